"""The asyncpg driver: one protocol call per statement; behind a transaction-mode
pooler, unnamed statements described once per connection."""

from __future__ import annotations

import asyncio
import weakref
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy.engine import Dialect

from .dberrors import READ_ONLY_SQLSTATE, mark_hot_standby
from .deadlines import ABANDON_PATIENCE
from .drivers import CompiledStatement, Driver, Memo
from .orphans import terminate_orphan

__all__ = [
    "PostgresDriver",
    "abandon",
    "cancel_requests",
    "close_without_waiting",
    "never_switch_jit",
    "terminate_without_waiting",
]


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

    async def abandon(self, conn: Any) -> None:
        await abandon(conn)

    async def settle(self, conn: Any) -> bool:
        # A statement cut off half way: the server may still be running it. Give the
        # connection up without waiting for the server (it may not be answering).
        await abandon(conn)
        return False

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


def cancel_requests(conn: Any) -> set[asyncio.Future[Any]]:
    """The cancel requests an asyncpg connection is sending for a statement cut off
    (asyncpg sends one on a new connection when the task awaiting a statement is
    cancelled, and keeps the task in its private ``_cancellations``); an empty set
    where that is missing (another asyncpg): the connection is then aborted at once
    and the server learns of the cancellation only when it meets the closed socket."""
    tasks: Any = getattr(conn, "_cancellations", None)
    if not isinstance(tasks, set):
        return set()
    return {t for t in tasks if isinstance(t, asyncio.Future) and not t.done()}


CANCEL_LINGER = 60.0
"""Seconds a cancel request not delivered when its connection is aborted may go on in
the background (for a server that is stopped, not gone)."""

_lingering: set[asyncio.Future[Any]] = set()
"""Cancel requests going on after their connection was aborted (held here: the loop
keeps only weak references to tasks)."""


def _detach(conn: Any, requests: set[asyncio.Future[Any]]) -> None:
    """Let ``requests`` go on after ``conn`` is aborted, up to ``CANCEL_LINGER``.

    asyncpg cancels a connection's cancel requests when it is terminated; one cut off
    while a pooler forwards it makes PgBouncer 1.18 exit ("bad client state"), dropping
    every client, and one never delivered leaves the server running the statement."""
    tasks: Any = getattr(conn, "_cancellations", None)
    if isinstance(tasks, set):
        tasks.difference_update(requests)
    for request in requests:
        _lingering.add(request)
        request.add_done_callback(_lingering.discard)
        asyncio.get_running_loop().call_later(CANCEL_LINGER, request.cancel)


async def abandon(conn: Any, patience: float = ABANDON_PATIENCE) -> None:
    """Give an asyncpg connection up without waiting for the server's goodbye: its
    cancel request (``cancel_requests``) gets ``patience`` seconds to reach the server
    (and goes on in the background after, ``_detach``), then the connection is aborted
    (``terminate()``, public). asyncpg's own ``close()`` would wait for the cancel
    request and, before 0.32, without a limit, as would SQLAlchemy's invalidation,
    which tries ``close()`` first (seconds on a server that does not answer)."""
    try:
        pending = cancel_requests(conn)
        if pending:
            await asyncio.wait(pending, timeout=patience)
            _detach(conn, {t for t in pending if not t.done()})
    finally:
        conn.terminate()


def close_without_waiting(dbapi_connection: Any, record: Any) -> None:
    """A pool event (``close``): end a connection the pool closes (at ``dispose()``,
    an overflow connection given back) with ``terminate()``, which sends the server its
    goodbye and aborts the socket, instead of asyncpg's ``close()``, which then waits
    for the server to close its end, without a limit: forever on a server that does
    not answer (``_storage.deadlines``)."""
    conn = getattr(dbapi_connection, "driver_connection", None)
    if conn is not None:
        _detach(conn, cancel_requests(conn))
        terminate_orphan(conn)  # terminate(), also once the connection's loop has closed


def terminate_without_waiting(dbapi_connection: Any) -> None:
    """The dialect's ``do_terminate`` for the engines the store makes: SQLAlchemy ends a
    connection it gives up (a failed or cancelled connect, an invalidation) by trying
    asyncpg's ``close()`` first, which before asyncpg 0.32 waits without a limit for a
    cancel request to be answered; this aborts it first (``close_without_waiting``)."""
    close_without_waiting(dbapi_connection, None)
    dbapi_connection.terminate()
