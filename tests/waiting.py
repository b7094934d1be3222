"""Waiting for a state instead of sleeping for a while: each helper returns as soon as the
state holds and fails, saying what it waited for, when it does not by a deadline."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from typing import Any

import psycopg
from helpers import PG_ADMIN_URL
from sqlalchemy import make_url

POLL = 0.02
"""Seconds between two looks at a state that sends no signal (a database, a process)."""


async def eventually(check: Callable[[], Any], what: str, *, within: float = 10.0) -> Any:
    """``check()``'s first true value, looking every ``POLL`` seconds (``check`` may be a
    coroutine function); an ``AssertionError`` naming ``what`` after ``within`` seconds."""
    deadline = time.monotonic() + within
    while True:
        value = check()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {within}s: {what} (last: {value!r})")
        await asyncio.sleep(POLL)


async def clock_tick() -> datetime:
    """The wall clock's next reading: waits, yielding to the loop, until the clock the
    store stamps its rows with (aware UTC ``datetime.now``) has moved past its reading at
    the call. Every stamp taken before the call is older than the result, every stamp
    taken after it newer or equal: what ordering by time needs, without a guessed sleep."""
    start = datetime.now(timezone.utc)
    while (now := datetime.now(timezone.utc)) <= start:  # noqa: ASYNC110 - a clock sends no signal
        await asyncio.sleep(0)
    return now


def _lock_waiters(database: str) -> int:
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid)"
            " WHERE NOT l.granted AND a.datname = %s",
            (database,),
        ).fetchone()
    assert row is not None
    return int(row[0])


SQLITE_WINDOW = 0.3
"""How long a task must stay blocked on SQLite, where a waiting writer cannot be seen."""


async def blocked_on_lock(task: asyncio.Task[Any], backend: Any) -> None:
    """Return once ``task`` waits for a lock another transaction holds; fail if it ends.

    PostgreSQL: a session of the backend's database is seen waiting for a lock
    (``pg_locks``), and the task is still running. SQLite shows no waiter (a writer
    retries the file's lock from the store): the task must still be running after
    ``SQLITE_WINDOW`` seconds.
    """
    if backend.name.startswith("postgres"):
        database = make_url(backend.url).database
        assert database is not None

        async def waiting() -> bool:
            assert not task.done(), "the task ended instead of waiting for the lock"
            return await asyncio.to_thread(_lock_waiters, database) > 0

        await eventually(waiting, "a session waiting for a lock")
    else:
        await asyncio.wait({task}, timeout=SQLITE_WINDOW)
    assert not task.done(), "the task ended instead of waiting for the lock"


async def writing(store: Any, task: asyncio.Task[Any], backend: Any) -> None:
    """Return once ``task``'s write is under way behind a lock another connection holds.

    An SQLite file's store says so itself: its writer runs the task's program (alone,
    nothing else writes), which cannot end while the lock is held. Elsewhere, as
    ``blocked_on_lock``: Postgres shows the session waiting for the lock.
    """
    if store.diagnostics().writer is None:
        await blocked_on_lock(task, backend)
        return

    def running() -> bool:
        assert not task.done(), "the write ended instead of waiting for the lock"
        return bool(store.diagnostics().writer == "running")

    await eventually(running, "the writer running the write")


async def queued(store: Any, tasks: Sequence[asyncio.Future[Any]]) -> None:
    """Return once ``tasks``' writes wait for the SQLite writer's next group (its
    diagnostics count them); where there is no writer (Postgres runs each write as it
    comes, nothing held them), once they have ended."""
    if store.diagnostics().writer is None:
        await eventually(lambda: all(t.done() for t in tasks), "the writes ended")
        return
    n = len(tasks)
    await eventually(lambda: store.diagnostics().queued == n, f"{n} programs queued")


async def settled(get: Callable[[], Any], expected: Any, *, within: float = 5.0) -> Any:
    """``get()`` once it equals ``expected`` (looking every ``POLL`` seconds; ``get``
    may be a coroutine function), else its last value after ``within`` seconds: for
    a state that settles with no signal (a server's sessions, a file's size), to
    compare in the caller's own assertion."""
    deadline = time.monotonic() + within
    while True:
        value = get()
        if inspect.isawaitable(value):
            value = await value
        if value == expected or time.monotonic() > deadline:
            return value
        await asyncio.sleep(POLL)


def settled_now(get: Callable[[], Any], expected: Any, *, within: float = 5.0) -> Any:
    """``settled`` for code outside an event loop (it blocks the thread meanwhile)."""
    deadline = time.monotonic() + within
    while (value := get()) != expected and time.monotonic() < deadline:
        time.sleep(POLL)
    return value
