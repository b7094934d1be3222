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
``histstore.turns`` and ``WindowStore`` understand the history (tool calls pair with
tool messages by ``id`` / ``tool_call_id``). Reading gives back messages equal to those
written. Messages stored by other code in the Chat Completions shape (``{"role":
"user", "content": "Hi"}``) are read through LangChain's ``convert_to_messages``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Awaitable, Callable, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

from histstore import HistStoreError, InvalidMessage, Message, validate_id

from . import StoreTarget, _missing_framework, _StoreHandle

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


class _LoopThread:
    """A private event loop, running in a daemon thread, for the sync methods."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        started = threading.Event()
        self.loop.call_soon(started.set)
        self._thread = threading.Thread(target=self._run, name="histstore-langchain", daemon=True)
        self._thread.start()
        started.wait()

    def _run(self) -> None:
        loop = self.loop
        asyncio.set_event_loop(loop)
        try:
            loop.run_forever()
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.run_until_complete(loop.shutdown_default_executor())
        finally:
            loop.close()

    def stop(self) -> None:
        """Stop the loop and wait for the thread to end."""
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()


class HiststoreChatMessageHistory(BaseChatMessageHistory):
    """A chat history on one histstore conversation.

    The async methods (``aget_messages``, ``aadd_messages``, ``aclear``) are native.
    The sync ones (``messages``, ``add_messages``, ``clear``) run the same coroutines
    and raise ``RuntimeError`` (naming the async method) when an event loop runs in the
    calling thread. Where they run:

    - given a URL or path, the history owns its store. The store is opened on the loop
      of the first call: an async call's loop, or, for a sync call, a private loop
      thread the history starts (later async calls then run there too). Calls from
      other threads or loops are handed to that loop. ``close()`` / ``aclose()`` (or
      ``with`` / ``async with``) release the store and the thread.
    - given a ``Store``, the history runs sync calls on the loop the store is used on:
      the loop running when the history was made, or the loop of its latest async call.
      They work from any thread other than that loop's while it runs (e.g. inside
      ``asyncio.to_thread``); with no such loop they raise ``RuntimeError``.

    Args:
        conversation_id: the conversation id (histstore's id rules apply).
        store: a ``Store`` (borrowed: never closed here) or anything
            ``histstore.connect()`` takes (owned).

    Raises:
        InvalidId: bad ``conversation_id``.
        TypeError, ValueError: ``store`` is not a store or a valid target.
    """

    def __init__(self, conversation_id: str, store: StoreTarget) -> None:
        super().__init__()
        self.conversation_id = validate_id(conversation_id)
        self._handle = _StoreHandle(store)
        self._lock = threading.Lock()
        self._thread: _LoopThread | None = None
        self._home: asyncio.AbstractEventLoop | None = None
        if not self._handle.owned:
            try:
                self._home = asyncio.get_running_loop()
            except RuntimeError:
                self._home = None

    # ------------------------------------------------------------------ async API

    async def aget_messages(self) -> list[BaseMessage]:
        """The conversation's messages, oldest first.

        Raises:
            InvalidMessage: a stored message is not one LangChain can read (the error
                names its position, not its content).
        """
        return await self._acall(self._read)

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

        await self._acall(write)

    async def aclear(self) -> None:
        """Remove the conversation and everything it holds."""

        async def clear(store: Store) -> None:
            await store.clear(self.conversation_id)

        await self._acall(clear)

    async def aclose(self) -> None:
        """Release an owned store and the private loop thread; a borrowed store is left
        open. Idempotent."""
        with self._lock:
            home, thread = self._home, self._thread
            self._thread = None
        if self._handle.owned and not self._handle.closed:
            if home is None or home is asyncio.get_running_loop():
                await self._handle.close()
            else:
                await asyncio.wrap_future(self._submit_close(home))
        if thread is not None:
            await asyncio.to_thread(thread.stop)

    # ------------------------------------------------------------------ sync API

    @property
    def messages(self) -> list[BaseMessage]:  # type: ignore[override]
        """The conversation's messages, oldest first (sync ``aget_messages``)."""
        return self._call(self._read, "messages", "aget_messages")

    def add_messages(self, messages: Sequence[BaseMessage]) -> None:
        """Append messages in one transaction (sync ``aadd_messages``)."""
        batch = [to_stored(m) for m in messages]
        if not batch:
            return

        async def write(store: Store) -> None:
            await store.write(self.conversation_id, batch)

        self._call(write, "add_messages", "aadd_messages")

    def clear(self) -> None:
        """Remove the conversation and everything it holds (sync ``aclear``)."""

        async def clear(store: Store) -> None:
            await store.clear(self.conversation_id)

        self._call(clear, "clear", "aclear")

    def close(self) -> None:
        """Release an owned store and the private loop thread (sync ``aclose``)."""
        self._no_loop_here("close", "aclose")
        with self._lock:
            home, thread = self._home, self._thread
            self._thread = None
        if self._handle.owned and home is not None and not self._handle.closed:
            self._submit_close(home).result()
        if thread is not None:
            thread.stop()

    # ------------------------------------------------------------------ context managers

    async def __aenter__(self) -> HiststoreChatMessageHistory:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def __enter__(self) -> HiststoreChatMessageHistory:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"HiststoreChatMessageHistory({self.conversation_id!r})"

    # ------------------------------------------------------------------ plumbing

    async def _read(self, store: Store) -> list[BaseMessage]:
        stored = await store.read(self.conversation_id)
        return [self._convert(m) for m in stored]

    def _convert(self, message: Message) -> BaseMessage:
        try:
            return from_stored(message.to_dict())
        except (ValueError, TypeError, KeyError, NotImplementedError) as exc:
            raise InvalidMessage(
                f"message {message.position} of conversation {self.conversation_id!r}"
                f" is not a message LangChain can read ({type(exc).__name__})"
            ) from None

    async def _acall(self, op: Callable[[Store], Awaitable[T]]) -> T:
        """Run ``op`` on the store, on the loop the store belongs to."""
        loop = asyncio.get_running_loop()
        self._check_open()
        with self._lock:
            if not self._handle.owned or self._home is None:
                self._home = loop
            home = self._home
        if home is loop:
            return await op(await self._handle.get())
        return await asyncio.wrap_future(self._submit(home, op))

    def _check_open(self) -> None:
        if self._handle.closed:
            raise HistStoreError(f"the history of conversation {self.conversation_id!r} is closed")

    def _no_loop_here(self, name: str, async_name: str) -> None:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return
        raise RuntimeError(
            f"HiststoreChatMessageHistory.{name} is synchronous and cannot run in a thread"
            f" whose event loop is running; use `await history.{async_name}()` instead"
        )

    def _call(self, op: Callable[[Store], Awaitable[T]], name: str, async_name: str) -> T:
        """Run ``op`` from sync code: on the store's loop, or on a private loop thread."""
        self._no_loop_here(name, async_name)
        self._check_open()
        with self._lock:
            if self._home is None:
                if not self._handle.owned:
                    raise RuntimeError(
                        f"HiststoreChatMessageHistory.{name} needs the event loop its Store"
                        " runs on: make the history inside that loop, or call"
                        f" `await history.{async_name}()` there once; or give the history a"
                        " URL or path so that it owns its store"
                    )
                self._thread = _LoopThread()
                self._home = self._thread.loop
            home = self._home
        return self._submit(home, op).result()

    def _submit(
        self, home: asyncio.AbstractEventLoop, op: Callable[[Store], Awaitable[T]]
    ) -> concurrent.futures.Future[T]:
        if home.is_closed() or not home.is_running():
            raise RuntimeError("the event loop this history's store runs on is no longer running")

        async def run() -> T:
            return await op(await self._handle.get())

        return asyncio.run_coroutine_threadsafe(run(), home)

    def _submit_close(self, home: asyncio.AbstractEventLoop) -> concurrent.futures.Future[None]:
        if home.is_closed() or not home.is_running():
            raise RuntimeError(
                "cannot close the history's store: the event loop it was opened on is no"
                " longer running (close it before that loop ends)"
            )
        return asyncio.run_coroutine_threadsafe(self._handle.close(), home)
