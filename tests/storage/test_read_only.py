"""SPEC 14: ``connect(..., read_only=True)`` and the reading commands never change the
database, its schema included; a read-only store refuses every write with a typed
error; an SQLite file on a read-only filesystem can be opened and listed."""

from __future__ import annotations

import asyncio
import hashlib
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from helpers import PYTHON, empty_pg_database, subprocess_env, writing_as_before_listing
from sqlalchemy import text
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool

import histstore
from histstore import DatabaseFailure, SchemaError, WriteError
from histstore._storage.engine import resolve_target
from histstore._storage.migrations import alembic_config

OLDER = "c4e8a1f2d9b7"  # a revision before the newest
READING = (("ls",), ("show", "c"), ("stats",), ("export",), ("search", "hello"), ("log", "c"))


def _msgs(*texts: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": t} for t in texts]


async def test_a_read_only_store_reads_and_refuses_every_write(shared_backend: Any) -> None:
    async with shared_backend.connect() as store:
        await store.write("c", _msgs("hello", "world"))
        await store.merge_metadata("c", {"k": 1})
        async with shared_backend.connect(read_only=True) as ro:
            assert [m.content for m in await ro.read("c")] == ["hello", "world"]
            assert await ro.conversations() == ["c"]
            assert len(await ro.search("hello")) == 1
            assert [c.kind for c in await ro.changes("c")] == ["write"]
            assert await ro.metadata("c") == {"k": 1}
            conv = await ro.edit("c")

            with pytest.raises(WriteError, match="read_only") as caught:
                await ro.write("c", _msgs("no"))
            assert caught.value.outcome is not None
            assert caught.value.outcome.accepted == 0
            assert not caught.value.outcome.uncertain
            for refused in (
                ro.pop("c"),
                ro.clear("c"),
                ro.fork("c", "d"),
                ro.merge_metadata("c", {"k": 2}),
                ro.list_append("c", "l", [1]),
                ro.revert("c", 0, by="test"),
            ):
                with pytest.raises(DatabaseFailure, match="read_only=True"):
                    await refused
            conv.push({"role": "user", "content": "edited"})
            with pytest.raises(DatabaseFailure, match="read_only=True"):
                await ro.commit(conv)

            # Below the store, the database refuses writes on these connections too.
            with pytest.raises(DBAPIError, match=r"read-only|readonly"):
                async with ro.engine.begin() as conn:
                    await conn.execute(text("DELETE FROM histstore_leases"))

            # It reads what writers store meanwhile (SQLite: shared, not immutable).
            await store.write("c", _msgs("more"))
            assert await ro.count("c") == 3
        assert [m.content for m in await store.read("c")] == ["hello", "world", "more"]
        assert await store.metadata("c") == {"k": 1}
        assert not await store.exists("d")


async def test_read_only_options() -> None:
    with pytest.raises(ValueError, match="migrate=True"):
        histstore.connect("x.db", read_only=True, migrate=True)
    with pytest.raises(ValueError, match="read_only"):
        histstore.connect("x.db", read_only=1)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------- older schema


@pytest.fixture(params=["sqlite-file", "postgres"])
async def older_url(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    """A database at an older revision, holding conversation ``c``."""
    if request.param == "sqlite-file":
        url = f"sqlite:///{tmp_path / 'older.db'}"
        await _upgrade_to(url, OLDER)
        yield url
    else:
        request.getfixturevalue("pg_url")  # skips when there is no server
        async with empty_pg_database() as url:
            await _upgrade_to(url, OLDER)
            yield url


async def _upgrade_to(url: str, revision: str) -> None:
    engine = _engine(url)
    try:

        def run(conn: Connection) -> None:
            command.upgrade(alembic_config(conn), revision)

        async with engine.begin() as conn:
            await conn.run_sync(run)
        async with (
            writing_as_before_listing(engine),
            histstore.connect(url, migrate=False) as store,
        ):
            # A keyed write takes the general path, which that schema can run (Postgres's
            # common append lists its search runs in a table it lacks).
            await store.write("c", _msgs("hello"), idempotency_key="older")
    finally:
        await engine.dispose()


def _engine(url: str) -> AsyncEngine:
    resolved = resolve_target(url)
    assert not isinstance(resolved, AsyncEngine)
    return create_async_engine(resolved, poolclass=NullPool)


async def _state(url: str) -> tuple[str, str]:
    """The database's revision and, for a file, a digest of its bytes."""
    engine = _engine(url)
    try:
        async with engine.connect() as conn:
            revision = (
                await conn.execute(text("SELECT version_num FROM histstore_alembic_version"))
            ).scalar_one()
    finally:
        await engine.dispose()
    digest = ""
    if url.startswith("sqlite:///"):
        data = await asyncio.to_thread(Path(url.removeprefix("sqlite:///")).read_bytes)
        digest = hashlib.sha256(data).hexdigest()
    return revision, digest


async def _cli(*args: str) -> tuple[int, str]:
    env = {**subprocess_env(), "NO_COLOR": "1"}
    env.pop("HISTSTORE_URL", None)
    proc = await asyncio.create_subprocess_exec(
        PYTHON,
        "-m",
        "histstore",
        *args,
        env=env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout=300)
    assert proc.returncode is not None
    return proc.returncode, out.decode() + err.decode()


async def test_reading_never_upgrades_an_older_schema(older_url: str) -> None:
    before = await _state(older_url)
    assert before[0] == OLDER
    with pytest.raises(SchemaError, match=r"older than this version.*histstore migrate"):
        await histstore.connect(older_url, read_only=True)
    assert await _state(older_url) == before

    for args in READING:
        code, output = await _cli(*args, "--url", older_url)
        assert code == 1, output
        lines = output.splitlines()
        assert len(lines) == 1, output
        assert lines[0].startswith("histstore: error: "), output
        assert "histstore migrate" in lines[0], output
        assert await _state(older_url) == before, args

    if older_url.startswith("sqlite"):
        # Opened to write, the embedded default still upgrades a writable file.
        async with histstore.connect(older_url) as store:
            assert await store.count("c") == 1
        assert (await _state(older_url))[0] != OLDER
    else:
        with pytest.raises(SchemaError, match="histstore migrate"):
            await histstore.connect(older_url)


# ---------------------------------------------------------------------------- read-only filesystem


@pytest.fixture
def read_only_dir(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """A folder and a read-only bind mount of it (root may write anywhere else)."""
    source, mounted = tmp_path / "source", tmp_path / "mounted"
    source.mkdir()
    mounted.mkdir()
    steps = (
        ["mount", "--bind", str(source), str(mounted)],
        ["mount", "-o", "remount,bind,ro", str(mounted)],
    )
    done = 0
    try:
        for step in steps:
            result = subprocess.run(step, capture_output=True, text=True, check=False)
            if result.returncode != 0:
                pytest.skip(f"cannot make a read-only mount here: {result.stderr.strip()}")
            done += 1
        yield source, mounted
    finally:
        if done:
            subprocess.run(["umount", str(mounted)], check=False)


async def test_a_file_on_a_read_only_filesystem_is_read(
    read_only_dir: tuple[Path, Path],
) -> None:
    source, mounted = read_only_dir
    async with histstore.connect(source / "chat.db") as store:
        await store.write("c", _msgs("hello", "world"))
    with pytest.raises(OSError, match="Read-only file system"):
        (mounted / "probe").touch()
    path = mounted / "chat.db"
    assert not await asyncio.to_thread(Path(f"{path}-shm").exists)  # no WAL index to share

    async with histstore.connect(path, read_only=True) as ro:
        assert [m.content for m in await ro.read("c")] == ["hello", "world"]
        with pytest.raises(WriteError, match="read_only"):
            await ro.write("c", _msgs("no"))
    code, output = await _cli("ls", "--url", str(path))
    assert code == 0, output
    assert "c " in output
    code, output = await _cli("show", "c", "--url", str(path))
    assert code == 0, output
    assert "world" in output
