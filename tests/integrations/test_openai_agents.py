"""HiststoreSession: the OpenAI Agents SDK Session protocol on every backend."""

from __future__ import annotations

import asyncio
import copy
import os
import subprocess
import sys
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from agents import Agent, Runner, function_tool
from agents.items import ModelResponse, TResponseInputItem
from agents.memory import OpenAIResponsesCompactionSession, Session, SessionSettings
from agents.memory.session import _CompactionSnapshot
from agents.models.interface import Model
from agents.usage import Usage
from faults import Faults
from helpers import PYTHON, subprocess_env
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

import histstore
from histstore import HistStoreError, InvalidMessage, WindowTooSmall
from histstore.integrations.openai_agents import COMPACTION_AUTHOR, HiststoreSession
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


# ---------------------------------------------------------------- compaction sessions
#
# The SDK's OpenAIResponsesCompactionSession drives HiststoreSession: automatically after
# a run (its ``_get_compaction_snapshot`` hook) and on ``run_compaction()`` (its
# ``_atomic_replace_items`` hook). A fake ``responses.compact`` client stands in for the
# API; nothing goes to the network.


class RespondingModel(FakeModel):
    """A model that answers every call with a numbered reply and a response id."""

    async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
        self.queue.append([text(f"reply {len(self.inputs)}")])
        response = await super().get_response(*args, **kwargs)
        response.response_id = f"resp_{len(self.inputs)}"
        return response


SUMMARY: list[dict[str, Any]] = [
    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "q0"}]},
    {"type": "compaction", "id": "cmp_1", "encrypted_content": "gAAAA-summary"},
]


class FakeResponses:
    """``client.responses``: ``compact`` records its arguments, runs ``during`` (a write
    from elsewhere, a failure) and returns ``SUMMARY``."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []
        self.during: Any = None

    async def compact(self, **kwargs: Any) -> Any:
        self.calls.append(copy.deepcopy(kwargs))
        if self.during is not None:
            await self.during()
        return SimpleNamespace(output=copy.deepcopy(SUMMARY), usage=None)


def compacting(
    session: HiststoreSession, *, at: int = 6, mode: Any = "auto"
) -> tuple[OpenAIResponsesCompactionSession, FakeResponses]:
    """The SDK's compaction wrapper around ``session``: it compacts once the history it
    is shown holds ``at`` items."""
    responses = FakeResponses()
    wrapper = OpenAIResponsesCompactionSession(
        session.session_id,
        session,
        client=SimpleNamespace(responses=responses),  # type: ignore[arg-type]
        compaction_mode=mode,
        should_trigger_compaction=lambda ctx: len(ctx["session_items"]) >= at,
    )
    return wrapper, responses


def forbid_clear_and_add(monkeypatch: pytest.MonkeyPatch, session: HiststoreSession) -> None:
    """Make the SDK's fallback (clear the session, then add the output) fail loudly."""

    async def refused(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("compaction went through clear_session/add_items")

    monkeypatch.setattr(session, "clear_session", refused)
    monkeypatch.setattr(session, "add_items", refused)


async def run_turns(agent: Agent[Any], session: Any, first: int, last: int) -> None:
    for i in range(first, last):
        await Runner.run(agent, f"q{i}", session=session)


async def compactions(store: histstore.Store, cid: str) -> list[histstore.Change]:
    return [c for c in await store.changes(cid) if c.author == COMPACTION_AUTHOR]


async def test_automatic_compaction_is_one_change_that_revert_undoes(store, cid, monkeypatch):
    inner = HiststoreSession(cid, store)
    session, responses = compacting(inner, at=6)
    agent = Agent(name="a", model=RespondingModel())
    await run_turns(agent, session, 0, 2)
    assert responses.calls == []
    before = await inner.get_items()
    revision = (await store.edit(cid)).revision

    # Turn 3 is stored (its input, then the reply), then the SDK compacts, never
    # through clear_session/add_items.
    with monkeypatch.context() as patch:
        forbid_clear_and_add(patch, inner)
        patch.setattr(inner, "add_items", HiststoreSession.add_items.__get__(inner))
        await run_turns(agent, session, 2, 3)
    assert responses.calls == [{"model": "gpt-4.1", "previous_response_id": "resp_3"}]
    assert await inner.get_items() == SUMMARY
    [change] = await compactions(store, cid)
    assert change.revision == revision + 3  # two writes of turn 3, then the one change
    assert change.kind == "splice"
    assert [m.author for m in await store.read(cid)] == [COMPACTION_AUTHOR] * 2
    # The change log survived the compaction (no clear): folding it gives the value.
    assert histstore.Conversation.fold(await store.changes(cid)) == await store.edit(cid)

    # The session goes on after the compaction; revert brings the turns back.
    await run_turns(agent, session, 3, 4)
    assert kinds(await inner.get_items()) == ["user", "compaction", "user", "assistant"]
    await store.revert(cid, change.revision - 1, by="me")
    turns = await inner.get_items()
    assert turns[:4] == before
    assert contents(turns)[4] == "q2"
    assert len(turns) == 6


async def test_automatic_compaction_of_a_suffix_keeps_the_older_items(store, cid):
    """The model sees only the newest items (``session_settings.limit``): the SDK
    compacts the suffix it saw, from a user message on, in input mode; the older items
    stay as they were, ids included."""
    inner = HiststoreSession(cid, store, session_settings={"limit": 3})
    session, responses = compacting(inner, at=3)
    older: list[TResponseInputItem] = []
    for i in range(3):
        older += [
            {"role": "user", "content": f"old q{i}"},
            {"role": "assistant", "content": f"a{i}"},
        ]
    await inner.add_items(older)
    kept_ids = [e.entry_id for e in (await store.edit(cid)).entries[:4]]
    await run_turns(Agent(name="a", model=RespondingModel()), session, 0, 1)

    # The run saw [a1, old q2, a2, q0] and answered; compact got [old q2, a2, q0, reply].
    [call] = responses.calls
    assert "previous_response_id" not in call
    assert contents(call["input"])[:3] == ["old q2", "a2", "q0"]
    assert len(call["input"]) == 4
    assert await inner.get_items(limit=100) == [*older[:4], *SUMMARY]
    assert [e.entry_id for e in (await store.edit(cid)).entries[:4]] == kept_ids
    [change] = await compactions(store, cid)
    await store.revert(cid, change.revision - 1, by="me")
    assert contents(await inner.get_items(limit=100))[4:7] == ["old q2", "a2", "q0"]
    assert await inner.get_items(limit=100) == [*older, *call["input"][2:]]


async def test_run_compaction_replaces_the_history_in_one_change(store, cid, monkeypatch):
    inner = HiststoreSession(cid, store)
    history = copy.deepcopy(RESPONSES_ITEMS)
    await inner.add_items(history)  # type: ignore[arg-type]
    session, responses = compacting(inner, mode="input")
    forbid_clear_and_add(monkeypatch, inner)
    await session.run_compaction({"force": True})
    # The API got the history (the SDK drops the system item and ids it cannot replay).
    assert responses.calls[0]["model"] == "gpt-4.1"
    assert responses.calls[0]["input"][-1]["content"][0]["text"] == "Done."
    assert await inner.get_items() == SUMMARY
    [change] = await compactions(store, cid)
    assert change.revision == 2
    assert [e.entry_id for e in (await store.edit(cid)).entries] == [7, 8]
    await store.revert(cid, 1, by="me")
    assert await inner.get_items() == RESPONSES_ITEMS


async def test_snapshot_hook_gives_the_sdk_its_snapshot(store, cid):
    inner = HiststoreSession(cid, store)
    empty = await inner._get_compaction_snapshot(5)
    assert isinstance(empty, _CompactionSnapshot)
    assert (empty.items, empty.complete) == ([], True)
    assert await empty.replace_suffix(0, SUMMARY) is False  # type: ignore[arg-type]

    await inner.add_items([{"role": "user", "content": f"m{i}"} for i in range(5)])
    snap = await inner._get_compaction_snapshot(3)
    assert snap is not None
    assert snap.items == await inner.get_items(limit=3)
    assert snap.complete is False
    whole = await inner._get_compaction_snapshot(5)
    assert whole is not None
    assert (whole.items, whole.complete) == (await inner.get_items(), True)

    assert await snap.replace_suffix(3, SUMMARY) is False  # type: ignore[arg-type]  # past the end
    assert await snap.replace_suffix(1, SUMMARY) is True  # type: ignore[arg-type]
    assert contents(await inner.get_items()) == ["m0", "m1", "m2", *contents(SUMMARY)]
    assert await snap.replace_suffix(1, SUMMARY) is False  # type: ignore[arg-type]  # once
    # ``whole`` was read before that replacement: refused, nothing written.
    assert await whole.replace_suffix(0, []) is False
    assert len(await compactions(store, cid)) == 1


async def test_prune_prefix_goes_in_the_same_change(store, cid):
    """The SDK's EncryptedSession passes ``prune_prefix`` to drop expired items: the
    leading ones it accepts are removed in the compaction's one change."""
    inner = HiststoreSession(cid, store)
    await inner.add_items([{"role": "user", "content": c} for c in ["x1", "x2", "k", "x3", "s"]])
    snap = await inner._get_compaction_snapshot(1, prune_prefix=lambda i: i["content"][0] == "x")
    assert snap is not None
    assert await snap.replace_suffix(0, SUMMARY[1:]) is True  # type: ignore[arg-type]
    assert contents(await inner.get_items()) == ["k", "x3", None]
    [change] = await compactions(store, cid)
    entries = (await store.edit(cid)).entries
    assert [e.entry_id for e in entries[:2]] == [3, 4]  # the kept entries keep their ids
    await store.revert(cid, change.revision - 1, by="me")
    assert contents(await inner.get_items()) == ["x1", "x2", "k", "x3", "s"]


async def test_an_append_during_automatic_compaction_is_kept(store, cid):
    """Another process appends while ``responses.compact`` runs: the stored history no
    longer is what was compacted, so the SDK's replacement is refused and skipped; the
    history keeps every item, the append included, and a later turn compacts again."""
    inner = HiststoreSession(cid, store)
    session, responses = compacting(inner, at=6)
    agent = Agent(name="a", model=RespondingModel())
    elsewhere = HiststoreSession(cid, store)

    async def append_elsewhere() -> None:
        await elsewhere.add_items([{"role": "user", "content": "from elsewhere"}])

    responses.during = append_elsewhere
    await run_turns(agent, session, 0, 3)
    assert len(responses.calls) == 1
    items = await inner.get_items()
    assert contents(items)[::2] == ["q0", "q1", "q2", "from elsewhere"]
    assert await compactions(store, cid) == []

    responses.during = None
    await run_turns(agent, session, 3, 4)
    assert await inner.get_items() == SUMMARY
    assert len(await compactions(store, cid)) == 1


async def test_an_append_between_snapshot_and_replace_is_kept(store, cid):
    inner = HiststoreSession(cid, store)
    await inner.add_items([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}])
    snap = await inner._get_compaction_snapshot(10)
    assert snap is not None
    await store.write(cid, [{"role": "user", "content": "late"}])
    assert await snap.replace_suffix(0, SUMMARY) is False  # type: ignore[arg-type]
    assert contents(await inner.get_items()) == ["a", "b", "late"]
    assert await compactions(store, cid) == []


async def test_a_failed_compaction_commit_leaves_the_history(store, cid, monkeypatch):
    """The splice's entries are written, then the change record fails: the transaction
    rolls back, the history and its change log are as they were, and the SDK's error
    reaches the caller; the next turn compacts."""
    inner = HiststoreSession(cid, store)
    session, _ = compacting(inner, at=6)
    agent = Agent(name="a", model=RespondingModel())
    await run_turns(agent, session, 0, 2)
    faults = Faults(monkeypatch)
    faults.fail_insert_into = "histstore_changes"
    with pytest.raises(HistStoreError):
        await run_turns(agent, session, 2, 3)
    faults.fail_insert_into = None
    kept = await inner.get_items()
    assert contents(kept)[::2] == ["q0", "q1", "q2"]
    assert len(kept) == 6
    assert await compactions(store, cid) == []
    assert histstore.Conversation.fold(await store.changes(cid)) == await store.edit(cid)
    await run_turns(agent, session, 3, 4)
    assert await inner.get_items() == SUMMARY


@pytest.mark.parametrize("mode", ["rollback-then-fail", "commit-then-fail"])
async def test_a_lost_commit_leaves_old_or_new_history(store, cid, monkeypatch, mode):
    """The connection drops at the compaction's COMMIT: the history is the old one or
    the compacted one (one change, revertable), never a mix and never empty."""
    inner = HiststoreSession(cid, store)
    await inner.add_items(copy.deepcopy(RESPONSES_ITEMS))  # type: ignore[arg-type]
    session, _ = compacting(inner, mode="input")
    faults = Faults(monkeypatch)
    faults.commit_mode = mode
    with pytest.raises(HistStoreError):
        await session.run_compaction({"force": True})
    faults.commit_mode = None
    if mode == "rollback-then-fail":
        assert await inner.get_items() == RESPONSES_ITEMS
        assert await compactions(store, cid) == []
    else:
        assert await inner.get_items() == SUMMARY
        [change] = await compactions(store, cid)
        await store.revert(cid, change.revision - 1, by="me")
        assert await inner.get_items() == RESPONSES_ITEMS


async def test_a_failure_before_the_replacement_writes_nothing(store, cid):
    inner = HiststoreSession(cid, store)
    await inner.add_items(copy.deepcopy(RESPONSES_ITEMS))  # type: ignore[arg-type]
    session, responses = compacting(inner, mode="input")

    async def api_down() -> None:
        raise RuntimeError("compaction API unavailable")

    responses.during = api_down
    revision = (await store.edit(cid)).revision
    with pytest.raises(RuntimeError):
        await session.run_compaction({"force": True})
    assert await inner.get_items() == RESPONSES_ITEMS
    assert (await store.edit(cid)).revision == revision


class TransformingSession(HiststoreSession):
    async def add_items(self, items: list[TResponseInputItem]) -> None:
        await super().add_items([{**i, "tag": 1} for i in items])  # type: ignore[list-item]


async def test_a_subclass_that_transforms_items_gets_no_bypass(store, cid):
    session = TransformingSession(cid, store)
    assert await session._get_compaction_snapshot(3) is None
    assert await session._atomic_replace_items([]) is False


# A child process that runs ``run_compaction()`` and dies (``os._exit``) inside the
# compaction's transaction, once the entries are written and before the change record
# and the commit.
CRASHER = """
import asyncio, os, sys
from types import SimpleNamespace
import pytest
from faults import Faults
from agents.memory import OpenAIResponsesCompactionSession
import histstore
from histstore.integrations.openai_agents import HiststoreSession

url, conversation, pooler = sys.argv[1], sys.argv[2], sys.argv[3] or None

class Responses:
    async def compact(self, **kwargs):
        output = [{"type": "compaction", "encrypted_content": "x"}]
        return SimpleNamespace(output=output, usage=None)

def die_at(verb):
    if verb.startswith("INSERT INTO HISTSTORE_CHANGES "):
        os._exit(17)
    return False

async def main():
    faults = Faults(pytest.MonkeyPatch())
    faults._insert_fails = die_at
    store = await histstore.connect(url, **({"pooler": pooler} if pooler else {}))
    inner = HiststoreSession(conversation, store)
    session = OpenAIResponsesCompactionSession(
        conversation, inner, client=SimpleNamespace(responses=Responses()), compaction_mode="input"
    )
    await session.run_compaction({"force": True})

asyncio.run(main())
"""


async def test_a_process_killed_mid_compaction_loses_nothing(shared_backend, cid):
    async with shared_backend.connect() as store:
        await HiststoreSession(cid, store).add_items(copy.deepcopy(RESPONSES_ITEMS))  # type: ignore[arg-type]
    pooler = shared_backend.options.get("pooler", "")
    env = subprocess_env()  # the child imports tests/faults.py too
    env["PYTHONPATH"] += os.pathsep + str(Path(__file__).parents[1])
    proc = await asyncio.to_thread(
        subprocess.run,
        [PYTHON, "-c", CRASHER, shared_backend.url, cid, pooler],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 17, proc.stderr
    async with shared_backend.connect() as store:
        assert await HiststoreSession(cid, store).get_items() == RESPONSES_ITEMS
        assert await compactions(store, cid) == []
        assert histstore.Conversation.fold(await store.changes(cid)) == await store.edit(cid)


async def test_run_compaction_replaces_what_is_stored_then(store, cid):
    """A manual ``run_compaction()`` replaces the whole history as stored when it
    replaces (the SDK's contract): an item appended while ``responses.compact`` ran is
    replaced too, and the change record keeps it, so ``revert`` brings it back."""
    inner = HiststoreSession(cid, store)
    await inner.add_items([{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}])
    session, responses = compacting(inner, mode="input")

    async def append_elsewhere() -> None:
        await store.write(cid, [{"role": "user", "content": "late"}])

    responses.during = append_elsewhere
    await session.run_compaction({"force": True})
    assert await inner.get_items() == SUMMARY
    [change] = await compactions(store, cid)
    await store.revert(cid, change.revision - 1, by="me")
    assert contents(await inner.get_items()) == ["q", "a", "late"]


async def test_run_compaction_refuses_a_write_inside_its_commit(store, cid, monkeypatch):
    """A write that lands between loading the history and committing the replacement
    makes the commit conflict: nothing is replaced and the caller gets ConflictError."""
    inner = HiststoreSession(cid, store)
    await inner.add_items([{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}])
    session, _ = compacting(inner, mode="input")
    load = store.edit

    async def edit_then_write(conversation: str) -> histstore.Conversation:
        value = await load(conversation)
        await store.write(conversation, [{"role": "user", "content": "racing"}])
        return value

    monkeypatch.setattr(store, "edit", edit_then_write)
    with pytest.raises(histstore.ConflictError):
        await session.run_compaction({"force": True})
    monkeypatch.undo()
    assert contents(await inner.get_items()) == ["q", "a", "racing"]
    assert await compactions(store, cid) == []
