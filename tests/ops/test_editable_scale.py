"""Editable history at scale (SPEC 11 costs): an edit near the start of a long
conversation that changes its length moves the entries after it set-based, in a
bounded number of statements, and everything that follows positions (reads, search,
the change log, revert) still agrees, on every backend."""

from __future__ import annotations

import asyncio
from collections.abc import Generator, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import reach

from histstore import Conversation, Message, SemanticIndex, Store
from histstore._ops import edit_writes as _edit_writes

LONG = 2_000


class Statements:
    """Counts the statements a store's transactions send: one for each statement, one
    for each row of a statement run once per row (``executemany``)."""

    def __init__(self) -> None:
        self.count = 0

    def wrap(self, program: Generator[Any, Any, Any]) -> Generator[Any, Any, Any]:
        sent: Any = None
        while True:
            try:
                step = program.send(sent)
            except StopIteration as stop:
                return stop.value
            kind, _stmt, params = step
            self.count += len(params) if kind == "execute_many" else 1
            sent = yield step


@contextmanager
def counting(store: Store, monkeypatch: pytest.MonkeyPatch) -> Iterator[Statements]:
    driver = reach.driver(store)
    real = driver.run
    seen = Statements()

    def run(conn: Any, program: Any, *args: Any, **kwargs: Any) -> Any:
        if getattr(program, "__name__", None) == "index":
            # The background indexer's run, in a transaction of its own: not the commit's.
            return real(conn, program, *args, **kwargs)
        return real(conn, seen.wrap(program), *args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(driver, "run", run)
        yield seen


async def _long(store: Store, cid: str, n: int) -> None:
    for first in range(0, n, 500):
        await store.write(
            cid, [Message.user(f"entry{i} word{i}") for i in range(first, first + 500)]
        )


async def _splice_near_start(
    store: Store, cid: str, monkeypatch: pytest.MonkeyPatch, new: list[Message]
) -> int:
    conv = await store.edit(cid)
    conv.splice(5, 7, new, by="test")
    with counting(store, monkeypatch) as seen:
        await store.commit(conv)
    return seen.count


@pytest.mark.parametrize("added", [1, 4], ids=["shrinks", "grows"])
async def test_a_length_changing_splice_near_the_start_takes_bounded_statements(
    store: Store, cid: str, monkeypatch: pytest.MonkeyPatch, added: int
) -> None:
    await _long(store, cid, LONG)
    new = [Message.user(f"spliced{k} fresh") for k in range(added)]
    statements = await _splice_near_start(store, cid, monkeypatch, new)
    # A handful, however long the conversation: not one per entry that moves.
    assert statements <= 12

    expected = [f"entry{i} word{i}" for i in range(LONG)]
    expected[5:7] = [m.content for m in new]  # type: ignore[misc]
    got = await store.read(cid)
    assert [m.content for m in got] == expected
    assert [m.position for m in got] == list(range(len(expected)))
    assert await store.count(cid) == len(expected)
    newest = await store.read(cid, limit=3)
    assert [m.content for m in newest] == expected[-3:]
    assert [m.position for m in newest] == [len(expected) - 3, len(expected) - 2, len(expected) - 1]

    # Search follows the moved rows to their new positions, and forgets the removed ones.
    shift = added - 2
    hits = await store.search(f"word{LONG - 1}", conversation=cid)
    assert [(h.position, h.message.content) for h in hits] == [
        (LONG - 1 + shift, f"entry{LONG - 1} word{LONG - 1}")
    ]
    hits = await store.search("word100", conversation=cid)
    assert [h.position for h in hits] == [100 + shift]
    assert await store.search("word6", conversation=cid) == []
    assert [h.position for h in await store.search("spliced0", conversation=cid)] == [5]

    # The change log still folds to the stored value, and revert undoes the splice.
    value = await store.edit(cid)
    assert Conversation.fold(await store.changes(cid)) == value
    kept = [value.entry_id(i) for i in range(len(expected))]
    assert kept[:5] == [1, 2, 3, 4, 5]
    assert kept[5 + added :] == list(range(8, LONG + 1))
    with counting(store, monkeypatch) as seen:
        await store.revert(cid, value.revision - 1, by="test")
    assert seen.count <= 18  # the records after the target, the halt then, the writes
    back = await store.read(cid)
    assert [m.content for m in back] == [f"entry{i} word{i}" for i in range(LONG)]
    assert [m.entry_id for m in back] == list(range(1, LONG + 1))
    assert [h.position for h in await store.search("word6", conversation=cid)] == [6]
    assert [h.position for h in await store.search(f"word{LONG - 1}", conversation=cid)] == [
        LONG - 1
    ]


async def test_a_revert_puts_back_many_entries_a_few_thousand_rows_at_a_time(
    store: Store, cid: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A revert that puts back more entries than a commit sends at once (here 300 at a
    time) stores them all, in order, with their ids, found by search."""
    monkeypatch.setattr(_edit_writes, "ROWS_AT_ONCE", 300)
    await _long(store, cid, LONG)
    with counting(store, monkeypatch) as seen:
        await store.revert(cid, 1, by="test")  # the first 500
    assert seen.count <= 16
    assert await store.count(cid) == 500
    await store.revert(cid, 4, by="test")  # back to all 2,000: 1,500 rows in 5 parts
    back = await store.read(cid)
    assert [m.content for m in back] == [f"entry{i} word{i}" for i in range(LONG)]
    assert [m.entry_id for m in back] == list(range(1, LONG + 1))
    for i in (500, 799, 800, 1999):
        assert [h.position for h in await store.search(f"word{i}", conversation=cid)] == [i]


async def test_a_revert_counts_what_it_puts_back_for_the_background_indexer(
    store: Store, cid: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A revert that puts back many entries counts them toward SQLite's background
    indexer (as a write, an import and a commit do): once they make a chunk, a run
    indexes them, rather than leaving them to ``close()`` or to the next search."""
    from sqlalchemy import text
    from waiting import eventually

    from histstore._storage.search_index import PENDING_TABLE

    indexer = store.internals.executor.indexer
    if indexer is None:
        pytest.skip("this backend has no background indexer")
    await _long(store, cid, LONG)
    await store.revert(cid, 1, by="test")  # the first 500
    await store.search("entry1", limit=1)  # indexes the whole list
    await eventually(lambda: indexer.state == "idle", "the indexer's run to end")
    indexer.caught_up()
    monkeypatch.setattr(indexer, "_message_threshold", 1_000)

    async def listed() -> int:
        async with store.engine.connect() as conn:
            return int(
                (await conn.execute(text(f"SELECT count(*) FROM {PENDING_TABLE}"))).scalar_one()
            )

    assert await listed() == 0
    await store.revert(cid, 4, by="test")  # 1,500 entries back: more than the chunk
    await eventually(lambda: indexer.state == "idle", "the indexer's run to end")
    for _ in range(100):
        if await listed() == 0:
            break
        await asyncio.sleep(0.05)
    assert await listed() == 0


async def test_statements_do_not_grow_with_the_conversation(
    store: Store, cid: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    other = cid + "-b"
    await _long(store, cid, 500)
    await _long(store, other, 2_500)
    one = [Message.user("one instead of two")]
    assert await _splice_near_start(store, cid, monkeypatch, one) == await _splice_near_start(
        store, other, monkeypatch, one
    )
    # Other conversations are left as they were.
    assert await store.count(cid) == 499
    assert [m.content for m in await store.read(other, limit=1)] == ["entry2499 word2499"]


async def test_moved_entries_lose_their_vectors_and_are_embedded_again(
    store: Store, cid: str
) -> None:
    async def embed(texts: list[str]) -> list[list[float]]:
        return [[float(len(t)), 1.0] for t in texts]

    await store.write(cid, [Message.user(f"entry{i}") for i in range(30)])
    index = SemanticIndex(store, embed, model="test")
    assert await index.update() == 30
    conv = await store.edit(cid)
    conv.splice(2, 3, [Message.user("x"), Message.user("y")], by="test")
    await store.commit(conv)
    # The two new entries and the 27 that moved: never a vector of another message.
    assert await index.update() == 29
    for hit in await index.search("entry12", k=31):
        assert (await store.read(cid))[hit.position].content == hit.message.content
