"""Text search (SPEC 12): what is indexed, how queries are read, and that the index
changes with the messages, in the same transaction, on every backend."""

from __future__ import annotations

import dataclasses
import io
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import reach
from conftest import Backend
from faults import Faults
from helpers import new_id, stable_id
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import select, text, update

import histstore
import histstore.admin
from histstore import ConflictError, Hit, InvalidMessage, Message, Store, indexed_text
from histstore._core.search_text import parse_query
from histstore._storage import schema as _schema
from histstore._storage.statements import search as _search
from histstore._transfer.exporting import copy_store, export_store, import_store

# ---------------------------------------------------------------------- indexed text

SHAPES: list[Any] = [
    pytest.param({"role": "user", "content": "plain words"}, "plain words", id="chat-string"),
    pytest.param(
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "look at"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,QUJD"}},
            ],
        },
        "look at",
        id="chat-parts",
    ),
    pytest.param(
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "weather", "arguments": '{"city": "Paris", "days": 3}'},
                }
            ],
        },
        "Paris\n3",
        id="chat-tool-call",
    ),
    pytest.param(
        {"role": "assistant", "function_call": {"name": "f", "arguments": "not json"}},
        "not json",
        id="chat-legacy-function-call",
    ),
    pytest.param(
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 degrees"},
        "sunny, 21 degrees",
        id="chat-tool-result",
    ),
    pytest.param(
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "an answer", "annotations": []}],
        },
        "an answer",
        id="responses-message",
    ),
    pytest.param(
        {"role": "user", "content": [{"type": "input_text", "text": "a question"}]},
        "a question",
        id="responses-input",
    ),
    pytest.param(
        {
            "type": "function_call",
            "call_id": "c1",
            "name": "lookup",
            "arguments": '{"query": "tide tables", "nested": {"k": ["deep value"]}}',
        },
        "tide tables\ndeep value",
        id="responses-function-call",
    ),
    pytest.param(
        {"type": "function_call_output", "call_id": "c1", "output": "high tide at noon"},
        "high tide at noon",
        id="responses-function-output",
    ),
    pytest.param(
        {
            "type": "function_call_output",
            "call_id": "c1",
            "output": [{"type": "input_text", "text": "listed output"}],
        },
        "listed output",
        id="responses-function-output-blocks",
    ),
    pytest.param(
        {"type": "custom_tool_call", "call_id": "c2", "name": "sh", "input": "ls -la"},
        "ls -la",
        id="responses-custom-tool-call",
    ),
    pytest.param(
        {"type": "reasoning", "id": "r1", "summary": [], "encrypted_content": "opaque"},
        None,
        id="responses-reasoning",
    ),
    pytest.param(
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "let me check"},
                {"type": "tool_use", "id": "tu1", "name": "search", "input": {"q": "otters"}},
            ],
        },
        "let me check\notters",
        id="anthropic-tool-use",
    ),
    pytest.param(
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "tu1", "content": "otters hold hands"},
                {
                    "type": "tool_result",
                    "tool_use_id": "tu2",
                    "content": [{"type": "text", "text": "in blocks"}],
                },
                {"type": "image", "source": {"type": "base64", "data": "QUJD"}},
            ],
        },
        "otters hold hands\nin blocks",
        id="anthropic-tool-result",
    ),
    pytest.param(
        {
            "role": "assistant",
            "type": "ai",
            "content": "",
            "tool_calls": [
                {
                    "name": "weather",
                    "args": {"city": "Lyon", "days": 2},
                    "id": "lc",
                    "type": "tool_call",
                }
            ],
            "invalid_tool_calls": [{"name": "w", "args": "{broken Nantes", "id": "x"}],
        },
        "Lyon\n2\n{broken Nantes",
        id="langchain-tool-calls",
    ),
    pytest.param(
        {"type": "mcp_call", "name": "n", "arguments": '{"q": "kelp"}', "output": "forests"},
        "kelp\nforests",
        id="responses-mcp-call",
    ),
    pytest.param(
        {"type": "local_shell_call_output", "id": "l", "output": "total 0"},
        "total 0",
        id="responses-local-shell-output",
    ),
    pytest.param(
        {
            "type": "shell_call_output",
            "call_id": "s",
            "output": [{"stdout": "ok", "stderr": "warn"}],
        },
        "ok\nwarn",
        id="responses-shell-output",
    ),
    pytest.param(
        {
            "role": "assistant",
            "type": "adk_event",
            "event": {
                "author": "agent",
                "content": {
                    "role": "model",
                    "parts": [
                        {"text": "pondering", "thought": True},
                        {"text": "Checking"},
                        {"function_call": {"id": "c", "name": "w", "args": {"city": "Turin"}}},
                        {"executable_code": {"code": "print(1)", "language": "PYTHON"}},
                    ],
                },
            },
        },
        "Checking\nTurin\nprint(1)",
        id="adk-event",
    ),
    pytest.param(
        {
            "type": "adk_event",  # as stored before roles: the text is the same
            "event": {
                "author": "agent",
                "content": {
                    "role": "user",
                    "parts": [
                        {"function_response": {"id": "c", "name": "w", "response": {"t": 9}}}
                    ],
                },
            },
        },
        "9",
        id="adk-function-response",
    ),
    pytest.param(
        {"role": "user", "type": "adk_event", "event": {"author": "user", "actions": {}}},
        None,
        id="adk-event-without-content",
    ),
    pytest.param(
        {
            "role": "user",
            "type": "pydantic_ai",
            "message": {
                "kind": "request",
                "instructions": "not indexed",
                "parts": [
                    {"part_kind": "system-prompt", "content": "be kind"},
                    {
                        "part_kind": "user-prompt",
                        "content": ["see", {"kind": "image-url", "url": "https://x/y.png"}],
                    },
                ],
            },
        },
        "be kind\nsee",
        id="pydantic-ai-request",
    ),
    pytest.param(
        {
            "role": "assistant",
            "type": "pydantic_ai",
            "message": {
                "kind": "response",
                "parts": [
                    {"part_kind": "thinking", "content": "hmm"},
                    {"part_kind": "text", "content": "Calling"},
                    {"part_kind": "tool-call", "tool_name": "w", "args": '{"city": "Bari"}'},
                ],
            },
        },
        "Calling\nBari",
        id="pydantic-ai-response",
    ),
    pytest.param(
        {
            "role": "tool",
            "type": "pydantic_ai",
            "message": {
                "kind": "request",
                "parts": [
                    {"part_kind": "tool-return", "content": {"sky": "clear"}, "tool_call_id": "t"},
                    {"part_kind": "retry-prompt", "content": [{"msg": "field required"}]},
                ],
            },
        },
        "clear\nfield required",
        id="pydantic-ai-tool-return",
    ),
    pytest.param({"role": "assistant", "content": ""}, None, id="empty"),
    pytest.param({"role": "user", "content": "a\x00b"}, "a b", id="nul"),
]


@pytest.mark.parametrize(("message", "expected"), SHAPES)
def test_indexed_text_per_shape(message: dict[str, Any], expected: str | None) -> None:
    assert indexed_text(message) == expected
    assert indexed_text(Message.from_dict(message)) == expected


def test_keys_roles_and_types_are_not_text() -> None:
    m = {"role": "user", "type": "message", "content": [{"type": "text", "text": "x"}]}
    assert indexed_text(m) == "x"
    call = {"type": "function_call", "name": "n", "arguments": '{"secretkey": 1}'}
    assert indexed_text(call) == "1"


@pytest.mark.parametrize(
    ("query", "terms"),
    [
        ("fox", ["fox"]),
        ("  quick   brown fox ", ["quick", "brown", "fox"]),
        ('"brown  fox" jumps', ["brown fox", "jumps"]),
        ('a"b c"d', ["a", "b c", "d"]),
        ("OR NOT NEAR(a b) * - ^ : '", ["OR", "NOT", "NEAR(a", "b)", "*", "-", "^", ":", "'"]),
    ],
)
def test_queries_are_words_and_phrases(query: str, terms: list[str]) -> None:
    assert parse_query(query) == terms


@pytest.mark.parametrize("query", ["", "   ", "\n\t", '""', '" "', '"open', 'a "b c', "a\x00b"])
def test_bad_queries_are_refused(query: str) -> None:
    with pytest.raises(InvalidMessage):
        parse_query(query)


# ---------------------------------------------------------------------- the store


def texts(hits: list[Hit]) -> list[Any]:
    return [h.message.content for h in hits]


def where(hits: list[Hit]) -> list[tuple[str, int]]:
    return [(h.conversation, h.position) for h in hits]


async def test_all_words_must_match(store: Store, cid: str) -> None:
    await store.write(
        cid,
        [
            {"role": "user", "content": "the quick brown fox"},
            {"role": "assistant", "content": "a quick answer"},
            {"role": "user", "content": "Brown bread"},
        ],
    )
    assert sorted(where(await store.search("quick"))) == [(cid, 0), (cid, 1)]
    assert where(await store.search("QUICK fox")) == [(cid, 0)]
    assert sorted(where(await store.search("brown"))) == [(cid, 0), (cid, 2)]
    assert await store.search("quick bread") == []
    hit = (await store.search("fox"))[0]
    assert hit.message == Message.user("the quick brown fox")
    assert hit.message.position == 0
    assert hit.message.created_at is not None
    assert isinstance(hit.score, float)


async def test_phrases_match_words_in_order(store: Store, cid: str) -> None:
    await store.write(
        cid,
        [
            {"role": "user", "content": "the brown fox runs"},
            {"role": "user", "content": "the fox is brown"},
        ],
    )
    assert where(await store.search('"brown fox"')) == [(cid, 0)]
    assert where(await store.search('"fox is brown" the')) == [(cid, 1)]
    assert await store.search('"fox brown"') == []


async def test_every_message_of_a_large_batch_is_found(store: Store, cid: str) -> None:
    # More rows than one multi-row INSERT takes on SQLite (see _storage.sqlite_inserts).
    n = 300
    await store.write(cid, [{"role": "user", "content": f"walrus tag{i}x"} for i in range(n)])
    for i in (0, 1, 127, 128, 255, 256, 257, 299):
        assert where(await store.search(f"tag{i}x")) == [(cid, i)]
    assert len(await store.search("walrus", limit=n + 1)) == n
    await store.clear(cid)
    assert await store.search("walrus") == []


async def test_the_best_match_comes_first(store: Store, cid: str) -> None:
    filler = [{"role": "user", "content": f"unrelated message number {i}"} for i in range(8)]
    await store.write(
        cid,
        [
            *filler,
            {"role": "user", "content": "otter facts and many other words about rivers"},
            {"role": "user", "content": "otter otter otter"},
        ],
    )
    hits = await store.search("otter")
    assert where(hits) == [(cid, 9), (cid, 8)]
    assert hits[0].score > hits[1].score


async def test_conversation_and_limit(store: Store) -> None:
    a, b = new_id("a"), new_id("b")
    await store.write(a, [{"role": "user", "content": f"kiwi {i}"} for i in range(5)])
    await store.write(b, [{"role": "user", "content": "kiwi"}])
    assert {h.conversation for h in await store.search("kiwi", conversation=b)} == {b}
    assert len(await store.search("kiwi", conversation=a)) == 5
    assert len(await store.search("kiwi", limit=3)) == 3
    assert len(await store.search("kiwi")) == 6
    assert await store.search("kiwi", limit=0) == []
    assert await store.search("kiwi", conversation=new_id("none")) == []
    with pytest.raises(ValueError, match="limit"):
        await store.search("kiwi", limit=-1)
    with pytest.raises(TypeError):
        await store.search("kiwi", limit=None)  # type: ignore[arg-type]
    with pytest.raises(histstore.InvalidId):
        await store.search("kiwi", conversation=" padded")


@pytest.mark.parametrize(
    "query", ["", "  ", '"unclosed', 'one "two', 3, None, "a\x00"], ids=stable_id
)
async def test_bad_queries_raise_invalid_message(store: Store, query: Any) -> None:
    with pytest.raises(InvalidMessage):
        await store.search(query)


@pytest.mark.parametrize(
    ("query", "found"),
    [
        ("foo OR bar", False),
        ("foo AND NOT bar", False),
        ("NEAR(foo bar)", False),
        ("foo | bar", False),
        ("foo & !bar", False),
        ("'foo' <-> 'bar'", False),
        ("text:foo", False),
        ("foo*", True),
        ("fo*", False),
        ("-foo", True),
        ("foo:*", True),
        ("^foo", True),
        ("foo\\", True),
        ("(foo", True),
        ("foo -", True),
        ("foo 'foo'", True),
    ],
)
async def test_engine_syntax_is_matched_as_text(
    store: Store, cid: str, query: str, found: bool
) -> None:
    """Operators of FTS5 or tsquery in a query are words like any other, or punctuation:
    never an error, never an operator (no OR, no NOT, no prefix match)."""
    await store.write(cid, [{"role": "user", "content": "foo"}, {"role": "user", "content": "bar"}])
    assert where(await store.search(query)) == ([(cid, 0)] if found else [])


async def test_a_query_of_punctuation_finds_nothing(store: Store, cid: str) -> None:
    await store.write(cid, [{"role": "user", "content": "!!! ???"}])
    assert await store.search("!!!") == []
    assert await store.search('"???"') == []


async def test_what_is_not_text_is_not_found(store: Store, cid: str) -> None:
    await store.write(
        cid,
        [
            {
                "role": "assistant",
                "tool_calls": [
                    {
                        "id": "zebracallid",
                        "type": "function",
                        "function": {"name": "giraffename", "arguments": '{"okapikey": "lion"}'},
                    }
                ],
            }
        ],
    )
    assert where(await store.search("lion")) == [(cid, 0)]
    for word in ("zebracallid", "giraffename", "okapikey", "assistant", "function"):
        assert await store.search(word) == []


async def test_pop_and_clear_take_messages_out_of_the_index(store: Store, cid: str) -> None:
    await store.write(cid, [{"role": "user", "content": "walrus"}] * 3)
    await store.pop(cid)
    assert where(await store.search("walrus")) == [(cid, 0), (cid, 1)]
    await store.write(cid, [{"role": "user", "content": "narwhal"}])  # reuses position 2
    assert where(await store.search("narwhal")) == [(cid, 2)]
    assert len(await store.search("walrus")) == 2
    await store.clear(cid)
    assert await store.search("walrus") == []
    assert await store.search("narwhal") == []


async def test_a_refused_write_leaves_no_trace(store: Store, cid: str) -> None:
    await store.write(cid, [{"role": "user", "content": "first"}])
    with pytest.raises(ConflictError):
        await store.write(cid, [{"role": "user", "content": "heron"}], at=5)
    with pytest.raises(InvalidMessage):
        await store.write(cid, [{"role": "user", "content": "heron"}, {"content": "no role"}])
    assert await store.search("heron") == []


@pytest.fixture
def faults(store: Store, monkeypatch: pytest.MonkeyPatch) -> Iterator[Faults]:
    f = Faults(monkeypatch)
    yield f
    f.fail_insert_into = None


async def test_a_write_rolled_back_half_way_leaves_no_trace(
    store: Store, cid: str, faults: Faults
) -> None:
    """The messages and their index entries go in, then the write record fails: the
    rollback takes the index entries too."""
    faults.fail_insert_into = "histstore_writes"
    with pytest.raises(histstore.WriteError):
        await store.write(cid, [{"role": "user", "content": "pelican"}], idempotency_key="k")
    faults.fail_insert_into = None
    assert await store.search("pelican") == []
    await store.write(cid, [{"role": "user", "content": "pelican"}])
    assert where(await store.search("pelican")) == [(cid, 0)]


async def test_fork_save_and_purge(store: Store) -> None:
    a, b = new_id("a"), new_id("b")
    await store.write(a, [{"role": "user", "content": f"lemur {i}"} for i in range(4)])
    await store.fork(a, b, upto=2)
    assert sorted(where(await store.search("lemur", conversation=b))) == [(b, 0), (b, 1)]
    state = await store.load(b)
    await store.save(dataclasses.replace(state, messages=(Message.user("capybara"),)))
    assert await store.search("lemur", conversation=b) == []
    assert where(await store.search("capybara")) == [(b, 0)]
    assert await store.purge(idle_for=timedelta(0)) >= 2
    assert await store.search("lemur") == []
    assert await store.search("capybara") == []


async def test_purge_of_conversations_written_in_turn(store: Store) -> None:
    """Purge deletes a batch's messages in one statement (SQLite: in rowid order, see
    ``statements.dialects.delete_listed_in_rowid_order``): conversations whose messages
    were written in turn lose all of theirs, the others keep theirs, and SQLite's
    full-text index passes its own check."""
    gone, kept = [new_id("gone") for _ in range(3)], [new_id("kept") for _ in range(2)]
    for i in range(3):
        for c in gone + kept:  # their messages' rowids interleave
            await store.write(c, [{"role": "user", "content": f"osprey {i}"}])
    conv = _schema.conversations
    old = datetime.now(timezone.utc) - timedelta(days=3)
    async with store.engine.begin() as conn:
        await conn.execute(update(conv).where(conv.c.id.in_(gone)).values(updated_at=old))
    assert await store.purge(idle_for=timedelta(days=1)) == len(gone)
    assert await store.conversations() == sorted(kept)
    assert sorted(where(await store.search("osprey", limit=50))) == sorted(
        (c, i) for c in kept for i in range(3)
    )
    for c in gone:
        assert await store.read(c) == []
    async with store.engine.connect() as conn:
        left = await conn.execute(select(_schema.messages.c.conversation_id).distinct())
        assert sorted(left.scalars()) == sorted(kept)
        if conn.dialect.name == "sqlite":
            await conn.execute(
                text(
                    "INSERT INTO histstore_messages_fts(histstore_messages_fts, rank)"
                    " VALUES ('integrity-check', 1)"
                )
            )


async def test_a_view_searches_its_own_conversations(store: Store) -> None:
    mine, theirs = new_id("mine"), new_id("theirs")
    alice, bob = store.scoped("alice"), store.scoped("bob")
    await alice.write(mine, [{"role": "user", "content": "secret badger"}])
    await bob.write(theirs, [{"role": "user", "content": "other badger"}])
    assert where(await alice.search("badger")) == [(mine, 0)]
    assert where(await bob.search("badger")) == [(theirs, 0)]
    assert await alice.search("badger", conversation=theirs) == []
    assert len(await store.search("badger")) == 2


async def test_import_and_copy_index_what_they_write(store: Store, tmp_path: Path) -> None:
    cid = new_id()
    await store.write(
        cid,
        [
            {"role": "user", "content": "moose"},
            {"type": "function_call", "call_id": "x", "name": "f", "arguments": '{"a": "elk"}'},
        ],
    )
    out = io.StringIO()
    await export_store(store, out)
    await store.clear(cid)
    assert await store.search("moose") == []
    await import_store(store, (line.encode() for line in out.getvalue().splitlines(True)))
    assert where(await store.search("moose")) == [(cid, 0)]
    assert where(await store.search("elk")) == [(cid, 1)]

    async with histstore.connect(str(tmp_path / "copy.db")) as target:
        await copy_store(store, target)
        assert where(await target.search("elk")) == [(cid, 1)]
        assert where(await target.search("moose")) == [(cid, 0)]


WORDS = st.sampled_from(["ant", "bee", "cat", "dog", "eel", "fig"])


@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    docs=st.lists(st.lists(WORDS, min_size=1, max_size=5), min_size=1, max_size=8),
    query=st.lists(WORDS, min_size=1, max_size=2),
)
async def test_search_finds_exactly_the_messages_holding_the_words(
    store: Store, docs: list[list[str]], query: list[str]
) -> None:
    """Against a model: a message is found iff it holds every query word."""
    cid = new_id()  # the store outlives examples: a fresh id each time
    await store.write(cid, [{"role": "user", "content": " ".join(d)} for d in docs])
    got = sorted(
        h.position for h in await store.search(" ".join(query), conversation=cid, limit=100)
    )
    assert got == [i for i, d in enumerate(docs) if all(w in d for w in query)]


async def test_reindex_fills_text_the_schema_could_not(store: Store) -> None:
    """As after ``migrate --sql`` on a database with messages: no indexed text yet
    (revision b7d4e2a91c30 leaves ``search_text`` NULL, which c8d2f4a6e1b9 makes ``''``,
    no text, beside a string content)."""
    a, b = new_id("a"), new_id("b")
    await store.scoped("alice").write(
        a, [{"role": "user", "content": f"ibis {i}"} for i in range(5)]
    )
    await store.write(b, [{"role": "user", "content": "ibis"}, {"type": "reasoning"}])
    async with store.engine.begin() as conn:
        await conn.execute(
            update(_schema.messages)
            .where(_schema.messages.c.data.not_like('%"reasoning"%'))
            .values(search_text="")
        )
    assert await store.search("ibis") == []
    assert await histstore.admin.reindex(store.scoped("alice"), batch=2) == 5
    assert {h.conversation for h in await store.search("ibis", limit=100)} == {a}
    assert await histstore.admin.reindex(store, batch=2) == 1
    assert len(await store.search("ibis", limit=100)) == 6
    assert await histstore.admin.reindex(store) == 0
    with pytest.raises(ValueError, match="batch"):
        await histstore.admin.reindex(store, batch=0)


async def test_reindex_indexes_adapter_envelopes_stored_without_roles(
    store: Store, cid: str
) -> None:
    """Envelopes stored without their role key (by an older adapter, or before the
    output of ``migrate --sql`` that could not compute it) get their role and their
    text from ``reindex``, as the online upgrade gives them."""
    event = {"author": "u", "content": {"role": "user", "parts": [{"text": "marmot"}]}}
    reply = {"kind": "response", "parts": [{"part_kind": "text", "content": "badger"}]}
    no_message = {"author": "agent", "actions": {"state_delta": {"k": 1}}}
    stored = [
        {"type": "adk_event", "event": event},
        {"type": "pydantic_ai", "message": reply},
        {"type": "adk_event", "event": no_message},
    ]
    await store.write(cid, stored)
    async with store.engine.begin() as conn:
        await conn.execute(update(_schema.messages).values(search_text=None))
    assert await store.search("badger", conversation=cid) == []
    # SQLite computes an ADK event's text from its JSON (revision e5c3a9d7f2b4).
    sqlite_computes = store.engine.dialect.name == "sqlite"
    found = [h.position for h in await store.search("marmot", conversation=cid)]
    assert found == ([0] if sqlite_computes else [])
    assert await histstore.admin.reindex(store) == 2
    assert [h.position for h in await store.search("marmot", conversation=cid)] == [0]
    assert [h.position for h in await store.search("badger", conversation=cid)] == [1]
    messages = await store.read(cid)
    assert [m.to_dict() for m in messages] == [
        {"role": "user", **stored[0]},
        {"role": "assistant", **stored[1]},
        stored[2],  # an event with no message gets no role
    ]
    assert list(messages[0].to_dict()) == ["role", "type", "event"]  # the role first
    async with store.engine.connect() as conn:
        roles = await conn.execute(
            select(_schema.messages.c.role).order_by(_schema.messages.c.position)
        )
        assert [r[0] for r in roles] == [None, None, None]  # only 'system' is kept there
    assert await histstore.admin.reindex(store) == 0


async def test_reindex_leaves_a_message_replaced_under_it(
    backend: Backend, store: Store, cid: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A message replaced between reindex's read and its update keeps the new one."""
    if not backend.shared or backend.name.startswith("sqlite"):
        pytest.skip("SQLite's reindex holds the write lock from its read to its update")
    event = {"author": "u", "content": {"role": "user", "parts": [{"text": "marmot"}]}}
    await store.write(cid, [{"type": "adk_event", "event": event}])
    driver = reach.driver(store)
    page, fetch = reach.statements(store).reindex_page, driver.fetch

    async def fetch_then_replace(*args: Any, **kwargs: Any) -> Any:
        rows = await fetch(*args, **kwargs)
        if args[1] is page and rows:
            async with backend.connect() as other:
                await other.clear(cid)
                await other.write(cid, [{"role": "user", "content": "replaced"}])
        return rows

    monkeypatch.setattr(driver, "fetch", fetch_then_replace)
    await histstore.admin.reindex(store)
    assert [m.to_dict() for m in await store.read(cid)] == [{"role": "user", "content": "replaced"}]
    monkeypatch.undo()
    assert [h.position for h in await store.search("replaced", conversation=cid)] == [0]
    assert await histstore.admin.reindex(store) == 0


@pytest.mark.parametrize("by_conversation", [False, True])
async def test_the_full_text_index_serves_the_search(
    store: Store, cid: str, by_conversation: bool
) -> None:
    """The search statement is one the index answers: FTS5 drives it on SQLite; on
    Postgres the GIN index on the messages' text (usable whenever the planner wants it;
    with few rows it may prefer a scan, so scans are switched off here): the search
    names the very expression the index was made on, and never scans the messages."""
    await store.write(cid, [{"role": "user", "content": f"word{i} common"} for i in range(50)])
    async with store.engine.connect() as conn:
        dialect = conn.dialect
        q = _search.search_terms(dialect, ["word7"])
        stmt = _search.search(dialect, False, by_conversation).params(q=q, limit=10, c=cid)
        sql = str(stmt.compile(dialect=dialect, compile_kwargs={"literal_binds": True}))
        if dialect.name == "postgresql":
            await conn.execute(text("SET LOCAL enable_seqscan = off"))
            plan = "\n".join(r[0] for r in await conn.execute(text("EXPLAIN " + sql)))
            assert "Seq Scan on histstore_messages" not in plan, plan
            if not by_conversation:  # (one conversation may go by its key instead)
                assert "ix_histstore_messages_text" in plan, plan
        else:
            rows = await conn.execute(text("EXPLAIN QUERY PLAN " + sql))
            plan = "\n".join(r[3] for r in rows)
            assert "SCAN histstore_messages_fts VIRTUAL TABLE INDEX" in plan, plan
            assert "SCAN histstore_messages " not in plan + " ", plan


async def test_every_path_lists_exactly_the_messages_it_stored(store: Store) -> None:
    """Writes list what they insert themselves (revision a2f6c8e4d0b3): after appends
    of every size, a splice, a revert, a fork and a save, each message is found once,
    and (SQLite) FTS5 agrees with its content table and matches each message once."""
    a, b = new_id("a"), new_id("b")

    async def found() -> list[tuple[str, int]]:
        """Each step's messages are indexed before the next (a search indexes the list):
        a step listing a message indexed already would index it twice."""
        hits = where(await store.search("kestrel", limit=1000))
        assert len(hits) == len(set(hits))
        return hits

    await store.write(a, [{"role": "user", "content": "kestrel 0"}])
    assert len(await found()) == 1
    await store.write(a, [{"role": "user", "content": f"kestrel {i}"} for i in range(1, 101)])
    assert len(await found()) == 101
    await store.write(a, [{"role": "tool", "content": [{"type": "image", "url": "x"}]}])
    value = await store.edit(a)
    value.splice(1, 2, [{"role": "user", "content": "kestrel swapped"}], by="test")
    await store.commit(value)  # "kestrel 1" replaced
    assert len(await found()) == 101
    await store.revert(a, 2, by="test")
    assert len(await found()) == 101
    await store.fork(a, b, upto=50)
    assert len(await found()) == 151
    state = await store.load(b)
    await store.save(dataclasses.replace(state, messages=state.messages[:10]))
    assert len(await found()) == 101 + 10
    async with store.engine.connect() as conn:
        if conn.dialect.name != "sqlite":
            return
        await conn.execute(
            text(
                "INSERT INTO histstore_messages_fts(histstore_messages_fts, rank)"
                " VALUES ('integrity-check', 1)"
            )
        )
        listed = await conn.execute(text("SELECT count(*) FROM histstore_messages_fts_queued"))
        assert listed.scalar_one() == 0  # the search indexed the whole list
        matched = await conn.execute(
            text(
                "SELECT count(*), count(DISTINCT rowid) FROM histstore_messages_fts"
                " WHERE histstore_messages_fts MATCH 'kestrel'"
            )
        )
        assert tuple(matched.one()) == (111, 111)
