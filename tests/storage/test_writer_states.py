"""The SQLite writer's states through the public API (docs/architecture.md has their
tables): a close while writes queue, a queued write cancelled, a transaction that
fails half way, and Core writes on the writer's one write connection. Each ends with
the writer where its table says it must be; an impossible move would have raised
(``states.InvalidTransition``) instead of hanging or leaking a connection."""

from __future__ import annotations

import asyncio

import pytest
import reach
from conftest import Backend
from helpers import new_id, user_msgs
from waiting import eventually, queued

import histstore
from histstore.items import ItemStore, ItemWrite


def _file(store: histstore.Store) -> bool:
    """Whether the store has a writer of its own (an SQLite file)."""
    return store.diagnostics().writer is not None


def _writer(store: histstore.Store) -> tuple[str | None, str | None, bool]:
    now = store.diagnostics()
    return now.writer, now.writer_lifecycle, now.writer_connection


async def test_a_close_while_writes_queue_runs_them_and_ends_with_nothing_held(
    backend: Backend,
) -> None:
    store = await backend.connect()
    c = new_id()
    release = asyncio.Event()

    async def hold() -> None:
        async with reach.holding_the_write_turn(store):
            await release.wait()

    holder = asyncio.ensure_future(hold())
    file = _file(store)
    if file:
        await eventually(lambda: store.diagnostics().writer == "running", "the turn held")
    writes = [asyncio.ensure_future(store.write(c, user_msgs(1))) for _ in range(4)]
    if file:
        await queued(store, writes)
        closing = asyncio.ensure_future(store.close())
        # Closing: the queued writes and the held turn still run; nothing is given back.
        await eventually(lambda: store.diagnostics().writer_lifecycle == "closing", "closing")
        assert _writer(store) == ("running", "closing", True)
        assert store.diagnostics().queued == 4
        assert not closing.done()
        release.set()
    else:  # no queue to close over: the writes end first
        release.set()
        await asyncio.gather(holder, *writes)
        assert await store.count(c) == 4
        closing = asyncio.ensure_future(store.close())
    await asyncio.gather(holder, *writes, closing)
    assert all(w.result().accepted == 1 for w in writes)
    assert _writer(store) == (("idle", "closed", False) if file else (None, None, False))
    with pytest.raises(histstore.HistStoreError, match="closed"):
        await store.write(c, user_msgs(1))
    if backend.shared:  # (a store in memory takes its database with it)
        async with backend.connect() as again:
            assert await again.count(c) == 4


async def test_a_queued_write_cancelled_leaves_the_queue_with_nothing_done(
    backend: Backend,
) -> None:
    async with backend.connect() as store:
        c = new_id()
        await store.write(c, user_msgs(1))
        file = _file(store)
        async with reach.holding_the_write_turn(store):
            if not file:
                return  # no queue to leave: each write runs as it comes
            stays = asyncio.ensure_future(store.write(c, user_msgs(1, "stays")))
            goes = asyncio.ensure_future(store.write(c, user_msgs(1, "goes")))
            await queued(store, [stays, goes])
            goes.cancel()
            with pytest.raises(asyncio.CancelledError):
                await goes
            assert store.diagnostics().queued == 1
        await stays
        assert [m.content for m in await store.read(c)] == ["m-0", "stays-0"]
        assert _writer(store) == ("idle", "open", True)


async def test_a_transaction_failing_half_way_gives_the_connection_back_settled(
    backend: Backend,
) -> None:
    async with backend.connect() as store:
        c = new_id()
        await store.write(c, user_msgs(1))
        file = _file(store)
        held: list[tuple[str | None, str | None, bool]] = []

        async def fail_half_way() -> None:
            async with reach.holding_the_write_turn(store):
                held.append(_writer(store))
                raise RuntimeError("half way")

        with pytest.raises(RuntimeError, match="half way"):
            await fail_half_way()
        assert held == [("running", "open", True) if file else (None, None, False)]
        if file:
            # Given back (the lending rolled it back and settled it), not kept.
            assert _writer(store) == ("idle", "open", False)
        await store.write(c, user_msgs(1, "after"))  # opened again by the next job
        assert await store.count(c) == 2
        assert _writer(store)[2] is file


async def test_core_writes_run_on_the_writers_one_connection(backend: Backend) -> None:
    async with backend.connect() as store:
        items = ItemStore(store)
        soon = ItemWrite(("ns",), "k", {"v": 1}, ttl=0.0001)  # 6 ms
        await items.write([soon])
        assert await eventually(items.sweep, "the item swept once expired") == 1
        if not _file(store):
            return  # no writer: Core writes take a connection of the pool
        assert _writer(store) == ("idle", "open", True)
        await items.write([soon])
        # Made read-only, the writer's connection refuses the sweep: it ran there, not
        # on another connection of the pool.
        async with reach.write_connection(store) as conn:
            await conn.execute("PRAGMA query_only = ON")
        with pytest.raises(histstore.HistStoreError, match="readonly"):
            await items.sweep()
        assert _writer(store) == ("idle", "open", False)  # given back after the failure
