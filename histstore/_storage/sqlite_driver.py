"""The aiosqlite driver: a whole program in one trip to the connection's thread, or
none at all.

aiosqlite runs every call as a function on the connection's own thread; this driver
hands it the whole program, from ``BEGIN IMMEDIATE`` to ``COMMIT``, as one such
function (its private ``Connection._execute`` and ``_conn``). When they are missing (a
future aiosqlite), the program runs through aiosqlite's public calls instead: slower,
never broken (``aiosqlite_one_trip``).

A short call may instead run on the event loop's own thread (``inline``, chosen by the
caller): the trip to the connection's thread and back (two thread wake-ups and the GIL
handed over twice) costs more than a read of the newest messages by an index or a
small write without an fsync. It runs there with the connection's busy timeout at 0,
so it never sleeps on the loop: where a lock is taken (another process writes, a
reader meets a WAL being recovered) the call goes to the connection's thread after
all, before any statement of it ran. A connection made with ``check_same_thread`` on
(an engine the caller built) refuses such calls; it gets none after its first refusal.

The busy timeout is not set back after each such call (two statements more than a
short read itself): it stays 0 while calls on the loop follow each other, and is set
back before anything else runs on the connection, where that may wait: first thing in
a call on its thread or through aiosqlite's calls here, or as it goes back to
SQLAlchemy's pool (``restore_on_checkin``, a pool hook) for other work.
"""

from __future__ import annotations

import asyncio
import random
import sqlite3
import time
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
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
from .sqlite_inserts import execute_many

__all__ = ["SqliteDriver", "aiosqlite_one_trip", "restore_on_checkin"]

T = TypeVar("T")


class SqliteDriver(Driver):
    begin_sql = "BEGIN IMMEDIATE"  # see _engine: why writers take the lock up front

    def __init__(self, dialect: Dialect, one_trip: bool, busy_timeout_ms: int | None) -> None:
        super().__init__(dialect, None)
        self.one_trip = one_trip
        self.groups = self.reads_now = one_trip
        self.busy_timeout_ms = busy_timeout_ms
        """The busy timeout of the connections (0 while calls run on the loop's thread,
        see the module); ``None``: an in-memory connection, which never waits."""

    async def execute_sql(self, conn: Any, sql: str) -> None:
        await _patient(conn)
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
        if inline and (rows := self.read_now(conn, stmt, params, memo)) is not None:
            return rows
        args = stmt.args(params, memo)
        if self.one_trip:
            return await _on_thread(conn, _fetch_on_thread, conn._conn, stmt.sql, args)  # noqa: SLF001 - see run
        await _patient(conn)
        rows = await conn.execute_fetchall(stmt.sql, args)
        return rows  # type: ignore[no-any-return]

    async def execute(
        self, conn: Any, stmt: CompiledStatement, params: Any, many: bool, memo: Memo
    ) -> None:
        await _patient(conn)
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

    async def checkpoint(self, conn: Any, truncate: bool = False) -> tuple[int, int]:
        """Copy what the WAL holds into the database file as far as readers allow
        (``PASSIVE``: waits for no reader or writer, and blocks none); returns the
        WAL's pages and how many of them are copied. ``truncate``: ``TRUNCATE``
        instead, with a busy timeout of 0 for it, so that it gives up at once (the
        file keeps its size) when a reader or another process's writer is there."""
        await _patient(conn)
        if not truncate:
            rows = await conn.execute_fetchall("PRAGMA wal_checkpoint(PASSIVE)")
        else:
            await conn.execute_fetchall("PRAGMA busy_timeout = 0")
            try:
                rows = await conn.execute_fetchall("PRAGMA wal_checkpoint(TRUNCATE)")
            finally:
                await conn.execute_fetchall(f"PRAGMA busy_timeout = {self.busy_timeout_ms or 0:d}")
        _busy, pages, copied = rows[0]
        return int(pages), int(copied)

    async def run_group(
        self, conn: Any, programs: list[Program[Any]], phase: Phase, inline: bool = False
    ) -> list[tuple[bool, Any]]:
        """Run ``programs`` in one write transaction, each in a savepoint of its own (see
        ``_storage.sqlite_writer``; one program alone needs none): per program ``(True,
        value)``, or ``(False, what it raised)`` with its statements undone. A failure
        of the transaction itself raises (``phase`` says how far it got). ``inline``:
        on the event loop's thread when the write lock is free (see the module)."""
        if not self.one_trip:
            return [(True, await self.run(conn, programs[0], phase, begin=True, end=True))]
        if inline and (outcomes := self._write_on_loop(conn, programs, phase)) is not None:
            return outcomes
        return await _on_thread(
            conn,
            self._run_group_on_thread,
            conn._conn,  # noqa: SLF001 - see run
            programs,
            phase,
        )

    def _on_loop(self, conn: Any) -> sqlite3.Connection | None:
        """``conn``'s sqlite3 connection, to be used on this (the event loop's) thread, its
        busy timeout 0 (left so, see the module); ``None`` when it refuses calls from
        here. aiosqlite's thread is idle meanwhile: a lent connection's earlier calls
        have ended (``Executor``; a cancelled one's first, ``settle``)."""
        raw: sqlite3.Connection = conn._conn  # noqa: SLF001 - see run
        if conn in _IMPATIENT:  # one that refuses got no call here: never in both
            return raw
        if conn in _REFUSED_ON_LOOP:
            return None
        if (patience := self.busy_timeout_ms) is None:  # in memory: nothing to wait for
            return raw
        try:
            raw.execute("PRAGMA busy_timeout = 0")
        except sqlite3.ProgrammingError as exc:  # e.g. made in another thread, checked
            _given_up(conn, exc)
            return None
        _IMPATIENT[conn] = patience
        return raw

    def read_now(
        self,
        conn: Any,
        stmt: CompiledStatement,
        params: Mapping[str, Any],
        memo: Memo | None = None,
    ) -> list[Any] | None:
        """The rows read on this thread; ``None`` when that was not possible (no one-trip
        calls, refused, or a lock would have to be waited for): nothing was read."""
        raw = None if conn is None or not self.one_trip else self._on_loop(conn)
        if raw is None:
            return None
        try:
            return raw.execute(stmt.sql, stmt.args(params, memo)).fetchall()
        except (sqlite3.OperationalError, sqlite3.ProgrammingError) as exc:
            if _given_up(conn, exc):
                return None
            raise

    def _write_on_loop(
        self, conn: Any, programs: list[Program[Any]], phase: Phase
    ) -> list[tuple[bool, Any]] | None:
        """``run_group``'s transaction on this thread; ``None`` when the write lock is not
        free (another process writes) or the connection refuses, before any statement
        of the programs ran. Once the lock is held nothing waits: in WAL mode the
        transaction's statements and its COMMIT take no other lock."""
        raw = self._on_loop(conn)
        if raw is None:
            return None
        try:
            raw.execute("BEGIN IMMEDIATE")
        except (sqlite3.OperationalError, sqlite3.ProgrammingError) as exc:
            if _given_up(conn, exc):
                return None
            raise
        return _written(raw, programs, phase)

    def _run_on_thread(
        self,
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
            _take_write_lock(conn, self.busy_timeout_ms)
        return _transaction(conn, program, phase, end)

    def _run_group_on_thread(
        self, conn: sqlite3.Connection, programs: list[Program[Any]], phase: Phase
    ) -> list[tuple[bool, Any]]:
        _take_write_lock(conn, self.busy_timeout_ms)
        return _written(conn, programs, phase)


def _transaction(
    conn: sqlite3.Connection, program: Program[T], phase: Phase, end: bool
) -> T | Rollback[T]:
    """``program``'s steps in the transaction begun on ``conn``; with ``end``, then its
    COMMIT (or ROLLBACK, for a ``Rollback``). Rolled back on failure."""
    with _rolled_back_on_failure(conn, phase):
        value = _run_steps(conn, program)
        if end and isinstance(value, Rollback):
            conn.execute("ROLLBACK")
        elif end:
            _commit(conn, phase)
    return value


def _written(
    conn: sqlite3.Connection, programs: list[Program[Any]], phase: Phase
) -> list[tuple[bool, Any]]:
    """``SqliteDriver.run_group``'s transaction, its write lock taken."""
    if len(programs) == 1:
        return [(True, _transaction(conn, programs[0], phase, end=True))]
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
    ``SqliteDriver.run``), after its busy timeout is set back when a call on the loop
    left it at 0. The value comes back in a box that is emptied here: aiosqlite's
    thread holds what its last call returned until its next call, and a value may be a
    whole conversation."""
    patience = _IMPATIENT.pop(conn, None)
    raw = None if patience is None else conn._conn  # noqa: SLF001 - see above
    box: list[T] = await conn._execute(_boxed, raw, patience, fn, *args)  # noqa: SLF001
    return box.pop()


async def _patient(conn: Any) -> None:
    """Set ``conn``'s busy timeout back when a call on the loop left it at 0, before a
    call through aiosqlite's own methods."""
    patience = _IMPATIENT.pop(conn, None)
    if patience is not None:
        await conn.execute(f"PRAGMA busy_timeout = {patience:d}")


def restore_on_checkin(dbapi_connection: Any, _record: Any) -> None:
    """A pool ``checkin`` hook: a connection goes back to SQLAlchemy's pool with its busy
    timeout set back (it is idle, so this runs here, on the returning thread). A closed
    one is left as it is."""
    conn = getattr(dbapi_connection, "driver_connection", None)
    if conn is None or (patience := _IMPATIENT.pop(conn, None)) is None:
        return
    with suppress(ValueError, sqlite3.ProgrammingError):  # closed meanwhile
        conn._conn.execute(f"PRAGMA busy_timeout = {patience:d}")  # noqa: SLF001


_IMPATIENT: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
"""aiosqlite connections whose busy timeout a call on the loop's thread left at 0, with
the timeout to set back before anything else runs on them (see the module)."""

_REFUSED_ON_LOOP: weakref.WeakSet[Any] = weakref.WeakSet()
"""aiosqlite connections whose sqlite3 connection refused a call from another thread
than its own (made with ``check_same_thread`` on): they run every call on their thread."""


def _given_up(conn: Any, exc: sqlite3.Error) -> bool:
    """Whether a call on the loop's thread, failing with ``exc`` at its first statement,
    is to run on the connection's thread instead: SQLite was busy, or the connection
    refused (when it refuses calls from other threads, it gets none again; any other
    refusal, such as a closed connection, the thread then reports)."""
    if isinstance(exc, sqlite3.ProgrammingError):
        if "thread" in str(exc):
            _REFUSED_ON_LOOP.add(conn)
        return True
    return isinstance(exc, sqlite3.OperationalError) and _is_busy(exc)


def _is_busy(exc: sqlite3.OperationalError) -> bool:
    """Whether SQLite answered SQLITE_BUSY (or an extended code of it, its low byte);
    Python 3.10 has no codes on its exceptions, only SQLite's message."""
    code = getattr(exc, "sqlite_errorcode", None)
    return "locked" in str(exc) if code is None else code & 0xFF == _SQLITE_BUSY


def _boxed(
    conn: sqlite3.Connection | None, patience: int | None, fn: Callable[..., T], *args: Any
) -> list[T]:
    if conn is not None:
        conn.execute(f"PRAGMA busy_timeout = {patience:d}")
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


_SQLITE_BUSY = 5
_POLL_MAX = 0.004  # seconds between tries for the write lock, at most


def _take_write_lock(conn: sqlite3.Connection, patience: int | None) -> None:
    """``BEGIN IMMEDIATE``, trying again every few milliseconds while another process
    holds the database's write lock, until ``patience``, the connection's busy timeout
    (ms; ``None`` in memory, where nothing else holds it), has passed.

    SQLite's own busy handler sleeps ever longer between tries (up to 100 ms), so a
    writer of another process could sleep on long after the lock came free; polling
    with a short, jittered pause hands the lock over within a few milliseconds. The
    busy timeout is set back for the transaction's other statements. Runs on the
    connection's own thread, where sleeping blocks nothing else.
    """
    if patience is None or patience <= 0:
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
                if not _is_busy(exc) or time.monotonic() >= deadline:
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
