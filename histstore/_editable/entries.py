"""The parts of an editable conversation: entries, asides, turn records, change records.

Pure values, no I/O. A ``Change`` is one recorded edit; ``to_record`` and
``from_record`` turn it into a JSON-able dict and back, the form a store keeps.
"""

from __future__ import annotations

import json as _json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from functools import lru_cache
from types import MappingProxyType
from typing import Any

from .._core import codec as _codec
from .._core.models import Message, MessageLike, as_message, decoded_message, stored_message
from .._errors import InvalidMessage

__all__ = [
    "TURN_ENDS",
    "USAGE_KEYS",
    "Aside",
    "AsideOp",
    "AsideState",
    "Entry",
    "Spliced",
    "TurnRecord",
    "check_author",
    "check_by",
    "check_count",
    "check_usage",
]

_MAX = 2**63 - 1
TURN_ENDS = ("completed", "stopped", "failed", "halted")
USAGE_KEYS = ("input", "output", "cache_read", "cache_write")


def check_count(value: object, *, what: str, low: int = 0) -> int:
    """An int (not a bool) from ``low`` to 2**63-1, else ``InvalidMessage``."""
    if type(value) is int and low <= value <= _MAX:
        return value
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= _MAX:
        raise InvalidMessage(f"{what} must be an int from {low} to 2**63-1")
    return value


def check_author(value: object, *, what: str = "author") -> str | None:
    """``None`` or a non-empty str a text column stores, else ``InvalidMessage``."""
    if value is None:
        return None
    return check_by(value, what=what)


def check_by(value: object, *, what: str = "by") -> str:
    """A non-empty str a text column stores, else ``InvalidMessage``."""
    if not isinstance(value, str) or not value:
        raise InvalidMessage(f"{what} must be a non-empty str")
    return _codec.check_text(value, what=what)


def check_time(value: object, *, what: str) -> datetime | None:
    """``None`` or an aware datetime, given back in UTC; else ``InvalidMessage``."""
    if value is None:
        return None
    if not isinstance(value, datetime) or value.utcoffset() is None:
        raise InvalidMessage(f"{what} must be an aware datetime or None")
    return value.astimezone(timezone.utc)


def check_usage(usage: object) -> Mapping[str, int] | None:
    """A turn's token counts with all four keys (a missing one counts 0), or ``None``."""
    if usage is None:
        return None
    if not isinstance(usage, Mapping):
        raise InvalidMessage("usage must be a mapping or None")
    unknown = [k for k in usage if k not in USAGE_KEYS]
    if unknown:
        raise InvalidMessage(f"usage keys must be among {', '.join(USAGE_KEYS)}")
    return MappingProxyType(
        {k: check_count(usage.get(k, 0), what=f"usage[{k!r}]") for k in USAGE_KEYS}
    )


@dataclass(frozen=True, slots=True, init=False)
class Entry:
    """One entry of a conversation: a message, its id, who wrote it, when it was made.

    ``message`` may be given as a message dict (it becomes a ``Message``). ``author`` is
    ``None`` for the user's, the model's or a tool's messages, else a non-empty str naming
    the editor. ``created_at`` (an aware time, kept in UTC) is not compared.

    Raises:
        InvalidMessage: a field breaks these rules.
    """

    message: Message
    entry_id: int | None
    """The entry's id (from 1), unique within its conversation; ``None`` until stored."""
    author: str | None
    created_at: datetime | None = field(compare=False)

    def __init__(
        self,
        message: MessageLike,
        *,
        entry_id: int | None = None,
        author: str | None = None,
        created_at: datetime | None = None,
    ) -> None:
        set_ = object.__setattr__
        set_(self, "message", as_message(message))
        if entry_id is not None:
            check_count(entry_id, what="entry_id", low=1)
        set_(self, "entry_id", entry_id)
        set_(self, "author", check_author(author))
        set_(self, "created_at", check_time(created_at, what="created_at"))

    @classmethod
    def from_store(
        cls, message: Message, entry_id: int, author: str | None, created_at: datetime | None
    ) -> Entry:
        """An entry as a store holds it, for a store's programs: the parts are trusted
        (they were checked when it was stored), so nothing is checked again."""
        entry = cls.__new__(cls)
        set_ = object.__setattr__
        set_(entry, "message", message)
        set_(entry, "entry_id", entry_id)
        set_(entry, "author", author)
        set_(entry, "created_at", created_at)
        return entry

    def __repr__(self) -> str:
        return (
            f"Entry(entry_id={self.entry_id!r}, author={self.author!r}, role={self.message.role!r})"
        )


@dataclass(frozen=True, slots=True)
class Aside:
    """A JSON value drawn after the entry ``after`` (``None``: before every entry)."""

    aside_id: int
    """The aside's id, unique within its conversation."""
    after: int | None
    """The entry id it follows; ``None``: before every entry."""
    value: Any
    """The JSON value."""

    def __repr__(self) -> str:
        return f"Aside(aside_id={self.aside_id!r}, after={self.after!r})"


@dataclass(frozen=True, slots=True)
class AsideState:
    """What a change record keeps of an aside: where it is drawn, the entry it was put
    after (``home``: it follows that entry again when a restore brings it back), its value.
    """

    after: int | None
    home: int | None
    value: Any

    def __repr__(self) -> str:
        return f"AsideState(after={self.after!r}, home={self.home!r})"


@dataclass(frozen=True, slots=True)
class AsideOp:
    """One aside put (``before`` is ``None``), replaced, or removed (``after`` is ``None``)."""

    aside_id: int
    before: AsideState | None
    after: AsideState | None


@dataclass(frozen=True, slots=True)
class TurnRecord:
    """A turn of model work: ``number`` from 1, ``start`` the entry id where it begins.

    ``end`` (one of ``TURN_ENDS``), ``ended_at`` and ``usage`` are ``None`` while it is
    open. ``usage`` maps ``input``, ``output``, ``cache_read`` and ``cache_write`` to
    token counts. The times are not compared.
    """

    number: int
    start: int
    opened_at: datetime | None = field(default=None, compare=False)
    """When the turn was opened (aware, UTC); ``None`` until a store keeps it."""
    end: str | None = None
    ended_at: datetime | None = field(default=None, compare=False)
    usage: Mapping[str, int] | None = None

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        check_count(self.number, what="TurnRecord.number", low=1)
        check_count(self.start, what="TurnRecord.start", low=1)
        set_(self, "opened_at", check_time(self.opened_at, what="TurnRecord.opened_at"))
        set_(self, "ended_at", check_time(self.ended_at, what="TurnRecord.ended_at"))
        if self.end is not None and self.end not in TURN_ENDS:
            raise InvalidMessage(f"TurnRecord.end must be one of {', '.join(TURN_ENDS)}")
        if self.end is None and (self.usage is not None or self.ended_at is not None):
            raise InvalidMessage("an open TurnRecord has no usage and no ended_at")
        set_(self, "usage", check_usage(self.usage))


@dataclass(frozen=True, slots=True)
class Spliced:
    """What a splice did, as entry ids: ``removed`` from the range, ``kept`` in place,
    ``added`` (newly made), ``restored`` (brought back by ``restore``)."""

    removed: list[int]
    kept: list[int]
    added: list[int]
    restored: list[int]


# ---------------------------------------------------------------- JSON forms


def time_text(value: datetime | None) -> str | None:
    """An aware time as ISO 8601 text (``None`` stays ``None``)."""
    return None if value is None else value.isoformat()


def time_from(value: object, *, what: str) -> datetime | None:
    """The time ``time_text`` wrote, else ``InvalidMessage``."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidMessage(f"{what} must be ISO 8601 text or null")
    return _parsed_time(value, what)


@lru_cache(maxsize=1024)
def _parsed_time(value: str, what: str) -> datetime | None:
    """``time_from`` of a text, kept for the next entry of the same batch (a log's entries
    share their batch's time; a ``datetime`` cannot be changed, so sharing is safe)."""
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise InvalidMessage(f"{what} is not an ISO 8601 time") from None
    return check_time(parsed, what=what)


def fields(record: object, allowed: Sequence[str], *, what: str) -> Mapping[str, Any]:
    """``record`` when it is a mapping with only ``allowed`` keys, else ``InvalidMessage``."""
    if type(record) is not dict and not isinstance(record, Mapping):
        raise InvalidMessage(f"{what} must be a JSON object")
    for k in record:
        if k not in allowed:
            raise InvalidMessage(f"{what} has unknown keys")
    return record


def entry_to_json(entry: Entry) -> dict[str, Any]:
    """An entry with an id as a JSON-able dict (``None`` fields left out)."""
    out: dict[str, Any] = {"id": entry.entry_id, "message": entry.message.to_dict()}
    if entry.author is not None:
        out["author"] = entry.author
    if entry.created_at is not None:
        out["created_at"] = time_text(entry.created_at)
    return out


def entry_text(entry: Entry) -> str:
    """``entry_to_json(entry)`` as JSON text, the message's own text put in as it is
    (no copy of the message, no second encoding)."""
    out = f'{{"id":{int(eid_of(entry))},"message":{entry.message.to_json()}'
    if entry.author is not None:
        out += ',"author":' + _json.dumps(entry.author, ensure_ascii=False)
    if entry.created_at is not None:
        out += f',"created_at":"{entry.created_at.isoformat()}"'
    return out + "}"


def eid_of(entry: Entry) -> int:
    """The id of an entry that has one."""
    assert entry.entry_id is not None
    return entry.entry_id


PENDING = stored_message("{}", None, None)
"""The message of an entry read with ``pending``: not decoded yet (see ``entry_from_json``)."""


def entry_from_json(
    record: object, *, decoded: bool = False, pending: dict[int, Any] | None = None
) -> Entry:
    """The entry ``entry_to_json`` wrote. ``decoded``: ``record`` is what ``json.loads``
    made and hands over (its message is kept, not copied; see
    ``_core.models.decoded_message``). With ``pending`` (implies ``decoded``), the
    entry's message is ``PENDING`` and its JSON value is put in ``pending`` under the
    entry's ``id()``, to be made a message only if it is needed (``settle``)."""
    r = fields(record, ("id", "message", "author", "created_at"), what="an entry record")
    if "id" not in r or "message" not in r:
        raise InvalidMessage("an entry record needs 'id' and 'message'")
    message = r["message"]
    if pending is not None and type(message) is dict:
        return pending_entry(r["id"], message, r.get("author"), r.get("created_at"), pending)
    if decoded and type(message) is dict:
        message = decoded_message(message)
    return Entry(
        message,
        entry_id=check_count(r["id"], what="entry id", low=1),
        author=r.get("author"),
        created_at=time_from(r.get("created_at"), what="created_at"),
    )


def pending_entry(
    entry_id: object,
    message: dict[str, Any] | str,
    author: object,
    created_at: object,
    pending: dict[int, Any],
) -> Entry:
    """The entry ``entry_to_json`` wrote with these fields (checked), whose message is
    ``PENDING``; ``message``, its decoded value or its JSON text as a store wrote it, is
    put in ``pending`` under the entry's ``id()`` (see ``entry_from_json``)."""
    entry = Entry.from_store(
        PENDING,
        check_count(entry_id, what="entry id", low=1),
        check_author(author),
        time_from(created_at, what="created_at"),
    )
    pending[id(entry)] = message
    return entry


def settle(entries: list[Entry], pending: dict[int, Any]) -> None:
    """Give the entries read with ``pending`` (see ``entry_from_json`` and
    ``pending_entry``) among ``entries`` their messages, in place."""
    for i, e in enumerate(entries):
        if e.message is PENDING:
            data = pending.get(id(e))
            if data is None:
                raise InvalidMessage("an entry's message was not read")
            # A message's text is as a store wrote it (checked then): it is decoded
            # only when it is looked at.
            message = (
                stored_message(data, None, None) if type(data) is str else decoded_message(data)
            )
            entries[i] = Entry.from_store(message, eid_of(e), e.author, e.created_at)


def aside_state_to_json(state: AsideState | None) -> dict[str, Any] | None:
    """An aside state as a JSON-able dict."""
    if state is None:
        return None
    return {"after": state.after, "home": state.home, "value": state.value}


def aside_state_from_json(record: object) -> AsideState | None:
    """The aside state ``aside_state_to_json`` wrote."""
    if record is None:
        return None
    r = fields(record, ("after", "home", "value"), what="an aside record")
    if "value" not in r:
        raise InvalidMessage("an aside record needs 'value'")
    return make_aside_state(
        optional_id(r.get("after"), what="aside after"),
        optional_id(r.get("home"), what="aside home"),
        r["value"],
    )


def make_aside_state(after: int | None, home: int | None, value: object) -> AsideState:
    """An aside state holding a private copy of ``value``, which must round-trip as JSON."""
    _text, copy, _size = _codec.encode(value, what="aside value")
    return AsideState(after, home, copy)


def optional_id(value: object, *, what: str) -> int | None:
    """``None`` or an id (an int from 1)."""
    return None if value is None else check_count(value, what=what, low=1)


def turn_to_json(turn: TurnRecord) -> dict[str, Any]:
    """A turn record as a JSON-able dict."""
    return {
        "number": turn.number,
        "start": turn.start,
        "opened_at": time_text(turn.opened_at),
        "end": turn.end,
        "ended_at": time_text(turn.ended_at),
        "usage": None if turn.usage is None else dict(turn.usage),
    }


def turn_from_json(record: object) -> TurnRecord:
    """The turn record ``turn_to_json`` wrote."""
    keys = ("number", "start", "opened_at", "end", "ended_at", "usage")
    r = fields(record, keys, what="a turn record")
    if "number" not in r or "start" not in r:
        raise InvalidMessage("a turn record needs 'number' and 'start'")
    end = r.get("end")
    if end is not None and not isinstance(end, str):
        raise InvalidMessage("a turn record's end must be a str or null")
    return TurnRecord(
        r["number"],
        r["start"],
        opened_at=time_from(r.get("opened_at"), what="opened_at"),
        end=end,
        ended_at=time_from(r.get("ended_at"), what="ended_at"),
        usage=r.get("usage"),
    )
