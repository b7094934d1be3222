"""SQLite files: new databases readable by their owner only, and ``backup`` (``histstore
backup``) taking a consistent, checked copy while other processes write (issue 38)."""

from __future__ import annotations

import asyncio
import itertools
import os
import sqlite3
import stat
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import pytest
from cli_runner import assert_one_line_error, ok, run
from helpers import PYTHON, subprocess_env
from waiting import eventually

import histstore
from histstore import HistStoreError, admin
from histstore._storage import sqlite_files


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def names(directory: Path, prefix: str = "") -> list[str]:
    """The names in ``directory`` that start with ``prefix``, sorted."""
    return sorted(p.name for p in directory.iterdir() if p.name.startswith(prefix))


@pytest.fixture
def usual_umask() -> Iterator[None]:
    """The umask most systems give a process (022: new files readable by everyone)."""
    before = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(before)


@pytest.mark.usefixtures("usual_umask")
async def test_a_new_database_and_its_wal_and_shm_are_private(tmp_path: Path) -> None:
    path = tmp_path / "chat.db"
    async with histstore.connect(path) as store:
        await store.write("c", [{"role": "user", "content": "personal"}])
        made = {name: mode(tmp_path / name) for name in names(tmp_path)}
    assert made == {"chat.db": 0o600, "chat.db-wal": 0o600, "chat.db-shm": 0o600}
    await ok("migrate", "--url", str(tmp_path / "cli.db"))
    assert mode(tmp_path / "cli.db") == 0o600


@pytest.mark.usefixtures("usual_umask")
async def test_an_existing_file_keeps_the_permissions_its_owner_gave_it(tmp_path: Path) -> None:
    path = tmp_path / "shared.db"
    path.touch()
    path.chmod(0o640)
    async with histstore.connect(path) as store:
        await store.write("c", [{"role": "user", "content": "hi"}])
    assert mode(path) == 0o640


WRITER = """
import asyncio, os, sys
import histstore

async def main(path, i, ready, stop):
    n = 0
    async with histstore.connect(path) as store:
        while not os.path.exists(stop):
            batch = [{"role": "user", "content": f"walrus{i} number {n + k}"} for k in range(3)]
            await store.write(f"writer-{i}", batch)
            n += 3
            if n == 30:
                open(ready, "w").close()
    print(n)

asyncio.run(main(sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]))
"""


def _messages_in(db: Path) -> int:
    """The messages ``db`` holds, read by a connection of its own."""
    with closing(sqlite3.connect(db)) as conn:
        return int(conn.execute("SELECT count(*) FROM histstore_messages").fetchone()[0])


async def check_copy(copy: Path, writers: int) -> list[int]:
    """Each writer's conversation in the copy: whole batches, in order, every message
    found by search. The lengths."""
    lengths = []
    async with histstore.connect(copy, read_only=True) as store:
        for i in range(writers):
            texts = [m.content for m in await store.read(f"writer-{i}")]
            assert len(texts) >= 30
            assert len(texts) % 3 == 0  # never part of a batch
            assert texts == [f"walrus{i} number {k}" for k in range(len(texts))]
            hits = await store.search(f"walrus{i}", limit=len(texts) + 10)
            assert len(hits) == len(texts)
            lengths.append(len(texts))
    return lengths


@pytest.mark.usefixtures("usual_umask")
async def test_backup_while_processes_write(tmp_path: Path) -> None:
    source = tmp_path / "live.db"
    async with histstore.connect(source):
        pass
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    stop = tmp_path / "stop"
    ready = [tmp_path / f"ready-{i}" for i in range(3)]
    procs = [
        await asyncio.create_subprocess_exec(
            PYTHON,
            str(script),
            str(source),
            str(i),
            str(ready[i]),
            str(stop),
            env=subprocess_env(),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        for i in range(3)
    ]
    copies = [tmp_path / f"copy-{n}.db" for n in range(3)]
    try:

        def all_ready() -> bool:
            assert all(p.returncode is None for p in procs), "a writer ended early"
            return all(r.exists() for r in ready)

        await eventually(all_ready, "every writer writing", within=60)
        first = await admin.backup(source, copies[0])
        said = await ok("backup", str(copies[1]), "--url", str(source))
        assert said.out.startswith("backed up 3 conversations (")
        assert f"to {copies[1]}, checked in " in said.out
        # The writers go on: the last copy is taken once the source holds more.
        copied = _messages_in(copies[1])
        await eventually(lambda: _messages_in(source) > copied, "the writers writing more")
        last = await admin.backup(f"sqlite:///{source}", copies[2])
    finally:
        stop.touch()
        outputs = [await asyncio.wait_for(p.communicate(), 120) for p in procs]
    assert all(p.returncode == 0 for p in procs), outputs
    written = [int(out) for out, _err in outputs]

    assert (first.path, first.conversations) == (copies[0], 3)
    assert first.bytes == copies[0].stat().st_size
    assert last.messages > first.messages
    seen = [await check_copy(copy, 3) for copy in copies]
    for before, after in itertools.pairwise(seen):
        assert all(a <= b for a, b in zip(before, after, strict=True))  # later copies hold more
    assert all(n <= total for n, total in zip(seen[-1], written, strict=True))
    assert sum(seen[0]) == first.messages
    for copy in copies:
        assert mode(copy) == 0o600
        assert names(tmp_path, f".{copy.name}") == []
        header = copy.read_bytes()[:20]
        assert header[18:20] == b"\x01\x01"  # rollback journal: one self-contained file
    async with histstore.connect(source) as store:
        assert [await store.count(f"writer-{i}") for i in range(3)] == written


async def test_backup_refuses_what_it_cannot_do(tmp_path: Path, pg_url: str) -> None:
    source = tmp_path / "chat.db"
    async with histstore.connect(source) as store:
        await store.write("c", [{"role": "user", "content": "hi"}])
    taken = tmp_path / "taken.db"
    taken.write_bytes(b"mine")
    with pytest.raises(HistStoreError, match="exists"):
        await admin.backup(source, taken)
    assert taken.read_bytes() == b"mine"
    with pytest.raises(HistStoreError, match="no SQLite database"):
        await admin.backup(tmp_path / "missing.db", tmp_path / "out.db")
    assert not (tmp_path / "missing.db").exists()
    with pytest.raises(HistStoreError, match="in-memory"):
        await admin.backup(":memory:", tmp_path / "out.db")
    with pytest.raises(HistStoreError, match="pg_dump") as refused:
        await admin.backup(pg_url, tmp_path / "out.db")
    assert "pg_restore" in str(refused.value)
    assert_one_line_error(await run("backup", str(tmp_path / "out.db"), "--url", pg_url), "pg_dump")
    assert_one_line_error(await run("backup", str(taken), "--url", str(source)), "exists")
    assert names(tmp_path) == ["chat.db", "taken.db"]


def test_the_check_finds_a_damaged_database(tmp_path: Path) -> None:
    path = tmp_path / "chat.db"
    asyncio.run(_messages(path, 300))
    with closing(sqlite3.connect(path)) as conn:
        assert sqlite_files.check(conn, "it") == (1, 300)
        page_size = conn.execute("PRAGMA page_size").fetchone()[0]
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
    data = bytearray(path.read_bytes())
    for page in range(2, pages):  # every page but the schema's: headers overwritten
        data[page * page_size : page * page_size + 12] = b"\xff" * 12
    path.write_bytes(bytes(data))
    with closing(sqlite3.connect(path)) as conn, pytest.raises(HistStoreError, match="it failed"):
        sqlite_files.check(conn, "it")


def test_a_copy_that_fails_its_check_is_not_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = tmp_path / "chat.db"
    asyncio.run(_messages(source, 1))

    def failing(conn: sqlite3.Connection, what: str) -> tuple[int, int]:
        raise HistStoreError(f"{what} failed its integrity check: page 3")

    monkeypatch.setattr(sqlite_files, "check", failing)
    with pytest.raises(HistStoreError, match="integrity check: page 3"):
        sqlite_files.backup(source, tmp_path / "copy.db", 5.0)
    assert names(tmp_path, "copy") == names(tmp_path, ".copy") == []


async def _messages(path: Path, n: int) -> None:
    async with histstore.connect(path) as store:
        await store.write("c", [{"role": "user", "content": f"message {i}"} for i in range(n)])
