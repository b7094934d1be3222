"""SQLite only: short calls run on the event loop's own thread, where that is safe.

A read of the newest messages, and one task's short writes on a store whose commits do
not fsync (``durability="process"``), skip the trip to the connection's thread; the
writes of concurrent tasks, writes that fsync, and connections that refuse other
threads keep it. Nothing ever waits for a lock on the loop's thread: a write that finds
the lock taken by another process waits for it on the connection's thread. The busy
timeout stays 0 between calls on the loop, and is whole again wherever a call may wait.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import reach
from helpers import agent_turns, new_id, user_msgs
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine
from waiting import eventually

import histstore
from histstore import WriteOutcome

pytestmark = pytest.mark.sqlite_file


def msgs(*contents: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": c} for c in contents]


class Statements:
    """The statements every new ``sqlite3`` connection runs, with the thread of each."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, str]] = []

    def on(self, verb: str) -> set[str]:
        """Where statements beginning with ``verb`` ran: "loop" and/or "thread"."""
        loop = threading.main_thread().ident
        return {
            "loop" if ident == loop else "thread"
            for ident, sql in self.seen
            if sql.lstrip().upper().startswith(verb)
        }

    def clear(self) -> None:
        self.seen.clear()


@pytest.fixture
def statements(monkeypatch: pytest.MonkeyPatch) -> Statements:
    seen = Statements()
    real = sqlite3.connect

    def connect(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        conn = real(*args, **kwargs)
        conn.set_trace_callback(lambda sql: seen.seen.append((threading.get_ident(), sql)))
        return conn

    monkeypatch.setattr(sqlite3, "connect", connect)
    return seen


async def test_one_task_reads_and_writes_on_the_loop_thread(
    tmp_path: Path, statements: Statements
) -> None:
    async with histstore.connect(tmp_path / "s.db", durability="process") as store:
        c = new_id()
        await store.write(c, msgs("m0", "m1"))  # a first writer: nobody wrote before it
        statements.clear()
        for i in range(1, 4):
            assert [m.content for m in await store.read(c, limit=2)][-1] == f"m{2 * i - 1}"
            outcome = await store.write(c, msgs(f"m{2 * i}", f"m{2 * i + 1}"))
            assert outcome == WriteOutcome(2, False, 2 * i + 2)
        assert await store.count(c) == 8
        assert statements.on("SELECT") == {"loop"}
        assert statements.on("INSERT INTO HISTSTORE_MESSAGES") == {"loop"}
        assert statements.on("COMMIT") == {"loop"}
        assert [m.content for m in await store.read(c)] == [f"m{i}" for i in range(8)]


async def test_writes_that_fsync_or_of_several_tasks_stay_on_the_thread(
    tmp_path: Path, statements: Statements
) -> None:
    async with histstore.connect(tmp_path / "f.db") as store:  # durability="full"
        c = new_id()
        for _ in range(3):
            await store.write(c, user_msgs(1))
        assert statements.on("INSERT INTO HISTSTORE_MESSAGES") == {"thread"}
        assert await store.read(c, limit=5) == await store.read(c)
    async with histstore.connect(tmp_path / "p.db", durability="process") as store:
        statements.clear()
        ids = await agent_turns(store, tasks=4, turns=5)
        # (A task left writing alone at the end may write on the loop: it wrote last.)
        assert "thread" in statements.on("INSERT INTO HISTSTORE_MESSAGES")
        assert statements.on("SELECT") == {"loop"}
        statements.clear()
        for c in ids:  # one after another, each from a task of its own
            await asyncio.ensure_future(store.write(c, user_msgs(1)))
        assert statements.on("INSERT INTO HISTSTORE_MESSAGES") == {"thread"}


async def test_large_reads_and_batches_stay_on_the_thread(
    tmp_path: Path, statements: Statements
) -> None:
    async with histstore.connect(tmp_path / "l.db", durability="process") as store:
        c = new_id()
        await store.write(c, user_msgs(1))
        statements.clear()
        await store.write(c, user_msgs(500))  # the same task again, but a large batch
        assert statements.on("INSERT INTO HISTSTORE_MESSAGES") == {"thread"}
        statements.clear()
        assert len(await store.read(c)) == 501  # no limit
        assert len(await store.read(c, limit=400)) == 400
        assert statements.on("SELECT") == {"thread"}


async def test_an_engine_that_checks_threads_runs_every_call_on_its_thread(
    tmp_path: Path, statements: Statements
) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'e.db'}"
    engine = create_async_engine(url, connect_args={"check_same_thread": True})
    try:
        async with histstore.connect(engine, durability="process", migrate=True) as store:
            c = new_id()
            for i in range(3):
                await store.read(c, limit=5)
                await store.write(c, msgs(f"m{i}"))
            assert [m.content for m in await store.read(c, limit=5)] == ["m0", "m1", "m2"]
        assert statements.on("INSERT INTO HISTSTORE_MESSAGES") == {"thread"}
        assert "loop" not in statements.on("SELECT")
    finally:
        await engine.dispose()


async def test_a_write_meeting_another_process_lock_waits_off_the_loop(
    tmp_path: Path, statements: Statements
) -> None:
    path = tmp_path / "w.db"
    async with histstore.connect(path, durability="process", busy_timeout=10) as store:
        c = new_id()
        locked, first_done = asyncio.Event(), asyncio.Event()

        async def writer() -> WriteOutcome:
            await store.write(c, msgs("m0"))
            first_done.set()
            await locked.wait()
            statements.clear()
            return await store.write(c, msgs("m1"))  # tries on the loop first

        task = asyncio.ensure_future(writer())
        await first_done.wait()
        other = sqlite3.connect(path, isolation_level=None)
        try:
            other.execute("BEGIN IMMEDIATE")  # another process's writer holds the lock
            locked.set()
            started = time.monotonic()
            await asyncio.sleep(0.3)
            assert time.monotonic() - started < 5  # the loop went on (busy timeout: 10 s)
            assert not task.done()
            assert [m.content for m in await store.read(c, limit=5)] == ["m0"]
            other.execute("COMMIT")
        finally:
            other.close()
        assert await task == WriteOutcome(1, False, 2)
        assert "loop" in statements.on("BEGIN IMMEDIATE")  # refused at once there
        assert statements.on("INSERT INTO HISTSTORE_MESSAGES") == {"thread"}
        # The loop's try left the connection's busy timeout as it was: a write that
        # must wait on the thread still waits instead of failing at once.
        other = sqlite3.connect(path, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")
        waiting = asyncio.ensure_future(store.write(new_id(), user_msgs(1)))
        await asyncio.sleep(0.2)
        assert not waiting.done()
        other.execute("COMMIT")
        other.close()
        assert await waiting == WriteOutcome(1, False, 1)
        assert [m.content for m in await store.read(c)] == ["m0", "m1"]


async def test_a_failed_write_on_the_loop_thread_leaves_nothing_behind(
    tmp_path: Path, statements: Statements
) -> None:
    async with histstore.connect(tmp_path / "x.db", durability="process") as store:
        c = new_id()
        await store.write(c, msgs("m0", "m1"))
        statements.clear()
        with pytest.raises(histstore.ConflictError):
            await store.write(c, msgs("other"), at=0)  # position 0 holds another message
        assert await store.write(c, msgs("m2")) == WriteOutcome(1, False, 3)
        assert statements.on("ROLLBACK") == {"loop"}
        assert [m.content for m in await store.read(c)] == ["m0", "m1", "m2"]


async def test_a_failed_read_on_the_loop_thread_is_typed_and_its_connection_kept(
    tmp_path: Path, statements: Statements
) -> None:
    async with histstore.connect(tmp_path / "f.db", durability="process") as store:
        c = new_id()
        await store.write(c, msgs("m0"))
        aborts = iter([1])  # the first statement after this is interrupted, no other
        async with reach.next_connection(store) as conn:
            await conn.set_progress_handler(lambda: next(aborts, 0), 1)
            reader = conn
        statements.clear()
        with pytest.raises(histstore.DatabaseFailure) as caught:
            await store.count(c)
        assert isinstance(caught.value.__cause__, sqlite3.OperationalError)
        assert await store.count(c) == 1
        assert statements.on("SELECT") == {"loop"}
        assert [m.content for m in await store.read(c, limit=5)] == ["m0"]
        async with reach.next_connection(store) as conn:
            assert conn is reader  # a statement's failure leaves the connection usable


async def test_writes_keep_the_thread_while_the_wal_has_grown_large(
    tmp_path: Path, statements: Statements
) -> None:
    """A commit may checkpoint by itself once the WAL is large (the background
    checkpoints fell behind): such a commit never runs on the loop's thread."""
    async with histstore.connect(tmp_path / "b.db", durability="process") as store:
        writer = reach.executor(store).writer
        assert writer is not None
        c = new_id()
        await store.write(c, msgs("m0"))
        # The WAL as a long run of commits without checkpoints left it.
        writer.checkpoints.pages = lambda: 10.0**6  # type: ignore[method-assign]
        assert store.diagnostics().wal_pages == 10.0**6
        statements.clear()
        await store.write(c, msgs("m1"))
        assert statements.on("INSERT INTO HISTSTORE_MESSAGES") == {"thread"}
        del writer.checkpoints.pages  # as after a checkpoint
        statements.clear()
        await store.write(c, msgs("m2"))
        assert statements.on("INSERT INTO HISTSTORE_MESSAGES") == {"loop"}
        assert [m.content for m in await store.read(c)] == ["m0", "m1", "m2"]


async def test_calls_on_the_loop_thread_leave_the_busy_timeout_at_0_until_one_may_wait(
    tmp_path: Path, statements: Statements
) -> None:
    async with histstore.connect(tmp_path / "t.db", durability="process", busy_timeout=5) as store:
        c = new_id()
        await store.write(c, msgs("m0", "m1"))
        async with reach.next_connection(store) as conn:
            reader = conn  # the connection the reads below take (the newest kept)
        statements.clear()
        for i in range(3):
            assert await store.count(c) == 2 + i
            assert await store.exists(c)
            newest = await store.read(c, limit=2)
            assert newest[0].content == ("m0", "m1", "x")[i]
            await store.write(c, msgs("x"))  # one task's write: on the loop too
        assert statements.on("SELECT") == {"loop"}
        assert statements.on("INSERT INTO HISTSTORE_MESSAGES") == {"loop"}
        assert statements.on("PRAGMA BUSY_TIMEOUT") == {"loop"}  # once per connection
        assert len([s for _, s in statements.seen if "busy_timeout" in s]) <= 2
        # A call on the connection's thread (a read that may wait) sets it back first.
        driver = reach.driver(store)
        statements.clear()
        async with reach.next_connection(store) as conn:
            assert conn is reader
            pragma = driver.compile(text("PRAGMA busy_timeout"))
            assert await driver.fetch(conn, pragma, {}) == [(5000,)]
        assert statements.on("PRAGMA BUSY_TIMEOUT = 5000") == {"thread"}
        # Back on the loop, then back to SQLAlchemy's pool: set back as it goes.
        assert await store.count(c) == 5
        reach.shorten_idle_time(store, 0.0)
        await eventually(lambda: store.diagnostics().idle_connections == 0, "connections back")
        async with reach.next_connection(store) as conn:
            assert conn is reader  # the pool's newest
            assert await conn.execute_fetchall("PRAGMA busy_timeout") == [(5000,)]
        assert [m.content for m in await store.read(c)] == ["m0", "m1", "x", "x", "x"]
