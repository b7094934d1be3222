"""``close()`` at its edges, on every backend: the calls a store took before ``close()``
began end as they would have without it (close waits for them), a call begun after it
is refused as the closed store; and a ``close()`` from inside one of the store's own
transactions raises at once instead of waiting for itself."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import reach
from conftest import Backend
from helpers import new_id, user_msgs

import histstore

_WRITERS = 12  # more than a store sends at once, so that some queue (append groups)
_ROUNDS = 6  # a race: each round closes at a slightly different moment


async def _calls(store: histstore.Store, c: str, i: int) -> Any:
    """One caller's call: common appends (grouped on Postgres), a few keyed writes
    (a program), and reads of the newest messages (grouped on Postgres)."""
    if i % 4 == 3:
        return await store.read(c, limit=5)
    key = f"k-{i}" if i % 4 == 2 else None
    return await store.write(c, user_msgs(1, tag=f"w{i}"), idempotency_key=key)


@pytest.mark.parametrize("yields", [0, 1, 2, 3, 5])
async def test_calls_begun_before_close_end_as_their_own_and_later_ones_are_refused(
    backend: Backend, yields: int
) -> None:
    for _ in range(_ROUNDS):
        store = await backend.connect()
        c = new_id()
        tasks = [asyncio.ensure_future(_calls(store, c, i)) for i in range(_WRITERS)]
        for _ in range(yields):  # 0: none has begun yet; from 1 on: all have
            await asyncio.sleep(0)
        async with asyncio.timeout(30):  # (not wait_for: its task would start last)
            await store.close()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        written = []
        for i, result in enumerate(results):
            if yields == 0:  # begun after close began: refused, nothing written
                assert isinstance(result, histstore.HistStoreError), result
                assert "closed" in str(result)
                if i % 4 != 3:
                    assert result.outcome is not None
                    assert (result.outcome.accepted, result.outcome.uncertain) == (0, False)
                continue
            assert not isinstance(result, BaseException), repr(result)
            if i % 4 != 3:
                assert result.accepted == 1
                written.append(result.length)
        writes = sum(1 for i in range(_WRITERS) if i % 4 != 3)
        assert sorted(written) == ([] if yields == 0 else list(range(1, writes + 1)))
        if backend.shared:  # (a store in memory takes its database with it)
            async with backend.connect() as again:
                stored = [m.content for m in await again.read(c)]
            expected = [f"w{i}-0" for i in range(_WRITERS) if i % 4 != 3]
            assert sorted(stored) == ([] if yields == 0 else sorted(expected))


async def test_a_write_between_its_steps_when_close_begins_is_stored(backend: Backend) -> None:
    store = await backend.connect()
    c = new_id()
    big = {"role": "user", "content": "x" * 200_000}  # encoded in a thread, off the loop
    write = asyncio.ensure_future(store.write(c, [big]))
    await asyncio.sleep(0)  # it began: its batch is being encoded, no statement sent yet
    async with asyncio.timeout(30):
        await store.close()
    outcome = await write
    assert (outcome.accepted, outcome.length) == (1, 1)
    if backend.shared:
        async with backend.connect() as again:
            assert await again.read(c) == [histstore.Message.from_dict(big)]


async def _close_inside(store: histstore.Store, c: str, tag: str, *, fail: bool) -> None:
    """``close()`` inside a transaction of the store's own that appended a message."""
    async with reach.writing_in_a_transaction(store, c, user_msgs(1, tag=tag)):
        with pytest.raises(histstore.HistStoreError, match="inside"):
            await asyncio.wait_for(store.close(), 10)
        assert not store.closed
        if fail:
            raise RuntimeError("out")  # the transaction rolls back


async def test_a_close_inside_the_stores_own_transaction_raises_at_once(
    backend: Backend,
) -> None:
    store = await backend.connect()
    c = new_id()
    await store.write(c, user_msgs(1))
    with pytest.raises(RuntimeError, match="out"):
        await _close_inside(store, c, "undone", fail=True)
    await _close_inside(store, c, "kept", fail=False)
    # The store goes on as if close() had not been called, and closes after.
    outcome = await asyncio.wait_for(store.write(c, user_msgs(1, tag="after")), 10)
    assert outcome.length == 3
    assert [m.content for m in await store.read(c)] == ["m-0", "kept-0", "after-0"]
    await asyncio.wait_for(store.close(), 10)
    assert store.closed
    with pytest.raises(histstore.HistStoreError, match="closed"):
        await store.read(c)


async def test_a_call_begun_while_close_waits_is_refused_and_a_cancelled_close_goes_on(
    backend: Backend,
) -> None:
    store = await backend.connect()
    c = new_id()
    held, release = asyncio.Event(), asyncio.Event()

    async def hold() -> None:
        async with reach.holding_the_write_turn(store):
            held.set()
            await release.wait()

    holder = asyncio.ensure_future(hold())
    await asyncio.wait_for(held.wait(), 10)
    first = asyncio.ensure_future(store.close())
    await asyncio.sleep(0.05)
    assert not first.done()  # it waits for the transaction it found
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    # Still closing: a call begun now is refused at once, having done nothing.
    with pytest.raises(histstore.HistStoreError, match="closed") as caught:
        await asyncio.wait_for(store.write(c, user_msgs(1)), 10)
    assert caught.value.outcome is not None
    assert (caught.value.outcome.accepted, caught.value.outcome.uncertain) == (0, False)
    with pytest.raises(histstore.HistStoreError, match="closed"):
        await asyncio.wait_for(store.read(c), 10)
    second = asyncio.ensure_future(store.close())
    await asyncio.sleep(0.05)
    assert not second.done()
    assert not store.closed
    release.set()
    await asyncio.wait_for(asyncio.gather(holder, second), 10)
    assert store.closed
    if backend.shared:
        async with backend.connect() as again:
            assert await again.count(c) == 0


async def test_a_close_inside_a_lease_or_a_stream_closes_the_store(backend: Backend) -> None:
    store = await backend.connect()
    c = new_id()
    await store.write(c, user_msgs(3))
    seen: list[str] = []

    async def streaming() -> None:
        async for m in store.stream(c, page=1):
            seen.append(str(m.content))
            await asyncio.wait_for(store.close(), 10)

    with pytest.raises(histstore.HistStoreError, match="closed"):
        await streaming()
    assert seen == ["m-0"]
    assert store.closed
    leased = await backend.connect()

    async def leasing() -> None:
        async with leased.lease(c):
            await asyncio.wait_for(leased.close(), 10)

    with pytest.raises(histstore.HistStoreError, match="closed"):
        await leasing()
    assert leased.closed
