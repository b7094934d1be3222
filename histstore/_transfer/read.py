"""Reading a store's conversations for export and copy, page by page, as its owner sees them.

A page is a run of conversations (in id order, or in the order given) whose messages add
up to about ten batches; it is read in one snapshot transaction, so a conversation's
row, messages, lists and editable history (entry ids and authors, asides, turn
records, change log) always agree. Messages, list items and change records are read a
batch at a time, so memory stays bounded however large a conversation is. Through a
scoped view only the view's user's conversations are seen; any other id is
``NotFound``.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, Select, false, func, select, true, type_coerce
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.types import NullType

from .._ops.context import Context, not_found
from .._storage import schema as s
from .._storage.statements.dialects import message_columns, message_time
from .editable import LogRow, write_record

__all__ = ["Page", "Source", "StoredConversation"]

_conv = s.conversations
_msg = s.messages
_PAGE = 200  # conversations looked at per page of ids
_ROWS = (
    "position",
    "role",
    "data",
    "token_count",
    "created_at",
    "search_text",
    "entry_id",
    "author",
)
Row = Sequence[Any]


@dataclass
class StoredConversation:
    """One conversation's row and its small parts (messages, list items and the change
    log stream)."""

    id: str
    owner: str | None
    system_prompt: str | None
    length: int
    created_at: datetime
    updated_at: datetime
    revision: int = 0
    next_entry: int = 1
    next_aside: int = 1
    halted: str | None = None
    metadata: list[tuple[str, str]] = field(default_factory=list)  # stored key, JSON text
    summaries: list[dict[str, Any]] = field(default_factory=list)  # table columns
    lists: list[tuple[str, int]] = field(default_factory=list)
    asides: list[Row] = field(default_factory=list)  # aside_id, after, home, value text
    turns: list[Row] = field(default_factory=list)  # number .. usage, as the table has them

    @property
    def editable(self) -> tuple[int, int, int, str | None]:
        """Its revision, next entry id, next aside id and halt."""
        return self.revision, self.next_entry, self.next_aside, self.halted


class Page:
    """Conversations read in one snapshot transaction; messages and items on demand."""

    def __init__(
        self,
        conn: AsyncConnection,
        convs: list[StoredConversation],
        batch: int,
        time: Callable[[Any], Any],
    ) -> None:
        self.conn = conn
        self.convs = convs
        self._batch = batch
        self._small: dict[str, list[Row]] | None = None
        self._small_logs: dict[str, list[LogRow]] | None = None
        self._time = time
        self._times: dict[Any, Any] = {}  # a batch's messages share their time

    def _rows(self, raw: Sequence[Row]) -> list[Row]:
        """Message rows as read (``created_at`` as the driver gives it), with their times
        converted once per distinct value."""
        times = self._times
        out: list[Row] = []
        if len(times) > 4 * self._batch:
            times.clear()
        for position, role, data, tokens, created, *rest in raw:
            at = times.get(created)
            if at is None:
                at = times[created] = self._time(created)
            out.append((position, role, data, tokens, at, *rest))
        return out

    async def messages(self, conv: StoredConversation) -> AsyncIterator[list[Row]]:
        """Rows of (position, role, data, token_count, created_at, search_text), a batch
        at a time."""
        if conv.length == 0:
            return
        if conv.length <= self._batch:
            if self._small is None:
                self._small = await self._fetch_small()
            rows = self._small.pop(conv.id, [])
            if rows:
                yield rows
            return
        position = 0
        cols = _columns(self.conn)
        while True:
            stmt = (
                select(*cols)
                .where(_msg.c.conversation_id == conv.id, _msg.c.position >= position)
                .order_by(_msg.c.position)
                .limit(self._batch)
            )
            rows = self._rows((await self.conn.execute(stmt)).all())
            if not rows:
                return
            yield rows
            if len(rows) < self._batch:
                return
            position = rows[-1][0] + 1

    async def _fetch_small(self) -> dict[str, list[Row]]:
        """Every message of the page's small conversations, in groups of ``batch`` rows."""
        found: dict[str, list[Row]] = {}
        group: list[str] = []
        size = 0
        small = [c for c in self.convs if 0 < c.length <= self._batch]
        cols = [*_columns(self.conn), _msg.c.conversation_id]
        for i, conv in enumerate(small):
            group.append(conv.id)
            size += conv.length
            if size >= self._batch or i == len(small) - 1:
                stmt = (
                    select(*cols)
                    .where(_msg.c.conversation_id.in_(group))
                    .order_by(_msg.c.conversation_id, _msg.c.position)
                )
                for r in self._rows((await self.conn.execute(stmt)).all()):
                    found.setdefault(r[len(_ROWS)], []).append(r)
                group, size = [], 0
        return found

    async def items(self, conv: StoredConversation, name: str) -> AsyncIterator[Sequence[Row]]:
        """A named list's rows of (idx, value, blob), a batch at a time."""
        li = s.list_items
        idx = 0
        while True:
            stmt = (
                select(li.c.idx, li.c.value, li.c.blob)
                .where(li.c.conversation_id == conv.id, li.c.name == name, li.c.idx >= idx)
                .order_by(li.c.idx)
                .limit(self._batch)
            )
            rows: Sequence[Row] = (await self.conn.execute(stmt)).all()
            if not rows:
                return
            yield rows
            if len(rows) < self._batch:
                return
            idx = rows[-1][0] + 1

    async def changes(self, conv: StoredConversation) -> AsyncIterator[list[LogRow]]:
        """The change records as stored, oldest first, a batch at a time: (revision,
        kind, author, at, the record's JSON text); a plain write's comes from its
        idempotency row (``write_record``)."""
        if conv.revision == 0:
            return
        if conv.revision <= self._batch:
            if self._small_logs is None:
                self._small_logs = await self._fetch_small_logs()
            rows = self._small_logs.pop(conv.id, [])
            if rows:
                yield rows
            return
        after, batch = 0, self._batch
        while True:
            writes = [r for _cid, r in await self._log([conv.id], after, True, batch)]
            changes = [r for _cid, r in await self._log([conv.id], after, False, batch)]
            merged = sorted(writes + changes, key=_revision)
            if not merged:
                return
            # Only as far as both tables were read (a full batch may stop short).
            full = [rows[-1][0] for rows in (writes, changes) if len(rows) == batch]
            bound = min(full, default=None)
            out = merged if bound is None else [r for r in merged if r[0] <= bound]
            yield out
            if bound is None:
                return
            after = out[-1][0]

    async def _fetch_small_logs(self) -> dict[str, list[LogRow]]:
        """The change logs of the page's conversations of at most ``batch`` records, in
        groups of about ``batch`` records."""
        found: dict[str, list[LogRow]] = {}
        small = [c for c in self.convs if 0 < c.revision <= self._batch]
        group: list[str] = []
        size = 0
        for i, conv in enumerate(small):
            group.append(conv.id)
            size += conv.revision
            if size >= self._batch or i == len(small) - 1:
                for is_write in (True, False):
                    for cid, row in await self._log(group, 0, is_write, None):
                        found.setdefault(cid, []).append(row)
                group, size = [], 0
        for rows in found.values():
            rows.sort(key=_revision)
        return found

    async def _log(
        self, ids: list[str], after: int, writes: bool, limit: int | None
    ) -> list[tuple[str, LogRow]]:
        """(conversation, record) pairs of ``ids`` after revision ``after`` from the
        writes table (``writes``) or the changes table, by conversation and revision."""
        if writes:
            w = s.writes
            stmt = select(w.c.conversation_id, w.c.revision, w.c.created_at, w.c.appended).where(
                w.c.conversation_id.in_(ids), w.c.revision.is_not(None), w.c.revision > after
            )
            order = [w.c.conversation_id, w.c.revision]
        else:
            ch = s.changes
            stmt = select(
                ch.c.conversation_id, ch.c.revision, ch.c.kind, ch.c.author, ch.c.at, ch.c.record
            ).where(ch.c.conversation_id.in_(ids), ch.c.revision > after)
            order = [ch.c.conversation_id, ch.c.revision]
        stmt = stmt.order_by(*order)
        if limit is not None:
            stmt = stmt.limit(limit)
        rows: Sequence[Any] = (await self.conn.execute(stmt)).all()
        if writes:
            return [
                (r[0], (int(r[1]), "write", None, r[2], write_record(int(r[3] or 0)))) for r in rows
            ]
        return [(r[0], (int(r[1]), r[2], r[3], r[4], r[5])) for r in rows]


class Source:
    """A store's conversations (all it sees, those given, or a user's), page by page."""

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
        self._batch = batch
        scope = ctx.scope(user) if ctx.sees(user) else false()
        self._visible: ColumnElement[bool] = true() if scope is None else scope
        driver = ctx.executor.driver
        convert = message_time(driver.dialect, driver.result_processor(_msg.c.created_at.type))
        self._time: Callable[[Any], Any] = convert or _same

    def _select(self, *cols: Any) -> Select[Any]:
        return select(*cols).where(self._visible)

    async def check_ids(self) -> None:
        """Raise ``NotFound`` naming the first given id that is not there (or not seen)."""
        if self._ids is None:
            return
        for i in range(0, len(self._ids), _PAGE):
            chunk = self._ids[i : i + _PAGE]
            async with self._ctx.executor.session("read", action="export") as conn:
                stmt = self._select(_conv.c.id).where(_conv.c.id.in_(chunk))
                found = set((await conn.execute(stmt)).scalars())
            for cid in chunk:
                if cid not in found:
                    raise not_found(cid)

    async def totals(self) -> tuple[int, int]:
        """How many conversations and messages the source holds (for progress)."""
        stmt = self._select(func.count(), func.coalesce(func.sum(_conv.c.length), 0))
        if self._ids is not None:
            if len(self._ids) > _PAGE * 10:
                return len(self._ids), 0
            stmt = stmt.where(_conv.c.id.in_(self._ids))
        async with self._ctx.executor.session("read", action="count") as conn:
            row = (await conn.execute(stmt)).one()
        return int(row[0]), int(row[1])

    async def _id_pages(self) -> AsyncIterator[list[tuple[str, int]]]:
        """Runs of (id, length), each holding about ten batches of messages."""
        budget = self._batch * 10
        if self._ids is not None:
            pending: list[tuple[str, int]] = []
            for i in range(0, len(self._ids), _PAGE):
                chunk = self._ids[i : i + _PAGE]
                async with self._ctx.executor.session("read", action="export") as conn:
                    stmt = self._select(_conv.c.id, _conv.c.length).where(_conv.c.id.in_(chunk))
                    lengths = {r[0]: r[1] for r in await conn.execute(stmt)}
                pending.extend((c, int(lengths[c])) for c in chunk if c in lengths)
                for page in _cut(pending, budget, final=False):
                    yield page
            for page in _cut(pending, budget, final=True):
                yield page
            return
        last: str | None = None
        while True:
            stmt = self._select(_conv.c.id, _conv.c.length).order_by(_conv.c.id).limit(_PAGE)
            if last is not None:
                stmt = stmt.where(_conv.c.id > last)
            async with self._ctx.executor.session("read", action="export") as conn:
                rows = [(r[0], int(r[1])) for r in await conn.execute(stmt)]
            if not rows:
                return
            last = rows[-1][0]
            while rows:
                yield next(iter(_cut(rows, budget, final=True)))

    async def pages(self) -> AsyncGenerator[Page, None]:
        """Pages of conversations; each is valid until the next is asked for."""
        async for run in self._id_pages():
            ids = [cid for cid, _length in run]
            async with self._ctx.executor.session("snapshot", action="read") as conn:
                convs = await _read_convs(conn, ids, self._visible)
                yield Page(conn, convs, self._batch, self._time)


def _columns(conn: AsyncConnection) -> list[ColumnElement[Any]]:
    """The message columns read, ``created_at`` as the driver gives it in a read of
    messages (``dialects.message_columns``; converted by ``Page._rows``)."""
    at = type_coerce(message_columns(conn.dialect)[2], NullType())
    return [at if name == "created_at" else _msg.c[name] for name in _ROWS]


def _same(value: Any) -> Any:
    return value


def _revision(row: LogRow) -> int:
    return row[0]


def _cut(pending: list[tuple[str, int]], budget: int, *, final: bool) -> Iterable[list[Any]]:
    """Take runs whose lengths add up to ``budget`` off the front of ``pending``."""
    while pending:
        total = 0
        for n, (_cid, length) in enumerate(pending):
            total += length
            if total >= budget:
                run = pending[: n + 1]
                del pending[: n + 1]
                yield run
                break
        else:
            if not final and len(pending) < _PAGE:
                return
            run = pending[:]
            pending.clear()
            yield run


async def _read_convs(
    conn: AsyncConnection, ids: list[str], visible: ColumnElement[bool]
) -> list[StoredConversation]:
    """The rows, metadata, summaries and list lengths of those of ``ids`` still seen."""
    found: dict[str, StoredConversation] = {}
    stmt = select(
        _conv.c.id,
        _conv.c.owner,
        _conv.c.system_prompt,
        _conv.c.length,
        _conv.c.created_at,
        _conv.c.updated_at,
        _conv.c.revision,
        _conv.c.next_entry,
        _conv.c.next_aside,
        _conv.c.halted,
    ).where(_conv.c.id.in_(ids), visible)
    for r in await conn.execute(stmt):
        found[r.id] = StoredConversation(
            r.id,
            r.owner,
            r.system_prompt,
            int(r.length),
            r.created_at,
            r.updated_at,
            int(r.revision),
            int(r.next_entry),
            int(r.next_aside),
            r.halted,
        )
    ids = [cid for cid in ids if cid in found]
    a, t = s.asides, s.turns
    with_asides = [cid for cid in ids if found[cid].next_aside > 1]
    if with_asides:
        for ar in await conn.execute(
            select(a.c.conversation_id, a.c.aside_id, a.c.after, a.c.home, a.c.value)
            .where(a.c.conversation_id.in_(with_asides))
            .order_by(a.c.conversation_id, a.c.aside_id)
        ):
            found[ar[0]].asides.append(tuple(ar[1:]))
    changed = [cid for cid in ids if found[cid].revision > 0]
    if changed:
        for tr in await conn.execute(
            select(
                t.c.conversation_id,
                t.c.number,
                t.c.start,
                t.c.opened_at,
                t.c.end,
                t.c.ended_at,
                t.c.usage,
            )
            .where(t.c.conversation_id.in_(changed))
            .order_by(t.c.conversation_id, t.c.number)
        ):
            found[tr[0]].turns.append(tuple(tr[1:]))
    md, sm, ls = s.metadata_entries, s.summaries, s.lists
    for m in await conn.execute(
        select(md.c.conversation_id, md.c.key, md.c.value)
        .where(md.c.conversation_id.in_(ids))
        .order_by(md.c.conversation_id, md.c.key)
    ):
        found[m.conversation_id].metadata.append((m.key, m.value))
    summaries = select(sm).where(sm.c.conversation_id.in_(ids))
    for summary in (
        await conn.execute(summaries.order_by(sm.c.conversation_id, sm.c.seq))
    ).mappings():
        srow = dict(summary)
        found[srow.pop("conversation_id")].summaries.append(srow)
    for li in await conn.execute(
        select(ls.c.conversation_id, ls.c.name, ls.c.length)
        .where(ls.c.conversation_id.in_(ids))
        .order_by(ls.c.conversation_id, ls.c.name)
    ):
        found[li.conversation_id].lists.append((li.name, int(li.length)))
    return [found[cid] for cid in ids]
