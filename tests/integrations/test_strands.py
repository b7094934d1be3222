"""The Strands Agents ``SessionRepository`` (SPEC 15), driven by Strands' own ``Agent``,
``RepositorySessionManager`` and ``Graph`` with a scripted model, on every backend.

Strands calls the repository synchronously; with a borrowed ``Store`` the agent runs in
a worker thread (``asyncio.to_thread``), as the repository documents."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import psycopg
import pytest
from cli_runner import ok
from helpers import PG_ADMIN_URL
from sqlalchemy import make_url
from strands import Agent, tool
from strands.multiagent import GraphBuilder
from strands.session import RepositorySessionManager
from strands.types.exceptions import SessionException
from strands.types.session import Session, SessionAgent, SessionMessage, SessionType
from strands_models import ScriptedModel, redact_input, say, use_tool
from waiting import settled_now

import histstore
from histstore import Message, Store, compact, indexed_text
from histstore.integrations.strands import (
    REDACTION_AUTHOR,
    HiststoreSessionManager,
    HiststoreSessionRepository,
)

T = TypeVar("T")
AGENT = "forecaster"


def conversation(session_id: str, agent_id: str = AGENT) -> str:
    return f"strands-agent/{session_id}/{agent_id}"


@tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    return f"drizzle over {city}"


def forecaster(model: ScriptedModel, manager: Any) -> Agent:
    return Agent(
        model=model,
        tools=[get_weather],
        session_manager=manager,
        agent_id=AGENT,
        callback_handler=None,
    )


async def in_thread(fn: Callable[[], T]) -> T:
    """Run Strands' sync calls off the store's loop (a borrowed store's loop serves them)."""
    return await asyncio.to_thread(fn)


def weather_turns(model: ScriptedModel, repository: Any, sid: str, cities: list[str]) -> Agent:
    """An agent with one tool-using turn per city in session ``sid``."""
    for i, city in enumerate(cities):
        model.script += [use_tool("get_weather", f"{sid}-{i}", city=city), say(f"Rain in {city}.")]
    agent = forecaster(model, RepositorySessionManager(sid, repository))
    for city in cities:
        agent(f"Weather in {city}?")
    return agent


# ---------------------------------------------------------------- the agent's own runner


async def test_agent_turns_with_a_tool_are_stored_and_resume(store: Store, cid: str) -> None:
    repository = HiststoreSessionRepository(store)
    model = ScriptedModel()

    def first() -> Agent:
        agent = weather_turns(model, repository, cid, ["Lima"])
        agent.state.set("units", {"temp": "C", "seen": [1, None]})
        model.script.append(say("You're welcome."))
        agent("Thanks!")
        return agent

    before = await in_thread(first)
    stored = await store.read(conversation(cid))
    assert [m.role for m in stored] == [
        "user",
        "assistant",
        "tool",
        "assistant",
        "user",
        "assistant",
    ]
    assert {m.to_dict()["type"] for m in stored} == {"strands_message"}
    assert [m.to_dict()["session_message"]["message_id"] for m in stored] == list(range(6))
    assert indexed_text(stored[1]) == "Lima"  # the call's arguments, not the tool's name
    assert [h.position for h in await store.search("drizzle", conversation=conversation(cid))] == [
        2
    ]
    metadata = await store.metadata(conversation(cid))
    assert metadata["strands:state"] == {"units": {"temp": "C", "seen": [1, None]}}
    assert metadata["strands:kind"] == "agent"

    # A new process: a new repository on the same database restores the agent exactly.
    again = HiststoreSessionRepository(store)
    model.script.append(say("Still raining."))

    def second() -> Agent:
        agent = forecaster(model, RepositorySessionManager(cid, again))
        restored = [dict(m) for m in agent.messages]
        assert restored == [dict(m) for m in before.messages]
        assert agent.state.get("units") == {"temp": "C", "seen": [1, None]}
        agent("And now?")
        return agent

    after = await in_thread(second)
    assert len(after.messages) == 8
    assert model.seen[-1][2]["content"][0]["toolResult"]["content"] == [
        {"text": "drizzle over Lima"}
    ]
    assert await store.count(conversation(cid)) == 8


async def test_redaction_is_an_edit_the_log_can_undo(store: Store, cid: str) -> None:
    repository = HiststoreSessionRepository(store)
    model = ScriptedModel(say("Hello."), redact_input("[input redacted]", "I cannot help."))

    def run() -> Agent:
        agent = forecaster(model, RepositorySessionManager(cid, repository))
        agent("Hi")
        agent("my card is 4111 1111")
        return agent

    agent = await in_thread(run)
    assert agent.messages[2]["content"] == [{"text": "[input redacted]"}]
    c = conversation(cid)
    stored = await store.read(c)
    assert indexed_text(stored[2]) == "[input redacted]"
    assert stored[2].author == REDACTION_AUTHOR
    assert await store.search("4111", conversation=c) == []
    changes = await store.changes(c)
    redaction = changes[-2]  # the redaction, then the model's answer
    assert (redaction.kind, redaction.author) == ("splice", REDACTION_AUTHOR)
    # The message as it was is in the log: reverting to before the redaction restores it.
    await store.revert(c, redaction.revision - 1, by="test:undo")
    restored = await store.read(c)
    assert indexed_text(restored[2]) == "my card is 4111 1111"
    assert [h.position for h in await store.search("4111", conversation=c)] == [2]
    assert restored[2].entry_id == stored[2].entry_id


def run_graph(cid: str, repository: HiststoreSessionRepository, tag: str) -> dict[str, Any] | None:
    """Run a two-node ``Graph`` persisted in session ``cid``; its stored state after."""
    builder = GraphBuilder()
    for node, said in (("research", f"notes {tag}"), ("write", f"report {tag}")):
        builder.add_node(Agent(model=ScriptedModel(say(said)), callback_handler=None), node)
    builder.add_edge("research", "write")
    builder.set_max_node_executions(4)
    builder.set_session_manager(RepositorySessionManager(cid, repository))
    graph = builder.build()
    result = graph("Write about rain")
    assert result.status.value == "completed"
    return repository.read_multi_agent(cid, graph.id)


async def test_graph_state_is_stored_read_back_and_updated(store: Store, cid: str) -> None:
    first, second = HiststoreSessionRepository(store), HiststoreSessionRepository(store)
    state = await in_thread(lambda: run_graph(cid, first, "one"))
    assert state is not None
    assert state["status"] == "completed"
    assert state["execution_order"] == ["research", "write"]
    [found] = await store.conversations(metadata={"strands:kind": "multi_agent"})
    assert found == f"strands-multi-agent/{cid}/default_graph"
    assert "report one" in json.dumps(state["node_results"])
    # Another process: Strands reads the stored state (a finished run starts over) and
    # updates it as the new run goes.
    again = await in_thread(lambda: run_graph(cid, second, "two"))
    assert again is not None
    assert "report two" in json.dumps(again["node_results"])
    assert "report one" not in json.dumps(again["node_results"])


# ---------------------------------------------------------------- the repository's contract


def text_message(text: str, i: int, role: str = "user") -> SessionMessage:
    return SessionMessage({"role": role, "content": [{"text": text}]}, i)  # type: ignore[typeddict-item]


async def test_repository_calls_like_the_file_repository(store: Store, cid: str) -> None:
    repository = HiststoreSessionRepository(store)

    def run() -> None:
        assert repository.read_session(cid) is None
        session = Session(session_id=cid, session_type=SessionType.AGENT)
        repository.create_session(session)
        with pytest.raises(SessionException, match="already exists"):
            repository.create_session(session)
        assert repository.read_session(cid) == session

        assert repository.read_agent(cid, "a") is None
        with pytest.raises(SessionException, match="does not exist"):
            repository.update_agent(cid, SessionAgent("a", {}, {}))
        created = SessionAgent("a", {"n": 1}, {"removed_message_count": 0})
        repository.create_agent(cid, created)
        assert repository.read_agent(cid, "a") == created
        update = SessionAgent("a", {"n": 2}, {"removed_message_count": 0})
        repository.update_agent(cid, update)
        read = repository.read_agent(cid, "a")
        assert read is not None
        assert read.state == {"n": 2}
        assert read.created_at == created.created_at

        image = {"image": {"format": "png", "source": {"bytes": b"\x89PNG\x00\xff"}}}
        first = SessionMessage({"role": "user", "content": [{"text": "look"}, image]}, 0)  # type: ignore[list-item]
        repository.create_message(cid, "a", first)
        repository.create_message(cid, "a", first)  # the same message again: confirmed
        assert repository.read_message(cid, "a", 0) == first  # bytes come back as bytes
        with pytest.raises(SessionException):
            repository.create_message(cid, "a", text_message("other", 0))
        with pytest.raises(SessionException):
            repository.create_message(cid, "a", text_message("gap", 2))
        for i in range(1, 6):
            repository.create_message(cid, "a", text_message(f"m{i}", i, "assistant"))
        assert repository.read_message(cid, "a", 6) is None
        page = repository.list_messages(cid, "a", limit=2, offset=3)
        assert [(m.message_id, m.message["content"][0]["text"]) for m in page] == [
            (3, "m3"),
            (4, "m4"),
        ]
        assert len(repository.list_messages(cid, "a", offset=1)) == 5
        with pytest.raises(SessionException, match="does not exist"):
            repository.list_messages(cid, "nobody")
        with pytest.raises(SessionException, match="does not exist"):
            repository.update_message(cid, "a", text_message("x", 9))

        with pytest.raises(SessionException, match="does not exist"):
            repository.update_multi_agent(cid, _FakeMultiAgent({"step": 0}))
        repository.create_multi_agent(cid, _FakeMultiAgent({"step": 1}))
        repository.update_multi_agent(cid, _FakeMultiAgent({"step": 2, "data": (1, 2)}))
        assert repository.read_multi_agent(cid, "team") == {"step": 2, "data": [1, 2]}
        assert repository.read_multi_agent(cid, "other") is None

        repository.delete_session(cid)
        assert repository.read_session(cid) is None
        assert repository.read_agent(cid, "a") is None
        assert repository.read_multi_agent(cid, "team") is None
        with pytest.raises(SessionException, match="does not exist"):
            repository.delete_session(cid)

    await in_thread(run)
    assert await store.conversations() == []


class _FakeMultiAgent:
    """What the repository reads of a multi-agent: its id and serialized state."""

    id = "team"

    def __init__(self, state: dict[str, Any]) -> None:
        self.state = state

    def serialize_state(self) -> dict[str, Any]:
        return self.state


async def test_values_without_a_json_form_raise_a_typed_error(store: Store, cid: str) -> None:
    repository = HiststoreSessionRepository(store)
    bad = SessionMessage({"role": "user", "content": [{"text": "x", "when": object()}]}, 0)  # type: ignore[typeddict-unknown-key]
    with pytest.raises(histstore.InvalidMessage):
        await in_thread(lambda: repository.create_message(cid, "a", bad))
    assert not await store.exists(conversation(cid, "a"))


async def test_list_messages_reads_only_what_it_returns(
    store: Store, cid: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    c = conversation(cid, "a")
    from histstore.integrations._strands_records import message_record

    await store.write(c, [message_record(text_message(f"m{i}", i)) for i in range(600)])
    read = store.read
    seen: list[int] = []

    async def spy(*args: Any, **kwargs: Any) -> Any:
        got = await read(*args, **kwargs)
        seen.append(len(got))
        return got

    monkeypatch.setattr(store, "read", spy)
    repository = HiststoreSessionRepository(store)
    page = await in_thread(lambda: repository.list_messages(cid, "a", limit=10, offset=500))
    assert [m.message_id for m in page] == list(range(500, 510))
    assert seen == [10]
    assert (await in_thread(lambda: repository.read_message(cid, "a", 599))) is not None
    assert seen == [10, 1]


# ---------------------------------------------------------------- histstore's tools on it


async def test_compact_then_the_agent_keeps_going(store: Store, cid: str) -> None:
    repository = HiststoreSessionRepository(store)
    model = ScriptedModel()
    live = await in_thread(
        lambda: weather_turns(model, repository, cid, ["Accra", "Bamako", "Dakar"])
    )

    async def summarize(messages: list[Message]) -> str:
        return "Summary: " + "; ".join(t for t in map(indexed_text, messages) if t)

    assert await compact(store, conversation(cid), summarize, keep_turns=1) is not None
    assert await store.count(conversation(cid)) == 5  # the summary, the newest turn
    # The compaction moved the positions: the manager made before it conflicts.
    with pytest.raises(SessionException):
        await in_thread(lambda: live("Still there?"))
    assert await store.count(conversation(cid)) == 5  # nothing written
    model.script.append(say("Dry in Dakar now."))

    def resume() -> Agent:
        agent = forecaster(model, RepositorySessionManager(cid, repository))
        assert agent.messages[0]["content"][0]["text"].startswith("Summary: Weather in Accra?")
        agent("And now?")
        return agent

    agent = await in_thread(resume)
    assert model.seen[-1][0]["content"][0]["text"].startswith("Summary: ")
    assert await store.count(conversation(cid)) == len(agent.messages) == 7


async def test_show_search_and_copy_carry_the_session(shared_backend: Any, tmp_path: Path) -> None:
    sid = f"s-{uuid.uuid4().hex[:8]}"
    async with shared_backend.connect() as store:
        repository = HiststoreSessionRepository(store)
        await in_thread(lambda: weather_turns(ScriptedModel(), repository, sid, ["Windhoek"]))
    result = await ok("show", conversation(sid), "--url", shared_backend.url)
    rows = [line.split(maxsplit=3) for line in result.out.splitlines()]
    assert [(r[2], r[3]) for r in rows if len(r) == 4 and r[0].isdigit()] == [
        ("user", "Weather in Windhoek?"),
        ("assistant", f'-> get_weather(city="Windhoek")  [{sid}-0]'),
        ("tool", f"<- [{sid}-0] drizzle over Windhoek"),
        ("assistant", "Rain in Windhoek."),
    ]
    assert "strands_message" not in result.out
    found = await ok("search", "Windhoek", "--url", shared_backend.url)
    assert conversation(sid) in found.out
    target = tmp_path / "copy.db"
    await ok("copy", shared_backend.url, str(target))
    model = ScriptedModel(say("Copied."))
    with HiststoreSessionManager(sid, target) as manager:
        agent = forecaster(model, manager)
        assert [m["role"] for m in agent.messages] == ["user", "assistant", "user", "assistant"]
        agent("Still there?")
    assert len(model.seen[-1]) == 5


# ---------------------------------------------------------------- where it runs


async def test_an_owned_store_serves_sync_calls_inside_a_running_loop(shared_backend: Any) -> None:
    """Strands calls the repository from its own loop: ``invoke_async`` on this loop."""
    sid = f"s-{uuid.uuid4().hex[:8]}"
    model = ScriptedModel(say("One."), say("Two."))
    async with HiststoreSessionManager(sid, shared_backend.url) as manager:
        agent = forecaster(model, manager)
        await agent.invoke_async("first")
        agent("second")  # sync, from this loop's thread: Strands runs its own loop
    async with shared_backend.connect() as store:
        assert await store.count(conversation(sid)) == 4


async def test_a_borrowed_store_refuses_calls_on_its_own_loop(store: Store, cid: str) -> None:
    repository = HiststoreSessionRepository(store)
    with pytest.raises(RuntimeError, match="another thread"):
        repository.read_session(cid)
    assert await in_thread(lambda: repository.read_session(cid)) is None
    async with repository:
        pass
    assert not store.closed  # a borrowed store is never closed


def test_import_without_strands_names_the_extra() -> None:
    code = "import sys; sys.modules['strands'] = None\nimport histstore.integrations.strands\n"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode != 0
    assert "pip install 'histstore[strands]'" in proc.stderr


# ---------------------------------------------------------------- concurrency, resources


async def test_racing_writers_never_duplicate_a_message_nor_a_session(
    store: Store, cid: str
) -> None:
    """Processes sharing a session (several repositories, each its own thread)."""
    repositories = [HiststoreSessionRepository(store) for _ in range(6)]
    session = Session(session_id=cid, session_type=SessionType.AGENT)

    def create(repository: HiststoreSessionRepository) -> bool:
        try:
            repository.create_session(session)
        except SessionException:
            return False
        return True

    def append(i: int) -> bool:
        try:
            repositories[i].create_message(cid, "a", text_message(f"writer {i}", 0))
        except SessionException:
            return False
        return True

    same = text_message("the same", 1)
    created = await asyncio.gather(*(in_thread(lambda r=r: create(r)) for r in repositories))
    assert sorted(created) == [False] * 5 + [True]
    won = await asyncio.gather(*(in_thread(lambda i=i: append(i)) for i in range(6)))
    assert won.count(True) == 1
    await asyncio.gather(
        *(in_thread(lambda r=r: r.create_message(cid, "a", same)) for r in repositories)
    )
    stored = await store.read(conversation(cid, "a"))
    assert [indexed_text(m) for m in stored] == [f"writer {won.index(True)}", "the same"]


def _open_connections(backend: Any) -> tuple[int, int]:
    """Server sessions on the backend's database, and aiosqlite threads still running."""
    sqlite = sum("_connection_worker_thread" in t.name for t in threading.enumerate())
    if not backend.url.startswith("postgresql"):
        return 0, sqlite
    database = make_url(backend.url).database
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
            (database,),
        ).fetchone()
    assert row is not None
    return int(row[0]), sqlite


def _settled(backend: Any, expected: tuple[int, int]) -> tuple[int, int]:
    return settled_now(lambda: _open_connections(backend), expected)


def test_an_owned_repository_works_from_threads_and_loops_and_closes_clean(
    shared_backend: Any,
) -> None:
    before = _settled(shared_backend, _open_connections(shared_backend))
    repository = HiststoreSessionRepository(shared_backend.url)

    def create(i: int) -> None:
        repository.create_session(Session(session_id=f"t{i}", session_type=SessionType.AGENT))

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(create, range(8)))

    async def inside_a_loop() -> None:  # a framework's sync hook, called from its loop
        create(8)
        assert repository.read_session("t3") is not None
        repository.close()  # from a running loop too

    asyncio.run(inside_a_loop())
    assert _settled(shared_backend, before) == before
    assert not [t for t in threading.enumerate() if t.name == "histstore-strands"]
    with pytest.raises(histstore.HistStoreError):
        repository.read_session("t1")

    async def count() -> int:
        async with shared_backend.connect() as store:
            return len(await store.conversations(metadata={"strands:kind": "session"}))

    assert asyncio.run(count()) == 9


# ---------------------------------------------------------------- what is indexed and shown


def test_every_block_kind_has_its_role_text_and_show_lines() -> None:
    from histstore.cli._messages import message_lines
    from histstore.integrations._strands_records import message_record

    call = SessionMessage(
        {
            "role": "assistant",
            "content": [
                {"reasoningContent": {"reasoningText": {"text": "hidden plan"}}},
                {"text": "Checking."},
                {"toolUse": {"toolUseId": "t1", "name": "lookup", "input": {"q": "tides"}}},
            ],
        },
        0,
    )
    result = SessionMessage(
        {
            "role": "user",
            "content": [
                {
                    "toolResult": {
                        "toolUseId": "t1",
                        "status": "error",
                        "content": [{"text": "partial"}, {"json": {"height": 3.5, "unit": "m"}}],
                    }
                }
            ],
        },
        1,
    )
    guarded = SessionMessage(
        {"role": "user", "content": [{"guardContent": {"text": {"text": "checked words"}}}]}, 2
    )
    records = [message_record(m) for m in (call, result, guarded)]
    assert [r["role"] for r in records] == ["assistant", "tool", "user"]
    assert [indexed_text(r) for r in records] == [
        "Checking.\ntides",  # never the reasoning, the tool's name or ids
        "partial\n3.5\nm",
        "checked words",
    ]
    assert [message_lines(r) for r in records] == [
        ["(thinking) hidden plan", "Checking.", '-> lookup(q="tides")  [t1]'],
        ["<- [t1] partial", '{"height": 3.5, "unit": "m"}', "(error)"],
        ["checked words"],
    ]
    stored = [Message.from_dict(r) for r in records]
    histstore.turns.validate_pairing(stored)
    assert histstore.turns.status(stored[:1]) == "interrupted"
    assert histstore.turns.pending_tool_calls(stored[:1])[0]["name"] == "lookup"
    # A redaction: role and text are the redacted message's.
    redacted = SessionMessage(result.message, 1, redact_message=guarded.message)
    assert message_record(redacted)["role"] == "user"
    assert indexed_text(message_record(redacted)) == "checked words"


async def test_a_scoped_store_owns_the_session(store: Store, cid: str) -> None:
    ada = HiststoreSessionRepository(store.scoped("ada"))
    bob = HiststoreSessionRepository(store.scoped("bob"))
    model = ScriptedModel()
    await in_thread(lambda: weather_turns(model, ada, cid, ["Oslo"]))
    assert await in_thread(lambda: bob.read_session(cid)) is None
    assert await in_thread(lambda: bob.read_agent(cid, AGENT)) is None
    assert sorted(await store.conversations(user="ada")) == [
        conversation(cid),
        f"strands-session/{cid}",
    ]


async def test_a_redaction_overtaken_by_a_write_is_redone_on_what_it_left(
    store: Store, cid: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from histstore.integrations._strands_records import message_record

    repository = HiststoreSessionRepository(store)
    c = conversation(cid, "a")
    for i in range(2):
        await in_thread(lambda i=i: repository.create_message(cid, "a", text_message(f"m{i}", i)))
    commit = store.commit
    raced: list[int] = []

    async def overtaken(value: Any) -> int:
        if not raced:  # another writer appends between the edit's read and its commit
            raced.append(1)
            await store.write(c, [message_record(text_message("late", 2))], at=2)
        return await commit(value)

    monkeypatch.setattr(store, "commit", overtaken)
    redacted = SessionMessage(text_message("m1", 1).message, 1, text_message("[gone]", 1).message)
    await in_thread(lambda: repository.update_message(cid, "a", redacted))
    assert [indexed_text(m) for m in await store.read(c)] == ["m0", "[gone]", "late"]
    assert [ch.kind for ch in await store.changes(c)][-2:] == ["write", "splice"]


async def test_long_and_lookalike_ids_stay_apart(store: Store) -> None:
    repository = HiststoreSessionRepository(store)
    long_session = "s" * 300
    pairs = [(long_session, "a"), ("x/y", "z"), ("x", "y/z"), ("x%2Fy", "z")]

    def run() -> None:
        for i, (session_id, agent_id) in enumerate(pairs):
            repository.create_session(Session(session_id, SessionType.AGENT))
            repository.create_agent(session_id, SessionAgent(agent_id, {"i": i}, {}))
            repository.create_message(session_id, agent_id, text_message(f"pair {i}", 0))
        for i, (session_id, agent_id) in enumerate(pairs):
            agent = repository.read_agent(session_id, agent_id)
            assert agent is not None
            assert agent.state == {"i": i}
            [message] = repository.list_messages(session_id, agent_id)
            assert message.message["content"][0]["text"] == f"pair {i}"

    await in_thread(run)
    assert len(await store.conversations()) == 2 * len(pairs)


async def test_window_store_reads_the_newest_whole_turn(store: Store, cid: str) -> None:
    from histstore.window import WindowStore

    repository = HiststoreSessionRepository(store)
    await in_thread(lambda: weather_turns(ScriptedModel(), repository, cid, ["Cusco", "Puno"]))
    window = await WindowStore(store, max_messages=5).read(conversation(cid))
    assert [m.position for m in window] == [4, 5, 6, 7]  # question, call, result, answer
    assert histstore.turns.status(window) == "closed"
