"""Reading a store's conversations for export and copy, page by page, as its owner sees them.

A page is a run of conversations (in id order, or in the order given) whose messages add
up to about ten batches; it is read in one snapshot transaction, so a conversation's
row, messages and lists always agree. Messages and list items are read a batch at a
time, so memory stays bounded however large a conversation is. Through a scoped view
only the view's user's conversations are seen; any other id is ``NotFound``.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, Select, false, func, select, true, type_coerce
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.types import NullType

from . import _schema as s
from ._context import Context, not_found

__all__ = ["Page", "Source", "StoredConversation"]

_conv = s.conversations
_msg = s.messages
_PAGE = 200  # conversations looked at per page of ids
_ROWS = ("position", "role", "data", "token_count", "created_at", "search_text")
Row = Sequence[Any]


@dataclass
class StoredConversation:
    """One conversation's row and its small parts (messages and list items stream)."""

    id: str
    owner: str | None
    system_prompt: str | None
    length: int
    created_at: datetime
    updated_at: datetime
    metadata: list[tuple[str, str]] = field(default_factory=list)  # stored key, JSON text
    summaries: list[dict[str, Any]] = field(default_factory=list)  # table columns
    lists: list[tuple[str, int]] = field(default_factory=list)


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
        cols = _columns()
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
        cols = [*_columns(), _msg.c.conversation_id]
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
        convert = ctx.executor.driver.result_processor(_msg.c.created_at.type)
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


def _columns() -> list[ColumnElement[Any]]:
    """The message columns read, ``created_at`` as the driver gives it (see ``Page._rows``)."""
    return [
        type_coerce(_msg.c[name], NullType()) if name == "created_at" else _msg.c[name]
        for name in _ROWS
    ]


def _same(value: Any) -> Any:
    return value


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
    ).where(_conv.c.id.in_(ids), visible)
    for r in await conn.execute(stmt):
        found[r.id] = StoredConversation(
            r.id, r.owner, r.system_prompt, int(r.length), r.created_at, r.updated_at
        )
    ids = [cid for cid in ids if cid in found]
    md, sm, ls = s.metadata_entries, s.summaries, s.lists
    for m in await conn.execute(
        select(md.c.conversation_id, md.c.key, md.c.value)
        .where(md.c.conversation_id.in_(ids))
        .order_by(md.c.conversation_id, md.c.key)
    ):
        found[m.conversation_id].metadata.append((m.key, m.value))
    for r in await conn.execute(
        select(sm).where(sm.c.conversation_id.in_(ids)).order_by(sm.c.conversation_id, sm.c.seq)
    ):
        srow = dict(r._mapping)
        found[srow.pop("conversation_id")].summaries.append(srow)
    for li in await conn.execute(
        select(ls.c.conversation_id, ls.c.name, ls.c.length)
        .where(ls.c.conversation_id.in_(ids))
        .order_by(ls.c.conversation_id, ls.c.name)
    ):
        found[li.conversation_id].lists.append((li.name, int(li.length)))
    return [found[cid] for cid in ids]
