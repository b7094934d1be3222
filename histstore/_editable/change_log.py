"""A conversation's change log as a store keeps it, and how whole records are rebuilt.

A stored record holds every part of its ``Change`` but the entries it added, which are
only counted: the entries a change added are what stood at its place right after it,
so they are recovered by walking back from the current entries, undoing each change in
turn (``rebuild``). A write's record is its idempotency row (kept by the write's own
statements, none extra) and says only how many messages it appended at the end.

Pure functions, no I/O.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from .._core import codec as _codec
from .._errors import ConflictError, HistStoreError, InvalidMessage
from .changes import Change
from .entries import AsideState, Entry, entry_from_json, entry_text, pending_entry, settle
from .fold import EditableState

__all__ = [
    "Logged",
    "Window",
    "asides_before",
    "encode",
    "logged",
    "lowest_touched",
    "rebuild",
    "rebuild_after",
    "touched_from",
    "written",
]


@dataclass(frozen=True, slots=True)
class Logged:
    """One stored change record: the change without its added entries and the asides
    they moved, the count of those entries, and the moves as stored."""

    change: Change
    added: int
    moved: tuple[Any, ...] = ()


def encode(change: Change, added: int | None = None) -> str:
    """The JSON text of a change's stored record (``kind``, ``author``, ``at`` and
    ``revision`` have columns of their own; the added entries are counted: ``added``
    when the change itself does not hold them)."""
    # The removed entries are put in as text (their messages' own JSON): a record may
    # hold a whole conversation, and copying and encoding every message again is what
    # would cost. The rest is encoded (and checked) as a dict, in the same key order.
    bare = replace(change, removed=(), added=(), moved=()) if change.touches_entries else change
    parts = bare.to_record()
    record: dict[str, Any] = {}
    if "start" in parts:
        record["start"] = parts["start"]
    if change.removed:
        record["removed"] = _REMOVED
    if change.moved:
        record["moved"] = [list(m) for m in change.moved]
    for key in ("asides", "halt", "turn"):
        if key in parts:
            record[key] = parts[key]
    count = len(change.added) if added is None else added
    if count:
        record["added"] = count
    text = _codec.encode(record, what="change record")[0]
    if not change.removed:
        return text
    # Built in one go: a removed list may be a whole conversation's messages, and each
    # concatenation would copy it once more.
    head, tail = text.split(_REMOVED_TEXT, 1)
    return f"{head}[{','.join([entry_text(e) for e in change.removed])}]{tail}"


_REMOVED = "\u0000removed\u0000"
"""Stands for the removed entries while the rest of a record is encoded."""
_REMOVED_TEXT = _codec.encode(_REMOVED)[0]


def logged(
    revision: int,
    kind: str,
    author: str | None,
    at: datetime,
    text: str,
    pending: dict[int, Any] | None = None,
) -> Logged:
    """A record read back from the changes table (with ``pending``, its entries'
    messages are left undecoded: see ``entries.entry_from_json``).

    Raises:
        HistStoreError: the stored record is not one ``encode`` made (a damaged database).
    """
    try:
        record, removed = _read(text, pending)
        added = record.pop("added", 0)
        moved = record.pop("moved", [])
        if not isinstance(added, int) or isinstance(added, bool) or added < 0:
            raise InvalidMessage("a bad count of added entries")
        if not isinstance(moved, list):
            raise InvalidMessage("a bad list of moved asides")
        change = Change.from_record({"kind": kind, **record}, decoded=True, pending=pending)
        if removed is not None:
            change = replace(change, removed=removed)
        change = replace(change, author=author, at=at, revision=revision)
    except (ValueError, TypeError) as exc:  # InvalidMessage is a ValueError
        raise HistStoreError(f"change record {revision} is damaged ({exc})") from None
    return Logged(change, added, tuple(moved))


_REMOVED_FIRST = re.compile(r'\{(?:"start":(-?[0-9]+|null),)?"removed":\[')
"""How a record ``encode`` wrote begins when it removed entries."""
_ENTRY_FIRST = re.compile(r'\{"id":([0-9]+),"message":')
"""How ``entry_text`` begins an entry."""
_DECODER = json.JSONDecoder()


def _read(
    text: str, pending: dict[int, Any] | None
) -> tuple[dict[str, Any], tuple[Entry, ...] | None]:
    """The record ``encode`` wrote as a dict; with ``pending``, its removed entries apart
    (else ``None``), each made as soon as it is read, its message's JSON text put in
    ``pending`` (see ``entries.pending_entry``): a removed list may hold a whole
    conversation, and neither its decoded entries nor their messages then stand at once."""
    head = _REMOVED_FIRST.match(text) if pending is not None else None
    if head is None or pending is None:
        record = _codec.decode(text)
        if not isinstance(record, dict):
            raise InvalidMessage("not an object")
        return record, None
    removed: list[Entry] = []
    at = head.end()
    if text.startswith("]", at):
        at += 1
    else:
        while True:
            entry, at = _entry_at(text, at, pending)
            removed.append(entry)
            after = text[at : at + 1]
            at += 1
            if after == "]":
                break
            if after != ",":
                raise InvalidMessage("a bad list of removed entries")
    rest = text[at:]
    record = {} if rest == "}" else _codec.decode("{" + rest[1:]) if rest[:1] == "," else None
    if not isinstance(record, dict):
        raise InvalidMessage("not an object")
    if head.group(1) is not None:
        record["start"] = None if head.group(1) == "null" else int(head.group(1))
    return record, tuple(removed)


def _entry_at(text: str, at: int, pending: dict[int, Any]) -> tuple[Entry, int]:
    """The entry whose JSON begins at ``text[at]``, and where it ends. An entry as
    ``entry_text`` writes it (``id``, ``message``, then ``author`` and ``created_at`` when
    it has them) is read in place; any other is decoded whole."""
    first = _ENTRY_FIRST.match(text, at)
    if first is not None:
        start = first.end()
        _message, end = _DECODER.raw_decode(text, start)  # decoded only to find its end
        after = end
        author = created = None
        if text.startswith(_AUTHOR, after):
            author, after = _DECODER.raw_decode(text, after + len(_AUTHOR))
        if text.startswith(_CREATED, after):
            close = text.find('"', after + len(_CREATED))
            if close > 0:
                created, after = text[after + len(_CREATED) : close], close + 1
        if text.startswith("}", after):
            entry = pending_entry(int(first.group(1)), text[start:end], author, created, pending)
            return entry, after + 1
    item, at = _DECODER.raw_decode(text, at)
    return entry_from_json(item, decoded=True, pending=pending), at


_AUTHOR = ',"author":'
_CREATED = ',"created_at":"'


def touched_from(changes: Sequence[Change], length: int) -> list[int]:
    """The lowest position each of ``changes`` (whole, applied in order, leaving
    ``length`` entries) touched, where its own state placed it; the length it met for
    one that touched none. The entries below it stood as they were through it."""
    out = [0] * len(changes)
    for i in range(len(changes) - 1, -1, -1):
        c = changes[i]
        length -= len(c.added)
        out[i] = length if c.start is None else c.start
        length += len(c.removed)
    return out


def written(revision: int, at: datetime, appended: int) -> Logged:
    """A write's record, from its idempotency row: ``appended`` messages at the end."""
    return Logged(Change("write", at=at, revision=revision), appended)


def rebuild(
    conversation: str,
    current: Sequence[Entry],
    log: Sequence[Logged],
    *,
    pending: dict[int, Any] | None = None,
    upto: int | None = None,
) -> list[Change]:
    """The whole change records of a conversation whose entries are ``current`` and whose
    log, oldest first from revision 1, is ``log``.

    Walking back from ``current`` recovers each change's added entries; folding the
    records forward then gives each one the parts applying it makes (the halt a write
    cleared, the asides a pop moved) and checks that they build ``current``.

    With ``pending`` (the log was read with it, see ``logged``), only the records up to
    revision ``upto`` are whole: the entries standing at ``upto`` get their messages
    (``entries.settle``) and the others keep ``PENDING``. A revert needs no more, and a
    long history's messages are then decoded once at most, not once per record.

    Raises:
        HistStoreError: the log does not build the current entries (a damaged database).
    """
    entries = list(current)
    if pending is not None and upto == len(log):
        _settle(conversation, entries, pending)
    added: list[tuple[Entry, ...]] = [()] * len(log)
    for i in range(len(log) - 1, -1, -1):
        rec = log[i]
        change = rec.change
        if rec.added or change.removed:
            start = len(entries) - rec.added if change.start is None else change.start
            if start < 0 or start + rec.added > len(entries):
                raise _damaged(conversation)
            added[i] = tuple(entries[start : start + rec.added])
            entries[start : start + rec.added] = change.removed
        if pending is not None and upto == i:
            _settle(conversation, entries, pending)  # the entries at revision ``upto``
    if entries:
        raise _damaged(conversation)
    state = EditableState()
    out: list[Change] = []
    try:
        for rec, new in zip(log, added, strict=True):
            change = rec.change
            if new or rec.moved:
                change = replace(change, added=new, moved=rec.moved)
            out.append(state.apply(change))
    except (ConflictError, InvalidMessage):
        raise _damaged(conversation) from None
    if [e.entry_id for e in state.entries] != [e.entry_id for e in current]:
        raise _damaged(conversation)
    return out


def _settle(conversation: str, entries: list[Entry], pending: dict[int, Any]) -> None:
    try:
        settle(entries, pending)
    except InvalidMessage:
        raise _damaged(conversation) from None


def _damaged(conversation: str) -> HistStoreError:
    return HistStoreError(
        f"the change log of conversation {conversation!r} does not build its entries"
    )


@dataclass(frozen=True, slots=True)
class Window:
    """The records after a revision, whole (``rebuild_after``), the entries from
    ``offset`` on as they stood at that revision (those before it stood as they stand),
    and the halt then."""

    changes: list[Change]
    offset: int
    entries: list[Entry]
    halted: str | None


def lowest_touched(length: int, log: Sequence[Logged]) -> int:
    """The lowest position the records ``log`` (the newest of a conversation now
    ``length`` long) touched, each as its own state placed it: the entries below it
    stood as they stand throughout."""
    low = n = length
    for rec in reversed(log):
        start = n - rec.added if rec.change.start is None else rec.change.start
        low = min(low, start)
        n = n - rec.added + len(rec.change.removed)
    return low


def rebuild_after(
    conversation: str,
    suffix: Sequence[Entry],
    offset: int,
    log: Sequence[Logged],
    halted: str | None,
) -> Window:
    """The whole records ``log`` (every record after some revision, oldest first) of a
    conversation whose entries from position ``offset`` on are ``suffix``, when its
    halt at that revision was ``halted``: what ``rebuild`` gives for them, walking back
    only over the entries they touched (``offset`` at most ``lowest_touched``).

    A record's parts that applying it makes are those of ``EditableState.apply``: a
    change that reaches the end clears the halt it met (a write's record does not say).

    Raises:
        HistStoreError: the records do not fit the entries (a damaged database).
    """
    entries = list(suffix)
    added: list[tuple[Entry, ...]] = [()] * len(log)
    lengths = [0] * len(log)
    for i in range(len(log) - 1, -1, -1):
        rec = log[i]
        change = rec.change
        if rec.added or change.removed:
            start = len(entries) - rec.added if change.start is None else change.start - offset
            if start < 0 or start + rec.added > len(entries):
                raise _damaged(conversation)
            added[i] = tuple(entries[start : start + rec.added])
            entries[start : start + rec.added] = change.removed
        lengths[i] = len(entries)
    out: list[Change] = []
    before = halted
    for rec, new, n in zip(log, added, lengths, strict=True):
        change = rec.change
        halt = change.halt
        if change.touches_entries or new:
            k = len(change.removed)
            start = n - k if change.start is None else change.start - offset
            if halt is None and start + k == n and halted is not None:
                halt = (halted, None)
        if halt is not None:
            halted = halt[1]
        if new or rec.moved or halt != change.halt:
            change = replace(change, added=new, moved=rec.moved, halt=halt)
        out.append(change)
    return Window(out, offset, entries, before)


def asides_before(
    asides: dict[int, AsideState], changes: Sequence[Change]
) -> dict[int, AsideState]:
    """The asides as they stood before ``changes`` (whole records, oldest first) made
    them ``asides``: each record's aside parts undone, then the moves its entries made."""
    out = dict(asides)
    for change in reversed(changes):
        for op in reversed(change.asides):
            if op.before is None:
                out.pop(op.aside_id, None)
            else:
                out[op.aside_id] = op.before
        for aside_id, old, _new in reversed(change.moved):
            out[aside_id] = replace(out[aside_id], after=old)
    return out
