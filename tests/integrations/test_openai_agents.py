"""HiststoreSession: the OpenAI Agents SDK Session protocol on every backend."""

from __future__ import annotations

import asyncio
import copy
import subprocess
import sys
import uuid
from typing import Any

import pytest
from agents import Agent, Runner, function_tool
from agents.items import ModelResponse, TResponseInputItem
from agents.memory import Session, SessionSettings
from agents.models.interface import Model
from agents.usage import Usage
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

import histstore
from histstore import HistStoreError, InvalidMessage, WindowTooSmall
from histstore.integrations.openai_agents import HiststoreSession
from histstore.window import WindowStore


class FakeModel(Model):
    """A model answering with queued outputs and recording every input it was given."""

    def __init__(self) -> None:
        self.queue: list[list[Any]] = []
        self.inputs: list[list[dict[str, Any]]] = []

    async def get_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: Any,
        tools: Any,
        output_schema: Any,
        handoffs: Any,
        tracing: Any,
        *,
        previous_response_id: str | None,
        conversation_id: str | None,
        prompt: Any,
    ) -> ModelResponse:
        items = [{"role": "user", "content": input}] if isinstance(input, str) else input
        self.inputs.append(copy.deepcopy([dict(i) for i in items]))
        return ModelResponse(output=self.queue.pop(0), usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError


def text(content: str) -> ResponseOutputMessage:
    return ResponseOutputMessage(
        id=f"msg_{uuid.uuid4().hex[:8]}",
        type="message",
        role="assistant",
        status="completed",
        content=[ResponseOutputText(type="output_text", text=content, annotations=[])],
    )


def call(name: str, arguments: str, call_id: str) -> ResponseFunctionToolCall:
    return ResponseFunctionToolCall(
        id=f"fc_{uuid.uuid4().hex[:8]}",
        type="function_call",
        name=name,
        arguments=arguments,
        call_id=call_id,
        status="completed",
    )


@function_tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


def kinds(items: list[dict[str, Any]]) -> list[str]:
    return [i.get("type") if i.get("type") not in (None, "message") else i["role"] for i in items]


def contents(items: list[TResponseInputItem]) -> list[Any]:
    return [dict(i).get("content") for i in items]


# ---------------------------------------------------------------- the Runner, several turns


async def test_runner_replays_history_with_tool_calls(store, cid):
    model = FakeModel()
    agent = Agent(name="assistant", model=model, tools=[get_weather])
    session = HiststoreSession(cid, store)

    model.queue.append([text("Hello!")])
    first = await Runner.run(agent, "Hi", session=session)
    assert first.final_output == "Hello!"

    model.queue.append([call("get_weather", '{"city": "Paris"}', "call_1")])
    model.queue.append([text("It is sunny in Paris.")])
    second = await Runner.run(agent, "Weather in Paris?", session=session)
    assert second.final_output == "It is sunny in Paris."
    # The model's second call of that turn saw the tool call and its output.
    assert kinds(model.inputs[2]) == [
        "user",
        "assistant",
        "user",
        "function_call",
        "function_call_output",
    ]
    assert model.inputs[2][-1]["call_id"] == "call_1"
    assert model.inputs[2][-1]["output"] == "sunny in Paris"

    model.queue.append([text("You're welcome.")])
    await Runner.run(agent, "Thanks", session=session)
    seen = model.inputs[-1]
    assert kinds(seen) == [
        "user",
        "assistant",
        "user",
        "function_call",
        "function_call_output",
        "assistant",
        "user",
    ]
    assert seen[0]["content"] == "Hi"
    assert seen[-1]["content"] == "Thanks"
    assert seen[3]["arguments"] == '{"city": "Paris"}'

    # Everything the model saw, plus its last reply, is what the session and the store hold.
    items = await session.get_items()
    assert kinds(items) == [*kinds(seen), "assistant"]
    assert [m.to_dict() for m in await store.read(cid)] == items
    assert histstore.turns.status(items) == "closed"
    assert len(histstore.turns.split_turns(items)) == 3


# Runner.run_sync calls loop.shutdown_asyncgens() after every run yet keeps the loop for
# the next one; asyncio then warns about each async generator started later on it
# (SQLAlchemy's ``AsyncEngine.begin`` is one). The generators run to their end; the
# warning is the SDK's loop handling, not a leak.
@pytest.mark.filterwarnings("ignore:asynchronous generator .* was scheduled after:ResourceWarning")
async def test_runner_sync_with_an_owned_store(shared_backend, cid):
    """Runner.run_sync in a thread of its own: the session opens its store on that loop."""

    def run_in_thread() -> list[list[dict[str, Any]]]:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        model = FakeModel()
        agent = Agent(name="assistant", model=model)
        session = HiststoreSession(cid, shared_backend.url)
        try:
            for i in range(3):
                model.queue.append([text(f"reply {i}")])
                result = Runner.run_sync(agent, f"question {i}", session=session)
                assert result.final_output == f"reply {i}"
        finally:
            loop.run_until_complete(session.close())
            asyncio.set_event_loop(None)
            loop.close()
        return model.inputs

    inputs = await asyncio.to_thread(run_in_thread)
    assert [len(i) for i in inputs] == [1, 3, 5]
    assert contents(inputs[2])[0] == "question 0"
    async with shared_backend.connect() as other:
        stored = [m.to_dict() for m in await other.read(cid)]
    assert kinds(stored) == ["user", "assistant"] * 3
    assert stored[-2]["content"] == "question 2"


async def test_session_settings_limit_reaches_the_model(store, cid):
    session = HiststoreSession(cid, store, session_settings={"limit": 2})
    await session.add_items([{"role": "user", "content": f"turn {i}"} for i in range(10)])
    model = FakeModel()
    model.queue.append([text("ok")])
    await Runner.run(Agent(name="a", model=model), "new", session=session)
    assert contents(model.inputs[0]) == ["turn 8", "turn 9", "new"]


async def test_window_shapes_what_the_model_sees(store, cid):
    window = WindowStore(store, max_messages=3)
    session = HiststoreSession(cid, store, window=window)
    history: list[TResponseInputItem] = [{"role": "system", "content": "Be brief."}]
    for i in range(4):
        history += [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"a{i}"}]
    await session.add_items(history)

    model = FakeModel()
    model.queue.append([text("ok")])
    await Runner.run(Agent(name="a", model=model), "q4", session=session)
    assert contents(model.inputs[0]) == ["Be brief.", "q3", "a3", "q4"]
    # A limit reads the raw tail, whatever the window.
    tail = await session.get_items(limit=3)
    assert contents(tail)[:2] == ["a3", "q4"]
    assert tail[2]["content"][0]["text"] == "ok"
    assert len(await store.read(cid)) == 11


# ---------------------------------------------------------------- the Session protocol


async def test_is_a_session_with_the_protocols_attributes(store, cid):
    session = HiststoreSession(cid, store)
    assert isinstance(session, Session)
    assert session.session_id == cid
    assert session.session_settings is None
    settings = SessionSettings(limit=5)
    assert HiststoreSession(cid, store, session_settings=settings).session_settings is settings


RESPONSES_ITEMS: list[dict[str, Any]] = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": [{"type": "input_text", "text": "Grüße 👋 \u0000 end"}]},
    {
        "type": "reasoning",
        "id": "rs_1",
        "summary": [{"type": "summary_text", "text": "thinking"}],
        "encrypted_content": "gAAAA==",
    },
    {
        "type": "function_call",
        "id": "fc_1",
        "call_id": "call_9",
        "name": "lookup",
        "arguments": '{"q": "x", "n": 1.5e300}',
        "status": "completed",
    },
    {"type": "function_call_output", "call_id": "call_9", "output": '{"rows": []}'},
    {
        "type": "message",
        "id": "msg_1",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": "Done.", "annotations": [], "logprobs": None}],
    },
]


async def test_items_round_trip_as_plain_equal_dicts(store, cid):
    session = HiststoreSession(cid, store)
    await session.add_items(copy.deepcopy(RESPONSES_ITEMS))  # type: ignore[arg-type]
    items = await session.get_items()
    assert items == RESPONSES_ITEMS
    assert all(type(i) is dict for i in items)
    items[0]["content"] = "changed"  # a fresh copy: the store is unaffected
    assert (await session.get_items())[0]["content"] == "You are terse."


async def test_order_limit_pop_and_clear(store, cid):
    session = HiststoreSession(cid, store)
    assert await session.get_items() == []
    assert await session.pop_item() is None
    await session.add_items(
        [{"role": "user", "content": "m0"}, {"role": "assistant", "content": "m1"}]
    )
    await session.add_items([])
    await session.add_items([{"role": "user", "content": f"m{i}"} for i in range(2, 6)])
    assert contents(await session.get_items()) == [f"m{i}" for i in range(6)]
    assert contents(await session.get_items(limit=2)) == ["m4", "m5"]
    assert contents(await session.get_items(limit=4)) == ["m2", "m3", "m4", "m5"]
    assert contents(await session.get_items(limit=100)) == [f"m{i}" for i in range(6)]
    assert await session.get_items(limit=0) == []

    assert await session.pop_item() == {"role": "user", "content": "m5"}
    assert await session.pop_item() == {"role": "user", "content": "m4"}
    assert contents(await session.get_items()) == ["m0", "m1", "m2", "m3"]

    await session.clear_session()
    assert await session.get_items() == []
    assert await session.pop_item() is None
    assert not await store.exists(cid)
    await session.add_items([{"role": "user", "content": "again"}])
    assert contents(await session.get_items()) == ["again"]


async def test_sessions_are_isolated(store):
    a = HiststoreSession(f"a-{uuid.uuid4().hex}", store)
    b = HiststoreSession(f"b-{uuid.uuid4().hex}", store)
    await a.add_items([{"role": "user", "content": "for a"}])
    await b.add_items([{"role": "user", "content": "for b"}])
    assert await b.pop_item() == {"role": "user", "content": "for b"}
    await b.clear_session()
    assert contents(await a.get_items()) == ["for a"]


async def test_settings_limit_and_explicit_override(store, cid):
    session = HiststoreSession(cid, store, session_settings=SessionSettings(limit=3))
    await session.add_items([{"role": "user", "content": f"m{i}"} for i in range(10)])
    assert contents(await session.get_items()) == ["m7", "m8", "m9"]
    assert contents(await session.get_items(limit=2)) == ["m8", "m9"]


async def test_window_applies_only_without_a_limit(store, cid):
    def make_window(s: histstore.Store) -> WindowStore:
        return WindowStore(s, max_messages=2)

    session = HiststoreSession(cid, store, window=make_window)
    await session.add_items(
        [
            {"role": "user", "content": "q0"},
            {"role": "assistant", "content": "a0"},
            {"role": "user", "content": "q1"},
            {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c", "output": "x"},
        ]
    )
    with pytest.raises(WindowTooSmall):  # the newest turn has three items
        await session.get_items()
    await session.add_items(
        [{"role": "user", "content": "q2"}, {"role": "assistant", "content": "a2"}]
    )
    assert contents(await session.get_items()) == ["q2", "a2"]
    assert len(await session.get_items(limit=5)) == 5


async def test_concurrent_adds_from_many_tasks(store, cid):
    session = HiststoreSession(cid, store)
    tasks, per_task = 25, 4

    async def add(t: int) -> None:
        await session.add_items([{"role": "user", "content": f"t{t}-{k}"} for k in range(per_task)])

    await asyncio.gather(*(add(t) for t in range(tasks)))
    items = await session.get_items()
    got = contents(items)
    expected = {f"t{t}-{k}" for t in range(tasks) for k in range(per_task)}
    assert len(got) == len(expected)
    assert set(got) == expected
    # Each batch is stored whole and in order, never interleaved with another.
    for start in range(0, len(got), per_task):
        batch = got[start : start + per_task]
        owner = batch[0].split("-")[0]
        assert batch == [f"{owner}-{k}" for k in range(per_task)]
    assert await session.get_items() == items  # the same order on every read
    assert contents(await session.get_items(limit=per_task)) == got[-per_task:]


async def test_invalid_items_write_nothing(store, cid):
    session = HiststoreSession(cid, store)
    with pytest.raises(InvalidMessage):
        await session.add_items([{"role": "user", "content": "ok"}, {"content": "no role"}])  # type: ignore[list-item]
    with pytest.raises(InvalidMessage):
        await session.add_items([{"role": "user", "content": float("nan")}])
    assert await session.get_items() == []


# ---------------------------------------------------------------- owning a store


async def test_owned_store_opens_lazily_and_closes(shared_backend, cid, tmp_path):
    async with HiststoreSession(cid, shared_backend.url) as session:
        await session.add_items([{"role": "user", "content": "kept"}])
    with pytest.raises(HistStoreError):
        await session.get_items()
    async with HiststoreSession(cid, shared_backend.url) as again:
        assert contents(await again.get_items()) == ["kept"]

    unused = HiststoreSession(cid, tmp_path / "never.db")
    await unused.close()  # nothing was opened: nothing is created
    assert not (tmp_path / "never.db").exists()


async def test_borrowed_store_stays_open(store, cid):
    async with HiststoreSession(cid, store) as session:
        await session.add_items([{"role": "user", "content": "x"}])
    assert await store.count(cid) == 1


async def test_concurrent_first_use_opens_one_store(tmp_path, cid):
    session = HiststoreSession(cid, str(tmp_path / "c.db"))
    try:
        await asyncio.gather(
            *(session.add_items([{"role": "user", "content": str(i)}]) for i in range(10))
        )
        assert len(await session.get_items()) == 10
    finally:
        await session.close()


def test_bad_arguments_fail_at_construction(tmp_path):
    with pytest.raises(histstore.InvalidId):
        HiststoreSession(" padded", tmp_path / "x.db")
    with pytest.raises(TypeError):
        HiststoreSession("ok", 42)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="sqlite and postgresql"):
        HiststoreSession("ok", "mysql://u@h/db")
    with pytest.raises(TypeError):
        HiststoreSession("ok", tmp_path / "x.db", window=3)  # type: ignore[arg-type]


def test_import_without_the_sdk_names_the_extra():
    code = "import sys; sys.modules['agents'] = None\nimport histstore.integrations.openai_agents\n"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode != 0
    assert "ImportError" in proc.stderr
    assert "pip install 'histstore[openai-agents]'" in proc.stderr
