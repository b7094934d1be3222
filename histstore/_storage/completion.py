"""Work that, once begun, runs to its end even when the caller is cancelled."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Iterable
from contextlib import suppress
from typing import Any, TypeVar

__all__ = ["end_all", "finish_then_cancel", "run_to_completion"]

T = TypeVar("T")


async def run_to_completion(coro: Coroutine[Any, Any, T], *, grace: float | None = None) -> T:
    """Await ``coro`` in its own task; if the caller is cancelled, finish it first.

    A transaction interrupted half way can leave a connection in an unknown state (the
    pool then throws it away, and with it an in-memory database) or, on Postgres, a
    session idle in transaction. So the work runs to its end (commit or rollback), and
    only then does the caller see its ``CancelledError``.

    ``grace`` (seconds; ``None``: no limit) bounds that wait: work still running then is
    cancelled, which on Postgres gives its connection up (``Driver.abandon``; the server
    rolls back, or, cancelled in COMMIT, may have committed), and the caller's
    ``CancelledError`` follows once it has ended (``_storage.deadlines``).
    """
    task = asyncio.ensure_future(coro)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        if grace is not None:
            with suppress(asyncio.CancelledError):  # cancelled again: give it up at once
                await asyncio.wait({task}, timeout=grace)
            task.cancel()
        await finish_then_cancel(task)
        raise


async def finish_then_cancel(work: asyncio.Future[Any], grace: float | None = None) -> None:
    """For a caller cancelled while ``work`` runs: wait until it has ended (through any
    further cancellations), or for at most ``grace`` seconds, marking its outcome read;
    the caller then re-raises its ``CancelledError``."""
    loop = asyncio.get_running_loop()
    deadline = None if grace is None else loop.time() + grace
    while not work.done():
        left = None if deadline is None else deadline - loop.time()
        if left is not None and left <= 0:
            return
        try:
            await asyncio.wait({work}, timeout=left)
        except asyncio.CancelledError:
            continue  # cancelled again while waiting: keep waiting
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
