"""The seam to the drivers: compiled statements, programs, and how each driver runs them.

A statement is a SQLAlchemy Core statement compiled once for the dialect
(``CompiledStatement``); its values go through SQLAlchemy's own bind processors and are
sent straight to the driver connection, one driver call per statement, without
SQLAlchemy's execution layer (several hundred microseconds of Python a statement).

A write transaction is a *program*: a generator that yields the statements to run (see
``Step``) and receives each one's rows; it returns the transaction's value. Returning
``Rollback(value)`` ends the transaction without committing. Every write of the store
is written once as such a program, and each driver runs it its own way:

* asyncpg awaits one protocol call per statement;
* aiosqlite runs the whole program, from ``BEGIN IMMEDIATE`` to ``COMMIT``, in one trip
  to the connection's thread (the thread hops cost more than the statements, and
  SQLite's one write lock is then held only while SQLite works). That uses aiosqlite's
  private ``Connection._execute`` and ``_conn``; when they are missing (a future
  aiosqlite), the program runs through aiosqlite's public calls instead: slower, never
  broken. Nothing outside this module touches a driver or SQLAlchemy internals.
"""

from __future__ import annotations

import random
import sqlite3
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Generator, Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from sqlalchemy.engine import Dialect
from sqlalchemy.sql import ClauseElement, Executable
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.types import TypeEngine

__all__ = [
    "EXECUTE",
    "EXECUTE_MANY",
    "FETCH",
    "CompiledStatement",
    "Driver",
    "Phase",
    "Program",
    "Rollback",
    "Step",
    "for_dialect",
    "never_switch_jit",
]

T = TypeVar("T")

Processor = Callable[[Any], Any] | None
Memo = dict[tuple[int, int], Any]
"""Converted bind values by (processor, value) identity, shared within one transaction."""

FETCH, EXECUTE, EXECUTE_MANY = "fetch", "execute", "execute_many"
Step = tuple[str, "CompiledStatement", Any]
"""One statement of a program: ``(FETCH, stmt, params)`` sends back the rows,
``(EXECUTE, stmt, params)`` sends back ``None``, ``(EXECUTE_MANY, stmt, [params, ...])``
runs the statement once per parameter mapping and sends back ``None``."""


@dataclass(frozen=True)
class Rollback(Generic[T]):
    """What a program returns to end its transaction without committing."""

    value: T


Program = Generator[Step, Any, "T | Rollback[T]"]
"""A transaction's statements; what it returns is committed (see ``Rollback``). An
exception it raises rolls the transaction back and propagates."""


class Phase:
    """Where a transaction is: ``body``, then ``commit`` while COMMIT is under way, then
    ``done``. A failure in the commit phase leaves the outcome unknown."""

    __slots__ = ("name",)

    def __init__(self) -> None:
        self.name = "body"


class CompiledStatement:
    """A Core statement compiled for one dialect, with its parameter order and processors."""

    def __init__(self, stmt: ClauseElement, dialect: Dialect, schema: str | None = None) -> None:
        placed: dict[str, Any] = {}
        if schema is not None:
            placed = {"schema_translate_map": {None: schema}, "render_schema_translate": True}
        compiled = stmt.compile(dialect=dialect, **placed)
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


class _Running(Generic[T]):
    """Iterates over a program's steps; set ``rows`` to what a step returned (it is sent
    back with the next step, ``None`` otherwise). ``value``: what the program returned."""

    def __init__(self, program: Program[T]) -> None:
        self._program = program
        self.rows: Any = None
        self.value: T | Rollback[T] | None = None

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
    """Runs compiled statements and programs on one kind of driver connection."""

    begin_sql = "BEGIN"
    snapshot_sql = "BEGIN"
    """How a transaction of reads that must agree begins (see ``run``'s ``snapshot``)."""

    def __init__(self, dialect: Dialect, schema: str | None = None) -> None:
        self.dialect = dialect
        self.schema = schema

    def compile(self, stmt: ClauseElement) -> CompiledStatement:
        """Compile a statement for this driver's dialect (and the store's schema)."""
        return CompiledStatement(stmt, self.dialect, self.schema)

    def result_processor(self, type_: TypeEngine[Any]) -> Processor:
        """How a value of ``type_`` read by the driver becomes a Python value."""
        return _processor(type_, self.dialect, bind=False)

    async def execute_sql(self, conn: Any, sql: str) -> None:
        """Run one statement without parameters (settings, BEGIN, ROLLBACK)."""
        await conn.execute(sql)

    async def fetch(
        self,
        conn: Any,
        stmt: CompiledStatement,
        params: Mapping[str, Any],
        memo: Memo | None = None,
    ) -> Sequence[Any]:
        """Run a statement that returns rows; all of them."""
        raise NotImplementedError

    async def execute(
        self, conn: Any, stmt: CompiledStatement, params: Any, many: bool, memo: Memo
    ) -> None:
        """Run a statement without rows, once or (``many``) once per parameter mapping."""
        raise NotImplementedError

    def in_transaction(self, conn: Any) -> bool:
        """Whether a transaction is open; raises when the connection is gone."""
        return bool(conn.in_transaction)

    def closed(self, conn: Any) -> bool:
        """Whether the driver already knows the connection is gone (no round trip)."""
        return False

    async def run(
        self,
        conn: Any,
        program: Program[T],
        phase: Phase,
        *,
        begin: bool,
        end: bool,
        snapshot: bool = False,
    ) -> T | Rollback[T]:
        """Run ``program``; with ``begin`` open the transaction first, with ``end`` commit
        it after (or roll it back for a ``Rollback``). On an exception the transaction
        is rolled back when the connection still answers, and the exception propagates.
        With ``snapshot`` the transaction only reads, from one snapshot, taking no write
        lock (``snapshot_sql``).
        """
        memo: Memo = {}
        running = _Running(program)
        if begin:
            await self.execute_sql(conn, self.snapshot_sql if snapshot else self.begin_sql)
        try:
            for kind, stmt, params in running:
                if kind == FETCH:
                    running.rows = await self.fetch(conn, stmt, params, memo)
                else:
                    await self.execute(conn, stmt, params, kind == EXECUTE_MANY, memo)
        except BaseException:
            with suppress(Exception):
                if self.in_transaction(conn):
                    await self.execute_sql(conn, "ROLLBACK")
            raise
        value = running.value
        if end:
            await self.finish(conn, isinstance(value, Rollback), phase)
        return value  # type: ignore[return-value]

    async def finish(self, conn: Any, rollback: bool, phase: Phase) -> None:
        """End the open transaction: roll back, or commit (moving ``phase`` along)."""
        if rollback:
            await self.execute_sql(conn, "ROLLBACK")
            return
        phase.name = "commit"
        await self.execute_sql(conn, "COMMIT")
        phase.name = "done"


class _Aiosqlite(Driver):
    begin_sql = "BEGIN IMMEDIATE"  # see _engine: why writers take the lock up front

    def __init__(self, dialect: Dialect, one_trip: bool) -> None:
        super().__init__(dialect, None)
        self.one_trip = one_trip

    async def fetch(
        self,
        conn: Any,
        stmt: CompiledStatement,
        params: Mapping[str, Any],
        memo: Memo | None = None,
    ) -> Sequence[Any]:
        rows = await conn.execute_fetchall(stmt.sql, stmt.args(params, memo))
        return rows  # type: ignore[no-any-return]

    async def execute(
        self, conn: Any, stmt: CompiledStatement, params: Any, many: bool, memo: Memo
    ) -> None:
        if many:
            await conn.executemany(stmt.sql, [stmt.args(p, memo) for p in params])
        else:
            await conn.execute(stmt.sql, stmt.args(params, memo))

    async def run(
        self,
        conn: Any,
        program: Program[T],
        phase: Phase,
        *,
        begin: bool,
        end: bool,
        snapshot: bool = False,
    ) -> T | Rollback[T]:
        if not self.one_trip:
            return await super().run(conn, program, phase, begin=begin, end=end, snapshot=snapshot)
        # aiosqlite runs every call as a function on the connection's own thread; this
        # hands it the whole program as one such function (``_execute`` is the queue
        # every aiosqlite method uses; ``_conn`` the sqlite3 connection it owns).
        return await conn._execute(  # type: ignore[no-any-return]
            self._run_on_thread, conn._conn, program, phase, begin, end, snapshot
        )

    @staticmethod
    def _run_on_thread(
        conn: sqlite3.Connection,
        program: Program[T],
        phase: Phase,
        begin: bool,
        end: bool,
        snapshot: bool = False,
    ) -> T | Rollback[T]:
        memo: Memo = {}
        running = _Running(program)
        if begin and snapshot:
            conn.execute("BEGIN")  # deferred: in WAL mode the first read fixes a snapshot
        elif begin:
            _take_write_lock(conn)
        try:
            for kind, stmt, params in running:
                if kind == FETCH:
                    running.rows = conn.execute(stmt.sql, stmt.args(params, memo)).fetchall()
                elif kind == EXECUTE:
                    conn.execute(stmt.sql, stmt.args(params, memo))
                else:
                    conn.executemany(stmt.sql, [stmt.args(p, memo) for p in params])
            value = running.value
            if end:
                if isinstance(value, Rollback):
                    conn.execute("ROLLBACK")
                else:
                    phase.name = "commit"
                    conn.execute("COMMIT")
                    phase.name = "done"
        except BaseException:
            # Still on the thread, so the transaction never outlives this call.
            if phase.name == "body" and conn.in_transaction:
                with suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
            raise
        return value  # type: ignore[return-value]


_SQLITE_BUSY = 5
_POLL_MAX = 0.004  # seconds between tries for the write lock, at most


def _take_write_lock(conn: sqlite3.Connection) -> None:
    """``BEGIN IMMEDIATE``, trying again every few milliseconds while another process
    holds the database's write lock, until the connection's busy timeout has passed.

    SQLite's own busy handler sleeps ever longer between tries (up to 100 ms), so a
    writer of another process could sleep on long after the lock came free; polling
    with a short, jittered pause hands the lock over within a few milliseconds. The
    busy timeout is set back for the transaction's other statements. Runs on the
    connection's own thread, where sleeping blocks nothing else.
    """
    patience = int(conn.execute("PRAGMA busy_timeout").fetchone()[0])
    if patience <= 0:
        conn.execute("BEGIN IMMEDIATE")
        return
    conn.execute("PRAGMA busy_timeout = 0")
    try:
        deadline = time.monotonic() + patience / 1000
        pause = 0.0005
        while True:
            try:
                conn.execute("BEGIN IMMEDIATE")
                return
            except sqlite3.OperationalError as exc:
                # SQLITE_BUSY or an extended code of it (its low byte); Python 3.10 has
                # no codes on its exceptions, only SQLite's message.
                code = getattr(exc, "sqlite_errorcode", None)
                busy = "locked" in str(exc) if code is None else code & 0xFF == _SQLITE_BUSY
                if not busy or time.monotonic() >= deadline:
                    raise
            time.sleep(pause * random.uniform(0.5, 1.5))  # noqa: S311 (jitter, not secrets)
            pause = min(pause * 2, _POLL_MAX)
    finally:
        conn.execute(f"PRAGMA busy_timeout = {patience:d}")


class _Asyncpg(Driver):
    # Every read sees the snapshot of the first; a read-only transaction never fails
    # for serialization.
    snapshot_sql = "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"

    def __init__(self, dialect: Dialect, schema: str | None, pooled: bool) -> None:
        super().__init__(dialect, schema)
        self.reuse_unnamed = pooled
        """Behind a transaction-mode pooler, and while asyncpg allows it (``_statement``)."""
        self._unnamed: weakref.WeakKeyDictionary[Any, OrderedDict[str, Any]] = (
            weakref.WeakKeyDictionary()
        )

    async def _statement(self, conn: Any, sql: str) -> Any | None:
        """Behind a transaction-mode pooler: the connection's reusable *unnamed*
        statement for ``sql``, or ``None`` to run it through ``conn`` itself.

        asyncpg's statement cache is off there (``_engine.transaction_pooler_args``), so
        ``conn.fetch`` would spend a round trip describing the statement before each
        execution. A statement prepared once with the empty name keeps its description
        on the client and is marked *unprepared*: every execution sends its Parse again
        together with Bind and Execute, one round trip, complete on whichever server
        session runs it; no server session keeps anything of it. That mark is asyncpg's
        private ``PreparedStatementState.prepared``: when it cannot be read as
        ``False`` (another asyncpg), this returns ``None`` and nothing is reused.
        """
        if not self.reuse_unnamed:
            return None
        cached = self._unnamed.get(conn)
        if cached is None:
            cached = self._unnamed[conn] = OrderedDict()
        statement = cached.get(sql)
        if statement is not None:
            cached.move_to_end(sql)
            return statement
        statement = await conn.prepare(sql, name="")
        state = getattr(statement, "_state", None)
        if getattr(state, "prepared", True) is not False:
            self.reuse_unnamed = False  # this asyncpg: statements run through ``conn``
            return None
        cached[sql] = statement
        if len(cached) > _UNNAMED_CACHE_SIZE:
            cached.popitem(last=False)
        return statement

    async def fetch(
        self,
        conn: Any,
        stmt: CompiledStatement,
        params: Mapping[str, Any],
        memo: Memo | None = None,
    ) -> Sequence[Any]:
        args = stmt.args(params, memo)
        statement = await self._statement(conn, stmt.sql)
        if statement is not None:
            return await statement.fetch(*args)  # type: ignore[no-any-return]
        return await conn.fetch(stmt.sql, *args)  # type: ignore[no-any-return]

    async def execute(
        self, conn: Any, stmt: CompiledStatement, params: Any, many: bool, memo: Memo
    ) -> None:
        statement = await self._statement(conn, stmt.sql)
        if many:
            rows = [stmt.args(p, memo) for p in params]
            if statement is not None:
                await statement.executemany(rows)
            else:
                await conn.executemany(stmt.sql, rows)
        elif statement is not None:
            await statement.fetch(*stmt.args(params, memo))
        else:
            await conn.execute(stmt.sql, *stmt.args(params, memo))

    def in_transaction(self, conn: Any) -> bool:
        if conn.is_closed():
            raise ConnectionError("connection closed")
        return bool(conn.is_in_transaction())

    def closed(self, conn: Any) -> bool:
        # asyncpg reads its socket while idle, so it learns of a server's goodbye (a
        # shutdown, a restart, an idle timeout) before the connection is used again.
        return bool(conn.is_closed())


_UNNAMED_CACHE_SIZE = 256
"""Reusable unnamed statements kept per connection behind a pooler (least recently
used first out); histstore's statements are a fixed set well below it."""


def never_switch_jit(conn: Any) -> None:
    """Tell an asyncpg connection that the server has no JIT for it to switch off.

    asyncpg turns JIT off with a session-level setting while it looks up a type it meets
    for the first time, and on again with a later statement; behind a transaction-mode
    pooler the two may reach different server sessions (see
    ``_engine.install_pooler_hooks``). This sets asyncpg's private ``_server_caps.jit``
    to false; where it is missing (another asyncpg), nothing is changed.
    """
    caps: Any = getattr(conn, "_server_caps", None)
    if getattr(caps, "jit", False) and callable(getattr(caps, "_replace", None)):
        conn._server_caps = caps._replace(jit=False)


def aiosqlite_one_trip() -> bool:
    """Whether the installed aiosqlite has what the one-trip program needs."""
    import aiosqlite

    return callable(getattr(aiosqlite.Connection, "_execute", None)) and isinstance(
        getattr(aiosqlite.Connection, "_conn", None), property
    )


def for_dialect(dialect: Dialect, schema: str | None = None, *, pooled: bool = False) -> Driver:
    """The driver seam for an engine's dialect; statements name ``schema`` when given.
    ``pooled``: the engine reaches PostgreSQL through a transaction-mode pooler.

    Raises:
        ValueError: a driver histstore does not run on, or a schema on SQLite.
    """
    name, driver = dialect.name, getattr(dialect, "driver", "")
    if name == "sqlite" and driver == "aiosqlite":
        if schema is not None:
            raise ValueError("schema= places the tables in a PostgreSQL schema; not on SQLite")
        return _Aiosqlite(dialect, aiosqlite_one_trip())
    if name == "postgresql" and driver == "asyncpg":
        return _Asyncpg(dialect, schema, pooled)
    raise ValueError(
        f"histstore runs on sqlite+aiosqlite and postgresql+asyncpg, not {name}+{driver}"
    )
