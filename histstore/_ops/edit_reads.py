"""Reads of editable history that leave the rest of the history alone (SPEC 11): the
newest entries with the facts beside them (``admin.tail``, ``histstore show``), and the
change records after a revision (``store.changes(since=, limit=)``, a revert) or up to one.

A record's added entries are recovered by walking back from the current entries
(``_editable.change_log``), which needs only the records after the revision and the
entries from the lowest position they touched; what applying a record makes of the halt
needs the halt at the revision, which the newest write or halt record up to it says.
The oldest records (``store.changes(limit=)``, ``histstore log --limit``) are rebuilt
from the entries they left, which are the first ones now unless a later record touched
one of them (each record's ``touched_from`` says).
"""

from __future__ import annotations

from collections.abc import Generator, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from .._core import codec as _codec
from .._core.models import stored_message
from .._editable.change_log import (
    Logged,
    Window,
    logged,
    lowest_touched,
    rebuild,
    rebuild_after,
    written,
)
from .._editable.changes import Change
from .._editable.entries import Aside, Entry, TurnRecord
from .._errors import HistStoreError
from .._storage.drivers import FETCH, Step, drained
from .context import Context

__all__ = [
    "ConversationTail",
    "Head",
    "halt_at",
    "identity",
    "oldest",
    "records_after",
    "stored_entries",
    "tail",
    "turn_record",
    "window_after",
]

T = TypeVar("T")
Steps = Generator[Step, Any, T]
Head = Sequence[Any]
"""A conversation's (revision, next entry, next aside, halted, length)."""


def turn_record(time: Any, r: Sequence[Any]) -> TurnRecord:
    """A turn record from a ``(number, start, opened_at, end, ended_at, usage)`` row."""
    return TurnRecord(
        int(r[0]),
        int(r[1]),
        opened_at=time(r[2]),
        end=r[3],
        ended_at=None if r[4] is None else time(r[4]),
        usage=None if r[5] is None else _codec.decode(r[5]),
    )


@dataclass(frozen=True)
class ConversationTail:
    """A conversation's newest entries and the facts of its editable state, read in one
    snapshot without its older entries (``admin.tail``).

    ``entries`` are those from position ``start`` on (``length - start`` of them);
    ``turns`` counts the turn records, ``newest_turn`` is the last (``None``: none);
    ``asides`` are all of them, in the order put.
    """

    revision: int
    """The conversation's newest revision."""
    halted: str | None
    """The reason it is halted; ``None``: not halted."""
    length: int
    start: int
    entries: list[Entry]
    asides: list[Aside]
    turns: int
    newest_turn: TurnRecord | None


def tail(ctx: Context, conversation: str, last: int | None) -> Steps[ConversationTail | None]:
    """Program steps: the newest ``last`` entries (all: ``None``) and the facts beside
    them (``None`` when the conversation is unknown or not visible). Costs O(``last`` +
    asides), whatever the history's length."""
    sql = ctx.sql.edit
    head = yield FETCH, sql.head, ctx.params(conversation)
    if not head:
        return None
    revision, _next_entry, next_aside, halted, length = head[0]
    start = 0 if last is None else max(int(length) - last, 0)
    got = yield FETCH, sql.entries_from, {"c": conversation, "start": start}
    entries = stored_entries(ctx, got)
    asides: list[Aside] = []
    if next_aside > 1:
        got = yield FETCH, sql.asides, {"c": conversation}
        asides = [Aside(int(r[0]), r[1], _codec.decode(r[3])) for r in got]
    got = yield FETCH, sql.newest_turn, {"c": conversation}
    newest = turn_record(ctx.sql.created_at or identity, got[0]) if got else None
    return ConversationTail(
        revision=int(revision),
        halted=halted,
        length=int(length),
        start=start,
        entries=entries,
        asides=asides,
        turns=0 if newest is None else newest.number,
        newest_turn=newest,
    )


def records_after(
    ctx: Context, conversation: str, since: int, revision: int
) -> Steps[list[Logged]]:
    """Program steps: the stored records after ``since`` up to ``revision`` (the
    conversation's, or an older one) oldest first (``list[Logged]``).

    Raises:
        HistStoreError: a record is missing.
    """
    sql = ctx.sql.edit
    params = {"c": conversation, "since": since, "upto": revision}
    time = ctx.sql.created_at or identity
    records: dict[int, Logged] = {}
    for r in (yield FETCH, sql.log_writes_upto, params):
        records[int(r[0])] = written(int(r[0]), time(r[1]), int(r[2] or 0))
    for r in drained((yield FETCH, sql.log_changes_upto, params)):
        records[int(r[0])] = logged(int(r[0]), r[1], r[2], time(r[3]), r[4])
    if sorted(records) != list(range(since + 1, revision + 1)):
        raise HistStoreError(f"the change log of conversation {conversation!r} has gaps")
    return [records[i] for i in range(since + 1, revision + 1)]


def oldest(ctx: Context, conversation: str, upto: int) -> Steps[list[Change] | None]:
    """Program steps: the whole records up to revision ``upto`` (from 1), rebuilt from
    the entries then, which are the first ones now when no later record touched an
    entry below their count (``None`` when one did). Costs O(records up to ``upto`` +
    entries then), whatever the history's length.

    Raises:
        HistStoreError: the records do not build those entries (a damaged database).
    """
    log = yield from records_after(ctx, conversation, 0, upto)
    length = sum(rec.added - len(rec.change.removed) for rec in log)
    got = yield FETCH, ctx.sql.edit.touched_below, {"c": conversation, "below": length}
    if got and got[0][0] is not None and int(got[0][0]) > upto:
        return None
    rows = yield FETCH, ctx.sql.edit.entries_below, {"c": conversation, "stop": length}
    entries = stored_entries(ctx, rows)
    if len(entries) != length:
        raise HistStoreError(f"conversation {conversation!r} has gaps in its messages")
    return rebuild(conversation, entries, log)


def halt_at(ctx: Context, conversation: str, revision: int) -> Steps[str | None]:
    """Program steps: the conversation's halt at ``revision`` (``str | None``), as the
    newest record up to it that is a write (no halt) or has a halt part left it."""
    sql = ctx.sql.edit
    got = yield FETCH, sql.last_write, {"c": conversation, "upto": revision}
    floor = int(got[0][0]) if got and got[0][0] is not None else 0
    params = {"c": conversation, "since": floor, "upto": revision}
    time = ctx.sql.created_at or identity
    for r in drained((yield FETCH, sql.halt_records, params)):
        if r[1] == "write":
            return None
        halt = logged(int(r[0]), r[1], r[2], time(r[3]), r[4]).change.halt
        if halt is not None:
            return halt[1]
    return None


def window_after(
    ctx: Context, conversation: str, head: Head, since: int
) -> Steps[tuple[Window, list[Entry]]]:
    """Program steps: the whole records after ``since`` (``Window``) of the conversation
    whose row reads ``head``, and its entries now from the window's ``offset`` on; reads
    those records, the entries from the lowest position they touched (and the one
    before, which a revert's moved asides may follow), and what says the halt at
    ``since``. Costs O(records after ``since`` + entries they touched)."""
    revision, length = int(head[0]), int(head[4])
    log = yield from records_after(ctx, conversation, since, revision)
    low = lowest_touched(length, log)
    offset = max(min(low, length) - 1, 0)
    rows = yield FETCH, ctx.sql.edit.entries_from, {"c": conversation, "start": offset}
    suffix = stored_entries(ctx, rows)
    if offset and not _aside_entries(log) <= {e.entry_id for e in suffix}:
        # A record put, moved or removed an aside after an entry below the window (an
        # aside part touches no position): read every entry instead.
        offset = 0
        rows = yield FETCH, ctx.sql.edit.entries_from, {"c": conversation, "start": 0}
        suffix = stored_entries(ctx, rows)
    if len(suffix) != length - offset:
        raise HistStoreError(f"conversation {conversation!r} has gaps in its messages")
    halted = yield from halt_at(ctx, conversation, since)
    return rebuild_after(conversation, suffix, offset, log, halted), suffix


def _aside_entries(log: Sequence[Logged]) -> set[int | None]:
    """The ids of the entries the records' aside parts and moves name (``None`` aside)."""
    named: set[int | None] = set()
    for rec in log:
        for op in rec.change.asides:
            for state in (op.before, op.after):
                if state is not None:
                    named.update((state.after, state.home))
        for _aside, old, new in (*rec.change.moved, *rec.moved):
            named.update((old, new))
    named.discard(None)
    return named


def stored_entries(ctx: Context, rows: Iterable[Sequence[Any]]) -> list[Entry]:
    """Entries from ``(data, position, created_at, entry_id, author)`` rows as the driver
    reads them."""
    time = ctx.sql.created_at or identity
    return [
        Entry.from_store(stored_message(r[0], None, None), int(r[3]), r[4], time(r[2]))
        for r in rows
    ]


def identity(value: Any) -> Any:
    """A stored time as the driver gives it (where no conversion is needed)."""
    return value
