"""The queue SQLite writers of one store wait in (``_storage.write_gate.WriteGate``)."""

from __future__ import annotations

import asyncio

import pytest

from histstore._storage.write_gate import WriteGate


async def test_a_free_gate_is_taken_without_suspending() -> None:
    gate = WriteGate()
    step = gate.take(1.0)
    # Runs to its end in one step: no task, no timer, no wait.
    with pytest.raises(StopIteration) as done:
        step.send(None)
    assert done.value.value is True
    gate.release()


async def test_writers_go_in_the_order_they_came() -> None:
    gate = WriteGate()
    order: list[int] = []

    async def writer(i: int) -> None:
        assert await gate.take(5.0)
        order.append(i)
        await asyncio.sleep(0)
        gate.release()

    assert await gate.take(5.0)
    first = [asyncio.create_task(writer(i)) for i in range(3)]
    await asyncio.sleep(0)  # all three queue
    gate.release()  # the first queued writer is woken but has not run yet ...
    late = asyncio.create_task(writer(99))  # ... so a newcomer queues behind the others
    await asyncio.gather(*first, late)
    assert order == [0, 1, 2, 99]


async def test_waiting_past_the_timeout_gives_up_and_leaves_the_queue_working() -> None:
    gate = WriteGate()
    assert await gate.take(1.0)
    assert await gate.take(0.05) is False
    gate.release()
    assert await gate.take(0.05)  # taken again at once: the timed-out waiter is gone
    gate.release()
