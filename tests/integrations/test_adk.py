"""HiststoreSessionService: Google ADK sessions, side by side with ADK's own services."""

from __future__ import annotations

import asyncio
import copy
import itertools
import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from adk_models import ScriptedModel, model_text
from faults import Faults
from google.adk.agents import LlmAgent
from google.adk.errors import StaleSessionError
from google.adk.errors.already_exists_error import AlreadyExistsError
from google.adk.errors.session_not_found_error import SessionNotFoundError
from google.adk.events import Event, EventActions
from google.adk.models.llm_response import LlmResponse
from google.adk.platform import time as adk_time
from google.adk.runners import Runner
from google.adk.sessions import (
    BaseSessionService,
    DatabaseSessionService,
    InMemorySessionService,
    Session,
)
from google.adk.sessions.base_session_service import GetSessionConfig
from google.adk.tools.tool_context import ToolContext
from google.genai import types
from helpers import REPO

import histstore
from histstore import HistStoreError, InvalidMessage
from histstore.integrations.adk import HiststoreSessionService

APP, USER = "weather-app", "user-1"


class Clock:
    """ADK's time source, set by the test so both services see the same times."""

    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def tick(self, seconds: float = 1.0) -> float:
        self.now += seconds
        return self.now


@pytest.fixture
def clock() -> Iterator[Clock]:
    c = Clock()
    adk_time.set_time_provider(lambda: c.now)
    try:
        yield c
    finally:
        adk_time.reset_time_provider()


@pytest.fixture
def services(store: histstore.Store) -> tuple[HiststoreSessionService, InMemorySessionService]:
    return HiststoreSessionService(store), InMemorySessionService()


def text_event(text: str, *, author: str = "user", ts: float, **delta: Any) -> Event:
    role = "user" if author == "user" else "model"
    return Event(
        invocation_id="inv-1",
        author=author,
        content=types.Content(role=role, parts=[types.Part(text=text)]),
        actions=EventActions(state_delta=dict(delta)),
        timestamp=ts,
    )


def dump(session: Session | None) -> dict[str, Any] | None:
    return None if session is None else session.model_dump()


async def both(
    ours: BaseSessionService, theirs: BaseSessionService, method: str, **kwargs: Any
) -> tuple[Any, Any]:
    """Call one method on both services with equal (separately copied) arguments."""
    got = await getattr(ours, method)(**copy.deepcopy(kwargs))
    expected = await getattr(theirs, method)(**copy.deepcopy(kwargs))
    return got, expected


async def append_both(
    pair: tuple[Session, Session],
    services: tuple[BaseSessionService, BaseSessionService],
    event: Event,
) -> None:
    """Append copies of one event to each service's session value; both must agree."""
    ours_event, theirs_event = copy.deepcopy(event), copy.deepcopy(event)
    got = await services[0].append_event(pair[0], ours_event)
    expected = await services[1].append_event(pair[1], theirs_event)
    assert got.model_dump() == expected.model_dump()
    assert pair[0].model_dump() == pair[1].model_dump()


async def create_both(
    services: tuple[BaseSessionService, BaseSessionService], **kwargs: Any
) -> tuple[Session, Session]:
    got, expected = await both(*services, "create_session", **kwargs)
    assert got.model_dump() == expected.model_dump()
    return got, expected


# ---------------------------------------------------------------- side by side with InMemory


async def test_create_get_list_delete_like_in_memory(services, clock):
    state = {"app:theme": "dark", "user:name": "Ada", "temp:scratch": 1, "topic": "rain"}
    await create_both(services, app_name=APP, user_id=USER, session_id="s1", state=state)
    clock.tick()
    await create_both(services, app_name=APP, user_id=USER, session_id=" s2 ", state={"n": 2})
    clock.tick()
    await create_both(
        services, app_name=APP, user_id="user-2", session_id="s3", state={"user:name": "Bo"}
    )
    await create_both(services, app_name="other-app", user_id=USER, session_id="s1")

    for sid in ("s1", "s2", " s2", "s3", "missing"):
        got, expected = await both(
            *services, "get_session", app_name=APP, user_id=USER, session_id=sid
        )
        assert dump(got) == dump(expected)
    for user in (USER, "user-2", "nobody", None):
        got, expected = await both(*services, "list_sessions", app_name=APP, user_id=user)
        assert got.model_dump() == expected.model_dump()
        got, expected = await both(*services, "list_sessions", app_name="no-app", user_id=user)
        assert got.model_dump() == expected.model_dump() == {"sessions": []}
    for user in (USER, "user-2", "nobody"):
        got, expected = await both(*services, "get_user_state", app_name=APP, user_id=user)
        assert got == expected

    await both(*services, "delete_session", app_name=APP, user_id=USER, session_id="s1 ")
    await both(*services, "delete_session", app_name=APP, user_id=USER, session_id="s1")
    got, expected = await both(
        *services, "get_session", app_name=APP, user_id=USER, session_id="s1"
    )
    assert got is None
    assert expected is None
    got, expected = await both(*services, "list_sessions", app_name=APP)
    assert got.model_dump() == expected.model_dump()
    assert [s.id for s in got.sessions] == ["s2", "s3"]
    # App and user state outlive the sessions that set them.
    assert got.sessions[0].state["app:theme"] == "dark"
    assert await services[0].get_user_state(app_name=APP, user_id=USER) == {"name": "Ada"}


async def test_events_and_state_deltas_like_in_memory(services, clock):
    pair = await create_both(services, app_name=APP, user_id=USER, session_id="s", state={"a": 0})
    other = await create_both(services, app_name=APP, user_id=USER, session_id="t")
    deltas: list[dict[str, Any]] = [
        {},
        {"a": 1, "temp:draft": "x", "app:count": 1, "user:seen": True},
        {"nested": {"k": [1, 2, {"deep": None}]}, "none": None},
        {"a": 2, "app:count": 2, "temp:draft": "y"},
    ]
    for i, delta in enumerate(deltas):
        author = "user" if i % 2 == 0 else "assistant"
        await append_both(
            pair, services, text_event(f"m{i}", author=author, ts=clock.tick(), **delta)
        )
    # The in-memory values hold temp: keys for the invocation; the stored ones never do.
    assert pair[0].state["temp:draft"] == "y"
    await append_both(other, services, text_event("x", ts=clock.tick(), **{"user:seen": False}))

    for sid in ("s", "t"):
        got, expected = await both(
            *services, "get_session", app_name=APP, user_id=USER, session_id=sid
        )
        assert dump(got) == dump(expected)
        assert got is not None
        assert "temp:draft" not in got.state
        assert got.state["user:seen"] is False  # user state is shared by the user's sessions
    assert [e.content.parts[0].text for e in got.events] == ["x"]
    got, expected = await both(*services, "list_sessions", app_name=APP, user_id=USER)
    assert got.model_dump() == expected.model_dump()
    assert [s.id for s in got.sessions] == ["s", "t"]


async def test_an_event_and_its_session_state_are_stored_together(store, clock, monkeypatch):
    """A failure while the session's state is stored leaves the event unstored too."""
    service = HiststoreSessionService(store)
    session = await service.create_session(app_name=APP, user_id=USER, state={"a": 0})
    await service.append_event(session, text_event("kept", ts=clock.tick(), a=1))
    faults = Faults(monkeypatch)
    faults.fail_insert_into = "histstore_metadata"
    with pytest.raises(HistStoreError):
        await service.append_event(session, text_event("lost", ts=clock.tick(), a=2))
    faults.fail_insert_into = None
    stored = await service.get_session(app_name=APP, user_id=USER, session_id=session.id)
    assert stored is not None
    assert [e.content.parts[0].text for e in stored.events] == ["kept"]
    assert stored.state == {"a": 1}


async def test_get_session_config_like_in_memory(services, clock):
    pair = await create_both(services, app_name=APP, user_id=USER, session_id="s")
    # Timestamps rise, repeat, and once go back: ADK's rule (walk back from the newest
    # event, stop at the first older one) is followed exactly, not a plain filter.
    stamps = [clock.now + t for t in [1, 2, 2, 3, 5, 4, 6, 7, 7, 7, 8, *range(9, 80)]]
    for i, ts in enumerate(stamps):
        await append_both(pair, services, text_event(f"e{i}", ts=ts))
    afters: list[float | None] = [None, clock.now, clock.now + 2, clock.now + 4.5]
    afters += [clock.now + 7, clock.now + 40, clock.now + 79, clock.now + 100]
    for recent, after in itertools.product([None, 0, 1, 3, 20, 81, 500], afters):
        config = GetSessionConfig(num_recent_events=recent, after_timestamp=after)
        got, expected = await both(
            *services, "get_session", app_name=APP, user_id=USER, session_id="s", config=config
        )
        assert dump(got) == dump(expected), (recent, after)


async def test_equal_event_delivered_twice_is_stored_once(services, clock):
    pair = await create_both(services, app_name=APP, user_id=USER, session_id="s")
    event = text_event("once", ts=clock.tick(), counter=1)
    await append_both(pair, services, event)
    await append_both(pair, services, event)  # the same event again: a no-op on both
    same_id = text_event("twice", ts=clock.tick())
    same_id.id = event.id  # a different event that shares the id is kept, as ADK keeps it
    await append_both(pair, services, same_id)
    got, expected = await both(*services, "get_session", app_name=APP, user_id=USER, session_id="s")
    assert dump(got) == dump(expected)
    assert got is not None
    assert len(got.events) == 2


async def test_partial_events_are_returned_not_stored(services, clock):
    pair = await create_both(services, app_name=APP, user_id=USER, session_id="s")
    partial = text_event("stream", ts=clock.tick(), k=1)
    partial.partial = True
    await append_both(pair, services, partial)
    got = await services[0].get_session(app_name=APP, user_id=USER, session_id="s")
    assert got is not None
    assert got.events == []
    assert "k" not in got.state


async def test_errors_like_in_memory(services, clock, store):
    await create_both(services, app_name=APP, user_id=USER, session_id="s")
    for service in services:
        with pytest.raises(AlreadyExistsError):
            await service.create_session(app_name=APP, user_id=USER, session_id=" s")
    ghost = Session(app_name=APP, user_id=USER, id="ghost")
    for service in services:
        with pytest.raises(SessionNotFoundError):
            await service.append_event(copy.deepcopy(ghost), text_event("x", ts=clock.tick()))
    assert not await store.exists("adk-session/weather-app/user-1/ghost")

    # A session deleted under a value someone still holds.
    pair = await create_both(services, app_name=APP, user_id=USER, session_id="gone")
    await both(*services, "delete_session", app_name=APP, user_id=USER, session_id="gone")
    for service, value in zip(services, pair, strict=True):
        with pytest.raises(SessionNotFoundError):
            await service.append_event(value, text_event("x", ts=clock.tick()))
    # ... and one that already held events (its append would no longer start at 0).
    pair = await create_both(services, app_name=APP, user_id=USER, session_id="gone2")
    held = [
        await s.append_event(v, text_event("a", ts=clock.tick()))
        for s, v in zip(services, pair, strict=True)
    ]
    assert held
    await both(*services, "delete_session", app_name=APP, user_id=USER, session_id="gone2")
    for service, value in zip(services, pair, strict=True):
        with pytest.raises(SessionNotFoundError):
            await service.append_event(value, text_event("y", ts=clock.tick()))
    assert not await store.exists("adk-session/weather-app/user-1/gone2")
    with pytest.raises(ValueError, match="num_recent_events"):
        GetSessionConfig(num_recent_events=-1)


async def test_generated_session_ids_are_unique(services):
    ours = services[0]
    a = await ours.create_session(app_name=APP, user_id=USER)
    b = await ours.create_session(app_name=APP, user_id=USER, session_id="   ")
    assert a.id != b.id
    assert uuid.UUID(a.id)
    assert uuid.UUID(b.id)
    listed = await ours.list_sessions(app_name=APP, user_id=USER)
    assert {s.id for s in listed.sessions} == {a.id, b.id}


ODD_KEYS = [
    "plain",
    "with space",
    " edge ",
    "pct%41",
    "tab\there",
    "nul\x00",
    "ünïcödé 👋",
    "k" * 300,
    "a:b:c",
    "",
]


async def test_any_state_key_and_json_value_round_trips(services, clock):
    state: dict[str, Any] = {key: {"value": i, "key": key} for i, key in enumerate(ODD_KEYS)}
    state.update({"user:" + key: [key] for key in ODD_KEYS})
    state.update({"app:" + key: None for key in ODD_KEYS})
    state["big"] = 1.7976931348623157e308
    pair = await create_both(
        services, app_name="app/with:odd %chars", user_id=" u ", session_id="s", state=state
    )
    await append_both(
        pair, services, text_event("x", ts=clock.tick(), **{"user:" + ODD_KEYS[3]: 9})
    )
    got, expected = await both(
        *services, "get_session", app_name="app/with:odd %chars", user_id=" u ", session_id="s"
    )
    assert dump(got) == dump(expected)
    assert got is not None
    assert got.state["app:"] is None


async def test_long_ids_and_lookalike_ids_stay_apart(services, clock):
    long_app, long_user, long_sid = "a" * 200, "u" * 200, "s" * 200
    pair = await create_both(
        services, app_name=long_app, user_id=long_user, session_id=long_sid, state={"k": 1}
    )
    await append_both(pair, services, text_event("x", ts=clock.tick()))
    # "a/b" + "c" and "a" + "b/c" must be different sessions.
    await create_both(services, app_name="a/b", user_id="c", session_id="d", state={"k": "abc"})
    await create_both(services, app_name="a", user_id="b/c", session_id="d", state={"k": "bcd"})
    for app, user, sid in [(long_app, long_user, long_sid), ("a/b", "c", "d"), ("a", "b/c", "d")]:
        got, expected = await both(
            *services, "get_session", app_name=app, user_id=user, session_id=sid
        )
        assert dump(got) == dump(expected)


async def test_values_without_a_json_form_raise_a_typed_error(store, clock):
    service = HiststoreSessionService(store)
    with pytest.raises(InvalidMessage):
        await service.create_session(app_name=APP, user_id=USER, state={"f": object()})
    with pytest.raises(InvalidMessage):
        await service.create_session(app_name=APP, user_id=USER, state={"user:x": float("nan")})
    assert await store.conversations() == []
    session = await service.create_session(app_name=APP, user_id=USER, session_id="s")
    with pytest.raises(InvalidMessage):
        await service.append_event(session, text_event("x", ts=clock.tick(), bad=float("inf")))
    got = await service.get_session(app_name=APP, user_id=USER, session_id="s")
    assert got is not None
    assert got.events == []
    # Rich values get their JSON form, as ADK's database service stores them.
    event = text_event("y", ts=clock.tick(), when=(1, 2), ids={3})
    await service.append_event(got, event)
    again = await service.get_session(app_name=APP, user_id=USER, session_id="s")
    assert again is not None
    assert again.state == {"when": [1, 2], "ids": [3]}


# ---------------------------------------------------------------- persistence and concurrency


async def test_stale_session_value_raises_like_adks_database_service(store, clock, tmp_path):
    adk_db = DatabaseSessionService(f"sqlite+aiosqlite:///{tmp_path / 'adk.db'}")
    try:
        for service in (HiststoreSessionService(store), adk_db):
            created = await service.create_session(app_name=APP, user_id=USER, session_id="s")
            loaded = await service.get_session(app_name=APP, user_id=USER, session_id="s")
            assert loaded is not None
            await service.append_event(loaded, text_event("first", ts=clock.tick()))
            with pytest.raises(StaleSessionError):
                await service.append_event(created, text_event("stale", ts=clock.tick()))
            await service.append_event(loaded, text_event("second", ts=clock.tick()))
            final = await service.get_session(app_name=APP, user_id=USER, session_id="s")
            assert final is not None
            assert [e.content.parts[0].text for e in final.events] == ["first", "second"]
    finally:
        await adk_db.close()


async def test_listed_session_values_can_append_unless_stale(store, clock):
    service = HiststoreSessionService(store)
    await service.create_session(app_name=APP, user_id=USER, session_id="s")
    [listed] = (await service.list_sessions(app_name=APP, user_id=USER)).sessions
    await service.append_event(listed, text_event("one", ts=clock.tick()))
    await service.append_event(listed, text_event("two", ts=clock.tick()))
    [again] = (await service.list_sessions(app_name=APP, user_id=USER)).sessions
    loaded = await service.get_session(app_name=APP, user_id=USER, session_id="s")
    assert loaded is not None
    await service.append_event(loaded, text_event("three", ts=clock.tick()))
    with pytest.raises(StaleSessionError):
        await service.append_event(again, text_event("late", ts=clock.tick()))
    final = await service.get_session(app_name=APP, user_id=USER, session_id="s")
    assert final is not None
    assert [e.content.parts[0].text for e in final.events] == [
        "one",
        "two",
        "three",
    ]


async def test_concurrent_appends_to_one_session_value_are_serialized(store, clock):
    service = HiststoreSessionService(store)
    session = await service.create_session(app_name=APP, user_id=USER, session_id="s")
    events = [text_event(f"e{i}", ts=clock.tick(), **{f"k{i}": i}) for i in range(20)]
    await asyncio.gather(*(service.append_event(session, e) for e in events))
    stored = await service.get_session(app_name=APP, user_id=USER, session_id="s")
    assert stored is not None
    assert sorted(e.id for e in stored.events) == sorted(e.id for e in events)
    assert stored.state == {f"k{i}": i for i in range(20)}
    assert [e.id for e in stored.events] == [e.id for e in session.events]


async def test_concurrent_state_updates_from_many_sessions_never_lose_a_key(shared_backend, clock):
    async with shared_backend.connect() as a, shared_backend.connect() as b:
        services = [HiststoreSessionService(a), HiststoreSessionService(b)]
        sessions = [
            await services[i % 2].create_session(app_name=APP, user_id=USER, session_id=f"s{i}")
            for i in range(16)
        ]

        async def bump(i: int) -> None:
            delta = {f"user:k{i}": i, f"app:k{i}": -i, "user:shared": i}
            await services[i % 2].append_event(sessions[i], text_event("x", ts=clock.now, **delta))

        await asyncio.gather(*(bump(i) for i in range(16)))
        user_state = await services[0].get_user_state(app_name=APP, user_id=USER)
        assert {k: v for k, v in user_state.items() if k != "shared"} == {
            f"k{i}": i for i in range(16)
        }
        assert user_state["shared"] in range(16)
        one = await services[1].get_session(app_name=APP, user_id=USER, session_id="s3")
        assert one is not None
        assert {k for k in one.state if k.startswith("app:")} == {f"app:k{i}" for i in range(16)}


async def test_recent_events_read_only_what_they_return(store, clock, monkeypatch):
    service = HiststoreSessionService(store)
    session = await service.create_session(app_name=APP, user_id=USER, session_id="s")
    conversation = "adk-session/weather-app/user-1/s"
    events = [text_event(f"e{i}", ts=clock.now + i) for i in range(600)]
    from histstore.integrations.adk import _event_record

    await store.write(conversation, [_event_record(e) for e in events])
    read = store.read
    seen: list[int] = []

    async def spy(*args: Any, **kwargs: Any) -> Any:
        got = await read(*args, **kwargs)
        seen.append(len(got))
        return got

    monkeypatch.setattr(store, "read", spy)
    for config, expected, most in [
        (GetSessionConfig(num_recent_events=20), 20, 20),
        (GetSessionConfig(after_timestamp=clock.now + 590), 10, 32),
        (GetSessionConfig(after_timestamp=clock.now + 500), 100, 32 + 64 + 128),
        (GetSessionConfig(num_recent_events=5, after_timestamp=clock.now), 5, 5),
    ]:
        seen.clear()
        got = await service.get_session(app_name=APP, user_id=USER, session_id="s", config=config)
        assert got is not None
        assert len(got.events) == expected
        assert sum(seen) <= most, config
    assert session.events == []


def model_call(name: str, call_id: str, **args: Any) -> LlmResponse:
    call = types.FunctionCall(name=name, args=args, id=call_id)
    return LlmResponse(content=types.Content(role="model", parts=[types.Part(function_call=call)]))


def get_weather(city: str, tool_context: ToolContext) -> dict[str, str]:
    """The weather in a city; remembers the last city asked about for the user."""
    tool_context.state["user:last_city"] = city
    tool_context.state["temp:calls"] = tool_context.state.get("temp:calls", 0) + 1
    return {"city": city, "sky": "sunny"}


async def run_turn(runner: Runner, session_id: str, text: str) -> list[Event]:
    message = types.Content(role="user", parts=[types.Part(text=text)])
    return [
        event
        async for event in runner.run_async(
            user_id=USER, session_id=session_id, new_message=message
        )
    ]


async def test_runner_turns_with_a_tool_resume_on_a_new_service(shared_backend):
    model = ScriptedModel()
    agent = LlmAgent(name="forecaster", model=model, tools=[get_weather], output_key="last_answer")
    model.script += [
        model_call("get_weather", "call-1", city="Paris"),
        model_text("Sunny in Paris."),
        model_text("You asked about Paris."),
    ]
    async with HiststoreSessionService(shared_backend.url) as first:
        runner = Runner(agent=agent, app_name=APP, session_service=first)
        session = await first.create_session(app_name=APP, user_id=USER, state={"app:units": "C"})
        await run_turn(runner, session.id, "Weather in Paris?")
        await run_turn(runner, session.id, "Which city did I ask about?")
        before = await first.get_session(app_name=APP, user_id=USER, session_id=session.id)
    assert before is not None
    kinds = [
        "call" if p.function_call else "result" if p.function_response else e.author
        for e in before.events
        for p in (e.content.parts if e.content and e.content.parts else [])
    ]
    assert kinds == ["user", "call", "result", "forecaster", "user", "forecaster"]
    assert before.state["user:last_city"] == "Paris"
    assert before.state["last_answer"] == "You asked about Paris."
    assert before.state["app:units"] == "C"
    assert not any(k.startswith("temp:") for k in before.state)

    # A new service on the same database (a restarted process) resumes the session.
    model.script.append(model_text("Still Paris."))
    async with shared_backend.connect() as store:
        second = HiststoreSessionService(store)
        resumed = await second.get_session(app_name=APP, user_id=USER, session_id=session.id)
        assert dump(resumed) == dump(before)
        runner = Runner(agent=agent, app_name=APP, session_service=second)
        await run_turn(runner, session.id, "And now?")
        after = await second.get_session(app_name=APP, user_id=USER, session_id=session.id)
        assert await second.get_user_state(app_name=APP, user_id=USER) == {"last_city": "Paris"}
    assert after is not None
    assert [e.id for e in after.events[: len(before.events)]] == [e.id for e in before.events]
    assert after.state["last_answer"] == "Still Paris."
    # The model saw the whole history, the tool call and its result included.
    last_request = model.seen[-1]
    assert [c.role for c in last_request] == [
        "user",
        "model",
        "user",
        "model",
        "user",
        "model",
        "user",
    ]
    assert last_request[2].parts[0].function_response.response == {"city": "Paris", "sky": "sunny"}


async def test_runner_events_match_in_memory_run(store, clock):
    """The same scripted run on both services stores the same session."""
    results = []
    for service in (HiststoreSessionService(store), InMemorySessionService()):
        model = ScriptedModel()
        model.script += [model_call("get_weather", "c1", city="Oslo"), model_text("Rain.")]
        agent = LlmAgent(name="forecaster", model=model, tools=[get_weather], output_key="out")
        runner = Runner(agent=agent, app_name=APP, session_service=service)
        await service.create_session(app_name=APP, user_id=USER, session_id="s")
        await run_turn(runner, "s", "Weather in Oslo?")
        session = await service.get_session(app_name=APP, user_id=USER, session_id="s")
        assert session is not None
        results.append(session)
    ours, theirs = results
    strip = {"id", "invocation_id", "timestamp"}
    assert [e.model_dump(exclude=strip) for e in ours.events] == [
        e.model_dump(exclude=strip) for e in theirs.events
    ]
    assert ours.state == theirs.state


# ---------------------------------------------------------------- owning a store


async def test_owned_store_opens_lazily_and_closes(shared_backend, tmp_path, clock):
    async with HiststoreSessionService(shared_backend.url) as service:
        await service.create_session(app_name=APP, user_id=USER, session_id="s")
    with pytest.raises(HistStoreError):
        await service.get_session(app_name=APP, user_id=USER, session_id="s")
    async with HiststoreSessionService(shared_backend.url) as again:
        assert await again.get_session(app_name=APP, user_id=USER, session_id="s") is not None
    unused = HiststoreSessionService(tmp_path / "never.db")
    await unused.close()
    assert not (tmp_path / "never.db").exists()


async def test_borrowed_store_stays_open(store):
    async with HiststoreSessionService(store) as service:
        await service.create_session(app_name=APP, user_id=USER, session_id="s")
    assert await store.exists("adk-session/weather-app/user-1/s")


def test_bad_store_arguments_fail_at_construction():
    with pytest.raises(TypeError):
        HiststoreSessionService(42)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="sqlite and postgresql"):
        HiststoreSessionService("mysql://u@h/db")


def test_import_without_adk_names_the_extra():
    code = "import sys; sys.modules['google.adk'] = None\nimport histstore.integrations.adk\n"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode != 0
    assert "ImportError" in proc.stderr
    assert "pip install 'histstore[adk]'" in proc.stderr


def test_benchmark_quick_run_prints_its_table(tmp_path):
    bench = REPO / "bench" / "adk.py"
    out = tmp_path / "adk.json"
    proc = subprocess.run(
        [sys.executable, str(bench), "--quick", "--backend", "sqlite", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = [line for line in proc.stdout.splitlines() if line.startswith("sqlite")]
    assert len(rows) == 4
    assert sum("histstore" in row for row in rows) == 2
    assert sum("DatabaseSessionService" in row for row in rows) == 2
    assert set(json.loads(out.read_text())["results"]["sqlite"]) == {
        "histstore",
        "adk DatabaseSessionService",
    }


async def test_sessions_are_owned_by_their_user(store, clock):
    """A session belongs to its ``user_id``: a view scoped to that user (and a service
    on it) finds it, another user's does not; an id no owner may be stays unowned."""
    sessions = HiststoreSessionService(store)
    for user, sid in (("alice", "a1"), ("alice", "a2"), ("bob", "b1"), ("x" * 300, "long")):
        await sessions.create_session(app_name=APP, user_id=user, session_id=sid)
    alice = HiststoreSessionService(store.scoped("alice"))
    assert sorted(s.id for s in (await alice.list_sessions(app_name=APP)).sessions) == [
        "a1",
        "a2",
    ]
    assert await alice.get_session(app_name=APP, user_id="bob", session_id="b1") is None
    session = await alice.get_session(app_name=APP, user_id="alice", session_id="a1")
    assert session is not None
    event = Event(
        author="user",
        invocation_id="i1",
        content=types.Content(role="user", parts=[types.Part(text="hello")]),
    )
    await alice.append_event(session, event)
    assert [h.position for h in await store.scoped("alice").search("hello")] == [0]
    assert await store.scoped("bob").search("hello") == []
    assert len(await store.scoped("bob").conversations()) == 1
    everyone = await sessions.list_sessions(app_name=APP)
    assert sorted(s.id for s in everyone.sessions) == ["a1", "a2", "b1", "long"]
    with pytest.raises(AlreadyExistsError):  # taken, whoever asks
        await HiststoreSessionService(store.scoped("bob")).create_session(
            app_name=APP, user_id="alice", session_id="a1"
        )


async def test_ls_user_lists_a_users_sessions(backend, clock):
    from cli_runner import run

    if not backend.shared:
        pytest.skip("a command cannot reach another process's in-memory database")
    async with backend.connect() as store:
        sessions = HiststoreSessionService(store)
        await sessions.create_session(app_name=APP, user_id="alice", session_id="a1")
        await sessions.create_session(app_name=APP, user_id="bob", session_id="b1")
    pooled = ("--pooler", "transaction") if backend.options.get("pooler") else ()
    result = await run("ls", "--url", backend.url, *pooled, "--user", "alice", "-q")
    assert (result.code, result.out.split()) == (0, [f"adk-session/{APP}/alice/a1"])
