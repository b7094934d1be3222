"""What every part of the checkpoint storage shares: the store's executor, the view's
owner (and the rule that decides which threads it sees), and small helpers."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy import ColumnElement, exists
from sqlalchemy.ext.asyncio import AsyncConnection

from .._storage import schema as s
from .._storage.statements.dialects import Mode

if TYPE_CHECKING:
    from .._store import Store

__all__ = [
    "BLOBS",
    "CHANNELS",
    "CHECKPOINTS",
    "CHUNK",
    "TEXT",
    "THREADS",
    "WRITES",
    "CheckpointScope",
    "chunks",
]

T = TypeVar("T")

THREADS = s.checkpoint_threads
CHECKPOINTS = s.checkpoints
BLOBS = s.checkpoint_blobs
CHANNELS = s.checkpoint_channels
WRITES = s.checkpoint_writes
TEXT = s.checkpoint_text
CHUNK = 400
"""Keys per ``IN`` list (well under SQLite's and asyncpg's parameter limits)."""


def chunks(items: Sequence[T], size: int = CHUNK) -> Iterable[Sequence[T]]:
    """``items`` in slices of at most ``size``, one ``IN`` list each."""
    for i in range(0, len(items), size):
        yield items[i : i + size]


class CheckpointScope:
    """The base of the checkpoint parts: one store's executor, confined to its user.

    Every transaction runs through the store's executor (its settings, schema, write
    turn and error translation); a scoped store (``store.user`` set) sees only the
    threads that user owns. The upserts and the thread lock are built once per engine
    (``_storage.statements.checkpoints``).
    """

    def __init__(self, store: Store) -> None:
        ctx = store.internals
        self._executor = ctx.executor
        self._owner = store.user
        self._sql = ctx.shared.checkpoint_statements(self._owner is not None)

    @property
    def user(self) -> str | None:
        """The owner the checkpoints are confined to; ``None`` for every thread."""
        return self._owner

    async def _run(
        self, mode: Mode, action: str, work: Callable[[AsyncConnection], Awaitable[T]]
    ) -> T:
        """One transaction through the store's executor: its settings, schema, write
        turn, error translation and lifecycle; run to its end even when cancelled."""
        return await self._executor.run(work, mode=mode, action=action)

    def _visible(self, thread: ColumnElement[Any]) -> ColumnElement[bool] | None:
        """The condition that a thread's rows are visible here (``None``: all are)."""
        if self._owner is None:
            return None
        return exists().where(THREADS.c.thread_id == thread, THREADS.c.owner == self._owner)
