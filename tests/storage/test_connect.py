"""Opening a store (SPEC section 1): targets, schema checks, SQLite settings, errors."""

from __future__ import annotations

import sqlite3
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import reach
from alembic import command
from helpers import empty_pg_database, is_database_error, pg_fetch, stable_id
from sqlalchemy import URL, make_url, text
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import StaticPool
from waiting import eventually

import histstore
from histstore import HistStoreError, Message, SchemaError, Store, WriteError
from histstore._storage import sqlite_driver as _sqlite_driver
from histstore._storage.engine import WAL_LIMIT_BYTES, WAL_NET_PAGES
from histstore._storage.migrations import alembic_config

VERSION_TABLE = "histstore_alembic_version"
NEWER_REVISION = "ffffffffffff"


async def roundtrip(store: Store, cid: str = "c") -> None:
    """Write and read back, proving the store works."""
    before = await store.count(cid)
    await store.write(cid, [Message.user("x")])
    assert await store.count(cid) == before + 1
    assert (await store.read(cid, limit=1))[0] == Message.user("x")


async def histstore_tables(engine: AsyncEngine) -> set[str]:
    async with engine.connect() as conn:
        names = await conn.run_sync(lambda c: c.dialect.get_table_names(c))
    return {n for n in names if n.startswith("histstore_")}


def _downgrade(conn: Connection) -> None:
    command.downgrade(alembic_config(conn), "base")


# ---------------------------------------------------------------- targets


@pytest.mark.parametrize("kind", ["str", "path", "url-str", "url-driver", "url-object"])
async def test_file_targets(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "chat.db"
    target: Any = {
        "str": str(path),
        "path": path,
        "url-str": f"sqlite:///{path}",
        "url-driver": f"sqlite+aiosqlite:///{path}",
        "url-object": URL.create("sqlite", database=str(path)),
    }[kind]
    async with histstore.connect(target) as store:
        assert isinstance(store, Store)
        assert store.engine.dialect.driver == "aiosqlite"
        await roundtrip(store)
    assert path.is_file()
    async with histstore.connect(path) as again:
        assert await again.count("c") == 1


@pytest.mark.parametrize("target", ["sqlite://", ":memory:", "sqlite+aiosqlite://"])
async def test_memory_targets_are_private_and_live_with_the_store(target: str) -> None:
    async with histstore.connect(target) as one, histstore.connect(target) as two:
        await roundtrip(one)
        await roundtrip(one)
        assert await two.count("c") == 0
        assert await two.conversations() == []
        assert await one.count("c") == 2


async def test_connect_is_awaitable_and_close_is_idempotent(tmp_path: Path) -> None:
    store = await histstore.connect(tmp_path / "a.db")
    await roundtrip(store)
    await store.close()
    await store.close()
    with pytest.raises(HistStoreError):
        await store.read("c")


async def test_context_manager_closes_the_store(tmp_path: Path) -> None:
    async with histstore.connect(tmp_path / "a.db") as store:
        await roundtrip(store)
    with pytest.raises(HistStoreError):
        await store.write("c", [Message.user("late")])
    async with histstore.connect(tmp_path / "a.db") as store:
        assert await store.count("c") == 1


async def test_borrowed_engine_is_left_open(tmp_path: Path) -> None:
    engine = create_async_engine(f"sqlite+aiosqlite:///{tmp_path / 'b.db'}")
    try:
        async with histstore.connect(engine) as store:
            assert store.engine is engine
            await roundtrip(store)
        store = await histstore.connect(engine)
        await roundtrip(store)
        await store.close()
        async with engine.connect() as conn:
            n = (await conn.execute(text("SELECT count(*) FROM histstore_messages"))).scalar()
        assert n == 2
    finally:
        await engine.dispose()


async def test_postgres_url_without_driver_means_asyncpg(pg_url: str) -> None:
    assert make_url(pg_url).drivername == "postgresql"
    for target in (pg_url, make_url(pg_url)):
        async with histstore.connect(target) as store:
            assert store.engine.dialect.driver == "asyncpg"
            await roundtrip(store, cid=f"pg-no-driver-{id(target)}")


async def test_environment_variable_names_the_database(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HISTSTORE_URL", f"sqlite:///{tmp_path / 'from-env.db'}")
    async with histstore.connect() as store:
        await roundtrip(store)
    assert not (tmp_path / "histstore.db").exists()
    async with histstore.connect(tmp_path / "from-env.db") as store:
        assert await store.count("c") == 1


async def test_default_is_histstore_db_in_the_current_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("HISTSTORE_URL", raising=False)
    async with histstore.connect() as store:
        await roundtrip(store)
    assert (tmp_path / "histstore.db").is_file()
    async with histstore.connect(tmp_path / "histstore.db") as store:
        assert await store.count("c") == 1


# ---------------------------------------------------------------- errors


@pytest.mark.parametrize("target", [123, 1.5, b"chat.db", ["chat.db"], object()], ids=stable_id)
async def test_bad_target_type_is_value_error(target: Any) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 - the contract says ValueError
        await histstore.connect(target)


@pytest.mark.parametrize("target", ["mysql://u@h/db", "oracle+cx_oracle://u@h/db"])
async def test_unsupported_database_is_value_error(target: str) -> None:
    with pytest.raises(ValueError, match=r"(?i)sqlite|postgres"):
        await histstore.connect(target)


@pytest.mark.parametrize(
    ("target", "right"),
    [
        ("postgresql+psycopg2://u@127.0.0.1/db", "postgresql+asyncpg://"),
        ("postgresql+nosuchdriver://u@127.0.0.1/db", "postgresql+asyncpg://"),
        ("sqlite+pysqlite://", "sqlite+aiosqlite://"),
    ],
)
async def test_another_driver_is_refused_naming_the_right_url(target: str, right: str) -> None:
    with pytest.raises(ValueError, match="runs") as info:
        await histstore.connect(target)
    assert right in str(info.value)
    assert "pip install" not in str(info.value)


async def test_missing_driver_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "asyncpg", None)  # as if the extra were not installed
    with pytest.raises(HistStoreError) as info:
        await histstore.connect("postgresql://u@127.0.0.1/db")
    assert "pip install 'histstore[postgres]'" in str(info.value)
    assert info.value.__cause__ is not None


async def test_an_aiosqlite_without_its_private_calls_still_works(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The one-trip program uses aiosqlite internals; without them (as the check finds
    when a future aiosqlite drops them) the store runs every statement through
    aiosqlite's public calls instead: slower, never broken."""
    monkeypatch.setattr(_sqlite_driver, "aiosqlite_one_trip", lambda: False)
    async with histstore.connect(tmp_path / "x.db") as store:
        assert not store.diagnostics().one_trip
        await store.write("c", [{"role": "user", "content": "hi"}])
        await store.write("c", [{"role": "user", "content": "hi"}], at=0)
        with pytest.raises(histstore.ConflictError):
            await store.write("c", [{"role": "user", "content": "other"}], at=0)
        await store.merge_metadata("c", {"k": 1})
        assert await store.list_append("c", "l", [1, 2]) == 2
        assert (await store.pop("c")) == histstore.Message.user("hi")
        assert await store.count("c") == 0


@pytest.mark.parametrize(
    "options",
    [
        {"durability": "disk"},
        {"busy_timeout": -1},
        {"max_batch": 0},
        {"max_message_bytes": 0},
        {"migrate": "yes"},
    ],
    ids=stable_id,
)
async def test_bad_options_are_value_errors(tmp_path: Path, options: dict[str, Any]) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 - the contract says ValueError
        await histstore.connect(tmp_path / "x.db", **options)
    assert not (tmp_path / "x.db").exists()


# ---------------------------------------------------------------- schema checks


@pytest.fixture(params=["sqlite-file", "sqlite-memory", "postgres"])
async def reopenable(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Any]:
    """A target that can be opened several times and starts with no schema."""
    if request.param == "sqlite-file":
        yield tmp_path / "reopen.db"
    elif request.param == "sqlite-memory":
        engine = create_async_engine("sqlite+aiosqlite://", poolclass=StaticPool)
        try:
            yield engine
        finally:
            await engine.dispose()
    else:
        request.getfixturevalue("pg_url")  # skips when there is no server
        async with empty_pg_database() as url:
            yield url


async def test_newer_schema_is_refused_on_every_backend(reopenable: Any) -> None:
    async with histstore.connect(reopenable, migrate=True) as store:
        await roundtrip(store)
        async with store.engine.begin() as conn:
            await conn.execute(
                text(f"UPDATE {VERSION_TABLE} SET version_num = :v"), {"v": NEWER_REVISION}
            )
    for migrate in (None, True):
        with pytest.raises(SchemaError) as info:
            await histstore.connect(reopenable, migrate=migrate)
        assert NEWER_REVISION in str(info.value)
    async with histstore.connect(reopenable, migrate=False) as store:
        assert await store.count("c") == 1
        async with store.engine.connect() as conn:
            version = (await conn.execute(text(f"SELECT version_num FROM {VERSION_TABLE}"))).all()
        assert version == [(NEWER_REVISION,)]


async def test_sqlite_creates_and_upgrades_its_schema(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    async with histstore.connect(path) as store:  # migrate=None: creates the schema
        await roundtrip(store)
        async with store.engine.begin() as conn:
            await conn.run_sync(_downgrade)
        assert await histstore_tables(store.engine) == {VERSION_TABLE}
    async with histstore.connect(path) as store:  # an outdated schema: upgraded
        await roundtrip(store)
        assert "histstore_messages" in await histstore_tables(store.engine)


async def test_sqlite_migrate_false_neither_creates_nor_checks(tmp_path: Path) -> None:
    path = tmp_path / "none.db"
    async with histstore.connect(path, migrate=False) as store:
        assert await histstore_tables(store.engine) == set()


async def test_postgres_schema_must_be_migrated(pg_url: str) -> None:
    async with empty_pg_database() as url:
        with pytest.raises(SchemaError, match="histstore migrate"):
            await histstore.connect(url)
        async with histstore.connect(url, migrate=False) as store:
            assert await histstore_tables(store.engine) == set()
        tables = await pg_fetch(url, "SELECT tablename FROM pg_tables WHERE schemaname='public'")
        assert tables == []
        async with histstore.connect(url, migrate=True) as store:
            await roundtrip(store)
        async with histstore.connect(url) as store:  # up to date: opens without migrate
            await roundtrip(store)
            async with store.engine.begin() as conn:
                await conn.run_sync(_downgrade)
        with pytest.raises(SchemaError, match="histstore migrate"):  # outdated
            await histstore.connect(url)
        async with histstore.connect(url, migrate=True) as store:
            await roundtrip(store)


async def test_schema_error_does_not_reveal_the_password(pg_url: str) -> None:
    async with empty_pg_database() as url:
        secret = make_url(url).set(password="hunter2-secret")
        with pytest.raises(SchemaError) as info:
            await histstore.connect(secret)  # trust auth ignores the password
        assert "hunter2-secret" not in str(info.value)


# ---------------------------------------------------------------- SQLite settings


async def _pragma(store: Store, name: str) -> Any:
    """A pragma on the connections the store uses, the same on both of its paths: the
    executor's driver connections, read by the driver as a statement that may wait (a
    call on the loop's thread leaves the busy timeout at 0 until one comes), and
    SQLAlchemy's (fails when they differ)."""
    driver = reach.driver(store)
    async with reach.next_connection(store) as conn:
        fast = (await driver.fetch(conn, driver.compile(text(f"PRAGMA {name}")), {}))[0][0]

    async def core(conn: Any) -> Any:
        return (await conn.exec_driver_sql(f"PRAGMA {name}")).scalar()

    general = await reach.core(store, core)
    assert fast == general
    return fast


async def test_sqlite_file_runs_in_wal_mode(tmp_path: Path) -> None:
    path = tmp_path / "wal.db"
    async with histstore.connect(path) as store:
        await roundtrip(store)
    raw = sqlite3.connect(path)
    try:
        assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        raw.close()


@pytest.mark.parametrize(("options", "expected"), [({}, 2), ({"durability": "process"}, 1)])
async def test_sqlite_synchronous_follows_durability(
    tmp_path: Path, options: dict[str, Any], expected: int
) -> None:
    async with histstore.connect(tmp_path / "sync.db", **options) as store:
        await roundtrip(store)
        assert await _pragma(store, "synchronous") == expected  # 2 = FULL, 1 = NORMAL


@pytest.mark.parametrize(("options", "expected"), [({}, 30_000), ({"busy_timeout": 0.5}, 500)])
async def test_sqlite_busy_timeout_is_set(
    tmp_path: Path, options: dict[str, Any], expected: int
) -> None:
    async with histstore.connect(tmp_path / "busy.db", **options) as store:
        await roundtrip(store)
        assert await _pragma(store, "busy_timeout") == expected


async def test_sqlite_commits_checkpoint_only_as_a_net(tmp_path: Path) -> None:
    async with histstore.connect(tmp_path / "net.db") as store:
        await roundtrip(store)
        assert await _pragma(store, "wal_autocheckpoint") == WAL_NET_PAGES
        assert await _pragma(store, "journal_size_limit") == WAL_LIMIT_BYTES


def _size(path: Path) -> int:
    return path.stat().st_size


async def test_sqlite_writes_are_checkpointed_in_the_background(tmp_path: Path) -> None:
    """Pages reach the database file though no commit checkpoints (the net is far)."""
    path = tmp_path / "ckpt.db"
    text_ = "x" * 3000
    async with histstore.connect(path, durability="process") as store:
        await roundtrip(store)
        start = _size(path)
        for i in range(300):  # several MB of WAL, well below the net
            await store.write(f"c{i % 20}", [Message.user(f"{i} {text_}")])
        await eventually(lambda: store.diagnostics().checkpoints == "idle", "the last checkpoint")
        assert _size(Path(f"{path}-wal")) < WAL_NET_PAGES * 4096
        assert _size(path) - start > 100_000  # no commit checkpoints below the net
        assert await store.count("c0") == 15


async def test_sqlite_write_gives_up_after_busy_timeout(tmp_path: Path) -> None:
    path = tmp_path / "locked.db"
    async with histstore.connect(path, busy_timeout=0.5) as store:
        await roundtrip(store)
        other = sqlite3.connect(path, isolation_level=None)
        try:
            other.execute("BEGIN IMMEDIATE")  # another writer holds the write lock
            assert await store.read("c") == [Message.user("x")]  # readers do not wait
            started = time.monotonic()
            with pytest.raises(WriteError) as info:
                await store.write("c", [Message.user("blocked")])
            elapsed = time.monotonic() - started
            assert 0.3 <= elapsed < 5
            assert info.value.outcome.accepted == 0
            assert info.value.outcome.uncertain is False
            assert info.value.idempotency_key
            assert is_database_error(info.value.__cause__)
            assert "blocked" not in str(info.value)
        finally:
            other.rollback()
            other.close()
        assert await store.count("c") == 1
        await roundtrip(store)
        assert await store.count("c") == 2


async def test_statements_are_compiled_once_per_process(tmp_path: Path) -> None:
    """Stores that connect() opens on the same kind of database share one set of compiled
    statements (opening a store costs no compilation after the first), and each works on
    its own database; a store on a caller's engine compiles its own."""
    async with (
        histstore.connect(tmp_path / "a.db") as a,
        histstore.connect(tmp_path / "b.db") as b,
    ):
        assert reach.statements(a) is reach.statements(b)
        assert reach.statements(a.scoped("u")) is reach.statements(b.scoped("u"))
        assert reach.statements(a) is not reach.statements(a.scoped("u"))
        await a.write("c", [Message.user("in a")])
        await b.write("c", [Message.user("in b"), Message.user("again")])
        assert [m.content for m in await a.read("c")] == ["in a"]
        assert [m.content for m in await b.read("c")] == ["in b", "again"]
        engine = create_async_engine(f"sqlite+aiosqlite:///{tmp_path / 'c.db'}")
        try:
            async with histstore.connect(engine, migrate=True) as c:
                assert reach.statements(c) is not reach.statements(a)
                await c.write("c", [Message.user("in c")])
                assert await c.count("c") == 1
        finally:
            await engine.dispose()
