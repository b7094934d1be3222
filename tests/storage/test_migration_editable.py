"""Revision c4e8a1f2d9b7 (editable history) over a database holding data at 0313065f7133.

The data is written as histstore stored it at that revision: Core statements on tables
that describe that revision's columns, not histstore's current code. The upgrade, a
downgrade and a second upgrade are checked through SQL, then the upgraded store is
read through the public API.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

from helpers import alembic
from sqlalchemy import (
    BigInteger,
    Column,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    insert,
    inspect,
    select,
    text,
)
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

import histstore
from histstore import Summary
from histstore._core import codec as _codec
from histstore._storage.schema import UTCDateTime

PREVIOUS = "0313065f7133"
HEAD = "head"  # c4e8a1f2d9b7 and the revisions after it
NEW_TABLES = {"histstore_changes", "histstore_asides", "histstore_turns"}
NEW_COLUMNS = {
    "histstore_conversations": {"revision", "next_entry", "next_aside", "halted"},
    "histstore_messages": {"entry_id", "author"},
    "histstore_writes": {"revision", "appended"},
}
AUTHORED = "ix_histstore_messages_authored"
BULK = 600  # small conversations: more than one batch of the upgrade's (500)

# The tables as revision 0313065f7133 left them: only the columns it knew.
_old = MetaData()
OLD = {
    t.name: t
    for t in (
        Table(
            "histstore_conversations",
            _old,
            Column("id", String(255), primary_key=True),
            Column("owner", String(255)),
            Column("system_prompt", Text),
            Column("length", BigInteger),
            Column("created_at", UTCDateTime),
            Column("updated_at", UTCDateTime),
        ),
        Table(
            "histstore_messages",
            _old,
            Column("conversation_id", String(255), primary_key=True),
            Column("position", BigInteger, primary_key=True),
            Column("role", Text),
            Column("data", Text),
            Column("token_count", Integer),
            Column("created_at", UTCDateTime),
            Column("search_text", Text),
        ),
        Table(
            "histstore_writes",
            _old,
            Column("conversation_id", String(255), primary_key=True),
            Column("key", String(255), primary_key=True),
            Column("position", BigInteger),
            Column("count", Integer),
            Column("digest", String(64)),
            Column("created_at", UTCDateTime),
        ),
        Table(
            "histstore_summaries",
            _old,
            Column("conversation_id", String(255), primary_key=True),
            Column("seq", Integer, primary_key=True),
            Column("start", BigInteger),
            Column("end", BigInteger),
            Column("content", Text),
            Column("token_count", Integer),
            Column("created_at", UTCDateTime),
        ),
        Table(
            "histstore_metadata",
            _old,
            Column("conversation_id", String(255), primary_key=True),
            Column("key", Text),
            Column("key_digest", String(64), primary_key=True),
            Column("value", Text),
            Column("digest", String(64)),
        ),
        Table(
            "histstore_lists",
            _old,
            Column("conversation_id", String(255), primary_key=True),
            Column("name", String(255), primary_key=True),
            Column("length", BigInteger),
        ),
        Table(
            "histstore_list_items",
            _old,
            Column("conversation_id", String(255), primary_key=True),
            Column("name", String(255), primary_key=True),
            Column("idx", BigInteger, primary_key=True),
            Column("value", Text),
            Column("blob", LargeBinary),
        ),
    )
}

# The columns this revision adds, read back after the upgrade.
_new = MetaData()
NEW_CONVERSATIONS = Table(
    "histstore_conversations",
    _new,
    Column("id", String(255), primary_key=True),
    Column("revision", BigInteger),
    Column("next_entry", BigInteger),
    Column("next_aside", BigInteger),
    Column("halted", Text),
)
NEW_MESSAGES = Table(
    "histstore_messages",
    _new,
    Column("conversation_id", String(255), primary_key=True),
    Column("position", BigInteger, primary_key=True),
    Column("entry_id", BigInteger),
    Column("author", Text),
)
NEW_WRITES = Table(
    "histstore_writes",
    _new,
    Column("conversation_id", String(255), primary_key=True),
    Column("key", String(255), primary_key=True),
    Column("revision", BigInteger),
    Column("appended", Integer),
)
CHANGES = Table(
    "histstore_changes",
    _new,
    Column("conversation_id", String(255), primary_key=True),
    Column("revision", BigInteger, primary_key=True),
    Column("kind", Text),
    Column("author", Text),
    Column("at", UTCDateTime),
    Column("record", Text),
)

T0 = datetime(2026, 3, 1, 12, 0, 0, 123456, tzinfo=timezone.utc)


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


@dataclass
class Conv:
    """One conversation as stored at 0313065f7133, and what the upgrade makes of it."""

    id: str
    messages: list[dict[str, Any]]
    updated_at: datetime
    # Write records: (key, position, count, made at); inserted in another order.
    writes: list[tuple[str, int, int, datetime]] = field(default_factory=list)
    revision: int = 0  # the conversation's revision after the upgrade
    # Key -> (revision, appended) after the upgrade; keys left out stay (None, None).
    numbered: dict[str, tuple[int, int]] = field(default_factory=dict)

    @property
    def saved(self) -> bool:
        """Whether the upgrade gives it one "save" change record."""
        return self.revision == 1 and not self.numbered

    @property
    def messages_range(self) -> range:
        return range(len(self.messages))

    def times(self) -> list[datetime]:
        """The messages' ``created_at``, a minute apart."""
        return [T0 + timedelta(minutes=p, microseconds=len(self.id)) for p in self.messages_range]


def _messages(cid: str, n: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for p in range(n):
        if p % 2:
            out.append({"role": "assistant", "content": [{"type": "text", "text": f"{cid} {p}"}]})
        else:
            out.append({"role": "user", "content": f"walrus {cid} {p}" if p % 4 == 0 else str(p)})
    return out


def _seconds(n: int) -> datetime:
    return T0 + timedelta(seconds=n, microseconds=7)


def _conversations() -> list[Conv]:
    convs = [
        # Three batches written one after the other: its history, as it was made.
        Conv(
            "tiled",
            _messages("tiled", 6),
            _seconds(100),
            writes=[
                ("w-z", 0, 2, _seconds(1)),
                ("w-a", 2, 3, _seconds(2)),
                ("w-m", 5, 1, _seconds(3)),
            ],
            revision=3,
            numbered={"w-z": (1, 2), "w-a": (2, 3), "w-m": (3, 1)},
        ),
        # Five messages written, the last one popped.
        Conv(
            "popped",
            _messages("popped", 4),
            _seconds(200),
            writes=[("p-1", 0, 3, _seconds(1)), ("p-2", 3, 2, _seconds(2))],
            revision=1,
        ),
        # Saved (or imported): messages, no write records.
        Conv("saved", _messages("saved", 3), _seconds(300), revision=1),
        # Only metadata: no message, so no change either.
        Conv("meta-only", [], _seconds(400)),
        # An empty batch in between stored nothing: it is no change record.
        Conv(
            "empty-batch",
            _messages("empty-batch", 3),
            _seconds(500),
            writes=[
                ("e-1", 0, 2, _seconds(1)),
                ("e-2", 2, 0, _seconds(2)),
                ("e-3", 2, 1, _seconds(3)),
            ],
            revision=2,
            numbered={"e-1": (1, 2), "e-3": (2, 1)},
        ),
        # 2,500 messages in 25 batches, their keys in no particular order.
        Conv(
            "big",
            _messages("big", 2500),
            _seconds(600),
            writes=[(f"b-{(i * 7) % 25:02d}", i * 100, 100, _seconds(i)) for i in range(25)],
            revision=25,
            numbered={f"b-{(i * 7) % 25:02d}": (i + 1, 100) for i in range(25)},
        ),
    ]
    for i in range(BULK):
        cid = f"bulk-{i:04d}"
        if i % 3:
            convs.append(
                Conv(
                    cid,
                    _messages(cid, 1),
                    _seconds(1000 + i),
                    writes=[(f"k{i}", 0, 1, _seconds(i))],
                    revision=1,
                    numbered={f"k{i}": (1, 1)},
                )
            )
        else:
            convs.append(Conv(cid, _messages(cid, 2), _seconds(1000 + i), revision=1))
    return convs


METADATA: dict[str, dict[str, Any]] = {
    "tiled": {"topic": "seals", "n": [1, 2]},
    "meta-only": {"only": True, "ü\x00": [None]},
}
SUMMARIES: dict[str, list[Summary]] = {
    "tiled": [
        Summary(0, 1, "the first two", token_count=5, created_at=_seconds(10)),
        Summary(0, 4, {"text": "most of it"}, token_count=None, created_at=_seconds(11)),
    ]
}
LISTS: dict[tuple[str, str], list[Any]] = {("saved", "notes"): [{"a": 1}, b"\x00raw\xff", "third"]}


async def _seed(engine: AsyncEngine) -> list[Conv]:
    """A database at 0313065f7133 holding the conversations of ``_conversations``."""
    await alembic(engine, "upgrade", PREVIOUS)
    convs = _conversations()
    messages, writes = [], []
    for conv in convs:
        for p, (m, at) in enumerate(zip(conv.messages, conv.times(), strict=True)):
            content = m["content"]
            searched = content if isinstance(content, str) else content[0]["text"]
            messages.append(
                {
                    "conversation_id": conv.id,
                    "position": p,
                    "role": m["role"],
                    "data": _json(m),
                    "token_count": p if p % 3 else None,
                    "created_at": at,
                    "search_text": searched,
                }
            )
        for key, position, count, at in reversed(conv.writes):
            digest = f"{len(key):064x}"
            writes.append(
                {
                    "conversation_id": conv.id,
                    "key": key,
                    "position": position,
                    "count": count,
                    "digest": digest,
                    "created_at": at,
                }
            )
    async with engine.begin() as conn:
        await conn.execute(
            insert(OLD["histstore_conversations"]),
            [
                {
                    "id": c.id,
                    "owner": "ann" if c.id == "tiled" else None,
                    "system_prompt": "be brief" if c.id == "saved" else None,
                    "length": len(c.messages),
                    "created_at": T0,
                    "updated_at": c.updated_at,
                }
                for c in convs
            ],
        )
        await conn.execute(insert(OLD["histstore_messages"]), messages)
        await conn.execute(insert(OLD["histstore_writes"]), writes)
        await conn.execute(
            insert(OLD["histstore_summaries"]),
            [
                {
                    "conversation_id": cid,
                    "seq": seq,
                    "start": s.start,
                    "end": s.end,
                    "content": _json(s.content),
                    "token_count": s.token_count,
                    "created_at": s.created_at,
                }
                for cid, summaries in SUMMARIES.items()
                for seq, s in enumerate(summaries)
            ],
        )
        await conn.execute(
            insert(OLD["histstore_metadata"]),
            [
                {
                    "conversation_id": cid,
                    "key": _codec.key_to_stored(k),
                    "key_digest": _codec.key_digest(_codec.key_to_stored(k)),
                    "value": _json(v),
                    "digest": _codec.canonical_digest(v),
                }
                for cid, entries in METADATA.items()
                for k, v in entries.items()
            ],
        )
        for (cid, name), items in LISTS.items():
            await conn.execute(
                insert(OLD["histstore_lists"]),
                {"conversation_id": cid, "name": name, "length": len(items)},
            )
            await conn.execute(
                insert(OLD["histstore_list_items"]),
                [
                    {
                        "conversation_id": cid,
                        "name": name,
                        "idx": i,
                        "value": None if isinstance(item, bytes) else _json(item),
                        "blob": item if isinstance(item, bytes) else None,
                    }
                    for i, item in enumerate(items)
                ],
            )
    return convs


# ---------------------------------------------------------------------- fixtures


# ---------------------------------------------------------------------- checks


async def _old_rows(conn: AsyncConnection) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of the older tables, over the older columns only."""
    out = {}
    for name, table in OLD.items():
        rows = (await conn.execute(select(table))).all()
        out[name] = sorted((tuple(r) for r in rows), key=repr)
    return out


async def _schema_of(conn: AsyncConnection) -> tuple[set[str], dict[str, set[str]], set[str]]:
    """The histstore tables, the columns of the altered ones, the messages' indexes."""

    def read(sync: Connection) -> tuple[set[str], dict[str, set[str]], set[str]]:
        inspector = inspect(sync)
        names = {n for n in inspector.get_table_names() if n.startswith("histstore_")}
        columns = {t: {c["name"] for c in inspector.get_columns(t)} for t in NEW_COLUMNS}
        indexes = {str(i["name"]) for i in inspector.get_indexes("histstore_messages")}
        return names, columns, indexes

    return await conn.run_sync(read)


async def _check_search_index(conn: AsyncConnection, convs: list[Conv], *, head: bool) -> None:
    """The full-text index still follows the messages: its triggers (SQLite) are all
    there and it agrees with the messages' text. At head (a2f6c8e4d0b3) writes list
    their own messages: no INSERT trigger."""
    walruses = sum(1 for c in convs for m in c.messages if "walrus" in str(m["content"]))
    if conn.dialect.name == "sqlite":
        triggers = await conn.execute(
            text(
                "SELECT name FROM sqlite_master WHERE type = 'trigger'"
                " AND tbl_name = 'histstore_messages'"
            )
        )
        expected = {
            "histstore_messages_fts_delete",
            "histstore_messages_fts_update",
            "histstore_vectors_gone",
        }
        if not head:
            expected.add("histstore_messages_fts_insert")
        else:  # the semantic index's marks (d2b7e4a9c1f3)
            expected.add("histstore_vector_marks_lowered")
        assert set(triggers.scalars()) == expected
        # Raises when the index disagrees with histstore_messages (its content table).
        await conn.execute(
            text(
                "INSERT INTO histstore_messages_fts(histstore_messages_fts, rank)"
                " VALUES ('integrity-check', 1)"
            )
        )
        found = text(
            "SELECT count(*) FROM histstore_messages_fts"
            " WHERE histstore_messages_fts MATCH 'walrus'"
        )
    elif (await conn.execute(text("SELECT to_regclass('ix_histstore_messages_text')"))).scalar():
        # From 5b7e2d4a9c13 on, a GIN index on the messages' text (the search's expression).
        found = text(
            "SELECT count(*) FROM histstore_messages WHERE to_tsvector('simple'::regconfig,"
            " nullif(coalesce(search_text, CASE WHEN json_typeof(data::json -> 'content')"
            " = 'string' THEN data::json ->> 'content' END), '')) @@ to_tsquery('simple', 'walrus')"
        )
    elif (await conn.execute(text("SELECT to_regclass('histstore_search_vectors')"))).scalar():
        # From e9a4c2f8b5d1 on, the vectors are a table of their own (the upgrade
        # moves them; nothing is listed).
        assert (
            await conn.execute(text("SELECT count(*) FROM histstore_search_listed"))
        ).scalar() == 0
        found = text(
            "SELECT count(*) FROM histstore_search_vectors"
            " WHERE vector @@ to_tsquery('simple', 'walrus')"
        )
    else:
        found = text(
            "SELECT count(*) FROM histstore_messages"
            " WHERE search_vector @@ to_tsquery('simple', 'walrus')"
        )
    assert (await conn.execute(found)).scalar() == walruses


async def _check_head(
    engine: AsyncEngine, convs: list[Conv], before: dict[str, list[tuple[Any, ...]]]
) -> None:
    """The database is at this revision: what it held is unchanged, and the new columns
    and records are what the upgrade makes of it."""
    await alembic(engine, "check")  # no drift from histstore's metadata
    by_id = {c.id: c for c in convs}
    async with engine.connect() as conn:
        assert await _old_rows(conn) == before
        names, columns, indexes = await _schema_of(conn)
        assert names >= NEW_TABLES
        for table, added in NEW_COLUMNS.items():
            assert added <= columns[table]
        assert AUTHORED in indexes

        m = NEW_MESSAGES
        stored = (await conn.execute(select(m))).all()
        assert len(stored) == sum(len(c.messages) for c in convs)
        for cid, position, entry_id, author in stored:
            assert (entry_id, author) == (position + 1, None), (cid, position)

        rows = (await conn.execute(select(NEW_CONVERSATIONS))).all()
        assert {r.id: tuple(r[1:]) for r in rows} == {
            c.id: (c.revision, len(c.messages) + 1, 1, None) for c in convs
        }

        rows = (await conn.execute(select(NEW_WRITES))).all()
        assert {(r.conversation_id, r.key): (r.revision, r.appended) for r in rows} == {
            (c.id, key): c.numbered.get(key, (None, None)) for c in convs for key, *_ in c.writes
        }

        changes = (await conn.execute(select(CHANGES))).all()
        saved = [c for c in convs if c.saved]
        assert {"popped", "saved"} <= {c.id for c in saved}
        assert sorted(r[:5] for r in changes) == sorted(
            (c.id, 1, "save", None, c.updated_at) for c in saved
        )
        for r in changes:
            assert json.loads(r.record) == {
                "start": 0,
                "added": len(by_id[r.conversation_id].messages),
            }
        # Each conversation's revisions are 1..N, across write and change records.
        revisions: dict[str, list[int]] = {c.id: [] for c in convs}
        for r in (*rows, *changes):
            if r.revision is not None:
                revisions[r.conversation_id].append(r.revision)
        assert {cid: sorted(rs) for cid, rs in revisions.items()} == {
            c.id: list(range(1, c.revision + 1)) for c in convs
        }
        for table in ("histstore_asides", "histstore_turns"):
            assert (await conn.execute(text(f"SELECT count(*) FROM {table}"))).scalar() == 0
        await _check_search_index(conn, convs, head=True)


async def _check_previous(
    engine: AsyncEngine, convs: list[Conv], before: dict[str, list[tuple[Any, ...]]]
) -> None:
    """The database is back at 0313065f7133, holding what it held there."""
    async with engine.connect() as conn:
        assert await _old_rows(conn) == before
        names, columns, indexes = await _schema_of(conn)
        assert not NEW_TABLES & names
        for table, added in NEW_COLUMNS.items():
            assert not added & columns[table]
        assert AUTHORED not in indexes
        version = await conn.execute(text("SELECT version_num FROM histstore_alembic_version"))
        assert version.scalar() == PREVIOUS
        await _check_search_index(conn, convs, head=False)


# ---------------------------------------------------------------------- tests


async def test_upgrade_numbers_the_stored_history(engine: AsyncEngine) -> None:
    """Upgrade, downgrade and upgrade again over data stored at 0313065f7133: the data
    is kept each time, and the upgrade makes the same records from it both times."""
    convs = await _seed(engine)
    async with engine.connect() as conn:
        before = await _old_rows(conn)
    assert len(before["histstore_messages"]) == 2500 + 6 + 4 + 3 + 3 + BULK + BULK // 3

    await alembic(engine, "upgrade", HEAD)
    await _check_head(engine, convs, before)
    await alembic(engine, "downgrade", PREVIOUS)
    await _check_previous(engine, convs, before)
    await alembic(engine, "upgrade", HEAD)
    await _check_head(engine, convs, before)


def _sample(convs: list[Conv]) -> list[Conv]:
    """The named conversations and a few of the small ones."""
    return [c for c in convs if not c.id.startswith("bulk-")] + [
        c for c in convs if c.id in ("bulk-0000", "bulk-0001", f"bulk-{BULK - 1:04d}")
    ]


async def test_upgraded_store_reads_what_was_stored(engine: AsyncEngine, empty_url: str) -> None:
    convs = await _seed(engine)
    await alembic(engine, "upgrade", HEAD)
    async with histstore.connect(empty_url) as store:
        for conv in _sample(convs):
            read = await store.read(conv.id)
            assert [m.to_dict() for m in read] == conv.messages
            assert [m.position for m in read] == list(conv.messages_range)
            assert [m.created_at for m in read] == conv.times()
            assert await store.count(conv.id) == len(conv.messages)
            assert await store.metadata(conv.id) == METADATA.get(conv.id, {})
            assert await store.summaries(conv.id) == SUMMARIES.get(conv.id, [])
        assert await store.list_load("saved", "notes") == LISTS["saved", "notes"]
        assert await store.list_load("tiled", "notes") == []
        assert len(await store.read("big", limit=10, start=2000)) == 10


async def test_upgraded_history_is_editable(engine: AsyncEngine, empty_url: str) -> None:
    """The editable-history API over the upgraded data: each entry's id is its position
    + 1, nobody authored it, and the change log folds to the stored value."""
    convs = await _seed(engine)
    await alembic(engine, "upgrade", HEAD)
    async with histstore.connect(empty_url) as store:
        for conv in _sample(convs):
            edited = await store.edit(conv.id)
            assert edited.revision == conv.revision, conv.id
            read = await store.read(conv.id)
            assert [m.entry_id for m in read] == [p + 1 for p in conv.messages_range]
            assert [m.author for m in read] == [None] * len(conv.messages)
            changes = await store.changes(conv.id)
            assert len(changes) == conv.revision
            folded = histstore.Conversation.fold(changes)
            assert folded == edited, conv.id
            assert folded.revision == edited.revision
            assert folded.messages == read
