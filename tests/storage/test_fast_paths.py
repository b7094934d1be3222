"""The fast paths that read private parts of aiosqlite, asyncpg and asyncio are taken
with the installed versions (docs/dependencies.md).

Each has a fallback that is correct but slower or leakier, and silent: a release of a
dependency that drops what a fast path reads fails these tests, not a benchmark.
"""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import pytest
import reach
from conftest import Backend
from helpers import user_msgs

import histstore
from histstore._storage import sqlite_driver as _sqlite_driver
from histstore._storage.orphans import terminate_orphan
from histstore._storage.pg_driver import PostgresDriver, never_switch_jit


def _spy(monkeypatch: pytest.MonkeyPatch, owner: Any, name: str) -> list[Any]:
    """Record what ``owner.name`` returns, calling through."""
    seen: list[Any] = []
    real = getattr(owner, name)

    def spied(*args: Any, **kwargs: Any) -> Any:
        value = real(*args, **kwargs)
        seen.append(value)
        return value

    monkeypatch.setattr(owner, name, spied)
    return seen


async def test_each_fast_path_of_the_backend_is_taken(
    backend: Backend, store: histstore.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    driver = reach.driver(store)
    if backend.name.startswith("sqlite"):
        # aiosqlite's ``Connection._execute`` and ``_conn``: a whole transaction in one
        # trip to the connection's thread, group commit, and calls on the loop's thread.
        assert _sqlite_driver.aiosqlite_one_trip()
        assert store.diagnostics().one_trip
        assert driver.groups
        on_loop = _spy(monkeypatch, _sqlite_driver.SqliteDriver, "read_now")
        trips = _spy(monkeypatch, _sqlite_driver, "_boxed")
        await asyncio.gather(*(store.write(f"c{i}", user_msgs(2)) for i in range(8)))
        for i in range(8):
            assert len(await store.read(f"c{i}", limit=2)) == 2
        assert trips, "no program ran in one trip to the connection's thread"
        assert any(rows is not None for rows in on_loop), "no read ran on the loop's thread"
        assert not _sqlite_driver._REFUSED_ON_LOOP
        return
    assert isinstance(driver, PostgresDriver)
    await store.write("c", user_msgs(2))
    assert len(await store.read("c")) == 2
    # Behind the pooler, unnamed statements are kept and reused (asyncpg's private
    # ``PreparedStatementState.prepared`` read as False); directly, nothing is to keep.
    assert driver.reuse_unnamed == (backend.name == "postgres-pgbouncer")
    if driver.reuse_unnamed:
        assert any(len(kept) for kept in driver._unnamed.values())


async def test_asyncpg_is_told_the_server_has_no_jit_to_switch(pg_url: str) -> None:
    """Behind a transaction-mode pooler (``_storage.engine.install_pooler_hooks``)."""
    conn = await asyncpg.connect(pg_url.replace("+asyncpg", ""))
    try:
        assert conn._server_caps.jit, "asyncpg no longer switches JIT: the hook is moot"
        never_switch_jit(conn)
        assert not conn._server_caps.jit
    finally:
        await conn.close()


def test_a_connection_of_a_closed_loop_is_closed_at_once(pg_url: str) -> None:
    """``terminate_orphan`` finishes asyncio's closing step itself (asyncpg's private
    ``_transport``, the transport's ``_call_connection_lost``); without them the socket
    would stay open until the garbage collector finds the connection."""
    loop = asyncio.new_event_loop()
    try:
        conn = loop.run_until_complete(asyncpg.connect(pg_url.replace("+asyncpg", "")))
        sock = conn._transport.get_extra_info("socket")
        assert sock.fileno() >= 0
    finally:
        loop.close()
    terminate_orphan(conn)
    assert conn.is_closed()
    assert sock.fileno() == -1
