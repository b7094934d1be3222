"""A LangGraph thread's messages are found by ``store.search`` (a hit names the thread),
indexed as they are added, and gone with the thread."""

from __future__ import annotations

import asyncio
import io
import json
from pathlib import Path
from typing import Any

import pytest
from cli_runner import ok
from helpers import CLI_WITHOUT_LANGGRAPH, PYTHON, alembic, subprocess_env
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, HumanMessage
from langgraph_graphs import call_weather, tool_loop
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

import histstore
from histstore import admin
from histstore._storage import schema as _schema
from histstore.checkpoints import CheckpointStore
from histstore.integrations.langgraph import HiststoreSaver

TEXT = _schema.checkpoint_text


async def text_rows(store: histstore.Store, thread: str | None = None) -> int:
    query = select(func.count()).select_from(TEXT)
    if thread is not None:
        query = query.where(TEXT.c.thread_id == thread)
    async with store.engine.connect() as conn:
        return int((await conn.execute(query)).scalar_one())


def chat(turns: int) -> tuple[GenericFakeChatModel, list[str]]:
    """A model answering ``turns`` questions, the first by way of the weather tool."""
    replies = [call_weather("Paris", "call-1"), AIMessage("Paris is sunny, says zanzibar")]
    replies += [AIMessage(f"answer number {i} quokka") for i in range(1, turns)]
    return GenericFakeChatModel(messages=iter(replies)), [
        f"question {i} wombat" for i in range(turns)
    ]


async def run(store: histstore.Store, thread: str, turns: int) -> dict[str, Any]:
    model, questions = chat(turns)
    graph = tool_loop(model).compile(checkpointer=HiststoreSaver(store))
    config: Any = {"configurable": {"thread_id": thread}}
    out: dict[str, Any] = {}
    for question in questions:
        out = await graph.ainvoke({"messages": [HumanMessage(question)]}, config)
    return out


async def test_search_finds_a_threads_human_and_ai_messages(store: histstore.Store) -> None:
    out = await run(store, "t-search", 3)
    await store.write("c", [{"role": "user", "content": "a wombat in a conversation"}])

    hits = await store.search("zanzibar")
    assert [(h.thread, h.conversation, h.message.role) for h in hits] == [
        ("t-search", "t-search", "assistant")
    ]
    assert "zanzibar" in hits[0].message.content
    assert out["messages"][hits[0].position].content == "Paris is sunny, says zanzibar"

    hits = await store.search('"question 2"')
    assert [(h.thread, h.message.role, h.message.content) for h in hits] == [
        ("t-search", "user", "question 2 wombat")
    ]
    # The tool call's arguments are text too.
    assert [h.position for h in await store.search("paris")][:1] != []

    both = await store.search("wombat", limit=10)
    assert {h.thread for h in both} == {None, "t-search"}
    assert len(both) == 4
    assert sorted(both, key=lambda h: -h.score) == both
    assert len(await store.search("wombat", limit=2)) == 2
    # A search of one conversation finds its messages only.
    assert [h.thread for h in await store.search("wombat", conversation="c")] == [None]


async def test_each_item_is_indexed_once(store: histstore.Store) -> None:
    out = await run(store, "t-once", 12)
    # One row per message, however many checkpoints stored values extending others.
    assert await text_rows(store, "t-once") == len(out["messages"])


async def test_scoped_stores_find_their_own_threads(store: histstore.Store) -> None:
    await run(store.scoped("alice"), "t-alice", 1)
    await run(store, "t-nobody", 1)
    assert {h.thread for h in await store.search("wombat")} == {"t-alice", "t-nobody"}
    assert [h.thread for h in await store.scoped("alice").search("wombat")] == ["t-alice"]
    assert await store.scoped("bob").search("wombat") == []


async def test_delete_and_prune(store: histstore.Store) -> None:
    await run(store, "t-gone", 2)
    await run(store, "t-kept", 2)
    saver = HiststoreSaver(store)
    await saver.adelete_thread("t-gone")
    assert {h.thread for h in await store.search("wombat")} == {"t-kept"}
    assert await text_rows(store, "t-gone") == 0
    await saver.aprune(["t-kept"], strategy="keep_latest")
    assert len(await store.search("wombat")) == 2  # the newest value's messages stay
    await saver.acopy_thread("t-kept", "t-copy")
    assert {h.thread for h in await store.search("wombat")} == {"t-kept", "t-copy"}
    await saver.aprune(["t-kept", "t-copy"], strategy="delete")
    assert await store.search("wombat") == []
    assert await text_rows(store) == 0


async def test_copy_and_export_carry_the_text(store: histstore.Store, tmp_path: Path) -> None:
    """A SQLite file's thread copied to every backend is found there; an exported file
    imports searchable, and a file without the text (exported before it) imports
    unindexed."""
    async with histstore.connect(tmp_path / "lg.db") as source:
        await run(source, "t-moved", 2)
        stats = await admin.copy_store(source, store)
        assert stats.threads == 1
        out = io.StringIO()
        await admin.export_store(source, out, threads=["t-moved"])
    assert [(h.thread, h.message.role) for h in await store.search("zanzibar")] == [
        ("t-moved", "assistant")
    ]
    assert await text_rows(store, "t-moved") == await text_rows(store)
    exported = [json.loads(line) for line in out.getvalue().splitlines()]
    await HiststoreSaver(store).adelete_thread("t-moved")
    await admin.import_store(store, [json.dumps(r).encode() + b"\n" for r in exported])
    assert [h.thread for h in await store.search("zanzibar")] == ["t-moved"]

    # As a file made before the text: no text records, no count of them.
    older = []
    for record in exported:
        if record.get("type") == "text":
            continue
        if record.get("type") == "thread":
            record["rows"].pop("text")
        older.append(json.dumps(record).encode() + b"\n")
    await admin.import_store(store, older)
    assert await store.search("zanzibar") == []
    found = await HiststoreSaver(store).aget_tuple({"configurable": {"thread_id": "t-moved"}})
    assert found is not None
    assert len(found.checkpoint["channel_values"]["messages"]) == 6


async def test_extensions_index_only_the_items_they_add(
    store: histstore.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each message's text is written once, when the value adding it is stored: the
    texts written follow the messages, not messages x checkpoints."""
    written: list[int] = []
    put = CheckpointStore.put

    async def counting(self: CheckpointStore, *args: Any, **kwargs: Any) -> bool:
        written.append(len(kwargs.get("texts", ())))
        return await put(self, *args, **kwargs)

    monkeypatch.setattr(CheckpointStore, "put", counting)
    out = await run(store, "t-cost", 30)
    assert len(written) > 60  # checkpoints
    assert sum(written) == len(out["messages"])


async def test_the_cli_search_names_the_thread(shared_backend: Any) -> None:
    url = shared_backend.url
    async with histstore.connect(url) as store:
        await run(store, "t-cli", 2)
        await store.write("c-cli", [{"role": "user", "content": "zanzibar in a conversation"}])
    result = await ok("search", "zanzibar", "--url", url)
    assert "thread t-cli  #3  assistant" in result.out
    assert "c-cli  #0  user" in result.out
    records = [
        json.loads(line)
        for line in (await ok("search", "zanzibar", "--json", "--url", url)).out.splitlines()
    ]
    assert {(r.get("thread"), r["conversation"]) for r in records} == {
        ("t-cli", "t-cli"),
        (None, "c-cli"),
    }


PREVIOUS = "a7c3e9f1b5d8"
"""The revision before thread text (6b2d9e4f1a37)."""


async def test_the_upgrade_leaves_older_threads_to_reindex_and_the_downgrade_drops_the_text(
    engine: AsyncEngine, empty_url: str
) -> None:
    """A thread stored at the previous revision (its tables are as that revision left
    them) is not searchable after the upgrade until ``reindex --threads``; its next
    turn's messages are. A downgrade drops the text and keeps the thread."""
    await alembic(engine, "upgrade", "head")
    async with histstore.connect(empty_url) as store:
        await run(store, "t-old", 2)
    await alembic(engine, "downgrade", PREVIOUS)
    assert "histstore_checkpoint_text" not in await table_names(engine)
    await alembic(engine, "upgrade", "head")
    await alembic(engine, "check")
    async with histstore.connect(empty_url) as store:
        assert await store.search("zanzibar") == []
        model = GenericFakeChatModel(messages=iter([AIMessage("a later pangolin")]))
        graph = tool_loop(model).compile(checkpointer=HiststoreSaver(store))
        config: Any = {"configurable": {"thread_id": "t-old"}}
        out = await graph.ainvoke({"messages": [HumanMessage("later")]}, config)
        assert [h.position for h in await store.search("pangolin")] == [7]
        assert await store.search("zanzibar") == []
    result = await ok("reindex", "--threads", "--url", empty_url)
    assert "indexed 8 messages of LangGraph threads" in result.out
    async with histstore.connect(empty_url) as store:
        assert [h.thread for h in await store.search("zanzibar")] == ["t-old"]
        assert await text_rows(store, "t-old") == len(out["messages"])
    await alembic(engine, "downgrade", PREVIOUS)
    async with histstore.connect(empty_url, migrate=False) as store:
        found = await HiststoreSaver(store).aget_tuple(config)  # the thread stays
        assert found is not None
        assert len(found.checkpoint["channel_values"]["messages"]) == 8


async def table_names(engine: AsyncEngine) -> set[str]:
    async with engine.connect() as conn:
        return set(await conn.run_sync(lambda c: c.dialect.get_table_names(c)))


async def test_reindex_threads_without_langgraph_says_what_to_install(tmp_path: Path) -> None:
    url = str(tmp_path / "lg.db")
    async with histstore.connect(url) as store:
        await run(store, "t-x", 1)
    script = CLI_WITHOUT_LANGGRAPH
    proc = await asyncio.create_subprocess_exec(
        PYTHON, "-c", script, "reindex", "--threads", "--url", url,
        env={**subprocess_env(), "NO_COLOR": "1"},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await proc.communicate()
    assert proc.returncode == 1
    assert "reindexed 0 messages" in out.decode()  # the conversations' part ran
    assert "threads were not reindexed" in err.decode()
    assert "pip install 'histstore[langgraph]'" in err.decode()
