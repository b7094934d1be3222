"""Connections: the store reuses the ones it used, never starves its pool, and gives
every one back when it closes (also to an engine it borrowed)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
import reach
from conftest import Backend
from helpers import agent_turns, connections_in_use, empty_pg_database, new_id, user_msgs
from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from waiting import eventually

import histstore
from histstore._storage.append_groups import IN_FLIGHT
from histstore._storage.connections import ConnectionCache
from histstore._storage.engine import resolve_target
from histstore._storage.lending import READ_SLOTS, ReadSlots


def _engine(backend: Backend, **pool: Any) -> AsyncEngine:
    url = resolve_target(backend.url)
    assert not isinstance(url, AsyncEngine)
    return create_async_engine(url, **pool)


def _count_connects(engine: AsyncEngine) -> list[int]:
    opened = [0]

    def on_connect(*_: object) -> None:
        opened[0] += 1

    event.listen(engine.sync_engine, "connect", on_connect)
    return opened


@pytest.fixture
async def borrowed(shared_backend: Backend) -> AsyncIterator[AsyncEngine]:
    """A caller's engine with a small pool (2 connections, no overflow)."""
    engine = _engine(shared_backend, pool_size=2, max_overflow=0, pool_timeout=10)
    async with histstore.connect(shared_backend.url, migrate=True):
        pass
    yield engine
    await engine.dispose()


async def test_calls_reuse_connections(store: histstore.Store, cid: str) -> None:
    opened = _count_connects(store.engine)
    for i in range(30):
        await store.write(cid, user_msgs(2, f"t{i}"))
        await store.read(cid, limit=20)
        await store.count(cid)
    assert opened[0] <= 1
    assert connections_in_use(store) == 0
    assert await store.count(cid) == 60


async def test_close_gives_every_connection_back_to_a_borrowed_engine(
    borrowed: AsyncEngine,
) -> None:
    store = await histstore.connect(borrowed)
    view = store.scoped("alice")
    ids = [new_id() for _ in range(8)]
    await asyncio.gather(
        *(store.write(c, user_msgs(2)) for c in ids),
        *(view.write(new_id(), user_msgs(1)) for _ in range(8)),
        *(store.read(c, limit=5) for c in ids),
    )
    await view.close()  # a view keeps nothing of its own
    await store.close()
    assert borrowed.pool.checkedout() == 0  # type: ignore[attr-defined]
    async with borrowed.connect() as conn:  # the caller's engine still works
        assert (await conn.exec_driver_sql("SELECT 1")).scalar() == 1


async def test_kept_connections_leave_the_pool_to_other_calls(borrowed: AsyncEngine) -> None:
    """With a pool of 2, reads that keep connections never block the calls that run
    through SQLAlchemy (state, listing) or each other."""
    async with histstore.connect(borrowed) as store:
        ids = [new_id() for _ in range(6)]
        for c in ids:
            await store.write(c, user_msgs(2))
        for _round in range(3):
            await asyncio.wait_for(
                asyncio.gather(
                    *(store.read(c, limit=2) for c in ids),
                    *(store.merge_metadata(c, {"k": 1}) for c in ids),
                    *(store.load(c) for c in ids),
                    store.conversations(),
                ),
                timeout=5,
            )
        assert connections_in_use(store) == 0
        assert store.diagnostics().idle_connections <= 1


async def test_an_in_memory_store_keeps_no_connection_aside() -> None:
    async with histstore.connect(":memory:") as store:
        c = new_id()
        await store.write(c, user_msgs(3))
        assert (await store.read(c, limit=1))[0].content == "m-2"
        assert store.diagnostics().idle_connections == 0
        await store.merge_metadata(c, {"k": 1})  # the only connection is free for this
        assert (await store.load(c)).metadata == {"k": 1}


async def test_cache_keeps_up_to_its_limit_and_returns_stale_connections(
    borrowed: AsyncEngine,
) -> None:
    cache = ConnectionCache(borrowed, limit=1, max_idle=0.05)
    pool: Any = borrowed.pool
    a, b = await cache.get(), await cache.get()
    assert pool.checkedout() == 2
    await cache.put(a)
    await cache.put(b)  # over the limit: back to the pool
    assert (cache.idle, pool.checkedout()) == (1, 1)
    assert await cache.get() is a  # the newest kept one
    await cache.put(a)
    await asyncio.sleep(0.1)
    c = await cache.get()  # a went stale: given back, c comes from the pool
    assert cache.idle == 0
    assert pool.checkedout() == 1
    await cache.put(c)
    await cache.close()
    assert (cache.idle, pool.checkedout()) == (0, 0)
    d = await cache.get()
    await cache.put(d)  # after close nothing is kept
    assert (cache.idle, pool.checkedout()) == (0, 0)


async def test_idle_connections_go_back_without_a_further_call(borrowed: AsyncEngine) -> None:
    """A burst leaves connections kept for the next calls; they go back to the pool once
    idle, even when no call comes to notice."""
    async with histstore.connect(borrowed) as store:
        reach.shorten_idle_time(store, 0.1)
        c = new_id()
        await asyncio.gather(*(store.read(c) for _ in range(4)), store.write(c, user_msgs(1)))
        now = store.diagnostics()  # (on SQLite the writer keeps one: the cache, none)
        assert now.idle_connections + now.writer_connection >= 1
        pool = borrowed.pool
        await eventually(  # no call meanwhile
            lambda: (
                store.diagnostics().idle_connections == 0
                and pool.checkedout() == store.diagnostics().writer_connection
            ),  # type: ignore[attr-defined]
            "the kept connections back in the pool",
        )
        assert await store.count(c) == 1  # and the store goes on


async def test_concurrent_reads_of_an_sqlite_file_share_a_few_connections(
    backend: Backend,
) -> None:
    """Sixteen tasks reading at once all get their rows; on an SQLite file at most
    ``READ_SLOTS`` connections serve them (each connection is a thread of its own, and
    more threads than cores only take turns at the GIL)."""
    async with backend.connect() as store:
        c = new_id()
        await store.write(c, user_msgs(30))
        opened = _count_connects(store.engine)
        before = opened[0]
        reads = await asyncio.gather(*(store.read(c, limit=20) for _ in range(16)))
        assert all(len(r) == 20 for r in reads)
        if backend.name == "sqlite-file":
            assert opened[0] - before <= READ_SLOTS


async def test_a_read_that_would_wait_for_a_slot_is_not_read_at_once() -> None:
    """``ReadSlots.free`` (the short reads' way past the semaphore) is true only while a
    read entering would neither wait nor pass one queued before it."""
    slots = ReadSlots(1)
    assert slots.free()
    holder_in, holder_go = asyncio.Event(), asyncio.Event()

    async def hold() -> None:
        async with slots:
            holder_in.set()
            await holder_go.wait()

    holder = asyncio.ensure_future(hold())
    await holder_in.wait()
    assert not slots.free()
    queued = asyncio.ensure_future(slots.__aenter__())
    await asyncio.sleep(0)
    holder_go.set()
    await holder
    assert not slots.free()  # the slot is free, but the queued read goes first
    await queued
    assert not slots.free()
    await slots.__aexit__(None, None, None)
    assert slots.free()
    cancelled = asyncio.ensure_future(slots.__aenter__())
    async with slots:
        await asyncio.sleep(0)
        cancelled.cancel()
        with pytest.raises(asyncio.CancelledError):
            await cancelled
    assert slots.free()  # a waiter cancelled in the queue leaves it
    assert ReadSlots(None).free()


async def test_postgres_appends_keep_a_few_sessions_of_their_own(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Concurrent turns' appends run on at most ``IN_FLIGHT`` server sessions, which
    then plan the write statements once each; the reads beside them use other sessions."""
    async with empty_pg_database() as url, histstore.connect(url, migrate=True) as store:
        driver = reach.driver(store)  # instrumented below
        run, fetch = driver.run, driver.fetch
        writers: set[int] = set()
        readers: set[int] = set()

        async def recording_run(conn: Any, *args: Any, begin: bool, end: bool) -> Any:
            if not begin:  # a statement that is its own transaction: an append
                writers.add(conn.get_server_pid())
            return await run(conn, *args, begin=begin, end=end)

        async def recording_fetch(conn: Any, *args: Any, **kwargs: Any) -> Any:
            readers.add(conn.get_server_pid())
            return await fetch(conn, *args, **kwargs)

        monkeypatch.setattr(driver, "run", recording_run)
        monkeypatch.setattr(driver, "fetch", recording_fetch)
        await agent_turns(store, tasks=16, turns=6)
        assert 1 <= len(writers) <= IN_FLIGHT
        assert len(readers - writers) > 1
