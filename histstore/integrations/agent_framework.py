"""A Microsoft Agent Framework ``HistoryProvider`` that keeps a session's messages in a
histstore conversation.

::

    from agent_framework import Agent
    from histstore.integrations.agent_framework import HiststoreHistoryProvider

    async with HiststoreHistoryProvider("chat.db") as history:
        agent = Agent(client=client, context_providers=[history])
        session = agent.create_session(session_id="chat-42")
        await agent.run("Hello", session=session)

The session id is the conversation id (``DEFAULT_SESSION`` when the framework passes
none). Each ``Message`` is stored as one histstore message ``{"role": ...,
"type": "agent_framework", "message": <its JSON>}``: ``message`` is exactly
``Message.to_dict()`` (what the framework's own file history keeps), read back with
``Message.from_dict``; ``role`` is histstore's (``user``, ``assistant``, ``system``,
``tool``) and the text contents, function-call arguments and function results are its
indexed text. A plain histstore message an edit put in (such as the summary ``compact``
makes) reads as a ``Message`` of its role and text.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from histstore import InvalidMessage, Message, indexed_text, validate_id
from histstore.envelopes import agent_framework_role

from . import StoreTarget, _missing_framework, _StoreAdapter, _StoreHandle, _unwrap

try:
    from agent_framework import HistoryProvider
    from agent_framework import Message as AFMessage
except ImportError as _exc:  # pragma: no cover - exercised in a subprocess by the tests
    raise _missing_framework("agent_framework", "agent-framework", _exc) from _exc

__all__ = ["DEFAULT_SESSION", "MESSAGE_TYPE", "HiststoreHistoryProvider"]

MESSAGE_TYPE: Final = "agent_framework"
"""The ``type`` of the histstore message that holds one ``Message``."""
DEFAULT_SESSION: Final = "default"
"""The conversation of a run the framework gives no session id."""


def _envelope(message: AFMessage) -> dict[str, Any]:
    payload = message.to_dict()
    return {"role": agent_framework_role(payload), "type": MESSAGE_TYPE, "message": payload}


def _framework_message(message: Message) -> AFMessage:
    """The ``Message`` of a stored message (see the module's docstring)."""
    data = message.to_dict()
    role = data.get("role")
    if data.get("type") == MESSAGE_TYPE or not isinstance(role, str):
        payload = _unwrap(
            message, MESSAGE_TYPE, "message", "the session is not an Agent Framework message"
        )
        return AFMessage.from_dict(payload)
    return AFMessage(role=role, contents=[indexed_text(message) or ""])


class HiststoreHistoryProvider(HistoryProvider, _StoreAdapter):
    """A ``HistoryProvider`` whose sessions are histstore conversations.

    Args:
        store: a ``Store`` (borrowed, never closed here) or anything
            ``histstore.connect()`` takes (owned: one store per event loop, opened on
            that loop's first use, released when the loop ends or by ``close()`` or
            ``async with``).
        source_id: the provider's id among the agent's context providers.
        load_messages, store_inputs, store_context_messages, store_context_from,
            store_outputs: the framework's own switches (``HistoryProvider``): whether
            a run loads the history first, and which of its messages it stores after.

    ``get_messages`` reads the session's whole history; ``save_messages`` appends a run's
    messages in one transaction, after whatever the session holds then, so two runs
    saving at once never interleave.

    Raises:
        TypeError, ValueError: ``store`` is not a store or a valid target.
    """

    DEFAULT_SOURCE_ID: Final = "histstore"
    """The ``source_id`` the provider takes when none is given."""

    def __init__(
        self,
        store: StoreTarget,
        *,
        source_id: str = DEFAULT_SOURCE_ID,
        load_messages: bool = True,
        store_inputs: bool = True,
        store_context_messages: bool = False,
        store_context_from: set[str] | None = None,
        store_outputs: bool = True,
    ) -> None:
        super().__init__(
            source_id,
            load_messages=load_messages,
            store_inputs=store_inputs,
            store_context_messages=store_context_messages,
            store_context_from=store_context_from,
            store_outputs=store_outputs,
        )
        self._handle = _StoreHandle(store)

    async def get_messages(
        self, session_id: str | None, *, state: dict[str, Any] | None = None, **kwargs: Any
    ) -> list[AFMessage]:
        """The session's messages, oldest first.

        Raises:
            InvalidId: the session id breaks histstore's id rules.
        """
        conversation = validate_id(session_id or DEFAULT_SESSION)
        store = await self._store()
        return [_framework_message(m) async for m in store.stream(conversation)]

    async def save_messages(
        self,
        session_id: str | None,
        messages: Sequence[AFMessage],
        *,
        state: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        """Append messages, all of them or none, after whatever the session holds.

        Raises:
            InvalidId: the session id breaks histstore's id rules.
            InvalidMessage: an item is not a ``Message`` or its JSON cannot be stored
                (nothing is written).
            WriteError: the database failed; see its ``outcome``.
        """
        conversation = validate_id(session_id or DEFAULT_SESSION)
        items = list(messages)
        for item in items:
            if not isinstance(item, AFMessage):
                raise InvalidMessage(f"expected a Message, not {type(item).__name__}")
        if not items:
            return
        store = await self._store()
        await store.write(conversation, [_envelope(m) for m in items])

    async def clear(self, session_id: str | None) -> None:
        """Remove the session's whole history (its conversation). Idempotent."""
        store = await self._store()
        await store.clear(validate_id(session_id or DEFAULT_SESSION))

    def __repr__(self) -> str:
        return f"HiststoreHistoryProvider(source_id={self.source_id!r})"
