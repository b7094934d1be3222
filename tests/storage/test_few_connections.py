"""A PostgreSQL server with few connections, shared by several processes.

Real servers only: a throwaway cluster with ``max_connections = 20`` (one slot reserved
for superusers), child processes started with ``sys.executable`` each opening a store
with the defaults and writing from several tasks, and the role's connection limit
lowered to make the server refuse (SQLSTATE 53300) on demand.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator, Coroutine, Iterator
from typing import Any, TypeVar

import asyncpg
import pytest
from cli_runner import run_subprocess
from helpers import subprocess_env
from pg_cluster import PASSWORD, Cluster, throwaway_cluster
from waiting import eventually

import histstore
from histstore import DatabaseFailure, Message

pytestmark = pytest.mark.postgres

T = TypeVar("T")

PROCESSES = 8
TASKS = 6
TURNS = 25
KEPT, OVERFLOW = 2, 3
"""The defaults of ``connect()`` on PostgreSQL (``_storage.pool_options``)."""

CHILD = """
import asyncio, json, sys
import histstore
from histstore import Message

async def main(url: str, name: str, tasks: int, turns: int) -> None:
    acked: dict[str, list[str]] = {}
    async with histstore.connect(url) as store:
        async def agent(t: int) -> None:
            c = f"{name}-{t}"
            acked[c] = []
            for i in range(turns):
                await store.read(c, limit=20)
                await store.write(c, [Message.user(f"{c}-{i}")])
                acked[c].append(f"{c}-{i}")
        await asyncio.gather(*(agent(t) for t in range(tasks)))
    print(json.dumps(acked))

asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])))
"""


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    settings = ["max_connections = 20", "superuser_reserved_connections = 1"]
    with throwaway_cluster(settings=settings) as c:
        yield c


@pytest.fixture(scope="module")
def app_url(cluster: Cluster) -> str:
    url = cluster.url(user="app", password=PASSWORD, database="app")

    async def migrate() -> None:
        async with histstore.connect(url, migrate=True):
            pass

    asyncio.run(migrate())
    return url


@pytest.fixture
async def watcher(cluster: Cluster) -> AsyncIterator[asyncpg.Connection]:
    """A superuser session over the cluster's socket, opened before the server fills."""
    conn = await asyncpg.connect(
        host=str(cluster.datadir.parent), port=cluster.port, user="postgres", database="app"
    )
    try:
        yield conn
    finally:
        await conn.close()


async def _connections(watcher: asyncpg.Connection) -> dict[str, int]:
    """The server's sessions of role ``app``, by application name."""
    rows = await watcher.fetch(
        "SELECT application_name, count(*) FROM pg_stat_activity WHERE usename = 'app' GROUP BY 1"
    )
    return {str(name): int(n) for name, n in rows}


async def test_processes_share_a_server_with_few_connections(
    watcher: asyncpg.Connection, app_url: str
) -> None:
    """Eight processes with the defaults on a server allowing 19 sessions: every one
    opens, every write is acknowledged and stored once, and none holds more than its
    pool allows."""
    env = subprocess_env()
    children = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            CHILD,
            f"{app_url}?application_name=p{k}",
            f"p{k}",
            str(TASKS),
            str(TURNS),
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        for k in range(PROCESSES)
    ]
    most: dict[str, int] = {}
    finished = asyncio.gather(*(child.communicate() for child in children))
    while not finished.done():
        for name, n in (await _connections(watcher)).items():
            most[name] = max(most.get(name, 0), n)
        await asyncio.wait({finished}, timeout=0.05)
    outputs = await finished
    for child, (_out, err) in zip(children, outputs, strict=True):
        assert child.returncode == 0, err.decode()[-2000:]
    assert most, "no session was seen"
    assert max(most.values()) <= KEPT + OVERFLOW, most

    acked: dict[str, list[str]] = {}
    for out, _err in outputs:
        acked.update(json.loads(out))
    assert len(acked) == PROCESSES * TASKS
    async with histstore.connect(app_url) as store:
        for c, texts in acked.items():
            assert len(texts) == TURNS
            assert [m.content for m in await store.read(c)] == texts


async def _role_limit(cluster: Cluster, limit: int) -> None:
    await asyncio.to_thread(cluster.psql, f"ALTER ROLE app CONNECTION LIMIT {limit}")


REFUSAL = 'too many connections for role "app"'


def _refusals(cluster: Cluster) -> int:
    """How many sessions of ``app`` the server has refused so far (its log says)."""
    return cluster.log.read_text(errors="replace").count(REFUSAL)


async def _refused_again(cluster: Cluster, since: int) -> None:
    """Return once the server has refused a session of ``app`` after ``since`` refusals."""
    await eventually(lambda: _refusals(cluster) > since, "a connection refused", within=30)


async def test_a_refusal_past_the_deadline_is_a_typed_failure(
    cluster: Cluster, app_url: str
) -> None:
    await _role_limit(cluster, 0)
    try:
        with pytest.raises(DatabaseFailure) as caught:
            await histstore.connect(app_url, refused_wait=0.3)
    finally:
        await _role_limit(cluster, -1)
    assert caught.value.transient
    assert caught.value.sqlstate == "53300"
    assert caught.value.__cause__ is not None


async def _while_refused(cluster: Cluster, work: Coroutine[Any, Any, T]) -> T:
    """Run ``work`` while the server refuses every session of ``app``; once it has been
    refused (and is still waiting), let sessions in again. Its result."""
    await _role_limit(cluster, 0)
    try:
        since = _refusals(cluster)
        running = asyncio.ensure_future(work)
        await _refused_again(cluster, since)
        await asyncio.sleep(0.3)
        assert not running.done()
    finally:
        await _role_limit(cluster, -1)
    return await running


async def test_connect_waits_out_a_refusal(cluster: Cluster, app_url: str) -> None:
    store = await _while_refused(cluster, _open(app_url))
    try:
        await store.write("after-refusal", [Message.user("hi")])
        assert [m.content for m in await store.read("after-refusal")] == ["hi"]
    finally:
        await store.close()


async def _open(url: str) -> histstore.Store:
    return await histstore.connect(url)


async def test_calls_go_on_with_the_connections_held_when_the_server_is_full(
    cluster: Cluster, watcher: asyncpg.Connection, app_url: str
) -> None:
    """A store holding one connection on a server that refuses every new one: its
    concurrent calls share the one it has (none fails, nothing is written twice)."""
    async with histstore.connect(app_url, refused_wait=60) as store:
        await store.write("full-0", [Message.user("warm")])
        held = (await _connections(watcher)).get("", 0)
        await _role_limit(cluster, max(held, 1))
        try:

            async def agent(k: int) -> None:
                for i in range(5):
                    await store.read(f"full-{k}", limit=20)
                    await store.write(f"full-{k}", [Message.user(f"{k}-{i}")])

            await asyncio.gather(*(agent(k) for k in range(1, 9)))
        finally:
            await _role_limit(cluster, -1)
        for k in range(1, 9):
            assert [m.content for m in await store.read(f"full-{k}")] == [
                f"{k}-{i}" for i in range(5)
            ]


@pytest.mark.parametrize("command", ["ls", "stats"])
async def test_the_command_line_waits_out_a_refusal(
    cluster: Cluster, app_url: str, command: str
) -> None:
    result = await _while_refused(cluster, run_subprocess(command, "--url", app_url))
    assert result.code == 0, result.err
