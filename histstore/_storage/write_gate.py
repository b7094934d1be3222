"""The queue a store's SQLite writers wait in for the file's write lock."""

from __future__ import annotations

import asyncio

__all__ = ["WriteGate"]


class WriteGate:
    """First come, first served, with a timeout; a free gate is taken at once.

    Taking a free gate with nobody queued costs no task and no timer (most writes of a
    store find it so); otherwise the writer queues behind the others, up to ``timeout``.
    Belongs to the event loop that first uses it, as ``asyncio.Lock`` does.
    """

    __slots__ = ("_lock", "_queued")

    def __init__(self) -> None:
        self._lock = asyncio.Lock()
        self._queued = 0  # writers waiting (or woken and not yet running)

    async def take(self, timeout: float) -> bool:  # noqa: ASYNC109 - answers False on time-out
        """Take the gate; ``False`` when ``timeout`` seconds passed first."""
        if not self._lock.locked() and not self._queued:
            await self._lock.acquire()  # returns at once: free, and no waiter to pass
            return True
        self._queued += 1
        try:
            await asyncio.wait_for(self._lock.acquire(), timeout)
        except TimeoutError:
            return False
        finally:
            self._queued -= 1
        return True

    @property
    def queued(self) -> int:
        """Writers waiting for the gate."""
        return self._queued

    def release(self) -> None:
        """Let the next writer in."""
        self._lock.release()
