"""Running database work so that cancellation can never leave it half done."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ["run_to_completion"]

T = TypeVar("T")


async def run_to_completion(coro: Coroutine[Any, Any, T]) -> T:
    """Await ``coro`` in its own task; if the caller is cancelled, finish it first.

    A transaction interrupted half way can leave a connection in an unknown state (the
    pool then throws it away, and with it an in-memory database) or, on Postgres, a
    session idle in transaction. So the work runs to its end (commit or rollback), and
    only then does the caller see its ``CancelledError``: cancellation takes effect
    once the operation under way has ended.
    """
    task = asyncio.ensure_future(coro)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        while not task.done():
            try:
                await asyncio.shield(task)
            except asyncio.CancelledError:
                continue  # cancelled again while waiting: keep waiting
            except BaseException:  # noqa: BLE001 - its outcome is read below
                break
        if not task.cancelled():
            task.exception()  # mark it retrieved; the cancellation wins
        raise
