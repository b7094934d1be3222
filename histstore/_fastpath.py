"""The hot path: SQLAlchemy-compiled statements run straight on the driver connection.

Reading the newest messages and appending a batch are what agents do on every model
call. Through SQLAlchemy's execution layer each statement costs several hundred
microseconds of Python, and on aiosqlite four trips to the driver's thread (cursor,
execute, fetch, close). So these few statements are compiled by SQLAlchemy once per
store (the SQL is the same Core statement the rest of the store uses; nothing is
written twice) and executed here with the driver's own calls, on a connection checked
out of the engine's pool: one trip per statement, as a hand-written driver program
would do.

This module is where the drivers differ: aiosqlite takes a parameter list and runs each
call on its thread; asyncpg takes ``*args``. Type conversion uses SQLAlchemy's own bind
and result processors for the dialect.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

from sqlalchemy.engine import Dialect
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.sql import ClauseElement
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.types import TypeEngine
from sqlalchemy.util import greenlet_spawn

from ._engine import SETUP_KEY, SqliteSettings, sqlite_setup
from ._errors import HistStoreError

__all__ = ["CompiledStatement", "Driver", "for_dialect"]

Processor = Callable[[Any], Any] | None
Memo = dict[tuple[int, int], Any]
"""Converted bind values by (processor, value) identity, shared within one write."""


class CompiledStatement:
    """A Core statement compiled for one dialect, with its parameter order and processors."""

    def __init__(self, stmt: ClauseElement, dialect: Dialect) -> None:
        compiled = stmt.compile(dialect=dialect)
        assert isinstance(compiled, SQLCompiler)
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


class Driver:
    """Runs compiled statements on one kind of driver connection."""

    begin_sql = "BEGIN"
    positional = False  # asyncpg: args spread; aiosqlite: one sequence

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
    async def connection(self, engine: AsyncEngine) -> AsyncIterator[Any]:
        """A driver connection from the engine's pool, given back (or dropped on error).

        The pool is used directly (``raw_connection``), without building SQLAlchemy
        ``Connection`` objects around it; giving a connection back may close it (an
        overflow connection), which the async drivers must do inside SQLAlchemy's
        greenlet, hence ``greenlet_spawn``.
        """
        raw = await engine.raw_connection()
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
                raise  # raised by the store after it ended the transaction
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
        finally:
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
        args = stmt.args(params, memo)
        if self.positional:
            return await driver.fetch(stmt.sql, *args)  # type: ignore[no-any-return]
        return await driver.execute_fetchall(stmt.sql, args)  # type: ignore[no-any-return]

    async def execute(
        self,
        driver: Any,
        stmt: CompiledStatement,
        params: Mapping[str, Any],
        memo: Memo | None = None,
    ) -> None:
        """Run a statement for its effect."""
        args = stmt.args(params, memo)
        if self.positional:
            await driver.execute(stmt.sql, *args)
        else:
            await driver.execute(stmt.sql, args)

    async def execute_many(
        self,
        driver: Any,
        stmt: CompiledStatement,
        rows: Sequence[Mapping[str, Any]],
        memo: Memo | None = None,
    ) -> None:
        """Run a statement once per row, in one call."""
        memo = {} if memo is None else memo
        await driver.executemany(stmt.sql, [stmt.args(r, memo) for r in rows])

    async def begin(self, driver: Any) -> None:
        """Begin a write transaction (SQLite: taking the write lock up front)."""
        await driver.execute(self.begin_sql)

    async def commit(self, driver: Any) -> None:
        """Commit the transaction."""
        await driver.execute("COMMIT")

    async def rollback(self, driver: Any) -> None:
        """Roll the transaction back."""
        await driver.execute("ROLLBACK")


class _Aiosqlite(Driver):
    begin_sql = "BEGIN IMMEDIATE"  # see _engine: why writers take the lock up front


class _Asyncpg(Driver):
    positional = True

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
