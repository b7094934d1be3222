"""Change records: one per edit of a conversation, with enough content to fold and undo it.

A ``Change`` is made of parts, each optional:

- an entries part: ``removed`` (the entries that stood at ``start``, with their ids,
  authors and times) replaced by ``added`` (each with its id). ``start`` is ``None``
  for a change at the end (a plain write or pop). ``moved`` lists the asides the part
  moved, as ``(aside_id, from_entry, to_entry)``: applying the change computes these
  again from the entries, and refuses a record whose ``moved`` says otherwise;
- ``asides``: aside states put, replaced or removed (``AsideOp``);
- ``halt``: the halt before and after, ``(before, after)``;
- ``turn``: a turn record opened (its ``end`` is ``None``) or the newest one ended.

``at`` and ``revision`` are ``None`` until a store keeps the change. ``to_record`` and
``from_record`` convert to and from a JSON-able dict (``from_record(c.to_record())``
equals ``c``, times included).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from .._errors import InvalidMessage
from .entries import (
    AsideOp,
    AsideState,
    Entry,
    TurnRecord,
    aside_state_from_json,
    aside_state_to_json,
    check_author,
    check_count,
    check_time,
    entry_from_json,
    entry_to_json,
    fields,
    optional_id,
    time_from,
    time_text,
    turn_from_json,
    turn_to_json,
)

__all__ = ["Change", "Move", "first_touched"]

Move = tuple[int, int | None, int | None]
"""An aside moved by an entries part: ``(aside_id, from_entry, to_entry)``."""

_KEYS = (
    "kind",
    "author",
    "at",
    "revision",
    "start",
    "removed",
    "added",
    "moved",
    "asides",
    "halt",
    "turn",
)


@dataclass(frozen=True, slots=True)
class Change:
    """One recorded edit of a conversation (see the module docstring for its parts).

    ``kind`` names the edit (``"write"``, ``"pop"``, ``"splice"``, ``"restore"``,
    ``"edit_each"``, ``"set_entries"``, ``"normalize"``, ``"revert"``, ``"aside_add"``,
    ``"aside_replace"``, ``"aside_remove"``, ``"halt"``, ``"resume"``, ``"turn_open"``,
    ``"turn_end"``, or a store's own such as ``"save"``); what a change does follows
    from its parts alone. Entry times are not compared; ``to_record()`` shows them.

    Raises:
        InvalidMessage: a part breaks these rules.
    """

    kind: str
    author: str | None = None
    """Who made the change: ``None`` for the user's, the model's or a tool's writes."""
    at: datetime | None = None
    """When a store recorded it (aware, UTC); ``None`` until a store keeps it."""
    revision: int | None = None
    """Its revision in the conversation, from 1; ``None`` until a store keeps it."""
    start: int | None = None
    """The position the entries part starts at; ``None`` for a change at the end."""
    removed: tuple[Entry, ...] = ()
    """The entries that stood at ``start``, with their ids, authors and times."""
    added: tuple[Entry, ...] = ()
    """The entries put in their place, each with its id."""
    moved: tuple[Move, ...] = ()
    """The asides the entries part moved, as ``(aside_id, from_entry, to_entry)``."""
    asides: tuple[AsideOp, ...] = ()
    """The aside states put, replaced or removed."""
    halt: tuple[str | None, str | None] | None = None
    """The conversation's halt before and after, ``(before, after)``; ``None``: unchanged."""
    turn: TurnRecord | None = None
    """The turn record opened (its ``end`` is ``None``) or the newest one ended."""

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        if not isinstance(self.kind, str) or not self.kind:
            raise InvalidMessage("Change.kind must be a non-empty str")
        check_author(self.author, what="Change.author")
        set_(self, "at", check_time(self.at, what="Change.at"))
        if self.revision is not None:
            check_count(self.revision, what="Change.revision", low=1)
        if self.start is not None:
            check_count(self.start, what="Change.start")
        set_(self, "removed", _entries(self.removed, what="Change.removed"))
        set_(self, "added", _entries(self.added, what="Change.added"))
        if len({e.entry_id for e in self.added}) != len(self.added):
            raise InvalidMessage("Change.added holds an entry id twice")
        set_(self, "moved", _moves(self.moved))
        if self.moved and not self.removed and not self.added:
            raise InvalidMessage("Change.moved needs an entries part")
        set_(self, "asides", _aside_ops(self.asides))
        if self.halt is not None:
            set_(self, "halt", _halt(self.halt))
        if self.turn is not None and not isinstance(self.turn, TurnRecord):
            raise InvalidMessage("Change.turn must be a TurnRecord or None")

    @property
    def touches_entries(self) -> bool:
        """Whether the change has an entries part."""
        return bool(self.removed or self.added)

    @classmethod
    def write(cls, entries: Iterable[Entry], *, author: str | None = None) -> Change:
        """A plain write: ``entries`` (each with its id) appended at the end."""
        return cls("write", author, added=tuple(entries))

    @classmethod
    def pop(cls, entry: Entry, *, moved: Iterable[Move] = (), halted: str | None = None) -> Change:
        """A plain pop: ``entry`` (with its id) removed from the end; ``moved`` may list the
        asides that followed it and now follow the entry before it; ``halted``, the halt
        the conversation had, which the pop clears."""
        halt = None if halted is None else (halted, None)
        return cls("pop", removed=(entry,), moved=tuple(moved), halt=halt)

    def stamped(self, revision: int, at: datetime) -> Change:
        """This change as a store keeps it: at ``revision``, made ``at``; entries and a turn
        record without a time get ``at``."""
        added = tuple(
            e if e.created_at is not None else replace(e, created_at=at) for e in self.added
        )
        turn = self.turn
        if turn is not None:
            if turn.end is None and turn.opened_at is None:
                turn = replace(turn, opened_at=at)
            elif turn.end is not None and turn.ended_at is None:
                turn = replace(turn, ended_at=at)
        return replace(self, revision=revision, at=at, added=added, turn=turn)

    def to_record(self) -> dict[str, Any]:
        """The change as a JSON-able dict (messages as dicts, times as ISO 8601 text);
        parts and fields a change lacks are left out."""
        out: dict[str, Any] = {"kind": self.kind}
        if self.author is not None:
            out["author"] = self.author
        if self.at is not None:
            out["at"] = time_text(self.at)
        if self.revision is not None:
            out["revision"] = self.revision
        if self.start is not None:
            out["start"] = self.start
        if self.removed:
            out["removed"] = [entry_to_json(e) for e in self.removed]
        if self.added:
            out["added"] = [entry_to_json(e) for e in self.added]
        if self.moved:
            out["moved"] = [list(m) for m in self.moved]
        if self.asides:
            out["asides"] = [
                {
                    "id": op.aside_id,
                    "before": aside_state_to_json(op.before),
                    "after": aside_state_to_json(op.after),
                }
                for op in self.asides
            ]
        if self.halt is not None:
            out["halt"] = list(self.halt)
        if self.turn is not None:
            out["turn"] = turn_to_json(self.turn)
        return out

    @classmethod
    def from_record(
        cls,
        record: Mapping[str, Any],
        *,
        decoded: bool = False,
        pending: dict[int, Any] | None = None,
    ) -> Change:
        """The change ``to_record`` gave (a copy: later changes to ``record`` do not reach
        it, unless ``decoded``: a record ``json.loads`` made and hands over, whose messages
        are kept rather than copied).

        Raises:
            InvalidMessage: ``record`` is not such a dict.
        """
        r = fields(record, _KEYS, what="a change record")
        if "kind" not in r:
            raise InvalidMessage("a change record needs 'kind'")
        halt = r.get("halt")
        if halt is not None and (not isinstance(halt, list) or len(halt) != 2):
            raise InvalidMessage("a change record's halt must be a pair or null")
        turn = r.get("turn")
        return cls(
            r["kind"],
            r.get("author"),
            at=time_from(r.get("at"), what="at"),
            revision=r.get("revision"),
            start=r.get("start"),
            removed=tuple(
                entry_from_json(e, decoded=decoded, pending=pending) for e in _list(r, "removed")
            ),
            added=tuple(
                entry_from_json(e, decoded=decoded, pending=pending) for e in _list(r, "added")
            ),
            moved=tuple(_move_from_json(m) for m in _list(r, "moved")),
            asides=tuple(_op_from_json(op) for op in _list(r, "asides")),
            halt=None if halt is None else (halt[0], halt[1]),
            turn=None if turn is None else turn_from_json(turn),
        )

    def __repr__(self) -> str:
        parts = [repr(self.kind)]
        if self.author is not None:
            parts.append(f"author={self.author!r}")
        if self.revision is not None:
            parts.append(f"revision={self.revision}")
        if self.touches_entries:
            parts.append(f"start={self.start!r}, removed={len(self.removed)}")
            parts.append(f"added={len(self.added)}")
        if self.asides:
            parts.append(f"asides={len(self.asides)}")
        if self.halt is not None:
            parts.append("halt")
        if self.turn is not None:
            parts.append(f"turn={self.turn.number}")
        return f"Change({', '.join(parts)})"


def first_touched(changes: Iterable[Change]) -> int | None:
    """The lowest position any of ``changes`` (applied in order) can have changed: each
    leaves the entries before its ``start`` as they were. ``None`` when none touches
    entries; 0 when one has no ``start`` (it is placed by the length it met)."""
    low: int | None = None
    for c in changes:
        if c.touches_entries:
            start = 0 if c.start is None else c.start
            low = start if low is None else min(low, start)
    return low


def _entries(value: object, *, what: str) -> tuple[Entry, ...]:
    if not isinstance(value, Sequence):
        raise InvalidMessage(f"{what} must be a sequence of Entry values")
    for e in value:
        if not isinstance(e, Entry) or e.entry_id is None:
            raise InvalidMessage(f"{what} must hold Entry values with ids")
    return tuple(value)


def _moves(value: object) -> tuple[Move, ...]:
    if not isinstance(value, Sequence):
        raise InvalidMessage("Change.moved must be a sequence of triples")
    out: list[Move] = []
    for m in value:
        if not isinstance(m, Sequence) or len(m) != 3:
            raise InvalidMessage("Change.moved must hold (aside_id, from, to) triples")
        out.append(
            (
                check_count(m[0], what="moved aside id", low=1),
                optional_id(m[1], what="moved from"),
                optional_id(m[2], what="moved to"),
            )
        )
    return tuple(out)


def _aside_ops(value: object) -> tuple[AsideOp, ...]:
    if not isinstance(value, Sequence):
        raise InvalidMessage("Change.asides must be a sequence of AsideOp values")
    ids = set()
    for op in value:
        if not isinstance(op, AsideOp):
            raise InvalidMessage("Change.asides must hold AsideOp values")
        check_count(op.aside_id, what="aside id", low=1)
        for state in (op.before, op.after):
            if state is not None and not isinstance(state, AsideState):
                raise InvalidMessage("an AsideOp's states must be AsideState values or None")
        if (op.before is None and op.after is None) or op.aside_id in ids:
            raise InvalidMessage("an AsideOp must change one aside, once")
        ids.add(op.aside_id)
    return tuple(value)


def _halt(value: object) -> tuple[str | None, str | None]:
    if not isinstance(value, tuple) or len(value) != 2:
        raise InvalidMessage("Change.halt must be a (before, after) pair or None")
    before = check_author(value[0], what="halt before")
    after = check_author(value[1], what="halt after")
    return (before, after)


def _list(record: Mapping[str, Any], key: str) -> list[Any]:
    value = record.get(key, [])
    if not isinstance(value, list):
        raise InvalidMessage(f"a change record's {key!r} must be a list")
    return value


def _move_from_json(value: object) -> Move:
    if not isinstance(value, list) or len(value) != 3:
        raise InvalidMessage("a moved aside must be an [aside_id, from, to] list")
    return (value[0], value[1], value[2])


def _op_from_json(value: object) -> AsideOp:
    r = fields(value, ("id", "before", "after"), what="an aside change")
    return AsideOp(
        check_count(r.get("id"), what="aside id", low=1),
        aside_state_from_json(r.get("before")),
        aside_state_from_json(r.get("after")),
    )
