"""``Store.diagnostics()``: the states of a store's concurrency objects, read without
touching the database (docs/architecture.md has their tables), and the check that an
impossible move between them raises."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import reach
from conftest import Backend
from helpers import new_id, user_msgs
from waiting import eventually

import histstore
from histstore._storage.states import InvalidTransition
from histstore._storage.wal_checkpoints import WalCheckpoints


async def test_diagnostics_follow_the_writer_from_open_to_closed(backend: Backend) -> None:
    async with backend.connect() as store:
        now = store.diagnostics()
        assert isinstance(now, histstore.Diagnostics)
        assert now.backend == ("sqlite" if backend.name.startswith("sqlite") else "postgresql")
        file = backend.name == "sqlite-file"  # the one backend with a writer of its own
        assert (now.writer, now.writer_lifecycle) == (("idle", "open") if file else (None, None))
        # Only a SQLite file's store indexes in the background (Postgres's writes keep
        # its index; in memory, each search indexes the list).
        assert now.indexer == ("idle" if file else None)

        c = new_id()
        async with reach.holding_the_write_turn(store):
            writes = [asyncio.ensure_future(store.write(c, user_msgs(1))) for _ in range(5)]
            if file:
                # The transaction holds the writer; the writes queue behind it.
                await eventually(lambda: store.diagnostics().queued == 5, "five writers queued")
                now = store.diagnostics()
                assert (now.writer, now.waiting_for_turn) == ("running", 0)
        await asyncio.gather(*writes)
        now = store.diagnostics()
        assert now.queued == now.waiting_for_turn == 0
        if file:
            assert now.writer == "idle"
            assert now.group_sizes[-1:] == (5,)  # one group, once the transaction ended
            assert now.wal_pages
            assert now.checkpoints in ("idle", "armed", "running")
        else:
            assert (now.group_sizes, now.wal_pages, now.checkpoints) == ((), None, None)
    now = store.diagnostics()
    if file:
        assert (now.writer, now.writer_lifecycle, now.checkpoints) == ("idle", "closed", "stopped")
    assert now.indexer == ("closing" if file else None)
    assert now.idle_connections == 0


async def test_an_impossible_move_raises(tmp_path: Any) -> None:
    async with histstore.connect(tmp_path / "s.db") as store:
        writer = reach.executor(store).writer
        assert writer is not None
    # Closed: a job that comes now (a caller racing the close) is refused as the closed
    # store refuses calls; lending its connection with no job running is a bug of the
    # storage layer, and raises rather than hangs.
    with pytest.raises(histstore.HistStoreError, match="closed"):
        await writer.submit(iter(()), "writing", None)  # type: ignore[arg-type]
    with pytest.raises(histstore.HistStoreError, match="closed"):
        async with writer.turn("writing", None):
            pass
    with pytest.raises(InvalidTransition, match="writer"):
        writer.lend()
    await writer.stop()  # again, as after a cancelled close: no move
    await writer.close()
    assert (writer.lifecycle, writer.runner, writer.connection.state) == ("closed", "idle", "none")

    async def nothing() -> tuple[int, int]:
        return 0, 0

    checkpoints = WalCheckpoints(None, None, nothing)  # type: ignore[arg-type]
    checkpoints.stop()
    checkpoints.stop()  # stopping twice is no move
    with pytest.raises(InvalidTransition, match="checkpoints"):
        checkpoints._start()
