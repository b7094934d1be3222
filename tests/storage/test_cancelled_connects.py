"""A call cancelled while the store opens a new SQLite connection (as ``asyncio.run``
cancels a store's background checkpoint at its end) leaves that connection closed,
not to the garbage collector (Python 3.13 warns of each: an unclosed database)."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from helpers import new_id, user_msgs
from waiting import eventually

import histstore


async def test_a_call_cancelled_while_its_connection_opens_leaves_none_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "c.db"
    async with histstore.connect(path) as store:
        c = new_id()
        await store.write(c, user_msgs(1))
        opened: list[sqlite3.Connection] = []
        real = sqlite3.connect
        loop = asyncio.get_running_loop()

        def cancel_reads() -> None:
            for read in reads:
                read.cancel()

        def connect(*args: Any, **kwargs: Any) -> sqlite3.Connection:
            conn = real(*args, **kwargs)
            opened.append(conn)
            # On the connection's thread, once it is open: the readers are cancelled
            # before the loop hears that it is (the cancel is queued first).
            loop.call_soon_threadsafe(cancel_reads)
            return conn

        monkeypatch.setattr(sqlite3, "connect", connect)
        # More readers at once than the store keeps connections: it opens new ones.
        reads = [asyncio.ensure_future(store.read(c)) for _ in range(8)]
        await asyncio.gather(*reads, return_exceptions=True)
        monkeypatch.undo()
    assert opened

    def closed(conn: sqlite3.Connection) -> bool:
        try:
            conn.total_changes  # noqa: B018 - what raises once the connection is closed
        except sqlite3.ProgrammingError as exc:
            return "closed" in str(exc)
        return False

    try:
        await eventually(
            lambda: all(closed(conn) for conn in opened), "every connection closed", within=3
        )
    finally:
        for conn in opened:  # what the store left open, closed here (not at exit)
            with contextlib.suppress(sqlite3.ProgrammingError):
                conn.close()
