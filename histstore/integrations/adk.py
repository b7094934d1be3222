"""A Google ADK session service that keeps its sessions in a histstore store.

::

    from google.adk.runners import Runner
    from histstore.integrations.adk import HiststoreSessionService

    async with HiststoreSessionService("chat.db") as sessions:
        runner = Runner(agent=agent, app_name="app", session_service=sessions)

Layout (every piece is an ordinary histstore conversation, readable with ``Store``):

- A session is the conversation ``adk-session/<app>/<user>/<session>`` (each part
  percent-encoded; a hash when the id would pass 255 characters). Each event is one
  message ``{"role": ..., "type": "adk_event", "event": <the event's JSON>}`` at the
  position it was appended at: ``role`` is the event's in histstore's terms (``user``,
  ``assistant`` for the model's, ``tool`` for function responses; none for an event
  without content), and the event's text, function call arguments and function
  responses are its indexed text, so search, ``histstore show``, ``WindowStore`` and
  ``compact`` understand the session. A plain message an edit put in (a summary)
  reads as a text event. The conversation's metadata holds ``adk:kind`` (``"session"``),
  ``adk:app``, ``adk:user``, ``adk:session``, ``adk:updated`` (the session's
  ``last_update_time``) and one key per session state key. The session is owned by its
  ``user_id`` (when that is a valid histstore id), so ``store.scoped(user_id)`` and
  ``histstore ls --user`` find it; given a scoped store, by that store's user.
- App state lives in the metadata of ``adk-app/<app>``, user state in that of
  ``adk-user/<app>/<user>``, one metadata key per state key, so concurrent updates of
  different keys, from any number of tasks, processes or sessions, never lose one.
  ``temp:`` keys are never stored.

Reading a session with ``GetSessionConfig(num_recent_events=n)`` reads only the newest
``n`` events; ``after_timestamp`` walks back from the newest event a page at a time
and stops at the first older one (ADK's in-memory rule), so its cost follows what it
returns, not the session's length.
"""

from __future__ import annotations

import asyncio
import weakref
from typing import Any

from histstore import ConflictError, InvalidId, InvalidMessage, Message, NotFound, Store

from . import StoreTarget, _missing_framework, _StoreAdapter, _StoreHandle

try:
    from google.adk.errors import StaleSessionError
    from google.adk.errors.already_exists_error import AlreadyExistsError
    from google.adk.errors.session_not_found_error import SessionNotFoundError
    from google.adk.events import Event
    from google.adk.platform import time as adk_time
    from google.adk.platform import uuid as adk_uuid
    from google.adk.sessions import BaseSessionService, Session
    from google.adk.sessions.base_session_service import GetSessionConfig, ListSessionsResponse
    from pydantic_core import PydanticSerializationError
    from typing_extensions import override
except ImportError as _exc:  # pragma: no cover - exercised in a subprocess by the tests
    raise _missing_framework("adk", "adk", _exc) from _exc

from ._adk_memory import HiststoreMemoryService as HiststoreMemoryService
from ._adk_records import (
    APP,
    CREATED_LIST,
    KIND,
    SESSION,
    UPDATED,
    USER,
    app_conversation,
    event_data,
    event_key,
    marker_position,
    merged_state,
    set_marker,
    split_state,
    state_from_metadata,
    state_metadata,
    to_events,
    user_conversation,
)
from ._adk_records import EVENT_TYPE as EVENT_TYPE
from ._adk_records import event_record as _event_record
from ._adk_records import session_conversation as _session_conversation
from ._adk_state import merge_scoped, scoped_state, state_of

__all__ = ["HiststoreMemoryService", "HiststoreSessionService"]

_FIRST_PAGE, _MAX_PAGE = 32, 1024


class HiststoreSessionService(_StoreAdapter, BaseSessionService):
    """An ADK ``BaseSessionService`` whose sessions, events and state live in histstore.

    Args:
        store: a ``Store`` (borrowed, never closed here) or anything
            ``histstore.connect()`` takes (owned: one store per event loop, opened on
            that loop's first use, released when the loop ends or by ``close()`` or
            ``async with``).

    Semantics follow ADK's ``InMemorySessionService`` call for call (session ids are
    stripped, an equal event delivered twice is stored once, sessions are listed oldest
    update first), with the stale-writer check of ADK's persistent services:
    ``append_event`` on a session value that no longer reflects the stored session
    (another writer appended since it was loaded) raises ``StaleSessionError`` and stores
    nothing. Appends to one session from this service are serialized, so tasks sharing
    a session value never trip that check.

    State values are stored as JSON (``pydantic_core.to_jsonable_python``, as ADK's
    database service does); a value with no JSON form raises ``InvalidMessage`` before
    anything is written. An event is stored in one transaction and its state delta is
    merged right after (session, app and user state are separate conversations), so a
    process that dies between the two leaves the event stored and its delta unapplied.

    Raises:
        TypeError, ValueError: ``store`` is not a store or a valid target.
    """

    def __init__(self, store: StoreTarget) -> None:
        self._handle = _StoreHandle(store)
        self._locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()

    # ------------------------------------------------------------------ sessions

    @override
    async def create_session(
        self,
        *,
        app_name: str,
        user_id: str,
        state: dict[str, Any] | None = None,
        session_id: str | None = None,
    ) -> Session:
        """Create a session; ``app:`` and ``user:`` keys of ``state`` go to app and user state.

        Raises:
            AlreadyExistsError: a session with this id exists.
            InvalidMessage: a state value has no JSON form.
        """
        store = await self._store()
        session_id = (session_id.strip() if session_id else None) or adk_uuid.new_uuid()
        app_state, user_state, session_state = split_state(state)
        conversation = _session_conversation(app_name, user_id, session_id)
        now = adk_time.get_time()
        # The first append to this list claims the id (and makes the session the user's):
        # list_append is atomic and returns the new length, so of two racing creators
        # exactly one sees 1. NotFound: the id is taken by a session of no owner.
        try:
            claimed = await _owned_by(store, user_id).list_append(conversation, CREATED_LIST, [now])
        except NotFound:
            claimed = 0
        if claimed != 1:
            raise AlreadyExistsError(f"Session with id {session_id} already exists.")
        await merge_scoped(store, app_name, user_id, app_state, user_state)
        await store.merge_metadata(
            conversation,
            {
                KIND: "session",
                APP: app_name,
                USER: user_id,
                SESSION: session_id,
                UPDATED: now,
                **state_metadata(session_state),
            },
        )
        app_now, user_now = await scoped_state(store, app_name, user_id)
        session = Session(
            app_name=app_name,
            user_id=user_id,
            id=session_id,
            state=merged_state(session_state, app_now, user_now),
            last_update_time=now,
        )
        set_marker(session, 0)
        return session

    @override
    async def get_session(
        self,
        *,
        app_name: str,
        user_id: str,
        session_id: str,
        config: GetSessionConfig | None = None,
    ) -> Session | None:
        """The session with the events ``config`` selects (all by default); ``None`` if unknown.

        ``num_recent_events=n`` keeps the newest ``n``; ``after_timestamp=t`` then keeps
        the newest events up to (not including) the newest one older than ``t``.
        """
        store = await self._store()
        session_id = session_id.strip() if session_id else session_id
        conversation = _session_conversation(app_name, user_id, session_id)
        # The length first, then the state: a delta merged in between belongs to an event
        # past the length, and then the next append fails the stale check, as it should.
        length = await store.count(conversation)
        try:
            metadata = await store.metadata(conversation)
        except NotFound:
            return None
        if metadata.get(KIND) != "session":
            return None
        events = await self._read_events(store, conversation, length, config)
        app_state, user_state = await scoped_state(store, app_name, user_id)
        session = Session(
            app_name=app_name,
            user_id=user_id,
            id=session_id,
            state=merged_state(state_from_metadata(metadata), app_state, user_state),
            events=events,
            last_update_time=metadata[UPDATED],
        )
        set_marker(session, length)
        return session

    async def _read_events(
        self, store: Store, conversation: str, length: int, config: GetSessionConfig | None
    ) -> list[Event]:
        recent = config.num_recent_events if config else None
        after = config.after_timestamp if config else None
        if recent == 0 or length == 0:
            return []
        if after is None:
            return to_events(await store.read(conversation, stop=length, limit=recent))
        lowest = 0 if recent is None else max(0, length - recent)
        kept: list[Message] = []
        stop, page = length, _FIRST_PAGE
        while stop > lowest:
            start = max(lowest, stop - page)
            chunk = await store.read(conversation, start=start, stop=stop)
            for message in reversed(chunk):
                if event_data(message)["timestamp"] < after:
                    return to_events(kept[::-1])
                kept.append(message)
            stop, page = start, min(page * 2, _MAX_PAGE)
        return to_events(kept[::-1])

    @override
    async def list_sessions(
        self, *, app_name: str, user_id: str | None = None
    ) -> ListSessionsResponse:
        """Every session of the app (of one user when given), without events.

        Ordered as ADK orders them: by ``last_update_time``, then user id, then session
        id. The installed ADK defines no paging for this call, so all are returned.
        """
        store = await self._store()
        wanted: dict[str, Any] = {KIND: "session", APP: app_name}
        if user_id is not None:
            wanted[USER] = user_id
        ids = await store.conversations(metadata=wanted)
        found = await asyncio.gather(*(self._metadata_or_none(store, c) for c in ids))
        metadatas = [m for m in found if m is not None]
        users = sorted({m[USER] for m in metadatas})
        app_state = await state_of(store, app_conversation(app_name))
        user_states = await asyncio.gather(
            *(state_of(store, user_conversation(app_name, u)) for u in users)
        )
        by_user = dict(zip(users, user_states, strict=True))
        sessions = [
            Session(
                app_name=app_name,
                user_id=m[USER],
                id=m[SESSION],
                state=merged_state(state_from_metadata(m), app_state, by_user[m[USER]]),
                last_update_time=m[UPDATED],
            )
            for m in metadatas
        ]
        sessions.sort(key=lambda s: (s.last_update_time, s.user_id, s.id))
        return ListSessionsResponse(sessions=sessions)

    @override
    async def delete_session(self, *, app_name: str, user_id: str, session_id: str) -> None:
        """Delete a session and its events (app and user state stay). Idempotent."""
        store = await self._store()
        session_id = session_id.strip() if session_id else session_id
        await store.clear(_session_conversation(app_name, user_id, session_id))

    @override
    async def get_user_state(self, *, app_name: str, user_id: str) -> dict[str, Any]:
        """The user's state, keys without the ``user:`` prefix; ``{}`` when there is none."""
        store = await self._store()
        return await state_of(store, user_conversation(app_name, user_id))

    # ------------------------------------------------------------------ events

    @override
    async def append_event(self, session: Session, event: Event) -> Event:
        """Store a (non-partial) event and its state delta, and add both to ``session``.

        Raises:
            SessionNotFoundError: the session is not stored.
            StaleSessionError: another writer appended since ``session`` was loaded.
            InvalidMessage: the event or a state value has no JSON form.
        """
        if event.partial:
            return event
        store = await self._store()
        conversation = _session_conversation(session.app_name, session.user_id, session.id)
        lock = self._locks.get(conversation)
        if lock is None:
            lock = self._locks[conversation] = asyncio.Lock()
        async with lock:
            return await self._append(store, conversation, session, event)

    async def _append(
        self, store: Store, conversation: str, session: Session, event: Event
    ) -> Event:
        at = marker_position(session)
        if not at and not await store.exists(conversation):
            # At 0 a write would create the conversation; past 0, a missing one makes
            # the write conflict, and the conflict is told apart below.
            raise SessionNotFoundError(f"Session {session.id} not found.")
        self._apply_temp_state(session, event)
        event = self._trim_temp_delta_state(event)
        app_delta, user_delta, session_delta = split_state(event.actions.state_delta)
        try:
            record = _event_record(event)
        except (PydanticSerializationError, TypeError, ValueError) as exc:
            raise InvalidMessage("an ADK event cannot be stored as JSON") from exc
        key = event_key(record)
        if at is None:
            at = await self._unmarked_position(store, conversation, session)
        try:
            # The idempotency key is the event's content: an equal event delivered again is
            # confirmed, not stored twice (as InMemorySessionService does). `at` is the
            # optimistic check that nobody appended since the session value was loaded.
            # The session's state delta and update time go with the event, in its
            # transaction: a crash never keeps one without the other.
            outcome = await store.write(
                conversation,
                [record],
                at=at,
                idempotency_key=key,
                metadata={UPDATED: event.timestamp, **state_metadata(session_delta)},
            )
        except ConflictError as exc:
            if not await store.exists(conversation):
                raise SessionNotFoundError(f"Session {session.id} not found.") from exc
            raise StaleSessionError(
                "The session has been modified in storage since it was loaded."
                " Please reload the session before appending more events."
            ) from exc
        if outcome.length == at:  # an equal event was already stored: nothing changes
            return event
        await merge_scoped(store, session.app_name, session.user_id, app_delta, user_delta)
        session.last_update_time = event.timestamp
        set_marker(session, at + 1)
        return self._commit_event_to_session(session, event)

    async def _unmarked_position(self, store: Store, conversation: str, session: Session) -> int:
        """Where to append for a session value this service did not load (e.g. a listed one).

        As ADK's database service does for such values: stale when the stored session moved
        past ``session.last_update_time`` and its newest event is not the value's newest.
        A plain message an edit put in (a summary) has no event time to compare: edits do
        not move the session's update time, so it is not taken for a newer event.
        """
        newest = await store.read(conversation, limit=1)
        if not newest:
            return 0
        data = event_data(newest[0])
        stored_event = newest[0].get("type") == EVENT_TYPE
        if (
            stored_event
            and data["timestamp"] > session.last_update_time
            and not (session.events and session.events[-1].id == data.get("id"))
        ):
            raise StaleSessionError(
                "The session has been modified in storage since it was loaded."
                " Please reload the session before appending more events."
            )
        position = newest[0].position
        assert position is not None
        return position + 1

    @staticmethod
    async def _metadata_or_none(store: Store, conversation: str) -> dict[str, Any] | None:
        try:
            return await store.metadata(conversation)
        except NotFound:  # deleted since it was listed
            return None


def _owned_by(store: Store, user_id: str) -> Store:
    """The view a session of ``user_id`` is created through: one scoped to the user, so
    the session is theirs (``store.scoped(user_id)`` and ``histstore ls --user`` find
    it); the store itself when it is a scoped view already (its user owns what it
    makes) or when ``user_id`` is no valid histstore id (the session has no owner)."""
    if store.user is not None:
        return store
    try:
        return store.scoped(user_id)
    except InvalidId:
        return store
