"""Driver connections a store keeps checked out of SQLAlchemy's pool between calls."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from time import monotonic

from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.pool import PoolProxiedConnection, QueuePool
from sqlalchemy.util import greenlet_spawn

from .orphans import release_orphaned
from .pool_options import DEFAULT_REFUSED_WAIT
from .refusals import Backoff, pool_idle
from .statements.kinds import is_sqlite

__all__ = ["MAX_IDLE", "ConnectionCache", "release_connections", "spare"]

MAX_IDLE = 0.5
"""Seconds a connection is kept out of the pool unused. Long enough for a busy store's
next call to take it; short enough that a burst's connections go back at once (the
pool closes those beyond its size: on a shared server, a session held idle is one
another process cannot open)."""


class ConnectionCache:
    """Pooled connections kept checked out between calls, newest first.

    Taking a connection from SQLAlchemy's pool and giving it back runs two greenlets and
    costs about as much as a short query, so the executor keeps the connections it used,
    up to ``limit``, and takes the newest. A store's caches keep at most one connection
    fewer than its pool holds (none for an in-memory database, whose only connection
    SQLAlchemy-run work needs), so the pool always has connections for the rest of the
    store. A connection idle for longer than ``max_idle`` seconds goes back to the pool
    (which then applies pre-ping and recycling, and closes one beyond its size);
    ``close()`` gives every one back. A connection the server refuses is waited for
    through ``backoff`` (``_storage.refusals``), which is told of each connection given
    back or dropped; while the server refuses, none is kept out of the pool.
    """

    def __init__(
        self,
        engine: AsyncEngine,
        *,
        limit: int,
        max_idle: float = MAX_IDLE,
        backoff: Backoff | None = None,
    ) -> None:
        self._engine = engine
        self._limit = limit
        self._max_idle = max_idle
        self._backoff = backoff or Backoff(DEFAULT_REFUSED_WAIT)
        self._idle: list[tuple[float, PoolProxiedConnection]] = []  # oldest first
        self._closed = False
        self._timer: asyncio.TimerHandle | None = None
        self._sweeper: asyncio.Task[None] | None = None

    @classmethod
    def for_engine(
        cls,
        engine: AsyncEngine,
        *,
        limit: int = 16,
        reserve: int = 0,
        capacity: int | None = None,
        backoff: Backoff | None = None,
    ) -> ConnectionCache:
        """A cache of at most ``limit`` connections that leaves ``engine``'s pool
        ``reserve`` connections and one more, of ``capacity`` (the most the pool holds,
        ``pool_size + max_overflow``; ``None``: its ``pool_size``)."""
        limit = max(0, min(limit, spare(engine, capacity) - reserve))
        return cls(engine, limit=limit, backoff=backoff)

    @property
    def limit(self) -> int:
        """How many connections the cache keeps at most."""
        return self._limit

    @property
    def idle(self) -> int:
        """How many connections the cache holds (checked out of the pool, unused)."""
        return len(self._idle)

    async def get(self) -> PoolProxiedConnection:
        """The newest cached connection still fresh, else one from the pool (waiting
        out the server's refusals, ``_storage.refusals``)."""
        idle = self._idle
        if idle and monotonic() - idle[-1][0] <= self._max_idle and not self._backoff.refusing:
            return idle.pop()[1]  # what ``_take`` returns, without asking the server
        return await self._backoff.open(self._take, self._has_idle)

    def use_newest(self) -> PoolProxiedConnection | None:
        """The newest cached connection when it is still fresh, for a call that waits
        for nothing (so that nothing else runs until it ends): it stays in the cache,
        idle from now; ``None`` when there is none. ``take_newest`` takes it out."""
        idle = self._idle
        now = monotonic()
        if idle and now - idle[-1][0] <= self._max_idle and not self._backoff.refusing:
            raw = idle[-1][1]
            idle[-1] = (now, raw)
            return raw
        return None

    def take_newest(self) -> PoolProxiedConnection:
        """Take out the connection ``use_newest`` just returned (its call failed)."""
        return self._idle.pop()[1]

    def _has_idle(self) -> bool:
        return bool(self._idle) or pool_idle(self._engine)

    async def _take(self) -> PoolProxiedConnection:
        while self._idle:
            since, raw = self._idle.pop()
            if monotonic() - since <= self._max_idle:
                return raw
            await greenlet_spawn(raw.close)
        if not is_sqlite(self._engine.dialect):
            return await self._engine.raw_connection()
        # aiosqlite drops a connection its thread opened for a caller cancelled meanwhile
        # (left to the garbage collector, open): the opening goes on whatever happens to
        # the caller, and what a cancelled caller would have had goes back to the pool.
        opening = asyncio.ensure_future(self._engine.raw_connection())
        try:
            return await asyncio.shield(opening)
        except asyncio.CancelledError:
            opening.add_done_callback(_give_back)
            raise

    async def put(self, raw: PoolProxiedConnection) -> None:
        """Keep a healthy connection for the next call, or give it back to the pool."""
        if self._closed or len(self._idle) >= self._limit or self._backoff.refusing:
            await self.drop(raw)
            return
        self._idle.append((monotonic(), raw))
        self._backoff.given_back()
        if self._timer is None and self._sweeper is None:
            self._schedule(self._max_idle)

    async def drop(self, raw: PoolProxiedConnection) -> None:
        """Give ``raw`` back to the pool (closed there if invalidated or beyond its size)."""
        await greenlet_spawn(raw.close)
        self._backoff.given_back()

    def _schedule(self, delay: float) -> None:
        """Sweep idle connections back to the pool in ``delay`` seconds, even when no
        further call comes (a burst must not leave sessions open on the server)."""
        self._timer = asyncio.get_running_loop().call_later(delay, self._start_sweep)

    def _start_sweep(self) -> None:
        self._timer = None
        if not self._closed:
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep())

    async def _sweep(self) -> None:
        try:
            now = monotonic()
            while self._idle and now - self._idle[0][0] > self._max_idle:
                _since, raw = self._idle.pop(0)
                await self.drop(raw)
        finally:
            self._sweeper = None
        if self._idle and not self._closed:
            self._schedule(max(0.0, self._idle[0][0] + self._max_idle - monotonic()) + 0.01)

    def abandon(self) -> list[PoolProxiedConnection]:
        """Stop keeping connections without touching the event loop (it has closed):
        the kept ones are handed to the caller, to terminate."""
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._sweeper = None
        kept = [raw for _since, raw in self._idle]
        self._idle.clear()
        return kept

    async def close(self) -> None:
        """Give every cached connection back to the pool; later ones go straight back."""
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        sweeper, self._sweeper = self._sweeper, None
        if sweeper is not None:
            await asyncio.gather(sweeper, return_exceptions=True)
        while self._idle:
            _since, raw = self._idle.pop()
            await greenlet_spawn(raw.close)


def spare(engine: AsyncEngine, capacity: int | None = None) -> int:
    """How many connections of ``engine``'s pool a store may keep out of it: all but
    one, of ``capacity`` (``None``: its ``pool_size``); none unless it is a queue pool."""
    pool_ = engine.sync_engine.pool
    if not isinstance(pool_, QueuePool):
        return 0
    return max(0, (pool_.size() if capacity is None else capacity) - 1)


async def release_connections(
    caches: Sequence[ConnectionCache],
    engine: AsyncEngine,
    dispose: bool,
    *,
    orphaned: bool,
    extra: Sequence[PoolProxiedConnection] = (),
) -> None:
    """Close ``caches`` and, with ``dispose``, ``engine``: on the loop the connections
    belong to, or, ``orphaned``, on another after that loop has closed (see
    ``_storage.orphans``), with the ``extra`` connections still checked out."""
    if orphaned:
        kept = [*extra, *(raw for cache in caches for raw in cache.abandon())]
        await release_orphaned(engine, kept, dispose=dispose)
        return
    for cache in caches:
        await cache.close()
    if dispose:
        await engine.dispose()


_GIVING_BACK: set[asyncio.Future[None]] = set()
"""Returns to the pool under way (held so that they are not collected half-way)."""


def _give_back(opening: asyncio.Future[PoolProxiedConnection]) -> None:
    """A connection opened for a caller cancelled meanwhile: back to the pool."""
    if opening.cancelled() or opening.exception() is not None:
        return
    returning = asyncio.ensure_future(greenlet_spawn(opening.result().close))
    _GIVING_BACK.add(returning)
    returning.add_done_callback(_GIVING_BACK.discard)
