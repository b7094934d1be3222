"""Waiting out a server that refuses new connections for now (PostgreSQL).

A server at ``max_connections`` answers a new session with SQLSTATE 53300 ("too many
clients already", also "remaining connection slots are reserved"); one starting up,
shutting down or in recovery with 57P03 ("cannot connect now"). Both say nothing was
done and that the same request can succeed in a moment, when another session ends or
the server is up. So every connection the store opens (for ``connect()``, for each call,
for the command line's subcommands) is opened through ``opening``: a refusal is retried
after a pause with full jitter, the pauses doubling from ``FIRST_PAUSE`` to ``MAX_PAUSE``,
until ``wait`` seconds have passed since the first refusal; the last refusal is then
raised as it came (the caller translates it into a transient ``DatabaseFailure`` whose
``__cause__`` is the driver's error).

Each attempt is a whole checkout from the pool, not only a new server session: a
connection this store gave back to its pool in the meantime is taken at once, so a
store that holds few connections on a full server goes on with those instead of
waiting for a new one. The jitter keeps processes refused together from coming back
together. Nothing is sent on a connection that was not opened, so retrying a refused
write can neither duplicate nor lose it.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from time import monotonic
from typing import TypeVar

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from .dberrors import DATABASE_ERRORS, sqlstate

__all__ = ["FIRST_PAUSE", "MAX_PAUSE", "REFUSALS", "connection", "opening", "refused"]

T = TypeVar("T")

REFUSALS = ("53300", "57P03")
"""SQLSTATEs of a server refusing a new session for now: too many connections; cannot
connect now (starting up, shutting down, in recovery, not yet accepting connections)."""

FIRST_PAUSE = 0.02
"""Seconds of the first pause after a refusal, at most (full jitter: 0 to this)."""

MAX_PAUSE = 0.5
"""The longest pause between two attempts, in seconds: short enough that a connection
freed on the server is taken within about half a second."""


def refused(exc: BaseException) -> bool:
    """Whether ``exc`` is a server refusing a new connection for now (``REFUSALS``)."""
    return sqlstate(exc) in REFUSALS


async def opening(open_: Callable[[], Awaitable[T]], wait: float) -> T:
    """``await open_()``, tried again after jittered pauses while the server refuses
    the connection, for up to ``wait`` seconds (see the module doc).

    Raises:
        the last refusal once ``wait`` has passed; any other error at once.
    """
    started: float | None = None
    ceiling = FIRST_PAUSE
    while True:
        try:
            return await open_()
        except DATABASE_ERRORS as exc:
            if not refused(exc):
                raise
            now = monotonic()
            if started is None:
                started = now
            left = started + wait - now
            if left <= 0:
                raise
        await asyncio.sleep(min(left, random.uniform(0, ceiling)))  # noqa: S311 - jitter
        ceiling = min(MAX_PAUSE, ceiling * 2)


@asynccontextmanager
async def connection(engine: AsyncEngine, wait: float) -> AsyncIterator[AsyncConnection]:
    """A SQLAlchemy connection of ``engine`` opened through ``opening``, closed after
    the block (as ``engine.connect()`` used as a context manager)."""
    conn = await opening(lambda: engine.connect().start(), wait)
    try:
        yield conn
    finally:
        await asyncio.shield(conn.close())
