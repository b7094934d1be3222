"""A store's calls in progress, for ``close()``: the one rule of every backend.

A call the store took before ``close()`` began (a public method running, a statement
or program of the executor's, a transaction or a session) ends as it would have without
the close, which waits for it: what it needs after that (a queued append's group, a
settling read, the next program of a multi-step call, the indexing its writes listed)
is still done. A call that begins once ``close()`` has begun is refused, before it
touches anything, with the closed store's ``HistStoreError``.

A call is known by its task: entering one marks the task's context (a ``ContextVar``,
which the tasks it starts inherit, as the groups' and a write's own tasks do), so that
the call's further steps are taken while closing. A ``close()`` from inside one of the
store's own calls that has not ended (a transaction block, a callback) would wait for
itself: it raises at once and changes nothing. A context may keep the mark of a call
that ended (see ``_Open``): that call no longer stops ``close()``.

Each public coroutine of the store, and of what is built over it (a ``SemanticIndex``,
the items and checkpoint storage, the admin and transfer functions), is one call from
its first line to its end (``span_methods``, ``span_calls``): the steps it takes are
nested in it. An async generator is not one: a span over its life would keep
``close()`` waiting on an iterator its caller dropped; each step it takes is a call.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import Awaitable, Callable, Collection
from contextvars import ContextVar, Token
from types import TracebackType
from typing import Any, Literal, Self, TypeVar, cast

from .._errors import HistStoreError

__all__ = ["Calls", "OneCall", "closed_error", "span_calls", "span_methods"]

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Awaitable[Any]])


class _Open:
    """An outermost call of a store, as the contexts of its task and of the tasks it
    starts hold it. Those tasks' further steps (a group's leader running the next
    group) are the store's work under way while it closes, even after the call ended;
    but only a ``live`` call would make ``close()`` wait for itself (a context may keep
    an ended call where ``ContextVar.reset`` could not run, e.g. an async generator
    finalized in another task)."""

    __slots__ = ("calls", "live", "token")

    def __init__(self, calls: Calls) -> None:
        self.calls = calls
        self.live = True
        self.token: Token[tuple[_Open, ...]] | None = None


_INSIDE: ContextVar[tuple[_Open, ...]] = ContextVar("histstore_calls", default=())
"""The outermost calls the running task is inside (some may have ended: see ``_Open``)."""

Lifecycle = Literal["open", "closing", "closed"]

_NESTED = object()
"""``Calls.begin``'s mark of a call begun inside another of the same store's."""

Mark = _Open | object | None
"""What ``Calls.begin`` returns and ``end`` takes (``None``: the call was not counted)."""


def _inside(calls: Calls, marks: tuple[_Open, ...], live: bool) -> bool:
    for mark in marks:  # noqa: SIM110 - a loop, no generator per call
        if mark.calls is calls and (mark.live or not live):
            return True
    return False


def closed_error() -> HistStoreError:
    """The error of a call on a closed (or closing) store."""
    return HistStoreError("the store is closed")


class Calls:
    """A store's calls in progress and its lifecycle (``open``, ``closing``, ``closed``;
    see the module)."""

    def __init__(self) -> None:
        self.state: Lifecycle = "open"
        self._running = 0  # calls in progress (a call's nested steps count apart)
        self._ended: asyncio.Event | None = None

    def inside(self, *, live: bool = False) -> bool:
        """Whether the running task is inside one of this store's calls (one that has
        not ended, with ``live``)."""
        return _inside(self, _INSIDE.get(), live)

    def check(self) -> None:
        """Refuse a call that begins now: the store is closed, or closing and the task
        is not inside one of its calls."""
        if self.state == "closed" or (self.state == "closing" and not self.inside()):
            raise closed_error()

    def call(self) -> _Call:
        """``with calls.call():`` runs a call (``begin``, ``end``)."""
        return _Call(self)

    def begin(self, *, strict: bool = True) -> Mark:
        """A call begins: counted, and the task's context marked as inside it (unless
        it was); give what this returns to ``end``. Refused as ``check`` says; not
        ``strict`` (a public method's span), a refused call instead runs uncounted, and
        its first step is refused with the error its method gives (a ``write``'s carries
        its outcome)."""
        marks = _INSIDE.get()
        if self.state != "open" and (self.state == "closed" or not _inside(self, marks, False)):
            if strict:
                raise closed_error()
            return None
        self._running += 1
        if _inside(self, marks, True):
            return _NESTED
        mark = _Open(self)
        mark.token = _INSIDE.set((*marks, mark))
        return mark

    def end(self, mark: Mark) -> None:
        """The call ``begin`` began ends."""
        if mark is None:
            return
        if isinstance(mark, _Open):
            mark.live = False
            try:  # noqa: SIM105 - suppress() would cost an object per call
                _INSIDE.reset(mark.token)  # type: ignore[arg-type]
            except ValueError:  # ended in another context (a generator closed)
                pass
        self._running -= 1
        if not self._running and self._ended is not None:
            self._ended.set()
            self._ended = None

    def refuse(self) -> None:
        """``close()`` begins: refuse new calls from now on. Raises ``HistStoreError``
        at once from inside a call (``wait`` would wait for itself), changing nothing."""
        if self.inside(live=True):
            raise HistStoreError(
                "close() inside one of the store's own calls or transactions would wait "
                "for itself; close the store once that call has ended"
            )
        if self.state == "open":
            self.state = "closing"

    async def wait(self) -> None:
        """Wait for the calls in progress (cancellable: a later ``close()`` waits on)."""
        while self._running:
            if self._ended is None:
                self._ended = asyncio.Event()
            await self._ended.wait()


class _Call:
    """One call's span (``Calls.call``); a class rather than a generator, so that its
    exit also runs where a generator's would not (see ``_storage.lending``)."""

    __slots__ = ("_calls", "_mark")

    def __init__(self, calls: Calls) -> None:
        self._calls = calls
        self._mark: Mark = None

    def __enter__(self) -> None:
        self._mark = self._calls.begin()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._calls.end(self._mark)


def span_methods(cls: type[T], calls_of: Callable[[T], Calls], *, but: Collection[str]) -> None:
    """Make each public coroutine method of ``cls`` (but those named in ``but``) one call
    of ``calls_of(self)`` from its first line to its end (``Calls.begin``, not strict)."""
    for name in dir(cls):
        method = getattr(cls, name)
        if not name.startswith("_") and name not in but and inspect.iscoroutinefunction(method):
            setattr(cls, name, _spanned(method, calls_of))


def _spanned(
    method: Callable[..., Awaitable[Any]], calls_of: Callable[[Any], Calls]
) -> Callable[..., Awaitable[Any]]:
    @functools.wraps(method)
    async def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        calls = calls_of(self)
        mark = calls.begin(strict=False)
        try:
            return await method(self, *args, **kwargs)
        finally:
            calls.end(mark)

    return call


def span_calls(calls_of: Callable[[Any], Calls], *, stores: int = 1) -> Callable[[F], F]:
    """Make a coroutine function one call of each store among its first ``stores``
    arguments (``calls_of(store)``; given by position or by name) from its first line to
    its end (``Calls.begin``, not strict), as ``span_methods`` does a method."""

    def decorate(function: F) -> F:
        if not inspect.iscoroutinefunction(function):
            raise TypeError("span_calls takes a coroutine function, not an async generator")
        names = tuple(inspect.signature(function).parameters)[:stores]

        @functools.wraps(function)
        async def call(*args: Any, **kwargs: Any) -> Any:
            given = [*args[:stores], *(kwargs.get(n) for n in names[len(args) :])]
            begun: list[tuple[Calls, Mark]] = []
            try:
                for store in given:
                    if store is not None:  # (missing: the function raises its TypeError)
                        calls = calls_of(store)
                        begun.append((calls, calls.begin(strict=False)))
                return await function(*args, **kwargs)
            finally:
                for calls, mark in reversed(begun):  # newest first: the marks' tokens
                    calls.end(mark)

        return cast(F, call)

    return decorate


class OneCall:
    """``one_call(work)`` for a class whose coroutine methods ``span_methods`` makes calls
    of a store."""

    async def one_call(self, work: Callable[[Self], Awaitable[T]]) -> T:
        """``await work(self)`` as one call of the store: the methods it awaits, and
        what it awaits between them, are all waited for by a ``close()`` that begins
        meanwhile; once ``close()`` has begun, its first statement raises
        ``HistStoreError`` ("the store is closed")."""
        return await work(self)
