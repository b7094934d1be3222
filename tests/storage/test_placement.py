"""PostgreSQL placement (SPEC 13): histstore's tables in a schema of their own, beside a
host application's Alembic, and under a role that may not create tables."""

from __future__ import annotations

import asyncio
import textwrap
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from helpers import (
    ALEMBIC,
    PYTHON,
    _pg_execute,
    empty_pg_database,
    pg_fetch,
    subprocess_env,
    user_msgs,
)
from sqlalchemy import make_url

import histstore
from histstore import ConflictError, SchemaError

pytestmark = pytest.mark.postgres


@pytest.fixture
async def empty_db(pg_url: str) -> AsyncIterator[str]:
    """A new Postgres database without histstore's schema (its URL, no driver name)."""
    async with empty_pg_database() as url:
        yield url


async def _tables(url: str, schema: str) -> set[str]:
    rows = await pg_fetch(
        url,
        f"SELECT tablename FROM pg_tables WHERE schemaname = '{schema}'",
    )
    return {r[0] for r in rows}


async def test_a_schema_holds_every_table_and_the_version_table(empty_db: str) -> None:
    async with histstore.connect(empty_db, schema="tenant_a", migrate=True) as store:
        assert store.schema == "tenant_a"
        c = "conv-1"
        await store.write(c, user_msgs(3))
        await store.write(c, user_msgs(1, "at"), at=3)
        await store.merge_metadata(c, {"k": 1})
        await store.list_append(c, "events", [1, 2])
        await store.fork(c, "conv-2", upto=2)
        assert [m.content for m in await store.read("conv-2")] == ["m-0", "m-1"]
        assert await store.metadata(c) == {"k": 1}
        assert (await store.load(c)).metadata == {"k": 1}
        assert await store.conversations() == ["conv-1", "conv-2"]
        async with store.lease(c, wait=False):
            assert await store.status(c) == "stepping"
        assert await store.pop(c) is not None
        await store.clear("conv-2")
    tables = await _tables(empty_db, "tenant_a")
    assert "histstore_messages" in tables
    assert "histstore_alembic_version" in tables
    assert not {t for t in await _tables(empty_db, "public") if t.startswith("histstore_")}


async def test_two_schemas_are_two_independent_stores(empty_db: str) -> None:
    async with (
        histstore.connect(empty_db, schema="tenant_a", migrate=True) as a,
        histstore.connect(empty_db, schema="tenant_b", migrate=True) as b,
    ):
        await a.write("same-id", user_msgs(2, "a"))
        await b.write("same-id", user_msgs(1, "b"))
        assert [m.content for m in await a.read("same-id")] == ["a-0", "a-1"]
        assert [m.content for m in await b.read("same-id")] == ["b-0"]
        # Leases are per schema too.
        async with a.lease("same-id", wait=False), b.lease("same-id", wait=False):
            with pytest.raises(ConflictError):
                async with a.lease("same-id", wait=False):
                    pass


async def test_an_unmigrated_schema_names_the_command(empty_db: str) -> None:
    with pytest.raises(SchemaError, match="--schema tenant_c"):
        await histstore.connect(empty_db, schema="tenant_c")


@pytest.mark.parametrize("bad", ["", "1abc", "a-b", 'a"b', "x" * 64, 5])
async def test_schema_names_are_checked(empty_db: str, bad: object) -> None:
    with pytest.raises(ValueError, match="schema"):
        await histstore.connect(empty_db, schema=bad)  # type: ignore[arg-type]


async def test_no_schema_on_sqlite(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="PostgreSQL"):
        await histstore.connect(tmp_path / "x.db", schema="tenant_a")


def _as(url: str, role: str) -> str:
    return make_url(url).set(username=role, password=None).render_as_string(hide_password=False)


async def test_a_role_without_create_is_told_who_must_migrate(empty_db: str) -> None:
    role = f"app_{uuid.uuid4().hex[:8]}"
    database = make_url(empty_db).database
    await _pg_execute(f'CREATE ROLE "{role}" LOGIN')
    try:
        await _pg_execute(
            "REVOKE CREATE ON SCHEMA public FROM PUBLIC;"
            f' REVOKE CREATE ON DATABASE "{database}" FROM PUBLIC',
            database,
        )
        for migrate in (None, True):
            with pytest.raises(SchemaError, match="as the database owner") as info:
                await histstore.connect(_as(empty_db, role), migrate=migrate)
            assert "histstore migrate --url" in str(info.value)
        # The owner migrates; a role that may only read and write then works.
        store = await histstore.connect(empty_db, migrate=True)
        await store.close()
        await _pg_execute(
            f'GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO "{role}"',
            database,
        )
        async with histstore.connect(_as(empty_db, role)) as store:
            await store.write("c", user_msgs(2))
            await store.merge_metadata("c", {"k": 1})
            async with store.lease("c", wait=False):
                pass
            assert await store.count("c") == 2
    finally:
        await _pg_execute(f'DROP OWNED BY "{role}"', database)
        await _pg_execute(f'DROP ROLE IF EXISTS "{role}"')


_HOST_ENV = textwrap.dedent(
    """
    import asyncio
    from alembic import context
    from sqlalchemy import Column, Integer, MetaData, Table
    from sqlalchemy.ext.asyncio import create_async_engine
    import histstore.alembic

    target_metadata = MetaData()
    Table("host_items", target_metadata, Column("id", Integer, primary_key=True))

    def run(connection):
        context.configure(
            connection=connection,
            target_metadata=target_metadata,
            include_name=histstore.alembic.include_name,
            include_object=histstore.alembic.include_object,
        )
        with context.begin_transaction():
            context.run_migrations()
        if not context.config.cmd_opts or context.config.cmd_opts.cmd[0].__name__ == "upgrade":
            histstore.alembic.upgrade(connection)

    async def main():
        engine = create_async_engine(context.config.get_main_option("sqlalchemy.url"))
        async with engine.begin() as conn:
            await conn.run_sync(run)
        await engine.dispose()

    asyncio.run(main())
    """
)

_HOST_REVISION = textwrap.dedent(
    """
    import sqlalchemy as sa
    from alembic import op

    revision = "host0001"
    down_revision = None

    def upgrade():
        op.create_table("host_items", sa.Column("id", sa.Integer, primary_key=True))

    def downgrade():
        op.drop_table("host_items")
    """
)


async def _alembic(cwd: Path, *args: str) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        str(ALEMBIC),
        *args,
        cwd=cwd,
        env=subprocess_env(),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), timeout=120)
    return int(proc.returncode or 0), out.decode(errors="replace")


async def test_the_host_runs_histstore_migrations_from_its_own_alembic(
    empty_db: str, tmp_path: Path
) -> None:
    """The README recipe: the host's env.py ignores histstore's objects in autogenerate
    and upgrades histstore with its own version table."""
    url = make_url(empty_db).set(drivername="postgresql+asyncpg")
    (tmp_path / "versions").mkdir()
    (tmp_path / "env.py").write_text(_HOST_ENV)
    (tmp_path / "versions" / "host0001.py").write_text(_HOST_REVISION)
    (tmp_path / "alembic.ini").write_text(
        "[alembic]\nscript_location = %(here)s\nsqlalchemy.url = "
        + url.render_as_string(hide_password=False).replace("%", "%%")
        + "\n"
    )
    code, out = await _alembic(tmp_path, "upgrade", "head")
    assert code == 0, out
    code, out = await _alembic(tmp_path, "check")
    assert code == 0, out  # histstore's tables are not the host's drift
    assert await pg_fetch(empty_db, "SELECT version_num FROM alembic_version") == [("host0001",)]
    async with histstore.connect(empty_db) as store:  # histstore's schema is current
        await store.write("c", user_msgs(1))


async def _histstore(*args: str) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        PYTHON,
        "-m",
        "histstore",
        *args,
        env=subprocess_env(),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), timeout=120)
    return int(proc.returncode or 0), out.decode(errors="replace")


async def test_the_command_line_places_tables_in_a_schema(empty_db: str) -> None:
    code, out = await _histstore("migrate", "--sql", "--url", empty_db, "--schema", "tenant_x")
    assert code == 0, out
    assert "WHERE nspname = 'tenant_x') THEN EXECUTE format('CREATE SCHEMA %I', 'tenant_x')" in out
    assert "tenant_x.histstore_alembic_version" in out
    assert await _tables(empty_db, "tenant_x") == set()  # --sql runs nothing
    code, out = await _histstore("migrate", "--url", empty_db, "--schema", "tenant_x")
    assert code == 0, out
    assert "histstore_messages" in await _tables(empty_db, "tenant_x")
    async with histstore.connect(empty_db, schema="tenant_x") as store:
        await store.write("c", user_msgs(2))
    code, out = await _histstore("ls", "-q", "--url", empty_db, "--schema", "tenant_x")
    assert (code, out.split()) == (0, ["c"])
    code, out = await _histstore("ls", "-q", "--url", empty_db)  # the default schema has none
    assert code == 1
    assert "histstore migrate" in out
