"""The values histstore hands out and takes in: messages, summaries, outcomes, states."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass
from datetime import datetime
from types import MappingProxyType
from typing import Any

from .._errors import InvalidMessage
from . import codec as _codec
from .ids import validate_id

__all__ = [
    "ConversationState",
    "Message",
    "MessageLike",
    "Summary",
    "WriteOutcome",
    "as_message",
    "decoded_message",
    "message_data",
    "peek_data",
    "role_in",
    "stored_message",
    "stored_messages",
]


class Message:
    """One message of a conversation: an immutable JSON object with a ``role`` or ``type``.

    Build one with ``Message.user(...)``, ``Message.assistant(...)``, ``Message.system(...)``,
    ``Message.tool(...)``, ``Message(role, content, **fields)`` or ``Message.from_dict(d)``;
    any JSON object with a string ``role`` or ``type`` is accepted (Chat Completions
    messages, Responses API items, Anthropic messages). ``to_dict()`` gives the object back
    as a fresh dict. Equality compares the dict form only; ``position``, ``created_at``,
    ``entry_id`` and ``author`` (set on messages read from a store: the entry's stable id
    and who edited it in, ``None`` for what ``write`` stored) are not compared.
    """

    __slots__ = (
        "_created",
        "_created_raw",
        "_data",
        "_size",
        "_text",
        "author",
        "entry_id",
        "position",
    )

    _text: str
    _data: dict[str, Any] | None
    _size: int
    _created: datetime | None
    _created_raw: tuple[Callable[[Any], datetime | None], Any] | None
    position: int | None
    entry_id: int | None
    author: str | None

    def __init__(self, role: str, content: Any = None, /, **fields: Any) -> None:
        _fill(self, {"role": role, "content": content, **fields})

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Message:
        """Make a message from a JSON object; ``from_dict(d).to_dict() == d``.

        Raises:
            InvalidMessage: ``data`` is not a JSON object with a string ``role`` or
                ``type``, or does not survive a JSON round trip unchanged.
        """
        self = cls.__new__(cls)
        _fill(self, data)
        return self

    @classmethod
    def user(cls, content: Any, **fields: Any) -> Message:
        """A ``user`` message."""
        return cls("user", content, **fields)

    @classmethod
    def assistant(cls, content: Any = None, **fields: Any) -> Message:
        """An ``assistant`` message (``content`` may be ``None`` beside ``tool_calls``)."""
        return cls("assistant", content, **fields)

    @classmethod
    def system(cls, content: Any, **fields: Any) -> Message:
        """A ``system`` message."""
        return cls("system", content, **fields)

    @classmethod
    def tool(cls, content: Any, *, tool_call_id: str, **fields: Any) -> Message:
        """A ``tool`` message answering the call ``tool_call_id``."""
        return cls("tool", content, tool_call_id=tool_call_id, **fields)

    @property
    def created_at(self) -> datetime | None:
        """When the message was stored (an aware UTC datetime), for messages read back."""
        raw = self._created_raw
        if raw is not None:
            object.__setattr__(self, "_created", raw[0](raw[1]))
            object.__setattr__(self, "_created_raw", None)
        return self._created

    @property
    def role(self) -> str:
        """The message's ``role``, else its ``type``."""
        return role_in(message_data(self))

    @property
    def content(self) -> Any:
        """The message's ``content`` (a fresh copy), or ``None`` when it has none."""
        content = message_data(self).get("content")
        if isinstance(content, (dict, list)):
            return _codec.decode(_codec.encode(content)[0])
        return content

    @property
    def size(self) -> int:
        """The size of the message's JSON text in UTF-8 bytes."""
        if self._size < 0:
            object.__setattr__(self, "_size", len(self._text.encode("utf-8")))
        return self._size

    def get(self, key: str, default: Any = None) -> Any:
        """A top-level field of the message (a fresh copy), or ``default``."""
        d = message_data(self)
        if key not in d:
            return default
        value = d[key]
        if isinstance(value, (dict, list)):
            return _codec.decode(_codec.encode(value)[0])
        return value

    def to_dict(self) -> dict[str, Any]:
        """The message as a fresh dict, equal to the one it was made from."""
        return _codec.decode(self._text)  # type: ignore[no-any-return]

    def to_json(self) -> str:
        """The message as compact JSON text (the form the store keeps)."""
        return self._text

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Message):
            return NotImplemented
        return self._text == other._text or message_data(self) == message_data(other)

    def __hash__(self) -> int:
        return hash(self.role)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("Message is immutable")

    def __delattr__(self, name: str) -> None:
        raise AttributeError("Message is immutable")

    def __repr__(self) -> str:
        where = "" if self.position is None else f", position={self.position}"
        return f"Message({message_data(self)!r}{where})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (
            _unpickle,
            (self._text, self.position, self.created_at, self.entry_id, self.author),
        )


# Slot setters, bypassing the immutability guard (faster than object.__setattr__), and
# the getters the functions below read a message's private slots with.
def _slot_setter(name: str) -> Callable[[Message, Any], None]:
    setter: Callable[[Message, Any], None] = Message.__dict__[name].__set__
    return setter


def _slot_getter(name: str) -> Callable[[Message], Any]:
    getter: Callable[[Message], Any] = Message.__dict__[name].__get__
    return getter


_set_text = _slot_setter("_text")
_set_data = _slot_setter("_data")
_set_size = _slot_setter("_size")
_set_position = _slot_setter("position")
_set_entry_id = _slot_setter("entry_id")
_set_author = _slot_setter("author")
_set_created = _slot_setter("_created")
_set_created_raw = _slot_setter("_created_raw")
_get_text = _slot_getter("_text")
_get_data = _slot_getter("_data")


def _fill(message: Message, data: Mapping[str, Any], *, decoded: bool = False) -> None:
    """Check ``data`` and make ``message`` (fresh from ``__new__``) hold it."""
    if type(data) is not dict and not isinstance(data, Mapping):
        raise InvalidMessage(f"a message must be a JSON object, not {type(data).__name__}")
    role = data.get("role")
    if not isinstance(role, str) and ("role" in data or not isinstance(data.get("type"), str)):
        raise InvalidMessage("a message needs a string 'role' or 'type'")
    copy: Any
    if decoded and type(data) is dict:
        text, size = _codec.encode_decoded(data, what="message")
        copy = data
    else:
        text, copy, size = _codec.encode(data if type(data) is dict else dict(data), what="message")
    _set_text(message, text)
    _set_data(message, copy)
    _set_size(message, size)
    _set_position(message, None)
    _set_entry_id(message, None)
    _set_author(message, None)
    _set_created(message, None)
    _set_created_raw(message, None)


def decoded_message(data: Any) -> Message:
    """A message from a value ``json.loads`` made and hands over (it is kept, not
    copied): the same checks as ``Message.from_dict`` but the round trip, which cannot
    change such a value."""
    message = Message.__new__(Message)
    _fill(message, data, decoded=True)
    return message


def stored_message(
    text: str,
    position: int | None,
    created_at: Any,
    convert: Callable[[Any], datetime | None] | None = None,
    entry_id: int | None = None,
    author: str | None = None,
) -> Message:
    """A message read back from the database (its text was validated when written).

    ``created_at`` is converted by ``convert`` (the column's result processor) only when
    it is first looked at.
    """
    message = Message.__new__(Message)
    _set_text(message, text)
    _set_data(message, None)
    _set_size(message, -1)
    _set_position(message, position)
    _set_entry_id(message, entry_id)
    _set_author(message, author)
    if convert is None:
        _set_created(message, created_at)
        _set_created_raw(message, None)
    else:
        _set_created(message, None)
        _set_created_raw(message, (convert, created_at))
    return message


_SHARED_TIMES = 1024
"""Distinct ``created_at`` values ``stored_messages`` keeps converted at most at once."""


class _Blank:
    """``Message``'s slots without its guard: ``stored_messages`` fills one with plain
    attribute stores and then makes it a ``Message`` by assigning its ``__class__``
    (Python allows it between classes of the same layout): a quarter of the time the
    slot setters take."""

    __slots__ = Message.__slots__


def stored_messages(
    rows: Iterable[Sequence[Any]], convert: Callable[[Any], datetime | None] | None
) -> list[Message]:
    """Messages from ``(data, position, created_at, entry_id, author)`` rows, as
    ``stored_message`` makes them, for a read of many.

    A list of rows is turned into the list of messages in place: each row is let go as
    its message is made, so the two are never all held at once. The messages of one
    write share their time: each distinct ``created_at`` is converted once and the
    messages holding it share the one value.
    """
    out: list[Any] = rows if type(rows) is list else list(rows)
    times: dict[Any, datetime | None] = {}
    blank, message_class = _Blank, Message
    last: Any = _Blank  # no row's time
    at: datetime | None = None
    for i, row in enumerate(out):
        raw = row[2]
        if raw != last:  # a write's rows come one after another: one look for the run
            try:
                at = times[raw]
            except KeyError:
                if len(times) >= _SHARED_TIMES:
                    times.clear()
                at = times[raw] = raw if convert is None else convert(raw)
            last = raw
        message: Any = blank()
        message._text = row[0]  # noqa: SLF001 - its own slots (_Blank)
        message._data = None  # noqa: SLF001 - its own slots (_Blank)
        message._size = -1  # noqa: SLF001 - its own slots (_Blank)
        message.position = row[1]
        message.entry_id = row[3]
        message.author = row[4]
        message._created = at  # noqa: SLF001 - its own slots (_Blank)
        message._created_raw = None  # noqa: SLF001 - its own slots (_Blank)
        message.__class__ = message_class
        out[i] = message
    return out


def message_data(message: Message) -> dict[str, Any]:
    """The message's JSON object, decoded once and then kept on the message: its own
    dict, not a copy, for histstore's readers (never change it; ``to_dict()`` copies)."""
    data: dict[str, Any] | None = _get_data(message)
    if data is None:
        data = _codec.decode(_get_text(message))
        _set_data(message, data)
    return data


def peek_data(message: Message) -> dict[str, Any]:
    """The message's JSON object: the one it keeps, else one decoded for this look only
    (not kept on the message: for a pass over many messages that looks at each once)."""
    data: dict[str, Any] | None = _get_data(message)
    return _codec.decode(_get_text(message)) if data is None else data


def role_in(data: Mapping[str, Any]) -> str:
    """A message's ``role``, else its ``type``, from its JSON object."""
    role = data.get("role")
    return role if isinstance(role, str) else str(data["type"])


def _unpickle(
    text: str,
    position: int | None,
    created_at: datetime | None,
    entry_id: int | None = None,
    author: str | None = None,
) -> Message:
    return stored_message(text, position, created_at, None, entry_id, author)


MessageLike = Message | Mapping[str, Any]


def as_message(value: object) -> Message:
    """Accept a ``Message`` or a message dict; anything else raises ``InvalidMessage``."""
    if isinstance(value, Message):
        return value
    if isinstance(value, Mapping):
        return Message.from_dict(value)
    raise InvalidMessage(f"a message must be a Message or a dict, not {type(value).__name__}")


@dataclass(frozen=True, slots=True)
class WriteOutcome:
    """What a write achieved.

    Attributes:
        accepted: how many messages of the batch are confirmed stored (a prefix, in
            argument order; all of them on success).
        uncertain: messages after that prefix may have been stored too.
        length: the conversation's length after the call, ``None`` when unknown.
    """

    accepted: int
    uncertain: bool = False
    length: int | None = None


@dataclass(frozen=True, slots=True)
class Summary:
    """A summary standing for the messages at positions ``start`` to ``end`` (inclusive).

    ``content`` is any JSON value (usually a string).
    """

    start: int
    end: int
    content: Any
    token_count: int | None = None
    """The summary's token count, if known."""
    created_at: datetime | None = None
    """When the summary was stored (aware, UTC); ``None`` before that."""

    def __post_init__(self) -> None:
        for name in ("start", "end"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v < 2**63:
                raise InvalidMessage(f"Summary.{name} must be an int from 0 to 2**63-1")
        if self.end < self.start:
            raise InvalidMessage("Summary.end must not be before Summary.start")
        tc = self.token_count
        if tc is not None and (
            not isinstance(tc, int) or isinstance(tc, bool) or not 0 <= tc < 2**31
        ):
            raise InvalidMessage("Summary.token_count must be an int from 0 to 2**31-1, or None")


def _freeze_messages(messages: Iterable[object]) -> tuple[Message, ...]:
    return tuple(as_message(m) for m in messages)


@dataclass(frozen=True, slots=True)
class ConversationState:
    """Everything a conversation holds besides its named lists.

    ``messages`` and ``summaries`` are tuples; ``metadata`` is a read-only mapping (or
    ``None`` when there is none). ``token_count`` sums the counts the store recorded
    when the messages were written (``connect(count_tokens=...)``).
    """

    id: str
    """The conversation's id."""
    _: KW_ONLY
    user: str | None = None
    """Its owner (see ``Store.scoped``); ``None``: no owner."""
    messages: tuple[Message, ...] = ()
    system_prompt: str | None = None
    """Its system prompt, if one was set."""
    summaries: tuple[Summary, ...] = ()
    metadata: Mapping[str, Any] | None = None
    token_count: int = 0
    created_at: datetime | None = None
    """When it was created (aware, UTC); ``None`` for a state not read from a store."""
    updated_at: datetime | None = None
    """When it last changed (aware, UTC); ``None`` for a state not read from a store."""

    def __post_init__(self) -> None:
        validate_id(self.id)
        if self.user is not None:
            validate_id(self.user, what="user")
        if self.system_prompt is not None:
            _codec.check_text(self.system_prompt, what="system_prompt")
        set_ = object.__setattr__
        set_(self, "messages", _freeze_messages(self.messages))
        summaries = tuple(self.summaries)
        for s in summaries:
            if not isinstance(s, Summary):
                raise InvalidMessage("summaries must be Summary values")
        set_(self, "summaries", summaries)
        if self.metadata is not None:
            if not isinstance(self.metadata, Mapping):
                raise InvalidMessage("metadata must be a mapping or None")
            _text, copy, _size = _codec.encode(dict(self.metadata), what="metadata")
            set_(self, "metadata", MappingProxyType(copy))
