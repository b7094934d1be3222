"""The stores an adapter owns (given a URL or path): one per event loop.

A store's connections belong to the loop that opened them, so an owned target gets a
store per loop, opened on the loop's first call (``LoopStores.open_here``) and found
again by a dict lookup. Each is released:

- when its loop shuts down (``asyncio.run``, ``asyncio.Runner``, pytest-asyncio, ...):
  ``loop.shutdown_asyncgens()`` closes the async generator ``_until_loop_ends`` left
  suspended on the loop, whose ``finally`` closes the store while the loop still runs;
- when the adapter closes or is garbage collected (``close``, ``aclose``, the
  finalizer), from any thread or loop: on its own loop while that runs (handed over),
  by running it while it is idle, or, once it has closed, on any other loop, where the
  store's connections are terminated instead of awaited (``Store.close`` does that);
- when the loop is found closed as another loop opens its store.

``LoopThread`` is the private loop the sync methods of an owned adapter run on.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable, Mapping
from typing import Any, TypeVar

from histstore import HistStoreError, Store, connect

__all__ = ["FINALIZER_PATIENCE", "LoopStores", "LoopThread"]

T = TypeVar("T")

_POLL = 0.05
"""Seconds between checks that a loop a close waits on has not closed meanwhile."""
FINALIZER_PATIENCE = 10.0
"""Seconds an adapter's finalizer waits for a running loop to close its store."""


class LoopThread:
    """A private event loop, running in a daemon thread, for the sync methods.

    Stopping it ends the loop as ``asyncio.run`` does (pending tasks cancelled, async
    generators closed, so the stores opened on it are released), then closes it.
    """

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
            pending = asyncio.all_tasks(loop)
            for task in pending:
                task.cancel()
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.run_until_complete(loop.shutdown_default_executor())
        finally:
            loop.close()

    def stop(self, timeout: float | None = None) -> None:
        """Stop the loop and wait for the thread to end (not when called from it)."""
        if not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self.loop.stop)
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)


class _Entry:
    """The store of one loop: being opened (``opening``), then open (``store``)."""

    __slots__ = ("derived", "loop", "opening", "store", "watch")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.opening: asyncio.Task[Store] | None = None
        self.store: Store | None = None
        self.watch: AsyncGenerator[None, None] | None = None
        self.derived: dict[Callable[[Store], Any], Any] = {}


class LoopStores:
    """The stores opened from one ``connect()`` target (with ``options``, ``connect()``'s
    keyword arguments), one per event loop (see module).

    Thread-safe. ``closed`` once ``aclose``/``close`` ran: nothing opens any more.
    """

    def __init__(self, target: object, options: Mapping[str, Any] | None = None) -> None:
        self._target = target
        self._options = dict(options or {})
        self._entries: dict[asyncio.AbstractEventLoop, _Entry] = {}
        self.by_loop: Mapping[asyncio.AbstractEventLoop, _Entry] = self._entries
        """Each loop's entry, to read without the lock (changed only under it)."""
        self._lock = threading.Lock()
        self._thread: LoopThread | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.closed = False

    # ------------------------------------------------------------------ using

    async def open_here(self) -> Store:
        """The running loop's store, opened now unless it is being opened already.

        Raises:
            HistStoreError: the adapter was closed.
        """
        loop = asyncio.get_running_loop()
        ended: list[_Entry] = []
        with self._lock:
            if self.closed:
                raise HistStoreError("the adapter is closed")
            entry = self._entries.get(loop)
            if entry is None:
                ended = [e for e in self._entries.values() if e.loop.is_closed()]
                for old in ended:
                    del self._entries[old.loop]
                entry = self._entries[loop] = _Entry(loop)
                entry.opening = loop.create_task(self._open(entry, ended))
        if entry.store is not None:
            return entry.store
        assert entry.opening is not None
        return await asyncio.shield(entry.opening)

    async def derived(self, make: Callable[[Store], T]) -> T:
        """``make(store)`` for the running loop's store, made once per store."""
        loop = asyncio.get_running_loop()
        entry = self._entries.get(loop)
        if entry is None or entry.store is None:
            store = await self.open_here()
            entry = self._entries.get(loop)
            if entry is None or entry.store is not store:  # released meanwhile: not kept
                return make(store)
        assert entry.store is not None
        if make not in entry.derived:
            entry.derived[make] = make(entry.store)
        value: T = entry.derived[make]
        return value

    def private_loop(self, name: str) -> asyncio.AbstractEventLoop:
        """The loop of the private thread (started on first use) that runs sync calls.

        Raises:
            HistStoreError: the adapter was closed.
        """
        thread = self._thread
        if thread is not None:
            return thread.loop
        with self._lock:
            if self.closed:
                raise HistStoreError("the adapter is closed")
            if self._thread is None:
                self._thread = LoopThread(name)
            return self._thread.loop

    async def _open(self, entry: _Entry, ended: list[_Entry]) -> Store:
        if ended:  # stores of loops found closed: released here, not left to pile up
            await _report(entry.loop, [self.release(e) for e in ended])
        try:
            store = await connect(self._target, **self._options)  # type: ignore[arg-type]
        except BaseException:
            with self._lock:
                if self._entries.get(entry.loop) is entry:
                    del self._entries[entry.loop]  # the next call tries again
            raise
        entry.store = store
        watch = _until_loop_ends(self, entry)
        await watch.asend(None)
        entry.watch = watch
        return store

    # ------------------------------------------------------------------ releasing

    async def release(self, entry: _Entry) -> None:
        """Close ``entry``'s store: call on its loop, or on any loop once that has closed."""
        with self._lock:
            if self._entries.get(entry.loop) is entry:
                del self._entries[entry.loop]
        opening, entry.opening = entry.opening, None
        if opening is not None and not opening.done() and not entry.loop.is_closed():
            await asyncio.wait([opening])  # running here: let it finish, then close it
        store, entry.store = entry.store, None
        watch, entry.watch = entry.watch, None
        entry.derived.clear()
        try:
            if store is not None:
                await store.close()
        finally:
            if watch is not None:
                if entry.loop.is_closed():
                    _finish(watch)
                else:
                    await watch.aclose()

    async def aclose(self) -> None:
        """Release every store and the private thread, from the running loop. Idempotent."""
        here = asyncio.get_running_loop()
        entries, thread = self._take_all()
        for entry in entries:
            if entry.loop is here or entry.loop.is_closed():
                await self.release(entry)
            else:
                await asyncio.to_thread(self._release_elsewhere, entry)
        if thread is not None:
            await asyncio.to_thread(thread.stop)

    def close(self, patience: float | None = None) -> None:
        """Release every store and the private thread, from sync code. Idempotent.

        Also the adapter's finalizer (a loop may run in this thread then), which waits
        at most ``patience`` seconds for each loop still running to do its part.
        """
        here = _running_loop()
        entries, thread = self._take_all()
        for entry in entries:
            if entry.loop is here:  # cannot wait here: the release runs when this returns
                task = here.create_task(self.release(entry))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
            else:
                _off_loop(lambda e=entry: self._release_elsewhere(e, patience))  # type: ignore[misc]
        if thread is not None:
            thread.stop(patience)

    def _take_all(self) -> tuple[list[_Entry], LoopThread | None]:
        with self._lock:
            self.closed = True
            entries = list(self._entries.values())
            self._entries.clear()
            thread, self._thread = self._thread, None
        return entries, thread

    def _release_elsewhere(self, entry: _Entry, patience: float | None = None) -> None:
        """Release ``entry`` from a thread running no loop: handed to its loop while that
        runs (waiting at most ``patience`` seconds), run on it while it is idle, else
        (closed) on a new loop here."""
        loop = entry.loop
        if not loop.is_closed() and loop.is_running():
            try:
                done = _start_on(loop, lambda: self.release(entry))
            except RuntimeError:  # it closed meanwhile
                pass
            else:
                give_up = None if patience is None else time.monotonic() + patience
                while True:
                    try:
                        done.result(timeout=_POLL)
                        break
                    except concurrent.futures.TimeoutError:
                        if loop.is_closed() or (give_up is not None and time.monotonic() > give_up):
                            break
        elif not loop.is_closed():
            releasing = self.release(entry)
            try:
                loop.run_until_complete(releasing)
            except RuntimeError:
                if not loop.is_running():
                    raise
                releasing.close()  # its thread started it meanwhile: hand it over
                return self._release_elsewhere(entry, patience)
        if loop.is_closed() and (entry.store is not None or entry.watch is not None):
            fresh = asyncio.new_event_loop()  # its loop ended first: release it here
            try:
                fresh.run_until_complete(self.release(entry))
            finally:
                fresh.close()
        return None


async def _until_loop_ends(stores: LoopStores, entry: _Entry) -> AsyncGenerator[None, None]:
    """Suspended on the entry's loop until ``loop.shutdown_asyncgens()`` closes it; then
    releases the entry there, while the loop still runs."""
    try:
        yield
    finally:
        entry.watch = None  # closing now: ``release`` must not close it again
        await stores.release(entry)


def _finish(watch: AsyncGenerator[None, None]) -> None:
    """Close a suspended ``_until_loop_ends`` whose loop has closed, without a loop: its
    entry is released already, so its ``finally`` awaits nothing that suspends."""
    closing: Any = watch.aclose()
    try:
        closing.send(None)
    except StopIteration:
        return
    closing.close()


async def _report(loop: asyncio.AbstractEventLoop, work: Iterable[Awaitable[None]]) -> None:
    """Run ``work``; failures go to the loop's exception handler, not to the caller."""
    for outcome in await asyncio.gather(*work, return_exceptions=True):
        if isinstance(outcome, BaseException):
            loop.call_exception_handler(
                {"message": "releasing a histstore store failed", "exception": outcome}
            )


def _start_on(
    loop: asyncio.AbstractEventLoop, make: Callable[[], Awaitable[None]]
) -> concurrent.futures.Future[None]:
    """Run ``make()`` on ``loop`` (running in another thread). The coroutine is made on
    the loop, so a loop that stops before running it leaves nothing unawaited.

    Raises:
        RuntimeError: the loop is closed.
    """
    result: concurrent.futures.Future[None] = concurrent.futures.Future()

    def start() -> None:
        if not result.set_running_or_notify_cancel():
            return
        task = asyncio.ensure_future(make())

        def finished(task: asyncio.Future[None]) -> None:
            if task.cancelled():  # its loop is ending: the caller checks what is left
                result.set_result(None)
            elif (exc := task.exception()) is not None:
                result.set_exception(exc)
            else:
                result.set_result(None)

        task.add_done_callback(finished)

    loop.call_soon_threadsafe(start)
    return result


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _off_loop(fn: Callable[[], None]) -> None:
    """Call ``fn``, in a helper thread when a loop runs in this one (it may block)."""
    if _running_loop() is None:
        fn()
        return
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pool.submit(fn).result()
