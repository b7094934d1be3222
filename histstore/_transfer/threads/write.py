"""Writing incoming LangGraph threads (import, copy): one thread, one write transaction.

An incoming thread replaces the destination's thread of that id whole: its row and its
checkpoint rows are written as they come, in batches, after the destination's rows are
deleted, so memory stays bounded however large it is. A thread the destination already
holds with the very same rows is left as it was: its rows are summed up
(``RowDigest``) before they are replaced, the incoming ones as they are written, and
when the two agree the transaction is rolled back and the thread counts as skipped.
Threads only at the destination are left alone.

A thread is stored whole or not at all: a record refused half way (or a failing
database) rolls its transaction back. Through a scoped view an incoming thread
becomes the view's user's; one of the id owned by someone else is ``NotFound``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from sqlalchemy import Table, delete, update
from sqlalchemy.ext.asyncio import AsyncConnection

from ..._errors import NotFound
from ..._ops.context import Context
from ..._storage.rows import now
from .read import StoredThread
from .rows import KINDS, ROW_BATCH, THREADS, RowDigest, encode_row

__all__ = ["IncomingRows", "ThreadTarget"]

IncomingRows = AsyncIterator[tuple[str, dict[str, Any]]]
"""A thread's checked rows, each with its record type (``threads.rows.KINDS``)."""


class _Unchanged(Exception):
    """The incoming thread equals the stored one: roll back, count it as skipped."""


class ThreadTarget:
    """Stores incoming threads in ``ctx``'s store (see the module doc)."""

    def __init__(self, ctx: Context, *, batch: int, action: str) -> None:
        self._ctx = ctx
        self._batch = min(batch, ROW_BATCH)
        self._action = action
        self._sql = ctx.shared.checkpoint_statements(ctx.owner is not None)

    async def apply(self, thread: dict[str, Any], rows: IncomingRows) -> bool:
        """Make the destination's thread ``thread["thread_id"]`` hold ``thread`` (a checked
        row of the threads table) and ``rows``; whether anything changed.

        Raises:
            NotFound: a scoped view may not see the destination's thread of that id.
        """
        thread = dict(thread)
        if self._ctx.owner is not None:
            thread["owner"] = self._ctx.owner
        tid = str(thread["thread_id"])

        async def work(conn: AsyncConnection) -> bool:
            before = await self._take(conn, tid)
            after = None if before is None else RowDigest()  # only to compare with
            if after is not None:
                after.add("thread", encode_row(THREADS, thread))
            values = {k: v for k, v in thread.items() if k != "thread_id"}
            await conn.execute(update(THREADS).where(THREADS.c.thread_id == tid).values(values))
            pending: dict[str, list[dict[str, Any]]] = {kind: [] for kind in KINDS}
            async for kind, row in rows:
                if after is not None:
                    after.add(kind, encode_row(KINDS[kind], row))
                pending[kind].append(row)
                if len(pending[kind]) >= self._batch:
                    await _insert(conn, KINDS[kind], pending[kind])
                    pending[kind] = []
            for kind, left in pending.items():
                await _insert(conn, KINDS[kind], left)
            if before is not None and before == after:
                raise _Unchanged
            return True

        try:
            return await self._ctx.executor.run(work, mode="write", action=self._action)
        except _Unchanged:
            return False

    async def _take(self, conn: AsyncConnection, tid: str) -> RowDigest | None:
        """Create the thread, or lock it, sum up what it holds and delete its rows;
        ``None`` when it was created."""
        params = {"thread_id": tid, "owner": self._ctx.owner, "now": now()}
        if (await conn.execute(self._sql.create_thread, params)).first() is not None:
            return None
        locked = await conn.execute(self._sql.lock_threads, {"threads": [tid], **params})
        if locked.first() is None:
            raise NotFound(f"thread {tid!r} not found")
        found = await conn.execute(THREADS.select().where(THREADS.c.thread_id == tid))
        digest = RowDigest()
        digest.add("thread", encode_row(THREADS, dict(found.mappings().one())))
        stored = StoredThread(conn, {"thread_id": tid}, dict.fromkeys(KINDS, 1), self._batch)
        for kind, table in KINDS.items():
            async for batch in stored.rows(kind):
                for row in batch:
                    digest.add(kind, encode_row(table, row))
            await conn.execute(delete(table).where(table.c.thread_id == tid))
        return digest


async def _insert(conn: AsyncConnection, table: Table, rows: list[dict[str, Any]]) -> None:
    if rows:
        await conn.execute(table.insert(), rows)
