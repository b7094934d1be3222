"""A LlamaIndex ``AsyncDBChatStore`` (what ``Memory`` keeps its messages in) on a histstore
store.

::

    from llama_index.core.memory import Memory
    from histstore.integrations.llama_index import HiststoreChatStore

    memory = Memory.from_defaults(session_id="chat-42", chat_store=HiststoreChatStore("chat.db"))

A key is a conversation: its active messages are the conversation ``key``, its archived
ones the conversation ``key + ARCHIVE_SUFFIX`` (``"chat-42#archived"``), so both are
histstore conversations, readable, searchable and exportable like any other. Each
``ChatMessage`` is stored as one histstore message ``{"role": ..., "type":
"llama_index", "message": <its JSON>}``: ``message`` is exactly
``ChatMessage.model_dump(mode="json")`` (what LlamaIndex's own SQL chat store keeps),
read back with ``ChatMessage.model_validate``; ``role`` is histstore's
(``histstore.envelopes.llama_index_role``) and the message's text blocks and tool-call
arguments are its indexed text. A plain histstore message an edit put in (such as the
summary ``compact`` makes) reads as a ``ChatMessage`` of its role and text.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Final, TypeVar

from histstore import (
    ConflictError,
    Conversation,
    Entry,
    InvalidMessage,
    Message,
    Store,
    indexed_text,
    validate_id,
)
from histstore.envelopes import llama_index_role

from . import StoreTarget, _missing_framework, _StoreHandle, _unwrap

try:
    from llama_index.core.base.llms.types import ChatMessage, MessageRole
    from llama_index.core.bridge.pydantic import PrivateAttr
    from llama_index.core.storage.chat_store.base_db import AsyncDBChatStore, MessageStatus
except ImportError as _exc:  # pragma: no cover - exercised in a subprocess by the tests
    raise _missing_framework("llama_index", "llamaindex", _exc) from _exc

__all__ = ["ARCHIVE_SUFFIX", "AUTHOR", "MESSAGE_TYPE", "HiststoreChatStore"]

MESSAGE_TYPE: Final = "llama_index"
"""The ``type`` of the histstore message that holds one ``ChatMessage``."""
ARCHIVE_SUFFIX: Final = "#archived"
"""What a key's archive conversation adds to the key."""
AUTHOR: Final = "llama_index"
"""The author of the changes ``set_messages`` and the deletions record."""
_ATTEMPTS: Final = 20
"""How often an edit is tried again when another writer changed the key meanwhile."""
_ARCHIVE_LEASE: Final = 60.0
"""Seconds an archive of one key holds its turn at most (a crashed archiver's is freed then)."""

T = TypeVar("T")
_ROLES: Final = frozenset(r.value for r in MessageRole)


def _envelope(message: ChatMessage, **extra: Any) -> dict[str, Any]:
    payload = message.model_dump(mode="json")
    return {"role": llama_index_role(payload), "type": MESSAGE_TYPE, "message": payload, **extra}


def _chat_message(message: Message) -> ChatMessage:
    """The ``ChatMessage`` of a stored message (see the module's docstring)."""
    data = message.to_dict()
    role = data.get("role")
    if data.get("type") == MESSAGE_TYPE or not isinstance(role, str):
        payload = _unwrap(message, MESSAGE_TYPE, "message", "the key is not a LlamaIndex message")
        return ChatMessage.model_validate(payload)
    known = role if role in _ROLES else "user"
    return ChatMessage(role=known, content=indexed_text(message) or "")


def _fingerprint(entry: Entry) -> str:
    """What names an entry for good: its id and when it was made (ids restart after a
    ``clear``)."""
    made = entry.created_at.isoformat() if entry.created_at is not None else ""
    return f"{entry.entry_id}@{made}"


def _check(value: int | None, name: str) -> int | None:
    if value is not None and value < 0:
        raise ValueError(f"{name} must be None or >= 0")
    return value


def _messages(messages: Sequence[ChatMessage]) -> list[ChatMessage]:
    items = list(messages)
    for item in items:
        if not isinstance(item, ChatMessage):
            raise InvalidMessage(f"expected a ChatMessage, not {type(item).__name__}")
    return items


class HiststoreChatStore(AsyncDBChatStore):
    """An ``AsyncDBChatStore`` whose keys are histstore conversations.

    Args:
        store: a ``Store`` (borrowed, never closed here) or anything
            ``histstore.connect()`` takes (owned: one store per event loop, opened on
            that loop's first use, released when the loop ends or by ``close()`` or
            ``async with``). ``Memory``'s sync methods run each call on a new loop: give
            them a path or URL.

    Statuses: ``ACTIVE`` messages are the conversation ``key``, ``ARCHIVED`` ones the
    conversation ``key + ARCHIVE_SUFFIX``; ``status=None`` means the archived ones, then
    the active ones. A key (and so its archive's id) follows histstore's id rules
    (``InvalidId``): at most ``255 - len(ARCHIVE_SUFFIX)`` characters to be archived.

    Costs: ``get_messages(limit=, offset=)`` reads only the messages it returns,
    ``count_messages`` reads none, ``add_message(s)`` is one append. The edits
    (``set_messages``, ``delete_message``, ``delete_oldest_messages``,
    ``archive_oldest_messages``) load the key's active messages (``store.edit``) and
    commit one change by ``AUTHOR``, retried when another writer got in meanwhile; so
    ``store.revert`` undoes one.
    """

    _handle: _StoreHandle = PrivateAttr()

    def __init__(self, store: StoreTarget, **data: Any) -> None:
        super().__init__(**data)
        self._handle = _StoreHandle(store)

    @classmethod
    def class_name(cls) -> str:
        return "HiststoreChatStore"

    async def _store(self) -> Store:
        return await self._handle.get()

    async def close(self) -> None:
        """Release an owned store (a borrowed one stays open). Idempotent."""
        await self._handle.close()

    async def __aenter__(self) -> HiststoreChatStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ------------------------------------------------------------------ reading

    async def get_messages(
        self,
        key: str,
        status: MessageStatus | None = MessageStatus.ACTIVE,
        limit: int | None = None,
        offset: int | None = None,
    ) -> list[ChatMessage]:
        """The messages of ``key`` with ``status``, oldest first: ``limit`` of them from
        the ``offset``-th on. Reads only those.

        Raises:
            InvalidId: a key breaks the id rules.
            ValueError: a negative ``limit`` or ``offset``.
        """
        start, limit = _check(offset, "offset") or 0, _check(limit, "limit")
        conversations = _conversations(key, status)
        store = await self._store()
        found: list[Message] = []
        for i, conversation in enumerate(conversations):
            want = None if limit is None else limit - len(found)
            if want == 0:
                break
            if i + 1 < len(conversations):  # the archive, before the active ones
                count = await store.count(conversation)
                if start >= count:
                    start -= count
                    continue
            stop = None if want is None else start + want
            found.extend(await store.read(conversation, start=start, stop=stop))
            start = 0
        return [_chat_message(m) for m in found]

    async def count_messages(
        self, key: str, status: MessageStatus | None = MessageStatus.ACTIVE
    ) -> int:
        """How many messages ``key`` holds with ``status`` (reads none of them)."""
        store = await self._store()
        return sum([await store.count(c) for c in _conversations(key, status)])

    async def get_keys(self) -> list[str]:
        """Every key holding messages of either status, in id order: the store's
        conversations, a ``...#archived`` one counted as its key (so give a chat store a
        store, or ``store.scoped(user)``, of its own)."""
        store = await self._store()
        keys: set[str] = set()
        page = 1000
        offset = 0
        while True:
            ids = await store.conversations(limit=page, offset=offset)
            keys.update(c.removesuffix(ARCHIVE_SUFFIX) for c in ids)
            if len(ids) < page:
                return sorted(keys)
            offset += page

    # ------------------------------------------------------------------ writing

    async def add_message(
        self, key: str, message: ChatMessage, status: MessageStatus = MessageStatus.ACTIVE
    ) -> None:
        """Append one message (see ``add_messages``)."""
        await self.add_messages(key, [message], status)

    async def add_messages(
        self,
        key: str,
        messages: list[ChatMessage],
        status: MessageStatus = MessageStatus.ACTIVE,
    ) -> None:
        """Append messages, all of them or none, after the key's messages of ``status``.

        Raises:
            InvalidMessage: an item is not a ``ChatMessage`` or cannot be stored as
                JSON (nothing is written).
            WriteError: the database failed; see its ``outcome``.
        """
        items = _messages(messages)
        if not items:
            return
        (conversation,) = _conversations(key, status)
        store = await self._store()
        await store.write(conversation, [_envelope(m) for m in items])

    async def set_messages(
        self,
        key: str,
        messages: list[ChatMessage],
        status: MessageStatus = MessageStatus.ACTIVE,
    ) -> None:
        """Make ``messages`` the key's messages of ``status`` (the others stay), in one
        change by ``AUTHOR``."""
        items = [_envelope(m) for m in _messages(messages)]
        (conversation,) = _conversations(key, status)

        def replace(value: Conversation) -> None:
            value.splice(0, None, items, by=AUTHOR)

        await self._edit(conversation, replace)

    async def delete_message(self, key: str, idx: int) -> ChatMessage | None:
        """Remove the active message at position ``idx`` (0: the oldest) and return it;
        ``None`` when there is none there."""

        def remove(value: Conversation) -> list[Entry]:
            entries = value.entries
            if not 0 <= idx < len(entries):
                return []
            value.splice(idx, idx + 1, [], by=AUTHOR)
            return [entries[idx]]

        removed = await self._edit(validate_id(key), remove)
        return _chat_message(removed[0].message) if removed else None

    async def delete_messages(self, key: str, status: MessageStatus | None = None) -> None:
        """Remove the key's messages of ``status`` (``None``: both; each status is one
        conversation, cleared). Idempotent."""
        store = await self._store()
        for conversation in _conversations(key, status):
            await store.clear(conversation)

    async def delete_oldest_messages(self, key: str, n: int) -> list[ChatMessage]:
        """Remove the oldest ``n`` active messages and return them (one change)."""
        removed = await self._edit(validate_id(key), _oldest(n))
        return [_chat_message(e.message) for e in removed]

    async def archive_oldest_messages(self, key: str, n: int) -> list[ChatMessage]:
        """Move the oldest ``n`` active messages to the archive and return them.

        The archive is appended to first, each message marked with the entry it comes
        from (``"archived_from"``), then the messages are removed from the active ones
        in one change. Archives of one key take turns (a lease on the archive), and
        what the archive's newest messages already hold is not appended again: a
        crash or a retry between the two steps never archives a message twice. After
        a crash between them, the messages are in both until the next archive of the
        key.
        """
        key = validate_id(key)
        archive = _archive(key)
        store = await self._store()
        async with store.lease(archive, ttl=_ARCHIVE_LEASE):
            for _attempt in range(_ATTEMPTS):
                value = await store.edit(key)
                victims = value.entries[: max(n, 0)]
                if not victims:
                    return []
                marks = [_fingerprint(e) for e in victims]
                length = await store.count(archive)
                # Copies of entries still active can only follow the last archive that
                # removed its messages: they are among the newest len(active) messages.
                recent = await store.read(archive, limit=len(value.entries))
                done = {m.to_dict().get("archived_from") for m in recent}
                fresh = [
                    {**e.message.to_dict(), "archived_from": mark}
                    for e, mark in zip(victims, marks, strict=True)
                    if mark not in done
                ]
                value.splice(0, len(victims), [], by=AUTHOR)
                try:
                    if fresh:
                        await store.write(archive, fresh, at=length)
                    await store.commit(value)
                except ConflictError:
                    continue
                return [_chat_message(e.message) for e in victims]
            raise ConflictError(
                f"key {key!r} kept changing while its oldest messages were archived"
            )

    async def _edit(self, conversation: str, change: Callable[[Conversation], T]) -> T:
        """Apply ``change`` to the conversation's value and commit it, tried again on a
        fresh value when another writer got in first."""
        store = await self._store()
        for _attempt in range(_ATTEMPTS):
            value = await store.edit(conversation)
            result = change(value)
            if not value.unsaved:
                return result
            try:
                await store.commit(value)
            except ConflictError:
                continue
            return result
        raise ConflictError(f"conversation {conversation!r} kept changing during an edit")

    def __repr__(self) -> str:
        return "HiststoreChatStore()"


def _oldest(n: int) -> Callable[[Conversation], list[Entry]]:
    def remove(value: Conversation) -> list[Entry]:
        entries = value.entries[: max(n, 0)]
        if entries:
            value.splice(0, len(entries), [], by=AUTHOR)
        return entries

    return remove


def _archive(key: str) -> str:
    """The id of ``key``'s archive conversation.

    Raises:
        InvalidId: the key, or with the suffix, breaks the id rules.
    """
    return validate_id(validate_id(key) + ARCHIVE_SUFFIX)


def _conversations(key: str, status: MessageStatus | None) -> list[str]:
    """The conversations holding ``key``'s messages of ``status``, oldest messages first."""
    key = validate_id(key)
    if status is None:
        return [_archive(key), key]
    if MessageStatus(status) is MessageStatus.ARCHIVED:
        return [_archive(key)]
    return [key]
