"""Revision f3b8d6a2c915 (adapter messages) over a database holding adapter rows as the
revision before it stored them: envelopes without a role, not indexed; LangChain tool
calls whose arguments were not indexed. Upgrade, downgrade and upgrade again, checked
through SQL and through the public API and the adapters."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

from google.adk.events import Event, EventActions
from google.genai import types
from helpers import alembic
from langchain_core.messages import AIMessage
from pydantic_ai.messages import (
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    SystemPromptPart,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from sqlalchemy import insert, select
from sqlalchemy.ext.asyncio import AsyncEngine

import histstore
from histstore._core import codec
from histstore._storage import schema as _schema
from histstore._storage.migrations import revisions
from histstore.integrations.langchain import to_stored
from histstore.integrations.pydantic_ai import HiststoreMessageHistory

REVISION = "f3b8d6a2c915"
PREVIOUS = revisions()[revisions().index(REVISION) - 1]
BULK = 2100  # envelopes in one conversation: more than one batch of the upgrade's (2000)
T0 = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)


def adk_events() -> list[dict[str, Any]]:
    def content(role: str, part: types.Part) -> types.Content:
        return types.Content(role=role, parts=[part])

    call = types.FunctionCall(id="c1", name="get_weather", args={"city": "Paris"})
    response = types.FunctionResponse(id="c1", name="get_weather", response={"sky": "sunny"})
    events = [
        Event(author="user", content=content("user", types.Part(text="Weather in Paris?"))),
        Event(author="bot", content=content("model", types.Part(function_call=call))),
        Event(author="bot", content=content("user", types.Part(function_response=response))),
        Event(author="bot", content=content("model", types.Part(text="Sunny, go out."))),
        Event(author="bot", actions=EventActions(state_delta={"k": 1})),
    ]
    for i, event in enumerate(events):  # fixed, so that every call gives equal events
        event.id, event.timestamp = f"ev{i}", 1_800_000_000.0 + i
    return [e.model_dump(mode="json", exclude_none=True) for e in events]


def pydantic_messages() -> list[dict[str, Any]]:
    messages = [
        ModelRequest(
            parts=[
                SystemPromptPart("Be brief.", timestamp=T0),
                UserPromptPart("Rome?", timestamp=T0),
            ]
        ),
        ModelResponse(parts=[ToolCallPart("w", {"city": "Rome"}, "t1")], timestamp=T0),
        ModelRequest(parts=[ToolReturnPart("w", "windy", "t1", timestamp=T0)]),
        ModelResponse(parts=[TextPart("Windy.")], timestamp=T0),
    ]
    payloads: list[dict[str, Any]] = json.loads(ModelMessagesTypeAdapter.dump_json(messages))
    return payloads


def old_rows() -> dict[str, list[tuple[dict[str, Any], str | None]]]:
    """Per conversation, each message's JSON and its search text, as the revision before
    stored them."""
    lc = to_stored(AIMessage("", tool_calls=[{"name": "w", "args": {"city": "Oslo"}, "id": "x"}]))
    bulk_event = adk_events()[0]
    return {
        "adk": [({"type": "adk_event", "event": e}, None) for e in adk_events()],
        "pyd": [({"type": "pydantic_ai", "message": m}, None) for m in pydantic_messages()],
        "lc": [(lc, None), ({"role": "user", "content": "plain Oslo"}, "plain Oslo")],
        "bulk": [
            ({"type": "adk_event", "event": {**bulk_event, "id": f"e{i}"}}, None)
            for i in range(BULK)
        ],
    }


async def insert_old(engine: AsyncEngine) -> dict[tuple[str, int], tuple[str, str, str | None]]:
    """Store ``old_rows`` with SQL; return each row's (role, data, search_text)."""
    stored: dict[tuple[str, int], tuple[str, str, str | None]] = {}
    async with engine.begin() as conn:
        for cid, rows in old_rows().items():
            await conn.execute(
                insert(_schema.conversations).values(
                    id=cid, length=len(rows), created_at=T0, updated_at=T0, next_entry=len(rows) + 1
                )
            )
            values = []
            for position, (data, text) in enumerate(rows):
                role = data.get("role") or data["type"]
                encoded = codec.encode(data)[0]
                stored[cid, position] = (role, encoded, text)
                values.append(
                    {
                        "conversation_id": cid,
                        "position": position,
                        "role": role,
                        "data": encoded,
                        "created_at": T0,
                        "search_text": text,
                        "entry_id": position + 1,
                    }
                )
            await conn.execute(insert(_schema.messages), values)
    return stored


async def snapshot(engine: AsyncEngine) -> dict[tuple[str, int], tuple[str, str, str | None]]:
    m = _schema.messages
    async with engine.connect() as conn:
        rows = await conn.execute(
            select(m.c.conversation_id, m.c.position, m.c.role, m.c.data, m.c.search_text)
        )
        return {(c, p): (r, d, t) for c, p, r, d, t in rows}


async def test_upgrade_gives_stored_adapter_messages_roles_and_text(
    engine: AsyncEngine, empty_url: str
) -> None:
    await alembic(engine, "upgrade", PREVIOUS)
    before = await insert_old(engine)
    await alembic(engine, "upgrade", "head")
    upgraded = await snapshot(engine)
    roles = {cid: [upgraded[cid, p][0] for p in range(n)] for cid, n in _lengths().items()}
    assert roles["adk"] == ["user", "assistant", "tool", "assistant", "adk_event"]
    assert roles["pyd"] == ["user", "assistant", "tool", "assistant"]
    assert roles["lc"] == ["assistant", "user"]
    assert set(roles["bulk"]) == {"user"}
    assert upgraded["lc", 1] == before["lc", 1]  # nothing new to index: untouched

    async with histstore.connect(empty_url) as store:
        # The framework JSON is what it was; the envelope gained its role, first.
        old = old_rows()
        for cid in ("adk", "pyd"):
            for m, (data, _text) in zip(await store.read(cid), old[cid], strict=True):
                got = m.to_dict()
                assert {k: v for k, v in got.items() if k != "role"} == data
                assert next(iter(got)) == ("role" if "role" in got else "type")
        assert await HiststoreMessageHistory("pyd", store).messages() == (
            ModelMessagesTypeAdapter.validate_python(pydantic_messages())
        )

        async def found(query: str, cid: str) -> list[int]:
            return sorted(h.position for h in await store.search(query, conversation=cid))

        assert await found("Paris", "adk") == [0, 1]
        assert await found("sunny", "adk") == [2, 3]
        assert await found("Rome", "pyd") == [0, 1]
        assert await found("brief", "pyd") == [0]
        assert await found("windy", "pyd") == [2, 3]
        assert await found("Oslo", "lc") == [0, 1]
        assert len(await store.search("Paris", conversation="bulk", limit=BULK + 1)) == BULK

    # Downgrade: every row as the revision before stored it (LangChain keeps its text).
    await alembic(engine, "downgrade", PREVIOUS)
    downgraded = await snapshot(engine)
    expected = dict(before)
    expected["lc", 0] = (*before["lc", 0][:2], upgraded["lc", 0][2])
    assert downgraded == expected
    # And up again: the same as the first upgrade.
    await alembic(engine, "upgrade", "head")
    assert await snapshot(engine) == upgraded


def _lengths() -> dict[str, int]:
    return {cid: len(rows) for cid, rows in old_rows().items()}
