"""History operations (SPEC section 4): read, count, write, pop, clear, conversations, exists."""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from helpers import new_id, snapshot, stable_id, user_msgs
from waiting import clock_tick

import histstore
from histstore import ConflictError, InvalidId, InvalidMessage, Message, WriteError, WriteOutcome

MARKER = "SECRET-CONTENT-91c2"

BAD_IDS = ["", " x", "x ", "a\x00b", "a\nb", "x" * 256, "a\ud800", None, 7, b"x"]


def contents(messages: list[Message]) -> list[Any]:
    return [m.content for m in messages]


def positions(messages: list[Message]) -> list[int | None]:
    return [m.position for m in messages]


# ---------------------------------------------------------------- read


async def test_unknown_conversation_is_empty(store: histstore.Store, cid: str) -> None:
    assert await store.read(cid) == []
    assert await store.read(cid, limit=5, start=1, stop=9) == []
    assert await store.count(cid) == 0
    assert await store.exists(cid) is False
    assert await store.pop(cid) is None


async def test_read_returns_stored_order_positions_and_utc_times(
    store: histstore.Store, cid: str
) -> None:
    before = datetime.now(timezone.utc)
    await store.write(cid, user_msgs(3, "a"))
    await store.write(cid, [Message.assistant("b-0")])
    after = datetime.now(timezone.utc)
    got = await store.read(cid)
    assert contents(got) == ["a-0", "a-1", "a-2", "b-0"]
    assert positions(got) == [0, 1, 2, 3]
    for m in got:
        assert m.created_at is not None
        assert m.created_at.tzinfo is not None
        assert m.created_at.utcoffset() == timedelta(0)
        assert before - timedelta(seconds=2) <= m.created_at <= after + timedelta(seconds=2)
    assert got[0].created_at <= got[3].created_at  # type: ignore[operator]


async def test_every_read_gives_a_message_the_time_it_was_stored_with(
    store: histstore.Store, cid: str
) -> None:
    # A whole read, a short one, a stream's page, the system messages and a pop (the
    # row it deleted, as stored) agree to the microsecond.
    await store.write(cid, [Message.system("s"), Message.user("u")])
    whole = await store.read(cid)
    newest = await store.read(cid, limit=1)
    streamed = [m async for m in store.stream(cid)]
    system = await store.system_messages(cid)
    popped = await store.pop(cid)
    assert popped is not None
    times = [m.created_at for m in [*whole, *newest, *streamed, *system, popped]]
    assert times == [popped.created_at] * 7
    assert all(t is not None and t.tzinfo is not None for t in times)


async def test_start_stop_limit_slice_then_keep_the_newest(
    store: histstore.Store, cid: str
) -> None:
    await store.write(cid, user_msgs(10))
    cases: list[tuple[dict[str, Any], list[int]]] = [
        ({}, list(range(10))),
        ({"start": 3}, list(range(3, 10))),
        ({"stop": 4}, [0, 1, 2, 3]),
        ({"start": 2, "stop": 5}, [2, 3, 4]),
        ({"start": 5, "stop": 5}, []),
        ({"start": 6, "stop": 2}, []),
        ({"start": 10}, []),
        ({"start": 50}, []),
        ({"stop": 50}, list(range(10))),
        ({"stop": 0}, []),
        ({"limit": 3}, [7, 8, 9]),
        ({"limit": 0}, []),
        ({"limit": 50}, list(range(10))),
        ({"start": 2, "stop": 6, "limit": 2}, [4, 5]),
        ({"start": 8, "limit": 5}, [8, 9]),
        ({"stop": 3, "limit": 10}, [0, 1, 2]),
        ({"stop": 7, "limit": 3}, [4, 5, 6]),
    ]
    for kwargs, expected in cases:
        got = await store.read(cid, **kwargs)
        assert positions(got) == expected, kwargs
        assert contents(got) == [f"m-{p}" for p in expected], kwargs


async def test_paging_backwards_visits_every_message_once(store: histstore.Store, cid: str) -> None:
    await store.write(cid, user_msgs(23))
    pages: list[list[Message]] = []
    page = await store.read(cid, limit=5)
    while page:
        pages.append(page)
        assert len(page) <= 5
        page = await store.read(cid, stop=page[0].position, limit=5)
    assert [len(p) for p in pages] == [5, 5, 5, 5, 3]
    flat = [m for p in reversed(pages) for m in p]
    assert positions(flat) == list(range(23))
    assert contents(flat) == [f"m-{i}" for i in range(23)]


@pytest.mark.parametrize("kwargs", [{"limit": -1}, {"start": -1}, {"stop": -1}, {"stop": -5}])
async def test_negative_read_arguments_raise_value_error(
    store: histstore.Store, cid: str, kwargs: dict[str, int]
) -> None:
    await store.write(cid, user_msgs(2))
    with pytest.raises(ValueError):  # noqa: PT011 - the contract says ValueError
        await store.read(cid, **kwargs)


async def test_read_returns_fresh_values(store: histstore.Store, cid: str) -> None:
    batch: list[dict[str, Any]] = [
        {"role": "user", "content": [{"type": "text", "text": "hi"}], "meta": {"k": [1]}},
        {"role": "assistant", "content": "ok"},
    ]
    await store.write(cid, batch)
    first = await store.read(cid)
    d = first[0].to_dict()
    d["content"][0]["text"] = "changed"
    d["meta"]["k"].append(2)
    d["role"] = "system"
    first[0].content.append({"type": "text", "text": "more"})
    first[0].get("meta")["k"].clear()
    first.clear()
    again = await store.read(cid)
    assert [m.to_dict() for m in again] == batch
    assert again is not first


async def test_mutating_the_written_dicts_afterwards_changes_nothing_stored(
    store: histstore.Store, cid: str
) -> None:
    batch: list[dict[str, Any]] = [{"role": "user", "content": ["a"]}]
    await store.write(cid, batch)
    batch[0]["content"].append("b")
    batch.append({"role": "user", "content": "c"})
    assert [m.to_dict() for m in await store.read(cid)] == [{"role": "user", "content": ["a"]}]


# ---------------------------------------------------------------- write


async def test_write_appends_and_reports_the_outcome(store: histstore.Store, cid: str) -> None:
    out = await store.write(cid, user_msgs(3, "a"))
    assert out == WriteOutcome(accepted=3, uncertain=False, length=3)
    out = await store.write(cid, (Message.assistant(f"b-{i}") for i in range(2)))
    assert out == WriteOutcome(accepted=2, uncertain=False, length=5)
    assert await store.count(cid) == 5
    assert contents(await store.read(cid)) == ["a-0", "a-1", "a-2", "b-0", "b-1"]


async def test_write_takes_messages_and_dicts_mixed(store: histstore.Store, cid: str) -> None:
    await store.write(
        cid,
        [
            Message.system("s"),
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "1"},
        ],
    )
    got = await store.read(cid)
    assert [m.role for m in got] == ["system", "function_call", "function_call_output"]


async def test_write_at_count_is_an_optimistic_append(store: histstore.Store, cid: str) -> None:
    out = await store.write(cid, user_msgs(2, "a"), at=0)
    assert out == WriteOutcome(2, False, 2)
    out = await store.write(cid, user_msgs(1, "b"), at=2)
    assert out == WriteOutcome(1, False, 3)
    assert contents(await store.read(cid)) == ["a-0", "a-1", "b-0"]


@pytest.mark.parametrize("held", [0, 3])
async def test_write_at_past_the_end_is_a_gap_conflict(
    store: histstore.Store, cid: str, held: int
) -> None:
    if held:
        await store.write(cid, user_msgs(held))
    before = await snapshot(store, cid)
    with pytest.raises(ConflictError) as info:
        await store.write(cid, [Message.user(MARKER)], at=held + 1)
    assert info.value.outcome is not None
    assert info.value.outcome.accepted == 0
    assert info.value.outcome.uncertain is False
    assert not isinstance(info.value, WriteError)
    assert MARKER not in str(info.value)
    assert cid in str(info.value)
    assert await snapshot(store, cid) == before


async def test_retry_at_same_position_confirms_without_duplicating(
    store: histstore.Store, cid: str
) -> None:
    batch = user_msgs(3)
    await store.write(cid, batch, at=0)
    out = await store.write(cid, batch, at=0)
    assert out == WriteOutcome(3, False, 3)
    out = await store.write(cid, batch[1:], at=1)
    assert out == WriteOutcome(2, False, 3)
    assert contents(await store.read(cid)) == ["m-0", "m-1", "m-2"]


async def test_overlap_compares_dict_form_not_key_order(store: histstore.Store, cid: str) -> None:
    await store.write(cid, [{"role": "user", "content": "x", "name": "n"}])
    out = await store.write(
        cid, [Message.from_dict({"name": "n", "content": "x", "role": "user"})], at=0
    )
    assert out.accepted == 1
    assert await store.count(cid) == 1


async def test_partial_overlap_appends_the_rest(store: histstore.Store, cid: str) -> None:
    await store.write(cid, user_msgs(2))
    out = await store.write(cid, user_msgs(5)[1:], at=1)
    assert out == WriteOutcome(4, False, 5)
    got = await store.read(cid)
    assert contents(got) == [f"m-{i}" for i in range(5)]
    assert positions(got) == list(range(5))


@pytest.mark.parametrize("differs_at", [0, 1])
async def test_overlap_that_differs_conflicts_and_writes_nothing(
    store: histstore.Store, cid: str, differs_at: int
) -> None:
    await store.write(cid, user_msgs(3))
    before = await snapshot(store, cid)
    batch: list[Any] = user_msgs(4)[1:]
    batch[differs_at] = Message.user(MARKER)
    with pytest.raises(ConflictError) as info:
        await store.write(cid, batch, at=1)
    assert info.value.outcome is not None
    assert (info.value.outcome.accepted, info.value.outcome.uncertain) == (0, False)
    assert MARKER not in str(info.value)
    assert await snapshot(store, cid) == before


async def test_idempotency_key_confirms_a_repeated_batch(store: histstore.Store, cid: str) -> None:
    batch = user_msgs(2, "a")
    assert await store.write(cid, batch, idempotency_key="k1") == WriteOutcome(2, False, 2)
    await store.write(cid, user_msgs(1, "b"))
    before = await snapshot(store, cid)
    out = await store.write(cid, batch, idempotency_key="k1")
    assert (out.accepted, out.uncertain) == (2, False)
    assert out.length in (3, None)
    assert await snapshot(store, cid) == before
    assert contents(await store.read(cid)) == ["a-0", "a-1", "b-0"]


async def test_used_idempotency_key_with_another_batch_conflicts(
    store: histstore.Store, cid: str
) -> None:
    await store.write(cid, user_msgs(2), idempotency_key="k1")
    before = await snapshot(store, cid)
    for other in ([Message.user(MARKER)], user_msgs(3), user_msgs(2)[::-1], user_msgs(1)):
        with pytest.raises(ConflictError) as info:
            await store.write(cid, other, idempotency_key="k1")
        assert info.value.outcome is not None
        assert (info.value.outcome.accepted, info.value.outcome.uncertain) == (0, False)
        assert MARKER not in str(info.value)
    assert await snapshot(store, cid) == before


async def test_idempotency_key_confirms_an_equal_batch_with_keys_reordered(
    store: histstore.Store, cid: str
) -> None:
    first = [{"role": "user", "content": "hi", "name": "ann"}]
    again = [{"name": "ann", "content": "hi", "role": "user"}]  # equal as dicts
    await store.write(cid, first, idempotency_key="k")
    outcome = await store.write(cid, again, idempotency_key="k")
    assert outcome == WriteOutcome(1, False, 1)
    assert await store.count(cid) == 1
    with pytest.raises(ConflictError):
        await store.write(cid, [{"role": "user", "content": "other"}], idempotency_key="k")


async def test_empty_batch_creates_the_conversation_and_writes_nothing(
    store: histstore.Store, cid: str
) -> None:
    assert await store.write(cid, []) == WriteOutcome(0, False, 0)
    assert await store.exists(cid)
    assert await store.read(cid) == []
    await store.write(cid, [Message.user("a")])
    assert await store.write(cid, [], at=1) == WriteOutcome(0, False, 1)
    with pytest.raises(ConflictError):
        await store.write(cid, [], at=3)


async def test_idempotency_keys_are_per_conversation(store: histstore.Store) -> None:
    a, b = new_id(), new_id()
    await store.write(a, user_msgs(2), idempotency_key="same")
    await store.write(b, user_msgs(2), idempotency_key="same")
    await store.write(b, user_msgs(1, "other"), idempotency_key="k2")
    assert await store.count(a) == 2
    assert await store.count(b) == 3


@pytest.mark.parametrize("key", ["", " k", "k\x00", "x" * 256, 5])
async def test_bad_idempotency_key_is_invalid_id(
    store: histstore.Store, cid: str, key: Any
) -> None:
    with pytest.raises(InvalidId):
        await store.write(cid, user_msgs(1), idempotency_key=key)
    assert await store.exists(cid) is False


# ---------------------------------------------------------------- pop, clear, exists


async def test_pop_removes_the_newest(store: histstore.Store, cid: str) -> None:
    await store.write(cid, user_msgs(3))
    m = await store.pop(cid)
    assert m == Message.user("m-2")
    assert m is not None
    assert m.position == 2
    assert await store.count(cid) == 2
    await store.write(cid, [Message.user("new")])
    got = await store.read(cid)
    assert contents(got) == ["m-0", "m-1", "new"]
    assert positions(got) == [0, 1, 2]
    assert contents([await store.pop(cid) for _ in range(3)]) == ["new", "m-1", "m-0"]  # type: ignore[misc]
    assert await store.pop(cid) is None
    assert await store.count(cid) == 0


async def test_clear_removes_everything_and_is_idempotent(store: histstore.Store) -> None:
    a, b = new_id(), new_id()
    await store.write(a, user_msgs(3), idempotency_key="k")
    await store.write(b, user_msgs(1))
    await store.clear(a)
    assert await store.exists(a) is False
    assert await store.count(a) == 0
    assert await store.read(a) == []
    assert a not in await store.conversations()
    await store.clear(a)
    await store.clear(new_id())
    assert await store.count(b) == 1
    # The id is reusable and starts empty; the old idempotency record is gone too.
    out = await store.write(a, user_msgs(2, "again"), idempotency_key="k")
    assert out == WriteOutcome(2, False, 2)
    got = await store.read(a)
    assert contents(got) == ["again-0", "again-1"]
    assert positions(got) == [0, 1]


async def test_exists(store: histstore.Store, cid: str) -> None:
    assert await store.exists(cid) is False
    await store.write(cid, user_msgs(1))
    assert await store.exists(cid) is True
    await store.pop(cid)
    assert await store.exists(cid) is True
    await store.clear(cid)
    assert await store.exists(cid) is False


# ---------------------------------------------------------------- conversations()


async def test_conversations_of_an_empty_store(store: histstore.Store) -> None:
    assert await store.conversations() == []
    assert await store.conversations(order="updated", descending=True, limit=3) == []


async def test_conversations_order_by_id_is_code_point_order(store: histstore.Store) -> None:
    ids = ["b", "a", "B", "a1", "\u00e9", "\U0001f600", "\uffef", "z", "A b", "~"]
    for i in ids:
        await store.write(i, user_msgs(1))
    assert await store.conversations() == sorted(ids)
    assert await store.conversations(order="id", descending=True) == sorted(ids, reverse=True)
    assert await store.conversations(limit=3, offset=2) == sorted(ids)[2:5]
    assert await store.conversations(limit=3, offset=8) == sorted(ids)[8:]
    assert await store.conversations(offset=20) == []
    assert await store.conversations(limit=0) == []


async def test_conversations_order_by_created_and_updated(store: histstore.Store) -> None:
    ids = ["c", "b", "a"]  # created in this order: the reverse of id order
    for i in ids:
        await store.write(i, user_msgs(1))
        await clock_tick()  # the next conversation is created later
    assert await store.conversations(order="created") == ["c", "b", "a"]
    assert await store.conversations(order="created", descending=True) == ["a", "b", "c"]
    assert await store.conversations(order="updated") == ["c", "b", "a"]
    await store.write("c", user_msgs(1, "later"))
    assert await store.conversations(order="updated") == ["b", "a", "c"]
    assert await store.conversations(order="updated", descending=True) == ["c", "a", "b"]
    assert await store.conversations(order="created") == ["c", "b", "a"]
    assert await store.conversations(order="updated", limit=2, offset=1) == ["a", "c"]


@pytest.mark.parametrize("kwargs", [{"order": "name"}, {"limit": -1}, {"offset": -1}])
async def test_conversations_rejects_bad_arguments(
    store: histstore.Store, kwargs: dict[str, Any]
) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 - the contract says ValueError
        await store.conversations(**kwargs)


async def test_conversations_filters_by_user(store: histstore.Store) -> None:
    alice, bob = store.scoped("alice"), store.scoped("bob")
    a1, a2, b1, nobody = "a1", "a2", "b1", "n1"
    await alice.write(a2, user_msgs(1))
    await alice.write(a1, user_msgs(1))
    await bob.write(b1, user_msgs(1))
    await store.write(nobody, user_msgs(1))
    assert await store.conversations(user="alice") == [a1, a2]
    assert await store.conversations(user="bob") == [b1]
    assert await store.conversations(user="carol") == []
    assert await store.conversations() == [a1, a2, b1, nobody]
    assert await alice.conversations() == [a1, a2]
    assert await bob.conversations(order="created", descending=True) == [b1]
    with pytest.raises(InvalidId):
        await store.conversations(user=" alice")


async def test_conversations_filters_by_metadata(store: histstore.Store) -> None:
    a, b, c, plain = "a", "b", "c", "d"
    await store.merge_metadata(a, {"topic": "billing", "n": 1, "tags": {"x": [1, 2], "y": None}})
    await store.merge_metadata(b, {"topic": "billing", "n": 2})
    await store.merge_metadata(c, {"topic": "support", "n": 1})
    await store.write(plain, user_msgs(1))
    assert await store.conversations(metadata={"topic": "billing"}) == [a, b]
    assert await store.conversations(metadata={"topic": "billing", "n": 1}) == [a]
    assert await store.conversations(metadata={"n": 1}) == [a, c]
    assert await store.conversations(metadata={"tags": {"y": None, "x": [1, 2]}}) == [a]
    assert await store.conversations(metadata={"tags": {"x": [2, 1], "y": None}}) == []
    assert await store.conversations(metadata={"topic": "none"}) == []
    assert await store.conversations(metadata={"topic": "billing"}, descending=True) == [b, a]
    assert await store.conversations(metadata={"topic": "billing"}, limit=1, offset=1) == [b]


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize("bad", BAD_IDS, ids=stable_id)
async def test_every_method_validates_the_id(store: histstore.Store, cid: str, bad: Any) -> None:
    await store.write(cid, user_msgs(2))
    before = await snapshot(store, cid)
    listed = await store.conversations()
    calls: list[Callable[[], Awaitable[object]]] = [
        lambda: store.read(bad),
        lambda: store.count(bad),
        lambda: store.write(bad, user_msgs(1)),
        lambda: store.write(bad, user_msgs(1), at=0, idempotency_key="k"),
        lambda: store.pop(bad),
        lambda: store.clear(bad),
        lambda: store.exists(bad),
    ]
    if bad is not None:  # user=None means "every user"
        calls.append(lambda: store.conversations(user=bad))
    for call in calls:
        with pytest.raises(InvalidId):
            await call()
    assert await snapshot(store, cid) == before
    assert await store.conversations() == listed


class _NotJson:
    pass


BAD_BATCHES: list[Any] = [
    pytest.param(MARKER, id="a-string"),
    pytest.param({"role": "user", "content": MARKER}, id="a-single-dict"),
    pytest.param(Message.user(MARKER), id="a-single-message"),
    pytest.param([MARKER], id="string-item"),
    pytest.param([{"content": MARKER}], id="no-role"),
    pytest.param([{"role": "user", "content": MARKER, "x": _NotJson()}], id="not-json"),
    pytest.param([{"role": "user", "content": MARKER, "x": math.nan}], id="nan"),
    pytest.param([{"role": "user", "content": MARKER + "\udc80"}], id="lone-surrogate"),
    pytest.param([{"role": "user", "content": {1: MARKER}}], id="int-key"),
    pytest.param(
        [*user_msgs(2), {"role": "user", "content": MARKER, "x": math.inf}, *user_msgs(2)],
        id="one-bad-among-good",
    ),
]


@pytest.mark.parametrize("batch", BAD_BATCHES)
@pytest.mark.parametrize("existing", [0, 2], ids=["new", "existing"])
async def test_invalid_batch_writes_nothing(
    store: histstore.Store, cid: str, batch: Any, existing: int
) -> None:
    if existing:
        await store.write(cid, user_msgs(existing))
    before = await snapshot(store, cid)
    for kwargs in ({}, {"at": existing}, {"idempotency_key": "k"}):
        with pytest.raises(InvalidMessage) as info:
            await store.write(cid, batch, **kwargs)
        assert MARKER not in str(info.value)
    assert await snapshot(store, cid) == before
    # The key was not used up by the failed write.
    await store.write(cid, user_msgs(1, "ok"), idempotency_key="k")
    assert await store.count(cid) == existing + 1


async def test_message_size_limit(backend: Any, cid: str) -> None:
    async with backend.connect(max_message_bytes=1000) as store:
        await store.write(cid, user_msgs(1))
        before = await snapshot(store, cid)
        fits = {"role": "user", "content": "x" * 900}
        assert Message.from_dict(fits).size <= 1000
        too_big = {"role": "user", "content": MARKER + "\u00e9" * 500}  # > 1000 bytes as UTF-8
        assert len(str(too_big)) < 1000
        with pytest.raises(InvalidMessage) as info:
            await store.write(cid, [fits, too_big, fits])
        assert MARKER not in str(info.value)
        assert await snapshot(store, cid) == before
        await store.write(cid, [fits])
        assert await store.count(cid) == 2


async def test_batch_size_limit(backend: Any, cid: str) -> None:
    async with backend.connect(max_batch=3) as store:
        await store.write(cid, user_msgs(1))
        before = await snapshot(store, cid)
        with pytest.raises(InvalidMessage) as info:
            await store.write(cid, [*user_msgs(3), Message.user(MARKER)])
        assert MARKER not in str(info.value)
        assert await snapshot(store, cid) == before
        assert (await store.write(cid, user_msgs(3))).accepted == 3
        assert await store.count(cid) == 4


async def test_default_limits_accept_large_batches(store: histstore.Store, cid: str) -> None:
    out = await store.write(cid, user_msgs(10_000))
    assert out == WriteOutcome(10_000, False, 10_000)
    with pytest.raises(InvalidMessage):
        await store.write(cid, user_msgs(10_001))
    assert await store.count(cid) == 10_000
    assert contents(await store.read(cid, limit=2)) == ["m-9998", "m-9999"]
