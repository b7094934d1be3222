"""The rows the programs write in more than one place, each built here once, and the
store's clock.

A row is a dict of the table's column names, as ``insert_messages`` and
``insert_change`` (``_storage.statements``) take it; a batch's message rows are lists of
values in the table's column order (``batch_values``, ``drivers.ValueRows``). The
builders check nothing: what they are given was validated before (``_core.rules``,
``_editable``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from typing import Any

from .._core import codec as _codec
from .._core.models import Message, message_data, role_in
from .._core.rules import Batch, role_key
from .._core.search_text import indexed_text
from .._editable.change_log import encode
from .._editable.changes import Change
from .._editable.entries import TurnRecord
from .computed_text import sqlite_text
from .drivers import ValueRows
from .schema import messages

__all__ = [
    "CLAIMED",
    "MESSAGE_COLUMNS",
    "SEARCH_TEXT_BYTES",
    "TextRule",
    "batch_columns",
    "batch_values",
    "change_row",
    "message_columns",
    "message_row",
    "now",
    "record_row",
    "searchable",
    "sqlite_stored_text",
    "stored_search_text",
    "text_rule",
    "turn_row",
]

Row = dict[str, Any]

TextRule = Callable[[Mapping[str, Any], str], str | None]
"""What a database's ``search_text`` holds for a message: ``rule(d, written)`` of its
JSON object ``d`` and its JSON text ``written`` (``text_rule``)."""

CLAIMED = "claimed"
"""The digest of a writes row that holds a key and stores no batch (a batch's digest is
22 base64url or 64 hex characters): a lost write's key, claimed when it was settled as
not stored, so that its statement can never commit later (``_ops.settle``). A write
under the key replaces it."""

SEARCH_TEXT_BYTES = 262_144
"""How much of a message's indexed text the full-text index covers: its first 256 KiB
(UTF-8), on every backend. PostgreSQL refuses a ``tsvector`` whose lexemes and positions
take over 1 MiB; text made of distinct short words takes about twice its own size there,
so this leaves room for the worst case. The message itself is stored whole."""


def searchable(text: str | None) -> str | None:
    """``text`` (a message's ``indexed_text``) cut to its first ``SEARCH_TEXT_BYTES``
    bytes of UTF-8, on a character boundary: what the ``search_text`` column holds."""
    if text is None or len(text) * 4 <= SEARCH_TEXT_BYTES:
        return text  # no code point takes more than 4 bytes
    raw = text.encode("utf-8", "surrogatepass")
    if len(raw) <= SEARCH_TEXT_BYTES:
        return text
    cut = SEARCH_TEXT_BYTES
    while raw[cut] & 0xC0 == 0x80:  # a continuation byte: back to where its character starts
        cut -= 1
    return raw[:cut].decode("utf-8", "surrogatepass")


def stored_search_text(message: Message | Mapping[str, Any]) -> str | None:
    """What a message row's ``search_text`` holds for ``message`` (a ``Message`` or its
    JSON object), from revision c8d2f4a6e1b9 on: ``NULL`` when the message's text is its
    string ``content`` (the common message, whose text is then not stored twice) or when
    it has no text and no string content; ``''`` when it has no text but a string
    content; else its ``indexed_text`` cut by ``searchable``. The indexes read the text
    back through ``statements.search.message_text``."""
    d = message_data(message) if isinstance(message, Message) else message
    content = d.get("content")
    if _plain_chat(d, content):
        return None
    text = searchable(indexed_text(d))
    if type(content) is str and content:
        return None if text == content else (text or "")
    return text


def now() -> datetime:
    """The store's clock: the current time, aware UTC. Every time a program stamps
    (``created_at``, ``updated_at``, a change's ``at``) comes from here."""
    return datetime.now(timezone.utc)


def message_row(
    conversation: str,
    position: int,
    *,
    role: str | None,
    data: str,
    token_count: int | None,
    created_at: datetime,
    search_text: str | None,
    entry_id: int,
    author: str | None,
) -> Row:
    """A row of the messages table: the message ``data`` (its JSON text) at ``position``,
    with its ``role`` key (``_core.rules.role_key``), its ``stored_search_text`` and the
    id and author of its entry."""
    return {
        "conversation_id": conversation,
        "position": position,
        "role": role,
        "data": data,
        "token_count": token_count,
        "created_at": created_at,
        "search_text": search_text,
        "entry_id": entry_id,
        "author": author,
    }


MESSAGE_COLUMNS = tuple(c.name for c in messages.columns)
"""The messages table's columns, in its order: what ``insert_messages`` takes, and the
order of the values of ``batch_values``."""


def message_columns(
    message: Message, rule: TextRule, data: Mapping[str, Any] | None = None
) -> tuple[str | None, str, str | None]:
    """The ``role``, ``data`` and ``search_text`` columns of ``message`` (the last by
    ``rule``, the database's ``text_rule``), from ``data``, its JSON object, when the
    caller has it (else read once and kept on the message)."""
    d = message_data(message) if data is None else data
    written = message.to_json()
    return role_key(role_in(d)), written, rule(d, written)


def pg_stored_text(d: Mapping[str, Any], written: str) -> str | None:
    """PostgreSQL's ``TextRule``: ``stored_search_text``, and the text stored for a
    string content whose JSON holds ``NUL_ESCAPE`` (its index cannot read it)."""
    text = stored_search_text(d)
    if text is None and NUL_ESCAPE in written:
        content = d.get("content")
        if type(content) is str and content:
            text = searchable(indexed_text(d)) or ""
    return text


def _plain_chat(d: Mapping[str, Any], content: Any) -> bool:
    """The commonest shape, whose text is its string ``content`` on every database: a
    role and a content short enough never to be cut, without a NUL."""
    return (
        type(content) is str
        and len(d) == 2
        and "role" in d
        and "\x00" not in content
        and len(content) * 4 <= SEARCH_TEXT_BYTES
    )


def sqlite_stored_text(d: Mapping[str, Any], written: str = "") -> str | None:
    """SQLite's ``TextRule`` (revision e5c3a9d7f2b4 on): ``NULL`` where the text SQLite
    computes from the JSON (``computed_text.sqlite_text``) is the message's
    ``indexed_text`` cut by ``searchable``, else that text (``''`` for none)."""
    content = d.get("content")
    if _plain_chat(d, content):
        return None
    text = searchable(indexed_text(d))
    return None if sqlite_text(d) == text else (text or "")


def text_rule(dialect: str) -> TextRule:
    """The rule of what ``search_text`` stores on the database ``dialect`` (its name):
    the one place where they differ. SQLite's index reads the text of the common shapes
    from the JSON (``sqlite_stored_text``); PostgreSQL's a string content only
    (``pg_stored_text``; its index expression is revision 5b7e2d4a9c13's)."""
    return _sqlite_rule if dialect == "sqlite" else _pg_rule


def _sqlite_rule(d: Mapping[str, Any], written: str) -> str | None:
    return sqlite_stored_text(d, written)  # read when called: a test may stand in for it


def _pg_rule(d: Mapping[str, Any], written: str) -> str | None:
    return pg_stored_text(d, written)


NUL_ESCAPE = "\\u0000"
"""What PostgreSQL's JSON functions refuse to turn into text anywhere in a document: a
row whose JSON holds it (a NUL in its role or another field, or those six characters in
a string) never has its text read from ``content`` by ``statements.search.message_text``,
so ``message_columns`` stores the text in ``search_text`` for it."""


def batch_columns(
    batch: Batch, rule: TextRule, skip: int = 0
) -> tuple[list[str | None], list[str], list[str | None]]:
    """The ``role``, ``data`` and ``search_text`` columns of ``batch.messages[skip:]``
    (the last by ``rule``)."""
    roles: list[str | None] = []
    datas: list[str] = []
    texts: list[str | None] = []
    for m in batch.messages[skip:]:
        role, data, text = message_columns(m, rule)
        roles.append(role)
        datas.append(data)
        texts.append(text)
    return roles, datas, texts


def batch_values(
    batch: Batch,
    conversation: str,
    first: int,
    at: datetime,
    skip: int = 0,
    *,
    first_entry: int,
    rule: TextRule,
) -> ValueRows:
    """Message rows for ``batch.messages[skip:]``, placed from position ``first`` on, as
    new entries (no author) with the ids from ``first_entry`` on, their text by
    ``rule``; a message without a
    time of its own (``batch.times``) is made ``at``. As lists of values in
    ``MESSAGE_COLUMNS`` order, the form ``insert_messages`` takes many rows in at the
    least cost."""
    times, tokens = batch.times, batch.tokens
    roles, datas, texts = batch_columns(batch, rule, skip)
    return ValueRows(
        MESSAGE_COLUMNS,
        [
            [
                conversation,
                first + i,
                roles[i],
                datas[i],
                tokens[skip + i],
                (times[skip + i] if times is not None else None) or at,
                texts[i],
                first_entry + i,
                None,
            ]
            for i in range(len(datas))
        ],
    )


def change_row(
    conversation: str,
    revision: int,
    change: Change,
    at: datetime,
    touched_from: int,
    added: int | None = None,
) -> Row:
    """A row of the changes table: ``change`` recorded as ``revision``, made ``at``,
    which left the entries below position ``touched_from`` as they were
    (``_editable.change_log.touched_from``). ``added`` counts the entries it added when
    the change itself does not hold them (``_editable.change_log.encode``)."""
    text = encode(change, added)
    return record_row(conversation, revision, change.kind, change.author, at, text, touched_from)


def record_row(
    conversation: str,
    revision: int,
    kind: str,
    author: str | None,
    at: datetime,
    record: str,
    touched_from: int,
) -> Row:
    """A row of the changes table from its columns, the ``record`` already encoded (as
    an export file carries it)."""
    return {
        "conversation_id": conversation,
        "revision": revision,
        "kind": kind,
        "author": author,
        "at": at,
        "record": record,
        "touched_from": touched_from,
    }


def turn_row(conversation: str, turn: TurnRecord, now: datetime | None) -> Row:
    """A row of the turns table: ``turn`` of ``conversation``, its times ``now`` where it
    has none (an open turn has no end time; ``None``: the times as they are)."""
    return {
        "conversation_id": conversation,
        "number": turn.number,
        "start": turn.start,
        "opened_at": turn.opened_at or now,
        "end": turn.end,
        "ended_at": turn.ended_at or (now if turn.end is not None else None),
        "usage": None if turn.usage is None else _codec.encode(dict(turn.usage))[0],
    }
