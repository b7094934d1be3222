"""SPEC 5: conversation state (load/save, fork, summaries, metadata, named lists, purge).

Every test runs on every backend through the ``store``/``backend`` fixtures; raw rows are
read through ``store.engine`` only to prove that nothing is left behind.
"""

from __future__ import annotations

import asyncio
import math
import textwrap
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from faults import Faults
from helpers import PYTHON, new_id, raw_rows, stable_id, subprocess_env, user_msgs
from sqlalchemy import select, update

import histstore
from histstore import (
    ConflictError,
    ConversationState,
    HistStoreError,
    InvalidId,
    InvalidMessage,
    Message,
    NotFound,
    Summary,
)
from histstore._storage import schema as _schema

Store = histstore.Store

# Values the SPEC says survive a round trip exactly on every backend.
TRICKY_VALUES: list[Any] = [
    "nul \u0000 inside",
    "astral \U0001f600 \U00010348",
    1.7976931348623157e308,
    -5e-324,
    2**70,
    -(2**63),
    {"z": 1, "a": [None, True, False, {"b": None}], "m": {"": ""}},
    [[[[[[["deep"]]]]]]],
    "x" * 100_000,
    None,
    0,
    "",
    [],
    {},
]
BAD_JSON: list[Any] = [
    math.nan,
    math.inf,
    {1, 2},
    (1, 2),
    object(),
    {1: "int key"},
    "lone \ud800 surrogate",
    b"bytes are not JSON",
]
BAD_IDS: list[Any] = ["", " lead", "trail ", "nul\x00", "x" * 256, "\ud800", 7, None]


def old_time() -> datetime:
    return datetime.now(timezone.utc) - timedelta(days=3)


async def make_old(store: Store, conversation: str, when: datetime | None = None) -> None:
    """Pretend the conversation was last changed long ago."""
    conv = _schema.conversations
    async with store.engine.begin() as conn:
        result = await conn.execute(
            update(conv).where(conv.c.id == conversation).values(updated_at=when or old_time())
        )
        assert result.rowcount == 1


async def fill(store: Store, c: str, *, user: str | None = None) -> ConversationState:
    """A conversation holding something of every kind; returns what it holds."""
    state = ConversationState(
        c,
        user=user,
        messages=[Message.system("be brief"), *user_msgs(3, "fill"), Message.assistant("ok")],
        system_prompt="you are a test",
        summaries=[Summary(0, 1, "first two"), Summary(1, 3, {"json": ["summary"]}, 12)],
        metadata={"topic": "tests", "n": 3},
    )
    await store.save(state)
    await store.list_append(c, "events", [{"e": 1}, b"\x00\xffraw", "two"])
    await store.list_append(c, "other", [1, 2, 3])
    await histstore.SemanticIndex(store, _embed, model="fill").update(c)
    return await store.load(c)


async def _embed(texts: list[str]) -> list[list[float]]:
    return [[1.0, float(len(t))] for t in texts]


def messages_of(state: ConversationState) -> list[tuple[int | None, datetime | None, Any]]:
    return [(m.position, m.created_at, m.to_dict()) for m in state.messages]


# --------------------------------------------------------------------------- load / save


async def test_load_unknown_raises_not_found(store: Store, cid: str) -> None:
    with pytest.raises(NotFound):
        await store.load(cid)
    assert not await store.exists(cid)


async def test_load_after_writes(store: Store, cid: str) -> None:
    before = datetime.now(timezone.utc)
    await store.write(cid, user_msgs(2))
    await store.write(cid, [Message.assistant("done")])
    state = await store.load(cid)
    assert state.id == cid
    assert state.user is None
    assert state.system_prompt is None
    assert state.summaries == ()
    assert state.metadata is None
    assert state.token_count == 0  # no count_tokens given to connect()
    assert [m.to_dict() for m in state.messages] == [
        *user_msgs(2),
        Message.assistant("done").to_dict(),
    ]
    assert [m.position for m in state.messages] == [0, 1, 2]
    for m in state.messages:
        assert m.created_at is not None
        assert m.created_at.tzinfo is not None
        assert m.created_at >= before - timedelta(seconds=5)
    assert state.created_at is not None
    assert state.updated_at is not None
    assert state.created_at.utcoffset() == timedelta(0)
    assert state.created_at <= state.updated_at


async def test_save_load_round_trip_every_field(store: Store, cid: str) -> None:
    when = datetime(2024, 5, 6, 7, 8, 9, 123456, tzinfo=timezone.utc)
    state = ConversationState(
        cid,
        user="owner-1",
        messages=[
            Message.system("sys"),
            {"role": "user", "content": [{"type": "text", "text": "hi \u0000 \U0001f600"}]},
            {"type": "reasoning", "id": "r1", "summary": []},
            Message.assistant(None, tool_calls=[{"id": "c1", "type": "function"}]),
            Message.tool({"big": 2**70, "f": 1.7976931348623157e308}, tool_call_id="c1"),
        ],
        system_prompt="system prompt \U0001f600",
        summaries=[
            Summary(0, 2, "summary text", token_count=7, created_at=when),
            Summary(1, 1, {"structured": [1, None]}),
        ],
        metadata={"k": {"nested": [1, 2, None]}, "s": "\u0000", "f": -0.5},
    )
    await store.save(state)
    got = await store.load(cid)
    assert got.id == cid
    assert got.user == "owner-1"
    assert got.system_prompt == "system prompt \U0001f600"
    assert list(got.messages) == list(state.messages)
    assert [m.to_dict() for m in got.messages] == [m.to_dict() for m in state.messages]
    assert [m.position for m in got.messages] == [0, 1, 2, 3, 4]
    assert all(m.created_at is not None for m in got.messages)
    assert got.summaries[0] == Summary(0, 2, "summary text", 7, when)
    assert got.summaries[1].start == 1
    assert got.summaries[1].end == 1
    assert got.summaries[1].content == {"structured": [1, None]}
    assert got.summaries[1].token_count is None
    assert got.summaries[1].created_at is not None
    assert dict(got.metadata or {}) == {"k": {"nested": [1, 2, None]}, "s": "\u0000", "f": -0.5}
    assert await store.metadata(cid) == dict(got.metadata or {})
    assert await store.summaries(cid) == list(got.summaries)
    assert await store.count(cid) == 5
    assert await store.read(cid) == list(state.messages)

    # Saving what was loaded changes nothing: positions and message times are kept.
    await store.save(got)
    again = await store.load(cid)
    assert messages_of(again) == messages_of(got)
    assert again.summaries == got.summaries
    assert again.created_at == got.created_at
    assert (again.user, again.system_prompt, again.metadata) == (
        got.user,
        got.system_prompt,
        got.metadata,
    )


async def test_saved_conversation_keeps_working(store: Store, cid: str) -> None:
    await store.save(ConversationState(cid, messages=user_msgs(3)))
    out = await store.write(cid, [Message.assistant("next")], at=3)
    assert out.length == 4
    assert (await store.pop(cid)) == Message.assistant("next")
    assert [m.position for m in await store.read(cid)] == [0, 1, 2]


async def test_token_count_sums_count_tokens(backend: Any) -> None:
    def count(m: Message) -> int:
        return len(str(m.content))

    c = new_id()
    async with backend.connect(count_tokens=count) as st:
        msgs = [Message.user("abc"), Message.assistant("defgh"), Message.user("i")]
        await st.write(c, msgs[:2])
        await st.write(c, msgs[2:])
        assert (await st.load(c)).token_count == 3 + 5 + 1
        await st.pop(c)
        assert (await st.load(c)).token_count == 3 + 5
        # save() records counts for the messages it writes (state.token_count is not taken).
        c2 = new_id()
        await st.save(ConversationState(c2, messages=msgs, token_count=999))
        assert (await st.load(c2)).token_count == 9


async def test_save_replaces_everything_but_lists(store: Store, cid: str) -> None:
    old = await fill(store, cid, user="first-owner")
    events = await store.list_load(cid, "events")
    new = ConversationState(
        cid,
        user="second-owner",
        messages=[Message.user("only one")],
        system_prompt=None,
        summaries=[Summary(0, 0, "new summary")],
        metadata={"fresh": True},
    )
    await store.save(new)
    got = await store.load(cid)
    assert got.user == "second-owner"
    assert got.system_prompt is None
    assert list(got.messages) == [Message.user("only one")]
    assert [s.content for s in got.summaries] == ["new summary"]
    assert dict(got.metadata or {}) == {"fresh": True}
    assert await store.count(cid) == 1
    assert got.created_at == old.created_at
    # Lists are left as they are.
    assert await store.list_load(cid, "events") == events
    assert await store.list_load(cid, "other") == [1, 2, 3]
    assert await store.conversations(user="first-owner") == []
    assert await store.conversations(user="second-owner") == [cid]

    await store.save(ConversationState(cid))
    empty = await store.load(cid)
    assert empty.messages == ()
    assert empty.summaries == ()
    assert empty.metadata is None
    assert empty.user is None
    assert await store.metadata(cid) == {}
    assert await store.read(cid) == []
    assert await store.list_len(cid, "events") == 3


async def test_save_invalid_writes_nothing(backend: Any) -> None:
    c, fresh = new_id(), new_id()
    async with backend.connect(max_message_bytes=1000) as st:
        old = await fill(st, c)
        rows = await raw_rows(st, c)
        too_big = ConversationState(c, messages=[Message.user("y" * 2000)], metadata={"x": 1})
        bad_summary = ConversationState(c, summaries=[Summary(0, 0, {1, 2})])
        for state in (too_big, bad_summary):
            with pytest.raises(InvalidMessage):
                await st.save(state)
            assert await raw_rows(st, c) == rows
            assert messages_of(await st.load(c)) == messages_of(old)
        with pytest.raises(InvalidMessage):
            await st.save(ConversationState(fresh, messages=[Message.user("y" * 2000)]))
        assert not await st.exists(fresh)


async def test_save_is_one_transaction(
    store: Store, cid: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failure after the old rows were deleted and new messages inserted rolls all back."""
    await fill(store, cid)
    rows = await raw_rows(store, cid)
    state = ConversationState(cid, messages=user_msgs(4, "new"), summaries=[Summary(0, 1, "s")])
    faults = Faults(monkeypatch)
    faults.fail_insert_into = "histstore_summaries"
    with pytest.raises(HistStoreError):
        await store.save(state)
    faults.fail_insert_into = None
    assert await raw_rows(store, cid) == rows
    # The store is usable afterwards.
    await store.save(state)
    assert [m.to_dict() for m in (await store.load(cid)).messages] == user_msgs(4, "new")


async def test_a_write_merges_its_metadata_in_its_own_transaction(store: Store, cid: str) -> None:
    await store.merge_metadata(cid, {"gone": 1, "kept": "k"})
    first = user_msgs(2, "a")
    out = await store.write(cid, first, at=0, idempotency_key="k1", metadata={"n": 1, "gone": None})
    assert out.length == 2
    assert await store.metadata(cid) == {"n": 1, "kept": "k"}
    # A retry only confirms what is stored: nothing commits, nothing merges.
    again = await store.write(cid, first, at=0, idempotency_key="k1", metadata={"n": 99})
    assert again.length == 2
    assert await store.metadata(cid) == {"n": 1, "kept": "k"}
    # A conflict stores neither.
    with pytest.raises(ConflictError):
        await store.write(cid, user_msgs(1, "late"), at=1, metadata={"n": 2})
    assert await store.metadata(cid) == {"n": 1, "kept": "k"}
    # Bad metadata is refused before anything is written.
    with pytest.raises(InvalidMessage):
        await store.write(cid, user_msgs(1, "x"), metadata={"n": math.nan})
    with pytest.raises(TypeError):
        await store.write(cid, user_msgs(1, "x"), metadata=[("n", 3)])  # type: ignore[arg-type]
    assert await store.count(cid) == 2
    # Without a key or position (the one-statement append otherwise) it merges too.
    await store.write(cid, user_msgs(1, "b"), metadata={"n": 3})
    assert (await store.count(cid), await store.metadata(cid)) == (3, {"n": 3, "kept": "k"})


async def test_a_write_whose_metadata_fails_stores_no_message(
    store: Store, cid: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    await store.write(cid, user_msgs(1, "a"))
    faults = Faults(monkeypatch)
    faults.fail_insert_into = "histstore_metadata"
    with pytest.raises(HistStoreError):
        await store.write(cid, user_msgs(2, "b"), at=1, metadata={"n": 1})
    faults.fail_insert_into = None
    assert await store.count(cid) == 1
    assert await store.metadata(cid) == {}


async def test_concurrent_saves_of_a_new_conversation(shared_backend: Any) -> None:
    """Saves racing to create one id all succeed; one of them wins whole."""
    c = new_id()
    states = [
        ConversationState(c, messages=user_msgs(i + 1, f"s{i}"), metadata={"who": i})
        for i in range(6)
    ]
    stores = [await shared_backend.connect() for _ in states]
    try:
        await asyncio.gather(*(st.save(state) for st, state in zip(stores, states, strict=True)))
        got = await stores[0].load(c)
    finally:
        for st in stores:
            await st.close()
    who = dict(got.metadata or {})["who"]
    assert [m.to_dict() for m in got.messages] == user_msgs(who + 1, f"s{who}")


# --------------------------------------------------------------------------- fork


async def test_fork_copies_everything(store: Store, cid: str) -> None:
    src = await fill(store, cid, user="u1")
    target = new_id()
    await store.fork(cid, target)
    got = await store.load(target)
    assert got.id == target
    assert messages_of(got) == messages_of(src)  # positions and times kept
    assert got.summaries == src.summaries
    assert got.metadata == src.metadata
    assert got.user == "u1"
    assert got.system_prompt == "you are a test"
    for name in ("events", "other"):
        assert await store.list_load(target, name) == await store.list_load(cid, name)
        assert await store.list_len(target, name) == await store.list_len(cid, name)
    assert await store.list_load(target, "events") == [{"e": 1}, b"\x00\xffraw", "two"]
    assert await store.count(target) == 5
    assert await store.conversations(user="u1") == sorted([cid, target])


@pytest.mark.parametrize("upto", [0, 1, 2, 3, 4])
async def test_fork_upto_keeps_prefix_and_summaries_ending_before(
    store: Store, cid: str, upto: int
) -> None:
    src = await fill(store, cid)  # 5 messages; summaries end at 1 and at 3
    target = new_id()
    await store.fork(cid, target, upto=upto)
    got = await store.load(target)
    assert messages_of(got) == messages_of(src)[:upto]
    assert got.summaries == tuple(s for s in src.summaries if s.end < upto)
    assert got.metadata == src.metadata
    assert got.system_prompt == src.system_prompt
    assert await store.list_load(target, "events") == await store.list_load(cid, "events")
    assert await store.count(target) == upto
    out = await store.write(target, [Message.user("continued")], at=upto)
    assert out.length == upto + 1


async def test_fork_upto_past_the_end_copies_everything(store: Store, cid: str) -> None:
    await store.write(cid, user_msgs(3))
    # A summary may stand for messages since popped (or not stored yet).
    await store.add_summary(cid, Summary(0, 2, "all three"))
    await store.add_summary(cid, Summary(0, 5, "reaches past the end"))
    src = await store.load(cid)
    for upto in (10, None):
        target = new_id()
        await store.fork(cid, target, upto=upto)
        got = await store.load(target)
        assert messages_of(got) == messages_of(src)
        # SPEC: the summaries that end before `upto` (all of them when None: a copy).
        assert got.summaries == src.summaries


async def test_fork_unknown_source(store: Store, cid: str) -> None:
    target = new_id()
    with pytest.raises(NotFound):
        await store.fork(cid, target)
    assert not await store.exists(target)
    assert not await store.exists(cid)


async def test_fork_onto_existing_target(store: Store, cid: str) -> None:
    await fill(store, cid)
    target = new_id()
    await store.write(target, [Message.user("mine")])
    rows = await raw_rows(store, target)
    with pytest.raises(ConflictError):
        await store.fork(cid, target)
    assert await raw_rows(store, target) == rows
    with pytest.raises(ConflictError):
        await store.fork(cid, cid)


async def test_fork_rejects_bad_arguments(store: Store, cid: str) -> None:
    await store.write(cid, user_msgs(1))
    with pytest.raises(InvalidId):
        await store.fork(cid, " bad")
    with pytest.raises(ValueError, match="upto"):
        await store.fork(cid, new_id(), upto=-1)


async def test_fork_then_continue_is_revert(store: Store, cid: str) -> None:
    await store.write(cid, user_msgs(6))
    await store.merge_metadata(cid, {"branch": "main"})
    await store.list_append(cid, "log", ["a", "b"])
    before = await raw_rows(store, cid)
    branch = new_id()
    await store.fork(cid, branch, upto=3)
    await store.write(branch, [Message.user("take two")], at=3)
    await store.merge_metadata(branch, {"branch": "retry", "extra": 1})
    await store.list_append(branch, "log", ["c"])
    await store.add_summary(branch, Summary(0, 3, "branch summary"))
    assert [m.content for m in await store.read(branch)] == ["m-0", "m-1", "m-2", "take two"]
    assert await store.list_load(branch, "log") == ["a", "b", "c"]
    assert await raw_rows(store, cid) == before
    assert [m.to_dict() for m in await store.read(cid)] == user_msgs(6)
    assert await store.metadata(cid) == {"branch": "main"}
    assert await store.summaries(cid) == []
    # Writes to the source after the fork do not reach the branch either.
    await store.write(cid, [Message.user("main goes on")])
    assert await store.count(branch) == 4


async def test_concurrent_forks_to_one_target(shared_backend: Any) -> None:
    """Of forks racing to create one target, one wins; the others get ConflictError.

    The forks come from different sources (forks of one source queue on its row lock).
    """
    sources, target = [new_id() for _ in range(6)], new_id()
    stores = [await shared_backend.connect() for _ in sources]
    try:
        for i, src in enumerate(sources):
            await stores[0].write(src, user_msgs(i + 1))
        results = await asyncio.gather(
            *(st.fork(src, target) for st, src in zip(stores, sources, strict=True)),
            return_exceptions=True,
        )
        n = await stores[0].count(target)
        assert 1 <= n <= len(sources)
    finally:
        for st in stores:
            await st.close()
    errors = [r for r in results if isinstance(r, BaseException)]
    assert len(errors) == len(stores) - 1
    assert all(isinstance(e, ConflictError) for e in errors), errors


# --------------------------------------------------------------------------- summaries


async def test_summaries_in_order_added(store: Store, cid: str) -> None:
    assert await store.summaries(cid) == []
    when = datetime(2023, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
    added = [
        Summary(5, 9, "later part"),
        Summary(0, 4, {"structured": True}, token_count=3, created_at=when),
        Summary(2, 3, "middle"),
        Summary(0, 0, "first"),
    ]
    for s in added:
        await store.add_summary(cid, s)
    got = await store.summaries(cid)
    assert [(s.start, s.end, s.content, s.token_count) for s in got] == [
        (s.start, s.end, s.content, s.token_count) for s in added
    ]
    assert got[1].created_at == when
    assert all(s.created_at is not None and s.created_at.tzinfo is not None for s in got)
    assert await store.exists(cid)  # add_summary creates the conversation
    assert (await store.load(cid)).summaries == tuple(got)


async def test_summaries_unknown_and_invalid(store: Store, cid: str) -> None:
    assert await store.summaries(cid) == []
    with pytest.raises(InvalidMessage):
        await store.add_summary(cid, Summary(0, 1, math.nan))
    assert not await store.exists(cid)
    with pytest.raises(InvalidMessage):
        Summary(3, 1, "end before start")
    with pytest.raises(InvalidId):
        await store.summaries("")
    with pytest.raises(InvalidId):
        await store.add_summary(" x", Summary(0, 0, "s"))


async def test_concurrent_add_summary_keeps_all(store: Store, cid: str) -> None:
    await asyncio.gather(*(store.add_summary(cid, Summary(i, i, f"s{i}")) for i in range(16)))
    got = await store.summaries(cid)
    assert sorted(s.content for s in got) == sorted(f"s{i}" for i in range(16))


# --------------------------------------------------------------------------- metadata


async def test_metadata_merge_semantics(store: Store, cid: str) -> None:
    with pytest.raises(NotFound):
        await store.metadata(cid)
    await store.merge_metadata(cid, {"a": 1, "b": {"x": None}, "c": "keep"})
    assert await store.exists(cid)  # merge creates the conversation
    assert await store.count(cid) == 0
    assert await store.metadata(cid) == {"a": 1, "b": {"x": None}, "c": "keep"}
    await store.merge_metadata(cid, {"a": [1, 2], "b": None, "d": False, "missing": None})
    assert await store.metadata(cid) == {"a": [1, 2], "c": "keep", "d": False}
    await store.merge_metadata(cid, {})
    assert await store.metadata(cid) == {"a": [1, 2], "c": "keep", "d": False}
    got = await store.metadata(cid)
    got["a"].append(3)
    got["new"] = 1
    assert await store.metadata(cid) == {"a": [1, 2], "c": "keep", "d": False}
    assert dict((await store.load(cid)).metadata or {}) == {"a": [1, 2], "c": "keep", "d": False}


async def test_metadata_empty_for_conversation_without_any(store: Store, cid: str) -> None:
    await store.write(cid, user_msgs(1))
    assert await store.metadata(cid) == {}
    assert (await store.load(cid)).metadata is None


async def test_metadata_values_round_trip(store: Store, cid: str) -> None:
    values = {f"k{i}": v for i, v in enumerate(TRICKY_VALUES) if v is not None}
    values["key \U0001f600 with spaces inside"] = "ok"
    await store.merge_metadata(cid, values)
    got = await store.metadata(cid)
    assert got == values
    for k, v in values.items():
        assert type(got[k]) is type(v)


@pytest.mark.parametrize("bad", BAD_JSON, ids=stable_id)
async def test_metadata_bad_value_writes_nothing(store: Store, cid: str, bad: Any) -> None:
    fresh = new_id()
    with pytest.raises(InvalidMessage):
        await store.merge_metadata(fresh, {"ok": 1, "bad": bad})
    assert not await store.exists(fresh)
    await store.merge_metadata(cid, {"a": 1})
    rows = await raw_rows(store, cid)
    with pytest.raises(InvalidMessage):
        await store.merge_metadata(cid, {"a": 2, "b": 3, "bad": bad})
    assert await raw_rows(store, cid) == rows


BAD_KEYS: list[Any] = ["\ud800", "a\udfffb", "x" * 300 + "\udc00", 7, None, b"k"]
ANY_KEYS = [
    "",
    " lead",
    "trail ",
    "nul\x00",
    "\x00",
    "\x01\x02",
    "\x01\x00\x01",
    "a\nb",
    "\x7f",
    "ü" * 255,
    "x" * 256,  # keys have no length limit (tests/test_metadata_keys.py)
    "\x00" * 200,
]


@pytest.mark.parametrize("key", ANY_KEYS, ids=stable_id)
async def test_metadata_keys_are_any_strings(store: Store, cid: str, key: str) -> None:
    """SPEC 5: keys are strings, NUL and control characters included, on every backend."""
    await store.merge_metadata(cid, {key: {"v": key}, "plain": 1})
    assert await store.metadata(cid) == {key: {"v": key}, "plain": 1}
    assert await store.conversations(metadata={key: {"v": key}}) == [cid]
    await store.merge_metadata(cid, {key: None})
    assert await store.metadata(cid) == {"plain": 1}
    await store.save(ConversationState(cid, metadata={key: 1}))
    assert (await store.load(cid)).metadata == {key: 1}


@pytest.mark.parametrize("key", BAD_KEYS, ids=stable_id)
async def test_metadata_bad_key_writes_nothing(store: Store, cid: str, key: Any) -> None:
    await store.merge_metadata(cid, {"a": 1})
    rows = await raw_rows(store, cid)
    for updates in ({"b": 2, key: 1}, {"b": 2, key: None}):
        with pytest.raises(InvalidMessage):
            await store.merge_metadata(cid, updates)
        assert await raw_rows(store, cid) == rows
    with pytest.raises(InvalidMessage):
        await store.save(ConversationState(cid, metadata={key: 1}))
    assert await raw_rows(store, cid) == rows


async def test_concurrent_merges_from_tasks_lose_nothing(store: Store, cid: str) -> None:
    async def merge(i: int) -> None:
        for j in range(3):
            await store.merge_metadata(cid, {f"task{i}-{j}": {"i": i, "j": j}})

    await asyncio.gather(*(merge(i) for i in range(32)))
    got = await store.metadata(cid)
    assert got == {f"task{i}-{j}": {"i": i, "j": j} for i in range(32) for j in range(3)}


_MERGE_CHILD = textwrap.dedent(
    """
    import asyncio, sys
    import histstore

    async def main(url, conversation, proc):
        async with histstore.connect(url) as store:
            async def merge(t):
                for j in range(5):
                    await store.merge_metadata(conversation, {f"p{proc}-t{t}-{j}": j})
            await asyncio.gather(*(merge(t) for t in range(4)))

    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3]))
    """
)


async def test_concurrent_merges_from_processes_lose_nothing(shared_backend: Any) -> None:
    c = new_id()
    procs = [
        await asyncio.create_subprocess_exec(
            PYTHON,
            "-c",
            _MERGE_CHILD,
            shared_backend.url,
            c,
            str(p),
            env=subprocess_env(),
            stderr=asyncio.subprocess.PIPE,
        )
        for p in range(3)
    ]
    results = [await p.communicate() for p in procs]
    for p, (_out, err) in zip(procs, results, strict=True):
        assert p.returncode == 0, err.decode()[-2000:]
    async with shared_backend.connect() as st:
        got = await st.metadata(c)
    assert got == {f"p{p}-t{t}-{j}": j for p in range(3) for t in range(4) for j in range(5)}


# --------------------------------------------------------------------------- named lists


async def test_list_round_trip_and_paging(store: Store, cid: str) -> None:
    items: list[Any] = [*TRICKY_VALUES, b"", b"\x00\x01\xff" * 100, bytearray(b"ba")]
    assert await store.list_append(cid, "items", items[:5]) == 5
    assert await store.list_append(cid, "items", items[5:]) == len(items)
    expected = [bytes(i) if isinstance(i, bytearray) else i for i in items]
    got = await store.list_load(cid, "items")
    assert got == expected
    for g, e in zip(got, expected, strict=True):
        assert type(g) is type(e)
    assert await store.list_len(cid, "items") == len(items)
    assert await store.list_load(cid, "items", start=3) == expected[3:]
    assert await store.list_load(cid, "items", start=3, limit=4) == expected[3:7]
    assert await store.list_load(cid, "items", limit=2) == expected[:2]
    assert await store.list_load(cid, "items", limit=0) == []
    assert await store.list_load(cid, "items", start=len(items)) == []
    assert await store.list_load(cid, "items", start=10_000) == []
    got[0] = "mutated"
    assert (await store.list_load(cid, "items"))[0] == expected[0]
    with pytest.raises(ValueError, match="start"):
        await store.list_load(cid, "items", start=-1)
    with pytest.raises(ValueError, match="limit"):
        await store.list_load(cid, "items", limit=-1)


async def test_lists_are_per_conversation_and_name(store: Store, cid: str) -> None:
    other = new_id()
    assert await store.list_append(cid, "a", [1]) == 1
    assert await store.list_append(cid, "b", [2, 2]) == 2
    assert await store.list_append(other, "a", [3, 3, 3]) == 3
    assert await store.list_append(cid, "a", []) == 1
    assert await store.list_load(cid, "a") == [1]
    assert await store.list_load(cid, "b") == [2, 2]
    assert await store.list_load(other, "a") == [3, 3, 3]
    assert await store.exists(other)  # list_append creates the conversation
    assert await store.count(other) == 0


async def test_list_never_written_is_empty(store: Store, cid: str) -> None:
    await store.write(cid, user_msgs(1))
    assert await store.list_load(cid, "never") == []
    assert await store.list_len(cid, "never") == 0
    unknown = new_id()
    with pytest.raises(NotFound):
        await store.list_load(unknown, "never")
    with pytest.raises(NotFound):
        await store.list_len(unknown, "never")
    assert not await store.exists(unknown)


@pytest.mark.parametrize("name", BAD_IDS, ids=stable_id)
async def test_list_bad_names(store: Store, cid: str, name: Any) -> None:
    await store.write(cid, user_msgs(1))
    rows = await raw_rows(store, cid)
    with pytest.raises(InvalidId):
        await store.list_append(cid, name, [1])
    with pytest.raises(InvalidId):
        await store.list_load(cid, name)
    with pytest.raises(InvalidId):
        await store.list_len(cid, name)
    assert await raw_rows(store, cid) == rows


@pytest.mark.parametrize("bad", [*BAD_JSON[:-1], [b"bytes inside JSON"]], ids=stable_id)
async def test_list_bad_items_write_nothing(store: Store, cid: str, bad: Any) -> None:
    fresh = new_id()
    with pytest.raises(InvalidMessage):
        await store.list_append(fresh, "l", [1, bad])
    assert not await store.exists(fresh)
    await store.list_append(cid, "l", [1])
    rows = await raw_rows(store, cid)
    with pytest.raises(InvalidMessage):
        await store.list_append(cid, "l", [2, bad, 3])
    assert await raw_rows(store, cid) == rows
    assert await store.list_load(cid, "l") == [1]


async def test_concurrent_list_appends_are_dense(store: Store, cid: str) -> None:
    tasks, per = 32, 4

    async def append(t: int) -> int:
        return await store.list_append(cid, "log", [{"t": t, "i": i} for i in range(per)])

    lengths = await asyncio.gather(*(append(t) for t in range(tasks)))
    assert sorted(lengths) == [per * (k + 1) for k in range(tasks)]
    items = await store.list_load(cid, "log")
    assert len(items) == tasks * per == await store.list_len(cid, "log")
    assert sorted((x["t"], x["i"]) for x in items) == [
        (t, i) for t in range(tasks) for i in range(per)
    ]
    # Each append is one block, in argument order, ending at the length it returned.
    for t, length in enumerate(lengths):
        assert items[length - per : length] == [{"t": t, "i": i} for i in range(per)]
    # Paging by index agrees with the whole list: indexes are dense from 0.
    assert await store.list_load(cid, "log", start=50, limit=7) == items[50:57]
    li = _schema.list_items
    async with store.engine.connect() as conn:
        idx = (
            await conn.execute(
                select(li.c.idx).where(li.c.conversation_id == cid).order_by(li.c.idx)
            )
        ).scalars()
        assert list(idx) == list(range(tasks * per))


# --------------------------------------------------------------------------- purge, clear


async def test_purge_removes_idle_keeps_recent(store: Store) -> None:
    idle, recent, no_msgs = new_id(), new_id(), new_id()
    for c in (idle, recent):
        await fill(store, c)
    await store.merge_metadata(no_msgs, {"x": 1})
    await make_old(store, idle)
    await make_old(store, no_msgs)
    await make_old(store, recent, datetime.now(timezone.utc) - timedelta(minutes=30))
    assert await store.purge(idle_for=timedelta(hours=1)) == 2
    assert not await store.exists(idle)
    assert not await store.exists(no_msgs)
    assert await store.exists(recent)
    assert await store.summaries(idle) == []
    assert await store.count(idle) == 0
    for c in (idle, no_msgs):
        assert all(rows == [] for rows in (await raw_rows(store, c)).values())
    assert await store.purge(idle_for=timedelta(hours=1)) == 0
    assert await store.load(recent)
    assert await store.purge(idle_for=timedelta(minutes=10)) == 1
    assert await store.conversations() == []


async def test_purge_many_conversations(store: Store) -> None:
    ids = [new_id() for _ in range(1203)]
    conv = _schema.conversations
    async with store.engine.begin() as conn:
        await conn.execute(
            conv.insert(),
            [
                {"id": c, "length": 0, "created_at": old_time(), "updated_at": old_time()}
                for c in ids
            ],
        )
    keep = new_id()
    await store.write(keep, user_msgs(1))
    assert await store.purge(idle_for=timedelta(days=1)) == len(ids)
    assert await store.conversations() == [keep]


CHANGES: dict[str, Callable[[Store, str], Awaitable[Any]]] = {
    "write": lambda st, c: st.write(c, [Message.user("new")]),
    "write-at": lambda st, c: st.write(c, [Message.user("new")], at=5),
    "pop": lambda st, c: st.pop(c),
    "add_summary": lambda st, c: st.add_summary(c, Summary(0, 1, "s")),
    "merge_metadata": lambda st, c: st.merge_metadata(c, {"changed": True}),
    "remove_metadata": lambda st, c: st.merge_metadata(c, {"topic": None}),
    "list_append": lambda st, c: st.list_append(c, "events", ["more"]),
    "save": lambda st, c: st.save(ConversationState(c, messages=user_msgs(1))),
}


@pytest.mark.parametrize("change", list(CHANGES))
async def test_every_change_counts_for_purge(store: Store, cid: str, change: str) -> None:
    await fill(store, cid)
    await make_old(store, cid)
    await CHANGES[change](store, cid)
    assert await store.purge(idle_for=timedelta(hours=1)) == 0
    assert await store.exists(cid)
    state = await store.load(cid)
    assert state.updated_at is not None
    assert state.updated_at > datetime.now(timezone.utc) - timedelta(minutes=5)


async def test_purge_arguments(store: Store) -> None:
    with pytest.raises(TypeError):
        await store.purge(idle_for=3600)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="idle_for"):
        await store.purge(idle_for=timedelta(seconds=-1))


async def test_clear_leaves_nothing(store: Store, cid: str) -> None:
    other = new_id()
    await fill(store, cid)
    await store.write(cid, user_msgs(2), idempotency_key="key-1")
    value = await store.edit(cid)  # an aside and a turn record too
    value.add_aside({"note": 1})
    value.open_turn()
    await store.commit(value)
    await fill(store, other)
    other_rows = await raw_rows(store, other)
    rows = await raw_rows(store, cid)
    assert all(rows.values()), rows.keys()
    await store.clear(cid)
    assert all(r == [] for r in (await raw_rows(store, cid)).values())
    assert await raw_rows(store, other) == other_rows
    with pytest.raises(NotFound):
        await store.load(cid)
    with pytest.raises(NotFound):
        await store.list_load(cid, "events")
    assert await store.summaries(cid) == []
    await store.clear(cid)  # idempotent
    # The id can be used again from scratch.
    await store.list_append(cid, "events", ["again"])
    assert await store.list_load(cid, "events") == ["again"]
    assert await store.write(cid, user_msgs(2), idempotency_key="key-1") is not None
    assert await store.count(cid) == 2


def test_tables_are_covered() -> None:
    """The raw-row checks above look at every table that holds a conversation's rows."""
    keyed = {t.name for t in _schema.metadata.sorted_tables if "conversation_id" in t.c}
    assert keyed == {t.name for t in _schema.CONVERSATION_TABLES}
    names = {_schema.conversations.name, *keyed}
    assert names == {
        "histstore_conversations",
        "histstore_messages",
        "histstore_writes",
        "histstore_summaries",
        "histstore_metadata",
        "histstore_lists",
        "histstore_list_items",
        "histstore_vectors",
        "histstore_vector_marks",
        "histstore_changes",
        "histstore_asides",
        "histstore_turns",
    }
