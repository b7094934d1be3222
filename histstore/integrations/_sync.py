"""Sync methods for async adapters: a ``LoopBridge`` runs an adapter's coroutines on the
event loop its store belongs to, from any loop or thread, and ``BridgedAdapter`` gives such
an adapter its ``close``/``aclose`` and ``with``/``async with``.

Used by the LangGraph and LangChain adapters, whose frameworks call sync methods too.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

from histstore import HistStoreError

from . import _StoreHandle

__all__ = ["BridgedAdapter", "LoopBridge", "LoopThread"]

T = TypeVar("T")
R = TypeVar("R")
_B = TypeVar("_B", bound="BridgedAdapter")


class LoopThread:
    """A private event loop, running in a daemon thread, for the sync methods."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        started = threading.Event()
        self.loop.call_soon(started.set)
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
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


class LoopBridge(Generic[R]):
    """Runs operations on an adapter's resource (``R``), on the loop its store belongs to.

    The home loop: for an owned store, the loop of the first call (for a sync call, a
    private ``LoopThread``); for a borrowed store, the loop running when the bridge was
    made, else that of the latest async call. Calls from other loops or threads are
    handed to the home loop; a sync call in a thread whose event loop runs raises
    ``RuntimeError`` naming the async method instead of blocking that loop.

    Args:
        handle: the adapter's store.
        resource: makes (or returns) what operations run on, on the home loop.
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
        self._lock = threading.Lock()
        self._thread: LoopThread | None = None
        self._home: asyncio.AbstractEventLoop | None = None
        if not handle.owned:
            try:
                self._home = asyncio.get_running_loop()
            except RuntimeError:
                self._home = None

    def home_for(self, loop: asyncio.AbstractEventLoop) -> asyncio.AbstractEventLoop:
        """The home loop for an async call on ``loop`` (which becomes it when it may)."""
        self._check_open()
        with self._lock:
            if not self.handle.owned or self._home is None:
                self._home = loop
            return self._home

    async def resource(self) -> R:
        """The resource (call on the home loop)."""
        return await self._resource()

    async def acall(self, op: Callable[[R], Awaitable[T]]) -> T:
        """Run ``op`` on the resource, on the home loop, from async code."""
        loop = asyncio.get_running_loop()
        home = self.home_for(loop)
        if home is loop:
            return await op(await self._resource())
        return await asyncio.wrap_future(self._submit(home, op))

    def call(self, op: Callable[[R], Awaitable[T]], name: str, async_name: str | None = None) -> T:
        """Run ``op`` from sync code (the adapter's method ``name``): on the home loop, or
        on a private loop thread when an owned store has none yet."""
        async_name = async_name or "a" + name
        self.no_loop_here(name, async_name)
        self._check_open()
        with self._lock:
            if self._home is None:
                if not self.handle.owned:
                    noun = self._noun
                    raise RuntimeError(
                        f"{self._owner}.{name} needs the event loop its Store runs on: make"
                        f" the {noun} inside that loop, or call `await {noun}.{async_name}"
                        f"{self._call_args}` there once; or give the {noun} a URL or path"
                        " so that it owns its store"
                    )
                self._thread = LoopThread(self._thread_name)
                self._home = self._thread.loop
            home = self._home
        return self._submit(home, op).result()

    def no_loop_here(self, name: str, async_name: str | None = None) -> None:
        """Raise ``RuntimeError`` when the sync method ``name`` is called on a running loop."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return
        raise RuntimeError(
            f"{self._owner}.{name} is synchronous and cannot run in a thread whose event"
            f" loop is running; use `await {self._noun}.{async_name or 'a' + name}"
            f"{self._call_args}` instead"
        )

    async def aclose(self) -> None:
        """Release an owned store (on its loop) and the private loop thread. Idempotent."""
        with self._lock:
            home, thread = self._home, self._thread
            self._thread = None
        if self.handle.owned and not self.handle.closed:
            if home is None or home is asyncio.get_running_loop():
                await self.handle.close()
            else:
                await asyncio.wrap_future(self._submit_close(home))
        if thread is not None:
            await asyncio.to_thread(thread.stop)

    def close(self) -> None:
        """Sync ``aclose``."""
        self.no_loop_here("close", "aclose")
        with self._lock:
            home, thread = self._home, self._thread
            self._thread = None
        if self.handle.owned and home is not None and not self.handle.closed:
            self._submit_close(home).result()
        if thread is not None:
            thread.stop()

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

    def _submit_close(self, home: asyncio.AbstractEventLoop) -> concurrent.futures.Future[None]:
        if home.is_closed() or not home.is_running():
            raise RuntimeError(
                f"cannot close the {self._noun}'s store: the event loop it was opened on is"
                " no longer running (close it before that loop ends)"
            )
        return asyncio.run_coroutine_threadsafe(self.handle.close(), home)


class BridgedAdapter:
    """``aclose``/``close`` and ``async with``/``with`` of an adapter with a ``LoopBridge``."""

    _bridge: LoopBridge[Any]

    async def aclose(self) -> None:
        """Release an owned store and the private loop thread; a borrowed store is left
        open. Idempotent."""
        await self._bridge.aclose()

    def close(self) -> None:
        """Release an owned store and the private loop thread (sync ``aclose``)."""
        self._bridge.close()

    async def __aenter__(self: _B) -> _B:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __enter__(self: _B) -> _B:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
