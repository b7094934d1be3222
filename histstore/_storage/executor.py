"""The executor: the one way the store reaches its database.

It owns the connections a store uses (``ConnectionCache``), runs statements and programs
on them through the driver seam (``_storage.drivers``) and SQLAlchemy Core work for the
reads off the hot path, finishes every transaction it starts even when the caller is
cancelled, and translates every database error (``_storage.dberrors``). It holds the
store's lifecycle: a closed executor, or one called from another event loop than its
own, refuses work with a ``HistStoreError`` before touching a connection.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from contextlib import AbstractAsyncContextManager, nullcontext
from typing import Any, TypeVar

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.pool import PoolProxiedConnection
from sqlalchemy.sql import ClauseElement
from sqlalchemy.util import greenlet_spawn

from .append_groups import IN_FLIGHT, AppendGroups, statement_sender
from .calls import Calls
from .completion import run_to_completion
from .connections import ConnectionCache, release_connections, spare
from .dberrors import DATABASE_ERRORS, DatabaseFailure, connection_lost, failure, not_committed
from .deadlines import WRITE_GRACE, CallTimeout
from .diagnostics import Diagnostics, diagnose
from .drivers import CompiledStatement, Driver, Phase, Program, Rollback, for_dialect
from .engine import SETTINGS_OPTION, SqliteSettings, is_memory_url
from .lending import READ_SLOTS, LentConnection, ReadSlots
from .long_work import LongWork
from .pool_options import DEFAULT_REFUSED_WAIT
from .read_groups import ReadGroups
from .refusals import Backoff, connection
from .search_index import INDEX_GROUPS, IndexScheduler, PendingIndex
from .sqlite_writer import SqliteWriter
from .statements import dialects as _dialects
from .transaction import Transaction

__all__ = ["Executor", "Transaction", "run_to_completion"]

T = TypeVar("T")

_NO_TURN: AbstractAsyncContextManager[None] = nullcontext()
_MAX_STALE = 64  # connections found closed that one call drops, then takes what comes


class Executor(LongWork):
    """Runs a store's statements, programs and Core work on its engine (see module doc).

    Shared by a store and its scoped views: closing it closes them all.
    """

    def __init__(
        self,
        engine: AsyncEngine,
        sqlite: SqliteSettings | None,
        schema: str | None = None,
        *,
        read_only: bool = False,
        pooled: bool = False,
        refused_wait: float = DEFAULT_REFUSED_WAIT,
        capacity: int | None = None,
        command_timeout: float | None = None,
    ) -> None:
        self.dialect = engine.dialect
        # PostgreSQL: every call is given up within ``deadlines.GIVE_UP_BOUND`` of its
        # caller's cancellation or ``command_timeout``, also when the server is silent.
        # SQLite works in this process: its calls run to their end (``busy_timeout``
        # bounds their waits, and ``connect()`` caps it at ``command_timeout``).
        self._limit = command_timeout if sqlite is None else None
        self._write_grace = WRITE_GRACE if sqlite is None else None
        self._read_grace = 0.0 if sqlite is None else None
        self.read_only = read_only
        """Every write transaction is refused (``connect(read_only=True)``)."""
        self._in_memory = is_memory_url(engine.url)
        patience = None if sqlite is None or self._in_memory else sqlite.busy_timeout_ms
        self.driver: Driver = for_dialect(engine.dialect, schema, pooled=pooled, patience=patience)
        self._base_engine = engine
        if schema is not None:
            # Core work names it by SQLAlchemy's translate map (statements carry it already).
            engine = engine.execution_options(schema_translate_map={None: schema})
        self.engine = engine
        """The engine (with the store's schema, when it has one)."""
        self._sqlite = sqlite
        # PostgreSQL: single-statement writes (appends, indexing runs) keep ``IN_FLIGHT``
        # connections of their own (each server session plans statements for itself).
        # ``capacity``: the most connections the pool holds, when connect() made it.
        # Every connection is opened through one ``Backoff`` (``_storage.refusals``).
        writes = IN_FLIGHT if sqlite is None else 0
        self._backoff = Backoff(refused_wait)
        self._statement_writes = ConnectionCache.for_engine(
            engine, limit=writes, reserve=1, capacity=capacity, backoff=self._backoff
        )
        # An SQLite file: the writer keeps its write connection for the store's life,
        # when the pool's size leaves one more (then the cache keeps one fewer).
        keeps = sqlite is not None and not self._in_memory and spare(engine) > 0
        self._cache = ConnectionCache.for_engine(
            engine,
            reserve=self._statement_writes.limit + keeps,
            capacity=capacity,
            backoff=self._backoff,
        )
        self.calls = Calls()
        """The calls in progress and the lifecycle (``_storage.calls``)."""
        given: dict[str, Any] = {} if sqlite is None else {SETTINGS_OPTION: sqlite}
        modes = {m: _dialects.mode_options(self.dialect, m) for m in ("read", "snapshot", "write")}
        self._engines = {m: engine.execution_options(**given, **o) for m, o in modes.items()}
        try:
            self._loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            self._loop = None
        # An SQLite file: every write goes through the store's writer
        # (``_storage.sqlite_writer``). In memory the pool's one connection serializes.
        self._gated = sqlite is not None and not self._in_memory
        self.writer: SqliteWriter | None = None
        if sqlite is not None and self._gated:
            self.writer = SqliteWriter(
                self._connection,
                self.driver.run_group,
                self.driver.checkpoint,
                busy_timeout_s=sqlite.busy_timeout_ms / 1000,
                inline=sqlite.synchronous == "NORMAL",  # commits that do not fsync
                keep=keeps,
            )
        # Programs go to the writer's queue where the driver runs a group in one trip.
        self._grouped = self.writer is not None and self.driver.groups
        self._reading = ReadSlots(READ_SLOTS if self._gated else None)
        self._now = self._connection()  # the short reads' at once (``LentConnection.read_now``)
        self.pending: PendingIndex | None = None if sqlite is None else PendingIndex(self.driver)
        """SQLite's pending list of the full-text index (``_storage.search_index``)."""
        # SQLite: a scheduler indexes the pending list in the background, through the
        # writer's queue (``search_index.IndexScheduler``). Postgres's index is kept by
        # the writes themselves.
        self.indexer: IndexScheduler | None = None
        if read_only:
            pass
        elif self._grouped and self.pending is not None and self.writer is not None:
            index = self.pending.index
            self.indexer = IndexScheduler(index, self._index_in_queue, INDEX_GROUPS)
            self.writer.indexer = self.indexer
        self._appends = AppendGroups(statement_sender(self.write))
        self._reads = ReadGroups(lambda st, p, a, c: self.fetch(st, p, action=a, conversation=c))

    # ------------------------------------------------------------------ lifecycle

    @property
    def closed(self) -> bool:
        """Whether ``close()`` has ended (it waits for the calls it found)."""
        return self.calls.state == "closed"

    @property
    def idle_connections(self) -> int:
        """Connections kept for the next calls (checked out of the pool, unused)."""
        return self._cache.idle + self._statement_writes.idle

    def diagnostics(self) -> Diagnostics:
        """What the store's connections, writer and background work are doing now."""
        return diagnose(self)

    def refuse_writes(self, action: str, conversation: str | None) -> None:
        """Raise ``DatabaseFailure`` (nothing done) when the store is read-only."""
        if self.read_only:
            where = f" conversation {conversation!r}" if conversation is not None else ""
            raise DatabaseFailure(
                f"{action}{where} refused: the store was opened with read_only=True"
            )

    async def close(self, *, dispose: bool) -> None:
        """Give every kept connection back; with ``dispose`` close the engine too (from
        any loop once the store's own has closed: ``_storage.orphans``). Waits first for
        the calls the store took (``_storage.calls``)."""
        if self.closed:
            return
        orphaned = self._loop is not None and self._loop.is_closed()
        if not orphaned:
            self._own_loop()
            self.calls.refuse()
            if self.writer is not None:
                await self.writer.stop()
            await self.calls.wait()
            await self._appends.wait_idle()
            await self._reads.wait_idle()
            if self.indexer is not None:
                await self.indexer.close()
            if self.writer is not None:
                await self.writer.close()
        self.calls.state = "closed"
        kept = (self._cache, self._statement_writes)
        lent = None if self.writer is None or not orphaned else self.writer.connection.abandon()
        extra = [lent.raw] if isinstance(lent, LentConnection) and lent.raw is not None else []
        await release_connections(kept, self._base_engine, dispose, orphaned=orphaned, extra=extra)

    def listed(self, messages: int = 1) -> None:
        """A write committed outside the groups: what it listed for the full-text index
        (about ``messages`` messages) is indexed by the next run or at close."""
        if self._grouped and self.writer is not None:
            self.writer.note_listed(messages)
        elif self.indexer is not None:
            self.indexer.listed(messages)

    async def index_list(self) -> None:
        """Index the full-text index's whole pending list (``_storage.search_index``), as
        a search of a writable SQLite store does first when the list holds messages."""
        if self.pending is None:  # Postgres: its writes keep the index
            return
        program = self.pending.index(None)
        if not self._grouped:
            await self.write(program, action="indexing search text")
        else:
            with self.call():
                await self._index_in_queue(program)

    async def _index_in_queue(self, program: Program[bool]) -> bool:
        """An indexing run in the SQLite writer's queue, marked as such: it lists nothing."""
        assert self.writer is not None
        return await self.writer.submit(program, "indexing search text", None, indexing=True)

    def compile(self, stmt: ClauseElement) -> CompiledStatement:
        """Compile a Core statement for this store's driver."""
        return self.driver.compile(stmt)

    # ------------------------------------------------------------------ connections

    async def checkout(self, cache: ConnectionCache) -> PoolProxiedConnection:
        """A connection from ``cache`` or the pool that the driver does not know to be
        gone: one the server closed while it was idle (a restart, an idle timeout) is
        invalidated, so the pool opens a new one, before anything is sent on it.

        The engine has no pre-ping (a round trip per call); a connection that dies
        unnoticed fails its call with ``DatabaseFailure`` and is never reused.
        """
        for _ in range(_MAX_STALE):
            raw = await cache.get()
            conn = raw.driver_connection
            if conn is None or not self.driver.closed(conn):
                return raw
            await greenlet_spawn(raw.invalidate)
        return await cache.get()

    def _connection(self, cache: ConnectionCache | None = None) -> LentConnection:
        """A driver connection from ``cache`` (else the main one), lent (``_storage.lending``)."""
        return LentConnection(self, self._cache if cache is None else cache)

    def _write_connection(self, cache: Any = None) -> AbstractAsyncContextManager[Any]:
        """A write's connection, in the turn: the SQLite writer's own, else ``_connection``."""
        return self._connection(cache) if self.writer is None else self.writer.lend()

    def _core(self, engine: AsyncEngine) -> AbstractAsyncContextManager[AsyncConnection]:
        """A SQLAlchemy connection of ``engine`` for Core work, waiting out refusals."""
        return connection(engine, self._backoff)

    def _writing(self, action: str, conversation: str | None) -> AbstractAsyncContextManager[None]:
        """This store's SQLite write turn, held for an ``async with`` (nothing on
        Postgres or in memory; see ``__init__``)."""
        if self.writer is None:
            return _NO_TURN
        return self.writer.turn(action, conversation)

    @property
    def sqlite(self) -> SqliteSettings | None:
        """The SQLite settings every connection gets (``None`` on Postgres)."""
        return self._sqlite

    # ------------------------------------------------------------------ running

    async def fetch(
        self,
        stmt: CompiledStatement,
        params: Mapping[str, Any],
        *,
        action: str,
        conversation: str | None = None,
        inline: bool = False,
        group: CompiledStatement | None = None,
    ) -> Sequence[Any]:
        """Run one reading statement (atomic by itself: no transaction) and return its rows;
        ``inline``: a short one, see ``Driver.fetch``; ``group``: the statement reading
        for several such calls at once (``_storage.read_groups``).

        A cancelled read just loses its connection, except in memory, where that
        connection is the database: there it runs to completion. A read whose
        connection is lost while it runs (not while it is opened) runs once more, on a
        new connection: it changes nothing, so that is safe, and a connection that died
        unnoticed (a server restart, a dropped network path) then costs no failure.
        """
        with self.call():
            if group is not None:
                try:
                    return await self._limited(
                        self._reads.submit(stmt, group, params, action, conversation)
                    )
                except CallTimeout as exc:
                    raise failure(action, conversation, exc, "body") from exc

            tries: tuple[bool, ...] = (True, False)
            if inline and self.driver.reads_now and self._reading.free():
                try:  # what the lines below do when they wait for nothing
                    rows = self._now.read_now(stmt, params)
                except BaseException as exc:  # noqa: BLE001 - read_failed raises or retries
                    rows, tries = None, await self._now.read_failed(exc, action, conversation)
                if rows is not None:
                    return rows

            async def run() -> Sequence[Any]:
                for again in tries:
                    opened = False
                    try:
                        async with self._connection() as conn:
                            opened = True
                            return await self.driver.fetch(conn, stmt, params, inline=inline)
                    except DATABASE_ERRORS as exc:
                        if again and opened and connection_lost(exc):
                            continue  # once more, on a new connection
                        raise failure(action, conversation, exc, "body") from exc
                raise AssertionError("unreachable")

            try:
                async with self._reading:
                    return await (
                        run_to_completion(run()) if self._in_memory else self._limited(run())
                    )
            except CallTimeout as exc:
                raise failure(action, conversation, exc, "body") from exc

    async def write(
        self,
        program: Program[T],
        *,
        action: str,
        conversation: str | None = None,
        single: bool = False,
        lists: int = 1,
        short: bool = False,
    ) -> T:
        """Run ``program`` as one write transaction, to its end even when cancelled.

        Returns its value (committed, or rolled back for a ``Rollback``). A database
        failure raises ``DatabaseFailure`` whose ``phase`` says whether the commit was
        under way; what the program raises propagates after the rollback. With
        ``single`` the program is one statement run as its own transaction (no BEGIN
        and COMMIT round trips): a failure during it leaves the outcome unknown.
        ``lists``: about how many messages it lists for the full-text index (0: none,
        as the indexer's). ``short``: a few rows written (``_storage.sqlite_writer``).
        """
        with self.call():
            self.refuse_writes(action, conversation)

            async def attempt(phase: Phase) -> T | Rollback[T]:
                async with self._write_connection(
                    self._statement_writes if single else None
                ) as conn:
                    if single:
                        phase.name = "commit"  # its own commit, from the moment it is sent
                    return await self.driver.run(
                        conn, program, phase, begin=not single, end=not single
                    )

            async def run() -> T:
                phase = Phase()
                try:
                    value = await self._limited(attempt(phase))
                    phase.name = "done"
                except DATABASE_ERRORS as exc:
                    # A server that answered with an error (a cancelled statement, a refused
                    # COMMIT) ended the transaction uncommitted, as did a statement the driver
                    # never sent: only a lost answer leaves the outcome unknown.
                    name = "body" if phase.name == "commit" and not_committed(exc) else phase.name
                    raise failure(action, conversation, exc, name) from exc
                return value.value if isinstance(value, Rollback) else value

            if self._grouped and self.writer is not None and not single:
                return await self.writer.submit(
                    program, action, conversation, short=short, lists=lists
                )
            if single and not self._gated:
                # One statement is its own transaction on the server: a cancellation during
                # it leaves nothing half done (the connection, whose state is then unknown,
                # is dropped), so it needs no task of its own to run it to the end.
                value = await run()
            else:
                # Waiting for the write turn can be cancelled; the transaction, once begun, ends.
                async with self._writing(action, conversation):
                    value = await run_to_completion(run(), grace=self._write_grace)
            if lists:
                self.listed(lists)
            return value

    async def append(
        self,
        one: CompiledStatement,
        group: CompiledStatement | None,
        params: dict[str, Any],
        *,
        action: str,
        lists: int,
    ) -> Sequence[Any]:
        """Run the append statement ``one`` with ``params`` as its own transaction and
        return its rows; concurrent appends go together in a ``group`` statement where
        there is one, each still getting its own rows or failure (``append_groups``)."""
        with self.call():
            self.refuse_writes(action, params["c"])
            rows = await self._appends.append(one, group, params, action)
            if lists:
                self.listed(lists)
            return rows

    async def snapshot(
        self, program: Program[T], *, action: str, conversation: str | None = None
    ) -> T:
        """Run ``program``, which only reads, in one snapshot transaction that takes no
        write lock and is rolled back at its end; return its value."""
        with self.call():

            async def attempt() -> T | Rollback[T]:
                async with self._connection() as conn:
                    return await self.driver.run(
                        conn, _rolled_back(program), Phase(), begin=True, end=True, snapshot=True
                    )

            async def run() -> T:
                try:
                    value = await self._limited(attempt())
                except DATABASE_ERRORS as exc:
                    raise failure(action, conversation, exc, "body") from exc
                assert isinstance(value, Rollback)
                return value.value

            async with self._reading:
                return await run_to_completion(run(), grace=self._read_grace)


def _rolled_back(program: Program[T]) -> Program[T]:
    """``program``, ending its transaction with a rollback whatever it returns."""
    value = yield from program
    return value if isinstance(value, Rollback) else Rollback(value)
