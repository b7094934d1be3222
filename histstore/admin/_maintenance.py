"""The maintenance side of ``histstore.admin``: what ``purge`` would delete, purging and
reindexing with progress reports."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

from sqlalchemy import Select, func, select
from sqlalchemy.ext.asyncio import AsyncConnection

from .._core import rules as _rules
from .._ops.listing import Listing, idle_cutoff
from .._ops.text_search import TextSearch
from .._storage import schema as s
from .._store import Store, store_call
from ._queries import scoped, visible_ids

__all__ = ["purge", "purge_candidates", "reindex"]

_conv = s.conversations


@store_call
async def purge_candidates(store: Store, *, idle_for: timedelta) -> list[str]:
    """The ids ``store.purge(idle_for=idle_for)`` would delete now, in id order.

    Raises:
        TypeError, ValueError: ``idle_for`` is not a non-negative ``timedelta``.
    """
    cutoff = idle_cutoff(idle_for)
    stmt = visible_ids(store).where(_conv.c.updated_at < cutoff).order_by(_conv.c.id)

    async def work(conn: AsyncConnection) -> list[str]:
        return list((await conn.execute(stmt)).scalars())

    return await store.internals.executor.run(work, mode="read", action="list idle conversations")


class _Reporter:
    """Turns a running count into ``progress(done, total)`` calls: ``total`` is the
    count taken before the work, raised to ``done`` when more turned up; a call never
    repeats the previous one, and ``finish`` makes the last call's ``done == total``."""

    def __init__(self, progress: Callable[[int, int], None], total: int) -> None:
        self._progress = progress
        self._total = total
        self._done = 0
        self._last: tuple[int, int] | None = None

    def __call__(self, done: int) -> None:
        self._done = done
        self._report(done, max(self._total, done))

    def finish(self) -> None:
        self._report(self._done, self._done)

    def _report(self, done: int, total: int) -> None:
        if (done, total) != self._last:
            self._last = (done, total)
            self._progress(done, total)


async def _count(store: Store, stmt: Select[Any], action: str) -> int:
    async def work(conn: AsyncConnection) -> int:
        return int((await conn.execute(stmt)).scalar_one())

    return await store.internals.executor.run(work, mode="read", action=action)


@store_call
async def reindex(
    store: Store, *, batch: int = 2000, progress: Callable[[int, int], None] | None = None
) -> int:
    """Recompute every message's indexed text (``histstore.indexed_text``) and so its
    full-text index entry, ``batch`` messages per transaction; returns how many changed.
    An adapter envelope stored without its role (``histstore.envelopes``) gets it too,
    with its ``role`` column, as a write stores it now.

    Needed only where these could not be computed when the schema was made: after
    applying ``histstore migrate --sql`` output to a database that already held
    messages. Through a scoped view, only that user's conversations. Safe to run
    while the store is in use, and to run again.

    ``progress(done, total)``, if given, is called after every batch with the messages
    read so far and the count of messages taken first (raised when more turned up);
    ``done`` never decreases and the last call has ``done == total``.

    Raises:
        TypeError, ValueError: ``batch`` is not a positive int.
    """
    if progress is None:
        return await TextSearch(store.internals).reindex(batch)
    _rules.positive(batch, "batch")
    messages = scoped(store, select(func.coalesce(func.sum(_conv.c.length), 0)))
    report = _Reporter(progress, await _count(store, messages, "count messages"))
    changed = await TextSearch(store.internals).reindex(batch, report)
    report.finish()
    return changed


@store_call
async def purge(
    store: Store, *, idle_for: timedelta, progress: Callable[[int, int], None] | None = None
) -> int:
    """``store.purge(idle_for=idle_for)``, with ``progress(done, total)``, if given,
    called after every batch: the conversations deleted so far, and how many were idle
    when it started (raised when more turned up). ``done`` never decreases and the
    last call has ``done == total`` (lower than at first when some changed meanwhile).

    Raises:
        TypeError, ValueError: ``idle_for`` is not a non-negative ``timedelta``.
    """
    cutoff = idle_cutoff(idle_for)
    if progress is None:
        return await store.purge(idle_for=idle_for)
    idle = scoped(store, select(func.count()).where(_conv.c.updated_at < cutoff))
    report = _Reporter(progress, await _count(store, idle, "count idle conversations"))
    purged = await Listing(store.internals).purge(idle_for, report)
    report.finish()
    return purged
