"""HiststoreChatStore: LlamaIndex's ``Memory`` and agents on every backend.

``Memory`` is always given ``tokenizer_fn=str.split``: its default tokenizer is tiktoken's,
which downloads its encoding on first use. Nothing else of LlamaIndex downloads data
when these tests import or run it.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from cli_runner import ok
from llama_index.core.agent.workflow import FunctionAgent
from llama_index.core.base.llms.types import (
    ChatMessage,
    CitableBlock,
    ImageBlock,
    MessageRole,
    TextBlock,
    ThinkingBlock,
    ToolCallBlock,
)
from llama_index.core.llms.mock import MockFunctionCallingLLM
from llama_index.core.memory import Memory
from llama_index.core.storage.chat_store.base_db import MessageStatus
from llama_index.core.tools import FunctionTool

import histstore
from histstore import InvalidId, Store, indexed_text
from histstore.integrations.llama_index import ARCHIVE_SUFFIX, HiststoreChatStore

# The workflow engine under LlamaIndex's agents reads pydantic's deprecated ``__fields__``.
pytestmark = pytest.mark.filterwarnings("ignore::pydantic.warnings.PydanticDeprecationWarning")

ACTIVE, ARCHIVED = MessageStatus.ACTIVE, MessageStatus.ARCHIVED


def memory(chat_store: HiststoreChatStore, key: str, token_limit: int = 40) -> Memory:
    return Memory.from_defaults(
        session_id=key,
        chat_store=chat_store,
        token_limit=token_limit,
        token_flush_size=10,
        tokenizer_fn=str.split,
    )


def turn(i: int) -> list[ChatMessage]:
    return [
        ChatMessage(role="user", content=f"question {i} about apples"),
        ChatMessage(role="assistant", content=f"answer {i} about pears"),
    ]


async def test_memory_archives_the_oldest_and_keeps_them_readable(store: Store, cid: str) -> None:
    chat_store = HiststoreChatStore(store)
    mem = memory(chat_store, cid)
    sent = [m for i in range(12) for m in turn(i)]
    for message in sent:
        await mem.aput(message)
    active = await chat_store.get_messages(cid)
    archived = await chat_store.get_messages(cid, ARCHIVED)
    assert archived + active == sent
    assert archived
    assert active
    assert await mem.aget() == active  # no memory blocks: the active queue as stored
    assert await chat_store.get_messages(cid, None) == sent
    assert await chat_store.count_messages(cid) == len(active)
    assert await chat_store.count_messages(cid, ARCHIVED) == len(archived)
    assert await chat_store.count_messages(cid, None) == len(sent)
    # Both are histstore conversations: roles, text and search as any other.
    assert await store.count(cid) == len(active)
    stored = await store.read(cid + ARCHIVE_SUFFIX, limit=2)
    assert [m.role for m in stored] == ["user", "assistant"]
    hits = await store.search('"question 0"')
    assert [(h.conversation, h.position) for h in hits] == [(cid + ARCHIVE_SUFFIX, 0)]
    assert await chat_store.get_keys() == [cid]


async def test_offset_and_limit_run_over_the_archive_then_the_active(
    store: Store, cid: str
) -> None:
    chat_store = HiststoreChatStore(store)
    sent = [m for i in range(5) for m in turn(i)]
    await chat_store.add_messages(cid, sent)
    assert await chat_store.archive_oldest_messages(cid, 3) == sent[:3]
    for status, expected in [(None, sent), (ACTIVE, sent[3:]), (ARCHIVED, sent[:3])]:
        for offset in (None, 0, 1, 2, 3, 4, 9, 10, 11):
            for limit in (None, 0, 1, 2, 5, 20):
                got = await chat_store.get_messages(cid, status, limit=limit, offset=offset)
                start = offset or 0
                assert got == expected[start : None if limit is None else start + limit]
    with pytest.raises(ValueError, match="limit"):
        await chat_store.get_messages(cid, limit=-1)


async def test_function_agent_with_a_scripted_llm_keeps_its_turns(store: Store, cid: str) -> None:
    def respond(messages: Any, **kwargs: Any) -> ChatMessage:
        last = messages[-1]
        if last.role == MessageRole.TOOL:
            return ChatMessage(role="assistant", content=f"Answer: {last.content}")
        call = ToolCallBlock(
            tool_call_id=f"call-{uuid.uuid4().hex[:6]}",
            tool_name="get_weather",
            tool_kwargs={"city": last.content},
        )
        return ChatMessage(role="assistant", blocks=[call])

    def get_weather(city: str) -> str:
        """The weather in a city."""
        return f"hail over {city}"

    llm = MockFunctionCallingLLM(response_generator=respond)
    agent = FunctionAgent(tools=[FunctionTool.from_defaults(get_weather)], llm=llm)
    chat_store = HiststoreChatStore(store)
    mem = memory(chat_store, cid, token_limit=100_000)
    for city in ["Reykjavik", "Tromso"]:
        result = await agent.run(city, memory=mem)
        assert str(result) == f"Answer: hail over {city}"
    stored = await store.read(cid)
    assert [m.role for m in stored] == ["user", "assistant", "tool", "assistant"] * 2
    assert await chat_store.get_messages(cid) == await mem.aget_all()
    call = (await chat_store.get_messages(cid))[1]
    assert isinstance(call.blocks[0], ToolCallBlock)
    assert indexed_text(stored[1]) == "Reykjavik"
    assert indexed_text(stored[2]) == "hail over Reykjavik"
    assert histstore.turns.status(stored) == "closed"  # every tool call answered
    # A second agent run on a fresh memory sees the first's history.
    seen: list[int] = []

    def count(messages: Any, **kwargs: Any) -> ChatMessage:
        seen.append(len(messages))
        return ChatMessage(role="assistant", content="ok")

    again = FunctionAgent(tools=[], llm=MockFunctionCallingLLM(response_generator=count))
    await again.run("Bergen", memory=memory(HiststoreChatStore(store), cid, 100_000))
    assert seen[0] >= 9  # the eight stored messages and the new question (a system prompt too)


async def test_rich_messages_read_back_as_stored(store: Store, cid: str) -> None:
    chat_store = HiststoreChatStore(store)
    sent = [
        ChatMessage(role="developer", content="Be terse."),
        ChatMessage(
            role="user",
            blocks=[
                TextBlock(text="Grüße 👋 \u0000 end"),
                ImageBlock(image=b"\x00\xff\x10", image_mimetype="image/png"),
                CitableBlock(title="t", source="s", content=[TextBlock(text="cited words")]),
            ],
            additional_kwargs={"n": 1.5e300, "nested": [None, True]},
        ),
        ChatMessage(
            role="assistant",
            blocks=[
                ThinkingBlock(content="secret musing"),
                ToolCallBlock(tool_call_id="c1", tool_name="lookup", tool_kwargs={"q": "zebra"}),
            ],
        ),
        ChatMessage(role="tool", content="striped", additional_kwargs={"tool_call_id": "c1"}),
    ]
    await chat_store.add_messages(cid, sent)
    assert await chat_store.get_messages(cid) == sent
    stored = await store.read(cid)
    assert [m.role for m in stored] == ["system", "user", "assistant", "tool"]
    assert "cited words" in (indexed_text(stored[1]) or "")
    assert indexed_text(stored[2]) == "zebra"
    assert not await store.search("musing")
    assert [h.position for h in await store.search("zebra", conversation=cid)] == [2]


async def test_edits_are_changes_by_the_chat_store(store: Store, cid: str) -> None:
    chat_store = HiststoreChatStore(store)
    sent = [m for i in range(4) for m in turn(i)]
    await chat_store.set_messages(cid, sent)
    await chat_store.add_message(cid, turn(9)[0], ARCHIVED)
    assert await chat_store.delete_message(cid, 1) == sent[1]
    assert await chat_store.delete_message(cid, 99) is None
    assert await chat_store.delete_oldest_messages(cid, 2) == [sent[0], sent[2]]
    assert await chat_store.get_messages(cid) == sent[3:]
    revision = (await store.edit(cid)).revision
    await chat_store.set_messages(cid, turn(7))
    assert await chat_store.get_messages(cid) == turn(7)
    assert await chat_store.get_messages(cid, ARCHIVED) == [turn(9)[0]]  # the other status stays
    await store.revert(cid, revision, by="test")
    assert await chat_store.get_messages(cid) == sent[3:]
    assert {c.author for c in await store.changes(cid, since=1)} == {"llama_index", "test"}
    await chat_store.delete_messages(cid, ACTIVE)
    assert await chat_store.count_messages(cid, None) == 1
    await chat_store.delete_messages(cid)
    assert await chat_store.count_messages(cid, None) == 0
    assert await chat_store.get_keys() == []
    with pytest.raises(InvalidId):
        await chat_store.add_message("k" * 250, turn(0)[0], ARCHIVED)


async def test_an_archive_cut_short_is_finished_once(
    store: Store, cid: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    chat_store = HiststoreChatStore(store)
    sent = [m for i in range(4) for m in turn(i)]
    await chat_store.add_messages(cid, sent)
    commit = store.commit

    async def crash(value: Any) -> int:
        monkeypatch.setattr(store, "commit", commit)
        raise RuntimeError("the process died here")

    monkeypatch.setattr(store, "commit", crash)
    with pytest.raises(RuntimeError):
        await chat_store.archive_oldest_messages(cid, 3)
    assert await chat_store.count_messages(cid) == 8  # archived, not yet removed
    assert await chat_store.archive_oldest_messages(cid, 5) == sent[:5]
    assert await chat_store.get_messages(cid, ARCHIVED) == sent[:5]
    assert await chat_store.get_messages(cid) == sent[5:]


async def test_concurrent_archives_archive_each_message_once(store: Store, cid: str) -> None:
    chat_store = HiststoreChatStore(store)
    sent = [m for i in range(10) for m in turn(i)]
    await chat_store.add_messages(cid, sent)
    done = await asyncio.gather(*(chat_store.archive_oldest_messages(cid, 2) for _ in range(6)))
    returned = sorted(str(m.content) for batch in done for m in batch)
    assert returned == sorted(str(m.content) for m in sent[:12])  # each once, by one archive
    assert await chat_store.get_messages(cid, None) == sent
    assert await chat_store.count_messages(cid) == 8


def test_memory_sync_calls_with_an_owned_store(shared_backend: Any, cid: str) -> None:
    chat_store = HiststoreChatStore(shared_backend.url)
    try:
        mem = Memory.from_defaults(
            session_id=cid, chat_store=chat_store, tokenizer_fn=str.split, chat_history=turn(0)
        )
        mem.put(turn(1)[0])  # each sync call runs a loop of its own
        assert mem.get_all() == [*turn(0), turn(1)[0]]
    finally:
        asyncio.run(chat_store.close())


async def test_show_search_export_and_copy(shared_backend: Any, tmp_path: Path) -> None:
    key = f"li-{uuid.uuid4().hex[:8]}"
    async with shared_backend.connect() as store:
        chat_store = HiststoreChatStore(store)
        await chat_store.add_messages(
            key,
            [
                ChatMessage(role="user", content="Weather in Quito?"),
                ChatMessage(
                    role="assistant",
                    blocks=[
                        ToolCallBlock(tool_call_id="q1", tool_name="w", tool_kwargs={"c": "Quito"})
                    ],
                ),
                ChatMessage(role="tool", content="fog", additional_kwargs={"tool_call_id": "q1"}),
            ],
        )
        await chat_store.archive_oldest_messages(key, 1)
        before = await chat_store.get_messages(key, None)
    shown = await ok("show", key, "--url", shared_backend.url)
    assert '-> w(c="Quito")  [q1]' in shown.out
    assert "<- [q1] fog" in shown.out
    assert "llama_index" not in shown.out
    assert "block_type" not in shown.out
    found = await ok("search", "Quito", "--url", shared_backend.url)
    assert key + ARCHIVE_SUFFIX in found.out
    dump = tmp_path / "dump.jsonl"
    await ok("export", key, key + ARCHIVE_SUFFIX, "--url", shared_backend.url, "-o", str(dump))
    imported, copied = str(tmp_path / "imported.db"), str(tmp_path / "copied.db")
    await ok("import", str(dump), "--url", imported)
    await ok("copy", shared_backend.url, copied)
    for target in (imported, copied):
        async with HiststoreChatStore(target) as again:
            assert await again.get_messages(key, None) == before


def test_without_llama_index_the_import_names_the_extra() -> None:
    code = (
        "import sys; sys.modules['llama_index'] = None\nimport histstore.integrations.llama_index\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode != 0
    assert "pip install 'histstore[llamaindex]'" in proc.stderr


async def test_a_page_reads_only_its_messages_and_a_count_none(
    store: Store, cid: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    chat_store = HiststoreChatStore(store)
    await chat_store.add_messages(cid, [m for i in range(50) for m in turn(i)])
    await chat_store.archive_oldest_messages(cid, 40)
    reads: list[tuple[str, int, int | None]] = []
    read = store.read

    async def recorded(conversation: str, **kwargs: Any) -> Any:
        got = await read(conversation, **kwargs)
        reads.append((conversation, kwargs.get("start", 0), kwargs.get("stop")))
        return got

    monkeypatch.setattr(store, "read", recorded)
    page = await chat_store.get_messages(cid, None, limit=5, offset=38)
    assert [str(m.content) for m in page] == [
        "question 19 about apples",
        "answer 19 about pears",
        "question 20 about apples",
        "answer 20 about pears",
        "question 21 about apples",
    ]
    assert reads == [(cid + ARCHIVE_SUFFIX, 38, 43), (cid, 0, 3)]  # bounded by the page
    reads.clear()
    assert await chat_store.count_messages(cid, None) == 100
    assert reads == []


async def test_compact_then_memory_keeps_going(store: Store, cid: str) -> None:
    chat_store = HiststoreChatStore(store)
    mem = memory(chat_store, cid, token_limit=100_000)
    for i in range(3):
        for message in turn(i):
            await mem.aput(message)

    async def summarize(messages: list[histstore.Message]) -> str:
        return "Summary: " + "; ".join(t for t in map(indexed_text, messages) if t)

    await histstore.compact(store, cid, summarize, keep_turns=1)
    history = await mem.aget()
    assert history[0] == ChatMessage(
        role="user",
        content="Summary: question 0 about apples; answer 0 about pears;"
        " question 1 about apples; answer 1 about pears",
    )
    assert history[1:] == turn(2)
    await mem.aput(turn(3)[0])
    assert (await chat_store.get_messages(cid))[-1] == turn(3)[0]
    assert await chat_store.archive_oldest_messages(cid, 1) == [history[0]]
    assert await chat_store.get_messages(cid, ARCHIVED) == [history[0]]


async def test_openai_style_tool_calls_are_indexed_and_paired(store: Store, cid: str) -> None:
    chat_store = HiststoreChatStore(store)
    call = {
        "id": "call_9",
        "type": "function",
        "function": {"name": "lookup", "arguments": '{"animal": "okapi"}'},
    }
    sent = [
        ChatMessage(role="user", content="Tell me about it"),
        ChatMessage(role="assistant", content="", additional_kwargs={"tool_calls": [call]}),
        ChatMessage(
            role="function", content="forest giraffe", additional_kwargs={"tool_call_id": "call_9"}
        ),
        ChatMessage(role="chatbot", content="It is a forest giraffe."),
    ]
    await chat_store.add_messages(cid, sent)
    assert await chat_store.get_messages(cid) == sent
    stored = await store.read(cid)
    assert [m.role for m in stored] == ["user", "assistant", "tool", "assistant"]
    assert indexed_text(stored[1]) == "okapi"
    assert histstore.turns.status(stored) == "closed"
    assert histstore.turns.status(stored[:2]) == "interrupted"  # a call with no result


def test_memory_downloads_nothing(tmp_path: Path) -> None:
    """With tiktoken gone and NLTK's downloader refusing, the import, ``Memory`` and this
    chat store still work: nothing here fetches data (given ``tokenizer_fn``)."""
    code = f"""
import asyncio, sys
sys.modules["tiktoken"] = None
import nltk
def refuse(*args, **kwargs):
    raise SystemExit("NLTK tried to download " + repr(args))
nltk.download = refuse
from llama_index.core.base.llms.types import ChatMessage
from llama_index.core.memory import Memory
from histstore.integrations.llama_index import HiststoreChatStore

async def main():
    async with HiststoreChatStore({str(tmp_path / "chat.db")!r}) as chat_store:
        memory = Memory.from_defaults(session_id="k", chat_store=chat_store, tokenizer_fn=str.split)
        await memory.aput(ChatMessage(role="user", content="hello"))
        print(len(await memory.aget()))

asyncio.run(main())
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "1"
