"""``close()``'s one rule for what is built over a store, on every backend: a
``SemanticIndex``'s calls, the admin and transfer functions, and the LangGraph memory
store's batches are each one call, from their first step to their last. One that had
begun when ``close()`` began ends as it would have (close waits for it, between its
steps too); one begun after is refused before it touches anything."""

from __future__ import annotations

import asyncio
import io
import threading
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from conftest import Backend
from helpers import new_id, user_msgs

import histstore
from histstore import SemanticIndex, admin

MODEL = "fake-2"


def _vectors(texts: list[str]) -> list[list[float]]:
    return [[1.0, float(len(t))] for t in texts]


class _Held:
    """An embedder that stops at its call number ``at`` until released."""

    def __init__(self, at: int) -> None:
        self.at = at
        self.calls = 0
        self.entered = asyncio.Event()
        self.release = asyncio.Event()

    async def __call__(self, texts: list[str]) -> list[list[float]]:
        self.calls += 1
        if self.calls == self.at:
            self.entered.set()
            await self.release.wait()
        return _vectors(texts)


async def _still_waits(close: asyncio.Future[None]) -> None:
    await asyncio.sleep(0.05)
    assert not close.done()


async def _embedded(store: histstore.Store, c: str) -> int:
    """How many of ``c``'s messages hold a vector for ``MODEL`` (by a search)."""

    async def embed(texts: list[str]) -> list[list[float]]:
        return _vectors(texts)

    return len(await SemanticIndex(store, embed, model=MODEL).search("q", conversation=c, k=50))


@pytest.mark.parametrize("one", [False, True], ids=["every", "one-conversation"])
async def test_a_semantic_update_between_its_batches_when_close_begins_is_stored(
    backend: Backend, one: bool
) -> None:
    store = await backend.connect()
    c = new_id()
    await store.write(c, user_msgs(5))
    embed = _Held(at=2)  # the first batch's vectors are committed, the second waits
    index = SemanticIndex(store, embed, model=MODEL)
    update = asyncio.ensure_future(index.update(c if one else None, batch=2))
    async with asyncio.timeout(30):
        await embed.entered.wait()
        close = asyncio.ensure_future(store.close())
        await _still_waits(close)  # for the update, held between two of its steps
        embed.release.set()
        assert await update == 5
        await close
    assert store.closed
    if backend.shared:
        async with backend.connect() as again:
            assert await _embedded(again, c) == 5


async def test_calls_begun_once_close_has_begun_are_refused_and_touch_nothing(
    backend: Backend,
) -> None:
    store = await backend.connect()
    c, other = new_id(), new_id()
    await store.write(c, user_msgs(3))
    await store.write(other, user_msgs(2))
    out = io.StringIO()
    await admin.export_store(store, out, ids=[other])
    await store.clear(other)
    embed = _Held(at=1)
    holder = asyncio.ensure_future(SemanticIndex(store, embed, model="holder").update(c))
    async with asyncio.timeout(30):
        await embed.entered.wait()
        close = asyncio.ensure_future(store.close())
        await _still_waits(close)
        never = _Held(at=0)
        index = SemanticIndex(store, never, model=MODEL)
        refused: list[Any] = [
            index.update(),
            index.search("q"),
            index.delete(c),
            admin.stats(store),
            admin.list_conversations(store),
            admin.tail(store, c),
            admin.purge(store, idle_for=timedelta(0)),
            admin.export_store(store, io.StringIO()),
            admin.import_store(store, [line.encode() for line in out.getvalue().splitlines()]),
            admin.copy_store(store, store),
        ]
        for call in refused:
            with pytest.raises(histstore.HistStoreError, match="the store is closed"):
                await call
        assert never.calls == 0  # the embedder was not called
        embed.release.set()
        assert await holder == 3
        await close
    if backend.shared:
        async with backend.connect() as again:
            assert not await again.exists(other)  # not imported
            assert await again.count(c) == 3  # not purged
            assert await _embedded(again, c) == 0  # the refused update stored nothing


async def test_an_import_under_way_when_close_begins_is_stored_whole(backend: Backend) -> None:
    store = await backend.connect()
    ids = [new_id() for _ in range(6)]
    for i, c in enumerate(ids):
        await store.write(c, user_msgs(3, tag=f"c{i}"))
    out = io.StringIO()
    await admin.export_store(store, out, ids=ids)
    for c in ids:
        await store.clear(c)
    lines = out.getvalue().splitlines()
    starts = [n for n, line in enumerate(lines) if '"conversation"' in line]
    reached, began, seen = asyncio.Event(), asyncio.Event(), []

    def read() -> Iterator[bytes]:
        """The file as the import reads it: ``reached`` at the third conversation, and
        whether close() had begun by the last one."""
        for n, line in enumerate(lines):
            if n == starts[2]:
                reached.set()
            if n == starts[-1]:
                seen.append(began.is_set())
            yield line.encode()

    async def close_when_reached() -> None:  # (a task of its own: not inside the import)
        await reached.wait()
        began.set()  # close() refuses new calls before it first awaits
        await store.close()

    closing = asyncio.ensure_future(close_when_reached())
    async with asyncio.timeout(30):
        stats = await admin.import_store(store, read(), batch=1)
        await closing
    assert seen == [True]  # the import's later steps were taken while closing
    assert store.closed
    assert (stats.conversations, stats.messages) == (6, 18)
    if backend.shared:
        async with backend.connect() as again:
            for i, c in enumerate(ids):
                assert [m.content for m in await again.read(c)] == [f"c{i}-{k}" for k in range(3)]


async def test_a_langgraph_memory_batch_between_its_reads_and_writes_is_stored(
    backend: Backend,
) -> None:
    pytest.importorskip("langgraph")
    from langgraph.store.base import GetOp, PutOp

    from histstore.integrations.langgraph_store import HiststoreMemoryStore

    store = await backend.connect()
    embed = _Held(at=1)  # the batch has read; its puts' texts are being embedded
    memories = HiststoreMemoryStore(
        store, index={"dims": 2, "embed": embed.__call__, "fields": ["text"]}
    )
    ns = ("users", new_id())
    put = PutOp(ns, "a", {"text": "hello there"})
    batch = asyncio.ensure_future(memories.abatch([GetOp(ns, "a"), put]))
    async with asyncio.timeout(30):
        await embed.entered.wait()
        close = asyncio.ensure_future(store.close())
        await _still_waits(close)
        # A batch begun now is refused before it reads anything.
        with pytest.raises(histstore.HistStoreError, match="the store is closed"):
            await memories.abatch([GetOp(ns, "a")])
        embed.release.set()
        assert await batch == [None, None]
        await close
    if backend.shared:
        async with backend.connect() as again:
            got = await HiststoreMemoryStore(again).aget(ns, "a")
            assert got is not None
            assert got.value == {"text": "hello there"}


async def test_a_langgraph_put_stored_whole_after_its_first_try_when_close_begins(
    backend: Backend,
) -> None:
    """The saver's put whose first try finds the value it extends gone serializes the
    value whole (in a worker thread) and stores it: close() begins in between."""
    pytest.importorskip("langgraph")
    from langgraph.checkpoint.conformance.test_utils import generate_checkpoint
    from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

    from histstore.integrations.langgraph import HiststoreSaver

    loop_thread = threading.get_ident()

    class Held(JsonPlusSerializer):
        """Stops in a worker thread once ``armed``, until released."""

        armed = False
        entered = threading.Event()
        release = threading.Event()

        def dumps_typed(self, obj: Any) -> tuple[str, bytes]:
            if self.armed and threading.get_ident() != loop_thread:
                self.entered.set()
                self.release.wait(30)
            return super().dumps_typed(obj)

    store = await backend.connect()
    serde = Held()
    saver = HiststoreSaver(store, serde=serde)
    thread = new_id()
    messages: list[Any] = []
    version: Any = None

    async def step(parent: str | None) -> str:
        nonlocal version
        messages.append({"role": "user", "content": f"message {len(messages)}"})
        version = saver.get_next_version(version, None)
        cp = generate_checkpoint(
            channel_values={"messages": list(messages)}, channel_versions={"messages": version}
        )
        configurable = {"thread_id": thread, "checkpoint_ns": ""}
        if parent is not None:
            configurable["checkpoint_id"] = parent
        await saver.aput({"configurable": configurable}, cp, {}, {"messages": version})
        return str(cp["id"])

    await step(await step(None))
    await HiststoreSaver(store).adelete_thread(thread)  # the value it would extend is gone
    serde.armed = True
    put = asyncio.ensure_future(step(None))
    try:
        async with asyncio.timeout(30):
            assert await asyncio.to_thread(serde.entered.wait, 30)
            close = asyncio.ensure_future(store.close())
            await _still_waits(close)
            serde.release.set()
            await put
            await close
    finally:
        serde.release.set()  # (a failed test leaves no thread waiting)
    if backend.shared:
        async with backend.connect() as again:
            got = await HiststoreSaver(again).aget_tuple(
                {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
            )
            assert got is not None
            assert got.checkpoint["channel_values"]["messages"] == messages
