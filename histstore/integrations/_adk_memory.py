"""A Google ADK memory service over histstore's search: ``HiststoreMemoryService``.

Where memory lives: a memory is a copy of an event's text, kept in conversations of the
store's own, whatever session service the session came from (ADK's, or histstore's
``HiststoreSessionService``). Copying makes memory work for any session service, keeps
it when the session is deleted (as ADK's memory services do), and lets one owner-scoped
full-text search serve an app and user. Layout, every part an ordinary conversation
owned by the user ``adk-memory/<app>/<user>`` (parts percent-encoded, a hash when long):

- ``adk-memory/<app>/<user>/<session>``: the memories of one session, in event order;
- ``adk-memory-loose/<app>/<user>``: events added without a session id;
- ``adk-memories/<app>/<user>``: memories written with ``add_memory``, and the list
  ``adk:deleted`` of the memory ids ``delete_memory`` removed (never added again), each
  also marked by a list of its own, ``adk:deleted:<sha256 of the id>``, so that an add
  looks up only the ids it adds (the metadata key ``adk:deleted-marked`` counts the
  items of ``adk:deleted`` marked so: an older version's deletions are marked on the
  next add).

``add_memory`` and ``add_events_to_memory`` write each memory under the idempotency key
``adk-memory:<sha256 of its id>``, so a memory already stored is found by its key, not
by reading the conversation; a conversation whose every memory was written so has the
metadata key ``adk:keyed``. One without it (made by an older version, or by
``add_session_to_memory``, which writes a session's memories together) is read whole
to skip stored ids, as before.

Each memory is one message ``{"role": "user" | "assistant", "content": <text>,
"adk_memory": {"id", "author", "timestamp", "content", "custom_metadata"}}``: the
``content`` string (the text parts, thoughts left out, one per line) is what the
indexes see; ``adk_memory.content`` is the ADK ``Content`` JSON given back.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

from google.adk.events import Event
from google.adk.memory import BaseMemoryService
from google.adk.memory.base_memory_service import SearchMemoryResponse
from google.adk.memory.memory_entry import MemoryEntry
from google.adk.sessions import Session
from typing_extensions import override

from histstore import (
    ConflictError,
    ConversationState,
    Hit,
    Message,
    NotFound,
    SemanticIndex,
    Store,
)

from . import StoreTarget, _StoreAdapter, _StoreHandle
from ._adk_memory_records import (
    RECORD,
    RRF,
    entry_memory,
    event_memory,
    fuse,
    id_digest,
    json_safe,
    memory_meta,
    owner,
    query_words,
    record_id,
    session_memory,
    to_entry,
    unique,
)
from ._record_ids import conversation_id

__all__ = ["HiststoreMemoryService"]

DELETED = "adk:deleted"
MARKED = "adk:deleted-marked"
KEYED = "adk:keyed"
_BY = "adk:delete_memory"
_RETRIES = 5


class HiststoreMemoryService(_StoreAdapter, BaseMemoryService):
    """An ADK ``BaseMemoryService`` whose memories are searched by histstore's indexes.

    Args:
        store: a ``Store`` (borrowed, never closed here) or anything
            ``histstore.connect()`` takes (owned: opened on first use, released by
            ``close()`` or ``async with``). Not a scoped view: memory conversations are
            owned per app and user (see the module).
        semantic_index: a ``SemanticIndex`` made on ``store`` (then ``store`` must be
            that ``Store``). Each add embeds the new memories; each search ranks by
            meaning too.
        limit: the most memories a search returns (ADK's in-memory service: 10).

    Scope: an app and user's memories are conversations owned by one store user, and
    ``search_memory`` searches through ``store.scoped(that user)``: the full-text index
    finds the matches and the owner condition keeps that user's only (likewise the
    vectors of the semantic index). Nothing of another app or user is read.

    Ranking: the messages holding every word of the query come first, in
    ``store.search``'s order; then, as ADK's own services match any word, those holding
    some words (more words first, then by reciprocal rank fusion of each word's search
    order); at most the query's first 16 distinct words count. A query is read as words
    only (quotes and operators are not syntax), so no query raises. With a semantic
    index, that ranking and the semantic one are fused (reciprocal rank fusion).

    Adding is idempotent by session: ``add_session_to_memory`` makes the session's
    memory conversation hold one memory per event with text, in event order, writing
    only what is new (a session that grew appends; one whose stored memories no longer
    match, e.g. recreated under the same id, is replaced). ``add_events_to_memory`` and
    ``add_memory`` skip ids already stored there, looking up only the ids they add (see
    the module; each memory is its own write). A ``MemoryEntry.id`` is the event's id
    (else a hash of author, time and content), its ``timestamp`` the event's time in
    ISO 8601 (UTC), and its ``custom_metadata`` holds ``session_id`` and ``event_id``.

    Raises:
        TypeError, ValueError: a bad ``store``, a scoped view, a ``semantic_index``
            without its ``Store``, or a ``limit`` that is not a positive int.
    """

    def __init__(
        self,
        store: StoreTarget,
        semantic_index: SemanticIndex | None = None,
        *,
        limit: int = 10,
    ) -> None:
        if isinstance(store, Store) and store.user is not None:
            raise ValueError("HiststoreMemoryService needs a whole store, not a scoped view")
        if semantic_index is not None:
            if not isinstance(semantic_index, SemanticIndex):
                raise TypeError("semantic_index must be a histstore.SemanticIndex")
            if not isinstance(store, Store):
                raise TypeError("with a semantic_index, store must be the Store it was made on")
        if not isinstance(limit, int) or isinstance(limit, bool):
            raise TypeError("limit must be an int")
        if limit < 1:
            raise ValueError("limit must be at least 1")
        self._handle = _StoreHandle(store)
        self._semantic = semantic_index
        self._limit = limit

    # ------------------------------------------------------------------ adding

    @override
    async def add_session_to_memory(self, session: Session) -> None:
        """Make the session's events with text searchable; again later, only what is new."""
        view = await self._view(session.app_name, session.user_id)
        conversation = session_memory(session.app_name, session.user_id, session.id)
        deleted = await self._deleted(view, session.app_name, session.user_id)
        records = unique(
            r
            for e in session.events
            if (r := event_memory(e, session.id, None)) is not None
            and r[RECORD]["id"] not in deleted
        )
        meta = memory_meta("session", session.app_name, session.user_id, session.id)
        if await _sync(view, conversation, records, meta):
            await self._embed(session.app_name, session.user_id, conversation)

    @override
    async def add_events_to_memory(
        self,
        *,
        app_name: str,
        user_id: str,
        events: Sequence[Event],
        session_id: str | None = None,
        custom_metadata: Mapping[str, object] | None = None,
    ) -> None:
        """Add the events with text, skipping ids already stored for that session.

        Without ``session_id`` they go with the app and user's other loose events.
        ``custom_metadata`` is added to each new memory's ``custom_metadata``.
        """
        if session_id:
            conversation = session_memory(app_name, user_id, session_id)
            meta = memory_meta("session", app_name, user_id, session_id)
        else:
            conversation = conversation_id("adk-memory-loose", app_name, user_id)
            meta = memory_meta("loose", app_name, user_id)
        extra = json_safe(custom_metadata or {})
        records = [r for e in events if (r := event_memory(e, session_id, extra)) is not None]
        await self._append(app_name, user_id, conversation, records, meta)

    @override
    async def add_memory(
        self,
        *,
        app_name: str,
        user_id: str,
        memories: Sequence[MemoryEntry],
        custom_metadata: Mapping[str, object] | None = None,
    ) -> None:
        """Store explicit memories (those with text); an id already stored is skipped.

        A memory without an id gets a hash of its author, time and content (so adding
        an equal one again changes nothing). ``custom_metadata`` is merged under each
        memory's own.
        """
        extra = json_safe(custom_metadata or {})
        records = [r for m in memories if (r := entry_memory(m, extra)) is not None]
        conversation = conversation_id("adk-memories", app_name, user_id)
        await self._append(
            app_name, user_id, conversation, records, memory_meta("memories", app_name, user_id)
        )

    async def _append(
        self,
        app_name: str,
        user_id: str,
        conversation: str,
        records: list[dict[str, Any]],
        meta: dict[str, Any],
    ) -> None:
        view = await self._view(app_name, user_id)
        records = unique(records)
        gone = await self._deleted_of(view, app_name, user_id, [r[RECORD]["id"] for r in records])
        records = [r for r in records if r[RECORD]["id"] not in gone]
        if not records:
            return
        try:
            keyed = (await view.metadata(conversation)).get(KEYED) is True
            found = True
        except NotFound:
            keyed = found = False
        if found and not keyed and await view.count(conversation):
            if await _append_reading(view, conversation, records):
                await self._embed(app_name, user_id, conversation)
            return
        for r in records:
            # The key finds a memory stored before: confirmed if equal, a conflict if
            # not (an id already stored is skipped either way).
            try:
                await view.write(
                    conversation,
                    [r],
                    idempotency_key="adk-memory:" + id_digest(r[RECORD]["id"]),
                    metadata=None if keyed else {**meta, KEYED: True},
                )
            except ConflictError:
                continue
            keyed = True
        await self._embed(app_name, user_id, conversation)

    # ------------------------------------------------------------------ searching

    @override
    async def search_memory(
        self, *, app_name: str, user_id: str, query: str
    ) -> SearchMemoryResponse:
        """The app and user's memories matching ``query``, best first (see the class)."""
        view = await self._view(app_name, user_id)
        words = query_words(query)
        rankings: list[list[Hit]] = []
        if words:
            rankings.append(await self._text_ranking(view, words))
        if self._semantic is not None and query.strip():
            index = self._semantic.scoped(owner(app_name, user_id))
            rankings.append(await index.search(query, k=self._limit))
        hits = rankings[0] if len(rankings) == 1 else fuse(rankings)
        memories: list[MemoryEntry] = []
        seen: set[str] = set()
        for hit in hits:
            entry = to_entry(hit)
            if entry is None or entry.id in seen:
                continue
            seen.add(entry.id or "")
            memories.append(entry)
            if len(memories) == self._limit:
                break
        return SearchMemoryResponse(memories=memories)

    async def _text_ranking(self, view: Store, words: list[str]) -> list[Hit]:
        every = await view.search(" ".join(words), limit=self._limit)
        if len(every) >= self._limit or len(words) == 1:
            return every
        per_word = await asyncio.gather(*(view.search(w, limit=2 * self._limit) for w in words))
        first = {(h.conversation, h.position) for h in every}
        counts: dict[tuple[str, int], int] = {}
        fused: dict[tuple[str, int], float] = {}
        found: dict[tuple[str, int], Hit] = {}
        for hits in per_word:
            for rank, hit in enumerate(hits):
                key = (hit.conversation, hit.position)
                if key in first:
                    continue
                counts[key] = counts.get(key, 0) + 1
                fused[key] = fused.get(key, 0.0) + 1.0 / (RRF + rank)
                found.setdefault(key, hit)
        rest = sorted(found, key=lambda k: (-counts[k], -fused[k], k))
        return [*every, *(found[k] for k in rest)]

    # ------------------------------------------------------------------ deleting

    @override
    async def delete_memory(
        self, *, app_name: str, user_id: str, memory_id: str | None = None
    ) -> None:
        """Remove the memory with this id (from every conversation of the app and user
        that holds it) and keep it from being added again. Reads that user's memory
        conversations; nothing happens for an unknown id or ``None``."""
        if not memory_id:
            return
        view = await self._view(app_name, user_id)
        memories = conversation_id("adk-memories", app_name, user_id)
        await view.list_append(memories, f"{DELETED}:{id_digest(memory_id)}", [memory_id])
        await view.list_append(memories, DELETED, [memory_id])
        for conversation in await view.conversations():
            for _ in range(_RETRIES):
                value = await view.edit(conversation)
                doomed = [
                    i for i, m in enumerate(value.messages) if record_id(m.to_dict()) == memory_id
                ]
                if not doomed:
                    break
                for i in reversed(doomed):
                    value.splice(i, i + 1, [], by=_BY)
                try:
                    await view.commit(value)
                    break
                except ConflictError:
                    continue

    # ------------------------------------------------------------------ helpers

    async def _view(self, app_name: str, user_id: str) -> Store:
        store = await self._store()
        return store.scoped(owner(app_name, user_id))

    async def _deleted(self, view: Store, app_name: str, user_id: str) -> set[str]:
        try:
            ids = await view.list_load(conversation_id("adk-memories", app_name, user_id), DELETED)
        except NotFound:
            return set()
        return {str(i) for i in ids}

    async def _deleted_of(
        self, view: Store, app_name: str, user_id: str, ids: list[str]
    ) -> set[str]:
        """Which of ``ids`` ``delete_memory`` removed, looked up one by one (first
        marking the deletions listed since the last add, see the module)."""
        memories = conversation_id("adk-memories", app_name, user_id)
        try:
            marked = (await view.metadata(memories)).get(MARKED, 0)
            listed = await view.list_len(memories, DELETED)
        except NotFound:
            return set()
        if not isinstance(marked, int) or isinstance(marked, bool) or marked > listed:
            marked = 0
        if marked < listed:
            for i in await view.list_load(memories, DELETED, start=marked):
                await view.list_append(memories, f"{DELETED}:{id_digest(str(i))}", [str(i)])
            await view.merge_metadata(memories, {MARKED: listed})
        return {i for i in ids if await view.list_len(memories, f"{DELETED}:{id_digest(i)}")}

    async def _embed(self, app_name: str, user_id: str, conversation: str) -> None:
        if self._semantic is not None:
            await self._semantic.scoped(owner(app_name, user_id)).update(conversation)


async def _sync(
    view: Store, conversation: str, records: list[dict[str, Any]], meta: dict[str, Any]
) -> bool:
    """Make ``conversation`` hold ``records``, writing only what is new; whether it changed.

    Stored memories are taken to be a prefix of ``records`` when the newest of them is
    the record at its position (a session's events are append-only; each record holds
    its event's id and time): then only the rest is appended. Otherwise (or when the
    conversation changes meanwhile) the conversation is replaced.
    """
    stored = await view.count(conversation)
    if stored == len(records) == 0:
        return False
    if stored <= len(records):
        start = max(0, stored - 1)
        try:
            # `at=start` confirms the newest stored memory and appends the rest in one
            # transaction; a retry or a concurrent add of the same session confirms all.
            # Memories written together, not under their keys: no longer ``KEYED``.
            outcome = await view.write(
                conversation,
                records[start:],
                at=start,
                metadata={**(meta if stored == 0 else {}), KEYED: None},
            )
        except ConflictError:
            pass
        else:
            return (outcome.length or 0) > stored
    messages = tuple(Message.from_dict(r) for r in records)
    await view.save(ConversationState(conversation, messages=messages, metadata=meta))
    return True


async def _append_reading(view: Store, conversation: str, records: list[dict[str, Any]]) -> bool:
    """Append to a conversation holding memories not all written under their keys (see
    the module) the ``records`` whose ids it does not hold, read from the whole
    conversation; whether it wrote any."""
    for _ in range(_RETRIES):
        have: set[Any] = set()
        length = 0
        async for m in view.stream(conversation):  # only the ids are kept
            have.add(record_id(m.to_dict()))
            length += 1
        new = unique(r for r in records if r[RECORD]["id"] not in have)
        if not new:
            return False
        try:
            # `at`: nobody appended since the read (else read again, skip what came).
            await view.write(conversation, new, at=length)
        except ConflictError:
            continue
        return True
    raise ConflictError(f"conversation {conversation!r} kept changing while adding memories")
