"""Revision a6d3f9c2e4b8: PostgreSQL checks the messages' key per statement, so an edit
moves the rows after it in one UPDATE; nothing changes on SQLite."""

from __future__ import annotations

from typing import Any

import pytest
from helpers import alembic
from sqlalchemy import text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine

import histstore

BEFORE = "e5c3a9d7f2b4"
KEY_DEFERRABLE = "SELECT condeferrable FROM pg_constraint WHERE conname = 'pk_histstore_messages'"


async def deferrable(engine: AsyncEngine) -> bool | None:
    """Whether the messages' key is deferrable (PostgreSQL), ``None`` on SQLite."""
    if engine.dialect.name != "postgresql":
        return None
    async with engine.connect() as conn:
        return bool((await conn.execute(text(KEY_DEFERRABLE))).scalar_one())


async def test_upgrade_and_downgrade_keep_the_messages_and_moves_stay_right(
    engine: AsyncEngine, empty_url: str
) -> None:
    pg = engine.dialect.name == "postgresql"
    await alembic(engine, "upgrade", "head")
    async with histstore.connect(empty_url) as store:
        await store.write("a", [{"role": "user", "content": f"walrus {i}"} for i in range(30)])
    await alembic(engine, "downgrade", BEFORE)
    assert await deferrable(engine) is (False if pg else None)
    async with engine.connect() as conn:
        rows = (await conn.execute(text("SELECT count(*) FROM histstore_messages"))).scalar()
    assert rows == 30
    await alembic(engine, "upgrade", "head")
    assert await deferrable(engine) is (True if pg else None)

    async with histstore.connect(empty_url) as store:
        for start, stop, new in ((2, 4, 1), (0, 1, 3), (5, 5, 0), (1, 6, 2)):
            conv = await store.edit("a")
            before: list[Any] = [m.content for m in await store.read("a")]
            replacement = [histstore.Message.user(f"gannet {start} {k}") for k in range(new)]
            conv.splice(start, stop, replacement, by="test")
            await store.commit(conv)
            after = [m.content for m in await store.read("a")]
            assert after == before[:start] + [m.content for m in replacement] + before[stop:]
        hits = await store.search("walrus", limit=100)
        found = sorted(h.position for h in hits)
        stored = await store.read("a")
        assert found == [i for i, m in enumerate(stored) if str(m.content).startswith("walrus")]
        assert all(str(stored[h.position].content) == str(h.message.content) for h in hits)


async def test_a_duplicate_key_still_fails_its_statement(
    engine: AsyncEngine, empty_url: str
) -> None:
    await alembic(engine, "upgrade", "head")
    async with histstore.connect(empty_url) as store:
        await store.write("a", [{"role": "user", "content": "one"}])
    copy = text(
        "INSERT INTO histstore_messages (conversation_id, position, data, created_at, entry_id)"
        " SELECT conversation_id, position, data, created_at, entry_id + 1"
        " FROM histstore_messages"
    )
    with pytest.raises(IntegrityError):
        async with engine.begin() as conn:
            await conn.execute(copy)
    async with histstore.connect(empty_url) as store:
        assert [m.content for m in await store.read("a")] == ["one"]
