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


async def test_a_close_inside_the_stores_own_transaction_raises_at_once(
    backend: Backend,
) -> None:
    store = await backend.connect()
    c = new_id()
    await store.write(c, user_msgs(1))
    with pytest.raises(RuntimeError, match="out"):
        async with reach.holding_the_write_turn(store, lock=c):
            with pytest.raises(histstore.HistStoreError, match="inside"):
                await asyncio.wait_for(store.close(), 10)
            assert not store.closed
            raise RuntimeError("out")  # the transaction rolls back
    async with reach.holding_the_write_turn(store, lock=c):
        with pytest.raises(histstore.HistStoreError, match="inside"):
            await asyncio.wait_for(store.close(), 10)
    # The store goes on as if close() had not been called, and closes after.
    outcome = await asyncio.wait_for(store.write(c, user_msgs(1, tag="after")), 10)
    assert outcome.length == 2
    await asyncio.wait_for(store.close(), 10)
    assert store.closed
    with pytest.raises(histstore.HistStoreError, match="closed"):
        await store.read(c)
