"""Releasing the connections of a store whose event loop has closed.

A connection belongs to the loop it was opened on. asyncpg's can only be closed on that
loop: ``Connection.close()`` awaits the server there, and even ``terminate()``, which
sends the Terminate message and aborts the transport at once, leaves the socket's last
step to the loop (asyncio's transports close their socket in a callback scheduled with
``call_soon``, which a closed loop refuses). aiosqlite's connection runs on a thread of
its own and closes from any loop.

So, on a live loop: each asyncpg connection is terminated first (below, without its
loop), after which SQLAlchemy's own close or invalidation of it has nothing to await on
the dead loop; then the kept connections are invalidated (never given back to a pool
another loop may draw from) and an owned engine is disposed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.pool import Pool, PoolProxiedConnection
from sqlalchemy.util import greenlet_spawn

from .statements.kinds import is_sqlite

__all__ = ["release_orphaned", "terminate_orphan"]


def terminate_orphan(conn: Any) -> None:
    """Close an asyncpg connection (``conn``) whose event loop has closed. Never raises."""
    try:
        conn.terminate()
        return
    except RuntimeError:  # the transport's close was refused by its closed loop
        pass
    # asyncpg has sent Terminate and marked itself closed; the transport is half closed,
    # its socket open. Finish asyncio's own closing step (private: ``_transport`` of
    # asyncpg's connection, ``_call_connection_lost`` of asyncio's selector transports).
    # Where either is missing (another event loop implementation), the socket is left
    # to the garbage collector, which closes it.
    transport = getattr(conn, "_transport", None)
    finish = getattr(transport, "_call_connection_lost", None)
    if callable(finish):
        with contextlib.suppress(RuntimeError, OSError, AttributeError):
            finish(None)
    with contextlib.suppress(RuntimeError):
        conn.terminate()  # closed now: frees what asyncpg keeps for the connection


def _terminate_on_close(dbapi_connection: Any, _record: Any) -> None:
    """Pool ``close`` hook of a disposed orphaned engine: terminate before SQLAlchemy closes."""
    terminate_orphan(dbapi_connection.driver_connection)


async def release_orphaned(
    engine: AsyncEngine, kept: Sequence[PoolProxiedConnection], *, dispose: bool
) -> None:
    """Release a store's connections after its loop closed (call on a live loop).

    ``kept``: the connections the store held between calls (checked out of ``engine``'s
    pool); they are invalidated. ``dispose``: the store owns ``engine``, whose pooled
    connections (of the same dead loop) are closed with it.
    """
    pg = not is_sqlite(engine.dialect)
    for raw in kept:
        if pg:
            terminate_orphan(raw.driver_connection)
        await greenlet_spawn(raw.invalidate)
    if dispose:
        pool: Pool = engine.sync_engine.pool
        if pg and not event.contains(pool, "close", _terminate_on_close):
            event.listen(pool, "close", _terminate_on_close)
        await engine.dispose()
