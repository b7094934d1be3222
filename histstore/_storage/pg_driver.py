"""The asyncpg driver: one protocol call per statement; behind a transaction-mode
pooler, unnamed statements described once per connection."""

from __future__ import annotations

import weakref
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy.engine import Dialect

from .dberrors import READ_ONLY_SQLSTATE, mark_hot_standby
from .drivers import CompiledStatement, Driver, Memo

__all__ = ["PostgresDriver", "never_switch_jit"]


class PostgresDriver(Driver):
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

        asyncpg's statement cache is off there (``_storage.engine.transaction_pooler_args``), so
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
        *,
        inline: bool = False,
    ) -> Sequence[Any]:
        args = stmt.args(params, memo)
        try:
            statement = await self._statement(conn, stmt.sql)
            if statement is not None:
                return await statement.fetch(*args)  # type: ignore[no-any-return]
            return await conn.fetch(stmt.sql, *args)  # type: ignore[no-any-return]
        except Exception as exc:
            _note_hot_standby(conn, exc)
            raise

    async def execute(
        self, conn: Any, stmt: CompiledStatement, params: Any, many: bool, memo: Memo
    ) -> None:
        rows = stmt.args_many(params, memo) if many else [stmt.args(params, memo)]
        try:
            statement = await self._statement(conn, stmt.sql)
            if len(rows) == 1:  # one execution, without executemany's pipeline
                if statement is not None:
                    await statement.fetch(*rows[0])
                else:
                    await conn.execute(stmt.sql, *rows[0])
            elif statement is not None:
                await statement.executemany(rows)
            else:
                await conn.executemany(stmt.sql, rows)
        except Exception as exc:
            _note_hot_standby(conn, exc)
            raise

    def in_transaction(self, conn: Any) -> bool:
        if conn.is_closed():
            raise ConnectionError("connection closed")
        return bool(conn.is_in_transaction())

    def closed(self, conn: Any) -> bool:
        # asyncpg reads its socket while idle, so it learns of a server's goodbye (a
        # shutdown, a restart, an idle timeout) before the connection is used again.
        return bool(conn.is_closed())


def _note_hot_standby(conn: Any, exc: BaseException) -> None:
    """Mark a read-only refusal (SQLSTATE 25006) met on a hot standby, which the server
    reports on the session (``in_hot_standby``, PostgreSQL 14 on; asyncpg's public
    ``get_settings()``), so that its ``DatabaseFailure`` says so (``dberrors``)."""
    if getattr(exc, "sqlstate", None) != READ_ONLY_SQLSTATE:
        return
    try:
        standby = getattr(conn.get_settings(), "in_hot_standby", None) == "on"
    except Exception:  # noqa: BLE001 - a closed connection, another driver: say nothing
        return
    if standby:
        mark_hot_standby(exc)


_UNNAMED_CACHE_SIZE = 256
"""Reusable unnamed statements kept per connection behind a pooler (least recently
used first out); histstore's statements are a fixed set well below it."""


def never_switch_jit(conn: Any) -> None:
    """Tell an asyncpg connection that the server has no JIT for it to switch off.

    asyncpg turns JIT off with a session-level setting while it looks up a type it meets
    for the first time, and on again with a later statement; behind a transaction-mode
    pooler the two may reach different server sessions (see
    ``_storage.engine.install_pooler_hooks``). This sets asyncpg's private ``_server_caps.jit``
    to false; where it is missing (another asyncpg), nothing is changed.
    """
    caps: Any = getattr(conn, "_server_caps", None)
    if getattr(caps, "jit", False) and callable(getattr(caps, "_replace", None)):
        conn._server_caps = caps._replace(jit=False)  # noqa: SLF001 - asyncpg's, see above
