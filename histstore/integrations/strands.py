"""A Strands Agents ``SessionRepository`` that keeps its sessions in a histstore store.

::

    from strands import Agent
    from histstore.integrations.strands import HiststoreSessionManager

    with HiststoreSessionManager("session-1", "chat.db") as sessions:
        agent = Agent(model=model, session_manager=sessions)
        agent("Hello")

Layout (every piece is an ordinary histstore conversation, readable with ``Store``):

- A session is the conversation ``strands-session/<session>`` (parts percent-encoded; a
  hash when the id would pass 255 characters): its ``Session`` record is the first item
  of its list ``strands:session`` (whose first append claims the id), its metadata
  ``strands:kind`` (``"session"``) and ``strands:session``.
- An agent is the conversation ``strands-agent/<session>/<agent>``. Its messages are
  its histstore messages, ``message_id`` being the position: each is ``{"role": ...,
  "type": "strands_message", "session_message": <SessionMessage.to_dict()>}``, the
  role (``user``, ``assistant``, ``tool`` for tool results) and indexed text those of
  the message the agent sees, so search, ``histstore show``, ``WindowStore`` and
  ``compact`` understand it. Its metadata holds ``strands:state`` (the agent state),
  ``strands:conversation_manager_state``, ``strands:internal_state``, the agent's
  times, ``strands:kind`` (``"agent"``), ``strands:session`` and ``strands:agent``.
- A multi-agent (``Graph``, ``Swarm``) is ``strands-multi-agent/<session>/<id>``, its
  serialized state in the metadata key ``strands:state``.

``update_message`` (Strands redacting a message a guardrail blocked) is an edit of
histstore's editable history: one change by ``REDACTION_AUTHOR`` replacing that entry
(same entry id), so ``store.changes`` keeps the message as it was before and
``store.revert`` can bring it back.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Final, TypeVar

from histstore import ConflictError, Entry, NotFound, Store

from . import StoreTarget, _missing_framework, _StoreHandle
from ._sync import BridgedAdapter, LoopBridge

try:
    from strands.session.repository_session_manager import RepositorySessionManager
    from strands.session.session_repository import SessionRepository
    from strands.types.exceptions import SessionException
    from strands.types.session import Session, SessionAgent, SessionMessage
except ImportError as _exc:  # pragma: no cover - exercised in a subprocess by the tests
    raise _missing_framework("strands", "strands", _exc) from _exc

from ._strands_records import (
    KIND,
    MULTI_AGENT,
    SESSION,
    SESSION_LIST,
    STATE,
    agent_conversation,
    agent_from_metadata,
    agent_metadata,
    json_data,
    message_record,
    multi_agent_conversation,
    session_conversation,
    session_from_list,
    to_session_message,
)
from ._strands_records import MESSAGE_TYPE as _MESSAGE_TYPE
from ._strands_records import REDACTION_AUTHOR as _REDACTION_AUTHOR

if TYPE_CHECKING:
    from strands.multiagent.base import MultiAgentBase

MESSAGE_TYPE: Final = _MESSAGE_TYPE
"""The ``type`` of the message that holds one ``SessionMessage`` (under ``session_message``)."""
REDACTION_AUTHOR: Final = _REDACTION_AUTHOR
"""The author of the change (and of the entry) an ``update_message`` makes."""

__all__ = [
    "MESSAGE_TYPE",
    "REDACTION_AUTHOR",
    "HiststoreSessionManager",
    "HiststoreSessionRepository",
]

T = TypeVar("T")
_EDIT_ATTEMPTS = 8
"""How often ``update_message`` reloads and retries an edit other writers overtook."""


class HiststoreSessionRepository(BridgedAdapter, SessionRepository):
    """A Strands ``SessionRepository`` on histstore (see the module for the layout).

    Strands calls its methods synchronously, also from inside its own event loop; each
    runs on a loop its store can be used on and the calling thread waits:

    - given a URL or path, the repository owns its store and runs every call on a
      private loop thread, from any thread, inside a running loop or not;
    - given a ``Store``, it runs them on the loop that store is used on (the one running
      when the repository was made): call Strands from another thread then (e.g.
      ``await asyncio.to_thread(agent, "Hi")``); a call made on that loop itself raises
      ``RuntimeError``, since waiting there would never end.

    Semantics follow Strands' ``FileSessionManager``, with histstore's guarantees:
    ``create_message`` stores the message at position ``message_id`` in one transaction
    (the same message again is confirmed, not stored twice; a different message there,
    or a gap, raises ``SessionException`` and stores nothing), ``list_messages(limit=,
    offset=)`` reads only the messages it returns, and ``update_message`` is an edit
    (see the module). Values with no JSON form raise ``InvalidMessage`` before anything
    is written.

    Args:
        store: a ``Store`` (borrowed, never closed here) or anything
            ``histstore.connect()`` takes (owned; released by ``close()`` or ``with``).

    Raises:
        TypeError, ValueError: ``store`` is not a store or a valid target.
    """

    def __init__(self, store: StoreTarget) -> None:
        handle = _StoreHandle(store)
        self._bridge: LoopBridge[Store] = LoopBridge(
            handle,
            handle.get,
            owner="HiststoreSessionRepository",
            noun="repository",
            call_args="()",
            closed="the Strands session repository is closed",
            thread_name="histstore-strands",
        )

    def _run(self, name: str, op: Callable[[Store], Awaitable[T]]) -> T:
        return self._bridge.call_anywhere(op, name)

    # ------------------------------------------------------------------ sessions

    def create_session(self, session: Session, **kwargs: Any) -> Session:
        """Store a new session.

        Raises:
            SessionException: a session with this id exists.
        """
        conversation = session_conversation(session.session_id)
        record = json_data(session.to_dict(), "session")

        async def create(store: Store) -> None:
            if await store.list_append(conversation, SESSION_LIST, [record]) != 1:
                raise SessionException(f"Session {session.session_id} already exists")
            await store.merge_metadata(conversation, {KIND: "session", SESSION: session.session_id})

        self._run("create_session", create)
        return session

    def read_session(self, session_id: str, **kwargs: Any) -> Session | None:
        """The session; ``None`` when there is none."""
        conversation = session_conversation(session_id)

        async def read(store: Store) -> Session | None:
            try:
                return session_from_list(await store.list_load(conversation, SESSION_LIST, limit=1))
            except NotFound:
                return None

        return self._run("read_session", read)

    def delete_session(self, session_id: str, **kwargs: Any) -> None:
        """Delete the session with its agents, their messages and its multi-agents.

        Raises:
            SessionException: there is no such session.
        """

        async def delete(store: Store) -> None:
            found = await store.conversations(metadata={SESSION: session_id})
            if session_conversation(session_id) not in found:
                raise SessionException(f"Session {session_id} does not exist")
            for conversation in found:
                await store.clear(conversation)

        self._run("delete_session", delete)

    # ------------------------------------------------------------------ agents

    def create_agent(self, session_id: str, session_agent: SessionAgent, **kwargs: Any) -> None:
        """Store an agent's record (its state as metadata) in one transaction."""
        metadata = agent_metadata(session_id, session_agent, created=True)
        conversation = agent_conversation(session_id, session_agent.agent_id)

        async def create(store: Store) -> None:
            await store.merge_metadata(conversation, metadata)

        self._run("create_agent", create)

    def read_agent(self, session_id: str, agent_id: str, **kwargs: Any) -> SessionAgent | None:
        """The agent's record; ``None`` when there is none."""
        conversation = agent_conversation(session_id, agent_id)

        async def read(store: Store) -> SessionAgent | None:
            try:
                return agent_from_metadata(await store.metadata(conversation))
            except NotFound:
                return None

        return self._run("read_agent", read)

    def update_agent(self, session_id: str, session_agent: SessionAgent, **kwargs: Any) -> None:
        """Replace an agent's record; its ``created_at`` stays the stored one (and is set
        on ``session_agent``, as Strands' file repository does).

        Raises:
            SessionException: the agent is not stored.
        """
        agent_id = session_agent.agent_id
        metadata = agent_metadata(session_id, session_agent, created=False)
        conversation = agent_conversation(session_id, agent_id)

        async def update(store: Store) -> None:
            try:
                previous = agent_from_metadata(await store.metadata(conversation))
            except NotFound:
                previous = None
            if previous is None:
                raise SessionException(f"Agent {agent_id} in session {session_id} does not exist")
            await store.merge_metadata(conversation, metadata)
            session_agent.created_at = previous.created_at

        self._run("update_agent", update)

    # ------------------------------------------------------------------ messages

    def create_message(
        self, session_id: str, agent_id: str, session_message: SessionMessage, **kwargs: Any
    ) -> None:
        """Store a message at position ``message_id`` of the agent's conversation.

        Raises:
            SessionException: a different message is stored at ``message_id``, or the
                agent holds fewer than ``message_id`` messages; nothing is written.
            InvalidMessage: the message has no JSON form.
        """
        record = message_record(session_message)
        conversation = agent_conversation(session_id, agent_id)
        at = session_message.message_id

        async def create(store: Store) -> None:
            try:
                await store.write(conversation, [record], at=at)
            except ConflictError as exc:
                raise SessionException(
                    f"message {at} of agent {agent_id} in session {session_id}: another"
                    " message is stored there, or the ones before it are missing"
                ) from exc

        self._run("create_message", create)

    def read_message(
        self, session_id: str, agent_id: str, message_id: int, **kwargs: Any
    ) -> SessionMessage | None:
        """The message at position ``message_id``; ``None`` when there is none."""
        conversation = agent_conversation(session_id, agent_id)

        async def read(store: Store) -> SessionMessage | None:
            if not isinstance(message_id, int) or message_id < 0:
                return None
            found = await store.read(conversation, start=message_id, stop=message_id + 1)
            return to_session_message(found[0], message_id) if found else None

        return self._run("read_message", read)

    def update_message(
        self, session_id: str, agent_id: str, session_message: SessionMessage, **kwargs: Any
    ) -> None:
        """Replace the message at position ``message_id`` (a redaction), as one edit by
        ``REDACTION_AUTHOR``; its ``created_at`` stays the stored one. An equal message
        changes nothing. Loads the agent's conversation as an editable value
        (``store.edit``: O(messages)); committing it costs the one entry.

        Raises:
            SessionException: there is no message at ``message_id``.
        """
        conversation = agent_conversation(session_id, agent_id)
        at = session_message.message_id

        async def update(store: Store) -> None:
            for _attempt in range(_EDIT_ATTEMPTS):
                value = await store.edit(conversation)
                if not 0 <= at < len(value.entries):
                    raise SessionException(f"Message {at} does not exist")
                entry = value.entries[at]
                session_message.created_at = to_session_message(entry.message, at).created_at
                record = message_record(session_message)
                if record == entry.message.to_dict():
                    return
                kept = Entry(record, entry_id=entry.entry_id, author=REDACTION_AUTHOR)
                value.splice(at, at + 1, [kept], by=REDACTION_AUTHOR)
                try:
                    await store.commit(value)
                except ConflictError:
                    continue  # another writer got in first: edit what it left
                return
            raise SessionException(f"Message {at} kept changing while it was being updated")

        self._run("update_message", update)

    def list_messages(
        self,
        session_id: str,
        agent_id: str,
        limit: int | None = None,
        offset: int = 0,
        **kwargs: Any,
    ) -> list[SessionMessage]:
        """The agent's messages from position ``offset`` on, at most ``limit`` of them,
        oldest first; reads only those.

        Raises:
            SessionException: the agent is not stored.
        """
        conversation = agent_conversation(session_id, agent_id)
        stop = None if limit is None else offset + max(limit, 0)

        async def read(store: Store) -> list[SessionMessage]:
            found = await store.read(conversation, start=offset, stop=stop)
            if not found and not await store.exists(conversation):
                raise SessionException(f"Agent {agent_id} in session {session_id} does not exist")
            return [to_session_message(m, offset + i) for i, m in enumerate(found)]

        return self._run("list_messages", read)

    # ------------------------------------------------------------------ multi-agents

    def create_multi_agent(
        self, session_id: str, multi_agent: MultiAgentBase, **kwargs: Any
    ) -> None:
        """Store a multi-agent's serialized state."""
        conversation = multi_agent_conversation(session_id, multi_agent.id)
        metadata = {
            KIND: "multi_agent",
            SESSION: session_id,
            MULTI_AGENT: multi_agent.id,
            STATE: json_data(multi_agent.serialize_state(), "multi-agent state"),
        }

        async def create(store: Store) -> None:
            await store.merge_metadata(conversation, metadata)

        self._run("create_multi_agent", create)

    def read_multi_agent(
        self, session_id: str, multi_agent_id: str, **kwargs: Any
    ) -> dict[str, Any] | None:
        """A multi-agent's serialized state; ``None`` when there is none."""
        conversation = multi_agent_conversation(session_id, multi_agent_id)

        async def read(store: Store) -> dict[str, Any] | None:
            try:
                metadata = await store.metadata(conversation)
            except NotFound:
                return None
            state = metadata.get(STATE) if metadata.get(KIND) == "multi_agent" else None
            return state if isinstance(state, dict) else None

        return self._run("read_multi_agent", read)

    def update_multi_agent(
        self, session_id: str, multi_agent: MultiAgentBase, **kwargs: Any
    ) -> None:
        """Replace a multi-agent's serialized state.

        Raises:
            SessionException: the multi-agent is not stored.
        """
        conversation = multi_agent_conversation(session_id, multi_agent.id)
        state = json_data(multi_agent.serialize_state(), "multi-agent state")

        async def update(store: Store) -> None:
            try:
                kind = (await store.metadata(conversation)).get(KIND)
            except NotFound:
                kind = None
            if kind != "multi_agent":
                raise SessionException(
                    f"MultiAgent state {multi_agent.id} in session {session_id} does not exist"
                )
            await store.merge_metadata(conversation, {STATE: state})

        self._run("update_multi_agent", update)

    def close(self) -> None:
        """Release an owned store and the private loop thread (a borrowed store stays
        open), from any thread, a running loop's too: Strands code is sync. Idempotent."""
        self._bridge.handle.close_sync()

    def __repr__(self) -> str:
        return "HiststoreSessionRepository()"


class HiststoreSessionManager(RepositorySessionManager):
    """Strands' ``RepositorySessionManager`` on a ``HiststoreSessionRepository``: pass it
    as ``Agent(session_manager=...)`` (or to a ``Graph`` or ``Swarm``).

    Args:
        session_id: the Strands session id; the session is created when it is not stored.
        store: a ``Store`` (borrowed) or anything ``histstore.connect()`` takes (owned;
            released by ``close()`` or ``with``).

    ``close()``, ``aclose()``, ``with`` and ``async with`` release an owned store.
    """

    def __init__(self, session_id: str, store: StoreTarget, **kwargs: Any) -> None:
        self.repository = HiststoreSessionRepository(store)
        """The session repository this manager reads and writes through."""
        super().__init__(session_id=session_id, session_repository=self.repository, **kwargs)

    def close(self) -> None:
        """Release an owned store (a borrowed one stays open). Idempotent."""
        self.repository.close()

    async def aclose(self) -> None:
        """Release an owned store, from any loop. Idempotent."""
        await self.repository.aclose()

    def __enter__(self) -> HiststoreSessionManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> HiststoreSessionManager:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
