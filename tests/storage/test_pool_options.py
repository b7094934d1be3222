"""``pool_size``, ``max_overflow`` and ``refused_wait``: in ``connect()`` and in the URL."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from conftest import Backend
from helpers import new_id, user_msgs
from sqlalchemy import URL
from waiting import eventually

import histstore
from histstore._storage.engine import resolve_target
from histstore._storage.pool_options import pool_options


def _open_now(pool: Any) -> int:
    """Connections the pool holds open: lent out, or idle in it."""
    return int(pool.checkedout()) + int(pool.checkedin())


async def test_a_store_never_holds_more_than_its_pool_allows(shared_backend: Backend) -> None:
    """A burst of 24 tasks on a store with ``pool_size=1, max_overflow=2``: at most three
    connections at once, every write stored, and once idle only the kept one is left."""
    async with shared_backend.connect(pool_size=1, max_overflow=2) as store:
        pool = store.engine.pool
        most = 0
        done = asyncio.Event()

        async def watch() -> None:
            nonlocal most
            while not done.is_set():
                most = max(most, _open_now(pool))
                await asyncio.sleep(0.001)

        async def agent(c: str) -> None:
            for i in range(3):
                await store.read(c, limit=20)
                await store.write(c, user_msgs(1, f"m{i}-"))

        watcher = asyncio.ensure_future(watch())
        ids = [new_id() for _ in range(24)]
        await asyncio.gather(*(agent(c) for c in ids))
        done.set()
        await watcher
        assert 1 <= most <= 3
        for c in ids:
            assert await store.count(c) == 3
        # The kept connections go back within half a second.
        await eventually(lambda: pool.checkedout() == 0, "every connection back in the pool")
        assert _open_now(pool) <= 1


async def test_an_in_memory_database_or_an_engine_takes_no_pool_size() -> None:
    with pytest.raises(ValueError, match="in-memory"):
        histstore.connect("sqlite://", pool_size=2)
    async with histstore.connect("sqlite://") as store:
        with pytest.raises(ValueError, match="AsyncEngine"):
            histstore.connect(store.engine, max_overflow=1)
        async with histstore.connect(store.engine, refused_wait=1):
            pass


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"pool_size": 0}, "pool_size"),
        ({"pool_size": True}, "pool_size"),
        ({"max_overflow": -1}, "max_overflow"),
        ({"max_overflow": 1.5}, "max_overflow"),
        ({"refused_wait": -1}, "refused_wait"),
        ({"refused_wait": float("inf")}, "refused_wait"),
        ({"refused_wait": "30"}, "refused_wait"),
    ],
)
def test_bad_options_are_value_errors(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        histstore.connect("postgresql://u@h/db", **options)


PG = "postgresql://u@h/db"


def test_the_url_sets_the_options() -> None:
    url = resolve_target(f"{PG}?pool_size=3&max_overflow=0&refused_wait=2.5")
    assert isinstance(url, URL)
    found = pool_options(url)
    assert (found.pool_size, found.max_overflow, found.refused_wait) == (3, 0, 2.5)


async def test_url_options_size_the_pool(pg_url: str) -> None:
    """The URL's options reach the pool (and not the driver); connect()'s arguments win."""
    sep = "&" if "?" in pg_url else "?"
    url = f"{pg_url}{sep}pool_size=1&max_overflow=0&refused_wait=5"
    async with histstore.connect(url) as store:
        c = new_id()
        await asyncio.gather(*(store.write(f"{c}-{k}", user_msgs(1)) for k in range(8)))
        assert _open_now(store.engine.pool) == 1
        assert store.engine.pool.size() == 1  # type: ignore[attr-defined]
    async with histstore.connect(url, pool_size=4) as store:
        assert store.engine.pool.size() == 4  # type: ignore[attr-defined]
