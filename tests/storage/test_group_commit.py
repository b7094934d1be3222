"""Concurrent writers of one store: each gets exactly its own outcome, whether the store
runs their programs in one transaction (SQLite's group commit) or in one each.

The writers queue behind a write that waits for a lock another connection holds (the
database's write lock on SQLite, the conversation's row on Postgres), so on SQLite they
run as one group once it is released; every assertion holds either way.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
from faults import Faults
from helpers import new_id, user_msgs
from sqlalchemy import event, select
from waiting import eventually, queued, settled, writing

import histstore
from histstore import ConflictError, WriteError, WriteOutcome
from histstore._storage import schema as _schema


@asynccontextmanager
async def writers_held(backend: Any, conversation: str) -> AsyncIterator[None]:
    """Hold, from another connection, what a write to ``conversation`` waits for."""
    if backend.name == "sqlite-file":
        other = sqlite3.connect(backend.url, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")
        try:
            yield
        finally:
            other.rollback()
            other.close()
        return
    async with backend.connect() as store, store.engine.begin() as conn:
        conv = _schema.conversations
        await conn.execute(select(conv.c.id).where(conv.c.id == conversation).with_for_update())
        yield


async def queued_behind_a_waiting_write(
    store: histstore.Store,
    backend: Any,
    calls: Callable[[], list[Any]],
    then: Callable[[], None] = lambda: None,
) -> list[Any]:
    """Start the coroutines ``calls()`` makes while a first write waits for a held lock
    (``then()`` runs just before), release it once they are all started, and return
    their results (exceptions included), after the first write's (a gap, so a
    ``ConflictError`` that commits nothing)."""
    blocker = new_id()
    await store.write(blocker, user_msgs(1, "b"))
    then()
    async with writers_held(backend, blocker):
        first = asyncio.ensure_future(store.write(blocker, user_msgs(1, "x"), at=5))
        await writing(store, first, backend)
        tasks = [asyncio.ensure_future(c) for c in calls()]
        await queued(store, tasks)
        assert not first.done()
    with pytest.raises(ConflictError):
        await first
    return await asyncio.gather(*tasks, return_exceptions=True)


async def test_writers_queued_together_each_get_their_own_outcome(shared_backend: Any) -> None:
    async with shared_backend.connect() as store:
        a, b = new_id(), new_id()
        await store.write(a, user_msgs(2, "base"))
        await store.write(b, user_msgs(1, "k"), idempotency_key="used")

        def calls() -> list[Any]:
            return [
                *(store.write(a, user_msgs(1, f"n{i}")) for i in range(6)),
                store.write(a, user_msgs(1, "gap"), at=50),  # a gap: conflict
                store.write(b, user_msgs(2, "other"), idempotency_key="used"),  # conflict
                store.write(b, user_msgs(1, "k"), idempotency_key="used"),  # confirmed
                store.merge_metadata(b, {"m": 1}),
            ]

        got = await queued_behind_a_waiting_write(store, shared_backend, calls)

        appended = got[:6]
        assert all(isinstance(o, WriteOutcome) for o in appended), got
        assert sorted(o.length for o in appended) == list(range(3, 9))
        assert isinstance(got[6], ConflictError)
        assert isinstance(got[7], ConflictError)
        assert got[8] == WriteOutcome(1, False, 1)
        assert got[9] is None
        messages = await store.read(a)
        assert [m.position for m in messages] == list(range(8))
        assert sorted(m.content for m in messages[2:]) == [f"n{i}-0" for i in range(6)]
        for outcome in appended:  # each writer's length is where its own message ends
            assert messages[outcome.length - 1].content.startswith("n")
        assert [m.content for m in await store.read(b)] == ["k-0"]
        assert await store.metadata(b) == {"m": 1}


@pytest.mark.parametrize("mode", ["commit-then-fail", "rollback-then-fail"])
async def test_a_failed_commit_of_queued_writers_settles_each(
    shared_backend: Any, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    async with shared_backend.connect() as store:
        conversations = [new_id() for _ in range(6)]
        faults = Faults(monkeypatch)

        def fail_next_commit() -> None:
            faults.commit_mode = mode

        got = await queued_behind_a_waiting_write(
            store,
            shared_backend,
            lambda: [store.write(c, user_msgs(2, c)) for c in conversations],
            fail_next_commit,
        )
        faults.commit_mode = None
        assert faults.commits_failed == 1
        for c, outcome in zip(conversations, got, strict=True):
            stored = [m.content for m in await store.read(c)]
            if isinstance(outcome, WriteOutcome):
                assert (outcome.accepted, outcome.uncertain) == (2, False)
                assert stored == [f"{c}-0", f"{c}-1"]
            else:
                assert isinstance(outcome, WriteError), outcome
                assert (outcome.outcome.accepted, outcome.outcome.uncertain) == (0, False)
                assert stored == []
        failed = sum(isinstance(o, WriteError) for o in got)
        if mode == "commit-then-fail":
            assert failed == 0  # every writer found its batch stored
        elif shared_backend.name == "sqlite-file":
            assert failed == len(conversations)  # one transaction held them all
        else:
            assert failed == 1


async def test_a_queued_writer_cancelled_stores_all_or_nothing(shared_backend: Any) -> None:
    async with shared_backend.connect() as store:
        c, kept = new_id(), new_id()
        blocker = new_id()
        await store.write(blocker, user_msgs(1, "b"))
        async with writers_held(shared_backend, blocker):
            first = asyncio.ensure_future(store.write(blocker, user_msgs(1, "x"), at=5))
            await writing(store, first, shared_backend)
            cancelled = asyncio.ensure_future(store.write(c, user_msgs(3, "c")))
            other = asyncio.ensure_future(store.write(kept, user_msgs(1, "k")))
            await queued(store, [cancelled, other])
            cancelled.cancel()
            await eventually(cancelled.done, "the cancelled writer ended")
        with pytest.raises(ConflictError):
            await first
        # On Postgres nothing held it: it may have finished before the cancel.
        with contextlib.suppress(asyncio.CancelledError):
            await cancelled
        assert await other == WriteOutcome(1, False, 1)
        assert await store.count(c) in (0, 3)
        if shared_backend.name == "sqlite-file":
            assert cancelled.cancelled()
            assert await store.count(c) == 0  # it never started
        # The store goes on.
        assert await store.write(c, user_msgs(1, "after")) == WriteOutcome(
            1, False, await store.count(c)
        )


async def test_a_writer_cancelled_while_its_transaction_runs_sees_it_end_first(
    shared_backend: Any,
) -> None:
    sqlite = shared_backend.name == "sqlite-file"
    async with shared_backend.connect() as store:
        c = new_id()
        await store.write(c, user_msgs(1, "a"))
        opened: list[object] = []
        event.listen(store.engine.sync_engine, "connect", lambda *_: opened.append(1))
        async with writers_held(shared_backend, c):
            running = asyncio.ensure_future(store.write(c, user_msgs(3, "b")))
            await writing(store, running, shared_backend)
            running.cancel()
            if sqlite:
                # A window in which it must not end: its transaction still waits for the lock.
                await asyncio.sleep(0.05)
                assert not running.done()
        with pytest.raises(asyncio.CancelledError):
            await running
        whole = ["a-0", "b-0", "b-1", "b-2"]
        if sqlite:
            # It had begun: it ran to its end before the caller saw the cancel, and its
            # connection, left clean, is kept (not closed and opened again).
            assert [m.content for m in await store.read(c)] == whole
            assert not opened
        else:
            # One statement, its own transaction: cut off, its outcome is the server's.
            await settled(lambda: store.count(c), 4, within=2)
            assert [m.content for m in await store.read(c)] in (whole, whole[:1])
        # The store goes on, with the writer's connection and the others.
        before = await store.count(c)
        await asyncio.gather(*(store.write(c, user_msgs(1, f"n{i}")) for i in range(5)))
        assert await store.count(c) == before + 5
