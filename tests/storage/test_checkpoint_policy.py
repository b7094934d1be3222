"""When a store checkpoints its SQLite WAL in the background (``_storage.wal_checkpoints``):
once its writers pause with enough in the WAL, or, while writes go on without a pause,
once the WAL is large; never in the middle of a short burst of writes. And when it
indexes the full-text index's pending list: after many groups, and when it closes.

The SQLite writer (``_storage.sqlite_writer``) runs here over stand-ins for the
database: each committed group adds ten pages to a pretend WAL, which a checkpoint
reports and the second one of a pair empties, as SQLite's restart does."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Generator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from waiting import eventually

from histstore._storage import search_index, wal_checkpoints
from histstore._storage.drivers import Phase, Program, Step
from histstore._storage.search_index import IndexScheduler
from histstore._storage.sqlite_writer import SqliteWriter

PAGES_PER_GROUP = 10
PAUSE = 0.2


class FakeDatabase:
    def __init__(self) -> None:
        self.wal = 0
        self.groups = 0
        self.started: list[int] = []  # groups committed when each pair started
        self.calls = 0

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[None]:
        yield

    async def run_group(
        self, conn: Any, programs: list[Program[Any]], phase: Phase, inline: bool = False
    ) -> list[tuple[bool, Any]]:
        await asyncio.sleep(0)  # a trip to the connection's thread
        self.wal += PAGES_PER_GROUP * len(programs)
        self.groups += len(programs)
        return [(True, None)] * len(programs)

    async def checkpoint(self, conn: Any, truncate: bool = False) -> tuple[int, int]:
        pages = self.wal
        self.calls += 1
        if self.calls % 2:
            self.started.append(self.groups)  # the first of the pair
        else:
            self.wal = 0  # the second, in the write turn: the next write restarts it
        return pages, pages


def _program() -> Generator[Step, Any, None]:
    return
    yield


def _writer(db: FakeDatabase) -> SqliteWriter:
    return SqliteWriter(db.connection, db.run_group, db.checkpoint, busy_timeout_s=5.0)


async def _writes(group: SqliteWriter, n: int) -> None:
    for _ in range(n):
        await group.submit(_program(), "writing", None)


async def test_checkpoints_wait_for_a_pause_or_a_large_wal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(wal_checkpoints, "IDLE_S", PAUSE)
    db = FakeDatabase()
    group = _writer(db)
    idle_groups = int(wal_checkpoints.IDLE_PAGES / wal_checkpoints.FIRST_PAGES_PER_GROUP)

    # Too little to copy: no checkpoint, not even after a pause.
    await _writes(group, idle_groups - 1)
    await asyncio.sleep(PAUSE * 2)
    assert db.started == []

    # Enough to copy: none while the burst goes on, one once it pauses.
    await _writes(group, idle_groups)
    assert db.started == []
    await eventually(lambda: db.started != [], "a checkpoint started")
    assert db.started == [2 * idle_groups - 1]
    await eventually(lambda: group.checkpoints.state == "idle", "the checkpoints idle")

    # Writes without a pause: a checkpoint once the WAL holds about CHECKPOINT_PAGES
    # (a group's pages as the last checkpoint measured them), in the middle of it.
    large = wal_checkpoints.CHECKPOINT_PAGES // PAGES_PER_GROUP
    await _writes(group, large + 50)
    await asyncio.sleep(0)
    started = db.started
    assert len(started) == 2
    assert started[1] - started[0] == large

    # Closing: the armed pause starts nothing any more.
    await _writes(group, idle_groups)
    await group.stop()
    await group.close()
    assert group.checkpoints.state == "stopped"
    await asyncio.sleep(PAUSE * 2)
    assert len(db.started) == 2


class FakeList(FakeDatabase):
    """Also a pretend pending list of the full-text index: each write lists one message;
    an indexer run takes up to ``CHUNK`` of them off and says whether more are left."""

    CHUNK = 100

    def __init__(self) -> None:
        super().__init__()
        self.listed = 0
        self.runs = 0

    async def run_group(
        self, conn: Any, programs: list[Program[Any]], phase: Phase, inline: bool = False
    ) -> list[tuple[bool, Any]]:
        await asyncio.sleep(0)
        out: list[tuple[bool, Any]] = []
        for program in programs:
            try:
                next(program)
            except StopIteration as done:
                out.append((True, done.value))
        return out

    def write(self) -> Generator[Step, Any, None]:
        self.listed += 1
        return
        yield

    def index(self) -> Generator[Step, Any, bool]:
        self.runs += 1
        self.listed -= min(self.listed, self.CHUNK)
        return self.listed > 0
        yield


async def test_the_pending_list_is_indexed_after_many_groups_and_at_close(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(wal_checkpoints, "IDLE_S", PAUSE)
    db = FakeList()
    group = _writer(db)

    async def index(program: Program[bool]) -> bool:
        return await group.submit(program, "indexing", None, indexing=True)

    indexer = group.indexer = IndexScheduler(db.index, index, search_index.INDEX_GROUPS)

    async def writes(n: int) -> None:
        for _ in range(n):
            await group.submit(db.write(), "writing", None)

    # Writes: nothing indexed while fewer than INDEX_GROUPS groups committed, not even
    # in a pause; a run once that many did, in the middle of the writes (a chunk each,
    # the writers' groups between them).
    await writes(search_index.INDEX_GROUPS - 1)
    await asyncio.sleep(PAUSE * 2)
    assert (db.runs, db.listed) == (0, search_index.INDEX_GROUPS - 1)
    await writes(21)
    assert db.runs > 1
    assert db.listed <= 21
    # The indexer's own commits are no reason to run it again.
    runs = db.runs
    await asyncio.sleep(PAUSE * 2)
    assert db.runs == runs

    # Closing: what is listed is indexed, a chunk per run, to the end of the list
    # (here also what a transaction outside the groups listed).
    runs = db.runs
    db.listed += 3 * FakeList.CHUNK
    group.note_listed()
    await group.stop()
    await indexer.close()
    await group.close()
    assert db.listed == 0
    assert db.runs - runs >= 3


async def test_a_bulk_load_is_indexed_by_the_messages_it_lists(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A few commits listing many messages each start a run once they listed a chunk's
    worth, long before ``INDEX_GROUPS`` commits: a bulk load leaves ``close`` little."""
    monkeypatch.setattr(wal_checkpoints, "IDLE_S", PAUSE)
    db = FakeList()
    group = _writer(db)

    async def index(program: Program[bool]) -> bool:
        return await group.submit(program, "indexing", None, indexing=True)

    indexer = group.indexer = IndexScheduler(
        db.index, index, search_index.INDEX_GROUPS, messages=1_000
    )
    # Each write says it lists 300 messages: three stay below the chunk, the fourth
    # crosses it and a run indexes the list in the background.
    for _ in range(3):
        await group.submit(db.write(), "writing", None, lists=300)
    await asyncio.sleep(PAUSE * 2)
    assert db.runs == 0
    await group.submit(db.write(), "writing", None, lists=300)
    await eventually(lambda: db.runs >= 1 and db.listed == 0, "a run after a chunk's worth")
    await group.stop()
    await indexer.close()
    await group.close()
