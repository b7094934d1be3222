"""Sync methods for async adapters: a ``LoopBridge`` runs an adapter's coroutines on a
loop its store can be used on, from any loop or thread, and ``BridgedAdapter`` gives such
an adapter its ``close``/``aclose`` and ``with``/``async with``.

Used by the LangGraph and LangChain adapters, whose frameworks call sync methods too.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

from histstore import HistStoreError

from . import _StoreHandle

__all__ = ["BridgedAdapter", "LoopBridge"]

T = TypeVar("T")
R = TypeVar("R")
_B = TypeVar("_B", bound="BridgedAdapter")


class LoopBridge(Generic[R]):
    """Runs operations on an adapter's resource (``R``), on a loop its store can be used on.

    Async calls run on the calling loop: an owned store has one store per loop (see
    ``_StoreHandle``), a borrowed one is used where it is called. Sync calls of an owned
    adapter run on its private ``_loops.LoopThread`` (started on the first one); those of a
    borrowed one are handed to the loop the store is used on: the loop running when the
    bridge was made, else that of the latest async call. A sync call may be made from a
    thread whose event loop runs (a notebook cell, an async handler calling sync code):
    it blocks that loop until the operation, running on the other loop, is done, as
    LangGraph's own sync savers do. Only a call that would wait on the loop it blocks (a
    borrowed store's, from that loop's own thread) raises ``RuntimeError`` naming the
    async method instead of deadlocking.

    Args:
        handle: the adapter's store.
        resource: makes (or returns) what operations run on, on the calling loop.
        owner: the adapter's class name, for error messages.
        noun: what users call the adapter (``saver``, ``history``), for error messages.
        call_args: how an async call is written in messages (``"()"`` or ``"(...)"``).
        closed: the message of the ``HistStoreError`` raised after ``close()``.
        thread_name: the name of the private loop thread.
    """

    def __init__(
        self,
        handle: _StoreHandle,
        resource: Callable[[], Awaitable[R]],
        *,
        owner: str,
        noun: str,
        call_args: str,
        closed: str,
        thread_name: str,
    ) -> None:
        self.handle = handle
        self._resource = resource
        self._owner = owner
        self._noun = noun
        self._call_args = call_args
        self._closed = closed
        self._thread_name = thread_name
        self._home: asyncio.AbstractEventLoop | None = None
        if not handle.owned:
            try:
                self._home = asyncio.get_running_loop()
            except RuntimeError:
                self._home = None

    def home_for(self, loop: asyncio.AbstractEventLoop) -> asyncio.AbstractEventLoop:
        """The loop an async call on ``loop`` runs on: ``loop`` itself (a borrowed store's
        sync calls then go there too)."""
        self._check_open()
        if not self.handle.owned:
            self._home = loop
        return loop

    async def resource(self) -> R:
        """The resource of the running loop's store."""
        return await self._resource()

    async def acall(self, op: Callable[[R], Awaitable[T]]) -> T:
        """Run ``op`` on the resource, on the running loop."""
        self.home_for(asyncio.get_running_loop())
        return await op(await self._resource())

    def call(self, op: Callable[[R], Awaitable[T]], name: str, async_name: str | None = None) -> T:
        """Run ``op`` from sync code (the adapter's method ``name``) and wait for it, also
        in a thread whose event loop runs (see the class)."""
        home = self._sync_home(name, async_name)
        return self._submit(home, op).result()

    def call_anywhere(self, op: Callable[[R], Awaitable[T]], name: str) -> T:
        """``call`` for an adapter whose sync method ``name`` has no async twin (a
        framework calling sync hooks from its own loop): the refusal on the store's own
        loop says to call it from another thread."""
        instead = "call it from another thread (e.g. asyncio.to_thread)"
        home = self._sync_home(name, None, instead=instead)
        return self._submit(home, op).result()

    def refuse_own_loop(self, name: str, async_name: str | None = None) -> None:
        """Raise what ``call`` would, before any work: ``RuntimeError`` when the sync
        method ``name`` would wait on the loop running in this thread, ``HistStoreError``
        when the adapter is closed."""
        self._sync_home(name, async_name)

    def _sync_home(
        self, name: str, async_name: str | None, *, instead: str | None = None
    ) -> asyncio.AbstractEventLoop:
        """The loop a sync call runs on (never the one running in this thread)."""
        async_name = async_name or "a" + name
        self._check_open()
        home = self._home
        if self.handle.owned:
            try:
                home = self.handle.private_loop(self._thread_name)
            except HistStoreError:
                raise HistStoreError(self._closed) from None
        elif home is None:
            noun = self._noun
            raise RuntimeError(
                f"{self._owner}.{name} needs the event loop its Store runs on: make"
                f" the {noun} inside that loop, or call `await {noun}.{async_name}"
                f"{self._call_args}` there once; or give the {noun} a URL or path"
                " so that it owns its store"
            )
        if home is _running_loop() and instead is not None:
            raise RuntimeError(
                f"{self._owner}.{name} is synchronous and its Store runs on this thread's"
                f" event loop: {instead}, or give the {self._noun} a"
                " URL or path so that it owns its store"
            )
        if home is _running_loop():
            raise RuntimeError(
                f"{self._owner}.{name} is synchronous and would block the event loop its"
                f" Store runs on, in this thread; use `await {self._noun}.{async_name}"
                f"{self._call_args}` instead (or give the {self._noun} a URL or path, so"
                " that its sync calls run on a loop of their own)"
            )
        return home

    async def aclose(self) -> None:
        """Release the owned stores (each on its loop, or terminated once that loop has
        closed) and the private loop thread, from any loop. Idempotent."""
        await self.handle.close()

    def close(self) -> None:
        """Sync ``aclose``, from any thread, a running loop's included: the stores of
        other loops are released before it returns; that of a loop running in this
        thread as soon as the loop runs again (it cannot be awaited here)."""
        self.handle.close_sync()

    def _check_open(self) -> None:
        if self.handle.closed:
            raise HistStoreError(self._closed)

    def _submit(
        self, home: asyncio.AbstractEventLoop, op: Callable[[R], Awaitable[T]]
    ) -> concurrent.futures.Future[T]:
        if home.is_closed() or not home.is_running():
            raise RuntimeError(
                f"the event loop this {self._noun}'s store runs on is no longer running"
            )

        async def run() -> T:
            return await op(await self._resource())

        return asyncio.run_coroutine_threadsafe(run(), home)


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


class BridgedAdapter:
    """``aclose``/``close`` and ``async with``/``with`` of an adapter with a ``LoopBridge``."""

    _bridge: LoopBridge[Any]

    async def aclose(self) -> None:
        """Release the owned stores (from any loop; see ``histstore.integrations``) and the
        private loop thread; a borrowed store is left open. Idempotent."""
        await self._bridge.aclose()

    def close(self) -> None:
        """Release the owned stores and the private loop thread (sync ``aclose``)."""
        self._bridge.close()

    async def __aenter__(self: _B) -> _B:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __enter__(self: _B) -> _B:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
