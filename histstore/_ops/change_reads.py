"""Reading the change records after a revision without the rest of the history
(SPEC 11): ``store.changes(since=, limit=)`` and a revert read these.

A record's added entries are recovered by walking back from the current entries
(``_editable.change_log``), which needs only the records after the revision and the
entries from the lowest position they touched; what applying a record makes of the halt
needs the halt at the revision, which the newest write or halt record up to it says.
"""

from __future__ import annotations

from collections.abc import Generator, Iterable, Sequence
from typing import Any

from .._core.models import stored_message
from .._editable.change_log import Logged, logged, lowest_touched, rebuild_after, written
from .._editable.entries import Entry
from .._errors import HistStoreError
from .._storage.drivers import FETCH, Step, drained
from .context import Context

__all__ = ["Head", "halt_at", "records_after", "stored_entries", "window_after"]

Steps = Generator[Step, Any, Any]
Head = tuple[int, int, int, Any, int]
"""A conversation's (revision, next entry, next aside, halted, length)."""


def records_after(ctx: Context, conversation: str, since: int, revision: int) -> Steps:
    """Program steps: the stored records after ``since`` of a conversation at
    ``revision``, oldest first (``list[Logged]``).

    Raises:
        HistStoreError: a record is missing.
    """
    sql = ctx.sql.edit
    params = {"c": conversation, "since": since}
    time = ctx.sql.created_at or _same
    records: dict[int, Logged] = {}
    for r in (yield FETCH, sql.log_writes, params):
        records[int(r[0])] = written(int(r[0]), time(r[1]), int(r[2] or 0))
    for r in drained((yield FETCH, sql.log_changes, params)):
        records[int(r[0])] = logged(int(r[0]), r[1], r[2], time(r[3]), r[4])
    if sorted(records) != list(range(since + 1, revision + 1)):
        raise HistStoreError(f"the change log of conversation {conversation!r} has gaps")
    return [records[i] for i in range(since + 1, revision + 1)]


def halt_at(ctx: Context, conversation: str, revision: int) -> Steps:
    """Program steps: the conversation's halt at ``revision`` (``str | None``), as the
    newest record up to it that is a write (no halt) or has a halt part left it."""
    sql = ctx.sql.edit
    got = yield FETCH, sql.last_write, {"c": conversation, "upto": revision}
    floor = int(got[0][0]) if got and got[0][0] is not None else 0
    params = {"c": conversation, "since": floor, "upto": revision}
    time = ctx.sql.created_at or _same
    for r in drained((yield FETCH, sql.halt_records, params)):
        if r[1] == "write":
            return None
        halt = logged(int(r[0]), r[1], r[2], time(r[3]), r[4]).change.halt
        if halt is not None:
            return halt[1]
    return None


def window_after(ctx: Context, conversation: str, head: Head, since: int) -> Steps:
    """Program steps: the whole records after ``since`` (``Window``) of the conversation
    whose row reads ``head``, and its entries now from the window's ``offset`` on; reads
    those records, the entries from the lowest position they touched (and the one
    before, which a revert's moved asides may follow), and what says the halt at
    ``since``. Costs O(records after ``since`` + entries they touched)."""
    revision, length = int(head[0]), int(head[4])
    log = yield from records_after(ctx, conversation, since, revision)
    low, _before = lowest_touched(length, log)
    offset = max(min(low, length) - 1, 0)
    rows = yield FETCH, ctx.sql.edit.entries_from, {"c": conversation, "start": offset}
    suffix = stored_entries(ctx, rows)
    if len(suffix) != length - offset:
        raise HistStoreError(f"conversation {conversation!r} has gaps in its messages")
    halted = yield from halt_at(ctx, conversation, since)
    return rebuild_after(conversation, suffix, offset, log, halted), suffix


def stored_entries(ctx: Context, rows: Iterable[Sequence[Any]]) -> list[Entry]:
    """Entries from ``(data, position, created_at, entry_id, author)`` rows as the driver
    reads them."""
    time = ctx.sql.created_at or _same
    return [
        Entry.from_store(stored_message(r[0], None, None), int(r[3]), r[4], time(r[2]))
        for r in rows
    ]


def _same(value: Any) -> Any:
    return value
