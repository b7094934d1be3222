"""A LangChain ``BaseChatMessageHistory`` that keeps its messages in a histstore store.

::

    from histstore.integrations.langchain import HiststoreChatMessageHistory

    history = HiststoreChatMessageHistory("conv-1", store)
    await history.aadd_messages([HumanMessage("Hi")])
    messages = await history.aget_messages()

Stored shape: each LangChain message is one histstore message, LangChain's own
serialization (``message_to_dict(m)["data"]``: ``type``, ``content``, ``id``, ``name``,
``additional_kwargs``, ``response_metadata``, and per class ``tool_calls``,
``invalid_tool_calls``, ``usage_metadata``, ``tool_call_id``, ``artifact``, ``status``,
...) with a ``role`` key added in front: ``human`` is stored as ``"user"``, ``ai`` as
``"assistant"``, ``system`` as ``"system"``, ``tool`` as ``"tool"``, ``function`` as
``"function"`` (chunks likewise); a ``ChatMessage`` already has its own ``role``. So an
AI message reads ``{"role": "assistant", "type": "ai", "content": ..., "tool_calls":
[{"name": ..., "args": {...}, "id": ..., "type": "tool_call"}], ...}`` and
``histstore.turns``, ``WindowStore`` and ``compact`` understand the history (tool calls
pair with tool messages by ``id`` / ``tool_call_id``), and search finds a message by its
content and its tool calls' ``args`` values. Reading gives back messages equal to those
written. Messages stored by other code in the Chat Completions shape (``{"role":
"user", "content": "Hi"}``) are read through LangChain's ``convert_to_messages``.

Deprecated upstream: langchain-core 1.x (as of 1.8.3) deprecates
``RunnableWithMessageHistory`` since 1.3.3 ("Use LangGraph's built-in persistence
instead") and ``BaseChatMessageHistory`` since 1.6.4, both to be removed in 2.0.0. The
class warns only when instantiated itself, so this subclass emits no warning. New code
should use LangGraph's persistence: ``histstore.integrations.langgraph.HiststoreSaver``
is a checkpointer on the same store.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from histstore import InvalidMessage, Message, validate_id

from . import StoreTarget, _missing_framework, _StoreHandle
from ._sync import BridgedAdapter, LoopBridge

try:
    from langchain_core.chat_history import BaseChatMessageHistory
    from langchain_core.messages import (
        BaseMessage,
        convert_to_messages,
        message_to_dict,
        messages_from_dict,
    )
except ImportError as _exc:  # pragma: no cover - exercised in a subprocess by the tests
    raise _missing_framework("langchain", "langchain", _exc) from _exc

if TYPE_CHECKING:
    from histstore import Store

__all__ = ["HiststoreChatMessageHistory", "from_stored", "to_stored"]

T = TypeVar("T")

# LangChain message types and the role stored beside them. Types whose data carries its
# own ``role`` (``chat``, ``ChatMessageChunk``) are stored as they are.
_ROLES = {
    "human": "user",
    "HumanMessageChunk": "user",
    "ai": "assistant",
    "AIMessageChunk": "assistant",
    "system": "system",
    "SystemMessageChunk": "system",
    "tool": "tool",
    "ToolMessageChunk": "tool",
    "function": "function",
    "FunctionMessageChunk": "function",
    "remove": "remove",
}
_OWN_ROLE = frozenset({"chat", "ChatMessageChunk"})


def to_stored(message: BaseMessage) -> dict[str, Any]:
    """The dict histstore stores for a LangChain message (see the module docstring)."""
    if not isinstance(message, BaseMessage):
        raise InvalidMessage(
            f"a LangChain history takes BaseMessage values, not {type(message).__name__}"
        )
    data: dict[str, Any] = message_to_dict(message)["data"]
    kind: str = data["type"]
    if kind in _OWN_ROLE:
        return data
    return {"role": _ROLES.get(kind, kind), **data}


def from_stored(data: dict[str, Any]) -> BaseMessage:
    """The LangChain message a stored dict stands for; inverse of ``to_stored``.

    Raises:
        ValueError: the dict is neither a stored LangChain message nor a message
            LangChain can convert (its text is not included).
    """
    kind = data.get("type")
    if kind in _ROLES or kind in _OWN_ROLE:
        fields = dict(data)
        if kind in _ROLES:
            fields.pop("role", None)
        return messages_from_dict([{"type": kind, "data": fields}])[0]
    return convert_to_messages([data])[0]


class HiststoreChatMessageHistory(BridgedAdapter, BaseChatMessageHistory):
    """A chat history on one histstore conversation.

    The async methods (``aget_messages``, ``aadd_messages``, ``aclear``) are native.
    The sync ones (``messages``, ``add_messages``, ``clear``) run the same coroutines on
    another loop and wait for them, also in a thread whose event loop runs (a notebook
    cell); only a sync call that would wait on the loop it blocks (a borrowed store's,
    from that loop's thread) raises ``RuntimeError`` naming the async method. Where
    they run:

    - given a URL or path, the history owns its stores: one per event loop, opened on
      the loop's first call (see ``histstore.integrations``); sync calls run on a
      private loop thread the history starts. ``close()`` / ``aclose()`` (or ``with`` /
      ``async with``), from any thread or loop, release the stores and the thread.
    - given a ``Store``, the history runs sync calls on the loop the store is used on:
      the loop running when the history was made, or the loop of its latest async call.
      They work from any thread other than that loop's while it runs (e.g. inside
      ``asyncio.to_thread``); with no such loop they raise ``RuntimeError``.

    Args:
        conversation_id: the conversation id (histstore's id rules apply).
        store: a ``Store`` (borrowed: never closed here) or anything
            ``histstore.connect()`` takes (owned).
        connect_options: ``histstore.connect()``'s keyword arguments for an owned store
            (``{"pooler": "transaction"}`` behind PgBouncer, for instance).

    Raises:
        InvalidId: bad ``conversation_id``.
        TypeError, ValueError: ``store`` is not a store or a valid target, or
            ``connect_options`` are given with a ``Store`` or are not ``connect()``'s.
    """

    def __init__(
        self,
        conversation_id: str,
        store: StoreTarget,
        *,
        connect_options: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self.conversation_id = validate_id(conversation_id)
        handle = _StoreHandle(store, connect_options)
        self._bridge: LoopBridge[Store] = LoopBridge(
            handle,
            handle.get,
            owner="HiststoreChatMessageHistory",
            noun="history",
            call_args="()",
            closed=f"the history of conversation {self.conversation_id!r} is closed",
            thread_name="histstore-langchain",
        )

    # ------------------------------------------------------------------ async API

    async def aget_messages(self) -> list[BaseMessage]:
        """The conversation's messages, oldest first.

        Raises:
            InvalidMessage: a stored message is not one LangChain can read (the error
                names its position, not its content).
        """
        return await self._bridge.acall(self._read)

    async def aadd_messages(self, messages: Sequence[BaseMessage]) -> None:
        """Append messages in one transaction: all of them or none.

        Raises:
            InvalidMessage: a message is not a ``BaseMessage`` or holds a value that
                does not survive JSON (nothing is written).
            WriteError: the database failed; see its ``outcome``.
        """
        batch = [to_stored(m) for m in messages]
        if not batch:
            return

        async def write(store: Store) -> None:
            await store.write(self.conversation_id, batch)

        await self._bridge.acall(write)

    async def aclear(self) -> None:
        """Remove the conversation and everything it holds."""

        async def clear(store: Store) -> None:
            await store.clear(self.conversation_id)

        await self._bridge.acall(clear)

    # ------------------------------------------------------------------ sync API

    @property
    def messages(self) -> list[BaseMessage]:  # type: ignore[override]
        """The conversation's messages, oldest first (sync ``aget_messages``)."""
        return self._bridge.call(self._read, "messages", "aget_messages")

    def add_messages(self, messages: Sequence[BaseMessage]) -> None:
        """Append messages in one transaction (sync ``aadd_messages``)."""
        batch = [to_stored(m) for m in messages]
        if not batch:
            return

        async def write(store: Store) -> None:
            await store.write(self.conversation_id, batch)

        self._bridge.call(write, "add_messages", "aadd_messages")

    def clear(self) -> None:
        """Remove the conversation and everything it holds (sync ``aclear``)."""

        async def clear(store: Store) -> None:
            await store.clear(self.conversation_id)

        self._bridge.call(clear, "clear", "aclear")

    def __repr__(self) -> str:
        return f"HiststoreChatMessageHistory({self.conversation_id!r})"

    # ------------------------------------------------------------------ plumbing

    async def _read(self, store: Store) -> list[BaseMessage]:
        # Streamed: only one page of stored messages is held beside the converted ones.
        return [self._convert(m) async for m in store.stream(self.conversation_id)]

    def _convert(self, message: Message) -> BaseMessage:
        try:
            return from_stored(message.to_dict())
        except (ValueError, TypeError, KeyError, NotImplementedError) as exc:
            raise InvalidMessage(
                f"message {message.position} of conversation {self.conversation_id!r}"
                f" is not a message LangChain can read ({type(exc).__name__})"
            ) from None
