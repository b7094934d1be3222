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
  broken. Nothing outside this module and the two driver modules (``_storage.sqlite_driver``,
``_storage.pg_driver``) touches a driver or SQLAlchemy internals.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Hashable, Iterator, Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass
from datetime import datetime
from functools import cached_property
from operator import itemgetter
from typing import Any, Generic, TypeVar

from sqlalchemy.engine import Dialect
from sqlalchemy.sql import ClauseElement, Executable
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.types import TypeEngine

from .statements.kinds import pairing

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
    "ValueRows",
    "drained",
    "for_dialect",
]

T = TypeVar("T")

Convert = Callable[[Any], Any]
Processor = Convert | None
Memo = dict[tuple[Any, ...], Any]
"""Converted bind values by processor and value, shared within one transaction: by the
value's identity, or for a ``datetime`` by its value (see ``CompiledStatement.args``)."""

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


@dataclass(frozen=True, slots=True)
class ValueRows:
    """The rows of an ``EXECUTE_MANY`` as lists of values in the order of ``names``, not
    as a dict each: for many rows of one shape (a batch's messages), which then skip a
    dict per row and reading it back. ``CompiledStatement.args_many`` takes them as
    they are when ``names`` are its parameters in order, else by name."""

    names: tuple[str, ...]
    rows: list[list[Any]]


class CompiledStatement:
    """A Core statement compiled for one dialect, with its parameter order and processors.

    Compiled on first use (``sql``, ``args``), not when made: a store makes every
    statement it may run when it opens, and a process typically runs a few of them, so
    a fresh process pays only for those (about 2 ms each), spread over their first
    calls, instead of compiling all of them (100 ms or more) before its first call.
    """

    def __init__(self, stmt: ClauseElement, dialect: Dialect, schema: str | None = None) -> None:
        assert isinstance(stmt, Executable)
        self.statement = stmt
        """The Core statement, for running it through SQLAlchemy with the same params."""
        self._dialect = dialect
        self._schema = schema

    @cached_property
    def sql(self) -> str:
        """The statement's SQL text for the dialect."""
        return self._compiled[0]

    @cached_property
    def _compiled(self) -> tuple[str, list[tuple[str, Processor, Any, Hashable]]]:
        placed: dict[str, Any] = {}
        if self._schema is not None:
            placed = {
                "schema_translate_map": {None: self._schema},
                "render_schema_translate": True,
            }
        compiled = self.statement.compile(dialect=self._dialect, **placed)
        assert isinstance(compiled, SQLCompiler)
        names = list(compiled.positiontup or ())
        # (name, processor, value the statement itself gives (e.g. SQLite's OFFSET 0),
        # and what its conversions are memoized under: see ``_converted``)
        binds: list[tuple[str, Processor, Any, Hashable]] = []
        for name in names:
            type_ = compiled.binds[name].type
            proc = _processor(type_, self._dialect, bind=True)
            binds.append((name, proc, compiled.binds[name].value, (type(type_), repr(type_))))
        return str(compiled), binds

    @cached_property
    def _binds(self) -> list[tuple[str, Processor, Any, Hashable]]:
        return self._compiled[1]

    @cached_property
    def _read_row(
        self,
    ) -> tuple[
        tuple[str, ...], Callable[[Mapping[str, Any]], Any], list[tuple[int, Convert, Hashable]]
    ]:
        """What ``args_many`` reads rows with: the bind names in order, one ``itemgetter``
        of them all (for a dict row), and the positions whose values a processor
        converts."""
        names = tuple(name for name, _, _, _ in self._binds)
        read = itemgetter(*names) if len(names) > 1 else (lambda row: [row[n] for n in names])
        converted = [
            (i, proc, kind) for i, (_, proc, _, kind) in enumerate(self._binds) if proc is not None
        ]
        return names, read, converted

    def args_many(
        self, rows: Sequence[Mapping[str, Any]] | ValueRows, memo: Memo | None = None
    ) -> list[Any]:
        """``args`` of each of ``rows`` (the rows of an ``EXECUTE_MANY``), with one memo.

        ``ValueRows`` in the statement's order are taken as they are; a dict row holding
        every bind name (as ``_storage.rows`` builds them) is read with one
        ``itemgetter`` call; any other row by name, with the statement's own values
        where it has none. Then only the values a processor converts are looked at, a
        value that is the object the row before held there (a batch's rows share their
        time) taking that row's conversion. All give the same arguments as ``args``."""
        if memo is None:
            memo = {}
        names, read, converted = self._read_row
        values: Sequence[Sequence[Any]]
        if isinstance(rows, ValueRows) and rows.names == names:
            values = rows.rows
        else:
            if isinstance(rows, ValueRows):  # another order: by name
                rows = [dict(zip(rows.names, row, strict=True)) for row in rows.rows]
            read_rows: list[Sequence[Any]] = []
            for row in rows:
                try:
                    read_rows.append(read(row))
                except KeyError:
                    read_rows.append([row.get(name, value) for name, _, value, _ in self._binds])
            values = read_rows
        last: list[tuple[Any, Any]] = [(None, None)] * len(converted)  # (value, converted)
        out: list[Any] = []
        for given in values:
            args = list(given)  # the given rows stay as they are
            for k, (i, proc, kind) in enumerate(converted):
                value = args[i]
                if value is None:
                    continue
                before, done = last[k]
                if value is not before:  # ``rows`` holds every value: no id is reused
                    done = _converted(proc, kind, value, memo)
                    last[k] = (value, done)
                args[i] = done
            out.append(args)
        return out

    def args(self, params: Mapping[str, Any], memo: Memo | None = None) -> list[Any]:
        """The positional arguments for ``params`` (a mapping of bind names to values).

        ``memo`` shares converted times between calls (the statements and rows of one
        write repeat the same timestamp, whose conversion is the costly one on SQLite),
        keyed by value, so equal times made apart (the rows of a revert or an import,
        each read back on its own) are converted once: with its zone and ``fold`` in the
        key, equal such values convert alike. Other values are converted each time: a
        key by identity would hand a later value the conversion of an earlier one the
        program let go of, whose id it was given (a program's successive arrays).
        """
        if memo is None:
            memo = {}
        out = []
        for name, proc, default, kind in self._binds:
            value = params.get(name, default)
            if proc is None or value is None:
                out.append(value)
            else:
                out.append(_converted(proc, kind, value, memo))
        return out


def _converted(proc: Convert, kind: Hashable, value: Any, memo: Memo) -> Any:
    """``proc(value)``; a time's conversion shared through ``memo`` (see ``args``) by
    every bind of the same ``kind``: its type's class and arguments, which on one
    dialect (a memo serves one program) convert alike, whichever column it is for."""
    if type(value) is not datetime:
        return proc(value)
    key = (kind, value, value.tzinfo, value.fold)
    if key not in memo:
        memo[key] = proc(value)
    return memo[key]


def _processor(type_: TypeEngine[Any], dialect: Dialect, *, bind: bool) -> Processor:
    impl = type_.dialect_impl(dialect)
    if bind:
        return impl.bind_processor(dialect)
    return impl.result_processor(dialect, None)


def drained(rows: Sequence[Any]) -> Iterator[Any]:
    """The rows a ``FETCH`` sent back, each let go (in the list, which the driver may
    still hold while the program runs) once the loop over them moved on: for rows that
    are large, such as change records that each hold a whole conversation."""
    if not isinstance(rows, list):
        yield from rows
        return
    for i, row in enumerate(rows):
        yield row
        rows[i] = None


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
    groups = False
    """Whether ``run_group`` runs several write programs in one transaction."""
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
        *,
        inline: bool = False,
    ) -> Sequence[Any]:
        """Run a statement that returns rows; all of them. ``inline``: a short read (a
        few rows by an index) that may run on the event loop's own thread, where the
        driver has threads of its own (SQLite); the same read elsewhere."""
        raise NotImplementedError

    reads_now = False
    """Whether ``read_now`` may read (else it always returns ``None``)."""

    def read_now(
        self,
        conn: Any,
        stmt: CompiledStatement,
        params: Mapping[str, Any],
        memo: Memo | None = None,
    ) -> list[Any] | None:
        """``fetch``'s rows of a short read, read at once on the event loop's thread
        without waiting for anything; ``None`` when the driver cannot, or ``conn`` is
        ``None`` or known closed (then nothing was read; ``fetch`` reads it). Only
        drivers with threads of their own can (SQLite)."""
        return None

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

    async def abandon(self, conn: Any) -> None:
        """Give ``conn`` up after a call on it was cut off, within
        ``_storage.deadlines.ABANDON_PATIENCE``, before it is invalidated; nothing
        here (a local database's connection closes without waiting for anyone)."""

    async def settle(self, conn: Any) -> bool:
        """After a caller was cancelled during a call on ``conn``: wait until that call
        has ended; whether ``conn`` may then be reused. ``False`` here: a call cut off
        half way leaves the connection in a state nobody knows."""
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

    async def run_group(
        self, conn: Any, programs: list[Program[Any]], phase: Phase, inline: bool = False
    ) -> list[tuple[bool, Any]]:
        """Run write programs in one transaction (see ``_storage.sqlite_writer``), where
        ``groups`` says the driver can; ``inline`` as ``fetch``'s, for a short write."""
        raise NotImplementedError

    async def checkpoint(self, conn: Any, truncate: bool = False) -> tuple[int, int]:
        """Checkpoint the database's log, where ``groups`` says the driver can: its
        pages, and how many of them are copied. ``truncate``: also cut the log's file
        to nothing, if no reader uses it now (never waiting for one)."""
        raise NotImplementedError

    async def finish(self, conn: Any, rollback: bool, phase: Phase) -> None:
        """End the open transaction: roll back, or commit (moving ``phase`` along)."""
        if rollback:
            await self.execute_sql(conn, "ROLLBACK")
            return
        phase.name = "commit"
        await self.execute_sql(conn, "COMMIT")
        phase.name = "done"


def for_dialect(
    dialect: Dialect,
    schema: str | None = None,
    *,
    pooled: bool = False,
    patience: int | None = None,
) -> Driver:
    """The driver seam for an engine's dialect; statements name ``schema`` when given.
    ``pooled``: the engine reaches PostgreSQL through a transaction-mode pooler.
    ``patience``: SQLite, the busy timeout (ms) of the store's connections (``None``: one
    in-memory connection, which never waits for a lock).

    Raises:
        ValueError: a driver histstore does not run on, or a schema on SQLite.
    """
    paired = pairing(dialect)
    if paired == "sqlite+aiosqlite":
        if schema is not None:
            raise ValueError("schema= places the tables in a PostgreSQL schema; not on SQLite")
        from . import sqlite_driver as _sqlite_driver

        one_trip = _sqlite_driver.aiosqlite_one_trip()
        return _sqlite_driver.SqliteDriver(dialect, one_trip, patience)
    if paired == "postgresql+asyncpg":
        from .pg_driver import PostgresDriver

        return PostgresDriver(dialect, schema, pooled)
    raise ValueError(f"histstore runs on sqlite+aiosqlite and postgresql+asyncpg, not {paired}")
