"""Switchable faults inside the database drivers, for tests of failures half way."""

from __future__ import annotations

import sqlite3
from collections.abc import Awaitable, Callable
from typing import Any

import aiosqlite
import asyncpg
import pytest

from histstore._storage import engine


def _verb(sql: object) -> str:
    return sql.strip().rstrip(";").strip().upper() if isinstance(sql, str) else ""


async def _nothing() -> None:
    return None


class Faults:
    """Switchable faults in the database drivers (aiosqlite and asyncpg) themselves.

    Patching the drivers, below SQLAlchemy, catches every way the store may reach the
    database (SQLAlchemy's execution layer or the driver directly). On SQLite the fault
    sits in the ``sqlite3`` connection that aiosqlite's thread uses (``_conn``), so it
    also catches a whole transaction run in one trip to that thread.
    """

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.commit_mode: str | None = None  # "commit-then-fail" or "rollback-then-fail"
        self.unreachable_after_commit = False
        self.unreachable = False
        self.commits_failed = 0
        self.fail_insert_into: str | None = None  # a table whose INSERTs fail
        # Postgres statements that are their own transaction (the append alone, and a
        # group's): a commit fault fires there, as a connection cut during them.
        self.own_transactions: tuple[str, ...] = ("WITH GROWN AS", "WITH BATCHES AS")
        self._setting_up: set[int] = set()  # connections being set up: no commit fault
        self._patch_aiosqlite(monkeypatch)
        self._patch_asyncpg(monkeypatch)
        self._patch_connection_setup(monkeypatch)

    def _insert_fails(self, verb: str) -> bool:
        table = self.fail_insert_into
        return table is not None and verb.startswith(f"INSERT INTO {table.upper()} ")

    def _take_commit_fault(self) -> str | None:
        mode, self.commit_mode = self.commit_mode, None  # fires once
        return mode

    def _patch_connection_setup(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """A commit fault is meant for a store's write: the transaction in which a new
        connection behind a pooler settles its session (``_storage.engine``) commits
        without it, whichever call opened that connection."""
        setup = engine._settle_pooled

        async def settle(conn: Any) -> None:
            self._setting_up.add(id(conn))
            try:
                await setup(conn)
            finally:
                self._setting_up.discard(id(conn))

        monkeypatch.setattr(engine, "_settle_pooled", settle)

    def _commit_failed(self, error: Exception) -> Exception:
        self.commits_failed += 1
        if self.unreachable_after_commit:
            self.unreachable = True
        return error

    async def _commit(
        self,
        really: Callable[[], Awaitable[Any]],
        undo: Callable[[], Awaitable[Any]],
        error: Exception,
    ) -> Any:
        mode = self._take_commit_fault()
        if mode is None:
            return await really()
        await (really() if mode == "commit-then-fail" else undo())
        raise self._commit_failed(error)

    def _patch_aiosqlite(self, monkeypatch: pytest.MonkeyPatch) -> None:
        faults = self
        real_conn: Any = aiosqlite.Connection._conn

        def statement(conn: sqlite3.Connection, verb: str, run: Callable[[], Any]) -> Any:
            error = sqlite3.OperationalError("simulated lost connection")
            if verb == "COMMIT":
                mode = faults._take_commit_fault()
                if mode is None:
                    return run()
                run() if mode == "commit-then-fail" else conn.rollback()
                raise faults._commit_failed(error)
            if faults._insert_fails(verb):
                raise sqlite3.OperationalError("injected fault")
            if faults.unreachable and verb not in ("ROLLBACK", "CLOSE"):
                raise error
            return run()

        class FaultyCursor:
            def __init__(self, conn: sqlite3.Connection, cursor: sqlite3.Cursor) -> None:
                object.__setattr__(self, "_conn", conn)
                object.__setattr__(self, "_cursor", cursor)

            def execute(self, sql: str, *args: Any) -> Any:
                statement(self._conn, _verb(sql), lambda: self._cursor.execute(sql, *args))
                return self

            def executemany(self, sql: str, *args: Any) -> Any:
                statement(self._conn, _verb(sql), lambda: self._cursor.executemany(sql, *args))
                return self

            def __getattr__(self, name: str) -> Any:
                return getattr(self._cursor, name)

            def __setattr__(self, name: str, value: Any) -> None:
                setattr(self._cursor, name, value)

            def __iter__(self) -> Any:
                return iter(self._cursor)

        class FaultyConnection:
            def __init__(self, conn: sqlite3.Connection) -> None:
                object.__setattr__(self, "_conn", conn)

            def execute(self, sql: str, *args: Any) -> Any:
                return statement(self._conn, _verb(sql), lambda: self._conn.execute(sql, *args))

            def executemany(self, sql: str, *args: Any) -> Any:
                run = lambda: self._conn.executemany(sql, *args)  # noqa: E731
                return statement(self._conn, _verb(sql), run)

            def commit(self) -> None:
                statement(self._conn, "COMMIT", self._conn.commit)

            def rollback(self) -> None:
                self._conn.rollback()

            def cursor(self, *args: Any) -> FaultyCursor:
                return FaultyCursor(self._conn, self._conn.cursor(*args))

            def __getattr__(self, name: str) -> Any:
                return getattr(self._conn, name)

            def __setattr__(self, name: str, value: Any) -> None:
                setattr(self._conn, name, value)

        def faulty_conn(conn: Any) -> Any:
            return FaultyConnection(real_conn.fget(conn))

        monkeypatch.setattr(aiosqlite.Connection, "_conn", property(faulty_conn))

    def _patch_asyncpg(self, monkeypatch: pytest.MonkeyPatch) -> None:
        def error() -> Exception:
            lost: Exception = asyncpg.exceptions.ConnectionDoesNotExistError("simulated lost")
            return lost

        orig_execute = asyncpg.connection.Connection.execute

        async def execute(conn: Any, query: str, *args: Any, **kwargs: Any) -> Any:
            if _verb(query) == "COMMIT" and id(conn) not in self._setting_up:
                return await self._commit(
                    lambda: orig_execute(conn, query, *args, **kwargs),
                    lambda: orig_execute(conn, "ROLLBACK;"),
                    error(),
                )
            if self.unreachable and _verb(query) != "ROLLBACK":
                raise error()
            if self._insert_fails(_verb(query)):
                raise asyncpg.exceptions.DataError("injected fault")
            return await orig_execute(conn, query, *args, **kwargs)

        monkeypatch.setattr(asyncpg.connection.Connection, "execute", execute)

        def guard(cls: Any, name: str) -> None:
            orig = getattr(cls, name)

            async def call(obj: Any, *args: Any, **kwargs: Any) -> Any:
                if self.unreachable:
                    raise error()
                # a prepared statement (pooler="transaction") carries its own query
                prepared = isinstance(obj, asyncpg.prepared_stmt.PreparedStatement)
                verb = _verb(obj.get_query() if prepared else args[0] if args else None)
                if self._insert_fails(verb):
                    raise asyncpg.exceptions.DataError("injected fault")
                if name == "fetch" and verb.startswith(self.own_transactions):
                    # The one-statement appends are their own transactions: a commit is
                    # the statement itself, so a lost commit is a connection cut there.
                    return await self._commit(lambda: orig(obj, *args, **kwargs), _nothing, error())
                return await orig(obj, *args, **kwargs)

            monkeypatch.setattr(cls, name, call)

        for name in ("executemany", "fetch", "fetchrow", "fetchval", "prepare"):
            guard(asyncpg.connection.Connection, name)
        for name in ("executemany", "fetch", "fetchrow", "fetchval"):
            guard(asyncpg.prepared_stmt.PreparedStatement, name)
