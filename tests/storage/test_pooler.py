"""SPEC 14, behind a transaction-mode pooler: ``connect(url, pooler="transaction")``.

The behaviour suite runs through PgBouncer as the ``postgres-pgbouncer`` backend (see
conftest.py). Here: many tasks at once on a pool of 4 server sessions, what the option
accepts, and that nothing is left behind in the server sessions other clients go on to
use (prepared statements, session settings, advisory locks, listeners, temp tables).
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import asyncpg
import pytest
from helpers import new_id
from sqlalchemy import make_url
from sqlalchemy.ext.asyncio import create_async_engine

import histstore
from histstore import WriteOutcome

TASKS = 32
PGBOUNCER_TRACKS = [
    "client_encoding",
    "DateStyle",
    "TimeZone",
    "standard_conforming_strings",
    "application_name",
]


async def test_many_tasks_write_and_read(store: histstore.Store) -> None:
    """32 tasks, each writing and reading its own conversation and one shared one; on
    PgBouncer they share 4 server sessions, so statements of one task's calls run on
    different sessions."""
    shared = new_id("shared")

    async def task(t: int) -> list[str]:
        own = new_id(f"t{t}")
        for k in range(6):
            outcome = await store.write(own, [{"role": "user", "content": f"t{t}-{k}"}])
            assert isinstance(outcome, WriteOutcome)
            await store.write(shared, [{"role": "user", "content": f"s{t}-{k}"}])
            recent = await store.read(own, limit=3)
            assert [m.to_dict()["content"] for m in recent] == [
                f"t{t}-{i}" for i in range(max(0, k - 2), k + 1)
            ]
            assert await store.count(own) == k + 1
        return [m.to_dict()["content"] for m in await store.read(own)]

    results = await asyncio.gather(*(task(t) for t in range(TASKS)))
    assert results == [[f"t{t}-{k}" for k in range(6)] for t in range(TASKS)]
    messages = await store.read(shared)
    assert [m.position for m in messages] == list(range(TASKS * 6))
    assert sorted(m.to_dict()["content"] for m in messages) == sorted(
        f"s{t}-{k}" for t in range(TASKS) for k in range(6)
    )


async def test_pooler_is_checked(tmp_path: Any) -> None:
    with pytest.raises(ValueError, match="pooler must be None or 'transaction'"):
        histstore.connect("postgresql://u@localhost/db", pooler="session")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="pooler= is for PostgreSQL behind a pooler"):
        histstore.connect(str(tmp_path / "x.db"), pooler="transaction")
    with pytest.raises(ValueError, match="pooler= is for PostgreSQL behind a pooler"):
        histstore.connect("sqlite://", pooler="transaction")
    engine = create_async_engine("postgresql+asyncpg://u@localhost/db")
    try:
        with pytest.raises(ValueError, match="AsyncEngine"):
            histstore.connect(engine, pooler="transaction")
    finally:
        await engine.dispose()
    assert not (tmp_path / "x.db").exists()


async def _server_sessions(url: str, n: int) -> list[dict[str, Any]]:
    """What each of ``n`` server sessions behind PgBouncer holds: ``n`` clients each
    keep a transaction open at once, so with a pool of ``n`` each is on its own session."""
    parts = make_url(url)
    conns = [
        await asyncpg.connect(
            host=parts.host,
            port=parts.port,
            user=parts.username,
            password=parts.password,
            database=parts.database,
            statement_cache_size=0,
        )
        for _ in range(n)
    ]
    try:
        for conn in conns:
            await conn.execute("BEGIN")
        found = []
        for conn in conns:
            found.append(
                {
                    "pid": await conn.fetchval("SELECT pg_backend_pid()"),
                    "prepared": await conn.fetch("SELECT name FROM pg_prepared_statements"),
                    # A setting other than what RESET gives (PgBouncer itself sets the
                    # parameters it tracks for its clients).
                    "settings": await conn.fetch(
                        "SELECT name FROM pg_settings WHERE source = 'session'"
                        " AND setting IS DISTINCT FROM reset_val"
                        " AND name <> ALL($1::text[])",
                        PGBOUNCER_TRACKS,
                    ),
                    "listening": await conn.fetch("SELECT pg_listening_channels()"),
                    "advisory": await conn.fetch(
                        "SELECT objid FROM pg_locks WHERE locktype = 'advisory'"
                        " AND pid = pg_backend_pid()"
                    ),
                    "temp": await conn.fetchval(
                        "SELECT count(*) FROM pg_class WHERE relpersistence = 't'"
                        " AND pg_table_is_visible(oid)"
                    ),
                }
            )
        for conn in conns:
            await conn.execute("ROLLBACK")
        return found
    finally:
        for conn in conns:
            await conn.close()


@pytest.mark.postgres_pgbouncer
async def test_nothing_is_left_in_the_server_sessions(pgbouncer_url: str) -> None:
    """A migration into a new schema and a busy workload through the pooler leave every
    server session as they found it: no prepared statement, no SET, no lock, no LISTEN,
    no temp table (the next client of the session, of any application, sees none)."""
    schema = f"pool_{uuid.uuid4().hex[:8]}"
    async with histstore.connect(
        pgbouncer_url, pooler="transaction", migrate=True, schema=schema
    ) as store:

        async def task(t: int) -> None:
            cid = new_id(f"t{t}")
            for k in range(5):
                await store.write(cid, [{"role": "user", "content": f"hello {t} {k}"}])
                await store.read(cid, limit=2)
            async with store.lease(cid, ttl=30):
                await store.merge_metadata(cid, {"turn": t})
            await store.search("hello", conversation=cid)
            await store.conversations(limit=5)
            state = await store.load(cid)
            await store.save(state)

        await asyncio.gather(*(task(t) for t in range(TASKS)))
    sessions = await _server_sessions(pgbouncer_url, 4)
    assert len({s["pid"] for s in sessions}) == 4
    for session in sessions:
        assert session["prepared"] == []
        assert session["settings"] == []
        assert session["listening"] == []
        assert session["advisory"] == []
        assert session["temp"] == 0


@pytest.mark.postgres_pgbouncer
async def test_statements_are_described_once_per_connection(
    pgbouncer_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the pooler each statement is described once per connection and then runs
    in one round trip (Parse, Bind and Execute together): turns after the first prepare
    nothing new, and what they write and read is right."""
    prepared: list[str] = []
    real_prepare = asyncpg.connection.Connection.prepare

    async def prepare(conn: Any, query: str, **kwargs: Any) -> Any:
        if "histstore_messages" in query:  # histstore's own statements, not SQLAlchemy's
            prepared.append(query)
        return await real_prepare(conn, query, **kwargs)

    monkeypatch.setattr(asyncpg.connection.Connection, "prepare", prepare)
    async with histstore.connect(pgbouncer_url, pooler="transaction") as store:
        cid = new_id("once")
        await store.write(cid, [{"role": "user", "content": "warm"}])
        await store.read(cid, limit=2)
        warm = len(prepared)
        assert warm > 0, "the pooled path prepares its statements"
        for k in range(20):
            await store.write(cid, [{"role": "user", "content": f"turn {k}"}])
            assert [m.content for m in await store.read(cid, limit=1)] == [f"turn {k}"]
        assert len(prepared) == warm
        assert await store.count(cid) == 21


@pytest.mark.postgres_pgbouncer
async def test_another_asyncpg_falls_back_to_describing_each_time(
    pgbouncer_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When asyncpg's statements no longer say they are re-parsed on each execution, the
    store does not reuse them (it could otherwise bind a statement another client of
    the server session parsed): it runs each statement through the connection again."""
    real_prepare = asyncpg.connection.Connection.prepare
    prepared: list[str] = []
    ran_opaque: list[str] = []

    class Opaque:
        """A prepared statement whose state says nothing (everything else it has)."""

        def __init__(self, inner: Any) -> None:
            self._inner = inner

        def __getattr__(self, name: str) -> Any:
            if name == "_state":
                raise AttributeError(name)
            if name in ("fetch", "executemany") and "histstore_messages" in self._inner.get_query():
                ran_opaque.append(name)
            return getattr(self._inner, name)

    async def prepare(conn: Any, query: str, **kwargs: Any) -> Any:
        prepared.append(query)
        return Opaque(await real_prepare(conn, query, **kwargs))

    monkeypatch.setattr(asyncpg.connection.Connection, "prepare", prepare)
    async with histstore.connect(pgbouncer_url, pooler="transaction") as store:
        cid = new_id("fallback")
        await store.write(cid, [{"role": "user", "content": "turn 0"}])
        warm = len(prepared)
        for k in range(1, 4):
            await store.write(cid, [{"role": "user", "content": f"turn {k}"}])
        assert [m.content for m in await store.read(cid)] == [f"turn {k}" for k in range(4)]
        assert ran_opaque == [], "a statement asyncpg did not vouch for was reused"
        assert len(prepared) == warm, "the fallback is remembered, not tried on every call"
