"""The SQLite -wal file returns to a bounded size after a reader held a snapshot while
writes went on, with the store still open (docs/concurrency-and-durability.md, "A long
reader and the WAL")."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from waiting import settled

import histstore
from histstore import Message
from histstore._storage.engine import WAL_LIMIT_BYTES

pytestmark = pytest.mark.sqlite_file

BURST = 48
"""Messages of 1 MiB written while the reader holds its snapshot: past the limit."""


def _wal(path: Path) -> int:
    wal = Path(f"{path}-wal")
    return wal.stat().st_size if wal.exists() else 0


async def _until_bounded(path: Path, seconds: float) -> int:
    """The -wal file's size once it is within the limit, or after ``seconds`` (the file
    system gives no event to wait for: it is looked at as ``settled`` does)."""
    await settled(lambda: _wal(path) <= WAL_LIMIT_BYTES, True, within=seconds)
    return _wal(path)


async def _burst_under_a_reader(store: histstore.Store, path: Path) -> None:
    """Write ``BURST`` MiB while another connection holds a read snapshot, then end it."""
    await store.write("small", [Message.user("before the reader")])
    reader = sqlite3.connect(path, isolation_level=None)
    try:
        reader.execute("BEGIN")
        assert reader.execute("SELECT count(*) FROM histstore_messages").fetchone() == (1,)
        big = "y" * (1 << 20)
        for i in range(BURST):
            await store.write(f"big{i % 4}", [Message.user(f"{i} {big}")])
        # The reader kept every checkpoint from copying the burst: the WAL holds it all.
        assert _wal(path) > WAL_LIMIT_BYTES
    finally:
        reader.execute("COMMIT")
        reader.close()


async def test_wal_shrinks_after_the_reader_ends_with_no_further_write(tmp_path: Path) -> None:
    path = tmp_path / "idle.db"
    async with histstore.connect(path) as store:
        await _burst_under_a_reader(store, path)
        # No write follows: the store looks again by itself and truncates the file.
        assert await _until_bounded(path, 20) <= WAL_LIMIT_BYTES
        assert await store.count("big0") == BURST // 4
        assert [m.content for m in await store.read("small")] == ["before the reader"]


async def test_wal_shrinks_once_writes_go_on_after_the_reader(tmp_path: Path) -> None:
    path = tmp_path / "busy.db"
    async with histstore.connect(path) as store:
        await _burst_under_a_reader(store, path)
        for i in range(200):
            await store.write("after", [Message.user(f"after {i}")])
        assert await _until_bounded(path, 20) <= WAL_LIMIT_BYTES
        assert await store.count("after") == 200
        assert await store.count("big3") == BURST // 4
