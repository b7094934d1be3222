"""SQLite only: a store's writers queue for the file's one write lock in the event loop,
first come first served, instead of sleeping in SQLite's busy handler."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from pathlib import Path

import pytest
import reach
from helpers import new_id, user_msgs
from waiting import eventually

import histstore
from histstore import WriteError, WriteOutcome


def _waiting(store: histstore.Store) -> tuple[int, int]:
    """Turns (transactions, Core writes) and programs waiting in the writer's queue."""
    now = store.diagnostics()
    return now.waiting_for_turn, now.queued


async def test_writers_wait_their_turn_behind_a_long_transaction(tmp_path: Path) -> None:
    async with histstore.connect(tmp_path / "q.db", busy_timeout=5) as store:
        c = new_id()
        order: list[int] = []

        async def write(i: int) -> None:
            await store.write(c, [{"role": "user", "content": f"m{i}"}])
            order.append(i)

        async with reach.holding_the_write_turn(store):  # and SQLite's write lock
            tasks = []
            for i in range(20):
                tasks.append(asyncio.ensure_future(write(i)))
                await asyncio.sleep(0)  # each queues before the next arrives
            await eventually(lambda: _waiting(store) == (0, 20), "20 writers queued")
            assert order == []  # nobody got in, nobody failed
        await asyncio.gather(*tasks)
        assert order == list(range(20))  # first come, first served
        assert [m.content for m in await store.read(c)] == [f"m{i}" for i in range(20)]


async def test_waiting_longer_than_the_busy_timeout_fails_cleanly(tmp_path: Path) -> None:
    async with histstore.connect(tmp_path / "q.db", busy_timeout=0.2) as store:
        c = new_id()
        async with reach.holding_the_write_turn(store):
            with pytest.raises(WriteError, match="locked") as info:
                await store.write(c, user_msgs(1))
            assert info.value.outcome == WriteOutcome(0, False, None)
        assert await store.write(c, user_msgs(1)) == WriteOutcome(1, False, 1)


async def test_a_write_cancelled_while_waiting_is_not_written(tmp_path: Path) -> None:
    async with histstore.connect(tmp_path / "q.db", busy_timeout=5) as store:
        c = new_id()
        async with reach.holding_the_write_turn(store):
            task = asyncio.ensure_future(store.write(c, user_msgs(1)))
            await eventually(lambda: _waiting(store) == (0, 1), "one writer queued")
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        assert not await store.exists(c)
        await store.write(c, user_msgs(2))
        assert await store.count(c) == 2


def _hold_lock(path: Path, seconds: float, held: threading.Event) -> None:
    """Another process's writer, as SQLite sees it: its own connection holds the
    database's write lock for ``seconds``."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        held.set()
        time.sleep(seconds)
        conn.execute("COMMIT")
    finally:
        conn.close()


async def _while_held(path: Path, seconds: float) -> threading.Thread:
    held = threading.Event()
    thread = threading.Thread(target=_hold_lock, args=(path, seconds, held))
    thread.start()
    await asyncio.to_thread(held.wait)
    return thread


async def test_a_writer_waits_for_another_process_then_writes(tmp_path: Path) -> None:
    """Across processes the store polls for the lock (instead of SQLite's ever longer
    sleeps) and writes once it comes free; the busy timeout still bounds the wait."""
    path = tmp_path / "p.db"
    async with histstore.connect(path, busy_timeout=5) as store:
        c = new_id()
        await store.write(c, user_msgs(1))
        thread = await _while_held(path, 0.3)
        assert await store.write(c, user_msgs(2)) == WriteOutcome(2, False, 3)
        await asyncio.to_thread(thread.join)
        assert await store.count(c) == 3


async def test_waiting_longer_than_the_busy_timeout_for_another_process_fails(
    tmp_path: Path,
) -> None:
    path = tmp_path / "p.db"
    async with histstore.connect(path, busy_timeout=1.0) as store:
        c = new_id()
        await store.write(c, user_msgs(1))
        thread = await _while_held(path, 2.5)
        with pytest.raises(WriteError, match="locked") as info:
            await store.write(c, user_msgs(1))
        assert info.value.outcome == WriteOutcome(0, False, None)
        await asyncio.to_thread(thread.join)
        # The connection's busy timeout is whole again: a short hold is waited out.
        thread = await _while_held(path, 0.2)
        assert await store.write(c, user_msgs(1)) == WriteOutcome(1, False, 2)
        await asyncio.to_thread(thread.join)
        assert await store.count(c) == 2


async def test_writers_that_came_together_last_time_go_together_again(tmp_path: Path) -> None:
    """After a group of several, a writer that finds nobody writing does not run alone:
    the writers arriving in the same turn of the event loop join it, in one commit."""
    async with histstore.connect(tmp_path / "g.db", durability="process") as store:

        def sizes() -> list[int]:
            return list(store.diagnostics().group_sizes[before:])

        ids = [new_id() for _ in range(6)]
        before = len(store.diagnostics().group_sizes)
        await asyncio.gather(*(store.write(c, user_msgs(1)) for c in ids))
        assert sizes() == [1, 5]  # the first found nobody writing; the rest came together
        before += 2
        await asyncio.gather(*(store.write(c, user_msgs(1)) for c in ids))
        assert sizes() == [6]
        before += 1
        for c in ids:  # one writer at a time: a group of one, then each runs alone
            await store.write(c, user_msgs(1))
        assert sizes() == [1] * 6
        assert [await store.count(c) for c in ids] == [3] * 6
