"""SPEC 14, upgrades: ``histstore migrate --sql`` from a database's own revision, applied
by ``psql -v ON_ERROR_STOP=1``, and ``migrate --lock-timeout`` behind another session's
locks. Databases at each earlier revision are made with Alembic and filled with rows as
that revision's schema holds them. The command runs in this process (``cli_runner.run``),
and as a child process, as a user runs it, where its own start is part of the timing.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sqlite3
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from cli_runner import Result, run, run_subprocess
from helpers import empty_pg_database
from sqlalchemy import Column, MetaData, Table, insert, inspect, select, text
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool

import histstore
from histstore import admin
from histstore._core import codec as _codec
from histstore._core.search_text import indexed_text
from histstore._storage import migrations as _migrations
from histstore._storage import schema as _schema
from histstore._storage.dberrors import DatabaseFailure
from histstore._storage.engine import resolve_target

REVISIONS = _migrations.revisions()
HEAD = REVISIONS[-1]
EARLIER = [_migrations.BASE, *REVISIONS[:-1]]
NOW = datetime(2024, 5, 6, 7, 8, 9, 123456, tzinfo=timezone.utc)

SHAPES: list[dict[str, Any]] = [
    {"role": "user", "content": "old walrus"},
    {"role": "assistant", "content": [{"type": "text", "text": "old narwhal"}]},
    {"type": "function_call", "call_id": "x", "name": "f", "arguments": '{"q": "orca"}'},
    {"type": "reasoning", "id": "r", "summary": []},
]
# An ADK event as the adapter stored it before revision f3b8d6a2c915: no role key. Every
# upgrade, online or by ``--sql`` then ``histstore reindex``, gives it its role.
ENVELOPE: dict[str, Any] = {
    "type": "adk_event",
    "event": {"author": "agent", "content": {"role": "model", "parts": [{"text": "sunny"}]}},
}
ENVELOPE_ROLES = "f3b8d6a2c915"
CONVERSATIONS = {"c0": 5, "c1": 2, "empty": 0, "adk": 1}
METADATA: dict[str, dict[str, Any]] = {"c0": {"topic": "whales", "n": [1, 2]}, "c1": {"": None}}


# ---------------------------------------------------------------------------- helpers


async def histstore_cli(*args: str) -> Result:
    """Run ``histstore ARGS`` in this process, with no ``$HISTSTORE_URL``."""
    saved = os.environ.pop("HISTSTORE_URL", None)
    try:
        return await run(*args)
    finally:
        if saved is not None:
            os.environ["HISTSTORE_URL"] = saved


async def psql(url: str, script: str) -> Result:
    """Apply ``script`` with the psql binary, stopping at the first error."""
    binary = shutil.which("psql")
    if binary is None:
        pytest.skip("psql is not installed")
    proc = await asyncio.create_subprocess_exec(
        binary,
        "-X",
        "-q",
        "-v",
        "ON_ERROR_STOP=1",
        "-d",
        url,
        env={**os.environ, "PGOPTIONS": ""},
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(script.encode()), timeout=300)
    assert proc.returncode is not None
    return Result(proc.returncode, out.decode(), err.decode())


@asynccontextmanager
async def engine_for(url: str) -> AsyncIterator[AsyncEngine]:
    resolved = resolve_target(url)
    assert not isinstance(resolved, AsyncEngine)
    engine = create_async_engine(resolved, poolclass=NullPool)
    try:
        yield engine
    finally:
        await engine.dispose()


async def upgrade_to(url: str, revision: str, schema: str | None = None) -> None:
    """Bring a database to ``revision`` with Alembic (``base``: leave it empty)."""
    if revision == _migrations.BASE:
        return

    def run(conn: Connection) -> None:
        command.upgrade(_migrations.alembic_config(conn, schema=schema), revision)

    async with engine_for(url) as engine, engine.begin() as conn:
        if schema is not None:
            await conn.execute(text(f'CREATE SCHEMA IF NOT EXISTS "{schema}"'))
        await conn.run_sync(run)


def _values(
    name: str,
    cid: str,
    n: int,
    *,
    key: str = "",
    value: Any = None,
    p: int = 0,
    enveloped_roles: bool = False,
) -> Any:
    """Every value a row of table ``name`` may hold at some revision, by column
    (``enveloped_roles``: the revision's adapters give an envelope its role)."""
    if name == "histstore_conversations":
        return {
            "id": cid,
            "owner": None,
            "system_prompt": None,
            "length": n,
            "created_at": NOW,
            "updated_at": NOW,
            "revision": 1 if n else 0,
            "next_entry": n + 1,
            "next_aside": 1,
            "halted": None,
        }
    if name == "histstore_messages":
        shape = SHAPES[p % len(SHAPES)]
        if cid == "adk":
            shape = {"role": "assistant", **ENVELOPE} if enveloped_roles else ENVELOPE
        return {
            "conversation_id": cid,
            "position": p,
            "role": shape.get("role"),
            "data": json.dumps(shape, ensure_ascii=False, separators=(",", ":")),  # as stored
            "token_count": None,
            "created_at": NOW,
            "search_text": indexed_text(shape),
            "entry_id": p + 1,
            "author": None,
        }
    if name == "histstore_metadata":
        return {
            "conversation_id": cid,
            "key": _codec.key_to_stored(key),
            "value": _codec.encode(value)[0],
            "digest": _codec.canonical_digest(value),
            "key_digest": _codec.key_digest(key),
        }
    assert name == "histstore_changes"
    return {
        "conversation_id": cid,
        "revision": 1,
        "kind": "save",
        "author": None,
        "at": NOW,
        "record": json.dumps({"start": 0, "added": n}, separators=(",", ":")),
    }


def _seed(conn: Connection, schema: str | None) -> None:
    """Rows as the schema at the database's revision holds them: only the columns it
    has, typed as histstore types them; a required column this test does not know is
    a failure that names it."""
    present = set(inspect(conn).get_table_names(schema=schema))
    version = Table(_schema.VERSION_TABLE, MetaData(), Column("version_num"), schema=schema)
    current = conn.execute(select(version.c.version_num)).scalar_one()
    roles = REVISIONS.index(current) >= REVISIONS.index(ENVELOPE_ROLES)
    reflected = MetaData()
    tables: dict[str, Table] = {}
    for name in ("histstore_conversations", "histstore_messages", "histstore_metadata"):
        assert name in present, name
    for name in (*sorted(present & set(_schema.metadata.tables)),):
        if name not in (
            "histstore_conversations",
            "histstore_messages",
            "histstore_metadata",
            "histstore_changes",
        ):
            continue
        found = Table(name, reflected, schema=schema, autoload_with=conn)
        current = _schema.metadata.tables[name].c
        columns = [
            Column(c.name, current[c.name].type if c.name in current else c.type)
            for c in found.c
            if c.computed is None
        ]
        tables[name] = Table(name, MetaData(), *columns, schema=schema)
        for c in found.c:
            if not c.nullable and c.server_default is None and c.computed is None:
                assert c.name in _values(name, "x", 1), f"{name}.{c.name} at this revision"

    def put(name: str, rows: list[dict[str, Any]]) -> None:
        if rows and name in tables:
            names = set(tables[name].c.keys())
            conn.execute(
                insert(tables[name]), [{k: v for k, v in r.items() if k in names} for r in rows]
            )

    for cid, n in CONVERSATIONS.items():
        put("histstore_conversations", [_values("histstore_conversations", cid, n)])
        put(
            "histstore_messages",
            [_values("histstore_messages", cid, n, p=p, enveloped_roles=roles) for p in range(n)],
        )
        if n:
            put("histstore_changes", [_values("histstore_changes", cid, n)])
        entries = METADATA.get(cid, {})
        put(
            "histstore_metadata",
            [_values("histstore_metadata", cid, n, key=k, value=v) for k, v in entries.items()],
        )


async def seed(url: str, schema: str | None = None) -> None:
    async with engine_for(url) as engine, engine.begin() as conn:
        await conn.run_sync(_seed, schema)


async def assert_data_reads_back(url: str, schema: str | None = None) -> None:
    async with histstore.connect(url, schema=schema) as store:  # checks the schema is at head
        for cid, n in CONVERSATIONS.items():
            stored = await store.read(cid)
            if cid == "adk":
                assert [m.to_dict() for m in stored] == [{"role": "assistant", **ENVELOPE}]
                continue
            assert [m.to_dict() for m in stored] == [SHAPES[p % len(SHAPES)] for p in range(n)]
            assert await store.metadata(cid) == METADATA.get(cid, {})
        assert [h.conversation for h in await store.search("sunny")] == ["adk"]
        walrus = await store.search("walrus", limit=20)
        assert sorted(h.conversation for h in walrus) == ["c0", "c0", "c1"]
        await store.write("c1", [{"role": "user", "content": "after the upgrade"}])
        assert await store.count("c1") == 3


async def revision_of(url: str, schema: str | None = None) -> str | None:
    return (await admin.migration_status(url, schema=schema)).current


@pytest.fixture
async def pg_database(pg_url: str) -> AsyncIterator[str]:
    """A new, empty Postgres database of its own."""
    async with empty_pg_database() as url:
        yield url


# ---------------------------------------------------------------------------- --sql


@pytest.mark.parametrize("start", EARLIER)
async def test_sql_from_each_earlier_revision_applied_by_psql(pg_database: str, start: str) -> None:
    url = pg_database
    await upgrade_to(url, start)
    if start != _migrations.BASE:
        await seed(url)
    online = await histstore_cli("migrate", "--sql", "--url", url)
    assert online.code == 0, online.err
    offline = await histstore_cli("migrate", "--sql", "--from", start, "--url", url)
    assert offline.code == 0, offline.err
    assert offline.out == online.out
    assert await revision_of(url) == (None if start == _migrations.BASE else start)  # ran nothing

    applied = await psql(url, online.out)
    assert applied.code == 0, applied.err
    assert await revision_of(url) == HEAD
    if start == _migrations.BASE:
        assert "histstore reindex" not in online.out
        return
    names_reindex = "histstore reindex" in online.out
    if names_reindex:
        # The only follow-up a script may name, at its end, as SQL comments.
        tail = online.out[online.out.rindex("COMMIT;") :]
        assert "histstore reindex" in tail
        assert all(line.startswith("--") for line in tail.splitlines()[1:] if line.strip())
        done = await histstore_cli("reindex", "--url", url)
        assert done.code == 0, done.err
    await assert_data_reads_back(url)


async def test_sql_honours_the_schema(pg_database: str) -> None:
    url, schema, start = pg_database, "tenant_y", REVISIONS[0]
    await upgrade_to(url, start, schema)
    await seed(url, schema)
    online = await histstore_cli("migrate", "--sql", "--url", url, "--schema", schema)
    assert online.code == 0, online.err
    offline = await histstore_cli(
        "migrate", "--sql", "--from", start, "--url", url, "--schema", schema
    )
    assert offline.out == online.out
    assert "--schema tenant_y" in online.out  # the reindex follow-up names it too
    applied = await psql(url, online.out)
    assert applied.code == 0, applied.err
    assert await revision_of(url, schema) == HEAD
    assert await revision_of(url) is None  # nothing landed in the default schema
    assert (await histstore_cli("reindex", "--url", url, "--schema", schema)).code == 0
    await assert_data_reads_back(url, schema)


async def test_sql_at_head_is_a_comment_and_newer_is_refused(pg_database: str) -> None:
    url = pg_database
    await upgrade_to(url, HEAD)
    at_head = await histstore_cli("migrate", "--sql", "--url", url)
    assert at_head.code == 0, at_head.err
    statements = [line for line in at_head.out.splitlines() if not line.startswith("--")]
    assert statements == []
    assert HEAD in at_head.out
    assert (await psql(url, at_head.out)).code == 0
    async with engine_for(url) as engine, engine.begin() as conn:
        await conn.execute(text(f"UPDATE {_schema.VERSION_TABLE} SET version_num = 'f00dfeedbeef'"))
    newer = await histstore_cli("migrate", "--sql", "--url", url)
    assert newer.code == 1
    assert "newer than this version of histstore" in newer.err
    assert newer.out == ""


async def test_from_an_unknown_revision_lists_the_known_ones() -> None:
    result = await histstore_cli(
        "migrate", "--sql", "--from", "nope", "--url", "postgresql://u@127.0.0.1:1/none"
    )
    assert result.code == 1
    assert "unknown revision 'nope'" in result.err
    for rev in ("base", *REVISIONS):
        assert rev in result.err
    assert "Traceback" not in result.err
    no_sql = await histstore_cli("migrate", "--from", REVISIONS[0], "--url", "x.db")
    assert no_sql.code == 2
    assert "--from goes with --sql" in no_sql.err


async def test_sql_of_an_older_sqlite_file_says_it_is_for_postgres(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    url = f"sqlite:///{path}"
    await upgrade_to(url, REVISIONS[-2])
    before = path.read_bytes()
    for extra in ((), ("--from", REVISIONS[-2])):
        result = await histstore_cli("migrate", "--sql", *extra, "--url", str(path))
        assert result.code == 1
        assert "for PostgreSQL only" in result.err
        assert "histstore migrate" in result.err
        assert "Traceback" not in result.err
    assert path.read_bytes() == before
    assert await revision_of(url) == REVISIONS[-2]


# ---------------------------------------------------------------------------- --lock-timeout

BEHIND_A_LOCK = REVISIONS[REVISIONS.index("e2a7c9d41f06") - 1]
"""Where the lock tests start: the next revision alters a histstore table on every
backend, so an upgrade from here waits behind another session's writer lock."""


@contextmanager
def sqlite_writer(path: Path) -> Iterator[sqlite3.Connection]:
    """Another session holding the SQLite file's write lock (an open write transaction)."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=WAL")  # as histstore keeps its files
        conn.execute("BEGIN IMMEDIATE")
        yield conn
    finally:
        conn.close()


@asynccontextmanager
async def pg_writer(url: str) -> AsyncIterator[Any]:
    """Another session with an open transaction holding ROW EXCLUSIVE (a live writer's
    lock) on every histstore table: no ALTER, CREATE INDEX or CREATE TRIGGER on them
    gets through until it ends."""
    import asyncpg

    conn = await asyncpg.connect(url)
    try:
        names = [
            r[0]
            for r in await conn.fetch(
                "SELECT tablename FROM pg_tables WHERE tablename LIKE 'histstore%'"
                " AND schemaname = current_schema()"
            )
        ]
        await conn.execute("BEGIN")
        await conn.execute(f"LOCK TABLE {', '.join(names)} IN ROW EXCLUSIVE MODE")
        yield conn
    finally:
        await conn.close()


@asynccontextmanager
async def older_database(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> Any:
    """A database at ``BEHIND_A_LOCK``, with data, as a URL."""
    if kind == "postgres":
        request.getfixturevalue("pg_url")
        async with empty_pg_database() as url:
            await upgrade_to(url, BEHIND_A_LOCK)
            await seed(url)
            yield url
    else:
        url = f"sqlite:///{tmp_path / 'locked.db'}"
        await upgrade_to(url, BEHIND_A_LOCK)
        await seed(url)
        yield url


@asynccontextmanager
async def held(kind: str, url: str) -> AsyncIterator[Any]:
    if kind == "postgres":
        async with pg_writer(url) as conn:
            yield conn
    else:
        with sqlite_writer(Path(url.removeprefix("sqlite:///"))) as conn:
            yield conn


async def release(kind: str, conn: Any) -> None:
    if kind == "postgres":
        await conn.execute("COMMIT")
    else:
        conn.execute("COMMIT")


BACKENDS = [pytest.param("postgres", marks=pytest.mark.postgres), "sqlite-file"]


@pytest.mark.parametrize("kind", BACKENDS)
async def test_migrate_behind_a_lock_gives_up_saying_nothing_changed(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    async with older_database(kind, tmp_path, request) as url:
        async with held(kind, url):
            started = time.monotonic()
            result = await run_subprocess("migrate", "--lock-timeout", "0.5", "--url", url)
            took = time.monotonic() - started
            assert result.code == 1, result.out
            assert "Nothing was changed" in result.err
            assert "safe to run again" in result.err
            assert "4 attempts" in result.err
            assert len(result.err.splitlines()) == 1
            # four waits of 0.5 s and pauses of 3.5 s, and the process's own start
            assert 5.5 <= took < 30
            assert await revision_of(url) == BEHIND_A_LOCK
        again = await histstore_cli("migrate", "--url", url)
        assert again.code == 0, again.err
        assert f"from {BEHIND_A_LOCK} to {HEAD} in " in again.out
        assert await revision_of(url) == HEAD
        await assert_data_reads_back(url)


@pytest.mark.parametrize("kind", BACKENDS)
async def test_migrate_succeeds_when_the_lock_goes_during_its_retries(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    async with older_database(kind, tmp_path, request) as url:
        async with held(kind, url) as conn:
            started = time.monotonic()
            running = asyncio.create_task(
                histstore_cli("migrate", "--lock-timeout", "1", "--url", url)
            )
            await asyncio.sleep(2.0)  # past the first attempt's wait, into the retries
            assert not running.done()
            await release(kind, conn)
            result = await running
            assert result.code == 0, result.err
            assert time.monotonic() - started >= 2.0
        assert await revision_of(url) == HEAD
        await assert_data_reads_back(url)


@pytest.mark.postgres
async def test_connect_with_migrate_retries_the_same_way(pg_database: str) -> None:
    """``connect(migrate=True)`` upgrades through the same retries (its lock timeout
    set here through the context's upgrade options, as ``admin.migrate`` does)."""
    url = pg_database
    await upgrade_to(url, BEHIND_A_LOCK)
    await seed(url)
    token = _migrations.upgrade_options.set(_migrations.UpgradeOptions(lock_timeout=0.2))
    try:
        async with pg_writer(url):
            with pytest.raises(DatabaseFailure, match="Nothing was changed; it is safe") as info:
                await histstore.connect(url, migrate=True)
            assert info.value.__cause__ is not None
            assert _migrations.is_lock_failure(info.value.__cause__)
        assert await revision_of(url) == BEHIND_A_LOCK
        seen: list[tuple[int, int]] = []
        how = _migrations.UpgradeOptions(
            lock_timeout=0.2, progress=lambda d, t: seen.append((d, t))
        )
        _migrations.upgrade_options.set(how)
        store = await histstore.connect(url, migrate=True)
        await store.close()
    finally:
        _migrations.upgrade_options.reset(token)
    steps = len(REVISIONS) - 1 - REVISIONS.index(BEHIND_A_LOCK)
    assert seen == [(done, steps) for done in range(steps + 1)]
    assert await revision_of(url) == HEAD
    await assert_data_reads_back(url)


async def test_lock_timeout_is_checked() -> None:
    with pytest.raises(ValueError, match="lock_timeout"):
        await admin.migrate("x.db", lock_timeout=0)
    result = await histstore_cli("migrate", "--lock-timeout", "-1", "--url", "x.db")
    assert result.code == 2
    result = await histstore_cli("migrate", "--sql", "--lock-timeout", "3", "--url", "x.db")
    assert result.code == 2
    assert "PGOPTIONS" in result.err
