"""Every call can be given up within a bound (SPEC 7 and 14; issues 38.2 and 46.2).

Real servers only: a throwaway cluster whose processes are all stopped (SIGSTOP, as a
hung host or a black-holed network path looks to a client) and always continued, and
the same cluster stalling every COMMIT in a wait for a synchronous standby that does not
exist. A call cancelled by its caller, or given up at its ``command_timeout``, returns
within ``GIVE_UP_BOUND`` (plus a margin for a loaded machine); a write given up while
committing is reported as uncertain, with its key, and writing it again with that key
stores it once.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from typing import Any

import asyncpg
import pytest
from conftest import running_pgbouncer
from helpers import new_id
from pg_cluster import PASSWORD, Cluster, throwaway_cluster
from waiting import eventually, settled

import histstore
from histstore import DatabaseFailure, WriteError
from histstore._storage import pg_driver
from histstore._storage.deadlines import GIVE_UP_BOUND
from histstore._storage.pg_driver import abandon, cancel_requests

pytestmark = pytest.mark.postgres

MARGIN = 0.7
"""Seconds a loaded 2-core machine may add to the bound (the calls take 0.3-0.5 s of
it; before the bound existed they took 2 s to forever)."""

CALLS: list[Any] = [
    pytest.param(lambda s, c: s.read(c, limit=20), id="read"),
    pytest.param(lambda s, c: s.count(c), id="count"),
    pytest.param(lambda s, c: s.load(c), id="load"),
    pytest.param(lambda s, c: s.write(c, one("x")), id="append"),
    pytest.param(lambda s, c: s.write(c, one("x"), idempotency_key="k"), id="key"),
]
Call = Callable[[histstore.Store, str], Awaitable[Any]]


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with throwaway_cluster() as c:
        yield c


@pytest.fixture(autouse=True)
async def cancel_requests_delivered() -> AsyncIterator[None]:
    """After each test, the cancel requests still going on (``pg_driver._detach``) get
    a few seconds to end before the loop closes and cuts them off: PgBouncer 1.18
    breaks when a client hangs up a cancel request it is forwarding (pgbouncer#801)."""
    yield
    await settled(lambda: not pg_driver._lingering, True)


@pytest.fixture(scope="module")
def bouncer(cluster: Cluster) -> Iterator[str]:
    """The cluster's database through a transaction-mode PgBouncer (which stays up while
    the cluster is stopped, as a pooler in front of a hung host does)."""
    with running_pgbouncer(url(cluster)) as through:
        yield through


@dataclass
class Target:
    """How a test reaches the cluster: directly, or through PgBouncer."""

    url: str
    options: dict[str, Any]

    def connect(self, query: str = "", **options: Any) -> Any:
        tail = f"?{query}" if query else ""
        return histstore.connect(self.url + tail, migrate=True, **self.options, **options)


@pytest.fixture(params=["direct", "pgbouncer"])
def target(request: pytest.FixtureRequest, cluster: Cluster) -> Target:
    if request.param == "direct":
        return Target(url(cluster), {})
    return Target(request.getfixturevalue("bouncer"), {"pooler": "transaction"})


def one(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def url(cluster: Cluster) -> str:
    return cluster.url(user="app", password=PASSWORD, database="app")


@contextmanager
def paused(cluster: Cluster) -> Iterator[None]:
    """Every process of the cluster stopped (postmaster and backends); continued after."""
    postmaster = int((cluster.datadir / "postmaster.pid").read_text().split()[0])
    children = subprocess.run(
        ["pgrep", "-P", str(postmaster)], capture_output=True, text=True, check=False
    ).stdout.split()
    stopped = [postmaster, *map(int, children)]
    try:
        for pid in stopped:
            os.kill(pid, signal.SIGSTOP)
        yield
    finally:
        for pid in stopped:
            os.kill(pid, signal.SIGCONT)


@asynccontextmanager
async def stalled_commits(cluster: Cluster) -> AsyncIterator[None]:
    """Every COMMIT that writes waits for a synchronous standby that never comes."""

    def apply(*settings: str) -> None:
        for setting in settings:
            cluster.psql(setting)
        cluster.psql("SELECT pg_reload_conf()")

    await asyncio.to_thread(
        apply,
        "ALTER SYSTEM SET synchronous_commit = on",
        "ALTER SYSTEM SET synchronous_standby_names = 'x'",
    )

    # Reloaded: a new session has the settings (the server signalled every backend
    # before; each applies them before its next statement).
    async def reloaded() -> bool:
        return await asyncio.to_thread(cluster.psql, "SHOW synchronous_standby_names") == "x\n"

    await eventually(reloaded, "the settings reloaded")
    try:
        yield
    finally:
        await asyncio.to_thread(
            apply,
            "ALTER SYSTEM RESET synchronous_standby_names",
            "ALTER SYSTEM RESET synchronous_commit",
        )


async def ended_within(work: Awaitable[Any], limit: float) -> tuple[float, BaseException | None]:
    """Run ``work`` for at most ``limit`` seconds (a test that fails, not one that
    hangs): how long it took and what it raised."""
    task = asyncio.ensure_future(work)
    started = time.monotonic()
    done, _ = await asyncio.wait({task}, timeout=limit)
    assert done, f"still running after {limit} s"
    return time.monotonic() - started, task.exception()


async def warmed(store: histstore.Store, conversation: str) -> None:
    """Open connections and compile the statements before the server stops."""
    await store.write(conversation, one("a"), idempotency_key="warm")
    await store.write(conversation, one("b"))
    await store.read(conversation, limit=20)
    await store.load(conversation)


@pytest.mark.parametrize("call", CALLS)
async def test_cancelled_call_returns_within_bound_on_a_silent_server(
    cluster: Cluster, target: Target, call: Call
) -> None:
    conversation = new_id()
    async with target.connect() as store:
        await warmed(store, conversation)
        with paused(cluster):
            deadline = 0.5
            took, error = await ended_within(
                asyncio.wait_for(call(store, conversation), deadline), 30
            )
        assert isinstance(error, asyncio.TimeoutError)
        assert took < deadline + GIVE_UP_BOUND + MARGIN
        await no_session_left_behind(cluster)
        # The server is back: the store works, and the write given up is all or nothing.
        await store.write(conversation, one("c"))
        assert (await store.read(conversation))[-1].content == "c"
        assert await store.count(conversation) in (3, 4)


@pytest.mark.parametrize("call", CALLS)
async def test_command_timeout_gives_up_on_a_silent_server(
    cluster: Cluster, target: Target, call: Call
) -> None:
    conversation = new_id()
    limit = 0.5
    async with target.connect(f"command_timeout={limit}") as store:
        await warmed(store, conversation)
        with paused(cluster):
            took, error = await ended_within(call(store, conversation), 30)
        assert took < limit + GIVE_UP_BOUND + MARGIN
        assert isinstance(error, DatabaseFailure | WriteError)
        assert "command_timeout=0.5s" in str(error)
        if isinstance(error, WriteError):
            assert error.outcome.accepted == 0
            assert error.idempotency_key is not None
            # Settled by writing the batch again with its key: stored once.
            again = await store.write(conversation, one("x"), idempotency_key=error.idempotency_key)
            assert again.accepted == 1
            assert [m.content for m in await store.read(conversation)] == ["a", "b", "x"]
        else:
            assert error.transient


async def test_write_stalled_in_commit_can_be_cancelled(cluster: Cluster, target: Target) -> None:
    conversation = new_id()
    async with target.connect() as store:
        await warmed(store, conversation)
        async with stalled_commits(cluster):
            deadline = 1.0
            write = store.write(conversation, one("x"), idempotency_key="k")
            took, error = await ended_within(asyncio.wait_for(write, deadline), 20)
        assert isinstance(error, asyncio.TimeoutError)
        assert took < deadline + GIVE_UP_BOUND + MARGIN
        await no_session_left_behind(cluster)
        # PostgreSQL answered the cancel request by committing locally: the key settles it.
        outcome = await store.write(conversation, one("x"), idempotency_key="k")
        assert outcome.accepted == 1
        assert [m.content for m in await store.read(conversation)] == ["a", "b", "x"]


@pytest.mark.parametrize("key", [None, "k"], ids=["append", "key"])
async def test_write_stalled_in_commit_is_uncertain_at_command_timeout(
    cluster: Cluster, target: Target, key: str | None
) -> None:
    conversation = new_id()
    limit = 1.0
    async with target.connect(command_timeout=limit) as store:
        await warmed(store, conversation)
        async with stalled_commits(cluster):
            write = store.write(conversation, one("x"), idempotency_key=key)
            took, error = await ended_within(write, 20)
        assert took < limit + GIVE_UP_BOUND + MARGIN
        assert isinstance(error, WriteError)
        assert error.outcome.uncertain
        assert error.outcome.accepted == 0
        assert error.idempotency_key == (key or error.idempotency_key) is not None
        failure = error.__context__
        assert isinstance(failure, DatabaseFailure)
        assert failure.phase == "commit"
        assert failure.transient
        outcome = await store.write(conversation, one("x"), idempotency_key=error.idempotency_key)
        assert outcome.accepted == 1
        assert [m.content for m in await store.read(conversation)] == ["a", "b", "x"]


async def test_close_on_a_silent_server_returns_at_command_timeout(
    cluster: Cluster, target: Target
) -> None:
    conversation = new_id()
    limit = 0.5
    store = await target.connect(command_timeout=limit)
    await warmed(store, conversation)
    with paused(cluster):
        took, error = await ended_within(store.close(), 30)
    assert error is None
    assert took < limit + GIVE_UP_BOUND + MARGIN
    assert store.closed


async def test_cancel_requests_of_this_asyncpg_are_seen(cluster: Cluster) -> None:
    """The connection given up waits for its cancel request, through asyncpg's private
    task set (``pg_driver.cancel_requests``); without it the fallback aborts at once."""
    conn = await asyncpg.connect(url(cluster).replace("postgresql://", "postgres://"))
    try:
        sleeping = asyncio.ensure_future(conn.fetch("SELECT pg_sleep(30)"))

        async def running() -> bool:
            sql = (
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE wait_event = 'PgSleep' AND query = 'SELECT pg_sleep(30)'"
            )
            return await asyncio.to_thread(cluster.psql, sql) != "0\n"

        await eventually(running, "the server running the sleep")
        sleeping.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sleeping
        assert cancel_requests(conn)
        started = time.monotonic()
        await abandon(conn)
        assert time.monotonic() - started < 0.3 + MARGIN
        assert conn.is_closed()
    finally:
        conn.terminate()


async def test_concurrent_calls_in_groups_are_given_up_within_bound(
    cluster: Cluster, target: Target
) -> None:
    """Reads and appends queued behind others go out as group statements; cancelled,
    each returns within the bound, and the groups they leave are given up."""
    conversations = [new_id() for _ in range(8)]
    async with target.connect() as store:
        for conversation in conversations:
            await warmed(store, conversation)
        deadline = 0.5
        calls = [
            *(store.read(c, limit=20) for c in conversations),
            *(store.write(c, one("x")) for c in conversations),
        ]
        with paused(cluster):
            started = time.monotonic()
            ends = await asyncio.gather(
                *(ended_within(asyncio.wait_for(call, deadline), 30) for call in calls)
            )
            took = time.monotonic() - started
        assert all(isinstance(error, asyncio.TimeoutError) for _, error in ends)
        assert took < deadline + GIVE_UP_BOUND + MARGIN
        await no_session_left_behind(cluster)
        for conversation in conversations:
            assert await store.count(conversation) in (2, 3)


async def no_session_left_behind(cluster: Cluster) -> None:
    """Within a few seconds no session of the cluster's ``app`` role is idle in a
    transaction or waiting for a standby (the server ended what was given up)."""
    sql = (
        "SELECT count(*) FROM pg_stat_activity WHERE usename = 'app'"
        " AND (state LIKE 'idle in transaction%' OR wait_event = 'SyncRep')"
    )

    async def none_left() -> bool:
        return await asyncio.to_thread(cluster.psql, sql) == "0\n"

    await eventually(none_left, "no session of app left behind", within=5)
