"""A message's search text is stored only where it is not its string content (revision
c8d2f4a6e1b9): what every index reads back is still exactly ``indexed_text``."""

from __future__ import annotations

from typing import Any

import pytest
from helpers import new_id
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import select, text

import histstore.admin
from histstore import Store, indexed_text
from histstore._storage import schema as _schema
from histstore._storage.rows import SEARCH_TEXT_BYTES, searchable
from histstore._storage.statements.search import message_text

ENVELOPE_NO_TEXT = {
    "type": "adk_event",
    "event": {"author": "agent", "actions": {"state_delta": {"k": 1}}},
    "content": "petrel",
}
# (message, what search_text holds: None, "" or "text" for its indexed text)
STORED: list[Any] = [
    pytest.param({"role": "user", "content": "kittiwake plain"}, None, id="plain"),
    pytest.param({"role": "user", "content": "kittiwake", "name": "n"}, None, id="named"),
    pytest.param({"role": "user", "content": ""}, None, id="empty"),
    pytest.param({"role": "user", "content": 'é "q" \\ \n \u2028 😀'}, None, id="escapes"),
    pytest.param({"role": "user", "content": "kittiwake\x00nul"}, "text", id="nul"),
    pytest.param(
        {
            "role": "assistant",
            "content": "kittiwake call",
            "tool_calls": [
                {"id": "1", "type": "function", "function": {"name": "f", "arguments": "fulmar"}}
            ],
        },
        "text",
        id="tool-call",
    ),
    pytest.param(
        {"role": "user", "content": [{"type": "text", "text": "kittiwake block"}]},
        "computed",  # SQLite computes it from the JSON (revision e5c3a9d7f2b4)
        id="blocks",
    ),
    pytest.param({"role": "assistant", "content": None}, None, id="no-content"),
    pytest.param({"type": "reasoning"}, None, id="no-text"),
    pytest.param(ENVELOPE_NO_TEXT, "", id="envelope-beside-a-string"),
    pytest.param({"role": "user", "content": "w " * SEARCH_TEXT_BYTES}, "text", id="cut"),
]


async def _read_back(store: Store, cid: str) -> list[tuple[Any, Any]]:
    """Each message's (text as the indexes read it, ``search_text`` column)."""
    m = _schema.messages
    async with store.engine.connect() as conn:
        rows = await conn.execute(
            select(message_text(conn.dialect, m), m.c.search_text)
            .where(m.c.conversation_id == cid)
            .order_by(m.c.position)
        )
        return [tuple(r) for r in rows]


@pytest.mark.parametrize(("message", "stored"), STORED)
async def test_the_text_the_indexes_read_is_indexed_text(
    store: Store, message: dict[str, Any], stored: str | None
) -> None:
    cid = new_id()
    await store.write(cid, [message])
    expected = searchable(indexed_text(message))
    [(read, column)] = await _read_back(store, cid)
    assert read == expected
    if stored == "computed":
        stored = None if store.engine.dialect.name == "sqlite" else "text"
    assert column == (expected if stored == "text" else stored)


TEXT = st.text(st.characters(blacklist_categories=["Cs"]), max_size=40)


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    contents=st.lists(
        st.one_of(TEXT, st.lists(TEXT.map(lambda t: {"type": "text", "text": t}), max_size=2)),
        min_size=1,
        max_size=5,
    ),
    named=st.booleans(),
)
async def test_any_content_reads_back_as_its_indexed_text(
    store: Store, contents: list[Any], named: bool
) -> None:
    """Against ``indexed_text``: strings with NULs, quotes, escapes and any code point,
    beside other keys or not, in blocks or not."""
    cid = new_id()
    messages = [
        {"role": "user", "content": c, **({"name": "x"} if named else {})} for c in contents
    ]
    await store.write(cid, messages)
    read = [r for r, _ in await _read_back(store, cid)]
    assert read == [searchable(indexed_text(m)) for m in messages]


async def test_search_and_reindex_agree_with_what_writes_store(store: Store, cid: str) -> None:
    """Every shape is found by its text alone; ``reindex`` finds nothing to change in
    what writes stored; an edit that replaces a message replaces its text."""
    messages = [p.values[0] for p in STORED]
    await store.write(cid, messages)
    found = sorted(h.position for h in await store.search("kittiwake", conversation=cid))
    assert found == [0, 1, 4, 5, 6]
    assert [h.position for h in await store.search("fulmar", conversation=cid)] == [5]
    assert await store.search("petrel", conversation=cid) == []  # not text: an envelope's
    assert await histstore.admin.reindex(store) == 0
    await _fts_agrees(store)
    value = await store.edit(cid)
    value.splice(0, 1, [{"role": "user", "content": "guillemot"}], by="test")
    await store.commit(value)
    found = sorted(h.position for h in await store.search("kittiwake", conversation=cid))
    assert found == [1, 4, 5, 6]
    assert [h.position for h in await store.search("guillemot", conversation=cid)] == [0]
    await _fts_agrees(store)


async def _fts_agrees(store: Store) -> None:
    """SQLite: FTS5 holds what its content (the view of every message's text) says."""
    async with store.engine.begin() as conn:
        if conn.dialect.name == "sqlite":
            await conn.execute(
                text(
                    "INSERT INTO histstore_messages_fts(histstore_messages_fts, rank)"
                    " VALUES ('integrity-check', 1)"
                )
            )
