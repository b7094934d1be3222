"""Waiting out a server that refuses new connections for now (PostgreSQL).

A server at ``max_connections`` answers a new session with SQLSTATE 53300 ("too many
clients already", also "remaining connection slots are reserved"); one starting up,
shutting down or in recovery with 57P03 ("cannot connect now"). Both say nothing was
done and that the same request can succeed in a moment, when another session ends or
the server is up. So every connection the store opens (for ``connect()``, for each call,
for the command line's subcommands) is opened through a ``Backoff``, which waits such
refusals out.

A store meets refusals together (``Backoff``, one per store): after a refusal it asks
the server for a new session again only once a pause has passed, one caller at a time,
the pauses doubling from ``FIRST_PAUSE`` to ``MAX_PAUSE`` (full jitter, so processes
refused together do not come back together) and starting short again once a session
opens. Meanwhile its callers take turns on the connections it holds: each waits for one
to be given back (first waiter first) or for the next turn to ask the server, and a
caller takes one that is idle in the store's cache or pool whenever there is one. A
caller fails once it has waited ``wait`` seconds and the server refuses it once more;
that last refusal is raised as it came (the caller translates it into a transient
``DatabaseFailure`` whose ``__cause__`` is the driver's error). Nothing is sent on a
connection that was not opened, so retrying a refused write can neither duplicate nor
lose it.
"""

from __future__ import annotations

import asyncio
import random
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from time import monotonic
from typing import TypeVar

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.pool import QueuePool

from .dberrors import DATABASE_ERRORS, sqlstate

__all__ = ["FIRST_PAUSE", "MAX_PAUSE", "REFUSALS", "Backoff", "connection", "refused"]

T = TypeVar("T")

REFUSALS = ("53300", "57P03")
"""SQLSTATEs of a server refusing a new session for now: too many connections; cannot
connect now (starting up, shutting down, in recovery, not yet accepting connections)."""

FIRST_PAUSE = 0.02
"""Seconds of the first pause after a refusal, at most (full jitter: 0 to this)."""

MAX_PAUSE = 0.5
"""The longest pause before the store asks the server again, in seconds: short enough
that a session freed on the server is taken within about half a second."""


def refused(exc: BaseException) -> bool:
    """Whether ``exc`` is a server refusing a new connection for now (``REFUSALS``)."""
    return sqlstate(exc) in REFUSALS


class Backoff:
    """A store's callers waiting out the server's refusals together (module doc).

    ``wait``: seconds a caller waits before its next refusal is raised.
    """

    def __init__(self, wait: float) -> None:
        self.wait = wait
        self._waiting: deque[asyncio.Future[None]] = deque()
        self._ask_at = 0.0  # ``monotonic()`` before which no caller asks the server
        self._ceiling = FIRST_PAUSE

    @property
    def refusing(self) -> bool:
        """Whether the server refused the store's last request for a session."""
        return self._ask_at > 0

    def given_back(self) -> None:
        """A connection went back to the store's cache or pool (or was closed): the
        caller that has waited longest tries again."""
        while self._waiting:
            waiter = self._waiting.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    async def open(self, open_: Callable[[], Awaitable[T]], idle: Callable[[], bool]) -> T:
        """``await open_()`` (a checkout), waiting out refusals; ``idle()``: whether the
        store has a connection that ``open_`` takes without asking the server.

        Raises:
            the server's refusal once ``wait`` has passed; any other error at once.
        """
        started: float | None = None
        # While the server refuses, a newcomer queues behind the callers already waiting
        # (no overtaking them to a connection given back); a caller woken for one that
        # another took keeps its place at the head of the queue.
        queued = self.refusing and any(not w.done() for w in self._waiting)
        while True:
            now = monotonic()
            late = started is not None and now - started >= self.wait
            asking = not idle()
            if queued and not late:
                pass
            elif not asking or now >= self._ask_at or late:
                if asking and self.refusing:  # one caller asks; the others wait for it
                    self._ask_at = now + self._pause()
                try:
                    value = await open_()
                except DATABASE_ERRORS as exc:
                    if not refused(exc) or late or self.wait <= 0:
                        raise
                    self._ceiling = min(MAX_PAUSE, self._ceiling * 2)
                    self._ask_at = max(self._ask_at, monotonic() + self._pause())
                else:
                    if asking and self.refusing:  # the server has room: the next may ask
                        self._ceiling, self._ask_at = FIRST_PAUSE, 0.0
                        self.given_back()
                    return value
            now = monotonic()
            head = started is not None
            if started is None:
                started = now
            left = started + self.wait - now
            until = left if queued else min(left, self._ask_at - now)
            await self._next(max(0.0, until), head=head)
            queued = False

    def _pause(self) -> float:
        return random.uniform(0, self._ceiling)  # noqa: S311 - jitter, not a secret

    async def _next(self, timeout: float, *, head: bool) -> None:  # noqa: ASYNC109 - a bound of the wait, not the caller's
        """Return at the next ``given_back()`` (``head``: the first to be woken), or
        after ``timeout`` seconds."""
        waiter = asyncio.get_running_loop().create_future()
        if head:
            self._waiting.appendleft(waiter)
        else:
            self._waiting.append(waiter)
        woken = False
        try:
            await asyncio.wait({waiter}, timeout=timeout)
            woken = True
        finally:
            if not waiter.done():
                waiter.cancel()
            elif not woken and not waiter.cancelled():
                self.given_back()  # cancelled once woken: the next caller's turn


def pool_idle(engine: AsyncEngine) -> bool:
    """Whether ``engine``'s pool holds an idle connection (taken without asking)."""
    pool = engine.sync_engine.pool
    return isinstance(pool, QueuePool) and pool.checkedin() > 0


@asynccontextmanager
async def connection(engine: AsyncEngine, backoff: Backoff) -> AsyncIterator[AsyncConnection]:
    """A SQLAlchemy connection of ``engine`` opened through ``backoff``, closed after
    the block (as ``engine.connect()`` used as a context manager)."""
    conn = await backoff.open(lambda: engine.connect().start(), lambda: pool_idle(engine))
    try:
        yield conn
    finally:
        await asyncio.shield(conn.close())
        backoff.given_back()
