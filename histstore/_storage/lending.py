"""What the executor lends its callers: a connection, a SQLAlchemy connection on the
SQLite writer's one write connection for Core writes (``CoreOnWriter``), and how many
reads of a store may run at once on SQLite (``READ_SLOTS``).

It is a context-manager class (as is the SQLite writer's turn), not an
``@asynccontextmanager`` generator: a store may close (and finish its writers' work)
while its loop shuts down, from the adapters' hook in ``loop.shutdown_asyncgens()``,
and an async generator first run after that call is never finalized by the loop
(asyncio warns of it).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any

from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.pool import PoolProxiedConnection
from sqlalchemy.util import greenlet_spawn

from .._errors import HistStoreError
from .dberrors import DATABASE_ERRORS, connection_lost, failure
from .engine import SETUP_KEY, sqlite_setup

if TYPE_CHECKING:
    from .connections import ConnectionCache
    from .drivers import CompiledStatement
    from .executor import Executor
    from .sqlite_writer import SqliteWriter

__all__ = ["READ_SLOTS", "CoreOnWriter", "LentConnection", "ReadSlots"]

READ_SLOTS = max(2, os.cpu_count() or 2)
"""Reads of one store on an SQLite file running at once, at most (the executor's
semaphore; the others wait, first come, first served).

Each read runs on a connection of its own, each connection on an aiosqlite thread. With
16 tasks reading at once, 16 threads took turns at the GIL on a 2-core machine: agent
turns (read newest 20, write 2) ran at about 1,800 a second with a p99 of 17 ms; with
two slots, at about 2,300 with a p99 of 13 ms. Two, not one, so that a long read (a
search over a million messages) does not hold up every other read. Postgres reads wait
in the server, not in threads: no slots there."""


class ReadSlots:
    """At most ``limit`` reads at once (``None``: no limit), first come, first served
    (an ``asyncio.Semaphore``'s, held for an ``async with``); ``free`` says, cheaper
    than the semaphore's ``locked``, whether a read would take a slot without waiting."""

    __slots__ = ("_in", "_limit", "_semaphore")

    def __init__(self, limit: int | None) -> None:
        self._limit = limit or 0
        self._semaphore = None if limit is None else asyncio.Semaphore(limit)
        self._in = 0  # reads holding a slot or waiting for one

    def free(self) -> bool:
        """Whether a slot is free and no read waits for one."""
        return self._semaphore is None or self._in < self._limit

    async def __aenter__(self) -> None:
        if self._semaphore is not None:
            self._in += 1
            try:
                await self._semaphore.acquire()
            except BaseException:
                self._in -= 1
                raise

    async def __aexit__(self, *exc_info: object) -> None:
        if self._semaphore is not None:
            self._in -= 1
            self._semaphore.release()


class LentConnection:
    """A driver connection from the executor's cache or pool, given back after.

    A connection whose state is unknown after an error, or that was lost, is
    invalidated (the pool opens another) instead of being reused.
    """

    __slots__ = ("_cache", "_executor", "_raw")

    def __init__(self, executor: Executor, cache: ConnectionCache) -> None:
        self._executor = executor
        self._cache = cache
        self._raw: PoolProxiedConnection | None = None

    @property
    def raw(self) -> PoolProxiedConnection | None:
        """The pooled connection while lent (for ending it after its loop closed)."""
        return self._raw

    def read_now(self, stmt: CompiledStatement, params: Mapping[str, Any]) -> list[Any] | None:
        """A short read at once on the event loop's thread (``Driver.read_now``), on the
        newest cached connection when it is fresh (every cached one was set up when
        first lent); ``None`` when there is none or the driver could not read (nothing
        read). It waits for nothing, so the connection stays in the cache meanwhile,
        and one lending serves every such read. When the read fails, the connection
        leaves the cache lent (``raw``): ``hand_over`` passes it to a lending whose
        ``__aexit__`` ends it, as ``async with``'s would."""
        cache = self._cache
        raw = cache.use_newest()
        if raw is None:
            return None
        try:
            return self._executor.driver.read_now(raw.driver_connection, stmt, params)
        except BaseException:
            self._raw = cache.take_newest()
            raise

    async def read_failed(
        self, exc: BaseException, action: str, conversation: str | None
    ) -> tuple[bool, ...]:
        """After ``read_now`` raised ``exc`` (for ``Executor.fetch``): the connection goes
        to a lending that ends it as ``async with``'s would; raises ``exc``, typed when a
        database's (``DatabaseFailure``, its cause), unless the connection was lost:
        then the tries left to the usual way (one, on a new connection)."""
        await self.hand_over().__aexit__(type(exc), exc, exc.__traceback__)
        if not isinstance(exc, DATABASE_ERRORS):
            raise exc
        if not connection_lost(exc):
            raise failure(action, conversation, exc, "body") from exc
        return (False,)

    def hand_over(self) -> LentConnection:
        """A lending of the connection ``read_now`` left lent; this one lends none."""
        other = LentConnection(self._executor, self._cache)
        other._raw, self._raw = self._raw, None
        return other

    async def __aenter__(self) -> Any:
        executor = self._executor
        raw = self._raw = await executor.checkout(self._cache)
        try:
            conn = raw.driver_connection
            assert conn is not None
            settings = executor.sqlite
            if settings is not None and raw.info.get(SETUP_KEY) != settings:
                for sql in sqlite_setup(settings):
                    await executor.driver.execute_sql(conn, sql)
                raw.info[SETUP_KEY] = settings
        except BaseException:
            await greenlet_spawn(raw.close)
            raise
        return conn

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        raw = self._raw
        assert raw is not None
        driver = self._executor.driver
        healthy = False
        try:
            if exc is None or isinstance(exc, HistStoreError):
                healthy = True  # a program's own error: its transaction has ended
            elif isinstance(exc, Exception):
                # A failed statement or a lost server: the transaction was rolled back if
                # the connection still answers; else never give it back to the pool (nor
                # one that failed as lost, e.g. its protocol in a state it cannot leave).
                try:
                    conn = raw.driver_connection
                    healthy = not driver.in_transaction(conn) and not connection_lost(exc)
                except Exception:  # noqa: BLE001 - any failure here means "drop it"
                    healthy = False
                if not healthy:
                    await _invalidate(raw)
            elif isinstance(exc, asyncio.CancelledError):
                # Cancelled during a driver call: reused only once the driver has seen
                # the call end with the connection clean (SQLite), else dropped.
                healthy = await driver.settle(raw.driver_connection)
                if not healthy:
                    await _invalidate(raw)
            else:
                # Interrupted half way through a driver call: its state is unknown.
                await _invalidate(raw)
        finally:
            if healthy:
                await self._cache.put(raw)
            else:
                await self._cache.drop(raw)


async def _invalidate(raw: PoolProxiedConnection) -> None:
    """Drop ``raw``'s driver connection (not again when SQLAlchemy's Core work on it
    already did, seeing it lost: the pool would warn)."""
    if raw.is_valid:
        await greenlet_spawn(raw.invalidate)


class CoreOnWriter:
    """A SQLAlchemy connection of ``engine`` on the SQLite writer's write connection,
    for the Core work of a write in the writer's turn: so every write of an SQLite
    file runs on that one connection.

    The ``Connection`` wraps the pooled connection the writer holds (SQLAlchemy's
    ``Connection(engine, connection)``), with no revalidation (a connection SQLAlchemy
    saw lost is never replaced by another from the pool behind the writer's back), and
    is dropped, never closed, after the block: closing it would check the writer's
    connection back into the pool. The block's end (or failure, or cancellation) is the
    writer's lending's to handle, as for a program: kept, settled or dropped.
    """

    __slots__ = ("_engine", "_lent", "_writer")

    def __init__(self, writer: SqliteWriter, engine: AsyncEngine) -> None:
        self._writer = writer
        self._engine = engine
        self._lent: Any = None

    async def __aenter__(self) -> AsyncConnection:
        lent = self._writer.lend()
        await lent.__aenter__()
        self._lent = lent
        try:
            lending = self._writer.connection.lending
            assert isinstance(lending, LentConnection)
            assert lending.raw is not None
            sync = _core_connection(self._engine, lending.raw)
        except BaseException as exc:
            self._lent = None
            await lent.__aexit__(type(exc), exc, exc.__traceback__)
            raise
        return AsyncConnection(self._engine, sync)

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        lent, self._lent = self._lent, None
        await lent.__aexit__(kind, exc, tb)


def _core_connection(engine: AsyncEngine, raw: PoolProxiedConnection) -> Connection:
    """A SQLAlchemy connection over the writer's ``raw`` connection that never replaces it
    with another from the pool after it is lost (SQLAlchemy's private keyword
    ``_allow_revalidate``). Where a SQLAlchemy release no longer takes that keyword, the
    connection is made without it, and a lost connection is handled as SQLAlchemy
    handles any other."""
    try:
        return Connection(engine.sync_engine, raw, _allow_revalidate=False)
    except TypeError:
        return Connection(engine.sync_engine, raw)
