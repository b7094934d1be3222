"""Looking at threads: which there are (with their checkpoint counts, namespaces and
times), and a thread's checkpoints without their values, for tools and the command line."""

from __future__ import annotations

import builtins
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

from sqlalchemy import ColumnElement, Select, and_, func, select, tuple_
from sqlalchemy.ext.asyncio import AsyncConnection

from .._core import rules as _rules
from .._errors import NotFound
from .._ops.listing import idle_cutoff
from ._scope import CHANNELS, CHECKPOINTS, THREADS, WRITES, CheckpointScope, chunks

__all__ = ["CheckpointInfo", "ThreadCatalog", "ThreadInfo"]


def _iso(value: datetime) -> str:
    return value.astimezone(timezone.utc).isoformat()


@dataclass(frozen=True, slots=True)
class ThreadInfo:
    """One thread's particulars: its owner, how many checkpoints it holds, its
    namespaces (``""`` is the root graph's), when it was made and last changed."""

    thread_id: str
    """The thread's id."""
    user: str | None
    """Its owner; ``None``: no owner."""
    checkpoints: int
    namespaces: tuple[str, ...]
    created_at: datetime
    """When it was made (aware, UTC)."""
    updated_at: datetime
    """When it last changed (aware, UTC)."""

    def as_dict(self) -> dict[str, Any]:
        """The particulars as a JSON-ready dict (times as ISO 8601 strings)."""
        return {
            "thread_id": self.thread_id,
            "user": self.user,
            "checkpoints": self.checkpoints,
            "namespaces": list(self.namespaces),
            "created_at": _iso(self.created_at),
            "updated_at": _iso(self.updated_at),
        }


@dataclass(frozen=True, slots=True)
class CheckpointInfo:
    """A checkpoint without its values: ids, metadata (the JSON object stored with it),
    the channels whose values it reads from the store (a plain scalar value lives in
    the checkpoint itself and is not listed) and how many pending writes it has."""

    checkpoint_ns: str
    """The namespace (``""``: the root graph)."""
    checkpoint_id: str
    """The checkpoint's id."""
    parent_checkpoint_id: str | None
    """The id of the checkpoint it follows; ``None``: the first."""
    created_at: datetime
    """When it was stored (aware, UTC)."""
    metadata: dict[str, Any] = field(default_factory=dict)
    channels: tuple[str, ...] = ()
    writes: int = 0

    @property
    def step(self) -> Any:
        """LangGraph's ``metadata["step"]`` (``None`` when absent)."""
        return self.metadata.get("step")

    @property
    def source(self) -> Any:
        """LangGraph's ``metadata["source"]`` (``"input"``, ``"loop"``, ``"update"``, ...)."""
        return self.metadata.get("source")

    def as_dict(self) -> dict[str, Any]:
        """The checkpoint as a JSON-ready dict."""
        return {
            "checkpoint_ns": self.checkpoint_ns,
            "checkpoint_id": self.checkpoint_id,
            "parent_checkpoint_id": self.parent_checkpoint_id,
            "created_at": _iso(self.created_at),
            "step": self.step,
            "source": self.source,
            "channels": list(self.channels),
            "writes": self.writes,
            "metadata": self.metadata,
        }


class ThreadCatalog(CheckpointScope):
    """``threads``, ``thread``, ``checkpoints`` and ``idle_threads``: what a view holds."""

    def _threads_query(self, idle_for: timedelta | None) -> Select[Any]:
        query = select(THREADS)
        if self._owner is not None:
            query = query.where(THREADS.c.owner == self._owner)
        if idle_for is not None:
            query = query.where(THREADS.c.updated_at < idle_cutoff(idle_for))
        return query

    async def threads(
        self, *, limit: int | None = None, idle_for: timedelta | None = None
    ) -> list[ThreadInfo]:
        """The threads this view sees, most recently changed first (then by id), read in
        one snapshot; ``idle_for``: only those not changed for that long.

        Raises:
            TypeError, ValueError: a bad ``limit`` or ``idle_for``.
        """
        query = self._threads_query(idle_for).order_by(
            THREADS.c.updated_at.desc(), THREADS.c.thread_id
        )
        if limit is not None:
            query = query.limit(_rules.positive(limit, "limit"))

        async def work(conn: AsyncConnection) -> list[ThreadInfo]:
            rows = [dict(r) for r in (await conn.execute(query)).mappings()]
            return await _infos(conn, rows)

        return await self._run("snapshot", "listing threads", work)

    async def count_threads(self, *, idle_for: timedelta | None = None) -> int:
        """How many threads ``threads`` (without a limit) would list."""
        query = select(func.count()).select_from(self._threads_query(idle_for).subquery())

        async def work(conn: AsyncConnection) -> int:
            return int((await conn.execute(query)).scalar_one())

        return await self._run("read", "counting threads", work)

    async def idle_threads(self, idle_for: timedelta) -> builtins.list[str]:
        """The ids of the threads not changed for ``idle_for``, by id."""
        query = self._threads_query(idle_for).with_only_columns(THREADS.c.thread_id)

        async def work(conn: AsyncConnection) -> builtins.list[str]:
            return sorted((await conn.execute(query)).scalars())

        return await self._run("read", "listing idle threads", work)

    async def thread(self, thread_id: str) -> ThreadInfo:
        """One thread's particulars.

        Raises:
            NotFound: the thread is unknown (or another owner's).
        """
        query = self._threads_query(None).where(THREADS.c.thread_id == thread_id)

        async def work(conn: AsyncConnection) -> builtins.list[ThreadInfo]:
            return await _infos(conn, [dict(r) for r in (await conn.execute(query)).mappings()])

        found = await self._run("snapshot", f"reading thread {thread_id!r}", work)
        if not found:
            raise NotFound(f"thread {thread_id!r} not found")
        return found[0]

    async def checkpoints(
        self, thread_id: str, *, limit: int | None = None
    ) -> builtins.list[CheckpointInfo]:
        """A thread's checkpoints, newest first (every namespace), without their values,
        read in one snapshot.

        Raises:
            NotFound: the thread is unknown (or another owner's).
        """
        query = (
            select(
                CHECKPOINTS.c.checkpoint_ns,
                CHECKPOINTS.c.checkpoint_id,
                CHECKPOINTS.c.parent_checkpoint_id,
                CHECKPOINTS.c.created_at,
                CHECKPOINTS.c.metadata,
            )
            .where(CHECKPOINTS.c.thread_id == thread_id)
            .order_by(CHECKPOINTS.c.checkpoint_id.desc(), CHECKPOINTS.c.checkpoint_ns.desc())
        )
        if limit is not None:
            query = query.limit(_rules.positive(limit, "limit"))
        seen = self._threads_query(None).where(THREADS.c.thread_id == thread_id)

        async def work(conn: AsyncConnection) -> builtins.list[CheckpointInfo] | None:
            if (await conn.execute(seen)).first() is None:
                return None
            rows = (await conn.execute(query)).all()
            return await _checkpoint_infos(conn, thread_id, rows)

        found = await self._run("snapshot", f"reading thread {thread_id!r}", work)
        if found is None:
            raise NotFound(f"thread {thread_id!r} not found")
        return found


async def _infos(conn: AsyncConnection, rows: Sequence[dict[str, Any]]) -> list[ThreadInfo]:
    """``ThreadInfo`` for thread rows, in their order."""
    counts: dict[str, dict[str, int]] = {}
    ids = [r["thread_id"] for r in rows]
    for chunk in chunks(ids):
        query = (
            select(CHECKPOINTS.c.thread_id, CHECKPOINTS.c.checkpoint_ns, func.count())
            .where(CHECKPOINTS.c.thread_id.in_(list(chunk)))
            .group_by(CHECKPOINTS.c.thread_id, CHECKPOINTS.c.checkpoint_ns)
        )
        for tid, ns, n in await conn.execute(query):
            counts.setdefault(tid, {})[ns] = int(n)
    return [
        ThreadInfo(
            r["thread_id"],
            r["owner"],
            sum(counts.get(r["thread_id"], {}).values()),
            tuple(sorted(counts.get(r["thread_id"], {}))),
            r["created_at"],
            r["updated_at"],
        )
        for r in rows
    ]


async def _checkpoint_infos(
    conn: AsyncConnection, thread_id: str, rows: Sequence[Any]
) -> list[CheckpointInfo]:
    """``CheckpointInfo`` for checkpoint rows (ns, id, parent, created_at, metadata)."""
    channels: dict[tuple[str, str], list[str]] = {}
    writes: dict[tuple[str, str], int] = {}
    keys = [(r[0], r[1]) for r in rows]
    for chunk in chunks(keys):
        key_of = tuple_(CHANNELS.c.checkpoint_ns, CHANNELS.c.checkpoint_id)
        named = select(CHANNELS.c.checkpoint_ns, CHANNELS.c.checkpoint_id, CHANNELS.c.channel)
        in_chunk: ColumnElement[bool] = and_(
            CHANNELS.c.thread_id == thread_id, key_of.in_(list(chunk))
        )
        for ns, cid, channel in await conn.execute(named.where(in_chunk)):
            channels.setdefault((ns, cid), []).append(channel)
        counted = (
            select(WRITES.c.checkpoint_ns, WRITES.c.checkpoint_id, func.count())
            .where(
                WRITES.c.thread_id == thread_id,
                tuple_(WRITES.c.checkpoint_ns, WRITES.c.checkpoint_id).in_(list(chunk)),
            )
            .group_by(WRITES.c.checkpoint_ns, WRITES.c.checkpoint_id)
        )
        writes.update({(ns, cid): int(n) for ns, cid, n in await conn.execute(counted)})
    return [
        CheckpointInfo(
            ns,
            cid,
            parent,
            created,
            _metadata(metadata),
            tuple(sorted(channels.get((ns, cid), ()))),
            writes.get((ns, cid), 0),
        )
        for ns, cid, parent, created, metadata in rows
    ]


def _metadata(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
