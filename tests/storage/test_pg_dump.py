"""docs/replicas-and-backups.md, PostgreSQL: a store in a schema of its own is dumped with
``pg_dump --format=custom --schema=...`` while it is in use and restored with
``pg_restore`` into another database, where histstore opens it as it was."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from helpers import empty_pg_database, new_id
from pg_cluster import find_bin

import histstore
from histstore import admin

pytestmark = pytest.mark.postgres

SCHEMA = "histstore"


async def tool(name: str, *args: str) -> None:
    program = find_bin(name)
    if program is None:
        pytest.skip(f"{name} is not installed")
    proc = await asyncio.create_subprocess_exec(
        program, *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await proc.communicate()
    assert proc.returncode == 0, (out, err)


async def test_pg_dump_and_pg_restore_carry_a_store(pg_url: str, tmp_path: Path) -> None:
    del pg_url  # only for its skip-or-fail check of the server
    dump = tmp_path / "histstore.dump"
    cid = new_id("dumped")
    async with empty_pg_database() as source, empty_pg_database() as target:
        async with histstore.connect(source, schema=SCHEMA, migrate=True) as store:
            await store.write(cid, [{"role": "user", "content": "a walrus to keep"}])
            await store.merge_metadata(cid, {"team": "blue"})
            # While the store is open (pg_dump reads one snapshot).
            await tool("pg_dump", "--format=custom", f"--schema={SCHEMA}", f"--file={dump}", source)
            await store.write(cid, [{"role": "user", "content": "after the dump"}])
        await tool("pg_restore", f"--dbname={target}", "--exit-on-error", str(dump))
        status = await admin.migration_status(target, schema=SCHEMA)
        assert status.up_to_date
        async with histstore.connect(target, schema=SCHEMA) as restored:
            assert [m.content for m in await restored.read(cid)] == ["a walrus to keep"]
            assert (await restored.load(cid)).metadata == {"team": "blue"}
            assert [h.conversation for h in await restored.search("walrus")] == [cid]
            await restored.write(cid, [{"role": "user", "content": "restored, written"}])
            assert await restored.count(cid) == 2
