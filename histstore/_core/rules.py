"""What the store accepts: every rule that decides whether a value is storable.

Each rule lives here once and every way in (``write``, ``save``, the state calls,
import and copy) applies it before anything is written, so a value is stored on every
backend or refused on every backend with the same ``InvalidMessage`` (or ``InvalidId``),
never by a database error half way through. Integers must fit their columns (positions
and lengths 64-bit, token counts 32-bit), text columns take no NUL and no lone
surrogate, times must be aware and representable in UTC.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from .._errors import InvalidMessage
from . import codec as _codec
from .models import Message, Summary, as_message, decoded_message

__all__ = [
    "MAX_BIGINT",
    "MAX_INT",
    "Batch",
    "argument",
    "item",
    "metadata_key",
    "metadata_key_digest",
    "metadata_rows",
    "position",
    "prepare_batch",
    "role_key",
    "summary_row",
    "time",
    "token_count",
]

MAX_BIGINT = 2**63 - 1
MAX_INT = 2**31 - 1


def argument(value: object, name: str, *, allow_none: bool = True) -> int | None:
    """A non-negative int argument of an API call (``limit``, ``start``, ``at`` ...).

    Raises ``TypeError`` or ``ValueError``: these are the caller's mistakes, not data.
    """
    if value is None and allow_none:
        return None
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int")
    if value < 0:
        raise ValueError(f"{name} must not be negative")
    if value > MAX_BIGINT:
        raise ValueError(f"{name} must be below 2**63")
    return value


def positive(value: object, name: str) -> int:
    """A positive int argument (``batch``, ``k`` ...); ``TypeError`` or ``ValueError``
    otherwise, as ``argument``."""
    number = argument(value, name, allow_none=False)
    if not number:
        raise ValueError(f"{name} must be positive")
    return number


def _int(value: object, what: str, top: int, top_text: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= top:
        raise InvalidMessage(f"{what} must be an int from 0 to {top_text}")
    return value


def position(value: object, what: str = "position") -> int:
    """A position or length: an int from 0 to 2**63-1."""
    return _int(value, what, MAX_BIGINT, "2**63-1")


def token_count(value: object, what: str = "token count") -> int | None:
    """A token count: ``None`` or an int from 0 to 2**31-1."""
    return None if value is None else _int(value, what, MAX_INT, "2**31-1")


def time(value: object, what: str = "time") -> datetime:
    """An aware ``datetime`` that has a UTC form (years 1 to 9999), in UTC."""
    if not isinstance(value, datetime) or value.tzinfo is None:
        raise InvalidMessage(f"{what} must be an aware datetime")
    try:
        return value.astimezone(timezone.utc)
    except (OverflowError, ValueError):
        raise InvalidMessage(f"{what} has no UTC form within the years 1 to 9999") from None


def role_key(role: str | None) -> str | None:
    """What the ``role`` column holds for a message's role: ``'system'`` for a system
    message, ``NULL`` for any other. The column only serves the index of system messages
    (the message's own JSON keeps the exact role), so the common roles cost no bytes
    there. Rows an older histstore stored hold their role itself; only ``'system'`` is
    ever looked for."""
    return "system" if role == "system" else None


def metadata_key(key: object) -> str:
    """A metadata key's stored form; any string without lone surrogates is a key, of
    any length.

    Raises ``InvalidMessage`` for a non-string or a lone surrogate.
    """
    if not isinstance(key, str):
        raise InvalidMessage(f"a metadata key must be a str, not {type(key).__name__}")
    if "\x00" not in key:
        _codec.check_text(key, what="a metadata key")
    else:
        _codec.check_text(key.replace("\x00", " "), what="a metadata key")
    return _codec.key_to_stored(key)


def metadata_key_digest(key: object) -> str:
    """What a metadata key is looked up by (the table's primary key and filter index
    hold it): the digest of its stored form. The same checks as ``metadata_key``."""
    return _codec.key_digest(metadata_key(key))


def metadata_rows(conversation: str, values: Mapping[Any, Any]) -> list[dict[str, Any]]:
    """Rows of the metadata table for ``values`` (keys checked, values encoded)."""
    rows = []
    for k, v in values.items():
        stored = metadata_key(k)
        text, copy, _size = _codec.encode(v, what="metadata value")
        rows.append(
            {
                "conversation_id": conversation,
                "key": stored,
                "key_digest": _codec.key_digest(stored),
                "value": text,
                "digest": _codec.canonical_digest(copy),
            }
        )
    return rows


def summary_row(conversation: str, seq: int, summary: Summary) -> dict[str, Any]:
    """A row of the summaries table (``Summary`` checks its own numbers)."""
    text, _copy, _size = _codec.encode(summary.content, what="summary content")
    created = None if summary.created_at is None else time(summary.created_at, "summary time")
    return {
        "conversation_id": conversation,
        "seq": seq,
        "start": summary.start,
        "end": summary.end,
        "content": text,
        "token_count": summary.token_count,
        "created_at": created,
    }


def item(value: Any) -> tuple[str | None, bytes | None]:
    """A list item's stored form: ``(json_text, None)``, or ``(None, blob)`` for bytes."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return None, bytes(value)
    text, _copy, _size = _codec.encode(value, what="list item")
    return text, None


@dataclass
class Batch:
    """A validated batch of messages, ready to be stored.

    ``times`` are the messages' own creation times (import and ``save`` keep them) or
    ``None`` where the store's clock decides. Its rows: ``_storage.rows.batch_values``.
    """

    messages: list[Message]
    tokens: list[int | None]
    digest: str
    times: list[datetime | None] | None = None


def prepare_batch(
    conversation: str,
    items: Sequence[object],
    *,
    max_message_bytes: int,
    count_tokens: Callable[[Message], int] | None,
    tokens: Sequence[object] | None = None,
    times: Sequence[object] | None = None,
    decoded: bool = False,
) -> Batch:
    """Validate messages (dicts or ``Message`` values) into a ``Batch``.

    ``tokens`` and ``times`` carry stored counts and creation times (import); without
    them ``count_tokens`` (when given) counts, and the store's clock dates. ``decoded``
    says the dicts among ``items`` were made by ``json.loads`` and are handed over
    (import): the same rules apply, without the round-trip check that cannot fail.

    Raises:
        InvalidMessage: a message is not storable or over ``max_message_bytes``, a
            count or time is out of range. The message names the conversation and the
            message's index in the batch, never its content.
    """
    messages: list[Message] = []
    for i, m in enumerate(items):
        try:
            message = decoded_message(m) if decoded and type(m) is dict else as_message(m)
        except InvalidMessage as exc:
            raise InvalidMessage(
                f"message {i} of the batch for conversation {conversation!r}: {exc}"
            ) from None
        if message.size > max_message_bytes:
            raise InvalidMessage(
                f"message {i} of the batch for conversation {conversation!r} has"
                f" {message.size} bytes of JSON, over the limit of {max_message_bytes}"
            )
        messages.append(message)
    counts: list[int | None]
    if tokens is not None:
        counts = [
            t
            if t is None or (type(t) is int and 0 <= t <= MAX_INT)
            else _refused_count(conversation, t, i)
            for i, t in enumerate(tokens)
        ]
    elif count_tokens is not None:
        counts = [
            counted(count_tokens, m, conversation, f"message {i} of the batch")
            for i, m in enumerate(messages)
        ]
    else:
        counts = [None] * len(messages)
    stamps: list[datetime | None] | None = None
    if times is not None:
        stamps = []
        last: tuple[object, datetime | None] = (None, None)
        for i, t in enumerate(times):
            if t is None:
                stamps.append(None)
                continue
            if t is not last[0]:  # a batch's messages often share one time value
                last = (
                    t,
                    time(
                        t, f"the time of message {i} of the batch for conversation {conversation!r}"
                    ),
                )
            stamps.append(last[1])
    return Batch(messages, counts, _codec.digest(m.to_json() for m in messages), stamps)


def _refused_count(conversation: str, value: object, i: int) -> int | None:
    """The token-count rule, run only for a value the fast check did not pass."""
    return token_count(
        value, f"the token count of message {i} of the batch for conversation {conversation!r}"
    )


def counted(
    count_tokens: Callable[[Message], int], message: Message, conversation: str, which: str
) -> int:
    """``count_tokens(message)``, checked: an int from 0 to 2**31-1.

    Raises:
        InvalidMessage: the function raised (its error is the cause) or returned
            anything else; names ``which`` message (e.g. ``"message 2 of the batch"``)
            and the conversation, never the content.
    """
    try:
        value = count_tokens(message)
    except Exception as exc:  # the caller's function: its error becomes the cause
        raise InvalidMessage(
            f"count_tokens raised {type(exc).__name__} for {which} for conversation"
            f" {conversation!r}"
        ) from exc
    if type(value) is int and 0 <= value <= MAX_INT:
        return value
    if type(value) is int:
        shown = "a negative int" if value < 0 else "an int over 2**31-1"
    else:
        shown = f"a {type(value).__name__}"
    raise InvalidMessage(
        f"count_tokens' result for {which} for conversation {conversation!r} must be an int"
        f" from 0 to 2**31-1 (got: {shown})"
    )


def check_batch_size(conversation: str, n: int, max_batch: int) -> None:
    """A write takes at most ``max_batch`` messages."""
    if n > max_batch:
        raise InvalidMessage(
            f"a batch of {n} messages for conversation {conversation!r} is over"
            f" the limit of {max_batch}"
        )
