"""HiststoreHistoryProvider: Microsoft Agent Framework agents on every backend."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

from agent_framework import (
    Agent,
    BaseChatClient,
    ChatResponse,
    Content,
    FunctionInvocationLayer,
    Message,
    tool,
)
from cli_runner import ok

import histstore
from histstore import Store, indexed_text
from histstore.integrations.agent_framework import HiststoreHistoryProvider
from histstore.window import WindowStore


class ScriptedClient(FunctionInvocationLayer[Any], BaseChatClient[Any]):
    """Calls ``get_weather`` with the user's text, then answers with the tool's result;
    records how many messages each model call was sent."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[list[Message]] = []

    async def _inner_get_response(  # type: ignore[override]
        self, *, messages: list[Message], stream: bool, options: Any, **kwargs: Any
    ) -> ChatResponse[Any]:
        self.seen.append(list(messages))
        last = messages[-1]
        if last.role == "tool":
            answer = f"Answer: {last.contents[0].result}"
            return ChatResponse(messages=[Message(role="assistant", contents=[answer])])
        call = Content.from_function_call(
            call_id=f"call-{uuid.uuid4().hex[:6]}",
            name="get_weather",
            arguments={"city": last.text},
        )
        return ChatResponse(messages=[Message(role="assistant", contents=[call])])


@tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    return f"sleet over {city}"


def agent_with(provider: HiststoreHistoryProvider) -> tuple[Agent[Any], ScriptedClient]:
    client = ScriptedClient()
    return Agent(client=client, context_providers=[provider], tools=[get_weather]), client


def dicts(messages: list[Message]) -> list[dict[str, Any]]:
    return [m.to_dict() for m in messages]


async def test_agent_runs_keep_their_history(store: Store, cid: str) -> None:
    provider = HiststoreHistoryProvider(store)
    agent, client = agent_with(provider)
    session = agent.create_session(session_id=cid)
    kept: list[Message] = []
    for city in ["Hobart", "Ushuaia"]:
        result = await agent.run(city, session=session)
        assert result.text == f"Answer: sleet over {city}"
        kept += [Message(role="user", contents=[city]), *result.messages]
    stored = await store.read(cid)
    assert [m.role for m in stored] == ["user", "assistant", "tool", "assistant"] * 2
    assert dicts(await provider.get_messages(cid)) == dicts(kept)
    # The second run's first model call was sent the first run and its question (the
    # framework marks loaded messages with their provider in additional_properties).
    sent = [(m.role, [c.to_dict() for c in m.contents]) for m in client.seen[2]]
    assert sent == [(m.role, [c.to_dict() for c in m.contents]) for m in kept[:5]]
    assert [indexed_text(m) for m in stored[1:3]] == ["Hobart", "sleet over Hobart"]
    assert histstore.turns.status(stored) == "closed"  # every call answered
    assert [h.position for h in await store.search("Ushuaia", conversation=cid)] == [4, 5, 6, 7]


async def test_the_switches_choose_what_is_loaded_and_stored(store: Store, cid: str) -> None:
    first = HiststoreHistoryProvider(store, store_outputs=False)
    agent, _client = agent_with(first)
    await agent.run("Nuuk", session=agent.create_session(session_id=cid))
    assert [m.role for m in await store.read(cid)] == ["user"]
    outputs_only = HiststoreHistoryProvider(store, store_inputs=False)
    agent, client = agent_with(outputs_only)
    await agent.run("Thule", session=agent.create_session(session_id=cid))
    assert [m.role for m in await store.read(cid)] == ["user", "assistant", "tool", "assistant"]
    assert [m.text for m in client.seen[0]] == ["Nuuk", "Thule"]
    blind = HiststoreHistoryProvider(store, load_messages=False)
    agent, client = agent_with(blind)
    await agent.run("Alert", session=agent.create_session(session_id=cid))
    assert len(client.seen[0]) == 1  # nothing loaded: the new question only
    assert await store.count(cid) == 8


async def test_an_owned_store_resumes_on_another_loop(shared_backend: Any, cid: str) -> None:
    async with HiststoreHistoryProvider(shared_backend.url) as provider:
        agent, _client = agent_with(provider)
        await agent.run("Oslo", session=agent.create_session(session_id=cid))
        before = dicts(await provider.get_messages(cid))
    async with shared_backend.connect() as store:
        again = HiststoreHistoryProvider(store)
        assert dicts(await again.get_messages(cid)) == before
        await again.clear(cid)
        assert await store.count(cid) == 0


async def test_show_search_export_and_copy(shared_backend: Any, tmp_path: Path) -> None:
    sid = f"maf-{uuid.uuid4().hex[:8]}"
    async with shared_backend.connect() as store:
        agent, _client = agent_with(HiststoreHistoryProvider(store))
        await agent.run("Windhoek", session=agent.create_session(session_id=sid))
        call_id = (await store.read(sid))[1].to_dict()["message"]["contents"][0]["call_id"]
    shown = await ok("show", sid, "--url", shared_backend.url)
    assert f'-> get_weather(city="Windhoek")  [{call_id}]' in shown.out
    assert f"<- [{call_id}] sleet over Windhoek" in shown.out
    assert "agent_framework" not in shown.out
    found = await ok("search", "sleet", "--url", shared_backend.url)
    assert sid in found.out
    async with shared_backend.connect() as store:
        before = dicts(await HiststoreHistoryProvider(store).get_messages(sid))
    dump = tmp_path / "dump.jsonl"
    await ok("export", sid, "--url", shared_backend.url, "-o", str(dump))
    imported, copied = str(tmp_path / "imported.db"), str(tmp_path / "copied.db")
    await ok("import", str(dump), "--url", imported)
    await ok("copy", shared_backend.url, copied)
    for target in (imported, copied):
        async with HiststoreHistoryProvider(target) as again:
            assert dicts(await again.get_messages(sid)) == before


async def test_compact_then_the_agent_keeps_going(store: Store, cid: str) -> None:
    provider = HiststoreHistoryProvider(store)
    agent, client = agent_with(provider)
    session = agent.create_session(session_id=cid)
    for city in ["Apia", "Suva", "Nadi"]:
        await agent.run(city, session=session)

    async def summarize(messages: list[histstore.Message]) -> str:
        return "Asked about " + ", ".join(t for t in map(indexed_text, messages) if t)

    await histstore.compact(store, cid, summarize, keep_turns=1)
    loaded = await provider.get_messages(cid)
    assert (loaded[0].role, loaded[0].text) == (
        "user",
        "Asked about Apia, Apia, sleet over Apia, Answer: sleet over Apia,"
        " Suva, Suva, sleet over Suva, Answer: sleet over Suva",
    )
    assert [m.text for m in loaded[1:2]] == ["Nadi"]
    client.seen.clear()
    result = await agent.run("Lautoka", session=session)
    assert result.text == "Answer: sleet over Lautoka"
    assert client.seen[0][0].text.startswith("Asked about Apia")
    assert await store.count(cid) == 9


async def test_a_window_holds_whole_turns(store: Store, cid: str) -> None:
    agent, _client = agent_with(HiststoreHistoryProvider(store))
    session = agent.create_session(session_id=cid)
    for city in ["Cusco", "Puno"]:
        await agent.run(city, session=session)
    window = await WindowStore(store, max_messages=5).read(cid)
    assert [m.position for m in window] == [4, 5, 6, 7]  # the newest run: call and result kept
    assert histstore.turns.status(window) == "closed"


def test_without_agent_framework_the_import_names_the_extra() -> None:
    code = (
        "import sys; sys.modules['agent_framework'] = None\n"
        "import histstore.integrations.agent_framework\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode != 0
    assert "pip install 'histstore[agent-framework]'" in proc.stderr
