"""LangGraph threads in export, import and copy (format version 3): a saver on the copy
sees every checkpoint with the same values, parents and pending writes, on every backend."""

from __future__ import annotations

import io
import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, HumanMessage
from langgraph_graphs import call_weather, tool_loop

import histstore
from histstore import Message, NotFound, admin
from histstore.integrations.langgraph import HiststoreSaver

T = "2024-01-02T03:04:05.123456+00:00"


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def agent_graph(saver: HiststoreSaver, replies: list[AIMessage]) -> Any:
    return tool_loop(GenericFakeChatModel(messages=iter(replies))).compile(checkpointer=saver)


def weather_turn(city: str) -> list[AIMessage]:
    return [call_weather(city, new_id("call")), AIMessage(f"Sunny in {city}.")]


async def run_threads(saver: HiststoreSaver, threads: list[str], turns: int = 2) -> None:
    for thread in threads:
        replies = [m for i in range(turns) for m in weather_turn(f"city {i}")]
        graph = agent_graph(saver, replies)
        for i in range(turns):
            config = {"configurable": {"thread_id": thread}}
            await graph.ainvoke({"messages": [HumanMessage(f"weather {i}?")]}, config)


async def seen(saver: HiststoreSaver, thread: str) -> list[tuple[Any, ...]]:
    """Everything a saver sees of a thread: each checkpoint, newest first."""
    return [
        (t.config, t.checkpoint, t.metadata, t.parent_config, t.pending_writes)
        async for t in saver.alist({"configurable": {"thread_id": thread}})
    ]


async def export_text(store: histstore.Store, **options: Any) -> str:
    out = io.StringIO()
    await admin.export_store(store, out, **options)
    return out.getvalue()


def lines(text: str) -> list[bytes]:
    return [line.encode() + b"\n" for line in text.splitlines()]


async def test_export_and_import_carry_every_checkpoint_value_and_write(
    store: histstore.Store,
) -> None:
    saver = HiststoreSaver(store)
    threads = [new_id("thread"), new_id("thread")]
    await run_threads(saver, threads)
    cid = new_id("conv")
    await store.write(cid, [Message.user("hi")])
    before = {t: await seen(saver, t) for t in threads}
    assert all(len(v) >= 8 and any(c[4] for c in v) for v in before.values())

    text = await export_text(store, batch=3)  # threads larger than a batch
    records = [json.loads(line) for line in text.splitlines()]
    assert records[0]["version"] == 4  # threads carry their messages' text records
    assert records[-1]["threads"] == 2
    assert records[-1]["checkpoints"] == sum(len(v) for v in before.values())

    for thread in threads:
        await saver.adelete_thread(thread)
    await store.clear(cid)
    stats = await admin.import_store(store, lines(text), batch=3)
    assert (stats.conversations, stats.threads, stats.skipped_threads) == (1, 2, 0)
    assert {t: await seen(saver, t) for t in threads} == before
    assert [m.content for m in await store.read(cid)] == ["hi"]

    again = await admin.import_store(store, lines(text))
    assert (again.skipped, again.threads, again.skipped_threads) == (1, 0, 2)
    assert {t: await seen(saver, t) for t in threads} == before

    # The graph goes on from the imported state.
    graph = agent_graph(saver, weather_turn("Oslo"))
    config = {"configurable": {"thread_id": threads[0]}}
    result = await graph.ainvoke({"messages": [HumanMessage("and Oslo?")]}, config)
    assert (
        len(result["messages"]) == len(before[threads[0]][0][1]["channel_values"]["messages"]) + 4
    )


async def test_import_replaces_a_thread_that_differs_and_keeps_others(
    store: histstore.Store,
) -> None:
    saver = HiststoreSaver(store)
    thread, other = new_id("thread"), new_id("thread")
    await run_threads(saver, [thread], turns=1)
    text = await export_text(store)
    wanted = await seen(saver, thread)
    await run_threads(saver, [thread, other], turns=1)  # the thread moves on; another one
    assert len(await seen(saver, thread)) > len(wanted)
    stats = await admin.import_store(store, lines(text))
    assert (stats.threads, stats.skipped_threads) == (1, 0)
    assert await seen(saver, thread) == wanted
    assert len(await seen(saver, other)) > 0


async def test_copy_from_sqlite_carries_threads(store: histstore.Store, tmp_path: Path) -> None:
    """SQLite file to every backend: to PostgreSQL, the backend move the README describes."""
    thread = new_id("thread")
    async with histstore.connect(tmp_path / "lg.db") as source:
        src_saver = HiststoreSaver(source)
        await run_threads(src_saver, [thread], turns=3)
        wanted = await seen(src_saver, thread)
        stats = await admin.copy_store(source, store, batch=4)
        assert (stats.threads, stats.checkpoints) == (1, len(wanted))
        again = await admin.copy_store(source, store)
        assert (again.threads, again.skipped_threads) == (0, 1)
    assert await seen(HiststoreSaver(store), thread) == wanted


async def test_exporting_chosen_threads_or_conversations(store: histstore.Store) -> None:
    saver = HiststoreSaver(store)
    one, two = new_id("thread"), new_id("thread")
    await run_threads(saver, [one, two], turns=1)
    cid = new_id("conv")
    await store.write(cid, [Message.user("hi")])

    only_conv = [json.loads(x) for x in (await export_text(store, ids=[cid])).splitlines()]
    assert only_conv[0]["version"] == 2  # no thread: readable by older versions
    assert "thread" not in {r.get("type") for r in only_conv}
    assert [r["id"] for r in only_conv if r.get("type") == "conversation"] == [cid]

    only_two = [json.loads(x) for x in (await export_text(store, threads=[two])).splitlines()]
    assert [r["id"] for r in only_two if r.get("type") in ("thread", "conversation")] == [two]
    with pytest.raises(NotFound):
        await export_text(store, threads=[new_id("thread")])


async def test_scoped_views_carry_only_their_own_threads(store: histstore.Store) -> None:
    thread = new_id("thread")
    await run_threads(HiststoreSaver(store.scoped("alice")), [thread], turns=1)
    assert "thread" not in await export_text(store.scoped("bob"))
    text = await export_text(store.scoped("alice"))
    assert f'"id":"{thread}"' in text
    with pytest.raises(NotFound):
        await admin.import_store(store.scoped("bob"), lines(text))


def thread_file(thread: str, rows: list[dict[str, Any]], **counts: int) -> list[bytes]:
    owner = {"owner": None, "created_at": T, "updated_at": T}
    kinds = {"checkpoint": 0, "blob": 0, "channel": 0, "write": 0}
    for row in rows:
        kinds[row["type"]] += 1
    kinds.update(counts)
    records = [
        {"format": "histstore", "version": 3, "exported_at": T},
        {"type": "thread", "id": thread, "row": owner, "rows": kinds},
        *rows,
        {"type": "end", "thread": thread},
        {
            "type": "footer",
            "conversations": 0,
            "messages": 0,
            "threads": 1,
            "checkpoints": kinds["checkpoint"],
        },
    ]
    return [(json.dumps(r) + "\n").encode() for r in records]


def checkpoint_row(**changes: Any) -> dict[str, Any]:
    row = {
        "checkpoint_ns": "",
        "checkpoint_id": "1f0",
        "parent_checkpoint_id": None,
        "run_id": None,
        "type": "msgpack",
        "checkpoint": "AAE=",
        "metadata": "{}",
        "created_at": T,
    }
    return {"type": "checkpoint", "row": {**row, **changes}}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"checkpoint": "not base64!"}, "not base64"),
        ({"colour": "blue"}, "unknown column 'colour'"),
        ({"type": None}, "may not be null"),
        ({"metadata": "nul\x00"}, "NUL"),
        ({"created_at": "yesterday"}, "ISO 8601"),
    ],
)
async def test_a_bad_thread_record_names_its_line_and_stores_nothing(
    store: histstore.Store, change: dict[str, Any], message: str
) -> None:
    thread = new_id("thread")
    good = checkpoint_row(checkpoint_id="1f0")
    bad = checkpoint_row(checkpoint_id="1f1", **change)
    with pytest.raises(admin.FormatError, match=f"line 4: thread {thread!r}: .*{message}"):
        await admin.import_store(store, thread_file(thread, [good, bad]))
    assert await seen(HiststoreSaver(store), thread) == []


async def test_thread_counts_are_checked(store: histstore.Store) -> None:
    thread = new_id("thread")
    with pytest.raises(admin.FormatError, match=r"counts do not match|end record"):
        await admin.import_store(store, thread_file(thread, [checkpoint_row()], checkpoint=2))
    with pytest.raises(admin.FormatError, match="end record"):
        await admin.import_store(store, thread_file(thread, [checkpoint_row()], checkpoint=0))
    assert await seen(HiststoreSaver(store), thread) == []
    stored = await admin.import_store(store, thread_file(thread, [checkpoint_row()]))
    assert (stored.threads, stored.checkpoints) == (1, 1)


async def test_a_version_2_file_still_imports(store: histstore.Store) -> None:
    cid = new_id("conv")
    records = [
        {"format": "histstore", "version": 2, "exported_at": T},
        {
            "type": "conversation",
            "id": cid,
            "user": None,
            "system_prompt": None,
            "created_at": T,
            "updated_at": T,
            "messages": 1,
            "metadata": {},
            "revision": 1,
            "next_entry": 2,
            "next_aside": 1,
            "halted": None,
        },
        {
            "type": "message",
            "position": 0,
            "created_at": T,
            "token_count": None,
            "entry_id": 1,
            "author": None,
            "data": {"role": "user", "content": "hi"},
        },
        {"type": "change", "revision": 1, "kind": "write", "author": None, "at": T, "added": 1},
        {"type": "end", "id": cid},
        {"type": "footer", "conversations": 1, "messages": 1},
    ]
    stats = await admin.import_store(store, [(json.dumps(r) + "\n").encode() for r in records])
    assert (stats.conversations, stats.threads) == (1, 0)
    assert [m.content for m in await store.read(cid)] == ["hi"]
    thread_in_v2 = [*records[:-1], {"type": "thread", "id": "t", "row": {}, "rows": {}}]
    with pytest.raises(admin.FormatError, match="expected a conversation record"):
        await admin.import_store(store, [(json.dumps(r) + "\n").encode() for r in thread_in_v2])


class ClosedPipe(io.StringIO):
    """A reader that goes away after ``keep`` characters (``histstore export | head``)."""

    def __init__(self, keep: int) -> None:
        super().__init__()
        self.keep = keep

    def write(self, text: str) -> int:
        if self.tell() + len(text) > self.keep:
            raise BrokenPipeError(32, "Broken pipe")
        return super().write(text)


@pytest.mark.parametrize("keep", [0, 2_000, 20_000])
async def test_a_closed_output_is_the_outputs_error_not_the_databases(
    store: histstore.Store, keep: int
) -> None:
    """The output fails while a conversation's or a thread's snapshot is open: the
    caller gets the stream's own ``BrokenPipeError``, not a ``DatabaseFailure``."""
    saver = HiststoreSaver(store)
    await run_threads(saver, [new_id("thread")], turns=3)
    await store.write(new_id("conv"), [Message.user("x" * 500)] * 20)
    assert len(await export_text(store)) > 20_000
    with pytest.raises(BrokenPipeError) as caught:
        await admin.export_store(store, ClosedPipe(keep), batch=3)
    assert not isinstance(caught.value, histstore.HistStoreError)
    assert await store.conversations()  # the store goes on
