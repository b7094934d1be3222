"""``Store.stream``: a conversation's messages oldest first, read a page at a time."""

from __future__ import annotations

from typing import Any

import pytest
from helpers import user_msgs
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import histstore
from histstore import HistStoreError, InvalidId, Message


async def streamed(messages: Any) -> list[Message]:
    return [m async for m in messages]


def contents(messages: list[Message]) -> list[Any]:
    return [m.content for m in messages]


async def test_stream_gives_what_read_gives(store: histstore.Store, cid: str) -> None:
    await store.write(cid, user_msgs(7))
    got = await streamed(store.stream(cid, page=3))
    assert got == await store.read(cid)
    assert [m.position for m in got] == list(range(7))
    assert [(m.created_at, m.entry_id, m.author) for m in got] == [
        (m.created_at, m.entry_id, m.author) for m in await store.read(cid)
    ]


async def test_stream_slices_by_position(store: histstore.Store, cid: str) -> None:
    await store.write(cid, user_msgs(10))
    assert contents(await streamed(store.stream(cid, start=3, stop=8, page=2))) == [
        f"m-{i}" for i in range(3, 8)
    ]
    assert await streamed(store.stream(cid, start=4, stop=4)) == []
    assert await streamed(store.stream(cid, start=9, stop=2)) == []
    assert contents(await streamed(store.stream(cid, start=8, stop=99))) == ["m-8", "m-9"]
    assert await streamed(store.stream(cid, start=10)) == []


async def test_unknown_conversation_streams_nothing(store: histstore.Store, cid: str) -> None:
    assert await streamed(store.stream(cid)) == []


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"start": -1}, ValueError),
        ({"stop": -1}, ValueError),
        ({"page": 0}, ValueError),
        ({"page": "10"}, TypeError),
        ({"start": None}, TypeError),
    ],
)
async def test_arguments_are_checked_when_called(
    store: histstore.Store, cid: str, kwargs: dict[str, Any], error: type[Exception]
) -> None:
    with pytest.raises(error):
        store.stream(cid, **kwargs)


def test_bad_id_raises_when_called(store: histstore.Store) -> None:
    with pytest.raises(InvalidId):
        store.stream("")


async def test_a_closed_store_raises_when_iterated(backend: Any, cid: str) -> None:
    async with backend.connect() as store:
        await store.write(cid, user_msgs(2))
        messages = store.stream(cid)
    with pytest.raises(HistStoreError):
        await streamed(messages)


async def test_messages_appended_after_the_start_are_not_included(
    store: histstore.Store, cid: str
) -> None:
    await store.write(cid, user_msgs(5))
    got: list[Message] = []
    async for m in store.stream(cid, page=2):
        got.append(m)
        if m.position == 0:
            await store.write(cid, user_msgs(3, "late"))
    assert contents(got) == [f"m-{i}" for i in range(5)]
    # Streaming on from the last position gives the rest.
    rest = await streamed(store.stream(cid, start=(got[-1].position or 0) + 1))
    assert contents(rest) == [f"late-{i}" for i in range(3)]


async def test_a_clear_during_the_iteration_ends_it(store: histstore.Store, cid: str) -> None:
    await store.write(cid, user_msgs(6))
    got: list[Message] = []
    async for m in store.stream(cid, page=2):
        got.append(m)
        if m.position == 1:
            await store.clear(cid)
    assert contents(got) == ["m-0", "m-1"]


async def test_a_pop_during_the_iteration_ends_it_at_the_new_end(
    store: histstore.Store, cid: str
) -> None:
    await store.write(cid, user_msgs(6))
    got: list[Message] = []
    async for m in store.stream(cid, page=2):
        got.append(m)
        if m.position == 1:
            await store.pop(cid)
    assert contents(got) == [f"m-{i}" for i in range(5)]


async def test_pages_are_separate_reads(store: histstore.Store, cid: str) -> None:
    """Between pages the iteration holds nothing: another task's writes go through."""
    await store.write(cid, user_msgs(4))
    other = cid + "-other"
    async for m in store.stream(cid, page=1):
        await store.write(other, [Message.user(f"while {m.position}")])
    assert await store.count(other) == 4


@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    n=st.integers(0, 30),
    start=st.integers(0, 35),
    stop=st.none() | st.integers(0, 35),
    page=st.integers(1, 12),
)
async def test_stream_round_trips_like_read(
    store: histstore.Store, n: int, start: int, stop: int | None, page: int
) -> None:
    cid = f"h-{n}"
    if await store.count(cid) != n:
        await store.clear(cid)
        await store.write(cid, user_msgs(n))
    got = await streamed(store.stream(cid, start=start, stop=stop, page=page))
    assert got == await store.read(cid, start=start, stop=stop)
    assert [m.position for m in got] == [
        m.position for m in await store.read(cid, start=start, stop=stop)
    ]
