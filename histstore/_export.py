"""Moving whole conversations: export to JSON Lines, import from it, copy between stores.

All three stream: memory stays bounded by one batch of rows, however large the store
or a conversation is.

The export format (version 1)
-----------------------------

UTF-8 text, one JSON object per line. Times are ISO 8601 strings in UTC with
microseconds (``2025-01-31T12:00:00.123456+00:00``). The first line is the header, the
last the footer; in between, each conversation is a ``conversation`` record, the
records that belong to it, and an ``end`` record::

    {"format": "histstore", "version": 1, "exported_at": TIME}
    {"type": "conversation", "id": ID, "user": OWNER|null, "system_prompt": STR|null,
     "created_at": TIME, "updated_at": TIME, "messages": N, "metadata": {KEY: VALUE}}
    {"type": "message", "position": P, "created_at": TIME, "token_count": INT|null,
     "data": MESSAGE}                       N of these, positions 0 to N-1 in order
    {"type": "summary", "start": S, "end": E, "content": VALUE, "token_count": INT|null,
     "created_at": TIME}                    in the order they were added
    {"type": "list", "name": NAME, "length": K}
    {"type": "item", "value": VALUE}        K of these after their list; a bytes item
    {"type": "item", "bytes": BASE64}       is standard base64
    {"type": "end", "id": ID}
    {"type": "footer", "conversations": C, "messages": M}

``MESSAGE`` is the message's JSON object exactly as stored. Idempotency records are
not exported. A reader refuses a file whose ``version`` is newer than it knows; later
versions only add record types or keys, which a version-1 reader would ignore.

Import and copy semantics
-------------------------

Each conversation is written whole or not at all; several small conversations share
a transaction (up to ``batch`` rows). A conversation already at the destination with
the same creation time, last-change time and length is taken as already copied and
skipped; any other conversation with that id is replaced (messages, summaries,
metadata, lists, owner, system prompt; its idempotency records are dropped).
Conversations only at the destination are left alone. So an interrupted import or copy
can simply be run again: it skips what it finished and redoes the rest.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterable, Sequence
from contextlib import aclosing
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import IO, Any

from sqlalchemy import Dialect, Table, delete, func, select
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from . import _codec
from . import _schema as s
from ._dialects import Mode, for_update
from ._dberrors import translate_errors
from ._errors import HistStoreError, InvalidMessage, NotFound
from ._ids import validate_id
from ._models import Summary
from ._store import Store

__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "FormatError",
    "TransferStats",
    "copy_store",
    "export_store",
    "import_store",
]

FORMAT_NAME = "histstore"
FORMAT_VERSION = 1
DEFAULT_BATCH = 1000

_conv = s.conversations
_msg = s.messages
_PAGE = 200  # conversations looked at per page of ids
# A message row: (position, role, data, token_count, created_at); an item row:
# (idx, value, blob). Plain tuples: building a dict per row would double the cost.
_ROWS = ("position", "role", "data", "token_count", "created_at")
MessageRow = Sequence[Any]
ItemRow = Sequence[Any]


class FormatError(HistStoreError, ValueError):
    """An import file does not follow the export format; names the line."""


@dataclass
class TransferStats:
    """What an export, import or copy did so far (handed to progress callbacks)."""

    conversations: int = 0
    skipped: int = 0
    messages: int = 0
    total_messages: int | None = None
    bytes_read: int = 0


Progress = Callable[[TransferStats], None]


@dataclass
class _Conv:
    """One conversation's row and its small parts (messages and list items stream)."""

    id: str
    owner: str | None
    system_prompt: str | None
    length: int
    created_at: datetime
    updated_at: datetime
    metadata: list[dict[str, Any]] = field(default_factory=list)  # key, value, digest
    summaries: list[dict[str, Any]] = field(default_factory=list)  # table columns
    lists: list[tuple[str, int]] = field(default_factory=list)


# ---------------------------------------------------------------------------- reading


class _Page:
    """Conversations read in one snapshot transaction; messages and items on demand."""

    def __init__(self, conn: AsyncConnection, convs: list[_Conv], batch: int) -> None:
        self.conn = conn
        self.convs = convs
        self._batch = batch
        self._small: dict[str, list[MessageRow]] | None = None

    async def messages(self, conv: _Conv) -> AsyncIterator[list[MessageRow]]:
        """The conversation's message rows in position order, a batch at a time."""
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
        cols = [_msg.c[name] for name in _ROWS]
        while True:
            stmt = (
                select(*cols)
                .where(_msg.c.conversation_id == conv.id, _msg.c.position >= position)
                .order_by(_msg.c.position)
                .limit(self._batch)
            )
            rows = list((await self.conn.execute(stmt)).tuples())
            if not rows:
                return
            yield rows
            if len(rows) < self._batch:
                return
            position = rows[-1][0] + 1

    async def _fetch_small(self) -> dict[str, list[MessageRow]]:
        """Every message of the page's small conversations, in groups of ``batch`` rows."""
        found: dict[str, list[MessageRow]] = {}
        group: list[str] = []
        size = 0
        small = [c for c in self.convs if 0 < c.length <= self._batch]
        cols = [*(_msg.c[name] for name in _ROWS), _msg.c.conversation_id]
        for i, conv in enumerate(small):
            group.append(conv.id)
            size += conv.length
            last = i == len(small) - 1
            if size >= self._batch or last:
                stmt = (
                    select(*cols)
                    .where(_msg.c.conversation_id.in_(group))
                    .order_by(_msg.c.conversation_id, _msg.c.position)
                )
                for r in (await self.conn.execute(stmt)).tuples():
                    found.setdefault(r[5], []).append(r)
                group, size = [], 0
        return found

    async def items(self, conv: _Conv, name: str) -> AsyncIterator[list[ItemRow]]:
        """A named list's item rows (``idx``, ``value``, ``blob``), a batch at a time."""
        li = s.list_items
        idx = 0
        while True:
            stmt = (
                select(li.c.idx, li.c.value, li.c.blob)
                .where(li.c.conversation_id == conv.id, li.c.name == name, li.c.idx >= idx)
                .order_by(li.c.idx)
                .limit(self._batch)
            )
            rows: list[ItemRow] = list((await self.conn.execute(stmt)).tuples())
            if not rows:
                return
            yield rows
            if len(rows) < self._batch:
                return
            idx = rows[-1][0] + 1


def _engine(store: Store, mode: Mode) -> AsyncEngine:
    """The store's engine set up for one kind of transaction (see ``mode_options``)."""
    return store._executor._engines[mode]


class _Source:
    """Reads a store's conversations page by page, each page in one snapshot.

    A page is a run of conversations (in id order, or the order given) whose messages
    add up to about ten batches; it is read in one snapshot transaction, so a
    conversation's row, messages and lists always agree.
    """

    def __init__(
        self,
        store: Store,
        *,
        ids: Sequence[str] | None = None,
        user: str | None = None,
        batch: int = DEFAULT_BATCH,
    ) -> None:
        self._store = store
        self._ids = list(dict.fromkeys(ids)) if ids is not None else None
        self._user = user
        self._batch = batch
        self._engine = _engine(store, "snapshot")

    async def check_ids(self) -> None:
        """Raise ``NotFound`` naming the first given id that does not exist."""
        if self._ids is None:
            return
        for i in range(0, len(self._ids), _PAGE):
            chunk = self._ids[i : i + _PAGE]
            async with _engine(self._store, "read").connect() as conn:
                found = set(
                    (await conn.execute(select(_conv.c.id).where(_conv.c.id.in_(chunk)))).scalars()
                )
            for cid in chunk:
                if cid not in found:
                    raise NotFound(f"conversation {cid!r} not found")

    async def totals(self) -> tuple[int, int]:
        """How many conversations and messages the source holds (for progress)."""
        stmt = select(func.count(), func.coalesce(func.sum(_conv.c.length), 0))
        if self._ids is not None:
            if len(self._ids) > _PAGE * 10:
                return len(self._ids), 0
            stmt = stmt.where(_conv.c.id.in_(self._ids))
        elif self._user is not None:
            stmt = stmt.where(_conv.c.owner == self._user)
        with translate_errors("count"):
            async with _engine(self._store, "read").connect() as conn:
                row = (await conn.execute(stmt)).one()
        return int(row[0]), int(row[1])

    async def _id_pages(self) -> AsyncIterator[list[tuple[str, int]]]:
        """Runs of (id, length), each holding about ten batches of messages."""
        budget = self._batch * 10
        if self._ids is not None:
            pending: list[tuple[str, int]] = []
            for i in range(0, len(self._ids), _PAGE):
                chunk = self._ids[i : i + _PAGE]
                async with _engine(self._store, "read").connect() as conn:
                    stmt = select(_conv.c.id, _conv.c.length).where(_conv.c.id.in_(chunk))
                    lengths = {r[0]: r[1] for r in await conn.execute(stmt)}
                pending.extend((c, int(lengths[c])) for c in chunk if c in lengths)
                for page in _cut(pending, budget, final=False):
                    yield page
            for page in _cut(pending, budget, final=True):
                yield page
            return
        last: str | None = None
        while True:
            stmt = select(_conv.c.id, _conv.c.length).order_by(_conv.c.id).limit(_PAGE)
            if self._user is not None:
                stmt = stmt.where(_conv.c.owner == self._user)
            if last is not None:
                stmt = stmt.where(_conv.c.id > last)
            async with _engine(self._store, "read").connect() as conn:
                rows = [(r[0], int(r[1])) for r in await conn.execute(stmt)]
            if not rows:
                return
            last = rows[-1][0]
            while rows:
                yield next(iter(_cut(rows, budget, final=True)))

    async def pages(self) -> AsyncGenerator[_Page, None]:
        """Pages of conversations; each is valid until the next is asked for."""
        async for run in self._id_pages():
            ids = [cid for cid, _length in run]
            with translate_errors("read"):
                async with self._engine.connect() as conn, conn.begin():
                    convs = await _read_convs(conn, ids)
                    yield _Page(conn, convs, self._batch)


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


async def _read_convs(conn: AsyncConnection, ids: list[str]) -> list[_Conv]:
    """The conversation rows, metadata, summaries and list lengths of ``ids``."""
    found: dict[str, _Conv] = {}
    stmt = select(
        _conv.c.id,
        _conv.c.owner,
        _conv.c.system_prompt,
        _conv.c.length,
        _conv.c.created_at,
        _conv.c.updated_at,
    ).where(_conv.c.id.in_(ids))
    for r in await conn.execute(stmt):
        found[r.id] = _Conv(
            r.id, r.owner, r.system_prompt, int(r.length), r.created_at, r.updated_at
        )
    md, sm, ls = s.metadata_entries, s.summaries, s.lists
    for m in await conn.execute(
        select(md.c.conversation_id, md.c.key, md.c.value, md.c.digest)
        .where(md.c.conversation_id.in_(ids))
        .order_by(md.c.conversation_id, md.c.key)
    ):
        row = dict(m._mapping)
        found[row.pop("conversation_id")].metadata.append(row)
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
    return [found[cid] for cid in ids if cid in found]


# ---------------------------------------------------------------------------- writing


class _Sink:
    """Writes whole conversations into a store, replacing or skipping existing ones.

    Use as an async context manager. Rows are buffered and inserted ``batch`` at a
    time; the transaction is committed between conversations once it holds ``batch``
    rows, so a conversation is never split across transactions. Leaving the block by an
    exception rolls back the conversations not yet committed.
    """

    def __init__(self, store: Store, *, batch: int = DEFAULT_BATCH) -> None:
        self._store = store
        self._batch = batch
        self._conn: AsyncConnection | None = None
        self._buffers: dict[Table, list[tuple[Any, ...]]] = {}
        self._inserts: dict[Table, _BulkInsert] = {}
        self._inflight: asyncio.Future[None] | None = None
        self._known: dict[str, Any] = {}
        self._rows_in_tx = 0
        self._current: _Conv | None = None
        self._received = 0
        self._items: dict[str, int] = {}
        self._pending: set[str] = set()  # ids buffered in the open transaction

    async def __aenter__(self) -> _Sink:
        return self

    async def __aexit__(self, exc_type: object, exc: object, tb: object) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        try:
            if exc_type is None:
                with translate_errors("import"):
                    await self._flush(conn)
                    await conn.commit()
            else:
                task, self._inflight = self._inflight, None
                if task is not None:
                    task.cancel()
                    await asyncio.gather(task, return_exceptions=True)
                await conn.rollback()
        finally:
            await conn.close()

    async def _connection(self) -> AsyncConnection:
        if self._conn is None:
            with translate_errors("import"):
                self._conn = await _engine(self._store, "write").connect()
                await self._conn.begin()
        return self._conn

    async def prefetch(self, ids: Sequence[str]) -> None:
        """Look up at once which of ``ids`` exist at the destination (and as what)."""
        conn = await self._connection()
        stmt = select(_conv.c.id, _conv.c.length, _conv.c.created_at, _conv.c.updated_at).where(
            _conv.c.id.in_(ids)
        )
        with translate_errors("import"):
            await self._settle()
            rows = {r.id: r for r in await conn.execute(for_update(conn.dialect, stmt))}
        for cid in ids:
            self._known[cid] = rows.get(cid)

    async def begin(self, conv: _Conv) -> bool:
        """Start writing ``conv``; False when an identical copy is there already."""
        conn = await self._connection()
        there: Any
        with translate_errors("import", conv.id):
            await self._settle()
            if conv.id in self._pending:  # the same id again: the later one wins
                await self._flush(conn)
                self._known.pop(conv.id, None)
            if conv.id in self._known:
                there = self._known.pop(conv.id)
            else:
                stmt = select(_conv.c.length, _conv.c.created_at, _conv.c.updated_at).where(
                    _conv.c.id == conv.id
                )
                there = (await conn.execute(for_update(conn.dialect, stmt))).first()
            if there is not None:
                if (there.length, there.created_at, there.updated_at) == (
                    conv.length,
                    conv.created_at,
                    conv.updated_at,
                ):
                    return False
                await self._flush(conn)
                for table in s.CONVERSATION_TABLES:
                    await conn.execute(delete(table).where(table.c.conversation_id == conv.id))
                await conn.execute(delete(_conv).where(_conv.c.id == conv.id))
        self._current = conv
        self._pending.add(conv.id)
        self._received = 0
        self._items = {}
        self._add_dicts(
            _conv,
            [
                {
                    "id": conv.id,
                    "owner": conv.owner,
                    "system_prompt": conv.system_prompt,
                    "length": conv.length,
                    "created_at": conv.created_at,
                    "updated_at": conv.updated_at,
                }
            ],
        )
        self._add_dicts(s.metadata_entries, conv.metadata)
        self._add_dicts(s.summaries, conv.summaries)
        self._add(s.lists, [(conv.id, n, k) for n, k in conv.lists])
        return True

    def add_summary(self, row: dict[str, Any]) -> None:
        assert self._current is not None
        self._add_dicts(s.summaries, [row])

    def add_list(self, name: str, length: int) -> None:
        assert self._current is not None
        self._add(s.lists, [(self._current.id, name, length)])

    async def add_messages(self, rows: Sequence[MessageRow]) -> None:
        """Add message rows of the current conversation, in position order."""
        conv = self._current
        assert conv is not None
        cid = conv.id
        expected = self._received
        if rows[0][0] != expected or rows[-1][0] != expected + len(rows) - 1:
            for i, row in enumerate(rows):
                if row[0] != expected + i:
                    raise FormatError(
                        f"conversation {cid!r}: message at position {row[0]} where"
                        f" {expected + i} was expected"
                    )
        self._received += len(rows)
        self._add(
            _msg, [(cid, p, role, data, tokens, at) for p, role, data, tokens, at, *_ in rows]
        )
        await self._flush_full()

    async def add_items(self, name: str, rows: Sequence[ItemRow]) -> None:
        """Add item rows of one of the current conversation's lists."""
        conv = self._current
        assert conv is not None
        self._items[name] = self._items.get(name, 0) + len(rows)
        self._add(s.list_items, [(conv.id, name, i, v, b) for i, v, b in rows])
        await self._flush_full()

    async def end(self, lists: Iterable[tuple[str, int]]) -> None:
        """Finish the current conversation; commit when the transaction is full."""
        conv = self._current
        assert conv is not None
        if self._received != conv.length:
            raise FormatError(
                f"conversation {conv.id!r} has {self._received} messages where its record"
                f" says {conv.length}"
            )
        for name, length in lists:
            if self._items.get(name, 0) != length:
                raise FormatError(
                    f"conversation {conv.id!r}: list {name!r} has {self._items.get(name, 0)}"
                    f" items where its record says {length}"
                )
        self._current = None
        if self._rows_in_tx >= self._batch and self._conn is not None:
            with translate_errors("import", conv.id):
                await self._flush(self._conn)
                await self._conn.commit()
                await self._conn.begin()
            self._rows_in_tx = 0
            self._pending.clear()

    def _add(self, table: Table, rows: list[tuple[Any, ...]]) -> None:
        """Buffer rows given as tuples in the table's column order."""
        if rows:
            self._buffers.setdefault(table, []).extend(rows)
            self._rows_in_tx += len(rows)

    def _add_dicts(self, table: Table, rows: Iterable[dict[str, Any]]) -> None:
        """Buffer rows of the current conversation given as dicts (without its id)."""
        conv = self._current
        assert conv is not None
        names = [c.name for c in table.c]
        fixed = {"conversation_id": conv.id}
        self._add(table, [tuple({**r, **fixed}[n] for n in names) for r in rows])

    async def _flush_full(self) -> None:
        """Once a buffer is full, insert the buffered rows while the caller goes on.

        The inserts run in a task, so reading and decoding the next rows overlaps with
        the database's work (aiosqlite's thread, or the Postgres server). At most one
        such task is in flight; every other use of the connection waits for it first.
        """
        if any(len(rows) >= self._batch for rows in self._buffers.values()):
            conn = self._conn
            assert conn is not None
            with translate_errors("import", self._current.id if self._current else None):
                await self._settle()
            batches = self._take()
            self._inflight = asyncio.ensure_future(self._write(conn, batches))
            await asyncio.sleep(0)  # let the task hand its first statement over

    async def _settle(self) -> None:
        """Wait for the inserts in flight (raising their error, if any)."""
        task, self._inflight = self._inflight, None
        if task is not None:
            await task

    async def _flush(self, conn: AsyncConnection) -> None:
        await self._settle()
        await self._write(conn, self._take())

    def _take(self) -> list[tuple[Table, list[tuple[Any, ...]]]]:
        taken = [(table, self._buffers.pop(table, [])) for table in _INSERT_ORDER]
        return [(table, rows) for table, rows in taken if rows]

    async def _write(
        self, conn: AsyncConnection, batches: list[tuple[Table, list[tuple[Any, ...]]]]
    ) -> None:
        for table, rows in batches:
            insert = self._inserts.get(table)
            if insert is None:
                insert = self._inserts[table] = _BulkInsert(table, conn.dialect)
            await insert.run(conn, rows)


_INSERT_ORDER = (_conv, s.metadata_entries, s.summaries, s.lists, _msg, s.list_items)


class _BulkInsert:
    """An ``INSERT`` of every column, run as the driver's own ``executemany``.

    The statement is SQLAlchemy's compilation of ``table.insert()`` for the dialect, and
    values go through the columns' own bind processors (those of ``UTCDateTime``, for
    one); what is skipped is SQLAlchemy's per-row parameter handling, which costs more
    than the database's work for rows this small.
    """

    def __init__(self, table: Table, dialect: Dialect) -> None:
        compiled = table.insert().compile(dialect=dialect)
        names = [c.name for c in table.c]
        if list(compiled.positiontup or ()) != names:
            raise HistStoreError(f"unexpected parameter order for {table.name}")
        self._sql = str(compiled)
        self._processors = [
            (i, proc)
            for i, c in enumerate(table.c)
            if (proc := c.type.dialect_impl(dialect).bind_processor(dialect)) is not None
        ]
        self._last: dict[int, tuple[Any, Any]] = {}

    async def run(self, conn: AsyncConnection, rows: list[tuple[Any, ...]]) -> None:
        if self._processors:
            rows = [self._process(row) for row in rows]
        await conn.exec_driver_sql(self._sql, rows)

    def _process(self, row: tuple[Any, ...]) -> tuple[Any, ...]:
        values = list(row)
        last = self._last
        for i, proc in self._processors:
            value = values[i]
            if value is None:
                continue
            seen = last.get(i)
            if seen is not None and seen[0] == value:  # rows of a batch share a time
                values[i] = seen[1]
            else:
                values[i] = processed = proc(value)
                last[i] = (value, processed)
        return tuple(values)


# ---------------------------------------------------------------------------- export


def _time(value: datetime) -> str:
    return value.astimezone(timezone.utc).isoformat(timespec="microseconds")


def _str(value: str | None) -> str:
    return json.dumps(value, ensure_ascii=False)


def _message_lines(rows: Sequence[MessageRow]) -> str:
    parts = []
    last: datetime | None = None
    stamp = ""
    for position, _role, data, tokens, created, *_ in rows:
        if created != last:  # a batch's messages share their time: format it once
            last, stamp = created, _time(created)
        count = "null" if tokens is None else int(tokens)
        parts.append(
            f'{{"type":"message","position":{position},"created_at":"{stamp}",'
            f'"token_count":{count},"data":{data}}}\n'
        )
    return "".join(parts)


def _conversation_line(conv: _Conv) -> str:
    metadata = ",".join(f"{_str(r['key'])}:{r['value']}" for r in conv.metadata)
    return (
        f'{{"type":"conversation","id":{_str(conv.id)},"user":{_str(conv.owner)},'
        f'"system_prompt":{_str(conv.system_prompt)},'
        f'"created_at":"{_time(conv.created_at)}","updated_at":"{_time(conv.updated_at)}",'
        f'"messages":{conv.length},"metadata":{{{metadata}}}}}\n'
    )


def _summary_line(row: dict[str, Any]) -> str:
    tokens = row["token_count"]
    return (
        f'{{"type":"summary","start":{row["start"]},"end":{row["end"]},'
        f'"content":{row["content"]},"token_count":{"null" if tokens is None else int(tokens)},'
        f'"created_at":"{_time(row["created_at"])}"}}\n'
    )


def _item_line(row: ItemRow) -> str:
    _idx, value, blob = row
    if value is None:
        data = base64.b64encode(bytes(blob)).decode("ascii")
        return f'{{"type":"item","bytes":"{data}"}}\n'
    return f'{{"type":"item","value":{value}}}\n'


async def export_store(
    store: Store,
    out: IO[str],
    *,
    ids: Sequence[str] | None = None,
    user: str | None = None,
    batch: int = DEFAULT_BATCH,
    progress: Progress | None = None,
) -> TransferStats:
    """Write the store's conversations (or those given, or a user's) as JSON Lines.

    Raises:
        NotFound: one of ``ids`` does not exist (checked before anything is written).
    """
    for cid in ids or ():
        validate_id(cid)
    if user is not None:
        validate_id(user, what="user")
    source = _Source(store, ids=ids, user=user, batch=batch)
    await source.check_ids()
    stats = TransferStats()
    if progress is not None:
        stats.total_messages = (await source.totals())[1]
    header = {"format": FORMAT_NAME, "version": FORMAT_VERSION, "exported_at": _time(_now())}
    out.write(json.dumps(header, separators=(",", ":")) + "\n")
    async with aclosing(source.pages()) as pages:
        async for page in pages:
            for conv in page.convs:
                await _export_conversation(page, conv, out, stats, progress)
            if progress is not None:
                progress(stats)
    footer = {"type": "footer", "conversations": stats.conversations, "messages": stats.messages}
    out.write(json.dumps(footer, separators=(",", ":")) + "\n")
    out.flush()
    return stats


async def _export_conversation(
    page: _Page, conv: _Conv, out: IO[str], stats: TransferStats, progress: Progress | None
) -> None:
    out.write(_conversation_line(conv))
    async for rows in page.messages(conv):
        out.write(_message_lines(rows))
        stats.messages += len(rows)
        if progress is not None:
            progress(stats)
    out.write("".join(_summary_line(r) for r in conv.summaries))
    for name, length in conv.lists:
        out.write(f'{{"type":"list","name":{_str(name)},"length":{length}}}\n')
        async for rows in page.items(conv, name):
            out.write("".join(_item_line(r) for r in rows))
    out.write(f'{{"type":"end","id":{_str(conv.id)}}}\n')
    stats.conversations += 1


def _now() -> datetime:
    return datetime.now(timezone.utc)


# ---------------------------------------------------------------------------- import


class _Reader:
    """Parses an export file line by line, naming the line in every error."""

    def __init__(self, lines: Iterable[bytes], stats: TransferStats) -> None:
        self._lines = iter(lines)
        self._stats = stats
        self.number = 0
        self._last_time: tuple[object, datetime] = (object(), _now())  # matches no text

    def error(self, message: str) -> FormatError:
        return FormatError(f"line {self.number}: {message}")

    def next(self) -> dict[str, Any] | None:
        for raw in self._lines:
            self.number += 1
            self._stats.bytes_read += len(raw)
            if not raw.strip():
                continue
            try:
                # NaN and Infinity parse here, and are refused where a value is stored.
                record = json.loads(raw)
            except (UnicodeDecodeError, ValueError):
                raise self.error("not a JSON object (is this a histstore export?)") from None
            if not isinstance(record, dict):
                raise self.error("not a JSON object (is this a histstore export?)")
            return record
        return None

    def field(self, record: dict[str, Any], key: str, kind: type | tuple[type, ...]) -> Any:
        value = record.get(key)
        if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
            raise self.error(f"{record.get('type', 'record')} has no valid {key!r}")
        return value

    def time(self, record: dict[str, Any], key: str) -> datetime:
        text = record.get(key)
        if text == self._last_time[0]:  # neighbouring records often share a time
            return self._last_time[1]
        text = self.field(record, key, str)
        try:
            value = datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            raise self.error(f"{key!r} is not an ISO 8601 time") from None
        if value.tzinfo is None:
            raise self.error(f"{key!r} has no time zone")
        value = value.astimezone(timezone.utc)
        self._last_time = (text, value)
        return value

    def count(self, record: dict[str, Any], key: str) -> int | None:
        value = record.get(key)
        if value is None:
            return None
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise self.error(f"{key!r} must be an int >= 0 or null")
        return value

    def ident(self, record: dict[str, Any], key: str, what: str) -> str:
        try:
            return validate_id(record.get(key), what=what)
        except HistStoreError as exc:
            raise self.error(str(exc)) from None


async def import_store(
    store: Store,
    lines: Iterable[bytes],
    *,
    batch: int = DEFAULT_BATCH,
    progress: Progress | None = None,
) -> TransferStats:
    """Import an export file (given as its lines) into ``store``.

    Every record is validated as it is read; a conversation is written whole or not at
    all. See the module docstring for what is replaced and what is skipped.

    Raises:
        FormatError: the file is not a valid export (names the line); conversations
            before the faulty one are imported, the faulty one is not.
    """
    stats = TransferStats()
    reader = _Reader(lines, stats)
    header = reader.next()
    if header is None or header.get("format") != FORMAT_NAME:
        raise reader.error("not a histstore export (no header)")
    version = header.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise reader.error("the header has no valid 'version'")
    if version > FORMAT_VERSION:
        raise reader.error(
            f"the file is format version {version}; this histstore reads version"
            f" {FORMAT_VERSION} (upgrade histstore)"
        )
    limit = store._settings.max_message_bytes
    footer = False
    async with _Sink(store, batch=batch) as sink:
        while (record := reader.next()) is not None:
            kind = record.get("type")
            if kind == "footer":
                footer = True
                if reader.next() is not None:
                    raise reader.error("records after the footer")
                break
            if kind != "conversation":
                raise reader.error(f"expected a conversation record, found {kind!r}")
            conv = _conv_from(reader, record)
            if await sink.begin(conv):
                await _import_conversation(reader, sink, conv, limit, batch, stats)
                stats.conversations += 1
            else:
                _skip_conversation(reader, conv)
                stats.skipped += 1
            if progress is not None:
                progress(stats)
    if not footer:
        raise FormatError(
            f"line {reader.number}: the file ends before its footer (truncated?);"
            " the conversations before this point were imported"
        )
    return stats


def _conv_from(reader: _Reader, record: dict[str, Any]) -> _Conv:
    cid = reader.ident(record, "id", "conversation id")
    user = record.get("user")
    if user is not None:
        user = reader.ident(record, "user", "user")
    prompt = record.get("system_prompt")
    if prompt is not None and not isinstance(prompt, str):
        raise reader.error("'system_prompt' must be a string or null")
    length = reader.count(record, "messages")
    if length is None:
        raise reader.error("the conversation has no 'messages' count")
    metadata = record.get("metadata") or {}
    if not isinstance(metadata, dict):
        raise reader.error("'metadata' must be an object")
    rows = []
    for key, value in metadata.items():
        try:
            validate_id(key, what="metadata key")
            text, copy, _size = _codec.encode(value, what="metadata value")
        except HistStoreError as exc:
            raise reader.error(f"conversation {cid!r}: {exc}") from None
        rows.append({"key": key, "value": text, "digest": _codec.canonical_digest(copy)})
    return _Conv(
        cid,
        user,
        prompt,
        length,
        reader.time(record, "created_at"),
        reader.time(record, "updated_at"),
        metadata=rows,
    )


async def _import_conversation(
    reader: _Reader, sink: _Sink, conv: _Conv, limit: int, batch: int, stats: TransferStats
) -> None:
    rows: list[MessageRow] = []
    lists: list[tuple[str, int]] = []
    seq = 0
    while True:
        record = reader.next()
        if record is None:
            raise reader.error(f"the file ends inside conversation {conv.id!r} (truncated?)")
        kind = record.get("type")
        if kind == "message":
            rows.append(_message_row(reader, record, conv.id, limit))
            if len(rows) >= batch:
                await sink.add_messages(rows)
                stats.messages += len(rows)
                rows = []
        elif kind == "summary":
            sink.add_summary(_summary_row(reader, record, seq))
            seq += 1
        elif kind == "list":
            name = reader.ident(record, "name", "list name")
            length = reader.count(record, "length")
            if length is None or any(n == name for n, _k in lists):
                raise reader.error(f"list {name!r} has no valid length or comes twice")
            sink.add_list(name, length)
            lists.append((name, length))
            await _import_items(reader, sink, name, length, batch)
        elif kind == "end":
            if record.get("id") != conv.id:
                raise reader.error(f"the end record does not match conversation {conv.id!r}")
            break
        else:
            raise reader.error(f"unexpected {kind!r} record in conversation {conv.id!r}")
    if rows:
        await sink.add_messages(rows)
        stats.messages += len(rows)
    await sink.end(lists)


def _message_row(reader: _Reader, record: dict[str, Any], cid: str, limit: int) -> MessageRow:
    """Validate a message record as ``Message.from_dict`` would, at a third of the cost.

    The value came from ``json.loads``, so it is made of JSON types only; encoding it
    again with the store's encoder then only fails for what ``Message`` refuses too
    (infinite floats from huge literals, lone surrogates from ``\\ud800`` escapes), and
    decoding that text back to compare (what ``from_dict`` does) would find no change.
    """
    data = record.get("data")
    if not isinstance(data, dict):
        raise reader.error(f"conversation {cid!r}: a message must be a JSON object")
    role = data.get("role")
    if not isinstance(role, str):
        role = data.get("type")
        if "role" in data or not isinstance(role, str):
            raise reader.error(f"conversation {cid!r}: a message needs a string 'role' or 'type'")
    try:
        text = _codec._encoder.encode(data)
        # ASCII text is its own UTF-8 (and holds no surrogates): no need to encode it.
        size = len(text) if text.isascii() else len(text.encode("utf-8"))
    except (ValueError, RecursionError):  # UnicodeEncodeError is a ValueError
        raise reader.error(f"conversation {cid!r}: a message is not storable JSON") from None
    if size > limit:
        raise reader.error(f"conversation {cid!r}: a message is over the size limit of {limit}")
    position = record.get("position")
    if type(position) is not int or position < 0:  # the common case costs one check
        position = reader.count(record, "position")
    tokens = record.get("token_count")
    if tokens is not None and (type(tokens) is not int or tokens < 0):
        tokens = reader.count(record, "token_count")
    return (position, role, text, tokens, reader.time(record, "created_at"))


def _summary_row(reader: _Reader, record: dict[str, Any], seq: int) -> dict[str, Any]:
    try:
        summary = Summary(
            reader.field(record, "start", int),
            reader.field(record, "end", int),
            record.get("content"),
            reader.count(record, "token_count"),
        )
        text, _copy, _size = _codec.encode(summary.content, what="summary content")
    except InvalidMessage as exc:
        raise reader.error(str(exc)) from None
    return {
        "seq": seq,
        "start": summary.start,
        "end": summary.end,
        "content": text,
        "token_count": summary.token_count,
        "created_at": reader.time(record, "created_at"),
    }


async def _import_items(reader: _Reader, sink: _Sink, name: str, length: int, batch: int) -> None:
    rows: list[ItemRow] = []
    for idx in range(length):
        record = reader.next()
        if record is None or record.get("type") != "item":
            raise reader.error(f"list {name!r} is missing items")
        if "bytes" in record:
            try:
                blob = base64.b64decode(reader.field(record, "bytes", str), validate=True)
            except ValueError:
                raise reader.error("'bytes' is not base64") from None
            rows.append((idx, None, blob))
        else:
            if "value" not in record:
                raise reader.error("an item has neither 'value' nor 'bytes'")
            try:
                text, _copy, _size = _codec.encode(record["value"], what="list item")
            except InvalidMessage as exc:
                raise reader.error(str(exc)) from None
            rows.append((idx, text, None))
        if len(rows) >= batch:
            await sink.add_items(name, rows)
            rows = []
    if rows:
        await sink.add_items(name, rows)


def _skip_conversation(reader: _Reader, conv: _Conv) -> None:
    while True:
        record = reader.next()
        if record is None:
            raise reader.error(f"the file ends inside conversation {conv.id!r} (truncated?)")
        if record.get("type") == "end":
            return


# ---------------------------------------------------------------------------- copy


async def copy_store(
    source: Store,
    target: Store,
    *,
    batch: int = DEFAULT_BATCH,
    progress: Progress | None = None,
) -> TransferStats:
    """Copy every conversation of ``source`` into ``target`` (see the module docstring).

    Rows go across as stored, without decoding messages.
    """
    reader = _Source(source, batch=batch)
    stats = TransferStats()
    if progress is not None:
        stats.total_messages = (await reader.totals())[1]
    async with _Sink(target, batch=batch) as sink, aclosing(reader.pages()) as pages:
        async for page in pages:
            await sink.prefetch([c.id for c in page.convs])
            for conv in page.convs:
                if not await sink.begin(conv):
                    stats.skipped += 1
                    stats.messages += conv.length
                    continue
                async for rows in page.messages(conv):
                    await sink.add_messages(rows)
                    stats.messages += len(rows)
                    if progress is not None:
                        progress(stats)
                for name, _length in conv.lists:
                    async for rows in page.items(conv, name):
                        await sink.add_items(name, rows)
                await sink.end(conv.lists)
                stats.conversations += 1
            if progress is not None:
                progress(stats)
    return stats
