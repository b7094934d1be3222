"""SPEC 14: an older histstore writing into a newer schema fails, saying the schema is
newer, and stores nothing; rows an older process stored before the guard existed (entry
id 0) are repaired by the upgrade, so every reading and editing path works on them.

"An older process" is played by the statements histstore sent before editable history
(revision c4e8a1f2d9b7): those of the first revision's schema and those of the revision
just before editable history (which adds ``search_text``), run as that code ran them.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from helpers import PYTHON, alembic, subprocess_env, writing_as_before_listing
from sqlalchemy import Table, column, delete, insert, select, table, text, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

import histstore
from histstore._storage import schema as _schema

NEWER = "schema is newer than this version of histstore"
BEFORE_GUARD = "c4e8a1f2d9b7"  # editable history, the revision before the guard
FIRST_COLUMNS = ("conversation_id", "position", "role", "data", "token_count", "created_at")
SEARCH_COLUMNS = (*FIRST_COLUMNS, "search_text")  # 0313065f7133, before editable history
OLD_CLEARED = ("histstore_vectors", "histstore_messages", "histstore_writes")
OLD_CLEARED += ("histstore_summaries", "histstore_metadata", "histstore_list_items")
OLD_CLEARED += ("histstore_lists",)


def _old(t: Table, names: Sequence[str]) -> Any:
    """``t`` as an older histstore knew it: only the columns it had then."""
    return table(t.name, *(column(n, t.c[n].type) for n in names))


def _upsert(dialect: str) -> Any:
    return (sqlite if dialect == "sqlite" else postgresql).insert


async def _old_append(
    conn: AsyncConnection,
    cid: str,
    texts: Sequence[str],
    *,
    columns: Sequence[str] = FIRST_COLUMNS,
    entry_id: int | None = None,
) -> None:
    """An older histstore's append: grow the conversation row (creating it), record the
    batch, insert the messages. ``entry_id``: also give that entry id (Postgres, where
    an older INSERT cannot store a row without one, to play what SQLite stored)."""
    now = datetime.now(timezone.utc)
    conv = _old(_schema.conversations, ("id", "owner", "length", "created_at", "updated_at"))
    ins = _upsert(conn.dialect.name)(conv).values(
        id=cid, owner=None, length=len(texts), created_at=now, updated_at=now
    )
    grown = ins.on_conflict_do_update(
        index_elements=["id"],
        set_={"length": conv.c.length + len(texts), "updated_at": now},
    ).returning(conv.c.length)
    length = (await conn.execute(grown)).scalar_one()
    start = length - len(texts)
    writes = _old(
        _schema.writes, ("conversation_id", "key", "position", "count", "digest", "created_at")
    )
    key = f"old-{start}"
    await conn.execute(
        insert(writes).values(
            conversation_id=cid,
            key=key,
            position=start,
            count=len(texts),
            digest="0" * 64,
            created_at=now,
        )
    )
    names = [*columns, *(["entry_id"] if entry_id is not None else [])]
    rows = []
    for i, t in enumerate(texts):
        data = json.dumps({"role": "user", "content": t})
        row = dict(zip(FIRST_COLUMNS, (cid, start + i, "user", data, None, now), strict=True))
        if "search_text" in columns:
            row["search_text"] = t
        if entry_id is not None:
            row["entry_id"] = entry_id
        rows.append(row)
    await conn.execute(insert(_old(_schema.messages, names)), rows)


async def _old_pop(conn: AsyncConnection, cid: str) -> None:
    """An older histstore's pop: shorten the conversation, then delete its last message."""
    c = _schema.conversations
    length = (
        await conn.execute(
            update(c).where(c.c.id == cid).values(length=c.c.length - 1).returning(c.c.length)
        )
    ).scalar_one()
    m = _schema.messages
    await conn.execute(delete(m).where(m.c.conversation_id == cid, m.c.position == length))


async def _old_clear(conn: AsyncConnection, cid: str) -> None:
    """An older histstore's clear: the tables it knew, then the conversation row."""
    for name in OLD_CLEARED:
        await conn.execute(text(f"DELETE FROM {name} WHERE conversation_id = :c"), {"c": cid})
    await conn.execute(text("DELETE FROM histstore_conversations WHERE id = :c"), {"c": cid})


async def _old_fork(conn: AsyncConnection, src: str, dst: str) -> None:
    """An older histstore's fork: the new row, then the messages copied by INSERT ... SELECT."""
    now = datetime.now(timezone.utc)
    c = _schema.conversations
    n = (await conn.execute(select(c.c.length).where(c.c.id == src))).scalar_one()
    conv = _old(c, ("id", "owner", "length", "created_at", "updated_at"))
    await conn.execute(
        insert(conv).values(id=dst, owner=None, length=n, created_at=now, updated_at=now)
    )
    cols = ", ".join(FIRST_COLUMNS[1:])
    await conn.execute(
        text(
            f"INSERT INTO histstore_messages (conversation_id, {cols})"
            f" SELECT :dst, {cols} FROM histstore_messages WHERE conversation_id = :src"
        ),
        {"dst": dst, "src": src},
    )


async def _refused(engine: AsyncEngine, work: Any) -> None:
    with pytest.raises(DBAPIError) as caught:
        async with engine.begin() as conn:
            await work(conn)
    assert NEWER in str(caught.value)


async def test_an_older_process_cannot_write_into_the_newer_schema(
    shared_backend: Any,
) -> None:
    async with shared_backend.connect() as store:
        await store.write("kept", [{"role": "user", "content": f"m{i}"} for i in range(3)])
        await store.pop("kept")  # a change record of its own (histstore_changes)
        await store.write("kept", [{"role": "user", "content": "m2"}])
        before = await store.edit("kept")
        log = await store.changes("kept")
        engine = store.engine

        for columns in (FIRST_COLUMNS, SEARCH_COLUMNS):
            for cid in ("kept", "fresh"):
                await _refused(
                    engine, lambda conn, c=cid, k=columns: _old_append(conn, c, ["x"], columns=k)
                )
        await _refused(engine, lambda conn: _old_fork(conn, "kept", "forked"))
        await _refused(engine, lambda conn: _old_pop(conn, "kept"))
        await _refused(engine, lambda conn: _old_clear(conn, "kept"))

        # Nothing the older process tried is stored; everything stored before is there.
        after = await store.edit("kept")
        assert after.entries == before.entries
        assert after.revision == before.revision
        assert await store.changes("kept") == log
        assert not await store.exists("fresh")
        assert not await store.exists("forked")
        assert [m.content for m in await store.read("kept")] == ["m0", "m1", "m2"]

        # histstore itself still does all of it.
        await store.write("kept", [{"role": "user", "content": "m3"}])
        await store.fork("kept", "forked")
        assert await store.pop("kept") is not None
        await store.clear("kept")
        assert await store.count("forked") == 4


async def _trigger_listed_append(conn: AsyncConnection, cid: str, texts: Sequence[str]) -> None:
    """An append of the histstore before a2f6c8e4d0b3, whose messages an INSERT trigger
    listed for the full-text index: a change record (revision, entry ids), no listing."""
    now = datetime.now(timezone.utc)
    c, n = _schema.conversations, len(texts)
    conv = _old(c, ("id", "owner", "length", "created_at", "updated_at", "revision", "next_entry"))
    ins = _upsert(conn.dialect.name)(conv).values(
        id=cid, owner=None, length=n, created_at=now, updated_at=now, revision=1, next_entry=n + 1
    )
    grown = ins.on_conflict_do_update(
        index_elements=["id"],
        set_={
            "length": conv.c.length + n,
            "revision": conv.c.revision + 1,
            "next_entry": conv.c.next_entry + n,
            "updated_at": now,
        },
    ).returning(conv.c.length, conv.c.next_entry, conv.c.revision)
    length, next_entry, revision = (await conn.execute(grown)).one()
    await conn.execute(
        insert(_schema.writes).values(
            conversation_id=cid,
            key=f"trigger-listed-{revision}",
            position=length - n,
            count=n,
            digest="0" * 64,
            created_at=now,
            revision=revision,
            appended=n,
        )
    )
    names = (*SEARCH_COLUMNS, "entry_id")
    rows = [
        dict(
            zip(
                names,
                (cid, length - n + i, "user", json.dumps({"role": "user", "content": t}), None,
                 now, t, next_entry - n + i),
                strict=True,
            )
        )
        for i, t in enumerate(texts)
    ]  # fmt: skip
    await conn.execute(insert(_old(_schema.messages, names)), rows)


async def test_a_histstore_whose_inserts_a_trigger_listed_cannot_write(
    shared_backend: Any,
) -> None:
    """Revision a2f6c8e4d0b3 (SQLite): writes list their own messages for search, and
    the INSERT trigger that listed them is gone, so the histstore of the revision before
    is refused, storing nothing. On PostgreSQL its statement trigger still lists such an
    insert: it is stored, and search finds it."""
    async with shared_backend.connect() as store:
        await store.write("kept", [{"role": "user", "content": f"m{i}"} for i in range(2)])
        engine = store.engine
        sqlite = engine.dialect.name == "sqlite"
        for cid in ("kept", "fresh"):
            work = lambda conn, c=cid: _trigger_listed_append(conn, c, ["gannet"])  # noqa: E731
            if sqlite:
                await _refused(engine, work)
            else:
                async with engine.begin() as conn:
                    await work(conn)
        found = sorted(h.conversation for h in await store.search("gannet"))
        assert found == ([] if sqlite else ["fresh", "kept"])
        assert await store.count("kept") == (2 if sqlite else 3)
        # histstore itself lists what it writes, on every path.
        await store.write("kept", [{"role": "user", "content": "gannet again"}])
        value = await store.edit("kept")
        value.splice(0, 1, [{"role": "user", "content": "petrel"}], by="test")
        await store.commit(value)
        await store.fork("kept", "forked")
        hits = sorted((h.conversation, h.message.content) for h in await store.search("petrel"))
        assert hits == [("forked", "petrel"), ("kept", "petrel")]
        await store.revert("kept", 1, by="test")
        assert [h.message.content for h in await store.search("m0", conversation="kept")] == ["m0"]


# ---------------------------------------------------------------------------- repair


async def _cli(*args: str) -> str:
    proc = await asyncio.create_subprocess_exec(
        PYTHON,
        "-m",
        "histstore",
        *args,
        env={**subprocess_env(), "NO_COLOR": "1"},
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout=300)
    assert proc.returncode == 0, err.decode()
    return out.decode()


async def test_upgrade_repairs_what_an_older_process_stored(
    engine: AsyncEngine, empty_url: str, tmp_path: Path
) -> None:
    """Before the guard, an older process stored messages with entry id 0 (on SQLite
    the column's default) and a clear that left change records behind. The upgrade
    numbers those messages, gives their conversations a log that builds them, drops
    the orphans; every path works on them; downgrading removes the guard."""
    await alembic(engine, "upgrade", BEFORE_GUARD)
    # Today's writes, as that revision's histstore made them.
    async with writing_as_before_listing(engine):
        await _before_guard_writes(empty_url)
    pg = engine.dialect.name == "postgresql"
    zero = 0 if pg else None  # Postgres refused an older INSERT outright (NOT NULL)
    async with engine.begin() as conn:
        await _old_append(conn, "c", ["o1", "o2"], entry_id=zero)
        await _old_append(conn, "c", ["o3"], columns=SEARCH_COLUMNS, entry_id=zero)
        await _old_append(conn, "o", ["p1", "p2"], entry_id=zero)
        await _old_clear(conn, "gone")  # its pop's change record stays behind
    async with histstore.connect(empty_url, migrate=False) as store:
        with pytest.raises(histstore.HistStoreError):
            await store.changes("c")  # what the older process left breaks the log

    await alembic(engine, "upgrade", "head")
    c_texts = ["n0", "n1", "o1", "o2", "o3"]
    async with histstore.connect(empty_url) as store:
        for cid, texts in {"c": c_texts, "o": ["p1", "p2"]}.items():
            await _numbered(store, cid, texts)
        assert [e.entry_id for e in (await store.edit("c")).entries][:2] == [1, 2]
        assert [m.content for m in await store.read("clean")] == ["fine"]
        assert await store.changes("gone") == []  # the orphaned record is gone
        await store.write("gone", [{"role": "user", "content": "again"}])
        assert [c.kind for c in await store.changes("gone")] == ["write"]

        assert await store.revert("c", 0, by="test") == 2
        assert await store.read("c") == []
        await store.revert("c", 1, by="test")
        assert [m.content for m in await store.read("c")] == c_texts
        await store.write("c", [{"role": "user", "content": "new"}])
        ids = [e.entry_id for e in (await store.edit("c")).entries]
        assert len(set(ids)) == 6
        log = await store.changes("c")

    assert "save" in await _cli("log", "c", "--url", empty_url)
    exported = tmp_path / "c.jsonl"
    await _cli("export", "--url", empty_url, "-o", str(exported))
    imported, copied = tmp_path / "imported.db", tmp_path / "copied.db"
    await _cli("import", str(exported), "--url", str(imported))
    await _cli("copy", empty_url, str(copied))
    for made in (imported, copied):
        async with histstore.connect(str(made)) as other:
            assert [m.content for m in await other.read("o")] == ["p1", "p2"]
            assert await other.changes("c") == log

    # Downgrading removes the guard: an older process's INSERT goes in again, and the
    # next upgrade repairs it as before.
    await alembic(engine, "downgrade", BEFORE_GUARD)
    async with engine.begin() as conn:
        await _old_append(conn, "o", ["p3"], entry_id=zero)
    await alembic(engine, "upgrade", "head")
    async with histstore.connect(empty_url) as store:
        await _numbered(store, "o", ["p1", "p2", "p3"])
        assert await store.changes("c") == log


async def _before_guard_writes(url: str) -> None:
    async with histstore.connect(url, migrate=False) as store:
        # Keyed writes take the general path, which that schema can run (Postgres's
        # common append lists its search runs in a table it lacks).
        await store.write(
            "c", [{"role": "user", "content": f"n{i}"} for i in range(3)], idempotency_key="k1"
        )
        await store.pop("c")
        await store.write("clean", [{"role": "user", "content": "fine"}], idempotency_key="k2")
        await store.write("gone", [{"role": "user", "content": "g"}], idempotency_key="k3")
        await store.pop("gone")


async def _numbered(store: histstore.Store, cid: str, texts: list[str]) -> None:
    """``cid`` holds ``texts`` under distinct entry ids, as one ``save`` at revision 1."""
    assert [m.content for m in await store.read(cid)] == texts
    conv = await store.edit(cid)
    ids = [e.entry_id for e in conv.entries]
    assert all(i is not None and i > 0 for i in ids)
    assert len(set(ids)) == len(ids)
    assert conv.revision == 1
    assert [c.kind for c in await store.changes(cid)] == ["save"]


# What older histstores' searches sent. Before e9a4c2f8b5d1 a search read the generated
# column ``search_vector`` of the message row (the statement is reduced to that part);
# from e9a4c2f8b5d1 to c8d2f4a6e1b9 a search, and an append, also read and wrote the
# pending list ``histstore_search_pending`` (renamed since).
OLDER_VECTOR_SEARCH = (
    "WITH query AS (SELECT plainto_tsquery('simple', 'walrus') AS q)"
    " SELECT histstore_messages.conversation_id, histstore_messages.position,"
    " ts_rank_cd(histstore_messages.search_vector, query.q) AS score"
    " FROM histstore_messages, query WHERE histstore_messages.search_vector @@ query.q"
    " ORDER BY score DESC LIMIT 10"
)
OLDER_LISTED_SEARCH = (
    "SELECT p.conversation_id, m.position FROM histstore_search_pending AS p"
    " JOIN histstore_messages AS m ON m.conversation_id = p.conversation_id"
    " AND m.entry_id BETWEEN p.first_entry AND p.last_entry"
)
OLDER_LISTING = (
    "INSERT INTO histstore_search_pending (conversation_id, first_entry, last_entry)"
    " VALUES ('older', 1, 1)"
)
# From e9a4c2f8b5d1 to 5b7e2d4a9c13 searches read the table of vectors, and appends
# listed their runs in a CTE of their own statement (both names are views since).
OLDER_TABLE_SEARCH = (
    "SELECT v.conversation_id, v.entry_id FROM histstore_search_vectors AS v"
    " WHERE v.vector @@ to_tsquery('simple', 'walrus')"
)
OLDER_RUN_LISTING = (
    "WITH runs AS (INSERT INTO histstore_search_listed (conversation_id, first_entry,"
    " last_entry) VALUES ('older', 1, 1)) SELECT 1"
)


@pytest.mark.postgres
async def test_an_older_search_fails_saying_the_schema_is_newer(pg_url: str) -> None:
    """Issue 38: it failed with the driver's ``UndefinedColumnError`` (revision
    d3a7f1c6b8e2 makes the names it reads raise the older-writer guards' message)."""
    async with histstore.connect(pg_url) as store:
        await store.write("older-search", [{"role": "user", "content": "a walrus"}])
        older = (OLDER_VECTOR_SEARCH, OLDER_LISTED_SEARCH, OLDER_LISTING)
        for sql in (*older, OLDER_TABLE_SEARCH, OLDER_RUN_LISTING):
            await _refused(store.engine, lambda conn, s=sql: conn.execute(text(s)))
        # histstore's own search, and everything else, go on.
        assert [h.conversation for h in await store.search("walrus")] == ["older-search"]
        await store.clear("older-search")
