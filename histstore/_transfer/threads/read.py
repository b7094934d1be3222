"""Reading a store's LangGraph threads for export and copy, one thread per snapshot.

A thread (its row and every row of the checkpoint tables that belongs to it) is read in
one snapshot transaction, so what is carried is a state the thread was in; its rows are
read a batch at a time, by primary key, so memory stays bounded however many
checkpoints it holds. Through a scoped view only the view's user's threads are seen.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, Select, Table, false, func, select, true, tuple_
from sqlalchemy.ext.asyncio import AsyncConnection

from ..._errors import NotFound
from ..._ops.context import Context
from .rows import KINDS, ROW_BATCH, THREADS

__all__ = ["StoredThread", "ThreadSource"]

_PAGE = 200  # thread ids read per page


@dataclass
class StoredThread:
    """One thread as read in its snapshot: its row, its row counts by record type, and
    its rows on demand (``rows``)."""

    conn: AsyncConnection
    row: dict[str, Any]
    counts: dict[str, int]
    batch: int

    @property
    def id(self) -> str:
        """The thread's id."""
        return str(self.row["thread_id"])

    async def rows(self, kind: str) -> AsyncIterator[list[dict[str, Any]]]:
        """The thread's rows of one checkpoint table, by primary key, a batch at a time."""
        if not self.counts[kind]:
            return
        table = KINDS[kind]
        keys = list(table.primary_key.columns)
        last: tuple[Any, ...] | None = None
        while True:
            stmt = select(table).where(table.c.thread_id == self.id)
            if last is not None:
                stmt = stmt.where(tuple_(*keys) > tuple_(*last))
            stmt = stmt.order_by(*keys).limit(self.batch)
            rows = [dict(r) for r in (await self.conn.execute(stmt)).mappings()]
            if not rows:
                return
            yield rows
            if len(rows) < self.batch:
                return
            last = tuple(rows[-1][k.name] for k in keys)


class ThreadSource:
    """A store's threads (all it sees, those given, or a user's), one at a time."""

    def __init__(
        self,
        ctx: Context,
        *,
        ids: Sequence[str] | None = None,
        user: str | None = None,
        batch: int,
    ) -> None:
        self._ctx = ctx
        self._ids = list(dict.fromkeys(ids)) if ids is not None else None
        self._batch = min(batch, ROW_BATCH)
        scope = ctx.scope(user, THREADS.c.owner) if ctx.sees(user) else false()
        self._visible: ColumnElement[bool] = true() if scope is None else scope

    def _select(self, *cols: Any) -> Select[Any]:
        return select(*cols).where(self._visible)

    async def check_ids(self) -> None:
        """Raise ``NotFound`` naming the first given thread that is not there (or not seen)."""
        for chunk in self._chunks():
            async with self._ctx.executor.session("read", action="export") as conn:
                stmt = self._select(THREADS.c.thread_id).where(THREADS.c.thread_id.in_(chunk))
                found = set((await conn.execute(stmt)).scalars())
            for tid in chunk:
                if tid not in found:
                    raise NotFound(f"thread {tid!r} not found")

    async def count(self) -> int:
        """How many threads the source holds (the given ones: how many were given)."""
        if self._ids is not None:
            return len(self._ids)
        async with self._ctx.executor.session("read", action="count threads") as conn:
            counting = self._select(func.count()).select_from(THREADS)
            return int((await conn.execute(counting)).scalar_one())

    def _chunks(self) -> list[list[str]]:
        ids = self._ids or []
        return [ids[i : i + _PAGE] for i in range(0, len(ids), _PAGE)]

    async def ids(self) -> AsyncIterator[str]:
        """The threads' ids: the given ones in their order, else all by id."""
        if self._ids is not None:
            for tid in self._ids:
                yield tid
            return
        last: str | None = None
        while True:
            stmt = self._select(THREADS.c.thread_id).order_by(THREADS.c.thread_id).limit(_PAGE)
            if last is not None:
                stmt = stmt.where(THREADS.c.thread_id > last)
            async with self._ctx.executor.session("read", action="export") as conn:
                page = list((await conn.execute(stmt)).scalars())
            for tid in page:
                yield tid
            if len(page) < _PAGE:
                return
            last = page[-1]

    @asynccontextmanager
    async def read(self, thread_id: str) -> AsyncIterator[StoredThread | None]:
        """The thread in a snapshot of its own (``None`` when it is gone meanwhile)."""
        async with self._ctx.executor.session("snapshot", action="read") as conn:
            stmt = self._select(THREADS).where(THREADS.c.thread_id == thread_id)
            found = (await conn.execute(stmt)).mappings().first()
            if found is None:
                yield None
                return
            counts = {kind: await _count(conn, table, thread_id) for kind, table in KINDS.items()}
            yield StoredThread(conn, dict(found), counts, self._batch)


async def _count(conn: AsyncConnection, table: Table, thread_id: str) -> int:
    stmt = select(func.count()).select_from(table).where(table.c.thread_id == thread_id)
    return int((await conn.execute(stmt)).scalar_one())
