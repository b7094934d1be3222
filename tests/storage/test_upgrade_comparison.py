"""SPEC 14, upgrades keep every message: a database at each earlier revision, holding a
message of every shape as the histstore of that revision stored it, is upgraded to head;
then each row, each read and each search agree with the same messages written fresh at
head (into another conversation of the same database).

What a revision's histstore stored is what its writes computed: the role column (the
role, else the type; compared as the index of system messages reads it), the JSON, and
from b7d4e2a91c30 on the search text, by the rule of its time. Those rules are the
revisions' own copies (b7d4e2a91c30 until f3b8d6a2c915, f3b8d6a2c915 until
c8d2f4a6e1b9), which are what the writes of those times computed; from c8d2f4a6e1b9
on, ``rows.stored_search_text`` (PostgreSQL's rule today; SQLite's differs from
e5c3a9d7f2b4 on, and rows are compared by the text they are searched by). Rows are
inserted with SQL, listed for the full-text index as that revision's writes listed them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

import pytest
from alembic.script import ScriptDirectory
from helpers import alembic
from sqlalchemy import Column, MetaData, Table, insert, inspect, select, text
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncEngine

import histstore
from histstore._core import codec
from histstore._core import rules as _rules
from histstore._storage import migrations as _migrations
from histstore._storage import rows as _rows
from histstore._storage import schema as _schema
from histstore._storage.statements.search import message_text

REVISIONS = _migrations.revisions()
SEARCH = REVISIONS.index("b7d4e2a91c30")  # search_text from here on
ENVELOPE_ROLES = REVISIONS.index("f3b8d6a2c915")  # envelopes have their role from here on
TEXT_ONCE = REVISIONS.index("c8d2f4a6e1b9")  # today's rule from here on
LISTS_ITSELF = REVISIONS.index("a2f6c8e4d0b3")  # SQLite writes list their messages
QUEUED = REVISIONS.index("e5c3a9d7f2b4")  # SQLite's list renamed (computed text)
T0 = datetime(2025, 3, 4, 5, 6, 7, tzinfo=timezone.utc)

ADK = {
    "type": "adk_event",
    "event": {
        "author": "agent",
        "content": {"role": "model", "parts": [{"text": "sunny"}, {"function_call": {"id": "c",
        "name": "weather", "args": {"city": "Quito"}}}]},
    },
}  # fmt: skip
PYDANTIC = {
    "type": "pydantic_ai",
    "message": {"kind": "request", "parts": [
        {"part_kind": "tool-return", "tool_name": "w", "content": {"sky": "drizzle"},
         "tool_call_id": "t1"}]},
}  # fmt: skip

MESSAGES: list[dict[str, Any]] = [
    {"role": "user", "content": "plain walrus"},
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": "please list the tool calls"},
    {"role": "assistant", "content": "no tool_calls"},
    {"role": "user", "content": "about tool-calls"},
    {"role": "assistant", "content": ""},
    {"role": "user", "content": "Grüße aus 東京, naïve café 🐋"},
    {"role": "user", "content": "nul\x00separated"},
    {"role": "user", "content": "large " + "word " * 60_000 + "farthest"},  # over 256 KiB
    {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function",
     "function": {"name": "get", "arguments": '{"city": "Lisbon"}'}}]},
    {"role": "assistant", "content": "checking tool calls", "tool_calls": [{"id": "c2",
     "type": "function", "function": {"name": "get", "arguments": '{"city": "Porto"}'}}]},
    {"role": "assistant", "content": "nothing to add", "tool_calls": []},
    {"role": "tool", "tool_call_id": "c1", "content": "sunny in Lisbon"},
    {"role": "assistant", "content": None, "function_call": {"name": "f",
     "arguments": '{"q": "heron"}'}},
    {"role": "assistant", "content": [{"type": "text", "text": "let me look"},
     {"type": "tool_use", "id": "u1", "name": "find", "input": {"q": "kestrel"}}]},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "u1",
     "content": [{"type": "text", "text": "kestrel facts"}]}]},
    {"type": "message", "role": "assistant",
     "content": [{"type": "output_text", "text": "responses otter"}]},
    {"type": "function_call", "call_id": "f1", "name": "f", "arguments": '{"q": "orca"}'},
    {"type": "function_call_output", "call_id": "f1", "output": "orca result"},
    {"type": "custom_tool_call", "call_id": "t1", "name": "x", "input": "ibex input"},
    {"type": "reasoning", "id": "r1", "summary": []},
    {"type": "mcp_call", "id": "m1", "name": "n", "server_label": "s",
     "arguments": '{"q": "puffin"}', "output": "puffin answer"},
    {"type": "shell_call_output", "call_id": "s1",
     "output": [{"stdout": "lemur out", "stderr": "lemur err"}]},
    {"type": "local_shell_call_output", "id": "l1", "output": "gecko"},
    {"role": "assistant", "content": "", "type": "ai", "name": None, "id": None,
     "tool_calls": [{"name": "w", "args": {"city": "Oslo"}, "id": "x", "type": "tool_call"}],
     "invalid_tool_calls": []},
    {"role": "assistant", **ADK},
    {"role": "tool", **PYDANTIC},
    {"type": "adk_event", "event": {"author": "agent", "actions": {"state_delta": {"k": 1}}}},
    {"role": "user", "type": "pydantic_ai", "message": {"kind": "request", "parts": []},
     "content": "stray envelope content"},
]  # fmt: skip
"""Every shape, as a write at head stores it (envelopes with their role)."""

QUERIES = sorted(
    {w for m in MESSAGES for w in re.findall(r"\w+", json.dumps(m, ensure_ascii=False))}
    | {"tool calls", "tool_calls", "tool-calls", '"tool calls"'}
)
"""Every word of the messages' JSON (keys, roles and ids too: neither side may find a
message by them), and the phrases the old candidate pattern caught."""


def _revision_module(revision: str) -> Any:
    return ScriptDirectory.from_config(_migrations.alembic_config()).get_revision(revision).module


def _stored_at(at: int) -> Callable[[dict[str, Any]], tuple[str, str, str | None]]:
    """How a write at revision ``REVISIONS[at]`` stored a message (in its head form):
    its role column, JSON and search text."""

    def columns(d: dict[str, Any]) -> tuple[str, str, str | None]:
        if at < ENVELOPE_ROLES and d.get("type") in ("adk_event", "pydantic_ai"):
            d = {k: v for k, v in d.items() if k != "role"}
        role = d.get("role")
        role = role if isinstance(role, str) else str(d["type"])
        data = codec.encode(d)[0]
        if at < SEARCH:
            return role, data, None
        if at < ENVELOPE_ROLES:
            return role, data, _revision_module("b7d4e2a91c30")._indexed_text(d)
        if at < TEXT_ONCE:
            f3b8 = _revision_module("f3b8d6a2c915")
            return role, data, f3b8._searchable(f3b8._indexed_text(d))
        return role, data, _rows.stored_search_text(d)  # c8d2f4a6e1b9's (PostgreSQL's today)

    return columns


def _seed(conn: Connection, at: int, cid: str, messages: list[dict[str, Any]] = MESSAGES) -> None:
    """Conversation ``cid`` with ``messages``, as the histstore of ``REVISIONS[at]``
    stored them: only the columns that revision has; a required column this test does
    not fill fails, naming it."""
    n = len(messages)
    stored = _stored_at(at)
    values: dict[str, list[dict[str, Any]]] = {
        "histstore_conversations": [
            {"id": cid, "length": n, "created_at": T0, "updated_at": T0, "revision": 1}
            | {"next_entry": n + 1, "next_aside": 1, "listed_changes": 1}
        ],
        "histstore_messages": [
            dict(zip(("role", "data", "search_text"), stored(m), strict=True))
            | {"conversation_id": cid, "position": p, "created_at": T0, "entry_id": p + 1}
            for p, m in enumerate(messages)
        ],
        "histstore_changes": [
            {"conversation_id": cid, "revision": 1, "kind": "save", "at": T0}
            | {"record": json.dumps({"start": 0, "added": n}, separators=(",", ":"))}
        ],
    }
    present = set(inspect(conn).get_table_names())
    for name, rows in values.items():
        if name not in present:
            continue
        found = Table(name, MetaData(), autoload_with=conn)
        for c in found.c:
            if not c.nullable and c.server_default is None and c.computed is None:
                assert c.name in rows[0], f"{name}.{c.name} at {REVISIONS[at]}"
        current = _schema.metadata.tables[name].c
        columns = [Column(c.name, current[c.name].type) for c in found.c if c.computed is None]
        table = Table(name, MetaData(), *columns)
        conn.execute(insert(table), [{k: r[k] for k in r if k in table.c} for r in rows])
    if conn.dialect.name == "sqlite" and at >= LISTS_ITSELF:  # as its writes listed them
        listed = (
            "histstore_messages_fts_queued"
            if at >= QUEUED
            else "histstore_messages_fts_listed"
            if at >= TEXT_ONCE
            else "histstore_messages_fts_pending"
        )
        conn.execute(
            text(f"INSERT INTO {listed} (message_rowid) SELECT rowid FROM histstore_messages")
        )


async def _rows_of(engine: AsyncEngine, cid: str) -> list[tuple[str, str, str | None]]:
    """Each row's role key, JSON and the text it is searched by
    (``statements.search.message_text``: ``search_text``, else what the database
    computes from the JSON)."""
    m = _schema.messages
    async with engine.connect() as conn:
        found = await conn.execute(
            select(m.c.role, m.c.data, message_text(conn.dialect, m))
            .where(m.c.conversation_id == cid)
            .order_by(m.c.position)
        )
        # The role column serves the index of system messages alone: a role an older
        # histstore stored for any other message means what NULL means now.
        return [(_rules.role_key(role), data, t) for role, data, t in found]


@pytest.mark.parametrize("start", REVISIONS[:-1])
async def test_an_upgrade_stores_every_message_as_a_fresh_write_at_head(
    engine: AsyncEngine, empty_url: str, start: str
) -> None:
    at = REVISIONS.index(start)
    await alembic(engine, "upgrade", start)
    async with engine.begin() as conn:
        await conn.run_sync(_seed, at, "old")
    await alembic(engine, "upgrade", "head")

    await _assert_as_fresh(engine, empty_url)


async def _assert_as_fresh(engine: AsyncEngine, url: str) -> None:
    """Conversation ``old`` reads, is stored and is found as ``MESSAGES`` written now."""
    async with histstore.connect(url) as store:
        await store.write("fresh", MESSAGES)
        old = [m.to_dict() for m in await store.read("old")]
        assert old == [m.to_dict() for m in await store.read("fresh")] == MESSAGES
        differ = []  # (query, positions found in old, in fresh)
        for query in QUERIES:
            hits = await store.search(query, limit=2 * len(MESSAGES))
            old_hits, fresh_hits = (
                sorted(h.position for h in hits if h.conversation == cid)
                for cid in ("old", "fresh")
            )
            if old_hits != fresh_hits:
                differ.append((query, old_hits, fresh_hits))
        rows = await _rows_of(engine, "old")
        fresh = await _rows_of(engine, "fresh")
        assert (differ, [p for p, row in enumerate(rows) if row != fresh[p]]) == ([], [])
        # The texts ending in what f3b8d6a2c915's candidate pattern caught are found.
        hits = await store.search('"tool calls"', conversation="old")
        assert {2, 3, 4, 10} <= {h.position for h in hits}


async def test_the_repair_revision_mends_what_f3b8d6a2c915_did_to_a_database(
    engine: AsyncEngine, empty_url: str
) -> None:
    """A database upgraded by f3b8d6a2c915 as it was before it had its own rules, then
    to c8d2f4a6e1b9: the messages it left without text have ``''`` (the plain ones whose
    JSON matched its pattern, ``tool calls``, and one with ``tool_calls: []``), and the
    large message the whole of its text. The repair makes them what a write stores."""
    before = REVISIONS.index("d9e3b5a7c1f4") - 1
    await alembic(engine, "upgrade", REVISIONS[before])
    async with engine.begin() as conn:
        await conn.run_sync(_seed, before, "old")
        m = _schema.messages
        old = m.c.conversation_id == "old"
        await conn.execute(
            m.update().where(old, m.c.position.in_([2, 3, 4, 11])).values(search_text="")
        )
        await conn.execute(
            m.update().where(old, m.c.position == 8).values(search_text=MESSAGES[8]["content"])
        )
    await alembic(engine, "upgrade", "head")
    await _assert_as_fresh(engine, empty_url)


async def test_a_message_stored_before_search_too_long_for_a_tsvector_is_kept(
    engine: AsyncEngine, empty_url: str
) -> None:
    """A message stored before search existed whose text PostgreSQL's ``tsvector`` could
    not hold whole (over 1 MiB of distinct words): the upgrade indexes its first 256 KiB,
    as a write does, instead of failing."""
    words = [f"w{i}" for i in range(200_000)]
    huge = {"role": "user", "content": " ".join(words)}
    await alembic(engine, "upgrade", REVISIONS[SEARCH - 1])
    async with engine.begin() as conn:
        await conn.run_sync(_seed, SEARCH - 1, "old", [huge])
    await alembic(engine, "upgrade", "head")
    async with histstore.connect(empty_url) as store:
        await store.write("fresh", [huge])
        assert [m.to_dict() for m in await store.read("old")] == [huge]
        for word, found in (("w0", True), ("w30000", True), (words[-1], False)):
            hits = await store.search(word, limit=5)
            assert sorted(h.conversation for h in hits) == (["fresh", "old"] if found else [])
    assert await _rows_of(engine, "old") == await _rows_of(engine, "fresh")
