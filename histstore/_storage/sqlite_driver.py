"""The aiosqlite driver: a whole program in one trip to the connection's thread.

aiosqlite runs every call as a function on the connection's own thread; this driver
hands it the whole program, from ``BEGIN IMMEDIATE`` to ``COMMIT``, as one such
function (its private ``Connection._execute`` and ``_conn``). When they are missing (a
future aiosqlite), the program runs through aiosqlite's public calls instead: slower,
never broken (``aiosqlite_one_trip``).
"""

from __future__ import annotations

import asyncio
import random
import re
import sqlite3
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from functools import lru_cache
from typing import Any, TypeVar

from sqlalchemy.engine import Dialect

from .drivers import (
    EXECUTE,
    FETCH,
    CompiledStatement,
    Driver,
    Memo,
    Phase,
    Program,
    Rollback,
    _Running,
)

__all__ = ["SqliteDriver", "aiosqlite_one_trip", "execute_many"]

T = TypeVar("T")


class SqliteDriver(Driver):
    begin_sql = "BEGIN IMMEDIATE"  # see _engine: why writers take the lock up front

    def __init__(self, dialect: Dialect, one_trip: bool) -> None:
        super().__init__(dialect, None)
        self.one_trip = one_trip
        self.groups = one_trip

    async def fetch(
        self,
        conn: Any,
        stmt: CompiledStatement,
        params: Mapping[str, Any],
        memo: Memo | None = None,
    ) -> Sequence[Any]:
        args = stmt.args(params, memo)
        if self.one_trip:
            return await _on_thread(conn, _fetch_on_thread, conn._conn, stmt.sql, args)  # noqa: SLF001 - see run
        rows = await conn.execute_fetchall(stmt.sql, args)
        return rows  # type: ignore[no-any-return]

    async def execute(
        self, conn: Any, stmt: CompiledStatement, params: Any, many: bool, memo: Memo
    ) -> None:
        if many:
            await conn.executemany(stmt.sql, stmt.args_many(params, memo))
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
        return await _on_thread(
            conn,
            self._run_on_thread,
            conn._conn,  # noqa: SLF001 - the sqlite3 connection aiosqlite owns, see above
            program,
            phase,
            begin,
            end,
            snapshot,
        )

    async def settle(self, conn: Any) -> bool:
        """aiosqlite runs the calls queued on a connection's thread in order, each to its
        end, whether or not its caller still waits: once a call queued now has run,
        every earlier one has ended (a whole program commits or rolls back within its
        call). Reusable then when no transaction was left open."""
        if not self.one_trip:
            return False  # its programs span several calls: one may be left half done
        try:
            while True:
                try:
                    await conn._execute(_nothing)  # noqa: SLF001 - aiosqlite's queue, see run
                    break
                except asyncio.CancelledError:
                    continue  # cancelled again while waiting: the call still ends first
            return not self.in_transaction(conn)
        except Exception:  # noqa: BLE001 - a connection that fails here is not reused
            return False

    @staticmethod
    async def checkpoint(conn: Any) -> tuple[int, int]:
        """Copy what the WAL holds into the database file as far as readers allow
        (``PASSIVE``: waits for no reader or writer, and blocks none); returns the
        WAL's pages and how many of them are copied."""
        rows = await conn.execute_fetchall("PRAGMA wal_checkpoint(PASSIVE)")
        _busy, pages, copied = rows[0]
        return int(pages), int(copied)

    async def run_group(
        self, conn: Any, programs: list[Program[Any]], phase: Phase
    ) -> list[tuple[bool, Any]]:
        """Run ``programs`` in one write transaction, each in a savepoint of its own (see
        ``_storage.group_commit``): per program ``(True, value)``, or ``(False, what it
        raised)`` with its statements undone. A failure of the transaction itself
        raises (``phase`` says how far it got)."""
        if len(programs) == 1:
            return [(True, await self.run(conn, programs[0], phase, begin=True, end=True))]
        return await _on_thread(
            conn,
            self._run_group_on_thread,
            conn._conn,  # noqa: SLF001 - see run
            programs,
            phase,
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
        if begin and snapshot:
            conn.execute("BEGIN")  # deferred: in WAL mode the first read fixes a snapshot
        elif begin:
            _take_write_lock(conn)
        with _rolled_back_on_failure(conn, phase):
            value = _run_steps(conn, program)
            if end and isinstance(value, Rollback):
                conn.execute("ROLLBACK")
            elif end:
                _commit(conn, phase)
        return value

    @staticmethod
    def _run_group_on_thread(
        conn: sqlite3.Connection, programs: list[Program[Any]], phase: Phase
    ) -> list[tuple[bool, Any]]:
        _take_write_lock(conn)
        outcomes: list[tuple[bool, Any]] = []
        with _rolled_back_on_failure(conn, phase):
            for program in programs:
                conn.execute("SAVEPOINT histstore_member")
                try:
                    value = _run_steps(conn, program)
                except Exception as exc:
                    if not conn.in_transaction:
                        raise  # the transaction itself is gone: every member fails
                    conn.execute("ROLLBACK TO histstore_member")
                    conn.execute("RELEASE histstore_member")
                    outcomes.append((False, exc))
                    continue
                if isinstance(value, Rollback):
                    conn.execute("ROLLBACK TO histstore_member")
                conn.execute("RELEASE histstore_member")
                outcomes.append((True, value))
            _commit(conn, phase)
        return outcomes


async def _on_thread(conn: Any, fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` run on the connection's thread (aiosqlite's private ``_execute``, see
    ``SqliteDriver.run``). The value comes back in a box that is emptied here: aiosqlite's
    thread holds what its last call returned until its next call, and a value may be a
    whole conversation."""
    box: list[T] = await conn._execute(_boxed, fn, *args)  # noqa: SLF001 - see above
    return box.pop()


def _boxed(fn: Callable[..., T], *args: Any) -> list[T]:
    return [fn(*args)]


def _fetch_on_thread(conn: sqlite3.Connection, sql: str, args: Sequence[Any]) -> list[Any]:
    return conn.execute(sql, args).fetchall()


def _nothing() -> None:
    """A call that does nothing (``SqliteDriver.settle`` queues it)."""


@contextmanager
def _rolled_back_on_failure(conn: sqlite3.Connection, phase: Phase) -> Iterator[None]:
    """Roll the open transaction back when the block fails before its COMMIT: still on
    the connection's thread, so a transaction never outlives its call."""
    try:
        yield
    except BaseException:
        if phase.name == "body" and conn.in_transaction:
            with suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
        raise


def _commit(conn: sqlite3.Connection, phase: Phase) -> None:
    phase.name = "commit"
    conn.execute("COMMIT")
    phase.name = "done"


def _run_steps(conn: sqlite3.Connection, program: Program[T]) -> T | Rollback[T]:
    """Run a program's statements on ``conn``; return what it returned."""
    memo: Memo = {}
    running = _Running(program)
    for kind, stmt, params in running:
        if kind == FETCH:
            running.rows = conn.execute(stmt.sql, stmt.args(params, memo)).fetchall()
        elif kind == EXECUTE:
            conn.execute(stmt.sql, stmt.args(params, memo))
        else:
            execute_many(conn, stmt.sql, stmt.args_many(params, memo))
    return running.value  # type: ignore[return-value]


MAX_ROWS = 32
"""Rows of one multi-row INSERT at most (see ``execute_many``). SQLite compiles a
multi-row INSERT once per connection, at a cost that grows faster than its rows: a
statement of 64 message rows took about 0.7 ms to prepare (a whole 100-message write's
worth), one of 32 about 0.1 ms, and per row both insert at the same speed."""

_VALUES = re.compile(r"\bVALUES (\((?:\?, )*\?\))")
# Bound parameters of one statement at most: SQLite's default limit (999 before 3.32).
_MAX_VARIABLES = 32766 if sqlite3.sqlite_version_info >= (3, 32) else 999


def execute_many(conn: sqlite3.Connection, sql: str, rows: Sequence[Sequence[Any]]) -> None:
    """Run ``sql`` once per row of arguments, as ``executemany`` does; but an INSERT of
    one ``VALUES`` group whose only parameters are that group's runs as a few multi-row
    INSERTs instead (row counts that are powers of two, at most ``MAX_ROWS``), which
    insert the same rows in the same order.

    One statement of many rows inserts them faster than a statement per row (by a
    tenth or more for a batch of 100 messages). Other statements run as they are, and
    one row as one ``execute``.
    """
    if len(rows) == 1:
        conn.execute(sql, rows[0])
        return
    cap = _rows_per_statement(sql) if rows else 0
    if cap < 2:
        conn.executemany(sql, rows)
        return
    done = 0
    while done < len(rows):
        n = _power_of_two_below(min(cap, len(rows) - done) + 1)
        chunk = rows[done : done + n]
        if n == 1:
            conn.execute(sql, chunk[0])
        else:
            conn.execute(_multi_row(sql, n), [value for row in chunk for value in row])
        done += n


def _power_of_two_below(n: int) -> int:
    """The largest power of two under ``n`` (``n`` > 1)."""
    return 1 << ((n - 1).bit_length() - 1)


@lru_cache(maxsize=256)
def _values_group(sql: str) -> str | None:
    """The one ``VALUES (?, ...)`` group of an INSERT whose every parameter is in it;
    ``None`` for any other statement."""
    if not sql.lstrip().upper().startswith("INSERT"):
        return None
    found = _VALUES.findall(sql)
    if len(found) != 1:
        return None
    return found[0] if sql.count("?") == found[0].count("?") else None


@lru_cache(maxsize=256)
def _rows_per_statement(sql: str) -> int:
    """How many rows of ``sql`` one multi-row INSERT takes (a power of two up to
    ``MAX_ROWS``, under the parameter limit); 0 for a statement that is not such an
    INSERT (see ``_values_group``)."""
    group = _values_group(sql)
    if group is None:
        return 0
    fits = max(1, _MAX_VARIABLES // group.count("?"))
    return _power_of_two_below(min(MAX_ROWS, fits) + 1)


@lru_cache(maxsize=256)
def _multi_row(sql: str, rows: int) -> str:
    """``sql`` (see ``_values_group``) inserting ``rows`` rows of arguments at once."""
    group = _values_group(sql)
    assert group is not None
    return _VALUES.sub(lambda _: "VALUES " + ", ".join([group] * rows), sql, count=1)


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


def aiosqlite_one_trip() -> bool:
    """Whether the installed aiosqlite has what the one-trip program needs."""
    import aiosqlite

    return callable(getattr(aiosqlite.Connection, "_execute", None)) and isinstance(
        getattr(aiosqlite.Connection, "_conn", None), property
    )
