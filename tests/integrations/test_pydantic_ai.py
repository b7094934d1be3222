"""HiststoreMessageHistory: Pydantic AI message histories on every backend."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from datetime import datetime, timezone
from typing import Any

import pytest
from pydantic_ai import Agent
from pydantic_ai.messages import (
    BinaryContent,
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    RetryFeedbackPart,
    RetryInfo,
    SystemPromptPart,
    TextPart,
    ThinkingPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.models.test import TestModel
from pydantic_ai.usage import RequestUsage

import histstore
from histstore import HistStoreError, InvalidMessage, WindowTooSmall
from histstore.integrations.pydantic_ai import HiststoreMessageHistory

T0 = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=timezone.utc)


def weather_model() -> tuple[FunctionModel, list[list[ModelMessage]]]:
    """A model that calls ``get_weather`` for every new question, then answers from it."""
    seen: list[list[ModelMessage]] = []

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        seen.append(list(messages))
        last = messages[-1]
        returns = [p for p in last.parts if isinstance(p, ToolReturnPart)]
        if returns:
            return ModelResponse(parts=[TextPart(f"Answer: {returns[0].content}")])
        prompt = next(p for p in last.parts if isinstance(p, UserPromptPart))
        return ModelResponse(
            parts=[
                ToolCallPart(
                    "get_weather", {"city": str(prompt.content)}, tool_call_id=f"call-{len(seen)}"
                )
            ]
        )

    return FunctionModel(respond), seen


def weather_agent(model: Any) -> Agent[None, str]:
    agent = Agent(model, instructions="Answer briefly.")

    @agent.tool_plain
    def get_weather(city: str) -> str:
        """The weather in a city."""
        return f"sunny in {city}"

    return agent


def kinds(messages: list[ModelMessage]) -> list[str]:
    return [
        f"{m.kind}:" + ",".join(p.part_kind for p in m.parts)  # type: ignore[union-attr]
        for m in messages
    ]


async def test_agent_turns_with_a_tool_call(store, cid):
    model, seen = weather_model()
    agent = weather_agent(model)
    history = HiststoreMessageHistory(cid, store)
    everything: list[ModelMessage] = []
    for city in ["Paris", "Oslo", "Lima"]:
        result = await agent.run(city, message_history=await history.messages())
        await history.add(result.new_messages())
        everything = result.all_messages()
        assert result.output == f"Answer: sunny in {city}"
    stored = await history.messages()
    assert stored == everything
    assert len(stored) == 12
    assert kinds(stored[:4]) == [
        "request:user-prompt",
        "response:tool-call",
        "request:tool-return",
        "response:text",
    ]
    # The third run's model saw both earlier runs, calls and results included.
    assert len(seen[-1]) == 11
    assert await store.count(cid) == 12


async def test_agent_with_the_test_model_resumes_on_a_new_store(shared_backend, cid):
    agent = weather_agent(TestModel())
    async with HiststoreMessageHistory(cid, shared_backend.url) as history:
        for prompt in ["one", "two"]:
            result = await agent.run(prompt, message_history=await history.messages())
            await history.add(result.new_messages())
        before = await history.messages()
    assert any(isinstance(p, ToolCallPart) for m in before for p in m.parts)
    async with shared_backend.connect() as store:
        resumed = HiststoreMessageHistory(cid, store)
        assert await resumed.messages() == before
        result = await agent.run("three", message_history=await resumed.messages())
        await resumed.add(result.new_messages())
        assert await resumed.messages() == result.all_messages()


def rich_history() -> list[ModelMessage]:
    return [
        ModelRequest(
            parts=[
                SystemPromptPart("You are terse.", timestamp=T0),
                UserPromptPart(
                    [
                        "Grüße 👋 \u0000 end",
                        BinaryContent(data=b"\x00\xff\x10", media_type="image/png"),
                    ],
                    timestamp=T0,
                ),
            ],
            instructions="Be brief.",
        ),
        ModelResponse(
            parts=[
                ThinkingPart("hmm", signature="sig=="),
                ToolCallPart(
                    "lookup", {"q": "x", "n": 1.5e300, "nested": [None, True]}, tool_call_id="c1"
                ),
                ToolCallPart("raw", '{"a": 1}', tool_call_id="c2"),
            ],
            usage=RequestUsage(input_tokens=10, output_tokens=3),
            model_name="m-1",
            timestamp=T0,
            provider_name="p",
            provider_details={"finish_reason": "tool_calls"},
            provider_response_id="resp-1",
        ),
        ModelRequest(
            parts=[
                ToolReturnPart("lookup", {"rows": [1, 2]}, tool_call_id="c1", timestamp=T0),
                ToolReturnPart(
                    "raw",
                    "bad args",
                    tool_call_id="c2",
                    outcome="retried",
                    retry=RetryInfo("validation_error", attempt=1),
                    timestamp=T0,
                ),
            ]
        ),
        ModelResponse(parts=[TextPart("Done.")], timestamp=T0),
    ]


async def test_messages_round_trip_as_pydantic_ais_own_json(store, cid):
    history = HiststoreMessageHistory(cid, store)
    original = rich_history()
    await history.add(original)
    got = await history.messages()
    # Exactly Pydantic AI's own JSON round trip, byte for byte in its JSON form.
    assert got == ModelMessagesTypeAdapter.validate_json(
        ModelMessagesTypeAdapter.dump_json(original)
    )
    assert ModelMessagesTypeAdapter.dump_json(got) == ModelMessagesTypeAdapter.dump_json(original)
    assert got[2:] == original[2:]
    # Read back again: a stable value, fresh on every read.
    again = await history.messages()
    assert again == got
    assert again[0] is not got[0]
    stored = (await store.read(cid))[1].to_dict()
    assert stored["type"] == "pydantic_ai"
    assert stored["message"]["kind"] == "response"


async def test_window_never_splits_a_call_from_its_result(store, cid, monkeypatch):
    model, _ = weather_model()
    agent = weather_agent(model)
    history = HiststoreMessageHistory(cid, store)
    for city in ["a", "b", "c"]:
        result = await agent.run(city, message_history=await history.messages())
        await history.add(result.new_messages())
    everything = await history.messages()
    # Runs are request, call, result, answer: any window starts at a run's first request.
    assert await history.messages(limit=4) == everything[-4:]
    assert await history.messages(limit=7) == everything[-4:]
    assert await history.messages(limit=8) == everything[-8:]
    assert await history.messages(limit=100) == everything
    assert await history.messages(limit=0) == []
    with pytest.raises(WindowTooSmall):
        await history.messages(limit=3)
    with pytest.raises(ValueError, match="limit"):
        await history.messages(limit=-1)

    read = store.read
    sizes: list[int] = []

    async def spy(*args: Any, **kwargs: Any) -> Any:
        got = await read(*args, **kwargs)
        sizes.append(len(got))
        return got

    monkeypatch.setattr(store, "read", spy)
    windowed = HiststoreMessageHistory(cid, store, limit=6)
    assert await windowed.messages() == everything[-4:]
    assert sizes == [6, 1]  # only the window, and the first message for its system prompt
    assert await windowed.messages(limit=None) == everything

    # An agent given the window runs normally: it starts at a clean request.
    result = await agent.run("d", message_history=await windowed.messages())
    assert result.output == "Answer: sunny in d"


async def test_window_never_starts_at_a_retry(store, cid):
    history = HiststoreMessageHistory(cid, store)
    feedback = RetryFeedbackPart("not JSON", retry=RetryInfo("model_retry"), timestamp=T0)
    messages: list[ModelMessage] = [
        ModelRequest(parts=[UserPromptPart("q", timestamp=T0)]),
        ModelResponse(parts=[TextPart("{oops")], timestamp=T0),
        ModelRequest(parts=[feedback]),
        ModelResponse(parts=[TextPart("{}")], timestamp=T0),
        ModelRequest(parts=[UserPromptPart("next", timestamp=T0)]),
        ModelResponse(parts=[TextPart("fine")], timestamp=T0),
    ]
    await history.add(messages)
    assert await history.messages(limit=4) == messages[4:]
    assert await history.messages(limit=5) == messages[4:]
    assert await history.messages(limit=6) == messages


async def test_add_clear_and_isolation(store, cid):
    a = HiststoreMessageHistory(cid, store)
    b = HiststoreMessageHistory(cid + "-b", store)
    assert await a.messages() == []
    await a.add([])
    assert not await store.exists(cid)
    first = rich_history()[:2]
    await a.add(first)
    await b.add(rich_history()[3:])
    await a.clear()
    await a.clear()
    assert await a.messages() == []
    assert not await store.exists(cid)
    assert len(await b.messages()) == 1


async def test_bad_messages_write_nothing(store, cid):
    history = HiststoreMessageHistory(cid, store)
    good = ModelRequest(parts=[UserPromptPart("ok", timestamp=T0)])
    with pytest.raises(InvalidMessage):
        await history.add([good, {"kind": "request", "parts": []}])  # type: ignore[list-item]
    with pytest.raises(InvalidMessage):
        await history.add([good, "text"])  # type: ignore[list-item]

    class Opaque:
        pass

    bad = ModelRequest(parts=[ToolReturnPart("f", Opaque(), tool_call_id="c", timestamp=T0)])
    with pytest.raises(InvalidMessage):
        await history.add([good, bad])
    assert await store.count(cid) == 0
    # A foreign message with no role (no plain message an edit could have put in) is
    # reported, never skipped.
    await store.write(cid, [{"type": "function_call", "call_id": "x", "name": "f"}])
    with pytest.raises(InvalidMessage):
        await history.messages()


async def test_concurrent_adds_are_whole_batches(store, cid):
    history = HiststoreMessageHistory(cid, store)

    def run(i: int) -> list[ModelMessage]:
        return [
            ModelRequest(parts=[UserPromptPart(f"q{i}", timestamp=T0)]),
            ModelResponse(parts=[TextPart(f"a{i}")], timestamp=T0),
        ]

    await asyncio.gather(*(history.add(run(i)) for i in range(20)))
    stored = await history.messages()
    assert len(stored) == 40
    for request, response in zip(stored[::2], stored[1::2], strict=True):
        question = request.parts[0].content  # type: ignore[union-attr]
        assert response.parts[0].content == "a" + str(question)[1:]  # type: ignore[union-attr]


# ---------------------------------------------------------------- owning a store


async def test_owned_store_opens_lazily_and_closes(shared_backend, cid, tmp_path):
    async with HiststoreMessageHistory(cid, shared_backend.url) as history:
        await history.add(rich_history()[3:])
    with pytest.raises(HistStoreError):
        await history.messages()
    async with HiststoreMessageHistory(cid, shared_backend.url) as again:
        assert len(await again.messages()) == 1
    unused = HiststoreMessageHistory(cid, tmp_path / "never.db")
    await unused.close()
    assert not (tmp_path / "never.db").exists()


async def test_borrowed_store_stays_open(store, cid):
    async with HiststoreMessageHistory(cid, store) as history:
        await history.add(rich_history()[3:])
    assert await store.count(cid) == 1


def test_bad_arguments_fail_at_construction(tmp_path):
    with pytest.raises(histstore.InvalidId):
        HiststoreMessageHistory(" padded", tmp_path / "x.db")
    with pytest.raises(TypeError):
        HiststoreMessageHistory("ok", 42)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="sqlite and postgresql"):
        HiststoreMessageHistory("ok", "mysql://u@h/db")
    with pytest.raises(ValueError, match="limit"):
        HiststoreMessageHistory("ok", tmp_path / "x.db", limit=-2)


def test_import_without_pydantic_ai_names_the_extra():
    code = (
        "import sys; sys.modules['pydantic_ai'] = None\nimport histstore.integrations.pydantic_ai\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode != 0
    assert "ImportError" in proc.stderr
    assert "pip install 'histstore[pydantic-ai]'" in proc.stderr
