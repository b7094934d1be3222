"""The executor's work beyond one statement or program (``Executor`` inherits it): a
transaction of several programs, SQLAlchemy Core work and sessions, each given up within
the bound of ``_storage.deadlines`` on PostgreSQL when its caller cancels it or the
store's ``command_timeout`` passes (the driver connection is abandoned, never rolled
back politely on a silent server)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, AbstractContextManager, asynccontextmanager
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from .._errors import HistStoreError
from .calls import Calls
from .completion import run_to_completion
from .dberrors import DATABASE_ERRORS, failure, not_committed
from .deadlines import CallTimeout
from .drivers import Driver, Phase
from .engine import SqliteSettings
from .lending import CoreOnWriter, LentConnection
from .statements import dialects as _dialects
from .transaction import Transaction

if TYPE_CHECKING:
    from .sqlite_writer import SqliteWriter

__all__ = ["LongWork"]

T = TypeVar("T")


class LongWork:
    """The executor's transactions, Core work and sessions (see the module); the
    attributes and methods below the annotations are the executor's own."""

    driver: Driver
    calls: Calls
    _engines: dict[str, AsyncEngine]
    _sqlite: SqliteSettings | None
    _limit: float | None
    _read_grace: float | None
    _write_grace: float | None
    writer: SqliteWriter | None
    _loop: asyncio.AbstractEventLoop | None

    def check(self) -> None:
        """Refuse a call on a closed or closing store (``_storage.calls``), or from
        another event loop than the store's."""
        self.calls.check()
        self._own_loop()

    def _own_loop(self) -> None:
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = loop
        elif loop is not self._loop:
            raise HistStoreError(
                "the store was opened on another event loop; open one store per event loop"
            )

    def call(self) -> AbstractContextManager[None]:
        """``with executor.call():`` one call's span (``_storage.calls``), checked first."""
        self._own_loop()
        return self.calls.call()

    def refuse_writes(self, action: str, conversation: str | None) -> None:
        raise NotImplementedError

    def listed(self, messages: int = 1) -> None:
        raise NotImplementedError

    def _connection(self, cache: Any = None) -> LentConnection:
        raise NotImplementedError

    def _write_connection(self) -> AbstractAsyncContextManager[Any]:
        raise NotImplementedError

    def _core(self, engine: AsyncEngine) -> AbstractAsyncContextManager[AsyncConnection]:
        raise NotImplementedError

    def _writing(self, action: str, conversation: str | None) -> AbstractAsyncContextManager[None]:
        raise NotImplementedError

    @asynccontextmanager
    async def transaction(self, *, action: str) -> AsyncIterator[Transaction]:
        """A write transaction for several programs; committed when the block ends
        normally, rolled back when it raises. Not shielded from cancellation: the
        connection of an interrupted transaction is dropped, never reused."""
        with self.call():
            self.refuse_writes(action, None)
            try:
                async with self._writing(action, None), self._write_connection() as conn:
                    tx = Transaction(self.driver, conn, self.listed)
                    try:
                        yield tx
                    except BaseException as exc:
                        # Cancelled on Postgres: the connection is given up (the server may
                        # not answer a ROLLBACK), which rolls the transaction back.
                        gave_up = isinstance(exc, asyncio.CancelledError) and self._sqlite is None
                        if tx.begun and not gave_up:
                            try:
                                if self.driver.in_transaction(conn):
                                    await self.driver.execute_sql(conn, "ROLLBACK")
                            except Exception:  # noqa: BLE001 - the connection is dropped
                                raise ConnectionError("rollback failed") from None
                        raise
                    await tx.commit()
            except DATABASE_ERRORS as exc:
                raise failure(action, None, exc, "body") from exc

    async def run(
        self,
        work: Callable[[AsyncConnection], Awaitable[T]],
        *,
        mode: _dialects.Mode,
        action: str,
        conversation: str | None = None,
    ) -> T:
        """Run SQLAlchemy Core ``work`` in one transaction of ``mode`` (see
        ``_storage.statements.dialects.mode_options``), to its end even when cancelled.
        A write on an SQLite file runs in the writer's turn on its one write connection
        (``lending.CoreOnWriter``); other work on a connection of the pool."""
        with self.call():
            if mode == "write":
                self.refuse_writes(action, conversation)
            engine = self._engines[mode]
            writer = self.writer if mode == "write" else None

            def connect() -> AbstractAsyncContextManager[AsyncConnection]:
                return self._core(engine) if writer is None else CoreOnWriter(writer, engine)

            async def attempt(phase: Phase) -> T:
                # Given up inside the work (before SQLAlchemy's ROLLBACK) and in its COMMIT.
                async with connect() as conn, self._abandoned_if_cancelled(conn):
                    async with conn.begin():
                        async with self._abandoned_if_cancelled(conn):
                            value = await work(conn)
                        phase.name = "commit"  # the block's end commits
                    phase.name = "done"
                    return value

            async def transaction() -> T:
                phase = Phase()
                try:
                    return await self._limited(attempt(phase))
                except HistStoreError:
                    raise
                except DATABASE_ERRORS as exc:
                    uncommitted = phase.name == "commit" and not_committed(exc)
                    name = "body" if mode != "write" or uncommitted else phase.name
                    raise failure(action, conversation, exc, name) from exc

            if mode != "write":
                return await run_to_completion(transaction(), grace=self._read_grace)
            async with self._writing(action, conversation):
                value = await run_to_completion(transaction(), grace=self._write_grace)
            self.listed()
            return value

    @asynccontextmanager
    async def session(
        self, mode: Literal["read", "snapshot"], *, action: str
    ) -> AsyncIterator[AsyncConnection]:
        """A SQLAlchemy connection in one transaction of ``mode`` for streaming reads
        (export); the transaction ends with the block. Reads only: a write is ``run``'s,
        in the writer's turn."""
        with self.call():
            try:
                async with (
                    self._core(self._engines[mode]) as conn,
                    self._abandoned_if_cancelled(conn),
                    conn.begin(),
                    self._abandoned_if_cancelled(conn),
                ):
                    yield conn
            except HistStoreError:
                raise
            except DATABASE_ERRORS as exc:
                raise failure(action, None, exc, "body") from exc

    # ------------------------------------------------------------------ giving up

    def _limited(self, work: Awaitable[T]) -> Awaitable[T]:
        """``work``, given up after the store's ``command_timeout`` (PostgreSQL): then
        ``CallTimeout``, once the work's connection is given up (``Driver.abandon``).
        Without one, ``work`` itself (no coroutine around it)."""
        limit = self._limit
        if limit is None:
            return work
        return self._timed(work, limit)

    async def _timed(self, work: Awaitable[T], limit: float) -> T:
        scope = asyncio.timeout(limit)
        try:
            async with scope:
                return await work
        except TimeoutError:
            if scope.expired():
                raise CallTimeout(limit) from None
            raise

    def _abandoned_if_cancelled(self, conn: AsyncConnection) -> _AbandonedIfCancelled:
        """SQLAlchemy work on ``conn``: when it is cancelled, give the driver connection
        up and invalidate ``conn``, before SQLAlchemy would roll back on it (which waits
        for the server). SQLite's work is local and ends by itself (and in memory its
        one connection is the database): nothing there."""
        return _AbandonedIfCancelled(None if self._sqlite is not None else self.driver, conn)


class _AbandonedIfCancelled:
    """See ``Executor._abandoned_if_cancelled`` (a class, not an async generator: see
    ``_storage.lending``)."""

    __slots__ = ("_conn", "_driver")

    def __init__(self, driver: Driver | None, conn: AsyncConnection) -> None:
        self._driver = driver
        self._conn = conn

    async def __aenter__(self) -> None:
        return None

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        conn = self._conn
        if self._driver is None or not isinstance(exc, asyncio.CancelledError):
            return
        if not conn.invalidated:
            raw = await conn.get_raw_connection()
            if raw.driver_connection is not None:
                await self._driver.abandon(raw.driver_connection)
            await conn.invalidate()
