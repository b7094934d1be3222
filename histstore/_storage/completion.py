"""Work that, once begun, runs to its end even when the caller is cancelled."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Iterable
from typing import Any, TypeVar

__all__ = ["end_all", "finish_then_cancel", "run_to_completion"]

T = TypeVar("T")


async def run_to_completion(coro: Coroutine[Any, Any, T]) -> T:
    """Await ``coro`` in its own task; if the caller is cancelled, finish it first.

    A transaction interrupted half way can leave a connection in an unknown state (the
    pool then throws it away, and with it an in-memory database) or, on Postgres, a
    session idle in transaction. So the work runs to its end (commit or rollback), and
    only then does the caller see its ``CancelledError``.
    """
    task = asyncio.ensure_future(coro)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        await finish_then_cancel(task)
        raise


async def finish_then_cancel(work: asyncio.Future[Any]) -> None:
    """For a caller cancelled while ``work`` runs: wait until it has ended (through any
    further cancellations), marking its outcome read; the caller then re-raises its
    ``CancelledError``."""
    while not work.done():
        try:
            await asyncio.shield(work)
        except asyncio.CancelledError:
            continue  # cancelled again while waiting: keep waiting
        except BaseException:  # noqa: BLE001 - its outcome is read below
            break
    if not work.cancelled():
        work.exception()  # mark it retrieved; the cancellation wins


def end_all(waiting: Iterable[asyncio.Future[Any]], exc: BaseException) -> None:
    """End each of ``waiting`` not done yet with ``exc``: cancelled for a
    ``CancelledError``, else with ``exc`` as its exception (the work they waited for
    failed as a whole)."""
    for done in waiting:
        if done.done():
            continue
        if isinstance(exc, asyncio.CancelledError):
            done.cancel()
        else:
            done.set_exception(exc)
