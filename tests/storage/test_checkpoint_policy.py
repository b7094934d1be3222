"""When a store checkpoints its SQLite WAL in the background (``_storage.group_commit``):
once its writers pause with enough in the WAL, or, while writes go on without a pause,
once the WAL is large; never in the middle of a short burst of writes.

The group commit runs here over stand-ins for the database: each committed group adds
ten pages to a pretend WAL, which a checkpoint reports and the second one of a pair
empties, as SQLite's restart does."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Generator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from histstore._storage import group_commit
from histstore._storage.drivers import Phase, Program, Step
from histstore._storage.group_commit import GroupCommit

PAGES_PER_GROUP = 10
PAUSE = 0.2


class FakeDatabase:
    def __init__(self) -> None:
        self.wal = 0
        self.groups = 0
        self.started: list[int] = []  # groups committed when each pair started
        self.calls = 0

    @asynccontextmanager
    async def writing(self, action: str, conversation: str | None) -> AsyncIterator[None]:
        yield

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[None]:
        yield

    async def run_group(
        self, conn: Any, programs: list[Program[Any]], phase: Phase
    ) -> list[tuple[bool, Any]]:
        await asyncio.sleep(0)  # a trip to the connection's thread
        self.wal += PAGES_PER_GROUP * len(programs)
        self.groups += len(programs)
        return [(True, None)] * len(programs)

    async def checkpoint(self, conn: Any) -> tuple[int, int]:
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


async def _writes(group: GroupCommit, n: int) -> None:
    for _ in range(n):
        await group.submit(_program(), "writing", None)


async def test_checkpoints_wait_for_a_pause_or_a_large_wal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(group_commit, "IDLE_S", PAUSE)
    db = FakeDatabase()
    group = GroupCommit(db.writing, db.connection, db.run_group, db.checkpoint)
    idle_groups = int(group_commit.IDLE_PAGES / group_commit.FIRST_PAGES_PER_GROUP)

    # Too little to copy: no checkpoint, not even after a pause.
    await _writes(group, idle_groups - 1)
    await asyncio.sleep(PAUSE * 2)
    assert db.started == []

    # Enough to copy: none while the burst goes on, one once it pauses.
    await _writes(group, idle_groups)
    assert db.started == []
    await asyncio.sleep(PAUSE * 2)
    assert db.started == [2 * idle_groups - 1]

    # Writes without a pause: a checkpoint once the WAL holds about CHECKPOINT_PAGES
    # (a group's pages as the last checkpoint measured them), in the middle of it.
    large = group_commit.CHECKPOINT_PAGES // PAGES_PER_GROUP
    await _writes(group, large + 50)
    await asyncio.sleep(0)
    started = db.started
    assert len(started) == 2
    assert started[1] - started[0] == large

    # Closing: the armed pause starts nothing any more.
    await _writes(group, idle_groups)
    await group.wait_idle()
    await asyncio.sleep(PAUSE * 2)
    assert len(db.started) == 2
