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
store's own calls (a transaction block, a callback) would wait for itself: it raises at
once and changes nothing.
"""

from __future__ import annotations

import asyncio
from contextlib import suppress
from contextvars import ContextVar, Token
from types import TracebackType
from typing import Literal

from .._errors import HistStoreError

__all__ = ["Calls", "closed_error"]

_INSIDE: ContextVar[tuple[Calls, ...]] = ContextVar("histstore_calls", default=())
"""The stores (their ``Calls``) whose calls the running task is inside."""

Lifecycle = Literal["open", "closing", "closed"]


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

    def inside(self) -> bool:
        """Whether the running task is inside one of this store's calls."""
        return self in _INSIDE.get()

    def check(self) -> None:
        """Refuse a call that begins now: the store is closed, or closing and the task
        is not inside one of its calls."""
        if self.state == "closed" or (self.state == "closing" and not self.inside()):
            raise closed_error()

    def call(self) -> _Call:
        """``with calls.call():`` runs a call (checked first: ``check``)."""
        return _Call(self, strict=True)

    def span(self) -> _Call:
        """``with calls.span():`` runs a public method as one call when the store takes
        it; else (closing, closed) it runs as it is, and its first statement or program
        is refused, with the error that method gives (a ``write``'s carries its outcome)."""
        return _Call(self, strict=False)

    def refuse(self) -> None:
        """``close()`` begins: refuse new calls from now on. Raises ``HistStoreError``
        at once from inside a call (``wait`` would wait for itself), changing nothing."""
        if self.inside():
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

    def enter(self) -> None:
        """A call begins (checked: ``check``); ``leave`` ends it."""
        self.check()
        self._running += 1

    def leave(self) -> None:
        """A call ends."""
        self._running -= 1
        if not self._running and self._ended is not None:
            self._ended.set()
            self._ended = None


class _Call:
    """One call's span (``Calls.call``); a class rather than a generator, so that its
    exit also runs where a generator's would not (see ``_storage.lending``)."""

    __slots__ = ("_calls", "_counted", "_strict", "_token")

    def __init__(self, calls: Calls, *, strict: bool) -> None:
        self._calls = calls
        self._strict = strict
        self._counted = False
        self._token: Token[tuple[Calls, ...]] | None = None

    def __enter__(self) -> None:
        calls = self._calls
        if not self._strict and calls.state != "open" and not calls.inside():
            return
        calls.enter()
        self._counted = True
        inside = _INSIDE.get()
        self._token = _INSIDE.set((*inside, calls)) if calls not in inside else None

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if not self._counted:
            return
        token = self._token
        if token is not None:
            with suppress(ValueError):  # ended in another context (a generator closed)
                _INSIDE.reset(token)
        self._calls.leave()
