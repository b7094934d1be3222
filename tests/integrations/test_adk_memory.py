"""HiststoreMemoryService: ADK memory over histstore search, with a real Runner and the
load_memory tool, on every backend."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence
from typing import Any

import pytest
from adk_models import ScriptedModel, model_text
from google.adk.agents import LlmAgent
from google.adk.events import Event
from google.adk.memory import InMemoryMemoryService
from google.adk.memory.memory_entry import MemoryEntry
from google.adk.models.llm_response import LlmResponse
from google.adk.runners import Runner
from google.adk.sessions import InMemorySessionService, Session
from google.adk.tools import load_memory
from google.genai import types

import histstore
from histstore.integrations._adk_memory_records import entry_memory
from histstore.integrations.adk import HiststoreMemoryService, HiststoreSessionService

APP, USER = "diary-app", "ada"
T0 = 1_800_000_000.0


def calls_load_memory(query: str) -> LlmResponse:
    call = types.FunctionCall(name="load_memory", args={"query": query}, id="m1")
    return LlmResponse(content=types.Content(role="model", parts=[types.Part(function_call=call)]))


def event(text: str, *, author: str = "user", ts: float = T0, **kw: Any) -> Event:
    role = "user" if author == "user" else "model"
    content = types.Content(role=role, parts=[types.Part(text=text)])
    return Event(invocation_id="inv", author=author, content=content, timestamp=ts, **kw)


def session(texts: Sequence[str], *, sid: str = "s1", app: str = APP, user: str = USER) -> Session:
    """A session value as any session service hands it out (events alternate speakers)."""
    events = [
        event(t, author="user" if i % 2 == 0 else "diarist", ts=T0 + i) for i, t in enumerate(texts)
    ]
    return Session(app_name=app, user_id=user, id=sid, events=events)


async def found(
    memory: HiststoreMemoryService, query: str, *, app: str = APP, user: str = USER
) -> list[str]:
    response = await memory.search_memory(app_name=app, user_id=user, query=query)
    return [" ".join(p.text or "" for p in m.content.parts or []) for m in response.memories]


async def stored(store: histstore.Store) -> dict[str, list[str]]:
    """Every memory message in the store, by conversation (through no view)."""
    out: dict[str, list[str]] = {}
    for user in {"adk-memory/diary-app/ada", "adk-memory/diary-app/bob", "adk-memory/other/ada"}:
        view = store.scoped(user)
        for c in await view.conversations():
            out[c] = [str(m.content) for m in await view.read(c)]
    return out


# ---------------------------------------------------------------- through a real Runner


async def run_turn(runner: Runner, session_id: str, text: str) -> None:
    message = types.Content(role="user", parts=[types.Part(text=text)])
    async for _ in runner.run_async(user_id=USER, session_id=session_id, new_message=message):
        pass


@pytest.mark.parametrize("sessions_kind", ["histstore", "adk in-memory"])
async def test_load_memory_tool_recalls_an_earlier_session(store, sessions_kind):
    sessions = HiststoreSessionService(store) if sessions_kind == "histstore" else None
    sessions = sessions or InMemorySessionService()
    memory = HiststoreMemoryService(store)
    model = ScriptedModel()
    agent = LlmAgent(name="diarist", model=model, tools=[load_memory])
    runner = Runner(agent=agent, app_name=APP, session_service=sessions, memory_service=memory)

    first = await sessions.create_session(app_name=APP, user_id=USER)
    model.script.append(model_text("Noted: your cat is called Miso."))
    await run_turn(runner, first.id, "Remember that my cat is called Miso.")
    done = await sessions.get_session(app_name=APP, user_id=USER, session_id=first.id)
    assert done is not None
    await memory.add_session_to_memory(done)

    second = await sessions.create_session(app_name=APP, user_id=USER)
    model.script += [calls_load_memory("what is my cat called"), model_text("Miso.")]
    await run_turn(runner, second.id, "What is my cat called?")

    # The model's last request holds load_memory's answer: the earlier turn, both sides.
    response = next(
        p.function_response.response
        for c in model.seen[-1]
        for p in c.parts or []
        if p.function_response is not None
    )
    memories = response["result"].memories  # ADK hands the tool's own value over
    texts = [m.content.parts[0].text for m in memories]
    assert texts[:2] == [
        "Remember that my cat is called Miso.",
        "Noted: your cat is called Miso.",
    ]
    assert [m.author for m in memories[:2]] == ["user", "diarist"]
    assert memories[0].custom_metadata["session_id"] == first.id
    assert memories[0].id == done.events[0].id


async def test_entries_give_back_the_text_parts_author_and_time(store):
    memory = HiststoreMemoryService(store)
    thinking = types.Part(text="internal musing about kayaks", thought=True)
    spoken = types.Part(text="We went kayaking on the fjord.")
    ev = Event(
        invocation_id="i",
        author="diarist",
        content=types.Content(role="model", parts=[thinking, spoken]),
        timestamp=T0,
    )
    tool_only = Event(
        invocation_id="i",
        author="diarist",
        content=types.Content(
            role="model",
            parts=[types.Part(function_call=types.FunctionCall(name="f", args={"x": "kayak"}))],
        ),
        timestamp=T0 + 1,
    )
    s = Session(app_name=APP, user_id=USER, id="trip", events=[ev, tool_only])
    await memory.add_session_to_memory(s)
    response = await memory.search_memory(app_name=APP, user_id=USER, query="kayaking fjord")
    (entry,) = response.memories
    assert entry.content == types.Content(role="model", parts=[types.Part(text=spoken.text)])
    assert entry.author == "diarist"
    assert entry.id == ev.id
    assert entry.timestamp == "2027-01-15T08:00:00+00:00"
    assert entry.custom_metadata == {"session_id": "trip", "event_id": ev.id}
    # Thoughts are not memories, and events without text are not stored.
    assert await found(memory, "musing") == []
    assert sum(len(v) for v in (await stored(store)).values()) == 1


# ---------------------------------------------------------------- scope


async def test_search_sees_only_that_app_and_user(store):
    memory = HiststoreMemoryService(store)
    await memory.add_session_to_memory(session(["ada likes green tea"]))
    await memory.add_session_to_memory(session(["bob likes green tea"], user="bob"))
    await memory.add_session_to_memory(session(["other app green tea"], app="other"))
    # A plain conversation of the store with the same words is not a memory.
    await store.write("notes", [{"role": "user", "content": "green tea everywhere"}])
    assert await found(memory, "green tea") == ["ada likes green tea"]
    assert await found(memory, "green tea", user="bob") == ["bob likes green tea"]
    assert await found(memory, "green tea", app="other") == ["other app green tea"]
    assert await found(memory, "green tea", user="nobody") == []
    # Scoping is by owner: every memory conversation is owned by its app and user.
    assert await store.conversations(user="adk-memory/diary-app/ada") == [
        "adk-memory/diary-app/ada/s1"
    ]


async def test_a_scoped_view_or_a_semantic_index_without_its_store_is_refused(store):
    with pytest.raises(ValueError, match="scoped view"):
        HiststoreMemoryService(store.scoped("someone"))
    index = histstore.SemanticIndex(store, embed, model="toy")
    with pytest.raises(TypeError, match="Store it was made on"):
        HiststoreMemoryService("unused.db", index)
    with pytest.raises(ValueError, match="limit"):
        HiststoreMemoryService(store, limit=0)
    with pytest.raises(TypeError):
        HiststoreMemoryService(42)  # type: ignore[arg-type]


async def test_owned_store_opens_on_first_use_and_closes(shared_backend, tmp_path):
    async with HiststoreMemoryService(shared_backend.url) as memory:
        await memory.add_session_to_memory(session(["the boiler needs a service"]))
        assert await found(memory, "boiler") == ["the boiler needs a service"]
    with pytest.raises(histstore.HistStoreError):
        await found(memory, "boiler")
    async with HiststoreMemoryService(shared_backend.url) as again:
        assert await found(again, "boiler") == ["the boiler needs a service"]
    unused = HiststoreMemoryService(tmp_path / "never.db")
    await unused.close()
    assert not (tmp_path / "never.db").exists()


# ---------------------------------------------------------------- idempotence


async def test_adding_a_session_again_or_grown_never_duplicates(store):
    memory = HiststoreMemoryService(store)
    texts = ["the plumber comes on monday", "I will be home", "", "bring the spare key"]
    grown = session(texts[:2])
    await memory.add_session_to_memory(grown)
    await memory.add_session_to_memory(grown)
    assert await stored(store) == {"adk-memory/diary-app/ada/s1": texts[:2]}
    grown.events += session(texts).events[2:]  # the same session, two events later
    await memory.add_session_to_memory(grown)
    await memory.add_session_to_memory(grown)
    assert await stored(store) == {"adk-memory/diary-app/ada/s1": [texts[0], texts[1], texts[3]]}
    assert await found(memory, "plumber") == [texts[0]]

    # A different session under the same id (deleted and made again) replaces it.
    await memory.add_session_to_memory(session(["the dentist is on friday"]))
    assert await stored(store) == {"adk-memory/diary-app/ada/s1": ["the dentist is on friday"]}
    assert await found(memory, "plumber") == []


async def test_event_deltas_skip_what_is_stored_and_mix_with_whole_sessions(store):
    memory = HiststoreMemoryService(store)
    whole = session(["buy oat milk", "noted", "and bread"])
    a, b, c = whole.events
    await memory.add_events_to_memory(app_name=APP, user_id=USER, events=[a], session_id="s1")
    await memory.add_events_to_memory(
        app_name=APP, user_id=USER, events=[a, b], session_id="s1", custom_metadata={"ttl": 7}
    )
    assert await stored(store) == {"adk-memory/diary-app/ada/s1": ["buy oat milk", "noted"]}
    noted = await memory.search_memory(app_name=APP, user_id=USER, query="noted")
    assert noted.memories[0].custom_metadata == {"ttl": 7, "event_id": b.id, "session_id": "s1"}
    # The whole session then makes the conversation its memories (its own metadata).
    await memory.add_session_to_memory(whole)
    assert await stored(store) == {
        "adk-memory/diary-app/ada/s1": ["buy oat milk", "noted", "and bread"]
    }
    # Without a session id, events go with the user's loose ones, also deduplicated.
    loose = event("oat milk is sold out", ts=T0 + 9)
    for _ in range(2):
        await memory.add_events_to_memory(app_name=APP, user_id=USER, events=[loose])
    assert (await stored(store))["adk-memory-loose/diary-app/ada"] == ["oat milk is sold out"]
    response = await memory.search_memory(app_name=APP, user_id=USER, query="oat milk")
    assert sorted(m.id for m in response.memories) == sorted([a.id, loose.id])
    assert c.id not in {m.id for m in response.memories}


async def test_explicit_memories_and_deleting_one_for_good(store):
    memory = HiststoreMemoryService(store)
    fact = MemoryEntry(
        content=types.Content(role="user", parts=[types.Part(text="allergic to peanuts")]),
        author="user",
        timestamp="2026-01-01T00:00:00+00:00",
        custom_metadata={"source": "form"},
    )
    for _ in range(2):
        await memory.add_memory(app_name=APP, user_id=USER, memories=[fact])
    response = await memory.search_memory(app_name=APP, user_id=USER, query="peanuts")
    (entry,) = response.memories
    assert entry.content == fact.content
    assert entry.timestamp == fact.timestamp
    assert entry.custom_metadata == {"source": "form"}
    assert entry.id

    said = session(["peanuts again, careful"])
    await memory.add_session_to_memory(said)
    assert len(await found(memory, "peanuts")) == 2
    await memory.delete_memory(app_name=APP, user_id=USER, memory_id=said.events[0].id)
    await memory.delete_memory(app_name=APP, user_id=USER, memory_id=entry.id)
    assert await found(memory, "peanuts") == []
    # A deleted memory does not come back when its session is added again.
    await memory.add_session_to_memory(said)
    assert await found(memory, "peanuts") == []
    await memory.delete_memory(app_name=APP, user_id=USER, memory_id=None)


# ---------------------------------------------------------------- ranking


async def test_every_word_first_then_most_words_and_no_query_raises(store):
    memory = HiststoreMemoryService(store)
    await memory.add_session_to_memory(
        session(
            [
                "the weather is nice",
                "my favorite color is blue",
                "blue whales are big",
                "my favorite food is ramen",
            ]
        )
    )
    # No memory holds every word: those holding most of them come first.
    assert (await found(memory, "what is my favorite color?"))[0] == "my favorite color is blue"
    got = await found(memory, "blue whales")
    assert got[0] == "blue whales are big"
    assert got[1] == "my favorite color is blue"
    assert await found(memory, 'unclosed "quote AND OR * ramen') == ["my favorite food is ramen"]
    for nothing in ["", "   ", "?!", '"']:
        assert await found(memory, nothing) == []


async def test_limit_bounds_the_answer(store):
    memory = HiststoreMemoryService(store, limit=3)
    await memory.add_session_to_memory(session([f"note {i} about tea" for i in range(8)]))
    assert len(await found(memory, "tea")) == 3
    assert len(await found(memory, "tea leaves")) == 3


# ---------------------------------------------------------------- semantic ranking

_CONCEPTS = [
    {"red", "crimson", "scarlet", "ruby"},
    {"dog", "puppy", "hound"},
    {"boat", "sailing", "yacht"},
]


async def embed(texts: list[str]) -> list[list[float]]:
    """A toy embedder: one dimension per concept, and a small constant one."""
    out = []
    for text in texts:
        words = set(re.findall(r"\w+", text.lower()))
        out.append([float(len(words & c)) for c in _CONCEPTS] + [0.1])
    return out


async def test_a_semantic_index_finds_memories_by_meaning(store):
    index = histstore.SemanticIndex(store, embed, model="toy")
    memory = HiststoreMemoryService(store, index)
    plain = HiststoreMemoryService(store)
    await memory.add_session_to_memory(
        session(["we painted the door ruby", "the puppy chewed a shoe", "sailing on sunday"])
    )
    await memory.add_session_to_memory(session(["the other crimson thing"], user="bob"))
    # No memory says "scarlet" or "hound": text search alone finds nothing.
    assert await plain.search_memory(app_name=APP, user_id=USER, query="scarlet") == (
        await InMemoryMemoryService().search_memory(app_name=APP, user_id=USER, query="x")
    )
    assert (await found(memory, "scarlet"))[0] == "we painted the door ruby"
    assert (await found(memory, "hound"))[0] == "the puppy chewed a shoe"
    # Meaning and text are fused: a word match still ranks first for its own words.
    assert (await found(memory, "sunday yacht"))[0] == "sailing on sunday"
    # Bob's crimson is never among Ada's memories.
    assert "the other crimson thing" not in await found(memory, "crimson red")
    # Each add embedded the new memories only.
    assert await index.update() == 0


# ---------------------------------------------------------------- adds by key


def fact(text: str, memory_id: str | None = None) -> MemoryEntry:
    return MemoryEntry(
        id=memory_id,
        content=types.Content(role="user", parts=[types.Part(text=text)]),
        author="user",
        timestamp="2026-01-01T00:00:00+00:00",
    )


async def test_adds_of_one_id_at_once_store_it_once(store):
    memory = HiststoreMemoryService(store)
    same = [fact("the gate code is 4711", "m1")]
    await asyncio.gather(
        *(memory.add_memory(app_name=APP, user_id=USER, memories=same) for _ in range(5))
    )
    # Another text under a stored id is skipped too, as is a repeat within one add.
    await memory.add_memory(
        app_name=APP, user_id=USER, memories=[fact("changed", "m1"), fact("new", "m2")] * 2
    )
    assert await stored(store) == {"adk-memories/diary-app/ada": ["the gate code is 4711", "new"]}


async def test_what_an_older_version_stored_and_deleted_is_still_skipped(store):
    memory = HiststoreMemoryService(store)
    # As the previous version left them: memories written together (no keys, no
    # adk:keyed) and a deleted id only in the adk:deleted list.
    view = store.scoped("adk-memory/diary-app/ada")
    older = [entry_memory(fact(t, f"old{i}"), {}) for i, t in enumerate(["tea", "jam", "eggs"])]
    await view.write("adk-memories/diary-app/ada", older)
    await view.list_append("adk-memories/diary-app/ada", "adk:deleted", ["gone1", "gone2"])
    await memory.add_memory(
        app_name=APP,
        user_id=USER,
        memories=[fact("again", "old1"), fact("back", "gone2"), fact("butter", "fresh")],
    )
    assert await stored(store) == {"adk-memories/diary-app/ada": ["tea", "jam", "eggs", "butter"]}
    await memory.delete_memory(app_name=APP, user_id=USER, memory_id="fresh")
    for _ in range(2):
        await memory.add_memory(
            app_name=APP, user_id=USER, memories=[fact("x", "gone1"), fact("y", "fresh")]
        )
    assert await stored(store) == {"adk-memories/diary-app/ada": ["tea", "jam", "eggs"]}


async def test_events_after_a_whole_session_skip_what_the_session_stored(store):
    memory = HiststoreMemoryService(store)
    whole = session(["water the plants", "done", "and the garden"])
    a, b, c = whole.events
    await memory.add_events_to_memory(app_name=APP, user_id=USER, events=[a], session_id="s1")
    await memory.add_session_to_memory(whole)  # appends b and c together, without keys
    await memory.add_events_to_memory(
        app_name=APP, user_id=USER, events=[a, b, c, event("new one", ts=T0 + 5)], session_id="s1"
    )
    assert await stored(store) == {
        "adk-memory/diary-app/ada/s1": ["water the plants", "done", "and the garden", "new one"]
    }
