"""Search over the full-text index's pending list, as users meet it.

On SQLite a write lists its messages for the index and the store indexes the list later
(``_storage.search_index``); on Postgres the writes keep the index themselves (a GIN
index on the messages' text), so its list is always empty. Whoever
indexes them, a search finds every write that returned before it; a crash leaves
nothing search cannot find; a read-only store finds what is listed and not indexed yet;
pops, clears and edits of listed and indexed messages alike keep the search exact.
In memory, SQLite's list is indexed by every search (there is nothing to count here).
"""

from __future__ import annotations

import asyncio
import sqlite3
from contextlib import closing
from typing import Any

import reach
from conftest import Backend
from helpers import PYTHON, new_id, subprocess_env
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import text
from waiting import eventually

from histstore import Message, Store
from histstore._storage.search_index import PENDING_TABLE
from histstore._storage.statements.search import PG_TEXT_INDEX

CRASH = """
import asyncio, os, sys
import histstore

async def main():
    store = await histstore.connect(sys.argv[1])
    await store.write(sys.argv[2], [
        {"role": "user", "content": "krill swarm"},
        {"role": "assistant", "content": "krill again"},
    ])
    os._exit(0)  # no close: what the write listed stays listed

asyncio.run(main())
"""


async def listed(backend: Backend) -> int:
    """What the pending list holds: messages on SQLite; Postgres has none (0)."""
    if backend.name == "sqlite-file":
        with closing(sqlite3.connect(backend.url)) as db:  # ``with`` alone leaves it open
            count: int = db.execute(f"SELECT count(*) FROM {PENDING_TABLE}").fetchone()[0]
        return count
    async with backend.connect(read_only=True) as store, store.engine.connect() as conn:
        # Every message the crashed or running writers stored is in the GIN index.
        plan = await conn.execute(text(f"SELECT to_regclass('{PG_TEXT_INDEX}') IS NOT NULL"))
        assert plan.scalar_one()
    return 0


async def test_a_crash_leaves_nothing_search_cannot_find(shared_backend: Backend) -> None:
    c = new_id()
    proc = await asyncio.create_subprocess_exec(
        PYTHON,
        "-c",
        CRASH,
        shared_backend.url,
        c,
        env=subprocess_env(),
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await asyncio.wait_for(proc.communicate(), timeout=120)
    assert proc.returncode == 0, err.decode(errors="replace")
    sqlite = shared_backend.name == "sqlite-file"
    assert await listed(shared_backend) == (2 if sqlite else 0)  # two messages listed
    # A read-only store cannot index the list, and still finds what it holds.
    async with shared_backend.connect(read_only=True) as reader:
        hits = await reader.search("krill")
        assert sorted((h.conversation, h.position) for h in hits) == [(c, 0), (c, 1)]
        assert [h.message.content for h in await reader.search("swarm")] == ["krill swarm"]
    assert await listed(shared_backend) == (2 if sqlite else 0)
    # The next store that searches indexes it: first (SQLite), or in the background
    # once it found what is listed (Postgres).
    async with shared_backend.connect() as store:
        assert [h.position for h in await store.search("again", conversation=c)] == [1]

        async def indexed() -> bool:
            return await listed(shared_backend) == 0

        await eventually(indexed, "the listed messages indexed")


async def test_a_store_that_keeps_writing_indexes_the_list_as_it_goes(
    shared_backend: Backend,
) -> None:
    """Without a search or a close, a store that writes much indexes what it listed:
    SQLite after 256 write groups (Postgres lists nothing)."""
    if shared_backend.name != "sqlite-file":
        return  # in memory, each search indexes the list (nothing to count here)
    c = new_id()
    async with shared_backend.connect() as store:
        for i in range(300):  # 300 writes, 1,200 messages
            await store.write(c, [{"role": "user", "content": f"heron {i}"}] * 4)
        total = 1_200

        async def some_indexed() -> bool:
            return await listed(shared_backend) < total

        await eventually(some_indexed, "some listed messages indexed while writing")
        assert len(await store.search("heron", conversation=c, limit=2_000)) == 1_200
    assert await listed(shared_backend) == 0


async def test_entries_a_revert_brings_back_are_found_again(shared_backend: Backend) -> None:
    """A revert puts back entries that were spliced out in two places: one statement
    stores entries whose ids are not consecutive; listed or indexed, search finds them."""
    c = new_id()
    async with shared_backend.connect() as store:
        await store.write(c, [{"role": "user", "content": f"gull {i}"} for i in range(6)])
        before = (await store.edit(c)).revision
        for at in (4, 1):  # entries 5, then 2
            value = await store.edit(c)
            value.splice(at, at + 1, [], by="test")
            await store.commit(value)
        await reach.index_pending(store)
        assert sorted(h.position for h in await store.search("gull", conversation=c)) == [
            0,
            1,
            2,
            3,
        ]
        await store.revert(c, before, by="test")
        async with shared_backend.connect(read_only=True) as reader:
            hits = await reader.search("gull", conversation=c)
            assert sorted(h.position for h in hits) == list(range(6))
        await reach.index_pending(store)
        hits = await store.search("gull", conversation=c)
        assert sorted((h.position, h.message.content) for h in hits) == [
            (i, f"gull {i}") for i in range(6)
        ]


async def test_a_store_closes_after_its_background_work_was_cancelled(
    shared_backend: Backend,
) -> None:
    """As ``asyncio.run`` does at its end: every other task is cancelled, the store's
    background indexing among them, and then the store closes; what it listed is
    indexed, at the latest by the next store."""
    c = new_id()
    store = await shared_backend.connect()
    for i in range(255):
        await store.write(c, [{"role": "user", "content": f"ibis {i}"}] * 3)
    # The 256th write group, the 1,065th message: indexing starts in the background.
    await store.write(c, [{"role": "user", "content": "ibis"}] * 300)
    others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for task in others:
        task.cancel()
    await asyncio.gather(*others, return_exceptions=True)
    await store.close()
    async with shared_backend.connect() as again:
        assert len(await again.search("ibis", conversation=c, limit=2_000)) == 1_065
        await reach.index_pending(again)
    assert await listed(shared_backend) == 0


async def test_a_read_only_store_ranks_listed_and_indexed_messages_together(
    shared_backend: Backend,
) -> None:
    indexed, waiting = new_id("a"), new_id("b")
    async with shared_backend.connect() as writer:
        await writer.write(indexed, [{"role": "user", "content": f"otter {i}"} for i in range(3)])
        await reach.index_pending(writer)  # what SQLite's search does first
        await writer.write(
            waiting,
            [{"role": "user", "content": "otter otter otter"}, {"role": "user", "content": "no"}],
        )
        if shared_backend.name != "sqlite-memory":
            assert await listed(shared_backend) == (
                2 if shared_backend.name == "sqlite-file" else 0
            )
        async with shared_backend.connect(read_only=True) as reader:
            hits = await reader.search("otter", limit=10)
            assert sorted((h.conversation, h.position) for h in hits) == sorted(
                [(indexed, 0), (indexed, 1), (indexed, 2), (waiting, 0)]
            )
            scores = [h.score for h in hits]
            assert scores == sorted(scores, reverse=True)
            top = await reader.search("otter", limit=2)
            assert [(h.conversation, h.position) for h in top] == [
                (h.conversation, h.position) for h in hits[:2]
            ]
            only = await reader.search("otter", conversation=waiting)
            assert [(h.conversation, h.position) for h in only] == [(waiting, 0)]
            assert await reader.search("walrus") == []
        hits = await writer.search("otter", limit=10)
        assert len(hits) == 4


WORDS = st.sampled_from(["ant", "bee", "cat", "dog"])
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("write"), st.lists(st.lists(WORDS, min_size=1, max_size=3), max_size=4)),
        st.tuples(st.just("pop"), st.integers(1, 3)),
        st.tuples(st.just("replace"), st.integers(0, 9), st.lists(WORDS, min_size=1, max_size=3)),
        st.tuples(st.just("search"), WORDS),
        st.tuples(st.just("clear"), st.just(0)),
        st.tuples(st.just("index"), st.just(0)),
    ),
    min_size=1,
    max_size=12,
)


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(ops=OPS)
async def test_search_stays_exact_whatever_is_listed_or_indexed(
    store: Store, ops: list[tuple[Any, ...]]
) -> None:
    """Against a model: writes, pops, clears and replacements of messages, with searches
    and indexing of the list (which SQLite's searches do first) between them at any
    point; every search finds exactly the messages holding its word."""
    c = new_id()  # the store outlives examples: a fresh id each time
    model: list[list[str]] = []

    async def check(word: str) -> None:
        hits = await store.search(word, conversation=c, limit=100)
        assert sorted(h.position for h in hits) == [i for i, m in enumerate(model) if word in m]

    for op in ops:
        if op[0] == "write":
            await store.write(c, [{"role": "user", "content": " ".join(m)} for m in op[1]])
            model.extend(op[1])
        elif op[0] == "pop":
            for _ in range(op[1]):
                await store.pop(c)
                if model:
                    model.pop()
        elif op[0] == "replace" and model:
            at = op[1] % len(model)
            value = await store.edit(c)
            value.splice(at, at + 1, [{"role": "user", "content": " ".join(op[2])}], by="test")
            await store.commit(value)
            model[at] = op[2]
        elif op[0] == "search":
            await check(op[1])
        elif op[0] == "clear":
            await store.clear(c)
            model.clear()
        elif op[0] == "index":
            await reach.index_pending(store)
    for word in ("ant", "bee", "cat", "dog"):
        await check(word)


async def test_every_write_is_listed_once(shared_backend: Backend) -> None:
    """Appends alone, appends that went together and writes of other kinds each list
    what they stored once (SQLite; Postgres lists nothing), and search finds all of it."""
    async with shared_backend.connect() as store:
        await store.write("a", [Message.user(f"auk {i}") for i in range(3)])
        await store.write("a", [Message.user("auk keyed")], idempotency_key="k")
        await store.write("a", [Message.user("auk at")], at=4)
        await asyncio.gather(
            *(store.write(f"g{i}", [Message.user("auk"), Message.user("auk")]) for i in range(8))
        )
        pg = store.engine.dialect.name == "postgresql"
        assert await listed(shared_backend) == (0 if pg else 21)
        assert len(await store.search("auk", limit=100)) == 21
