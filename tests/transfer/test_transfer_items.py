"""Memory items (``HiststoreMemoryStore``) in export, import and copy (format version 4):
a backend move keeps every item with its namespace, key, value, times, time to live,
expiry and vectors, so searches rank the same without embedding anything again."""

from __future__ import annotations

import asyncio
import io
import json
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from cli_runner import ok
from langgraph.store.base import PutOp
from sqlalchemy import select

import histstore
from histstore import Message, NotFound, admin
from histstore._ops.semantic import unit_vector, vector_bytes
from histstore._storage import schema as _schema
from histstore.integrations.langgraph_store import HiststoreMemoryStore

VOCAB = ("cat", "dog", "pizza", "pasta", "rain", "sun")
T = "2024-01-02T03:04:05.123456+00:00"


def embed(texts: list[str]) -> list[list[float]]:
    """A bag of words over ``VOCAB`` (plus a constant, so no vector is zero)."""
    return [[float(t.lower().split().count(w)) for w in VOCAB] + [0.1] for t in texts]


class Recording:
    """``embed``, keeping every text it was given."""

    def __init__(self) -> None:
        self.texts: list[str] = []

    def __call__(self, texts: list[str]) -> list[list[float]]:
        self.texts.extend(texts)
        return embed(texts)


INDEX: Any = {"dims": len(VOCAB) + 1, "embed": embed, "fields": ["text", "notes[*]"]}
QUERIES = ("cat", "pizza pasta", "rain sun dog")


def space() -> tuple[str, ...]:
    return ("users", uuid.uuid4().hex[:8])


async def fill(memories: HiststoreMemoryStore, ns: tuple[str, ...]) -> None:
    await memories.aput(ns, "pet", {"text": "a cat and a dog", "notes": ["cat", "sun"]})
    await memories.aput(ns, "food", {"text": "pizza", "n": 1.5}, ttl=60)
    await memories.aput((*ns, "deep"), "rain", {"text": "rain rain", "tags": ["x"]}, ttl=5)
    await memories.aput(ns, "plain", {"text": "pasta"}, index=False)  # no vectors


async def stored(store: histstore.Store) -> dict[tuple[str, str], tuple[Any, ...]]:
    """Every item row as stored (times, ttl, expiry) with its vectors."""
    i, v = _schema.items, _schema.item_vectors
    async with store.engine.connect() as conn:
        rows = (await conn.execute(select(i))).mappings().all()
        vectors = (await conn.execute(select(v))).mappings().all()
    out: dict[tuple[str, str], tuple[Any, ...]] = {}
    for r in rows:
        out[r["namespace"], r["key"]] = (
            json.loads(r["value"]),
            r["created_at"],
            r["updated_at"],
            r["ttl"],
            r["expires_at"],
            sorted(
                (x["field"], bytes(x["vector"]))
                for x in vectors
                if (x["namespace"], x["key"]) == (r["namespace"], r["key"])
            ),
        )
    return out


async def found(memories: HiststoreMemoryStore, ns: tuple[str, ...]) -> list[Any]:
    """What searches see (ranked by the stored vectors; reads refresh no expiry)."""
    out: list[Any] = []
    for query in QUERIES:
        hits = await memories.asearch(ns, query=query, limit=10, refresh_ttl=False)
        out.append([(h.namespace, h.key, h.value, h.score, h.created_at) for h in hits])
    plain = await memories.asearch(ns, limit=10, refresh_ttl=False)
    out.append([(h.namespace, h.key, h.updated_at) for h in plain])
    return out


async def export_text(store: histstore.Store, **options: Any) -> str:
    out = io.StringIO()
    await admin.export_store(store, out, **options)
    return out.getvalue()


def lines(text: str) -> list[bytes]:
    return [line.encode() + b"\n" for line in text.splitlines()]


async def test_export_and_import_carry_items_times_expiry_and_vectors(
    store: histstore.Store, tmp_path: Path
) -> None:
    ns = space()
    memories = HiststoreMemoryStore(store, index=INDEX)
    await fill(memories, ns)
    await store.write("conv-1", [Message.user("hi")])
    rows, hits = await stored(store), await found(memories, ns)
    assert len(rows) == 4
    assert sum(len(r[5]) for r in rows.values()) == 5  # "plain" has none, "pet" two
    assert [hit[0][1] for hit in hits[:2]] == ["pet", "food"]

    text = await export_text(store, batch=3)  # more items than a batch
    records = [json.loads(line) for line in text.splitlines()]
    assert records[0]["version"] == 4
    assert [r["key"] for r in records if r.get("type") == "memory"] == [
        "food",
        "pet",
        "plain",
        "rain",
    ]
    assert records[-1] == {
        "type": "footer",
        "conversations": 1,
        "messages": 1,
        "threads": 0,
        "checkpoints": 0,
        "items": 4,
    }

    # Into a fresh store: the same rows, and the same search results without embedding.
    async with histstore.connect(tmp_path / "fresh.db") as fresh:
        stats = await admin.import_store(fresh, lines(text), batch=3)
        assert (stats.conversations, stats.items, stats.skipped_items) == (1, 4, 0)
        assert await stored(fresh) == rows
        recording = Recording()
        again = HiststoreMemoryStore(fresh, index={**INDEX, "embed": recording})
        assert await found(again, ns) == hits
        assert recording.texts == list(QUERIES)  # the queries only: no item embedded again

    # Back into the store they came from, after they were deleted.
    for key, where in (("pet", ns), ("food", ns), ("rain", (*ns, "deep")), ("plain", ns)):
        await memories.adelete(where, key)
    assert await stored(store) == {}
    stats = await admin.import_store(store, lines(text))
    assert (stats.items, stats.skipped_items) == (4, 0)
    assert await stored(store) == rows
    assert await found(memories, ns) == hits


async def test_importing_again_skips_and_a_changed_item_is_replaced(
    store: histstore.Store,
) -> None:
    ns = space()
    memories = HiststoreMemoryStore(store, index=INDEX)
    await fill(memories, ns)
    text = await export_text(store)
    rows = await stored(store)

    again = await admin.import_store(store, lines(text))
    assert (again.items, again.skipped_items) == (0, 4)

    await memories.aput(ns, "pet", {"text": "pizza only"})  # changed: value, times, vectors
    await memories.aput(ns, "mine", {"text": "sun"})  # only at the destination
    stats = await admin.import_store(store, lines(text))
    assert (stats.items, stats.skipped_items) == (1, 3)
    now = await stored(store)
    assert {k: now[k] for k in rows} == rows
    assert (await memories.aget(ns, "mine")) is not None


async def test_copy_sqlite_to_every_backend_and_back(
    store: histstore.Store, tmp_path: Path
) -> None:
    """The backend move: SQLite to Postgres (and every backend) and back keeps the items."""
    ns = space()
    async with histstore.connect(tmp_path / "source.db") as source:
        await fill(HiststoreMemoryStore(source, index=INDEX), ns)
        rows = await stored(source)
        hits = await found(HiststoreMemoryStore(source, index=INDEX), ns)
        stats = await admin.copy_store(source, store, batch=2)
        assert (stats.items, stats.skipped_items) == (4, 0)
        again = await admin.copy_store(source, store)
        assert (again.items, again.skipped_items) == (0, 4)
    assert await stored(store) == rows
    assert await found(HiststoreMemoryStore(store, index=INDEX), ns) == hits
    async with histstore.connect(tmp_path / "back.db") as back:
        stats = await admin.copy_store(store, back)
        assert stats.items == 4
        assert await stored(back) == rows
        assert await found(HiststoreMemoryStore(back, index=INDEX), ns) == hits


async def test_an_import_beside_puts_of_the_same_items(store: histstore.Store) -> None:
    """Every item ends whole: the file's value with its vectors, or the put's with its."""
    ns = space()
    memories = HiststoreMemoryStore(store, index=INDEX)
    keys = [f"k{n}" for n in range(30)]
    await memories.abatch([PutOp(ns, k, {"text": "cat"}) for k in keys])
    text = await export_text(store, batch=7)

    async def puts() -> None:
        for k in keys:
            await memories.aput(ns, k, {"text": "pizza"})

    await asyncio.gather(admin.import_store(store, lines(text), batch=4), puts())
    rows = await stored(store)
    assert len(rows) == len(keys)
    for value, *_, vectors in rows.values():
        assert value["text"] in ("cat", "pizza")
        assert vectors == [("text", vector_bytes(unit_vector(embed([value["text"]])[0])))]


async def test_expired_items_stay_behind_and_scoped_views_carry_none(
    store: histstore.Store,
) -> None:
    ns = space()
    memories = HiststoreMemoryStore(store, index=INDEX)
    await fill(memories, ns)
    past = datetime.now(timezone.utc) - timedelta(minutes=1)
    async with store.engine.begin() as conn:
        i = _schema.items
        await conn.execute(i.update().where(i.c.key == "rain").values(expires_at=past))
    text = await export_text(store)
    keys = [json.loads(x).get("key") for x in text.splitlines() if '"type":"memory"' in x]
    assert sorted(keys) == ["food", "pet", "plain"]

    await store.scoped("alice").write("conv-a", [Message.user("hi")])
    assert '"memory"' not in await export_text(store.scoped("alice"))
    assert '"memory"' not in await export_text(store, user="alice")
    assert '"memory"' not in await export_text(store, ids=["conv-a"])
    assert '"type":"memory"' in await export_text(store, ids=["conv-a"], items=True)
    with pytest.raises(ValueError, match="scoped"):
        await export_text(store.scoped("alice"), items=True)
    with pytest.raises(NotFound, match="scoped view"):
        await admin.import_store(store.scoped("alice"), lines(text))


def item_file(*items: dict[str, Any], version: int = 4, count: int | None = None) -> list[bytes]:
    records: list[dict[str, Any]] = [{"format": "histstore", "version": version, "exported_at": T}]
    for item in items:
        records.append(
            {
                "type": "memory",
                "namespace": ["a", "b"],
                "key": "k",
                "value": {"text": "cat"},
                "created_at": T,
                "updated_at": T,
                "ttl": None,
                "expires_at": None,
                "vectors": {},
                **item,
            }
        )
    footer = {"type": "footer", "conversations": 0, "messages": 0, "threads": 0}
    records.append({**footer, "checkpoints": 0, "items": len(items) if count is None else count})
    return [(json.dumps(r) + "\n").encode() for r in records]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"vectors": {"$": "not base64!"}}, "not base64"),
        ({"vectors": {"$": "AAE="}}, "float32"),
        ({"value": [1]}, "JSON object"),
        ({"namespace": ["a.b"]}, "without '.'"),
        ({"namespace": []}, "empty"),
        ({"ttl": -1}, "ttl"),
        ({"created_at": "yesterday"}, "ISO 8601"),
    ],
)
async def test_a_bad_memory_record_names_its_line(
    store: histstore.Store, change: dict[str, Any], message: str
) -> None:
    with pytest.raises(admin.FormatError, match=f"line 2: .*{message}"):
        await admin.import_store(store, item_file(change))
    assert await stored(store) == {}


async def test_vectors_of_another_dimension_are_refused(store: histstore.Store) -> None:
    await HiststoreMemoryStore(store, index=INDEX).aput(("a",), "held", {"text": "cat"})
    two_floats = {"$": "AAAAAAAAgD8="}
    with pytest.raises(admin.FormatError, match=r"line 2: .*stored embeddings have 7 dim"):
        await admin.import_store(store, item_file({"vectors": two_floats}))
    assert list(await stored(store)) == [("a", "held")]


async def test_counts_and_versions_are_checked(store: histstore.Store) -> None:
    with pytest.raises(admin.FormatError, match="footer counts 2 items where the file holds 1"):
        await admin.import_store(store, item_file({}, count=2))
    with pytest.raises(admin.FormatError, match="expected a conversation record"):
        await admin.import_store(store, item_file({}, version=3))  # no memory in version 3
    stats = await admin.import_store(store, item_file({"ttl": 2.5, "expires_at": T}))
    assert stats.items == 1
    ((value, created, updated, ttl, expires, vectors),) = (await stored(store)).values()
    assert (value, ttl, vectors) == ({"text": "cat"}, 2.5, [])
    assert created == updated == expires == datetime.fromisoformat(T)


async def test_an_export_made_before_items_still_imports(store: histstore.Store) -> None:
    """A version-3 file (threads, no memory records) imports and leaves items alone."""
    ns = space()
    memories = HiststoreMemoryStore(store, index=INDEX)
    await memories.aput(ns, "kept", {"text": "cat"})
    row = {"owner": None, "created_at": T, "updated_at": T}
    counts = {"checkpoint": 0, "blob": 0, "channel": 0, "write": 0}
    records = [
        {"format": "histstore", "version": 3, "exported_at": T},
        {"type": "thread", "id": "t-1", "row": row, "rows": counts},
        {"type": "end", "thread": "t-1"},
        {"type": "footer", "conversations": 0, "messages": 0, "threads": 1, "checkpoints": 0},
    ]
    stats = await admin.import_store(store, [(json.dumps(r) + "\n").encode() for r in records])
    assert (stats.threads, stats.items) == (1, 0)
    assert (await memories.aget(ns, "kept")) is not None


async def test_cli_export_and_import_carry_items(shared_backend: Any, tmp_path: Path) -> None:
    ns = space()
    async with shared_backend.connect() as store:
        memories = HiststoreMemoryStore(store, index=INDEX)
        await fill(memories, ns)
        rows, hits = await stored(store), await found(memories, ns)
    dump = str(tmp_path / "dump.jsonl")
    exported = await ok("export", "--url", shared_backend.url, "-o", dump)
    assert "0 threads (0 checkpoints), 4 memory items to " in exported.err
    target = str(tmp_path / "imported.db")
    imported = await ok("import", dump, "--url", target)
    assert "and 0 threads (0 checkpoints), 4 memory items in " in imported.out
    again = await ok("import", dump, "--url", target)
    assert again.out.endswith("(and 0 threads, 4 memory items)\n")
    async with histstore.connect(target) as back:
        assert await stored(back) == rows
        assert await found(HiststoreMemoryStore(back, index=INDEX), ns) == hits
