"""The SQLite writer's one queue (``_storage.sqlite_writer``): programs and turns (a
``transaction()``, Core writes, a checkpoint's step) wait in it together, first come
first served, each for at most the busy timeout; a free writer is taken at once.

The writer runs here over a stand-in for the database, as in test_checkpoint_policy.py."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Generator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from waiting import eventually

from histstore._storage.dberrors import DatabaseFailure
from histstore._storage.drivers import Phase, Program, Step
from histstore._storage.sqlite_writer import SqliteWriter


class FakeDatabase:
    def __init__(self, log: list[str]) -> None:
        self.log = log

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[None]:
        yield

    async def run_group(
        self, conn: Any, programs: list[Program[Any]], phase: Phase, inline: bool = False
    ) -> list[tuple[bool, Any]]:
        await asyncio.sleep(0)  # a trip to the connection's thread
        outcomes: list[tuple[bool, Any]] = []
        for program in programs:
            try:
                next(program)
            except StopIteration as stop:
                outcomes.append((True, stop.value))
        return outcomes

    async def checkpoint(self, conn: Any, truncate: bool = False) -> tuple[int, int]:
        return 0, 0


def _program(log: list[str], name: str) -> Generator[Step, Any, str]:
    log.append(name)
    return name
    yield


def _writer(log: list[str], busy_timeout_s: float = 5.0) -> SqliteWriter:
    db = FakeDatabase(log)
    return SqliteWriter(db.connection, db.run_group, db.checkpoint, busy_timeout_s=busy_timeout_s)


def _state(writer: SqliteWriter) -> tuple[str, int, int]:
    """The runner, programs queued, turns queued (what ``Store.diagnostics()`` says)."""
    return writer.runner, writer.queued, writer.waiting_for_turn


async def test_a_free_writer_gives_its_turn_without_suspending() -> None:
    writer = _writer([])
    turn = writer.turn("hold", None)
    step = turn.__aenter__()
    # Runs to its end in one step: no task, no timer, no wait.
    with pytest.raises(StopIteration):
        step.send(None)
    assert _state(writer) == ("running", 0, 0)
    await turn.__aexit__(None, None, None)
    assert _state(writer) == ("idle", 0, 0)


async def test_programs_and_turns_go_in_the_order_they_came() -> None:
    log: list[str] = []
    writer = _writer(log)

    async def turn(name: str) -> None:
        async with writer.turn(name, None):
            log.append(name)
            await asyncio.sleep(0)

    async with writer.turn("first", None):
        jobs = [
            asyncio.ensure_future(writer.submit(_program(log, "a"), "w", None)),
            asyncio.ensure_future(turn("T")),
            asyncio.ensure_future(writer.submit(_program(log, "b"), "w", None)),
            asyncio.ensure_future(writer.submit(_program(log, "c"), "w", None)),
        ]
        await eventually(lambda: _state(writer) == ("running", 3, 1), "all queued")
        assert log == []
    assert await asyncio.gather(*jobs) == ["a", None, "b", "c"]
    assert log == ["a", "T", "b", "c"]
    assert list(writer.sizes) == [1, 2]  # a turn ends a group: b and c went together


async def test_a_turn_waiting_past_the_busy_timeout_fails_and_leaves_the_queue() -> None:
    log: list[str] = []
    writer = _writer(log, busy_timeout_s=0.05)
    async with writer.turn("hold", None):
        with pytest.raises(DatabaseFailure, match="locked"):
            async with writer.turn("late", None):
                pass
        with pytest.raises(DatabaseFailure, match="locked"):
            await writer.submit(_program(log, "late"), "w", None)
        assert _state(writer) == ("running", 0, 0)
    assert log == []
    async with writer.turn("again", None):  # taken at once: the timed-out jobs are gone
        assert _state(writer) == ("running", 0, 0)
    assert await writer.submit(_program(log, "now"), "w", None) == "now"


async def test_a_turn_cancelled_while_waiting_leaves_the_queue() -> None:
    log: list[str] = []
    writer = _writer(log)

    async def turn() -> None:
        async with writer.turn("cancelled", None):
            log.append("T")

    async with writer.turn("hold", None):
        task = asyncio.ensure_future(turn())
        await eventually(lambda: _state(writer) == ("running", 0, 1), "queued")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert _state(writer) == ("running", 0, 0)
    assert await writer.submit(_program(log, "a"), "w", None) == "a"
    assert log == ["a"]
