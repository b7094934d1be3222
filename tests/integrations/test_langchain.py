"""HiststoreChatMessageHistory: a LangChain chat history on every backend."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    BaseMessage,
    ChatMessage,
    FunctionMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.runnables import RunnableLambda
from langchain_core.runnables.history import RunnableWithMessageHistory

import histstore
from histstore import HistStoreError, InvalidMessage, WindowTooSmall
from histstore.integrations.langchain import HiststoreChatMessageHistory
from histstore.window import WindowStore

# RunnableWithMessageHistory is deprecated in langchain-core 1.x (in favour of LangGraph)
# but still shipped and used; its constructor warns.
rwmh_deprecated = pytest.mark.filterwarnings("ignore:RunnableWithMessageHistory is deprecated")


def every_kind() -> list[BaseMessage]:
    return [
        SystemMessage("You are terse.", id="s-1"),
        HumanMessage(
            [{"type": "text", "text": "Weather in Paris? 👋"}],
            id="h-1",
            name="ann",
            additional_kwargs={"client": {"tz": "Europe/Paris"}},
        ),
        AIMessage(
            "",
            id="a-1",
            name="bot",
            tool_calls=[
                {"name": "weather", "args": {"city": "Paris", "days": [1, 2]}, "id": "call-1"}
            ],
            invalid_tool_calls=[
                {
                    "name": "w",
                    "args": "{bad",
                    "id": "call-2",
                    "error": "not JSON",
                    "type": "invalid_tool_call",
                }
            ],
            additional_kwargs={"refusal": None},
            response_metadata={"model_name": "fake", "finish_reason": "tool_calls"},
            usage_metadata={"input_tokens": 3, "output_tokens": 5, "total_tokens": 8},
        ),
        ToolMessage(
            "sunny",
            tool_call_id="call-1",
            id="t-1",
            name="weather",
            artifact={"raw": [1, 2.5, None]},
            status="success",
        ),
        ToolMessage("failed", tool_call_id="call-2", status="error"),
        AIMessage("Sunny.", id="a-2", response_metadata={"stop": True}),
        ChatMessage("Looks fine.", role="critic", id="c-1"),
        FunctionMessage("42", name="legacy_fn"),
        AIMessageChunk("partial", id="chunk-1"),
    ]


async def test_every_kind_of_message_round_trips(store, cid):
    history = HiststoreChatMessageHistory(cid, store)
    sent = every_kind()
    await history.aadd_messages(sent)
    got = await history.aget_messages()
    assert got == sent
    assert [type(m) for m in got] == [type(m) for m in sent]
    ai = got[2]
    assert isinstance(ai, AIMessage)
    assert ai.tool_calls[0]["args"] == {"city": "Paris", "days": [1, 2]}
    assert ai.usage_metadata == {"input_tokens": 3, "output_tokens": 5, "total_tokens": 8}
    assert got[1].additional_kwargs == {"client": {"tz": "Europe/Paris"}}
    assert got[1].name == "ann"
    assert got[1].id == "h-1"
    assert isinstance(got[3], ToolMessage)
    assert got[3].artifact == {"raw": [1, 2.5, None]}


async def test_stored_shape_is_understood_by_histstore(store, cid):
    history = HiststoreChatMessageHistory(cid, store)
    kinds = every_kind()
    await history.aadd_messages([*kinds[:4], kinds[5]])  # without the invalid call's answer
    stored = [m.to_dict() for m in await store.read(cid)]
    assert [(d["role"], d["type"]) for d in stored] == [
        ("system", "system"),
        ("user", "human"),
        ("assistant", "ai"),
        ("tool", "tool"),
        ("assistant", "ai"),
    ]
    assert stored[2]["tool_calls"][0]["id"] == "call-1"
    assert stored[3]["tool_call_id"] == "call-1"
    assert histstore.turns.status(stored) == "closed"
    histstore.turns.validate_pairing(stored)  # each call answered exactly once
    window = await WindowStore(store, max_messages=5).read(cid)
    assert [m.role for m in window] == ["system", "user", "assistant", "tool", "assistant"]
    with pytest.raises(WindowTooSmall):  # the one turn (4 messages) is never split
        await WindowStore(store, max_messages=4).read(cid)


async def test_chat_completions_messages_stored_by_others_are_readable(store, cid):
    await store.write(
        cid,
        [
            {"role": "system", "content": "Be kind."},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello"},
        ],
    )
    got = await HiststoreChatMessageHistory(cid, store).aget_messages()
    assert [type(m) for m in got] == [SystemMessage, HumanMessage, AIMessage]
    assert [m.content for m in got] == ["Be kind.", "Hi", "Hello"]


async def test_unreadable_message_names_its_position_not_its_content(store, cid):
    await store.write(cid, [{"type": "mystery", "secret": "do-not-print"}])
    with pytest.raises(InvalidMessage) as info:
        await HiststoreChatMessageHistory(cid, store).aget_messages()
    assert "do-not-print" not in str(info.value)
    assert cid in str(info.value)
    assert "message 0" in str(info.value)


async def test_add_is_atomic_and_validated(store, cid):
    history = HiststoreChatMessageHistory(cid, store)
    with pytest.raises(InvalidMessage):
        await history.aadd_messages([HumanMessage("ok"), "not a message"])  # type: ignore[list-item]
    with pytest.raises(InvalidMessage):
        await history.aadd_messages(
            [HumanMessage("ok"), AIMessage("x", additional_kwargs={"bad": float("nan")})]
        )
    await history.aadd_messages([])
    assert await history.aget_messages() == []
    assert not await store.exists(cid)


async def test_aclear_and_isolation(store, cid):
    mine = HiststoreChatMessageHistory(cid, store)
    other = HiststoreChatMessageHistory(cid + "-other", store)
    await mine.aadd_messages([HumanMessage("a"), AIMessage("b")])
    await other.aadd_messages([HumanMessage("c")])
    await mine.aclear()
    assert await mine.aget_messages() == []
    assert [m.content for m in await other.aget_messages()] == ["c"]


async def test_sync_methods_refuse_their_stores_own_running_loop(store, cid):
    history = HiststoreChatMessageHistory(cid, store)
    with pytest.raises(RuntimeError, match=r"aget_messages\(\)"):
        history.messages  # noqa: B018
    with pytest.raises(RuntimeError, match=r"aadd_messages\(\)"):
        history.add_messages([HumanMessage("x")])
    with pytest.raises(RuntimeError, match=r"aadd_messages\(\)"):
        history.add_user_message("x")
    with pytest.raises(RuntimeError, match=r"aclear\(\)"):
        history.clear()
    assert await store.count(cid) == 0


# ---------------------------------------------------------------- RunnableWithMessageHistory


class Recorder:
    """A fake chat model behind a step that records the messages it is given."""

    def __init__(self, replies: list[str]) -> None:
        self.seen: list[list[BaseMessage]] = []
        model = GenericFakeChatModel(messages=iter([AIMessage(r) for r in replies]))
        self.runnable = RunnableLambda(self._record) | model

    def _record(self, messages: Any) -> Any:
        self.seen.append(list(messages.to_messages()))
        return messages


def chain_for(recorder: Recorder, factory: Any) -> RunnableWithMessageHistory:
    from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder

    prompt = ChatPromptTemplate.from_messages(
        [("system", "Be brief."), MessagesPlaceholder("history"), ("human", "{question}")]
    )
    return RunnableWithMessageHistory(
        prompt | recorder.runnable,
        factory,
        input_messages_key="question",
        history_messages_key="history",
    )


def config(cid: str) -> dict[str, Any]:
    return {"configurable": {"session_id": cid}}


def contents(messages: list[BaseMessage]) -> list[Any]:
    return [m.content for m in messages]


@rwmh_deprecated
async def test_runnable_with_history_async(store, cid):
    recorder = Recorder(["Paris.", "About 2 million."])
    chain = chain_for(recorder, lambda sid: HiststoreChatMessageHistory(sid, store))
    first = await chain.ainvoke({"question": "Capital of France?"}, config=config(cid))
    assert first.content == "Paris."
    second = await chain.ainvoke({"question": "Population?"}, config=config(cid))
    assert second.content == "About 2 million."
    assert contents(recorder.seen[1]) == [
        "Be brief.",
        "Capital of France?",
        "Paris.",
        "Population?",
    ]
    stored = await HiststoreChatMessageHistory(cid, store).aget_messages()
    assert contents(stored) == ["Capital of France?", "Paris.", "Population?", "About 2 million."]
    assert [type(m) for m in stored] == [HumanMessage, AIMessage] * 2


@rwmh_deprecated
async def test_runnable_with_history_sync_in_a_worker_thread(store, cid):
    """Sync invoke from a thread, on a store owned by the running loop."""
    recorder = Recorder(["one", "two", "three"])
    history = HiststoreChatMessageHistory(cid, store)  # made on the store's loop
    chain = chain_for(recorder, lambda sid: history)
    for q in ("q1", "q2", "q3"):
        await asyncio.to_thread(chain.invoke, {"question": q}, config(cid))
    assert contents(recorder.seen[2]) == ["Be brief.", "q1", "one", "q2", "two", "q3"]
    assert contents(await history.aget_messages()) == ["q1", "one", "q2", "two", "q3", "three"]


@rwmh_deprecated
async def test_runnable_with_history_sync_with_an_owned_store(shared_backend, cid):
    """Plain sync code (no loop anywhere in its thread) on a history given a URL."""

    def sync_app() -> list[list[BaseMessage]]:
        recorder = Recorder(["hello", "bye"])
        with HiststoreChatMessageHistory(cid, shared_backend.url) as history:
            chain = chain_for(recorder, lambda sid: history)
            chain.invoke({"question": "hi"}, config=config(cid))
            chain.invoke({"question": "leaving"}, config=config(cid))
            assert contents(history.messages) == ["hi", "hello", "leaving", "bye"]
        return recorder.seen

    seen = await asyncio.to_thread(sync_app)
    assert contents(seen[1]) == ["Be brief.", "hi", "hello", "leaving"]
    async with shared_backend.connect() as other:
        assert [m.role for m in await other.read(cid)] == ["user", "assistant"] * 2


# ---------------------------------------------------------------- owning a store, threads and loops


def threads_named(name: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == name]


async def test_owned_store_sync_first_then_async(shared_backend, cid):
    history = HiststoreChatMessageHistory(cid, shared_backend.url)
    before = len(threads_named("histstore-langchain"))
    await asyncio.to_thread(history.add_messages, [HumanMessage("from sync")])
    assert len(threads_named("histstore-langchain")) == before + 1
    # The store lives on the private loop; async calls are handed to it.
    await history.aadd_messages([AIMessage("from async")])
    assert contents(await history.aget_messages()) == ["from sync", "from async"]
    assert contents(await asyncio.to_thread(lambda: history.messages)) == [
        "from sync",
        "from async",
    ]
    await asyncio.to_thread(history.clear)
    assert await history.aget_messages() == []
    await history.aclose()
    assert len(threads_named("histstore-langchain")) == before
    with pytest.raises(HistStoreError):
        await history.aget_messages()
    with pytest.raises(HistStoreError):
        await asyncio.to_thread(history.add_messages, [HumanMessage("late")])


async def test_owned_store_async_first_then_sync_from_a_thread(shared_backend, cid):
    async with HiststoreChatMessageHistory(cid, shared_backend.url) as history:
        await history.aadd_messages([HumanMessage("a")])
        await asyncio.to_thread(history.add_messages, [AIMessage("b")])
        assert contents(await history.aget_messages()) == ["a", "b"]
    async with shared_backend.connect() as other:
        assert await other.count(cid) == 2


def test_sync_only_use_of_an_owned_store(tmp_path, cid):
    path = tmp_path / "sync.db"
    with HiststoreChatMessageHistory(cid, path) as history:
        history.add_user_message("hi")
        history.add_ai_message("hello")
        history.add_messages([HumanMessage("more"), AIMessage("sure")])
        assert contents(history.messages) == ["hi", "hello", "more", "sure"]
        assert str(history) == "Human: hi\nAI: hello\nHuman: more\nAI: sure"
    with HiststoreChatMessageHistory(cid, str(path)) as again:
        assert contents(again.messages) == ["hi", "hello", "more", "sure"]
        again.clear()
        assert again.messages == []


async def test_borrowed_store_without_its_loop_refuses_sync_calls(store, cid):
    def outside() -> None:
        history = HiststoreChatMessageHistory(cid, store)  # no loop in this thread
        with pytest.raises(RuntimeError, match=r"aget_messages\(\)"):
            history.messages  # noqa: B018

    await asyncio.to_thread(outside)


async def test_borrowed_store_is_left_open(store, cid):
    async with HiststoreChatMessageHistory(cid, store) as history:
        await history.aadd_messages([HumanMessage("x")])
    assert await store.count(cid) == 1


def test_bad_arguments_fail_at_construction(tmp_path):
    with pytest.raises(histstore.InvalidId):
        HiststoreChatMessageHistory("", tmp_path / "x.db")
    with pytest.raises(TypeError):
        HiststoreChatMessageHistory("ok", object())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="sqlite and postgresql"):
        HiststoreChatMessageHistory("ok", "oracle://u@h/db")


def test_import_without_langchain_names_the_extra():
    code = (
        "import sys; sys.modules['langchain_core'] = None\n"
        "import histstore.integrations.langchain\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode != 0
    assert "ImportError" in proc.stderr
    assert "pip install 'histstore[langchain]'" in proc.stderr


@pytest.fixture(autouse=True)
def no_thread_left_behind() -> Iterator[None]:
    before = len(threads_named("histstore-langchain"))
    yield
    assert len(threads_named("histstore-langchain")) == before
