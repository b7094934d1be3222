"""Checkpoint reads: one checkpoint by a single statement (``get``), and listing, a page
of checkpoints per snapshot with their channel values and pending writes."""

from __future__ import annotations

import builtins
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    ColumnElement,
    CompoundSelect,
    Integer,
    Select,
    Text,
    and_,
    bindparam,
    cast,
    literal,
    null,
    or_,
    select,
    union_all,
)
from sqlalchemy.ext.asyncio import AsyncConnection

from ._records import Blob, StoredCheckpoint, Write, as_bytes, with_parts
from ._scope import BLOBS, CHANNELS, CHECKPOINTS, WRITES, CheckpointScope, chunks

if TYPE_CHECKING:
    from .._store import Store

__all__ = ["CheckpointReads"]

_PAGE = 100
"""Checkpoints read per snapshot when listing."""


class CheckpointReads(CheckpointScope):
    """``get`` and ``list``: checkpoints with the values they read and their writes."""

    def __init__(self, store: Store) -> None:
        super().__init__(store)
        self._get_statements = {by_id: self._get_statement(by_id) for by_id in (False, True)}

    async def get(
        self, thread_id: str, checkpoint_ns: str, checkpoint_id: str | None = None
    ) -> StoredCheckpoint | None:
        """The checkpoint with that id, or the newest of the namespace; ``None`` if none.

        One statement: the checkpoint's id by index (the newest is the end of the primary
        key's range), then its row, its values and its writes by primary key.
        """
        stmt = self._get_statements[checkpoint_id is not None]
        params = {"t": thread_id, "ns": checkpoint_ns, "id": checkpoint_id}

        async def work(conn: AsyncConnection) -> StoredCheckpoint | None:
            return _assemble(thread_id, checkpoint_ns, await conn.execute(stmt, params))

        return await self._run("read", f"reading a checkpoint of thread {thread_id!r}", work)

    async def list(
        self,
        thread_id: str | None,
        checkpoint_ns: str | None,
        *,
        checkpoint_id: str | None = None,
        before: str | None = None,
        limit: int | None = None,
        where: Callable[[str], bool] | None = None,
    ) -> AsyncIterator[StoredCheckpoint]:
        """Checkpoints, newest id first (then by thread and namespace, descending).

        Args:
            thread_id: one thread, or ``None`` for every visible thread.
            checkpoint_ns: one namespace, or ``None`` for all.
            checkpoint_id: only the checkpoint with this id.
            before: only checkpoints whose id is smaller.
            limit: at most this many (after ``where``).
            where: a test on the metadata's JSON text; the checkpoints it refuses are
                skipped before their values and writes are read.

        Reads a page of rows per snapshot, so a long listing holds no transaction open
        between pages and sees checkpoints stored meanwhile only on later pages.
        """
        if limit is not None and limit <= 0:
            return
        order = [("checkpoint_id", CHECKPOINTS.c.checkpoint_id)]
        if thread_id is None:
            order.append(("thread_id", CHECKPOINTS.c.thread_id))
        if checkpoint_ns is None:
            order.append(("checkpoint_ns", CHECKPOINTS.c.checkpoint_ns))
        keys = [column for _, column in order]
        base = self._select_rows(
            thread_id, checkpoint_ns, checkpoint_id=checkpoint_id, before=before
        ).order_by(*(k.desc() for k in keys))
        cursor: builtins.list[Any] | None = None
        left = limit
        while True:
            query = base if cursor is None else base.where(_after(keys, cursor))
            query = query.limit(_PAGE)

            async def page(
                conn: AsyncConnection, query: Select[Any] = query, left: int | None = left
            ) -> tuple[list[StoredCheckpoint], list[StoredCheckpoint]]:
                rows = [_row(r) for r in await conn.execute(query)]
                kept = [r for r in rows if where is None or where(r.metadata)]
                if left is not None:
                    kept = kept[:left]
                return rows, await self._complete(conn, kept) if kept else []

            rows, found = await self._run("snapshot", "listing checkpoints", page)
            for item in found:
                yield item
            if left is not None:
                left -= len(found)
                if left <= 0:
                    return
            if len(rows) < _PAGE:
                return
            last = rows[-1]
            cursor = [getattr(last, name) for name, _ in order]

    def _get_statement(self, by_id: bool) -> CompoundSelect[Any]:
        """``get``'s statement (built once: parameters ``t``, ``ns`` and ``id``)."""
        thread_id = bindparam("t", type_=CHECKPOINTS.c.thread_id.type)
        checkpoint_ns = bindparam("ns", type_=Text())
        head_query = select(CHECKPOINTS.c.checkpoint_id).where(
            CHECKPOINTS.c.thread_id == thread_id, CHECKPOINTS.c.checkpoint_ns == checkpoint_ns
        )
        visible = self._visible(CHECKPOINTS.c.thread_id)
        if visible is not None:
            head_query = head_query.where(visible)
        if by_id:
            head_query = head_query.where(
                CHECKPOINTS.c.checkpoint_id
                == bindparam("id", type_=CHECKPOINTS.c.checkpoint_id.type)
            )
        else:
            head_query = head_query.order_by(CHECKPOINTS.c.checkpoint_id.desc()).limit(1)
        head = head_query.scalar_subquery()

        def at_head(table: Any) -> list[ColumnElement[bool]]:
            return [
                table.c.thread_id == thread_id,
                table.c.checkpoint_ns == checkpoint_ns,
                table.c.checkpoint_id == head,
            ]

        none_text = cast(null(), Text)
        # One row shape for the three parts: kind, four strings, bytes, an int.
        row = select(
            literal("c", Text).label("kind"),
            cast(CHECKPOINTS.c.checkpoint_id, Text).label("s1"),
            cast(CHECKPOINTS.c.parent_checkpoint_id, Text).label("s2"),
            CHECKPOINTS.c.type.label("s3"),
            CHECKPOINTS.c.metadata.label("s4"),
            CHECKPOINTS.c.checkpoint.label("data"),
            cast(null(), Integer).label("n"),
        ).where(*at_head(CHECKPOINTS))
        values = (
            select(
                literal("b", Text),
                BLOBS.c.channel,
                BLOBS.c.version,
                BLOBS.c.type,
                none_text,
                BLOBS.c.blob,
                cast(null(), Integer),
            )
            .select_from(CHANNELS.join(BLOBS, _same_blob()))
            .where(*at_head(CHANNELS))
        )
        writes = select(
            literal("w", Text),
            WRITES.c.channel,
            WRITES.c.task_id,
            WRITES.c.type,
            WRITES.c.task_path,
            WRITES.c.blob,
            WRITES.c.idx,
        ).where(*at_head(WRITES))
        return union_all(row, values, writes)

    def _select_rows(
        self,
        thread_id: str | None,
        checkpoint_ns: str | None,
        *,
        checkpoint_id: str | None = None,
        before: str | None = None,
    ) -> Select[Any]:
        conds: list[ColumnElement[bool]] = []
        if thread_id is not None:
            conds.append(CHECKPOINTS.c.thread_id == thread_id)
        if checkpoint_ns is not None:
            conds.append(CHECKPOINTS.c.checkpoint_ns == checkpoint_ns)
        if checkpoint_id is not None:
            conds.append(CHECKPOINTS.c.checkpoint_id == checkpoint_id)
        if before is not None:
            conds.append(CHECKPOINTS.c.checkpoint_id < before)
        visible = self._visible(CHECKPOINTS.c.thread_id)
        if visible is not None:
            conds.append(visible)
        return select(
            CHECKPOINTS.c.thread_id,
            CHECKPOINTS.c.checkpoint_ns,
            CHECKPOINTS.c.checkpoint_id,
            CHECKPOINTS.c.parent_checkpoint_id,
            CHECKPOINTS.c.type,
            CHECKPOINTS.c.checkpoint,
            CHECKPOINTS.c.metadata,
        ).where(*conds)

    async def _complete(
        self, conn: AsyncConnection, rows: Sequence[StoredCheckpoint]
    ) -> builtins.list[StoredCheckpoint]:
        """Add the channel values and pending writes to checkpoint rows (same snapshot)."""
        values: dict[tuple[str, str, str], list[Blob]] = {}
        writes: dict[tuple[str, str, str], list[Write]] = {}
        groups: dict[tuple[str, str], list[str]] = {}
        for r in rows:
            groups.setdefault((r.thread_id, r.checkpoint_ns), []).append(r.checkpoint_id)
        for (thread_id, ns), ids in groups.items():
            for chunk in chunks(ids):
                query = (
                    select(
                        CHANNELS.c.checkpoint_id,
                        BLOBS.c.channel,
                        BLOBS.c.version,
                        BLOBS.c.type,
                        BLOBS.c.blob,
                    )
                    .select_from(CHANNELS.join(BLOBS, _same_blob()))
                    .where(
                        CHANNELS.c.thread_id == thread_id,
                        CHANNELS.c.checkpoint_ns == ns,
                        CHANNELS.c.checkpoint_id.in_(list(chunk)),
                    )
                )
                for cid, channel, version, type_, blob in await conn.execute(query):
                    values.setdefault((thread_id, ns, cid), []).append(
                        Blob(channel, version, type_, as_bytes(blob))
                    )
                query = select(
                    WRITES.c.checkpoint_id,
                    WRITES.c.task_id,
                    WRITES.c.idx,
                    WRITES.c.channel,
                    WRITES.c.type,
                    WRITES.c.blob,
                    WRITES.c.task_path,
                ).where(
                    WRITES.c.thread_id == thread_id,
                    WRITES.c.checkpoint_ns == ns,
                    WRITES.c.checkpoint_id.in_(list(chunk)),
                )
                for w in await conn.execute(query):
                    writes.setdefault((thread_id, ns, w[0]), []).append(
                        Write(w[1], w[2], w[3], w[4], bytes(w[5]), w[6])
                    )
        out = []
        for r in rows:
            key = (r.thread_id, r.checkpoint_ns, r.checkpoint_id)
            out.append(with_parts(r, values.get(key, ()), writes.get(key, ())))
        return out


def _row(r: Any) -> StoredCheckpoint:
    """A checkpoint row, still without its values and writes."""
    return StoredCheckpoint(
        thread_id=r[0],
        checkpoint_ns=r[1],
        checkpoint_id=r[2],
        parent_checkpoint_id=r[3],
        type=r[4],
        checkpoint=bytes(r[5]),
        metadata=r[6],
        values=(),
        writes=(),
    )


def _same_blob() -> ColumnElement[bool]:
    """Join condition: the blob a checkpoint's channel row names."""
    return and_(
        BLOBS.c.thread_id == CHANNELS.c.thread_id,
        BLOBS.c.checkpoint_ns == CHANNELS.c.checkpoint_ns,
        BLOBS.c.channel == CHANNELS.c.channel,
        BLOBS.c.version == CHANNELS.c.version,
    )


def _assemble(thread_id: str, ns: str, result: Iterable[Any]) -> StoredCheckpoint | None:
    """A checkpoint from the rows of ``_get_statement`` (``None`` without its row)."""
    row: StoredCheckpoint | None = None
    values: list[Blob] = []
    writes: list[Write] = []
    for kind, s1, s2, s3, s4, data, n in result:
        if kind == "c":
            row = StoredCheckpoint(thread_id, ns, s1, s2, s3, bytes(data), s4, (), ())
        elif kind == "b":
            values.append(Blob(s1, s2, s3, as_bytes(data)))
        else:
            writes.append(Write(s2, n, s1, s3, bytes(data), s4))
    return None if row is None else with_parts(row, values, writes)


def _after(keys: Sequence[ColumnElement[Any]], values: Sequence[Any]) -> ColumnElement[bool]:
    """Rows after ``values`` in the descending order of ``keys`` (keyset paging)."""
    terms = [
        and_(*(keys[j] == values[j] for j in range(i)), keys[i] < values[i])
        for i in range(len(keys))
    ]
    return terms[0] if len(terms) == 1 else or_(*terms)
