"""HiststoreMemoryStore: LangGraph's ``BaseStore`` on every backend, checked against
LangGraph's own ``InMemoryStore`` (langgraph ships no store test suite) and used by real
graphs through ``compile(store=...)``."""

from __future__ import annotations

import asyncio
import itertools
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, TypedDict

import pytest
from helpers import alembic
from langgraph.config import get_store
from langgraph.graph import END, START, StateGraph
from langgraph.runtime import Runtime
from langgraph.store.base import (
    BaseStore,
    GetOp,
    InvalidNamespaceError,
    ListNamespacesOp,
    MatchCondition,
    PutOp,
    SearchOp,
)
from langgraph.store.memory import InMemoryStore
from sqlalchemy import event, func, inspect, select, text

import histstore
from histstore import HistStoreError, InvalidMessage
from histstore._storage import schema as _schema
from histstore.integrations.langgraph_store import HiststoreMemoryStore
from histstore.items import _statements as _item_statements
from histstore.items import _store as _item_store

THREAD = "histstore-langgraph-store"
VOCAB = ("cat", "dog", "pizza", "pasta", "rain", "sun", "python", "rust")


def threads_named(name: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == name]


@pytest.fixture(autouse=True)
def no_thread_left_behind() -> Iterator[None]:
    before = len(threads_named(THREAD))
    yield
    assert len(threads_named(THREAD)) == before


def embed(texts: list[str]) -> list[list[float]]:
    """A bag of words over ``VOCAB`` (plus a constant, so no vector is zero)."""
    out = []
    for t in texts:
        words = t.lower().replace(",", " ").replace('"', " ").split()
        out.append([float(words.count(w)) for w in VOCAB] + [0.1])
    return out


INDEX: Any = {"dims": len(VOCAB) + 1, "embed": embed, "fields": ["text"]}


# ---------------------------------------------------------------------- as InMemoryStore

ITEMS: list[tuple[tuple[str, ...], str, dict[str, Any]]] = [
    (("users", "ann", "prefs"), "theme", {"text": "dark", "n": 1, "on": True, "tags": ["a"]}),
    (("users", "ann", "prefs"), "lang", {"text": "en", "n": 2.5, "on": False, "tags": []}),
    (("users", "ann", "facts"), "pet", {"text": "cat", "n": 3, "o": {"k": "v", "m": 1}}),
    (("users", "bob", "facts"), "pet", {"text": "dog", "n": 4, "o": {"k": "w"}}),
    (("users", "bob"), "root", {"text": "bob", "n": 0, "on": None, "tags": ["a", "b"]}),
    (("usersx",), "near", {"text": "not under users", "n": 5}),
    (("docs", "v1"), "a", {"text": "x", "n": 6, "kind": "guide"}),
    (("docs", "v2", "drafts"), "b", {"text": "y", "n": 7, "kind": "note"}),
    (("docs", "v2"), "c", {"text": "z", "n": -1, "kind": "guide", "on": 1}),
    (("tenant", "a_%"), "k", {"text": "pattern characters are plain", "n": 8}),
    (("tenant", "abc%"), "k", {"text": "not under a_%", "n": 9}),
]

SEARCHES: list[tuple[tuple[str, ...], dict[str, Any] | None]] = [
    ((), None),
    (("users",), None),
    (("users", "ann"), None),
    (("user",), None),
    (("users", "ann", "prefs"), None),
    (("tenant", "a_%"), None),
    (("tenant", "a"), None),
    ((), {"n": 3}),
    ((), {"n": 2.5}),
    ((), {"n": {"$gt": 2}}),
    ((), {"n": {"$gte": 3, "$lt": 7}}),
    ((), {"n": {"$lte": 0}}),
    ((), {"n": {"$ne": 3}}),
    ((), {"on": True}),
    ((), {"on": None}),
    ((), {"on": {"$ne": None}}),
    ((), {"tags": ["a"]}),
    ((), {"tags": []}),
    ((), {"o": {"k": "v"}}),
    (("users",), {"o": {"k": {"$ne": "v"}}}),
    ((), {"kind": "guide", "n": {"$gt": 0}}),
    ((), {"kind": {"$eq": "note"}}),
    ((), {"missing": None}),
]

LISTINGS: list[dict[str, Any]] = [
    {},
    {"prefix": ("users",)},
    {"prefix": ("users",), "max_depth": 2},
    {"max_depth": 1},
    {"suffix": ("facts",)},
    {"prefix": ("users", "*", "facts")},
    {"prefix": ("*", "v2")},
    {"prefix": ("docs",), "suffix": ("drafts",)},
    {"limit": 2, "offset": 1},
    {"max_depth": 2, "limit": 3, "offset": 2},
    {"prefix": ("nothing",)},
    {"prefix": ("tenant", "a_%")},
    {"suffix": ("a_%",)},
]


def keys(found: list[Any]) -> list[tuple[tuple[str, ...], str]]:
    return sorted((tuple(i.namespace), i.key) for i in found)


async def fill(store: BaseStore) -> None:
    for namespace, key, value in ITEMS:
        await store.aput(namespace, key, value)


async def test_reads_as_langgraphs_in_memory_store(store):
    """Every search filter and namespace listing answers as ``InMemoryStore`` does."""
    ours, theirs = HiststoreMemoryStore(store), InMemoryStore()
    await fill(ours)
    await fill(theirs)
    for prefix, where in SEARCHES:
        got = await ours.asearch(prefix, filter=where, limit=100)
        want = await theirs.asearch(prefix, filter=where, limit=100)
        assert keys(got) == keys(want), (prefix, where)
        assert all(g.score is None for g in got)
    for listing in LISTINGS:
        assert await ours.alist_namespaces(**listing) == await theirs.alist_namespaces(**listing), (
            listing
        )
    for namespace, key, value in ITEMS:
        item = await ours.aget(namespace, key)
        assert item is not None
        assert (item.namespace, item.key, item.value) == (namespace, key, value)
        assert item.created_at.tzinfo is not None
    assert await ours.aget(("users", "ann"), "theme") is None  # not a prefix match
    # Strings order by code point (InMemoryStore raises: it compares numbers only).
    later = await ours.asearch(("docs",), filter={"text": {"$gt": "x"}, "n": {"$lt": 7}})
    assert keys(later) == [(("docs", "v2"), "c")]
    # Deletes, and a batch whose reads see the store as it was before its writes.
    await ours.adelete(("users", "ann", "prefs"), "theme")
    await theirs.adelete(("users", "ann", "prefs"), "theme")
    ops: list[Any] = [
        PutOp(("users", "ann", "prefs"), "theme", {"text": "light"}),
        GetOp(("users", "ann", "prefs"), "theme"),
        PutOp(("users", "ann", "prefs"), "theme", {"text": "blue"}),
        SearchOp(("users", "ann"), limit=100),
        ListNamespacesOp((MatchCondition("prefix", ("users", "ann")),)),
        PutOp(("users", "bob"), "root", None),
    ]
    got_batch = await ours.abatch(ops)
    want_batch = await theirs.abatch(ops)
    assert got_batch[1] is None
    assert want_batch[1] is None
    assert keys(got_batch[3]) == keys(want_batch[3])
    assert got_batch[4] == want_batch[4]
    for found in (ours, theirs):
        item = await found.aget(("users", "ann", "prefs"), "theme")
        assert item is not None
        assert item.value == {"text": "blue"}
        assert await found.aget(("users", "bob"), "root") is None


async def test_search_pages_newest_first_and_updates_keep_created_at(store):
    memories = HiststoreMemoryStore(store)
    for n in range(7):
        await memories.aput(("log",), f"k{n}", {"n": n})
    await memories.aput(("log",), "k2", {"n": 20})
    first = await memories.asearch(("log",), limit=3)
    assert [i.key for i in first] == ["k2", "k6", "k5"]
    assert [i.key for i in await memories.asearch(("log",), limit=3, offset=3)] == [
        "k4",
        "k3",
        "k1",
    ]
    updated = first[0]
    assert updated.value == {"n": 20}
    assert updated.updated_at > updated.created_at


# ---------------------------------------------------------------------- vectors


async def count(store: histstore.Store, table: Any) -> int:
    async with store.engine.connect() as conn:
        return int((await conn.execute(select(func.count()).select_from(table))).scalar_one())


async def test_search_by_meaning_with_fields_filters_and_index_override(store):
    memories = HiststoreMemoryStore(store, index=INDEX)
    await memories.aput(("food",), "it", {"text": "pizza pasta pizza", "n": 1})
    await memories.aput(("food",), "jp", {"text": "python rust", "n": 2})
    await memories.aput(("food", "deep"), "mix", {"text": "pizza rain", "n": 3})
    await memories.aput(("food",), "quiet", {"text": "pizza pizza"}, index=False)
    await memories.aput(("food",), "other", {"text": "rain", "alt": "pizza"}, index=["alt"])
    await memories.aput(
        ("food",), "many", {"text": "sun", "notes": ["cat", "pizza pasta"]}, index=["notes[*]"]
    )
    await memories.aput(("pets",), "elsewhere", {"text": "pizza"})

    hits = await memories.asearch(("food",), query="pizza pasta", limit=10)
    assert [h.key for h in hits] == ["many", "it", "other", "mix", "jp"]
    assert hits[0].score == pytest.approx(1.0, abs=0.01)  # its best text, "pizza pasta"
    assert hits[1].score is not None
    assert 0.9 < hits[1].score < 0.99
    assert all(a.score >= b.score for a, b in itertools.pairwise(hits))  # type: ignore[operator]
    assert "quiet" not in {h.key for h in hits}  # put with index=False: no vectors
    filtered = await memories.asearch(("food",), query="pizza", filter={"n": {"$gte": 2}})
    assert [h.key for h in filtered] == ["mix", "jp"]
    page = await memories.asearch(("food",), query="pizza pasta", limit=2, offset=1)
    assert [h.key for h in page] == ["it", "other"]

    # A write replaces an item's vectors; a delete removes them in the same transaction.
    await memories.aput(("food",), "jp", {"text": "pizza pasta", "n": 2})
    assert {h.key for h in await memories.asearch(("food",), query="pizza pasta", limit=2)} == {
        "many",
        "jp",
    }
    vectors = await count(store, _schema.item_vectors)
    await memories.adelete(("food",), "many")
    assert await count(store, _schema.item_vectors) == vectors - 2

    plain = HiststoreMemoryStore(store)  # no index: the query is not used
    assert {h.key for h in await plain.asearch(("food",), query="pizza")} >= {"quiet", "it"}


async def test_embeddings_of_another_dimension_are_refused(store):
    memories = HiststoreMemoryStore(store, index=INDEX)
    await memories.aput(("a",), "k", {"text": "cat"})
    short: Any = {"dims": 2, "embed": lambda texts: [[1.0, 0.5] for _ in texts]}
    with pytest.raises(InvalidMessage, match="dimensions"):
        await HiststoreMemoryStore(store, index=short).aput(("a",), "j", {"text": "dog"})
    assert await memories.aget(("a",), "j") is None  # nothing of that write is stored


# ---------------------------------------------------------------------- TTL


@dataclass
class Clock:
    now: datetime

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


async def test_ttl_expires_refreshes_on_read_and_sweeps(store, monkeypatch):
    clock = Clock(datetime.now(timezone.utc))
    monkeypatch.setattr(_item_store, "_now", clock)
    memories = HiststoreMemoryStore(store, ttl={"default_ttl": 1.0})
    assert memories.supports_ttl
    await memories.aput(("t",), "read", {"v": 1})  # the default ttl: one minute
    await memories.aput(("t",), "unread", {"v": 2})
    await memories.aput(("t",), "kept", {"v": 3}, ttl=None)
    await memories.aput(("t",), "short", {"v": 4}, ttl=0.25)
    clock.advance(40)
    assert await memories.aget(("t",), "read") is not None  # refreshes: one minute from now
    assert await memories.aget(("t",), "unread", refresh_ttl=False) is not None
    assert {i.key for i in await memories.asearch(("t",))} == {"read", "unread", "kept"}
    clock.advance(40)
    # "unread" was refreshed by the search above (40 s ago); "read" by the get and search.
    assert {i.key for i in await memories.asearch(("t",), refresh_ttl=False)} == {
        "read",
        "unread",
        "kept",
    }
    clock.advance(30)
    assert {i.key for i in await memories.asearch(("t",))} == {"kept"}  # expired: gone
    assert await memories.aget(("t",), "read") is None
    assert await count(store, _schema.items) == 4  # until swept
    assert await memories.asweep_ttl() == 3
    assert await count(store, _schema.items) == 1
    assert await memories.asweep_ttl() == 0


async def test_ttl_config_can_turn_refresh_on_read_off(store, monkeypatch):
    clock = Clock(datetime.now(timezone.utc))
    monkeypatch.setattr(_item_store, "_now", clock)
    memories = HiststoreMemoryStore(store, ttl={"default_ttl": 1.0, "refresh_on_read": False})
    await memories.aput(("t",), "k", {"v": 1})
    clock.advance(40)
    assert await memories.aget(("t",), "k") is not None
    clock.advance(30)
    assert await memories.aget(("t",), "k") is None


async def test_the_ttl_sweeper_runs_until_stopped(store, monkeypatch):
    memories = HiststoreMemoryStore(store)
    swept = asyncio.Event()
    real = memories.asweep_ttl

    async def sweep() -> int:
        found = await real()
        swept.set()
        return found

    monkeypatch.setattr(memories, "asweep_ttl", sweep)
    task = await memories.start_ttl_sweeper(sweep_interval_minutes=0.0001)
    assert await memories.start_ttl_sweeper() is task
    await asyncio.wait_for(swept.wait(), 10)
    assert await memories.stop_ttl_sweeper(timeout=5)
    assert task.done()
    again = await memories.start_ttl_sweeper()
    await asyncio.to_thread(memories.close)  # from sync code: cancelled on its loop
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(again, 5)


# ---------------------------------------------------------------------- graphs


class Chat(TypedDict):
    user: str
    said: str
    reply: str


def remembering_graph(sync: bool = False) -> StateGraph[Any]:
    """A node that recalls what a user said before (``runtime.store``: async, or sync for
    the sync runtime) and remembers the new line; then one that reads the store the sync
    way (``get_store``), which the async runtime runs in a worker thread."""

    def recalled(before: list[Any]) -> dict[str, str]:
        texts = ",".join(sorted(i.value["text"] for i in before))
        return {"reply": f"{len(before)} before: {texts}"}

    async def remember(state: Chat, runtime: Runtime[None]) -> dict[str, str]:
        assert runtime.store is not None
        namespace = ("memories", state["user"])
        before = await runtime.store.asearch(namespace, limit=100)
        await runtime.store.aput(namespace, f"m{len(before)}", {"text": state["said"]})
        return recalled(before)

    def remember_sync(state: Chat, runtime: Runtime[None]) -> dict[str, str]:
        assert runtime.store is not None
        namespace = ("memories", state["user"])
        before = runtime.store.search(namespace, limit=100)
        runtime.store.put(namespace, f"m{len(before)}", {"text": state["said"]})
        return recalled(before)

    def tally(state: Chat) -> dict[str, str]:
        store = get_store()
        found = store.list_namespaces(prefix=("memories",))
        return {"reply": state["reply"] + f" | users={len(found)}"}

    builder = StateGraph(Chat)
    builder.add_node("remember", remember_sync if sync else remember)
    builder.add_node("tally", tally)
    builder.add_edge(START, "remember")
    builder.add_edge("remember", "tally")
    builder.add_edge("tally", END)
    return builder


async def test_a_graph_keeps_memories_across_runs_and_stores(backend):
    async with backend.connect() as store:
        graph = remembering_graph().compile(store=HiststoreMemoryStore(store))
        out = await graph.ainvoke({"user": "ann", "said": "likes cats"})
        assert out["reply"] == "0 before:  | users=1"
        out = await graph.ainvoke({"user": "bob", "said": "likes dogs"})
        assert out["reply"] == "0 before:  | users=2"
        # The sync runtime in a worker thread, on the same borrowed store.
        sync = remembering_graph(sync=True).compile(store=HiststoreMemoryStore(store))
        out = await asyncio.to_thread(sync.invoke, {"user": "ann", "said": "eats pizza"})
        assert out["reply"] == "1 before: likes cats | users=2"
        if not backend.shared:
            return
    async with backend.connect() as store:  # a new process would do this
        graph = remembering_graph().compile(store=HiststoreMemoryStore(store))
        out = await graph.ainvoke({"user": "ann", "said": "again"})
        assert out["reply"] == "2 before: eats pizza,likes cats | users=2"


async def test_a_sync_program_owns_its_store(shared_backend):
    def program(user: str) -> str:
        with HiststoreMemoryStore(shared_backend.url) as memories:
            graph = remembering_graph(sync=True).compile(store=memories)
            reply: str = graph.invoke({"user": user, "said": "hello"})["reply"]
            assert memories.get(("memories", user), "m0") is not None
            return reply

    assert await asyncio.to_thread(program, "cy") == "0 before:  | users=1"
    assert await asyncio.to_thread(program, "cy") == "1 before: hello | users=1"
    async with HiststoreMemoryStore(shared_backend.url) as memories:
        assert [i.key for i in await memories.asearch(("memories", "cy"))] == ["m1", "m0"]


# ---------------------------------------------------------------------- rules


async def test_a_closed_owned_store_refuses_calls():
    owned = HiststoreMemoryStore("sqlite://")
    assert await owned.aget(("a",), "k") is None
    await owned.aclose()
    with pytest.raises(HistStoreError, match="closed"):
        await owned.aget(("a",), "k")
    await owned.aclose()  # idempotent


async def test_bad_input_gets_typed_errors_and_writes_nothing(store):
    memories = HiststoreMemoryStore(store)
    with pytest.raises(InvalidNamespaceError):
        await memories.abatch([PutOp(("a.b",), "k", {"v": 1})])
    with pytest.raises(InvalidNamespaceError):
        await memories.abatch([PutOp((), "k", {"v": 1})])
    with pytest.raises(InvalidNamespaceError):
        await memories.abatch([SearchOp(("a", ""))])
    with pytest.raises(InvalidMessage):
        await memories.aput(("a",), "k", {"v": float("nan")})
    with pytest.raises(InvalidMessage):
        await memories.aput(("a",), "k", {"v": object()})
    with pytest.raises(InvalidMessage, match="ttl"):
        await memories.aput(("a",), "k", {"v": 1}, ttl=-1)
    with pytest.raises(ValueError, match="Unsupported operator"):
        await memories.asearch(("a",), filter={"v": {"$in": [1]}})
    with pytest.raises(ValueError, match="keys"):
        await memories.asearch(("a",), filter={'v"': 1})
    with pytest.raises(ValueError, match="scoped"):
        HiststoreMemoryStore(store.scoped("someone"))
    assert await count(store, _schema.items) == 0


async def test_prefix_reads_are_served_by_the_primary_key(store):
    """A filtered search reads the key range of its prefix, not the table."""
    memories = HiststoreMemoryStore(store)
    await fill(memories)
    items = _item_store.ItemStore(store)
    conditions, params, _ = items._conditions(("users", "ann"), {"n": 1})
    search = (
        _item_statements.item_columns()
        .where(*conditions)
        .order_by(_schema.items.c.updated_at.desc())
    )
    sqlite = store.engine.dialect.name == "sqlite"

    def explain(conn: Any, cursor: Any, statement: str, params: Any, *rest: Any) -> Any:
        return ("EXPLAIN QUERY PLAN " if sqlite else "EXPLAIN ") + statement, params

    engine = store.engine.sync_engine
    async with store.engine.connect() as conn:
        if not sqlite:
            await conn.execute(text("SET enable_seqscan = off"))  # a tiny table: ask plainly
        event.listen(engine, "before_cursor_execute", explain, retval=True)
        try:
            result = await conn.execute(search, params)
            plan = " ".join(str(r[-1]) for r in result.cursor.fetchall())
        finally:
            event.remove(engine, "before_cursor_execute", explain)
    if sqlite:
        assert "USING PRIMARY KEY" in plan or "USING INDEX" in plan, plan
        assert "SCAN histstore_items" not in plan, plan
    else:
        assert "pk_histstore_items" in plan, plan


# ---------------------------------------------------------------------- schema


async def _tables(store: histstore.Store) -> set[str]:
    async with store.engine.connect() as conn:
        names = await conn.run_sync(lambda c: inspect(c).get_table_names())
    return {n for n in names if n.startswith("histstore_")}


ITEM_TABLES = {"histstore_items", "histstore_item_vectors"}


async def test_migration_upgrades_and_downgrades_a_database_holding_data(empty_url, cid):
    async with histstore.connect(empty_url, migrate=False) as store:
        # A message stored, then the schema taken back to the revision before the items'
        # tables (today's writes name tables that revision does not have).
        await alembic(store.engine, "upgrade", "head")
        await store.write(cid, [{"role": "user", "content": "kept"}])
        await alembic(store.engine, "downgrade", "a41c5e0d7b93")
        assert not (await _tables(store)) & ITEM_TABLES
        await alembic(store.engine, "upgrade", "head")
        assert await _tables(store) >= ITEM_TABLES
        await alembic(store.engine, "check")
        memories = HiststoreMemoryStore(store, index=INDEX)
        await memories.aput(("a",), "k", {"text": "cat"}, ttl=5)
        assert (await memories.asearch(("a",), query="cat"))[0].key == "k"

        await alembic(store.engine, "downgrade", "a41c5e0d7b93")
        assert not (await _tables(store)) & ITEM_TABLES
        async with store.engine.connect() as conn:
            rows = (await conn.execute(text("SELECT data FROM histstore_messages"))).all()
        assert len(rows) == 1
        assert "kept" in rows[0][0]
        await alembic(store.engine, "upgrade", "head")
        assert await HiststoreMemoryStore(store).aget(("a",), "k") is None
    async with histstore.connect(empty_url) as store:
        assert [m.content for m in await store.read(cid)] == ["kept"]


def test_import_without_langgraph_names_the_extra():
    code = (
        "import sys; sys.modules['langgraph'] = None\n"
        "import histstore.integrations.langgraph_store\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode != 0
    assert "pip install 'histstore[langgraph]'" in proc.stderr


async def test_listing_pages_through_many_namespaces_as_in_memory_store(store):
    """More namespaces than one step of the walk reads, cut and filtered."""
    ours, theirs = HiststoreMemoryStore(store), InMemoryStore()
    ops: list[Any] = [
        PutOp(("org", f"team{t:02}", f"user{u:02}"), "k", {"v": u})
        for t in range(30)
        for u in range(8)
    ]
    ops += [PutOp(("org", f"team{t:02}"), "root", {"v": 0}) for t in range(0, 30, 3)]
    await ours.abatch(ops)
    await theirs.abatch(ops)
    for listing in [
        {"limit": 500},
        {"prefix": ("org",), "max_depth": 2, "limit": 500},
        {"max_depth": 2, "limit": 7, "offset": 13},
        {"suffix": ("user03",), "limit": 500},
        {"prefix": ("org", "*", "user07"), "limit": 5, "offset": 20},
        {"prefix": ("org", "team29"), "max_depth": 3, "limit": 500},
    ]:
        assert await ours.alist_namespaces(**listing) == await theirs.alist_namespaces(**listing), (
            listing
        )
    # A label sorting before "." beside a shorter one: each cut namespace listed once.
    await ours.aput(("a",), "k", {"v": 1})
    await ours.aput(("a-b",), "k", {"v": 1})
    await ours.aput(("a", "x"), "k", {"v": 1})
    assert await ours.alist_namespaces(max_depth=1, limit=5) == [("a",), ("a-b",), ("org",)]


async def test_concurrent_writes_of_one_item_keep_one_value_with_its_vectors(store):
    memories = HiststoreMemoryStore(store, index={**INDEX, "fields": ["notes[*]"]})
    values = [{"notes": ["cat"] * (n % 3 + 1), "n": n} for n in range(12)]
    await asyncio.gather(*(memories.aput(("race",), "k", v) for v in values))
    item = await memories.aget(("race",), "k")
    assert item is not None
    assert item.value in values
    assert await count(store, _schema.item_vectors) == len(item.value["notes"])
