"""What a commit or a revert writes (SPEC 11): the rows that differ between a value's
saved state and its new one (``commit_writes``), then those rows and the change records
under an optimistic check of the revision (``persist``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from .._core import codec as _codec
from .._core import rules as _rules
from .._core.models import peek_data
from .._editable.change_log import touched_from
from .._editable.changes import Change, first_touched
from .._editable.entries import Entry
from .._editable.fold import EditableState, eid
from .._errors import ConflictError, InvalidMessage
from .._storage import rows as _rows
from .._storage.drivers import EXECUTE, EXECUTE_MANY, FETCH, Program
from .context import Context, not_found
from .edit_reads import Steps

__all__ = ["ROWS_AT_ONCE", "CommitWrites", "commit_writes", "persist"]

_ARRAYS = (
    ("roles", "role"),
    ("datas", "data"),
    ("tokens", "token_count"),
    ("times", "created_at"),
    ("texts", "search_text"),
    ("entry_ids", "entry_id"),
    ("authors", "author"),
)
"""The array parameters of ``insert_message_arrays`` and the row columns they hold."""
ROWS_AT_ONCE = 8_192
"""Message rows a commit makes and sends at once at most: a revert that puts back
90,000 entries holds a few thousand rows at a time, not all of them."""


def _entry_row(
    ctx: Context, conversation: str, position: int, entry: Entry, now: datetime
) -> dict[str, Any]:
    """The messages-table row of ``entry`` at ``position`` (counted by the store's
    ``count_tokens``; made ``now`` when the entry has no time)."""
    m = entry.message
    count = ctx.settings.count_tokens
    # A message read back stays undecoded (``peek_data``): a revert may put back many.
    role, data, search_text = _rows.message_columns(m, ctx.sql.text, peek_data(m))
    return _rows.message_row(
        conversation,
        position,
        role=role,
        data=data,
        token_count=None
        if count is None
        else _rules.counted(count, m, conversation, f"the message at position {position}"),
        created_at=entry.created_at or now,
        search_text=search_text,
        entry_id=eid(entry),
        author=entry.author,
    )


@dataclass
class CommitWrites:
    """What a commit writes besides the change records: the conversation row's new
    state, the message rows of ``[start, stop)`` (made from ``entries`` as they are
    written, ``ROWS_AT_ONCE`` at a time; ``cut``: the rows deleted first:
    ``"range"`` the same range, ``"tail"`` everything from ``start``, ``"move"`` the
    stored rows of ``[start, tail)``, after which the rows from ``tail`` on, which did
    not change, move by ``shift`` positions), and the asides and turn records that
    changed. Made off the database (``commit_writes``)."""

    row: dict[str, Any]
    start: int
    stop: int
    cut: str | None
    entries: Sequence[Entry]
    gone_asides: list[int]
    asides: list[dict[str, Any]]
    turns: list[dict[str, Any]]
    tail: int = 0
    shift: int = 0


def commit_writes(
    ctx: Context,
    conversation: str,
    before: EditableState,
    after: EditableState,
    changes: Sequence[Change],
    now: datetime,
) -> CommitWrites:
    """The writes that turn ``before`` (the stored state at the revision the value
    continues) into ``after`` by ``changes``: only what differs. The entries before the
    first position the changes touch are not looked at.

    Raises:
        InvalidMessage: an entry to write is over the store's ``max_message_bytes``.
    """
    old, new = before.entries, after.entries
    top = min(len(old), len(new))
    p = min(first_touched(changes) or 0, top)
    while p < top and _equal(old[p], new[p]):
        p += 1
    stop = len(new)
    tail = 0
    cut: str | None = "tail" if p < len(old) else None
    if len(old) == len(new):
        while stop > p and _equal(old[stop - 1], new[stop - 1]):
            stop -= 1
        cut = "range" if stop > p else None
    elif cut is not None:
        # The length changed: the entries after the edited run stay as they were and
        # only move (set-based, however many), unless there are none.
        q, room = 0, top - p
        while q < room and _equal(old[-1 - q], new[-1 - q]):
            q += 1
        if q:
            cut, stop, tail = "move", len(new) - q, len(old) - q
    limit = ctx.settings.max_message_bytes
    for i in range(p, stop):
        if new[i].message.size > limit:
            raise InvalidMessage(
                f"entry {i} of conversation {conversation!r} is over the size limit ({limit} bytes)"
            )
    asides = [
        {
            "conversation_id": conversation,
            "aside_id": aside_id,
            "after": state.after,
            "home": state.home,
            "value": _codec.encode(state.value)[0],
        }
        for aside_id, state in sorted(after.asides.items())
        if before.asides.get(aside_id) != state
    ]
    return CommitWrites(
        row={
            "length": len(new),
            "next_entry": after.next_entry,
            "next_aside": after.next_aside,
            "halted": after.halted,
        },
        start=p,
        stop=stop,
        cut=cut,
        entries=new[p:stop],
        gone_asides=sorted(before.asides.keys() - after.asides.keys()),
        asides=asides,
        turns=[
            _rows.turn_row(conversation, t, now)
            for i, t in enumerate(after.turns)
            if i >= len(before.turns) or before.turns[i] != t
        ],
        tail=tail,
        shift=len(new) - len(old),
    )


def _equal(a: Entry, b: Entry) -> bool:
    """Whether two entries are equal (the same object, as mostly, at once)."""
    return a is b or a == b


def persist(
    ctx: Context, conversation: str, work: CommitWrites, changes: Sequence[Change], now: datetime
) -> Program[int]:
    """The program that stores ``changes`` (stamped ``now`` at consecutive revisions, the
    first at the stored revision + 1) and ``work``, what they do; returns the revision.

    Raises:
        ConflictError: the stored revision is not the one the changes continue.
        NotFound: a scoped view may not see the conversation.
    """
    sql, edit, c = ctx.sql, ctx.sql.edit, conversation
    first = changes[0].revision
    assert first is not None
    expected = first - 1
    revision = expected + len(changes)
    params = ctx.params(c, expected=expected, revision=revision, now=now, **work.row)
    if not (yield FETCH, edit.claim_new if expected == 0 else edit.claim, params):
        taken = yield FETCH, sql.taken, {"c": c}
        if ctx.owner is not None and taken and taken[0][0] != ctx.owner:
            raise not_found(c)
        raise ConflictError(
            f"conversation {c!r} changed since revision {expected} (commit refused)"
        )
    if work.cut == "range":
        yield EXECUTE, edit.delete_range, {"c": c, "start": work.start, "stop": work.stop}
    elif work.cut == "tail":
        yield EXECUTE, sql.delete_messages_from, {"c": c, "start": work.start}
    elif work.cut == "move":
        if work.tail > work.start:
            yield EXECUTE, edit.delete_range, {"c": c, "start": work.start, "stop": work.tail}
        for stmt in edit.move_tail:
            yield EXECUTE, stmt, {"c": c, "start": work.tail, "shift": work.shift}
    yield from sql.listed(_inserted(ctx, c, work, now), len(work.entries))
    for aside_id in work.gone_asides:
        yield EXECUTE, edit.delete_aside, {"c": c, "aside_id": aside_id}
    if work.asides:
        yield EXECUTE_MANY, edit.put_aside, work.asides
    if work.turns:
        yield EXECUTE_MANY, edit.put_turn, work.turns
    lows = touched_from(changes, work.row["length"])
    records = [
        _rows.change_row(c, first + i, change, now, low)
        for i, (change, low) in enumerate(zip(changes, lows, strict=True))
    ]
    yield EXECUTE_MANY, edit.insert_change, records
    return revision


def _inserted(ctx: Context, c: str, work: CommitWrites, now: datetime) -> Steps[None]:
    """The INSERTs of ``work``'s entries (at ``work.start`` on)."""
    sql, entries = ctx.sql, work.entries
    for lo in range(0, len(entries), ROWS_AT_ONCE):
        rows = [
            _entry_row(ctx, c, work.start + i, entries[i], now)
            for i in range(lo, min(len(entries), lo + ROWS_AT_ONCE))
        ]
        if sql.insert_message_arrays is not None and len(rows) > 1:
            # One statement for the whole run of rows (their positions follow each other).
            arrays = {name: [r[column] for r in rows] for name, column in _ARRAYS}
            yield EXECUTE, sql.insert_message_arrays, {"c": c, "first": work.start + lo, **arrays}
        else:
            yield EXECUTE_MANY, sql.insert_messages, rows
