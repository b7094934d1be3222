"""HiststoreSaver: LangGraph's checkpoint conformance suite and real graphs, every backend."""

from __future__ import annotations

import asyncio
import json
import operator
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
from helpers import alembic
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
)
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import ALL_CAPABILITIES
from langgraph.checkpoint.conformance.test_utils import (
    generate_checkpoint,
    generate_metadata,
)
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt
from langgraph_graphs import call_weather, tool_loop
from sqlalchemy import insert, inspect, text

import histstore
from histstore import ConflictError, HistStoreError, InvalidId, InvalidMessage, NotFound
from histstore._core import codec as _codec
from histstore._storage import schema as _schema
from histstore.checkpoints import CheckpointStore
from histstore.integrations.langgraph import HiststoreSaver

CHECKPOINT_TABLES = {
    "histstore_checkpoint_threads",
    "histstore_checkpoints",
    "histstore_checkpoint_blobs",
    "histstore_checkpoint_writes",
}


def threads_named(name: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == name]


@pytest.fixture(autouse=True)
def no_thread_left_behind() -> Iterator[None]:
    before = len(threads_named("histstore-langgraph"))
    yield
    assert len(threads_named("histstore-langgraph")) == before


def thread_config(thread_id: str, **configurable: Any) -> RunnableConfig:
    return {"configurable": {"thread_id": thread_id, **configurable}}


def new_thread() -> str:
    return f"thread-{uuid.uuid4().hex}"


# ---------------------------------------------------------------------- conformance


class SyncInWorkerThreads(BaseCheckpointSaver[str]):
    """Presents a saver's sync methods to the (async) conformance suite: every call runs
    the sync method in a worker thread, as LangGraph's sync runtime does."""

    def __init__(self, inner: HiststoreSaver) -> None:
        super().__init__(serde=inner.serde)
        self.inner = inner

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return await asyncio.to_thread(self.inner.get_tuple, config)

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        found = await asyncio.to_thread(
            lambda: list(self.inner.list(config, filter=filter, before=before, limit=limit))
        )
        for item in found:
            yield item

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        return await asyncio.to_thread(self.inner.put, config, checkpoint, metadata, new_versions)

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        await asyncio.to_thread(self.inner.put_writes, config, writes, task_id, task_path)

    async def adelete_thread(self, thread_id: str) -> None:
        await asyncio.to_thread(self.inner.delete_thread, thread_id)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        await asyncio.to_thread(self.inner.delete_for_runs, run_ids)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        await asyncio.to_thread(self.inner.copy_thread, source_thread_id, target_thread_id)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        await asyncio.to_thread(self.inner.prune, thread_ids, strategy=strategy)

    def get_next_version(self, current: str | None, channel: None) -> str:
        return self.inner.get_next_version(current, channel)


@pytest.mark.parametrize("calls", ["async", "sync-in-threads"])
async def test_conformance_suite_passes_every_capability(backend, calls):
    async with backend.connect() as store:

        @checkpointer_test(name=f"HiststoreSaver-{backend.name}-{calls}")
        async def saver() -> AsyncIterator[BaseCheckpointSaver[str]]:
            inner = HiststoreSaver(store)
            yield inner if calls == "async" else SyncInWorkerThreads(inner)

        report = await validate(saver)
    assert set(report.results) == {c.value for c in ALL_CAPABILITIES}
    problems = {
        name: (r.detected, r.failures) for name, r in report.results.items() if r.passed is not True
    }
    assert not problems
    assert report.conformance_level() == "FULL"


async def test_conformance_suite_through_an_owned_store(shared_backend):
    """The saver opens and closes its own store (given a URL or path)."""

    @checkpointer_test(name=f"HiststoreSaver-owned-{shared_backend.name}")
    async def saver() -> AsyncIterator[BaseCheckpointSaver[str]]:
        async with HiststoreSaver(shared_backend.url) as owned:
            yield owned

    report = await validate(saver)
    assert report.conformance_level() == "FULL", report.to_dict()


# ---------------------------------------------------------------------- real graphs


async def test_tool_loop_over_several_turns_resumes_on_a_new_saver(shared_backend):
    thread = new_thread()
    config = thread_config(thread)
    replies = iter(
        [
            call_weather("Paris", "call-1"),
            AIMessage("Sunny in Paris."),
            AIMessage("You asked about Paris."),
            call_weather("Oslo", "call-2"),
            AIMessage("Sunny in Oslo too."),
        ]
    )
    model = GenericFakeChatModel(messages=replies)
    seen: list[int] = []

    async with shared_backend.connect() as store:
        graph = tool_loop(model, seen).compile(checkpointer=HiststoreSaver(store))
        out = await graph.ainvoke({"messages": [HumanMessage("Weather in Paris?")]}, config)
        assert [type(m) for m in out["messages"]] == [
            HumanMessage,
            AIMessage,
            ToolMessage,
            AIMessage,
        ]
        assert out["messages"][2].content == "It is sunny in Paris."
        out = await graph.ainvoke({"messages": [HumanMessage("What did I ask?")]}, config)
        assert out["messages"][-1].content == "You asked about Paris."
        history = [s async for s in graph.aget_state_history(config)]
        assert len(history) >= 8

    # A new process would do this: a new store and saver on the same database.
    async with shared_backend.connect() as store:
        graph = tool_loop(model, seen).compile(checkpointer=HiststoreSaver(store))
        state = await graph.aget_state(config)
        assert len(state.values["messages"]) == 6
        assert state.next == ()
        out = await graph.ainvoke({"messages": [HumanMessage("And Oslo?")]}, config)
    contents = [m.content for m in out["messages"]]
    assert contents[-3:] == ["", "It is sunny in Oslo.", "Sunny in Oslo too."]
    assert len(contents) == 10
    # The model saw the whole history each time, the resumed turn included.
    assert seen == [1, 3, 5, 7, 9]


class Outer(TypedDict):
    log: Annotated[list[str], operator.add]


class Inner(TypedDict):
    log: Annotated[list[str], operator.add]


def interrupting_graph() -> StateGraph[Any]:
    """A parent graph whose subgraph asks for approval (an interrupt) half way."""

    def draft(state: Inner) -> dict[str, list[str]]:
        return {"log": ["drafted"]}

    def approve(state: Inner) -> dict[str, list[str]]:
        answer = interrupt({"question": "approve?", "seen": list(state["log"])})
        return {"log": [f"approved:{answer}"]}

    sub = StateGraph(Inner)
    sub.add_node("draft", draft)
    sub.add_node("approve", approve)
    sub.add_edge(START, "draft")
    sub.add_edge("draft", "approve")
    sub.add_edge("approve", END)

    def start(state: Outer) -> dict[str, list[str]]:
        return {"log": ["started"]}

    def finish(state: Outer) -> dict[str, list[str]]:
        return {"log": ["finished"]}

    builder = StateGraph(Outer)
    builder.add_node("start", start)
    builder.add_node("review", sub.compile())
    builder.add_node("finish", finish)
    builder.add_edge(START, "start")
    builder.add_edge("start", "review")
    builder.add_edge("review", "finish")
    builder.add_edge("finish", END)
    return builder


async def test_interrupt_in_a_subgraph_resumes_on_a_new_saver_sync(shared_backend):
    """The sync runtime (``invoke`` in a worker thread) with a borrowed store."""
    thread = new_thread()
    config = thread_config(thread)

    async with shared_backend.connect() as store:
        graph = interrupting_graph().compile(checkpointer=HiststoreSaver(store))
        out = await asyncio.to_thread(graph.invoke, {"log": []}, config)
        (pending,) = out["__interrupt__"]
        assert pending.value == {"question": "approve?", "seen": ["started", "drafted"]}
        state = await asyncio.to_thread(graph.get_state, config, subgraphs=True)
        assert state.next == ("review",)
        assert state.tasks[0].state is not None  # the subgraph's own checkpoint
        assert state.tasks[0].state.next == ("approve",)

    async with shared_backend.connect() as store:
        graph = interrupting_graph().compile(checkpointer=HiststoreSaver(store))
        out = await asyncio.to_thread(graph.invoke, Command(resume="yes"), config)
        assert out["log"] == ["started", "started", "drafted", "approved:yes", "finished"]
        state = await asyncio.to_thread(graph.get_state, config)
        assert state.next == ()
        # A second run on the same thread starts from the finished state.
        out = await asyncio.to_thread(graph.invoke, {"log": ["again"]}, config)
        assert out["__interrupt__"]


async def test_interrupt_in_a_subgraph_async_then_sync_only_program(shared_backend):
    """Interrupted by an async run; resumed by a sync-only program owning its saver."""
    thread = new_thread()
    config = thread_config(thread)
    async with HiststoreSaver(shared_backend.url) as saver:
        graph = interrupting_graph().compile(checkpointer=saver)
        out = await graph.ainvoke({"log": []}, config)
        assert out["__interrupt__"]

    def program() -> dict[str, Any]:
        with HiststoreSaver(shared_backend.url) as saver:
            graph = interrupting_graph().compile(checkpointer=saver)
            assert graph.get_state(config).next == ("review",)
            return graph.invoke(Command(resume="ok"), config)

    out = await asyncio.to_thread(program)
    assert out["log"][-2:] == ["approved:ok", "finished"]


# ---------------------------------------------------------------------- sync rules


async def test_sync_methods_refuse_their_stores_own_running_loop(store):
    saver = HiststoreSaver(store)
    config = thread_config(new_thread())
    with pytest.raises(RuntimeError, match=r"saver\.aget_tuple"):
        saver.get_tuple(config)
    with pytest.raises(RuntimeError, match=r"saver\.alist"):
        saver.list(config)
    with pytest.raises(RuntimeError, match=r"saver\.aput\("):
        saver.put(config, generate_checkpoint(), generate_metadata(), {})
    with pytest.raises(RuntimeError, match=r"saver\.aput_writes"):
        saver.put_writes(thread_config("t", checkpoint_id="x"), [("ch", 1)], "task")
    with pytest.raises(RuntimeError, match=r"saver\.adelete_thread"):
        saver.delete_thread("t")
    saver.close()  # a borrowed store is left open
    assert await saver.aget_tuple(config) is None  # nothing was written or broken


async def test_borrowed_store_without_its_loop_refuses_sync_calls(store):
    saver = await asyncio.to_thread(HiststoreSaver, store)  # made outside any loop
    with pytest.raises(RuntimeError, match="event loop its Store runs on"):
        await asyncio.to_thread(saver.get_tuple, thread_config("t"))
    await saver.aget_tuple(thread_config("t"))  # an async call makes its loop the home
    assert await asyncio.to_thread(saver.get_tuple, thread_config("t")) is None


async def test_owned_store_sync_first_then_async_then_closed(shared_backend):
    thread = new_thread()
    saver = await asyncio.to_thread(HiststoreSaver, shared_backend.url)
    stored = await asyncio.to_thread(
        saver.put, thread_config(thread, checkpoint_ns=""), generate_checkpoint(), {}, {}
    )
    # The store lives on the saver's private loop thread; async calls are handed to it.
    found = await saver.aget_tuple(stored)
    assert found is not None
    assert found.config["configurable"]["checkpoint_id"] == stored["configurable"]["checkpoint_id"]
    assert [t async for t in saver.alist(thread_config(thread))] == [found]
    await saver.aclose()
    with pytest.raises(HistStoreError, match="closed"):
        await saver.aget_tuple(stored)


# ---------------------------------------------------------------------- semantics


async def put(saver: HiststoreSaver, thread: str, **kw: Any) -> RunnableConfig:
    parent = kw.pop("parent", None)
    config = thread_config(thread, checkpoint_ns=kw.pop("ns", ""))
    if parent is not None:
        config["configurable"]["checkpoint_id"] = parent["configurable"]["checkpoint_id"]
    values = kw.pop("values", {})
    cp = generate_checkpoint(channel_values=values)
    versions = {k: saver.get_next_version(None, None) for k in values}
    cp["channel_versions"] = versions
    return await saver.aput(config, cp, generate_metadata(**kw), versions)


async def test_values_are_stored_once_per_version(store):
    saver = HiststoreSaver(store)
    thread = new_thread()
    big = {"messages": [{"role": "user", "content": "x" * 1000}]}
    first = await put(saver, thread, values={"a": big, "b": [1, 2], "s": "scalar"})
    # [3, 2, 1] does not extend [1, 2]: stored whole (see test_langgraph_storage.py)
    cp = generate_checkpoint(channel_values={"a": big, "b": [3, 2, 1], "s": "scalar"})
    previous = (await saver.aget_tuple(first)).checkpoint["channel_versions"]  # type: ignore[union-attr]
    cp["channel_versions"] = {**previous, "b": saver.get_next_version(previous["b"], None)}
    config = thread_config(
        thread, checkpoint_ns="", checkpoint_id=first["configurable"]["checkpoint_id"]
    )
    second = await saver.aput(
        config, cp, generate_metadata(step=1), {"b": cp["channel_versions"]["b"]}
    )
    got = await saver.aget_tuple(second)
    assert got is not None
    assert got.checkpoint["channel_values"] == {"a": big, "b": [3, 2, 1], "s": "scalar"}
    assert got.parent_config is not None
    async with store.engine.connect() as conn:
        blobs = (
            (
                await conn.execute(
                    text("SELECT channel FROM histstore_checkpoint_blobs WHERE thread_id = :t"),
                    {"t": thread},
                )
            )
            .scalars()
            .all()
        )
    assert sorted(blobs) == ["a", "b", "b"]  # "a" once; scalars stay in the checkpoint
    await saver.aprune([thread])
    latest = await saver.aget_tuple(thread_config(thread, checkpoint_ns=""))
    assert latest is not None
    assert latest.checkpoint["channel_values"] == got.checkpoint["channel_values"]
    assert latest.parent_config is None
    async with store.engine.connect() as conn:
        count = (
            await conn.execute(
                text("SELECT count(*) FROM histstore_checkpoint_blobs WHERE thread_id = :t"),
                {"t": thread},
            )
        ).scalar()
    assert count == 2  # the old "b" went with the checkpoint that read it


async def test_only_checkpoints_past_a_megabyte_are_decoded_off_the_loop(store, monkeypatch):
    """Decoding holds the GIL, so a worker thread pays off only for very large
    checkpoints; smaller ones are decoded on the loop, as LangGraph's own savers do."""
    from histstore.integrations import langgraph as module

    decoded_on: list[int] = []
    real_load = module.load

    def recording_load(*args: Any) -> Any:
        decoded_on.append(threading.get_ident())
        return real_load(*args)

    monkeypatch.setattr(module, "load", recording_load)
    saver = HiststoreSaver(store)
    for size, in_thread in ((100_000, False), (1_500_000, True)):
        values = {"items": ["x" * 1000 for _ in range(size // 1000)]}
        stored = await put(saver, new_thread(), values=values)
        decoded_on.clear()
        got = await saver.aget_tuple(stored)
        assert got is not None
        assert got.checkpoint["channel_values"] == values
        assert (decoded_on != [threading.get_ident()]) is in_thread, size


async def test_versions_increase_and_differ_between_branches(store):
    saver = HiststoreSaver(store)
    one = saver.get_next_version(None, None)
    assert saver.get_next_version(one, None) > one
    assert saver.get_next_version(one, None) != saver.get_next_version(one, None)
    assert saver.get_next_version(3, None).startswith("0" * 31 + "4.")  # type: ignore[arg-type]


async def test_list_across_threads_pages_and_filters(store):
    saver = HiststoreSaver(store)
    threads = [new_thread() for _ in range(3)]
    for t in threads:
        parent = None
        for step in range(120):
            parent = await put(saver, t, parent=parent, step=step, source="loop")
    listed = [c async for c in saver.alist(thread_config(threads[0]))]
    assert len(listed) == 120
    ids = [c.checkpoint["id"] for c in listed]
    assert ids == sorted(ids, reverse=True)
    everything = [c async for c in saver.alist(None, filter={"step": 7})]
    assert sorted(c.config["configurable"]["thread_id"] for c in everything) == sorted(threads)
    assert len([c async for c in saver.alist(None, limit=250)]) == 250
    few = [
        c async for c in saver.alist(thread_config(threads[1]), filter={"source": "loop"}, limit=3)
    ]
    assert [c.metadata["step"] for c in few] == [119, 118, 117]
    one = [c async for c in saver.alist(thread_config(threads[2], checkpoint_id=ids[0]))]
    assert one == []  # that id belongs to another thread
    assert [c async for c in saver.alist(thread_config(threads[0]), limit=0)] == []


async def test_copy_thread_refuses_an_existing_target_and_unknown_source(store):
    saver = HiststoreSaver(store)
    source, target = new_thread(), new_thread()
    await put(saver, source)
    await put(saver, target)
    with pytest.raises(ConflictError):
        await saver.acopy_thread(source, target)
    with pytest.raises(NotFound):
        await saver.acopy_thread(new_thread(), new_thread())


async def test_scoped_store_confines_threads_to_their_owner(store):
    alice = HiststoreSaver(store.scoped("alice"))
    bob = HiststoreSaver(store.scoped("bob"))
    everyone = HiststoreSaver(store)
    thread = new_thread()
    stored = await put(alice, thread, values={"v": [1]})
    await alice.aput_writes(stored, [("ch", "w")], "task-1")

    assert await bob.aget_tuple(stored) is None
    assert [c async for c in bob.alist(thread_config(thread))] == []
    assert [c async for c in bob.alist(None)] == []
    with pytest.raises(NotFound):
        await put(bob, thread)
    with pytest.raises(NotFound):
        await bob.aput_writes(stored, [("ch", "w")], "task-2")
    with pytest.raises(NotFound):
        await bob.acopy_thread(thread, new_thread())
    await bob.adelete_thread(thread)
    await bob.aprune([thread], strategy="delete")
    await bob.adelete_for_runs(["run"])
    assert await alice.aget_tuple(stored) is not None

    seen = await everyone.aget_tuple(stored)
    assert seen is not None
    assert seen.pending_writes == [("task-1", "ch", "w")]
    copy = new_thread()
    await alice.acopy_thread(thread, copy)
    assert await alice.aget_tuple(thread_config(copy)) is not None
    assert await bob.aget_tuple(thread_config(copy)) is None
    await alice.adelete_thread(thread)
    assert await everyone.aget_tuple(stored) is None


async def test_bad_input_gets_typed_errors_and_writes_nothing(store):
    saver = HiststoreSaver(store)
    cp = generate_checkpoint()
    for bad in ("", " padded", "x" * 256, "nul\x00"):
        with pytest.raises(InvalidId):
            await saver.aput(thread_config(bad, checkpoint_ns=""), cp, {}, {})
        with pytest.raises(InvalidId):
            await saver.aget_tuple(thread_config(bad))
    with pytest.raises(InvalidId, match="thread_id"):
        await saver.aget_tuple({"configurable": {}})
    thread = new_thread()
    with pytest.raises(InvalidMessage):
        await saver.aput(
            thread_config(thread, checkpoint_ns=""), cp, {"step": 1, "when": object()}, {}
        )  # type: ignore[typeddict-unknown-key]
    with pytest.raises(InvalidMessage):
        await saver.aput(thread_config(thread, checkpoint_ns=""), cp, {"x": float("nan")}, {})  # type: ignore[typeddict-unknown-key]
    assert await saver.aget_tuple(thread_config(thread)) is None
    with pytest.raises(ValueError, match="strategy"):
        await saver.aprune([thread], strategy="everything")
    with pytest.raises(TypeError):
        HiststoreSaver(object())  # type: ignore[arg-type]
    uuid_thread = uuid.uuid4()
    stored = await saver.aput(thread_config(uuid_thread, checkpoint_ns=""), cp, {}, {})  # type: ignore[arg-type]
    assert stored["configurable"]["thread_id"] == str(uuid_thread)
    assert await saver.aget_tuple(thread_config(str(uuid_thread))) is not None


async def test_keep_latest_refuses_delta_channel_threads(store):
    saver = HiststoreSaver(store)
    thread = new_thread()
    first = await put(saver, thread)
    await put(saver, thread, parent=first, counters_since_delta_snapshot={"ch": [1, 1]})
    with pytest.raises(NotImplementedError, match="DeltaChannel"):
        await saver.aprune([thread])
    assert len([c async for c in saver.alist(thread_config(thread))]) == 2
    await saver.aprune([thread], strategy="delete")
    assert [c async for c in saver.alist(thread_config(thread))] == []


async def test_keep_latest_keeps_what_an_interrupted_graph_resumes_from(store):
    """Each namespace keeps its latest checkpoint, with the values and pending writes
    (the interrupt) it needs: the pruned thread resumes as an unpruned one does."""
    saver = HiststoreSaver(store)
    graph = interrupting_graph().compile(checkpointer=saver)
    pruned, control = new_thread(), new_thread()
    for thread in (pruned, control):
        assert (await graph.ainvoke({"log": []}, thread_config(thread)))["__interrupt__"]
    before = await graph.aget_state(thread_config(pruned), subgraphs=True)
    count = len([c async for c in saver.alist(thread_config(control))])

    await saver.aprune([pruned])
    listed = [c async for c in saver.alist(thread_config(pruned))]
    namespaces = [c.config["configurable"]["checkpoint_ns"] for c in listed]
    assert len(namespaces) == len(set(namespaces)) == 2  # the root and the subgraph
    assert all(c.parent_config is None for c in listed)
    after = await graph.aget_state(thread_config(pruned), subgraphs=True)
    assert (after.values, after.next) == (before.values, before.next)
    assert after.tasks[0].interrupts == before.tasks[0].interrupts
    assert after.tasks[0].state.values == before.tasks[0].state.values  # type: ignore[union-attr]
    assert len([c async for c in saver.alist(thread_config(control))]) == count

    resumed = [
        await graph.ainvoke(Command(resume="yes"), thread_config(t)) for t in (pruned, control)
    ]
    assert resumed[0] == resumed[1]
    assert resumed[0]["log"][-2:] == ["approved:yes", "finished"]


async def test_purge_and_the_thread_catalog_see_only_a_views_threads(store):
    alice, bob = CheckpointStore(store.scoped("alice")), CheckpointStore(store.scoped("bob"))
    mine, theirs = new_thread(), new_thread()
    await put(HiststoreSaver(store.scoped("alice")), mine)
    await put(HiststoreSaver(store.scoped("bob")), theirs)
    assert [t.thread_id for t in await bob.threads()] == [theirs]
    with pytest.raises(NotFound):
        await bob.thread(mine)
    with pytest.raises(NotFound):
        await bob.checkpoints(mine)
    assert await bob.idle_threads(timedelta(0)) == [theirs]
    assert await bob.purge(idle_for=timedelta(days=1)) == 0  # not idle that long
    assert await bob.purge(idle_for=timedelta(0)) == 1
    assert [t.thread_id for t in await CheckpointStore(store).threads()] == [mine]
    assert (await alice.thread(mine)).checkpoints == 1


# ---------------------------------------------------------------------- storage details


async def test_sqlite_writes_use_the_stores_settings_and_begin_immediate(tmp_path: Path):
    path = tmp_path / "lock.db"
    async with histstore.connect(path, durability="process", busy_timeout=0.2) as store:
        saver = HiststoreSaver(store)
        import sqlite3

        other = sqlite3.connect(path, isolation_level=None)
        try:
            other.execute("BEGIN IMMEDIATE")
            started = time.monotonic()
            with pytest.raises(HistStoreError) as info:
                await put(saver, new_thread())
            # It waited the store's busy timeout (0.2 s, not the default 30 s) for the
            # lock, then failed as a write the lock refused.
            assert 0.15 <= time.monotonic() - started < 10
            assert not isinstance(info.value, (InvalidId, InvalidMessage))
            other.execute("ROLLBACK")
        finally:
            other.close()
        await put(saver, new_thread())


async def _tables(store: histstore.Store) -> set[str]:
    async with store.engine.connect() as conn:
        names = await conn.run_sync(lambda c: inspect(c).get_table_names())
    return {n for n in names if n.startswith("histstore_")}


async def test_migration_upgrades_and_downgrades_a_database_holding_data(empty_url):
    async with histstore.connect(empty_url, migrate=False) as store:
        await alembic(store.engine, "upgrade", "3066f0ac1a5e")
        assert not (await _tables(store)) & CHECKPOINT_TABLES
        # Written as that revision's schema holds it (today's write path needs today's).
        now = datetime.now(timezone.utc)
        async with store.engine.begin() as conn:
            await conn.execute(
                insert(_schema.conversations).values(
                    id="conv", owner=None, length=1, created_at=now, updated_at=now
                )
            )
            await conn.execute(
                insert(_schema.messages).values(
                    conversation_id="conv",
                    position=0,
                    role="user",
                    data='{"role": "user", "content": "kept"}',
                    created_at=now,
                )
            )
            await conn.execute(
                text(
                    "INSERT INTO histstore_metadata (conversation_id, key, value, digest)"
                    " VALUES ('conv', 'k', '1', :digest)"
                ),
                {"digest": _codec.canonical_digest(1)},
            )

        await alembic(store.engine, "upgrade", "head")
        assert await _tables(store) >= CHECKPOINT_TABLES
        await alembic(store.engine, "check")
        assert [m.content for m in await store.read("conv")] == ["kept"]
        saver = HiststoreSaver(store)
        thread = new_thread()
        stored = await put(saver, thread, values={"v": {"x": 1}})
        await saver.aput_writes(stored, [("ch", 1)], "task")

        await alembic(store.engine, "downgrade", "3066f0ac1a5e")
        assert not (await _tables(store)) & CHECKPOINT_TABLES
        async with store.engine.connect() as conn:  # that revision's schema, read as such
            rows = (await conn.execute(text("SELECT data FROM histstore_messages"))).all()
        assert [json.loads(r[0])["content"] for r in rows] == ["kept"]
        assert await store.metadata("conv") == {"k": 1}

        await alembic(store.engine, "upgrade", "head")
        assert await HiststoreSaver(store).aget_tuple(thread_config(thread)) is None
    async with histstore.connect(empty_url) as store:  # current: opens without migrating
        assert await store.count("conv") == 1


def test_import_without_langgraph_names_the_extra():
    code = "import sys; sys.modules['langgraph'] = None\nimport histstore.integrations.langgraph\n"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode != 0
    assert "ImportError" in proc.stderr
    assert "pip install 'histstore[langgraph]'" in proc.stderr
