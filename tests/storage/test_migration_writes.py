"""Revision c2e4a6f8b0d1: SQLite keeps the write records WITHOUT ROWID, and the store
writes a short batch digest; records an older histstore wrote (64 hex digits) still
confirm a retried write, and a different batch under their key is still refused."""

from __future__ import annotations

import hashlib

import pytest
from helpers import alembic
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

import histstore
from histstore._core import codec

BEFORE = "a6d3f9c2e4b8"
RECORDS = (
    "SELECT conversation_id, key, position, count, digest, created_at, revision, appended"
    " FROM histstore_writes ORDER BY conversation_id, key"
)


def batch(word: str, n: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"{word} {i}"} for i in range(n)]


async def without_rowid(engine: AsyncEngine) -> bool | None:
    """Whether SQLite keeps the write records WITHOUT ROWID (``None``: PostgreSQL)."""
    if engine.dialect.name != "sqlite":
        return None
    async with engine.connect() as conn:
        sql = "SELECT sql FROM sqlite_schema WHERE name = 'histstore_writes'"
        made = (await conn.execute(text(sql))).scalar_one()
    return "WITHOUT ROWID" in made.upper()


async def records(engine: AsyncEngine) -> list[tuple[object, ...]]:
    async with engine.connect() as conn:
        return [tuple(r) for r in (await conn.execute(text(RECORDS))).all()]


async def as_older_histstore_wrote(engine: AsyncEngine, conversation: str, key: str) -> str:
    """Give the record of ``key`` the digest an older histstore stored (SHA-256 in hex
    over the batch's JSON texts, each after its length), from the stored messages."""
    async with engine.begin() as conn:
        position, count, short = (
            await conn.execute(
                text(
                    "SELECT position, count, digest FROM histstore_writes"
                    " WHERE conversation_id = :c AND key = :k"
                ),
                {"c": conversation, "k": key},
            )
        ).one()
        texts = (
            await conn.execute(
                text(
                    "SELECT data FROM histstore_messages WHERE conversation_id = :c"
                    " AND position >= :p AND position < :q ORDER BY position"
                ),
                {"c": conversation, "p": position, "q": position + count},
            )
        ).scalars()
        h = hashlib.sha256()
        for t in texts:
            raw = t.encode("utf-8")
            h.update(len(raw).to_bytes(8, "big"))
            h.update(raw)
        old = h.hexdigest()
        assert len(short) == 22
        assert codec.same_digest(old, short)
        await conn.execute(
            text("UPDATE histstore_writes SET digest = :d WHERE conversation_id = :c AND key = :k"),
            {"d": old, "c": conversation, "k": key},
        )
    return old


async def test_records_survive_both_ways_and_retries_stay_idempotent(
    engine: AsyncEngine, empty_url: str
) -> None:
    sqlite = engine.dialect.name == "sqlite"
    await alembic(engine, "upgrade", "head")
    async with histstore.connect(empty_url) as store:
        await store.write("a", batch("walrus", 3), idempotency_key="k1")
        await store.write("a", batch("gannet", 2), idempotency_key="k2")
        await store.write("b", batch("heron", 1))  # a key the store makes
    await alembic(engine, "downgrade", BEFORE)
    assert await without_rowid(engine) is (False if sqlite else None)
    old = await as_older_histstore_wrote(engine, "a", "k1")
    stored = await records(engine)
    assert len(stored) == 3

    await alembic(engine, "upgrade", "head")
    assert await without_rowid(engine) is (True if sqlite else None)
    assert await records(engine) == stored  # every column of every record, the old digest too
    assert old in [r[4] for r in stored]

    async with histstore.connect(empty_url) as store:
        # A retry across the upgrade (the record's hex digest) and one after it: confirmed.
        for key, again in (("k1", batch("walrus", 3)), ("k2", batch("gannet", 2))):
            outcome = await store.write("a", again, idempotency_key=key)
            assert (outcome.accepted, outcome.length) == (len(again), 5)
        # Another batch under a recorded key (of the same size, or not): refused.
        refused = [
            ("k1", [*batch("walrus", 2), {"role": "user", "content": "x"}]),
            ("k1", batch("walrus", 4)),
            ("k2", batch("gannet", 1)),
        ]
        for key, other in refused:
            with pytest.raises(histstore.ConflictError):
                await store.write("a", other, idempotency_key=key)
        await store.write("a", batch("tern", 1), idempotency_key="k3")
        assert [m.content for m in await store.read("a")] == [
            "walrus 0", "walrus 1", "walrus 2", "gannet 0", "gannet 1", "tern 0"
        ]  # fmt: skip
        log = await store.changes("a")
        assert [(c.kind, c.revision) for c in log] == [("write", 1), ("write", 2), ("write", 3)]
        assert [c.revision for c in await store.changes("a", since=2)] == [3]
        hits = await store.search("walrus", conversation="a", limit=10)
        assert sorted(h.position for h in hits) == [0, 1, 2]

    # Down again (the short digests stay) and up again.
    before = await records(engine)
    await alembic(engine, "downgrade", BEFORE)
    assert await records(engine) == before
    assert await without_rowid(engine) is (False if sqlite else None)
    await alembic(engine, "upgrade", "head")
    assert await records(engine) == before
    async with histstore.connect(empty_url) as store:
        outcome = await store.write("a", batch("tern", 1), idempotency_key="k3")
        assert (outcome.accepted, outcome.length) == (1, 6)


def test_a_digest_matches_its_older_hex_form_and_nothing_else() -> None:
    texts = ['{"role":"user","content":"walrus"}', '{"role":"user","content":"gannet"}']
    short = codec.digest(texts)
    h = hashlib.sha256()
    for t in texts:
        h.update(len(t.encode()).to_bytes(8, "big"))
        h.update(t.encode())
    assert len(short) == 22
    assert codec.same_digest(short, short)
    assert codec.same_digest(h.hexdigest(), short)
    other = codec.digest(texts[:1])
    assert not codec.same_digest(other, short)
    assert not codec.same_digest(hashlib.sha256(b"x").hexdigest(), short)
    assert not codec.same_digest("claimed", short)
    assert not codec.same_digest("z" * 64, short)  # not hex
