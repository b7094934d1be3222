"""The framework adapters on edited conversations (SPEC 11): after a splice, a rewrite
or a revert, they read the edited history and keep appending after it. Every backend."""

from __future__ import annotations

from langchain_core.messages import AIMessage, HumanMessage
from pydantic_ai.messages import ModelRequest, ModelResponse, TextPart, UserPromptPart

from histstore import Store
from histstore.integrations.langchain import HiststoreChatMessageHistory
from histstore.integrations.openai_agents import HiststoreSession
from histstore.integrations.pydantic_ai import HiststoreMessageHistory


async def summarize_first(store: Store, cid: str, keep: int) -> int:
    """Replace all but the newest ``keep`` messages with one summary; return the
    revision before."""
    value = await store.edit(cid)
    before = value.revision
    value.splice(0, len(value.entries) - keep, [{"role": "user", "content": "S"}], by="x")
    await store.commit(value)
    return before


async def test_openai_agents_session(store: Store, cid: str) -> None:
    session = HiststoreSession(cid, store)
    await session.add_items([{"role": "user", "content": f"m{i}"} for i in range(4)])
    before = await summarize_first(store, cid, 1)
    assert [i["content"] for i in await session.get_items()] == ["S", "m3"]
    assert [i["content"] for i in await session.get_items(limit=1)] == ["m3"]
    await session.add_items([{"role": "assistant", "content": "a"}])
    assert (await session.pop_item()) == {"role": "assistant", "content": "a"}
    await store.revert(cid, before, by="undo")
    assert [i["content"] for i in await session.get_items()] == ["m0", "m1", "m2", "m3"]


async def test_langchain_history(store: Store, cid: str) -> None:
    history = HiststoreChatMessageHistory(cid, store)
    await history.aadd_messages([HumanMessage("q1"), AIMessage("a1"), HumanMessage("q2")])
    await summarize_first(store, cid, 1)
    assert [m.content for m in await history.aget_messages()] == ["S", "q2"]
    await history.aadd_messages([AIMessage("a2")])
    assert [m.content for m in await history.aget_messages()] == ["S", "q2", "a2"]


async def test_pydantic_ai_history(store: Store, cid: str) -> None:
    history = HiststoreMessageHistory(cid, store)
    await history.add(
        [
            ModelRequest(parts=[UserPromptPart("q1")]),
            ModelResponse(parts=[TextPart("a1")]),
            ModelRequest(parts=[UserPromptPart("q2")]),
        ]
    )
    value = await store.edit(cid)
    value.edit_each(
        lambda e: {**e.message.to_dict(), "edited": True} if e.entry_id == 2 else None,
        by="moderator",
    )
    await store.commit(value)
    got = await history.messages()
    assert len(got) == 3
    assert isinstance(got[1], ModelResponse)
    await history.add([ModelResponse(parts=[TextPart("a2")])])
    assert len(await history.messages()) == 4
