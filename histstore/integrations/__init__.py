"""Adapters that keep an agent framework's history in a histstore store.

- ``histstore.integrations.openai_agents.HiststoreSession``: a ``Session`` of the
  OpenAI Agents SDK (``pip install 'histstore[openai-agents]'``).
- ``histstore.integrations.langchain.HiststoreChatMessageHistory``: a LangChain
  ``BaseChatMessageHistory`` (``pip install 'histstore[langchain]'``).
- ``histstore.integrations.adk.HiststoreSessionService``: a Google ADK
  ``BaseSessionService`` (``pip install 'histstore[adk]'``).
- ``histstore.integrations.pydantic_ai.HiststoreMessageHistory``: a Pydantic AI
  message history (``pip install 'histstore[pydantic-ai]'``).

Each adapter takes a ``Store`` (borrowed: the adapter never closes it) or anything
``histstore.connect()`` accepts (owned: opened on first use with ``connect()``'s
defaults, and released by the adapter's ``close()`` or ``async with``). For other
options, such as ``pooler="transaction"``, open the store yourself and pass it.
Importing an adapter's module without its framework raises ``ImportError`` naming the
extra to install.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any, TypeVar

from sqlalchemy import URL
from sqlalchemy.ext.asyncio import AsyncEngine

from histstore import HistStoreError, InvalidMessage, Message, Store, connect

__all__ = ["StoreTarget"]

StoreTarget = Store | str | os.PathLike[str] | URL | AsyncEngine | None
"""What an adapter's ``store`` argument takes: a ``Store``, or a ``connect()`` target."""

_A = TypeVar("_A", bound="_StoreAdapter")


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
    """The store an adapter works on: borrowed, or owned and opened on first use.

    An owned store is opened on the event loop of its first use and belongs to that loop
    (its connections do); using it from another loop raises ``RuntimeError``. A
    borrowed store is used on whatever loop calls, as any ``Store`` is.
    """

    __slots__ = ("_closed", "_loop", "_opening", "_store", "_target", "owned")

    def __init__(self, store: StoreTarget) -> None:
        self._store: Store | None = None
        self._target: object = None
        self._opening: asyncio.Task[Store] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False
        if isinstance(store, Store):
            self._store = store
            self.owned = False
        else:
            if store is not None and not isinstance(store, (str, os.PathLike, URL, AsyncEngine)):
                raise TypeError(
                    "store must be a histstore.Store, a file path, a database URL or an"
                    f" AsyncEngine, not {type(store).__name__}"
                )
            connect(store)  # a malformed URL fails here, not on first use (nothing opens)
            self._target = store
            self.owned = True

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        """The loop an owned store was opened on; ``None`` before that (or when borrowed)."""
        return self._loop

    @property
    def closed(self) -> bool:
        """Whether ``close()`` was called."""
        return self._closed

    async def get(self) -> Store:
        """The store, opened on the running loop when owned and not yet open.

        Raises:
            HistStoreError: the adapter was closed.
            RuntimeError: an owned store is used from a loop other than its own.
        """
        if self._closed:
            raise HistStoreError("the adapter is closed")
        if not self.owned:
            assert self._store is not None
            return self._store
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = loop
            self._opening = loop.create_task(self._open())
        elif self._loop is not loop:
            raise RuntimeError(
                "the adapter's store was opened on another event loop; an adapter given a"
                " URL or path belongs to the loop that first used it"
            )
        if self._store is not None:
            return self._store
        assert self._opening is not None
        return await asyncio.shield(self._opening)

    async def _open(self) -> Store:
        try:
            store = await connect(self._target)  # type: ignore[arg-type]
        except BaseException:
            self._loop = self._opening = None  # the next call tries again
            raise
        self._store = store
        return store

    async def close(self) -> None:
        """Close an owned store (on its own loop); a borrowed one is left as it is. Idempotent."""
        if not self.owned:
            return
        if self._loop is not None and self._loop is not asyncio.get_running_loop():
            raise RuntimeError("an owned store must be closed on the event loop it was opened on")
        self._closed = True
        opening, self._opening = self._opening, None
        if opening is not None and not opening.done():
            await asyncio.wait([opening])
        store, self._store = self._store, None
        if store is not None:
            await store.close()


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
