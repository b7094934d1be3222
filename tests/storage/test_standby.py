"""A hot standby, failover and synchronous replication, on real servers (issue 38).

A throwaway primary (tests/pg_cluster.py) and a standby made from it with
``pg_basebackup -R``, streaming. The standby serves read-only stores; a write to it
fails saying it is a standby; after the primary stops and the standby is promoted, a
store on a libpq multi-host URL with ``target_session_attrs=read-write`` writes to the
new primary, and every acknowledged message is there once. With a synchronous standby
(``synchronous_commit = remote_apply``) an acknowledged write is already on the standby.
What docs/replicas-and-backups.md describes is what these tests do.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from helpers import new_id
from pg_cluster import PASSWORD, Cluster, standby_of, throwaway_cluster, wait_for_replay

import histstore
from histstore import DatabaseFailure, WriteError, WriteOutcome

pytestmark = pytest.mark.postgres


def app_url(*clusters: Cluster, query: str = "") -> str:
    """The ``app`` database on ``clusters``, in libpq's multi-host form when several."""
    hosts = ",".join(f"127.0.0.1:{c.port}" for c in clusters)
    tail = f"?{query}" if query else ""
    return f"postgresql://app:{PASSWORD}@{hosts}/app{tail}"


@contextmanager
def primary_and_standby() -> Iterator[tuple[Cluster, Cluster]]:
    """A primary whose ``app`` database is at the newest schema, and its hot standby."""
    with throwaway_cluster() as primary:

        async def migrate() -> None:
            async with histstore.connect(app_url(primary), migrate=True):
                pass

        asyncio.run(migrate())
        with standby_of(primary) as standby:
            yield primary, standby


@pytest.fixture(scope="module")
def pair() -> Iterator[tuple[Cluster, Cluster]]:
    """A pair the tests share (none of them promotes it)."""
    with primary_and_standby() as clusters:
        yield clusters


@pytest.fixture
def own_pair() -> Iterator[tuple[Cluster, Cluster]]:
    """A pair of the test's own (it stops the primary and promotes the standby)."""
    with primary_and_standby() as clusters:
        yield clusters


def user(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


async def test_a_hot_standby_serves_reads_and_refuses_writes_as_a_standby(
    pair: tuple[Cluster, Cluster],
) -> None:
    primary, standby = pair
    cid = new_id("replicated")
    async with histstore.connect(app_url(primary)) as store:
        await store.write(cid, user("the walrus on the primary"))
    await asyncio.to_thread(wait_for_replay, primary, standby)

    async with histstore.connect(app_url(standby), read_only=True) as replica:
        assert [m.content for m in await replica.read(cid)] == ["the walrus on the primary"]
        assert cid in await replica.conversations()
        assert [h.conversation for h in await replica.search("walrus")] == [cid]
        assert await replica.exists(cid)

    # A store that may write, opened on the standby by mistake: its writes fail, store
    # nothing, and say why.
    async with histstore.connect(app_url(standby)) as wrong:
        assert await wrong.count(cid) == 1
        for kwargs in ({}, {"at": 1}, {"idempotency_key": "k"}):
            with pytest.raises(WriteError) as refused:
                await wrong.write(cid, user("not here"), **kwargs)  # type: ignore[arg-type]
            assert refused.value.outcome == WriteOutcome(0, False, None)
            failure = refused.value.__context__
            assert isinstance(failure, DatabaseFailure)
            assert failure.sqlstate == "25006"
            assert "SQLSTATE 25006" in str(refused.value)
            assert "hot standby" in str(refused.value)
            assert "in recovery" in str(refused.value)
        with pytest.raises(DatabaseFailure, match="hot standby"):
            await wrong.merge_metadata(cid, {"team": "blue"})
    async with histstore.connect(app_url(primary)) as store:
        assert [m.content for m in await store.read(cid)] == ["the walrus on the primary"]


async def write_until_stored(store: histstore.Store, cid: str, text: str) -> WriteOutcome:
    """Write one message, retrying a transient failure with the error's key (failover)."""
    key = None
    for _ in range(100):
        try:
            return await store.write(cid, user(text), idempotency_key=key)
        except WriteError as err:
            key = err.idempotency_key
            failure = err.__context__
            assert isinstance(failure, DatabaseFailure)
            assert failure.transient, failure
            await asyncio.sleep(0.1)
    raise AssertionError("the write never went through")


async def test_failover_through_a_multi_host_url(own_pair: tuple[Cluster, Cluster]) -> None:
    primary, standby = own_pair
    url = app_url(primary, standby, query="target_session_attrs=read-write")
    cid = new_id("failover")
    async with histstore.connect(url) as store:
        for i in range(3):
            await write_until_stored(store, cid, f"before {i}")
        # Asynchronous replication: only what the standby has replayed survives the
        # primary. Here it has everything before the primary stops.
        await asyncio.to_thread(wait_for_replay, primary, standby)
        await asyncio.to_thread(primary.stop, "fast")
        # No primary yet: the write fails as transient, and is not stored.
        with pytest.raises(WriteError) as between:
            await store.write(cid, user("between"))
        assert between.value.outcome.accepted == 0
        failure = between.value.__context__
        assert isinstance(failure, DatabaseFailure)
        assert failure.transient
        await asyncio.to_thread(standby.promote)
        key = between.value.idempotency_key
        await store.write(cid, user("between"), idempotency_key=key)  # stored once
        for i in range(3):
            await write_until_stored(store, cid, f"after {i}")
        texts = [m.content for m in await store.read(cid)]
    before = [f"before {i}" for i in range(3)]
    assert texts == [*before, "between", *(f"after {i}" for i in range(3))]
    async with histstore.connect(app_url(standby)) as promoted:  # the new primary
        assert await promoted.count(cid) == 7


async def test_a_synchronous_standby_has_every_acknowledged_write(
    pair: tuple[Cluster, Cluster],
) -> None:
    primary, standby = pair
    await asyncio.to_thread(
        primary.configure, "synchronous_standby_names = '*'", "synchronous_commit = remote_apply"
    )
    cid = new_id("synchronous")
    async with (
        histstore.connect(app_url(primary)) as store,
        histstore.connect(app_url(standby), read_only=True) as replica,
    ):
        for i in range(5):
            await store.write(cid, user(f"message {i}"))
            # No waiting: the commit was acknowledged once the standby applied it.
            assert await replica.count(cid) == i + 1
