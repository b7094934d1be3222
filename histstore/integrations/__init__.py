"""Adapters that keep an agent framework's history in a histstore store.

- ``histstore.integrations.openai_agents.HiststoreSession``: a ``Session`` of the
  OpenAI Agents SDK (``pip install 'histstore[openai-agents]'``).
- ``histstore.integrations.langchain.HiststoreChatMessageHistory``: a LangChain
  ``BaseChatMessageHistory`` (``pip install 'histstore[langchain]'``).
- ``histstore.integrations.adk.HiststoreSessionService``: a Google ADK
  ``BaseSessionService`` (``pip install 'histstore[adk]'``).
- ``histstore.integrations.pydantic_ai.HiststoreMessageHistory``: a Pydantic AI
  message history (``pip install 'histstore[pydantic-ai]'``).
- ``histstore.integrations.strands.HiststoreSessionRepository``: a Strands Agents
  ``SessionRepository`` (and ``HiststoreSessionManager``, Strands'
  ``RepositorySessionManager`` on it) (``pip install 'histstore[strands]'``).
- ``histstore.integrations.llama_index.HiststoreChatStore``: a LlamaIndex
  ``AsyncDBChatStore``, for ``Memory`` (``pip install 'histstore[llamaindex]'``).
- ``histstore.integrations.agent_framework.HiststoreHistoryProvider``: a Microsoft Agent
  Framework ``HistoryProvider`` (``pip install 'histstore[agent-framework]'``).
- ``histstore.integrations.langgraph_store.HiststoreMemoryStore``: LangGraph's long-term
  memory ``BaseStore`` (``pip install 'histstore[langgraph]'``).

Each adapter takes a ``Store`` (borrowed: the adapter never closes it) or anything
``histstore.connect()`` accepts (owned: opened on first use with ``connect()``'s
defaults, and released by the adapter's ``close()`` or ``async with``). For other
options, such as ``pooler="transaction"``, open the store yourself and pass it.
Importing an adapter's module without its framework raises ``ImportError`` naming the
extra to install.

An owned adapter works from any event loop: each loop it is used on gets a store of its
own (connections belong to one loop), opened on that loop's first call and found again
by a dict lookup; the sync methods of the LangGraph, LangChain and Strands adapters run on a
private loop thread. So successive ``asyncio.run`` calls, a framework's own loop,
worker threads with loops of their own and sync calls made inside a running loop (a
notebook cell, an async handler calling sync code) all work. A loop's store is closed when the loop
ends through ``asyncio.run`` (or anything calling ``loop.shutdown_asyncgens()``); a loop
closed without that leaves its store to be released later, its connections terminated
(asyncpg's) or closed (aiosqlite's) without that loop, as soon as another loop opens its
own store or the adapter closes. ``close()`` / ``aclose()`` (or leaving ``async with`` /
``with``) may be called from any thread or loop: it releases every store, on its loop
while that runs, and never raises because a loop has closed. An adapter that is garbage
collected, or still open at interpreter exit, releases its stores the same way. An
in-memory target (``":memory:"``) is a database per store, so per loop: share a
``Store`` instead. An ``AsyncEngine`` target is shared by the stores of every loop, as
given: its pool must suit them (SQLAlchemy: one engine per loop, or ``NullPool``).
"""

from __future__ import annotations

import asyncio
import os
import weakref
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from sqlalchemy import URL
from sqlalchemy.ext.asyncio import AsyncEngine

from histstore import HistStoreError, InvalidMessage, Message, Store, connect

from ._loops import FINALIZER_PATIENCE, LoopStores

__all__ = ["StoreTarget"]

StoreTarget = Store | str | os.PathLike[str] | URL | AsyncEngine | None
"""What an adapter's ``store`` argument takes: a ``Store``, or a ``connect()`` target."""

_A = TypeVar("_A", bound="_StoreAdapter")
T = TypeVar("T")


def _missing_framework(module: str, extra: str, exc: ImportError) -> ImportError:
    """The ``ImportError`` an adapter module raises when its framework is not installed."""
    error = ImportError(
        f"histstore.integrations.{module} needs an optional dependency that is not"
        f" installed ({exc.name or exc}); install it with: pip install 'histstore[{extra}]'"
    )
    error.__cause__ = exc
    return error


def _unwrap(message: Message, kind: str, key: str, describe: str) -> dict[str, Any]:
    """The object under ``key`` of a stored ``{"type": kind, key: {...}}`` record.

    Raises:
        InvalidMessage: the message is not such a record (``f"message {position} of
            {describe}"``; its content is not included).
    """
    data = message.to_dict()
    if data.get("type") != kind or not isinstance(data.get(key), dict):
        raise InvalidMessage(f"message {message.position} of {describe}")
    inner: dict[str, Any] = data[key]
    return inner


class _StoreHandle:
    """The store an adapter works on: borrowed, or owned (one store per event loop, each
    opened by ``connect(store, **options)``).

    A borrowed store is used on whatever loop calls, as any ``Store`` is. An owned one
    is opened on each loop's first call and released when that loop ends or the adapter
    closes (``_loops.LoopStores``); finding it again costs a dict lookup.
    """

    __slots__ = (
        "__weakref__",
        "_borrowed",
        "_closed",
        "_derived",
        "_finalizer",
        "_stores",
        "owned",
    )

    def __init__(self, store: StoreTarget, options: Mapping[str, Any] | None = None) -> None:
        self._borrowed: Store | None = None
        self._stores: LoopStores | None = None
        self._closed = False
        self._finalizer: weakref.finalize[Any, Any] | None = None
        self._derived: dict[Callable[[Store], Any], Any] = {}
        if isinstance(store, Store):
            if options:
                raise TypeError("connect() options are for a URL or path, not for a Store")
            self._borrowed = store
            self.owned = False
        else:
            if store is not None and not isinstance(store, (str, os.PathLike, URL, AsyncEngine)):
                raise TypeError(
                    "store must be a histstore.Store, a file path, a database URL or an"
                    f" AsyncEngine, not {type(store).__name__}"
                )
            # A malformed URL or option fails here, not on first use (nothing opens).
            connect(store, **(options or {}))
            self._stores = LoopStores(store, options)
            # An adapter dropped unclosed, or still open at exit, releases its stores.
            self._finalizer = weakref.finalize(self, self._stores.close, FINALIZER_PATIENCE)
            self.owned = True

    @property
    def closed(self) -> bool:
        """Whether ``close()`` was called."""
        return self._closed

    async def get(self) -> Store:
        """The store: borrowed, or the running loop's own (opened now if it is not yet).

        Raises:
            HistStoreError: the adapter was closed.
        """
        if self._closed:
            raise HistStoreError("the adapter is closed")
        if self._stores is None:
            assert self._borrowed is not None
            return self._borrowed
        entry = self._stores.by_loop.get(asyncio.get_running_loop())
        if entry is not None and entry.store is not None:
            return entry.store
        return await self._stores.open_here()

    async def derived(self, make: Callable[[Store], T]) -> T:
        """``make(store)`` for the store ``get()`` returns, made once per store."""
        if self._stores is not None and not self._closed:
            return await self._stores.derived(make)
        store = await self.get()
        if make not in self._derived:
            self._derived[make] = make(store)
        value: T = self._derived[make]
        return value

    def private_loop(self, thread_name: str) -> asyncio.AbstractEventLoop:
        """The loop of a private thread that runs an owned adapter's sync calls (started on
        first use, stopped by ``close``).

        Raises:
            HistStoreError: the adapter was closed.
        """
        if self._closed or self._stores is None:
            raise HistStoreError("the adapter is closed" if self._closed else "not owned")
        return self._stores.private_loop(thread_name)

    async def close(self) -> None:
        """Release every owned store (each on its loop, or terminated once its loop has
        closed) and the private thread; a borrowed store is left as it is. Idempotent."""
        if self._stores is None:
            return
        self._closed = True
        await self._stores.aclose()
        self._detach()

    def close_sync(self) -> None:
        """``close`` from sync code."""
        if self._stores is None:
            return
        self._closed = True
        self._stores.close()
        self._detach()

    def _detach(self) -> None:
        if self._finalizer is not None:
            self._finalizer.detach()


class _StoreAdapter:
    """The lifetime of an async adapter over a ``_StoreHandle``: ``close()`` and ``async with``."""

    _handle: _StoreHandle

    async def _store(self) -> Store:
        return await self._handle.get()

    async def close(self) -> None:
        """Release an owned store (a borrowed one stays open). Idempotent."""
        await self._handle.close()

    async def __aenter__(self: _A) -> _A:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
