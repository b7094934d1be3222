"""What the adapters store is histstore's data (SPEC 15): every framework message gets a
role and the indexed text of its meaning, so search, ``histstore show``, ``compact`` and
windows work on it, while the framework still reads back exactly what it stored."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from adk_models import ScriptedModel, model_text
from cli_runner import ok
from google.adk.agents import LlmAgent
from google.adk.models.llm_response import LlmResponse
from google.adk.runners import Runner
from google.genai import types
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from pydantic_ai import Agent
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    SystemPromptPart,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

import histstore
from histstore import Message, Store, compact, indexed_text
from histstore.integrations.adk import HiststoreSessionService
from histstore.integrations.langchain import HiststoreChatMessageHistory
from histstore.integrations.openai_agents import HiststoreSession
from histstore.integrations.pydantic_ai import HiststoreMessageHistory
from histstore.window import WindowStore

APP, USER = "app", "u"


# ---------------------------------------------------------------- ADK


def model_call(call_id: str, city: str) -> LlmResponse:
    call = types.FunctionCall(name="get_weather", args={"city": city}, id=call_id)
    return LlmResponse(content=types.Content(role="model", parts=[types.Part(function_call=call)]))


def get_weather(city: str) -> dict[str, str]:
    """The weather in a city."""
    return {"report": f"drizzle over {city}"}


async def adk_turn(runner: Runner, session_id: str, text: str) -> None:
    message = types.Content(role="user", parts=[types.Part(text=text)])
    async for _event in runner.run_async(user_id=USER, session_id=session_id, new_message=message):
        pass


async def adk_session(store: Store, sid: str, cities: list[str]) -> tuple[Runner, ScriptedModel]:
    """A session holding one tool-using turn per city; returns its runner and model."""
    model = ScriptedModel()
    agent = LlmAgent(name="forecaster", model=model, tools=[get_weather])
    service = HiststoreSessionService(store)
    runner = Runner(agent=agent, app_name=APP, session_service=service)
    await service.create_session(app_name=APP, user_id=USER, session_id=sid)
    for i, city in enumerate(cities):
        model.script += [model_call(f"{sid}-{i}", city), model_text(f"Expect rain in {city}.")]
        await adk_turn(runner, sid, f"Weather in {city}?")
    return runner, model


async def test_adk_events_have_roles_and_searchable_meaning(store: Store, cid: str) -> None:
    await adk_session(store, cid, ["Valparaiso"])
    conversation = f"adk-session/{APP}/{USER}/{cid}"
    stored = await store.read(conversation)
    assert [m.role for m in stored] == ["user", "assistant", "tool", "assistant"]
    assert [m.to_dict()["type"] for m in stored] == ["adk_event"] * 4
    # The question, the call's arguments, the tool's response and the answer.
    hits = await store.search("Valparaiso", conversation=conversation)
    assert sorted(h.position for h in hits) == [0, 1, 2, 3]
    assert [h.position for h in await store.search("drizzle", conversation=conversation)] == [2]
    assert indexed_text(stored[1]) == "Valparaiso"  # values, never keys or the tool's name
    # The framework reads back exactly what it stored (the role is the envelope's).
    service = HiststoreSessionService(store)
    session = await service.get_session(app_name=APP, user_id=USER, session_id=cid)
    assert session is not None
    assert [e.model_dump(mode="json", exclude_none=True) for e in session.events] == [
        m.to_dict()["event"] for m in stored
    ]


async def test_adk_event_without_content_has_no_role(store: Store, cid: str) -> None:
    from google.adk.events import Event, EventActions

    service = HiststoreSessionService(store)
    session = await service.create_session(app_name=APP, user_id=USER, session_id=cid)
    event = Event(
        author="forecaster", invocation_id="i", actions=EventActions(state_delta={"k": 1})
    )
    await service.append_event(session, event)
    [stored] = await store.read(f"adk-session/{APP}/{USER}/{cid}")
    assert "role" not in stored.to_dict()
    assert stored.role == "adk_event"
    assert indexed_text(stored) is None


# ---------------------------------------------------------------- Pydantic AI


def weather_model() -> FunctionModel:
    """Calls ``get_weather`` for every new question, then answers from its result."""

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        last = messages[-1]
        returns = [p for p in last.parts if isinstance(p, ToolReturnPart)]
        if returns:
            return ModelResponse(parts=[TextPart(f"Answer: {returns[0].content}")])
        prompt = next(p for p in last.parts if isinstance(p, UserPromptPart))
        call = ToolCallPart("get_weather", {"city": str(prompt.content)}, f"c{len(messages)}")
        return ModelResponse(parts=[call])

    return FunctionModel(respond)


def weather_agent() -> Agent[None, str]:
    agent = Agent(weather_model(), system_prompt="You forecast weather.")

    @agent.tool_plain
    def get_weather(city: str) -> str:
        """The weather in a city."""
        return f"hail in {city}"

    return agent


async def pydantic_runs(history: HiststoreMessageHistory, cities: list[str]) -> None:
    agent = weather_agent()
    for city in cities:
        result = await agent.run(city, message_history=await history.messages())
        await history.add(result.new_messages())


async def test_pydantic_ai_messages_have_roles_and_searchable_meaning(
    store: Store, cid: str
) -> None:
    history = HiststoreMessageHistory(cid, store)
    await pydantic_runs(history, ["Reykjavik", "Quito"])
    stored = await store.read(cid)
    roles = ["user", "assistant", "tool", "assistant"]
    assert [m.role for m in stored] == roles * 2
    assert [h.position for h in await store.search("forecast", conversation=cid)] == [0]
    assert sorted(h.position for h in await store.search("Quito", conversation=cid)) == [
        4,
        5,
        6,
        7,
    ]
    hail = await store.search("hail Reykjavik", conversation=cid)
    assert sorted(h.position for h in hail) == [2, 3]  # the tool's return and the answer
    # A request made only of system prompt parts is a system message.
    system = ModelRequest(parts=[SystemPromptPart("Answer in French.")])
    await history.add([system])
    assert (await store.read(cid, limit=1))[0].role == "system"
    # Read back as stored: the role key is the envelope's, not the message's.
    got = await history.messages()
    assert got[-1] == system
    assert [m.to_dict()["message"]["kind"] for m in await store.read(cid)][:2] == [
        "request",
        "response",
    ]


async def test_pydantic_ai_window_keeps_the_system_prompt(store: Store, cid: str) -> None:
    history = HiststoreMessageHistory(cid, store, limit=4)
    everything = HiststoreMessageHistory(cid, store)
    await pydantic_runs(everything, [f"city{i}" for i in range(6)])
    window = await history.messages()
    assert len(window) == 4
    first = window[0]
    assert isinstance(first, ModelRequest)
    assert [type(p).__name__ for p in first.parts] == ["SystemPromptPart", "UserPromptPart"]
    assert first.parts[0].content == "You forecast weather."  # type: ignore[union-attr]
    assert first.parts[1].content == "city5"  # type: ignore[union-attr]
    assert window[1:] == (await everything.messages())[-3:]
    # A valid history: the agent runs on it, and the next window holds the prompt too.
    agent = weather_agent()
    result = await agent.run("Lima", message_history=window)
    assert result.output == "Answer: hail in Lima"
    await history.add(result.new_messages())
    again = await history.messages()
    assert isinstance(again[0].parts[0], SystemPromptPart)
    assert again[0].parts[1].content == "Lima"  # type: ignore[union-attr]


# ---------------------------------------------------------------- LangChain, OpenAI Agents


async def test_langchain_tool_call_args_are_indexed(store: Store, cid: str) -> None:
    history = HiststoreChatMessageHistory(cid, store)
    call = {"name": "get_weather", "args": {"city": "Tbilisi", "days": 3}, "id": "lc1"}
    await history.aadd_messages(
        [
            HumanMessage("weather?"),
            AIMessage("", tool_calls=[call]),
            ToolMessage("fog", tool_call_id="lc1"),
        ]
    )
    assert [h.position for h in await store.search("Tbilisi", conversation=cid)] == [1]
    assert [h.position for h in await store.search("3", conversation=cid)] == [1]
    assert not await store.search("get_weather", conversation=cid)  # names are not text
    assert [m.role for m in await store.read(cid)] == ["user", "assistant", "tool"]


async def test_openai_agents_items_are_indexed_as_the_sdk_stores_them(
    store: Store, cid: str
) -> None:
    session = HiststoreSession(cid, store)
    items: list[Any] = [
        {"role": "user", "content": "weather in Hanoi?"},
        {"type": "function_call", "call_id": "f1", "name": "w", "arguments": '{"city":"Hue"}'},
        {"type": "function_call_output", "call_id": "f1", "output": "monsoon"},
        {
            "type": "message",
            "role": "assistant",
            "id": "m1",
            "status": "completed",
            "content": [{"type": "output_text", "text": "Bring an umbrella", "annotations": []}],
        },
        {"type": "mcp_call", "id": "p1", "name": "n", "server_label": "s",
         "arguments": '{"q":"typhoon"}', "output": "none expected"},
        {"type": "shell_call_output", "call_id": "s1",
         "output": [{"stdout": "barometer low", "stderr": "", "outcome": {"type": "exit"}}]},
        {"type": "reasoning", "id": "r1", "summary": [{"type": "summary_text", "text": "secret"}]},
    ]  # fmt: skip
    await session.add_items(items)
    assert await session.get_items() == items

    async def found(query: str) -> list[int]:
        return sorted(h.position for h in await store.search(query, conversation=cid))

    assert await found("Hanoi") == [0]
    assert await found("Hue") == [1]
    assert await found("monsoon") == [2]
    assert await found("umbrella") == [3]
    assert await found("typhoon") == [4]
    assert await found('"none expected"') == [4]
    assert await found("barometer") == [5]
    assert await found("secret") == []  # reasoning is never indexed


# ---------------------------------------------------------------- show


async def test_show_prints_adapter_messages_by_role_and_text(shared_backend: Any) -> None:
    sid = f"show-{uuid.uuid4().hex[:8]}"
    async with shared_backend.connect() as store:
        await adk_session(store, sid, ["Windhoek"])
        history = HiststoreMessageHistory(f"pyd-{sid}", store)
        await pydantic_runs(history, ["Nuuk"])
    result = await ok("show", f"adk-session/{APP}/{USER}/{sid}", "--url", shared_backend.url)
    rows = [line.split(maxsplit=3) for line in result.out.splitlines()]
    shown = [(r[2], r[3]) for r in rows if len(r) == 4 and r[0].isdigit()]
    assert shown == [
        ("user", "Weather in Windhoek?"),
        ("assistant", f'-> get_weather(city="Windhoek")  [{sid}-0]'),
        ("tool", f'<- [{sid}-0] {{"report": "drizzle over Windhoek"}}'),
        ("assistant", "Expect rain in Windhoek."),
    ]
    assert "adk_event" not in result.out
    result = await ok("show", f"pyd-{sid}", "--url", shared_backend.url)
    assert "pydantic_ai" not in result.out
    assert "part_kind" not in result.out
    assert "You forecast weather." in result.out
    assert "Answer: hail in Nuuk" in result.out
    found = await ok("search", "Windhoek", "--url", shared_backend.url)
    assert f"adk-session/{APP}/{USER}/{sid}" in found.out


# ---------------------------------------------------------------- compact, windows


async def summarize(messages: list[Message]) -> str:
    return "Summary: " + "; ".join(t for t in map(indexed_text, messages) if t)


async def test_compact_an_adk_session_then_the_runner_keeps_going(store: Store, cid: str) -> None:
    runner, model = await adk_session(store, cid, ["Accra", "Bamako", "Dakar"])
    conversation = f"adk-session/{APP}/{USER}/{cid}"
    seen: list[list[Message]] = []

    async def summary(messages: list[Message]) -> str:
        seen.append(messages)
        return await summarize(messages)

    assert await compact(store, conversation, summary, keep_turns=1) is not None
    assert [m.role for m in seen[0]] == ["user", "assistant", "tool", "assistant"] * 2
    service = runner.session_service
    session = await service.get_session(app_name=APP, user_id=USER, session_id=cid)
    assert session is not None
    first = session.events[0]
    assert first.author == "user"
    assert first.content is not None
    assert first.content.parts[0].text.startswith("Summary: Weather in Accra?")  # type: ignore[index, union-attr]
    assert [e.author for e in session.events[1:]] == [
        "user",
        "forecaster",
        "forecaster",
        "forecaster",
    ]
    again = await service.get_session(app_name=APP, user_id=USER, session_id=cid)
    assert again is not None
    assert again.events[0].id == first.id  # reads are stable
    # The runner appends after the summary; the model sees the summary as user text.
    model.script += [model_text("Dry in Dakar now.")]
    await adk_turn(runner, cid, "And now?")
    assert model.seen[-1][0].parts[0].text.startswith("Summary: ")  # type: ignore[index, union-attr]
    after = await service.get_session(app_name=APP, user_id=USER, session_id=cid)
    assert after is not None
    assert len(after.events) == 7
    assert after.events[-1].content.parts[0].text == "Dry in Dakar now."  # type: ignore[index, union-attr]
    # Nothing new since the summary's run: compacting again changes nothing.
    assert await compact(store, conversation, summary, keep_turns=2) is None


async def test_a_listed_adk_session_appends_after_a_summary(store: Store, cid: str) -> None:
    """A summary is no newer event: a listed session value (no events) appends after it."""
    from google.adk.events import Event

    runner, _model = await adk_session(store, cid, ["Cairo", "Giza"])
    conversation = f"adk-session/{APP}/{USER}/{cid}"
    assert await compact(store, conversation, summarize, keep_turns=0) is not None
    service = runner.session_service
    [listed] = (await service.list_sessions(app_name=APP, user_id=USER)).sessions
    said = types.Content(role="user", parts=[types.Part(text="thanks")])
    await service.append_event(listed, Event(author="user", invocation_id="i", content=said))
    session = await service.get_session(app_name=APP, user_id=USER, session_id=cid)
    assert session is not None
    texts = [e.content.parts[0].text for e in session.events]  # type: ignore[index, union-attr]
    assert len(texts) == 2
    assert texts[0].startswith("Summary: Weather in Cairo?")  # type: ignore[union-attr]
    assert texts[1] == "thanks"


async def test_compact_a_pydantic_ai_history_then_the_agent_keeps_going(
    store: Store, cid: str
) -> None:
    history = HiststoreMessageHistory(cid, store)
    await pydantic_runs(history, ["Oslo", "Bergen", "Tromso"])
    assert await compact(store, cid, summarize, keep_turns=1) is not None
    messages = await history.messages()
    assert isinstance(messages[0], ModelRequest)
    assert isinstance(messages[0].parts[0], UserPromptPart)
    assert str(messages[0].parts[0].content).startswith("Summary: You forecast weather.")
    assert len(messages) == 5
    await pydantic_runs(history, ["Bodo"])
    after = await history.messages()
    assert len(after) == 9
    assert after[-1].parts[0].content == "Answer: hail in Bodo"  # type: ignore[union-attr]
    # A plain assistant or system message an edit put in reads as a response / prompt.
    await store.write(
        cid, [{"role": "assistant", "content": "noted"}, {"role": "system", "content": "S"}]
    )
    tail = await history.messages(limit=None)
    assert isinstance(tail[-2], ModelResponse)
    assert tail[-2].parts[0].content == "noted"  # type: ignore[union-attr]
    assert isinstance(tail[-1], ModelRequest)
    assert isinstance(tail[-1].parts[0], SystemPromptPart)


async def test_window_store_reads_adapter_turns(store: Store, cid: str) -> None:
    history = HiststoreMessageHistory(cid, store)
    await pydantic_runs(history, ["Cusco", "Puno"])
    window = await WindowStore(store, max_messages=5).read(cid)
    # The newest whole turn: the run's request, call, result and answer.
    assert [m.position for m in window] == [4, 5, 6, 7]
    assert histstore.turns.status(window) == "closed"


async def test_turn_helpers_pair_framework_tool_calls(store: Store, cid: str) -> None:
    """``histstore.turns`` reads the calls and results inside ADK and Pydantic AI
    envelopes: a finished turn pairs, a history cut after a call is interrupted."""
    await adk_session(store, cid, ["Lima"])
    history = HiststoreMessageHistory(f"{cid}-p", store)
    await pydantic_runs(history, ["Cusco"])
    for conversation in (f"adk-session/{APP}/{USER}/{cid}", f"{cid}-p"):
        stored = await store.read(conversation)
        histstore.turns.validate_pairing(stored)
        assert histstore.turns.status(stored) == "closed"
        cut = stored[:2]  # the question and the model's call
        assert histstore.turns.status(cut) == "interrupted"
        [call] = histstore.turns.pending_tool_calls(cut)
        assert "Lima" in json.dumps(call) or "Cusco" in json.dumps(call)
        with pytest.raises(histstore.InvalidMessage, match="has no result"):
            histstore.turns.validate_pairing(cut)


async def test_window_store_merges_a_framework_system_prompt(store: Store, cid: str) -> None:
    history = HiststoreMessageHistory(cid, store)
    await history.add([ModelRequest(parts=[SystemPromptPart("Answer in French.")])])
    await pydantic_runs(history, ["Cusco", "Puno"])
    window = await WindowStore(store, max_messages=5).read(cid)
    assert window[0].to_dict() == {"role": "system", "content": "Answer in French."}
