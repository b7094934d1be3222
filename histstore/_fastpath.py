"""The hot path: SQLAlchemy-compiled statements run straight on the driver connection.

Reading the newest messages and appending a batch are what agents do on every model
call. Through SQLAlchemy's execution layer each statement costs several hundred
microseconds of Python, and on aiosqlite four trips to the driver's thread (cursor,
execute, fetch, close). So these few statements are compiled by SQLAlchemy once per
engine (the SQL is the same Core statement the rest of the store uses; nothing is
written twice) and executed here with the driver's own calls, on a connection from the
engine's pool that the store keeps between calls (``ConnectionCache``): one trip per
statement, as a hand-written driver program would do.

A write transaction is a *program*: a generator that yields the statements to run (see
``Step``) and receives each one's rows, so the logic of a write is written once and
each driver runs it its own way. asyncpg awaits one protocol call per statement.
aiosqlite runs the whole program, from ``BEGIN IMMEDIATE`` to ``COMMIT``, in one trip to
the connection's thread: the thread hops cost more than the statements, and SQLite's
one write lock is then held only while SQLite works, never across event-loop turns.

This module is where the drivers differ: aiosqlite takes a parameter list and runs each
call on its thread; asyncpg takes ``*args``. Type conversion uses SQLAlchemy's own bind
and result processors for the dialect.
"""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator, Callable, Generator, Mapping, Sequence
from contextlib import asynccontextmanager, suppress
from time import monotonic
from typing import Any, Generic, TypeVar

from sqlalchemy.engine import Dialect
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.pool import PoolProxiedConnection, QueuePool
from sqlalchemy.sql import ClauseElement, Executable
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.types import TypeEngine
from sqlalchemy.util import greenlet_spawn

from ._engine import SETUP_KEY, SqliteSettings, sqlite_setup
from ._errors import HistStoreError

__all__ = [
    "EXECUTE",
    "EXECUTE_MANY",
    "FETCH",
    "CompiledStatement",
    "ConnectionCache",
    "Driver",
    "Phase",
    "Program",
    "for_dialect",
]

T = TypeVar("T")

Processor = Callable[[Any], Any] | None
Memo = dict[tuple[int, int], Any]
"""Converted bind values by (processor, value) identity, shared within one write."""

FETCH, EXECUTE, EXECUTE_MANY = "fetch", "execute", "execute_many"
Step = tuple[str, "CompiledStatement", Any]
"""One statement of a program: ``(FETCH, stmt, params)`` sends back the rows,
``(EXECUTE, stmt, params)`` sends back ``None``, ``(EXECUTE_MANY, stmt, [params, ...])``
runs the statement once per parameter mapping and sends back ``None``."""
Program = Generator[Step, Any, T | None]
"""A write transaction's statements. Its return value is committed; ``None`` means
roll back (nothing to commit). An exception it raises rolls back and propagates."""
Phase = list[str]
"""Where a transaction is: ``["body"]``, then ``["commit"]`` while COMMIT is under way,
then ``["done"]``: a failure in the commit phase leaves the outcome unknown."""


class CompiledStatement:
    """A Core statement compiled for one dialect, with its parameter order and processors."""

    def __init__(self, stmt: ClauseElement, dialect: Dialect) -> None:
        compiled = stmt.compile(dialect=dialect)
        assert isinstance(compiled, SQLCompiler)
        assert isinstance(stmt, Executable)
        self.statement = stmt
        """The Core statement, for running it through SQLAlchemy with the same params."""
        self.sql = str(compiled)
        names = list(compiled.positiontup or ())
        # (name, processor, value the statement itself gives, e.g. SQLite's OFFSET 0)
        self._binds: list[tuple[str, Processor, Any]] = [
            (
                name,
                _processor(compiled.binds[name].type, dialect, bind=True),
                compiled.binds[name].value,
            )
            for name in names
        ]

    def args(self, params: Mapping[str, Any], memo: Memo | None = None) -> list[Any]:
        """The positional arguments for ``params`` (a mapping of bind names to values).

        ``memo`` shares converted values between calls (the statements and rows of one
        write repeat the same timestamp, whose conversion is the costly one on SQLite);
        the values it was filled from must outlive it.
        """
        if memo is None:
            memo = {}
        out = []
        for name, proc, default in self._binds:
            value = params.get(name, default)
            if proc is None or value is None:
                out.append(value)
                continue
            key = (id(proc), id(value))
            if key not in memo:
                memo[key] = proc(value)
            out.append(memo[key])
        return out


def _processor(type_: TypeEngine[Any], dialect: Dialect, *, bind: bool) -> Processor:
    impl = type_.dialect_impl(dialect)
    if bind:
        return impl.bind_processor(dialect)
    return impl.result_processor(dialect, None)


class ConnectionCache:
    """Pooled connections kept checked out between fast-path calls, newest first.

    Taking a connection from SQLAlchemy's pool and giving it back is cheap Python, but
    each of the two runs in a new greenlet (a new connection may have to be opened, an
    overflow one closed), and around a driver call the pair costs about as much as the
    call itself (some 50 us beside a 100 us read on the development machine, on both
    drivers). So the fast path keeps the connections it used, up to ``limit``, and
    takes the newest.

    The cache stays out of the pool's way: it keeps at most ``pool_size - 1``
    connections (none for an in-memory database, whose only connection the other calls
    need), so the pool always has connections for the rest of the store. A connection
    idle for longer than ``max_idle`` seconds goes back to the pool, which then applies
    the engine's own checks (pre-ping, recycling). ``close()`` gives every one back.
    """

    def __init__(self, engine: AsyncEngine, *, limit: int, max_idle: float = 10.0) -> None:
        self._engine = engine
        self._limit = limit
        self._max_idle = max_idle
        self._idle: list[tuple[float, PoolProxiedConnection]] = []
        self._closed = False

    @classmethod
    def for_engine(cls, engine: AsyncEngine) -> ConnectionCache:
        """A cache sized to leave ``engine``'s pool at least one connection."""
        pool_ = engine.sync_engine.pool
        size = pool_.size() if isinstance(pool_, QueuePool) else 0
        return cls(engine, limit=max(0, min(_MAX_CACHED, size - 1)))

    @property
    def idle(self) -> int:
        """How many connections the cache holds (checked out of the pool, unused)."""
        return len(self._idle)

    async def get(self) -> PoolProxiedConnection:
        """The newest cached connection still fresh, else one from the pool."""
        while self._idle:
            since, raw = self._idle.pop()
            if monotonic() - since <= self._max_idle:
                return raw
            await greenlet_spawn(raw.close)
        return await self._engine.raw_connection()

    async def put(self, raw: PoolProxiedConnection) -> None:
        """Keep a healthy connection for the next call, or give it back to the pool."""
        if self._closed or len(self._idle) >= self._limit:
            await greenlet_spawn(raw.close)
        else:
            self._idle.append((monotonic(), raw))

    async def close(self) -> None:
        """Give every cached connection back to the pool; later ones go straight back."""
        self._closed = True
        while self._idle:
            _since, raw = self._idle.pop()
            await greenlet_spawn(raw.close)


_MAX_CACHED = 16


class _Running(Generic[T]):
    """Iterates over a program's steps; set ``rows`` to what a step returned (it is sent
    back with the next step, ``None`` otherwise). ``value``: what the program returned."""

    def __init__(self, program: Program[T]) -> None:
        self._program = program
        self.rows: Any = None
        self.value: T | None = None

    def __iter__(self) -> _Running[T]:
        return self

    def __next__(self) -> Step:
        rows, self.rows = self.rows, None
        try:
            return self._program.send(rows)
        except StopIteration as stop:
            self.value = stop.value
            raise StopIteration from None


class Driver:
    """Runs compiled statements on one kind of driver connection."""

    def __init__(self, dialect: Dialect, sqlite: SqliteSettings | None) -> None:
        self.dialect = dialect
        self._sqlite = sqlite

    def compile(self, stmt: ClauseElement) -> CompiledStatement:
        """Compile a statement for this driver's dialect."""
        return CompiledStatement(stmt, self.dialect)

    def result_processor(self, type_: TypeEngine[Any]) -> Processor:
        """How a value of ``type_`` read by the driver becomes a Python value."""
        return _processor(type_, self.dialect, bind=False)

    @asynccontextmanager
    async def connection(self, cache: ConnectionCache) -> AsyncIterator[Any]:
        """A driver connection from the cache or the engine's pool, given back after.

        The pool is used directly (``raw_connection``), without building SQLAlchemy
        ``Connection`` objects around it. A connection whose state is unknown after an
        error is invalidated (the pool opens another) instead of being reused.
        """
        raw = await cache.get()
        healthy = False
        try:
            driver = raw.driver_connection
            assert driver is not None
            if self._sqlite is not None and raw.info.get(SETUP_KEY) != self._sqlite:
                for sql in sqlite_setup(self._sqlite):
                    await driver.execute(sql)
                raw.info[SETUP_KEY] = self._sqlite
            try:
                yield driver
            except HistStoreError:
                healthy = True  # raised by the store after it ended the transaction
                raise
            except Exception:
                # A failed statement or a lost server: end the transaction if the
                # connection still answers, else never give it back to the pool.
                if not await self._reset(driver):
                    await greenlet_spawn(raw.invalidate)
                raise
            except BaseException:
                # Cancelled half way through a driver call: its state is unknown.
                await greenlet_spawn(raw.invalidate)
                raise
            healthy = True
        finally:
            if healthy:
                await cache.put(raw)
            else:
                await greenlet_spawn(raw.close)

    async def _reset(self, driver: Any) -> bool:
        """Roll back whatever is open; False when the connection cannot be trusted."""
        try:
            if self._in_transaction(driver):
                await self.rollback(driver)
        except Exception:  # noqa: BLE001 - any failure here means "drop it"
            return False
        return True

    def _in_transaction(self, driver: Any) -> bool:
        return bool(driver.in_transaction)

    async def fetch(
        self,
        driver: Any,
        stmt: CompiledStatement,
        params: Mapping[str, Any],
        memo: Memo | None = None,
    ) -> Sequence[Any]:
        """Run a statement that returns rows; all of them."""
        raise NotImplementedError

    async def rollback(self, driver: Any) -> None:
        """Roll the transaction back."""
        await driver.execute("ROLLBACK")

    async def transaction(self, driver: Any, program: Program[T], phase: Phase) -> T | None:
        """Run ``program`` in one write transaction; its return value, committed.

        Updates ``phase`` as the commit starts and ends. On an exception from the program
        the transaction is rolled back; a failed statement is left to ``connection()``.
        """
        raise NotImplementedError


class _Aiosqlite(Driver):
    def __init__(self, dialect: Dialect, sqlite: SqliteSettings | None) -> None:
        super().__init__(dialect, sqlite)
        import aiosqlite

        # The one-trip transaction below relies on these two (see ``transaction``).
        if not (
            callable(getattr(aiosqlite.Connection, "_execute", None))
            and isinstance(getattr(aiosqlite.Connection, "_conn", None), property)
        ):
            version = getattr(aiosqlite, "__version__", "?")
            raise HistStoreError(
                f"aiosqlite {version} is not supported: histstore needs"
                " aiosqlite.Connection._execute and ._conn"
            )

    async def fetch(
        self,
        driver: Any,
        stmt: CompiledStatement,
        params: Mapping[str, Any],
        memo: Memo | None = None,
    ) -> Sequence[Any]:
        rows = await driver.execute_fetchall(stmt.sql, stmt.args(params, memo))
        return rows  # type: ignore[no-any-return]

    async def transaction(self, driver: Any, program: Program[T], phase: Phase) -> T | None:
        # aiosqlite runs every call as a function on the connection's own thread; this
        # hands it the whole transaction as one such function (the private ``_execute``
        # is the queue every aiosqlite method goes through; SQLAlchemy's adapter uses
        # that queue directly too). Nothing runs on that connection in between.
        result: T | None = await driver._execute(self._run_on_thread, driver, program, phase)
        return result

    def _run_on_thread(self, driver: Any, program: Program[T], phase: Phase) -> T | None:
        conn: sqlite3.Connection = driver._conn
        memo: Memo = {}
        run = _Running(program)
        conn.execute("BEGIN IMMEDIATE")  # see _engine: why writers take the lock up front
        try:
            for kind, stmt, params in run:
                if kind == FETCH:
                    run.rows = conn.execute(stmt.sql, stmt.args(params, memo)).fetchall()
                elif kind == EXECUTE:
                    conn.execute(stmt.sql, stmt.args(params, memo))
                else:
                    conn.executemany(stmt.sql, [stmt.args(p, memo) for p in params])
            value = run.value
            if value is None:
                conn.execute("ROLLBACK")
                return None
            phase[0] = "commit"
            conn.execute("COMMIT")
        except BaseException:
            # Still on the thread, so the transaction never outlives this call.
            # A connection that fails to roll back is dropped by connection().
            if phase[0] == "body" and conn.in_transaction:
                with suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
            raise
        phase[0] = "done"
        return value


class _Asyncpg(Driver):
    async def fetch(
        self,
        driver: Any,
        stmt: CompiledStatement,
        params: Mapping[str, Any],
        memo: Memo | None = None,
    ) -> Sequence[Any]:
        return await driver.fetch(stmt.sql, *stmt.args(params, memo))  # type: ignore[no-any-return]

    async def transaction(self, driver: Any, program: Program[T], phase: Phase) -> T | None:
        # One protocol call per statement; asyncpg takes the arguments spread.
        memo: Memo = {}
        run = _Running(program)
        await driver.execute("BEGIN")
        try:
            for kind, stmt, params in run:
                if kind == FETCH:
                    run.rows = await self.fetch(driver, stmt, params, memo)
                elif kind == EXECUTE:
                    await driver.execute(stmt.sql, *stmt.args(params, memo))
                else:
                    await driver.executemany(stmt.sql, [stmt.args(p, memo) for p in params])
        except HistStoreError:
            await self.rollback(driver)
            raise
        value = run.value
        if value is None:
            await self.rollback(driver)
            return None
        phase[0] = "commit"
        await driver.execute("COMMIT")
        phase[0] = "done"
        return value

    def _in_transaction(self, driver: Any) -> bool:
        if driver.is_closed():
            raise ConnectionError("connection closed")
        return bool(driver.is_in_transaction())


def for_dialect(dialect: Dialect, sqlite: SqliteSettings | None) -> Driver | None:
    """The fast-path driver for this engine, or ``None`` (then SQLAlchemy runs everything)."""
    driver = getattr(dialect, "driver", "")
    if dialect.name == "sqlite" and driver == "aiosqlite":
        return _Aiosqlite(dialect, sqlite)
    if dialect.name == "postgresql" and driver == "asyncpg":
        return _Asyncpg(dialect, None)
    return None
