"""Checkpoint storage: every statement on the ``histstore_checkpoint*`` tables.

LangGraph's checkpoints as rows, with no knowledge of LangGraph itself: the caller (the
adapter in ``histstore.integrations.langgraph``) serializes and deserializes; this module
keeps bytes, JSON text and ids. Its layout:

* ``histstore_checkpoint_threads``: one row per thread, with its owner. Every write
  upserts it first, which locks the thread (on SQLite the ``BEGIN IMMEDIATE`` write lock
  already serializes writers), so the writes of one thread never interleave.
* ``histstore_checkpoints``: one row per checkpoint, keyed ``(thread_id, checkpoint_ns,
  checkpoint_id)``. LangGraph's checkpoint ids grow with time, so the newest checkpoint
  of a namespace is the last entry of the primary key's range: reading it is one index
  probe however many checkpoints the thread holds.
* ``histstore_checkpoint_blobs``: channel values by ``(channel, version)``, written when
  a channel changes and shared by every later checkpoint that holds that version.
* ``histstore_checkpoint_channels``: which version of each channel a checkpoint reads,
  keyed by checkpoint, so its values are found by primary key.
* ``histstore_checkpoint_writes``: pending writes, keyed by checkpoint, task and index.

Reading one checkpoint (``get``) is a single statement, atomic by itself, that finds the
checkpoint's id once by index and fetches its row, values and writes together. Listing
reads a page per snapshot (``histstore._dialects.mode_options``); writes run in one write
transaction. Every transaction runs to its end when the caller is cancelled.
"""

from __future__ import annotations

import builtins
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy import (
    ColumnElement,
    CompoundSelect,
    Integer,
    Select,
    Text,
    and_,
    bindparam,
    cast,
    delete,
    exists,
    func,
    literal,
    null,
    or_,
    select,
    tuple_,
    union_all,
    update,
)
from sqlalchemy.ext.asyncio import AsyncConnection

from . import _dialects
from . import _schema as s
from ._dialects import Mode
from ._errors import ConflictError, NotFound

if TYPE_CHECKING:
    from ._store import Store

__all__ = ["Blob", "CheckpointStore", "StoredCheckpoint", "Write"]

T = TypeVar("T")

_threads = s.checkpoint_threads
_cps = s.checkpoints
_blobs = s.checkpoint_blobs
_chans = s.checkpoint_channels
_writes = s.checkpoint_writes
_PAGE = 100
"""Checkpoints read per snapshot when listing."""
_CHUNK = 400
"""Keys per ``IN`` list (well under SQLite's and asyncpg's parameter limits)."""


@dataclass(frozen=True, slots=True)
class Blob:
    """A channel's serialized value at one version (``blob`` is ``None`` for an empty one)."""

    channel: str
    version: str
    type: str
    blob: bytes | None


@dataclass(frozen=True, slots=True)
class Write:
    """One pending write of a task: its index, channel and serialized value."""

    task_id: str
    idx: int
    channel: str
    type: str
    blob: bytes
    task_path: str = ""


@dataclass(frozen=True, slots=True)
class StoredCheckpoint:
    """A checkpoint as stored, with the channel values it reads and its pending writes.

    ``metadata`` is the JSON text given to ``put``; ``values`` holds one ``Blob`` per
    channel version the checkpoint listed in ``put(blobs=...)`` that is stored (after a
    checkpoint was stored again with fewer channels, possibly more: match versions);
    ``writes`` are in LangGraph's order (task path, task id, index).
    """

    thread_id: str
    checkpoint_ns: str
    checkpoint_id: str
    parent_checkpoint_id: str | None
    type: str
    checkpoint: bytes
    metadata: str
    values: tuple[Blob, ...]
    writes: tuple[Write, ...]


@dataclass(frozen=True, slots=True)
class _Row:
    thread_id: str
    checkpoint_ns: str
    checkpoint_id: str
    parent_checkpoint_id: str | None
    type: str
    checkpoint: bytes
    metadata: str


def _now() -> datetime:
    return datetime.now(timezone.utc)


def _chunks(items: Sequence[T], size: int = _CHUNK) -> Iterable[Sequence[T]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


class CheckpointStore:
    """LangGraph checkpoints, pending writes and channel values in a store's database.

    Runs through the store's executor (its transactions, settings and schema); a scoped store
    (``store.user`` set) confines every call to the threads that user owns: threads it
    creates are owned by the user, and another owner's thread (or one owned by no one)
    behaves as if it did not exist (reads find nothing, deletes do nothing, writes and
    copies from it raise ``NotFound``). Thread ids follow histstore's id rules; callers
    validate them.

    Raises (every method): ``HistStoreError`` for database failures, with the driver's
    exception as ``__cause__``.
    """

    def __init__(self, store: Store) -> None:
        self._executor = store._executor
        self._owner = store.user
        self._dialect = store.engine.dialect
        self._get_statements = {by_id: self._get_statement(by_id) for by_id in (False, True)}

    @property
    def user(self) -> str | None:
        """The owner the checkpoints are confined to; ``None`` for every thread."""
        return self._owner

    # ------------------------------------------------------------------ plumbing

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
        return exists().where(_threads.c.thread_id == thread, _threads.c.owner == self._owner)

    async def _touch(self, conn: AsyncConnection, thread_id: str, now: datetime) -> None:
        """Create the thread (owned by this view's user) or mark it changed, locking it.

        Raises ``NotFound`` when the thread belongs to another owner.
        """
        ins = _dialects.insert(self._dialect, _threads).values(
            thread_id=thread_id, owner=self._owner, created_at=now, updated_at=now
        )
        stmt = ins.on_conflict_do_update(
            index_elements=[_threads.c.thread_id],
            set_={"updated_at": now},
            where=(_threads.c.owner == self._owner) if self._owner is not None else None,
        ).returning(_threads.c.thread_id)
        if (await conn.execute(stmt)).first() is None:
            raise NotFound(f"thread {thread_id!r} not found")

    # ------------------------------------------------------------------ writes

    async def put(
        self,
        thread_id: str,
        checkpoint_ns: str,
        checkpoint_id: str,
        *,
        parent_checkpoint_id: str | None,
        type: str,
        checkpoint: bytes,
        metadata: str,
        run_id: str | None,
        blobs: Mapping[str, str],
        new_blobs: Sequence[Blob] = (),
    ) -> None:
        """Store a checkpoint (replacing one with the same id) in one transaction.

        Args:
            blobs: channel -> version of every value the checkpoint reads from the blobs.
            new_blobs: values to store; a version already stored is kept as it is.
            metadata: a JSON object, as text.
            run_id: the run that made it (``delete_runs`` finds it by this).
        """
        now = _now()
        key = {"thread_id": thread_id, "checkpoint_ns": checkpoint_ns}
        row = {
            **key,
            "checkpoint_id": checkpoint_id,
            "parent_checkpoint_id": parent_checkpoint_id,
            "run_id": run_id,
            "type": type,
            "checkpoint": checkpoint,
            "metadata": metadata,
            "created_at": now,
        }
        blob_rows = [
            {**key, "channel": b.channel, "version": b.version, "type": b.type, "blob": b.blob}
            for b in new_blobs
        ]
        channel_rows = [
            {**key, "checkpoint_id": checkpoint_id, "channel": channel, "version": version}
            for channel, version in blobs.items()
        ]
        ins = _dialects.insert(self._dialect, _cps)
        upsert = ins.on_conflict_do_update(
            index_elements=list(_cps.primary_key.columns),
            set_={
                name: ins.excluded[name]
                for name in ("parent_checkpoint_id", "run_id", "type", "checkpoint", "metadata")
            },
        )
        keep_blobs = _dialects.insert(self._dialect, _blobs).on_conflict_do_nothing(
            index_elements=list(_blobs.primary_key.columns)
        )
        chans = _dialects.insert(self._dialect, _chans)
        set_channels = chans.on_conflict_do_update(
            index_elements=list(_chans.primary_key.columns),
            set_={"version": chans.excluded["version"]},
        )

        async def work(conn: AsyncConnection) -> None:
            await self._touch(conn, thread_id, now)
            if blob_rows:
                await conn.execute(keep_blobs, blob_rows)
            if channel_rows:
                await conn.execute(set_channels, channel_rows)
            await conn.execute(upsert, row)

        await self._run("write", f"saving a checkpoint of thread {thread_id!r}", work)

    async def put_writes(
        self,
        thread_id: str,
        checkpoint_ns: str,
        checkpoint_id: str,
        writes: Sequence[Write],
        *,
        replace: bool,
    ) -> None:
        """Store pending writes of a checkpoint in one transaction.

        A write whose ``(task_id, idx)`` is already stored for the checkpoint is replaced
        when ``replace``, else kept (so a retried call stores nothing twice).
        """
        if not writes:
            return
        rows = [
            {
                "thread_id": thread_id,
                "checkpoint_ns": checkpoint_ns,
                "checkpoint_id": checkpoint_id,
                "task_id": w.task_id,
                "idx": w.idx,
                "task_path": w.task_path,
                "channel": w.channel,
                "type": w.type,
                "blob": w.blob,
            }
            for w in writes
        ]
        ins = _dialects.insert(self._dialect, _writes)
        keys = list(_writes.primary_key.columns)
        stmt = (
            ins.on_conflict_do_update(
                index_elements=keys,
                set_={c: ins.excluded[c] for c in ("task_path", "channel", "type", "blob")},
            )
            if replace
            else ins.on_conflict_do_nothing(index_elements=keys)
        )

        async def work(conn: AsyncConnection) -> None:
            await self._touch(conn, thread_id, _now())
            await conn.execute(stmt, rows)

        await self._run("write", f"saving pending writes of thread {thread_id!r}", work)

    # ------------------------------------------------------------------ reads

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
        order = [("checkpoint_id", _cps.c.checkpoint_id)]
        if thread_id is None:
            order.append(("thread_id", _cps.c.thread_id))
        if checkpoint_ns is None:
            order.append(("checkpoint_ns", _cps.c.checkpoint_ns))
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
            ) -> tuple[list[_Row], list[StoredCheckpoint]]:
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
        thread_id = bindparam("t", type_=_cps.c.thread_id.type)
        checkpoint_ns = bindparam("ns", type_=Text())
        head_query = select(_cps.c.checkpoint_id).where(
            _cps.c.thread_id == thread_id, _cps.c.checkpoint_ns == checkpoint_ns
        )
        visible = self._visible(_cps.c.thread_id)
        if visible is not None:
            head_query = head_query.where(visible)
        if by_id:
            head_query = head_query.where(
                _cps.c.checkpoint_id == bindparam("id", type_=_cps.c.checkpoint_id.type)
            )
        else:
            head_query = head_query.order_by(_cps.c.checkpoint_id.desc()).limit(1)
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
            cast(_cps.c.checkpoint_id, Text).label("s1"),
            cast(_cps.c.parent_checkpoint_id, Text).label("s2"),
            _cps.c.type.label("s3"),
            _cps.c.metadata.label("s4"),
            _cps.c.checkpoint.label("data"),
            cast(null(), Integer).label("n"),
        ).where(*at_head(_cps))
        values = (
            select(
                literal("b", Text),
                _blobs.c.channel,
                _blobs.c.version,
                _blobs.c.type,
                none_text,
                _blobs.c.blob,
                cast(null(), Integer),
            )
            .select_from(_chans.join(_blobs, _same_blob()))
            .where(*at_head(_chans))
        )
        writes = select(
            literal("w", Text),
            _writes.c.channel,
            _writes.c.task_id,
            _writes.c.type,
            _writes.c.task_path,
            _writes.c.blob,
            _writes.c.idx,
        ).where(*at_head(_writes))
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
            conds.append(_cps.c.thread_id == thread_id)
        if checkpoint_ns is not None:
            conds.append(_cps.c.checkpoint_ns == checkpoint_ns)
        if checkpoint_id is not None:
            conds.append(_cps.c.checkpoint_id == checkpoint_id)
        if before is not None:
            conds.append(_cps.c.checkpoint_id < before)
        visible = self._visible(_cps.c.thread_id)
        if visible is not None:
            conds.append(visible)
        return select(
            _cps.c.thread_id,
            _cps.c.checkpoint_ns,
            _cps.c.checkpoint_id,
            _cps.c.parent_checkpoint_id,
            _cps.c.type,
            _cps.c.checkpoint,
            _cps.c.metadata,
        ).where(*conds)

    async def _complete(
        self, conn: AsyncConnection, rows: Sequence[_Row]
    ) -> builtins.list[StoredCheckpoint]:
        """Add the channel values and pending writes to checkpoint rows (same snapshot)."""
        values: dict[tuple[str, str, str], list[Blob]] = {}
        writes: dict[tuple[str, str, str], list[Write]] = {}
        groups: dict[tuple[str, str], list[str]] = {}
        for r in rows:
            groups.setdefault((r.thread_id, r.checkpoint_ns), []).append(r.checkpoint_id)
        for (thread_id, ns), ids in groups.items():
            for chunk in _chunks(ids):
                query = (
                    select(
                        _chans.c.checkpoint_id,
                        _blobs.c.channel,
                        _blobs.c.version,
                        _blobs.c.type,
                        _blobs.c.blob,
                    )
                    .select_from(_chans.join(_blobs, _same_blob()))
                    .where(
                        _chans.c.thread_id == thread_id,
                        _chans.c.checkpoint_ns == ns,
                        _chans.c.checkpoint_id.in_(list(chunk)),
                    )
                )
                for cid, channel, version, type_, blob in await conn.execute(query):
                    values.setdefault((thread_id, ns, cid), []).append(
                        Blob(channel, version, type_, _bytes(blob))
                    )
                query = select(
                    _writes.c.checkpoint_id,
                    _writes.c.task_id,
                    _writes.c.idx,
                    _writes.c.channel,
                    _writes.c.type,
                    _writes.c.blob,
                    _writes.c.task_path,
                ).where(
                    _writes.c.thread_id == thread_id,
                    _writes.c.checkpoint_ns == ns,
                    _writes.c.checkpoint_id.in_(list(chunk)),
                )
                for w in await conn.execute(query):
                    writes.setdefault((thread_id, ns, w[0]), []).append(
                        Write(w[1], w[2], w[3], w[4], bytes(w[5]), w[6])
                    )
        out = []
        for r in rows:
            key = (r.thread_id, r.checkpoint_ns, r.checkpoint_id)
            out.append(_stored(r, values.get(key, ()), writes.get(key, ())))
        return out

    # ------------------------------------------------------------------ deletes and copies

    async def delete_thread(self, thread_id: str) -> None:
        """Remove the thread and everything it holds. Idempotent; a foreign thread is left."""

        async def work(conn: AsyncConnection) -> None:
            if not await self._lock_visible(conn, [thread_id]):
                return
            for table in (_writes, _chans, _blobs, _cps, _threads):
                await conn.execute(delete(table).where(table.c.thread_id == thread_id))

        await self._run("write", f"deleting thread {thread_id!r}", work)

    async def delete_runs(self, run_ids: Sequence[str]) -> None:
        """Remove the checkpoints made by these runs, their pending writes, and the channel
        values no remaining checkpoint reads. Runs of foreign threads are left."""
        run_ids = sorted(set(run_ids))
        if not run_ids:
            return

        async def work(conn: AsyncConnection) -> None:
            doomed: list[tuple[str, str, str]] = []
            for chunk in _chunks(run_ids):
                query = select(_cps.c.thread_id, _cps.c.checkpoint_ns, _cps.c.checkpoint_id)
                query = query.where(_cps.c.run_id.in_(list(chunk)))
                visible = self._visible(_cps.c.thread_id)
                if visible is not None:
                    query = query.where(visible)
                doomed.extend(tuple(r) for r in await conn.execute(query))
            if not doomed:
                return
            threads = sorted({t for t, _, _ in doomed})
            await self._lock_visible(conn, threads)
            by_ns: dict[tuple[str, str], list[str]] = {}
            for t, ns, cid in doomed:
                by_ns.setdefault((t, ns), []).append(cid)
            for (t, ns), ids in sorted(by_ns.items()):
                for chunk in _chunks(sorted(ids)):
                    for table in (_writes, _chans, _cps):
                        await conn.execute(
                            delete(table).where(
                                table.c.thread_id == t,
                                table.c.checkpoint_ns == ns,
                                table.c.checkpoint_id.in_(list(chunk)),
                            )
                        )
                await self._collect_blobs(conn, t, ns)

        await self._run("write", "deleting the checkpoints of runs", work)

    async def prune(self, thread_ids: Sequence[str], *, keep_latest: bool) -> None:
        """Keep only each namespace's newest checkpoint (``keep_latest``), or nothing.

        With ``keep_latest`` the kept checkpoints lose their parent link, their pending
        writes stay, and the channel values only older checkpoints read are removed.
        Each thread is pruned in its own transaction; foreign threads are left.
        """
        for thread_id in dict.fromkeys(thread_ids):
            if not keep_latest:
                await self.delete_thread(thread_id)
                continue

            async def work(conn: AsyncConnection, thread_id: str = thread_id) -> None:
                if not await self._lock_visible(conn, [thread_id]):
                    return
                heads = await conn.execute(
                    select(_cps.c.checkpoint_ns, func.max(_cps.c.checkpoint_id))
                    .where(_cps.c.thread_id == thread_id)
                    .group_by(_cps.c.checkpoint_ns)
                )
                for ns, head in list(heads):
                    # Older checkpoints go, with their writes; writes of a newer
                    # checkpoint still being saved (there is none under the thread's
                    # lock, but writes may precede their checkpoint) stay.
                    for table in (_writes, _chans, _cps):
                        await conn.execute(
                            delete(table).where(
                                table.c.thread_id == thread_id,
                                table.c.checkpoint_ns == ns,
                                table.c.checkpoint_id < head,
                            )
                        )
                    await conn.execute(
                        update(_cps)
                        .where(
                            _cps.c.thread_id == thread_id,
                            _cps.c.checkpoint_ns == ns,
                            _cps.c.checkpoint_id == head,
                        )
                        .values(parent_checkpoint_id=None)
                    )
                    await self._collect_blobs(conn, thread_id, ns)

            await self._run("write", f"pruning thread {thread_id!r}", work)

    async def copy_thread(self, source: str, target: str) -> None:
        """Make ``target`` a copy of ``source``: every checkpoint, value and write.

        Raises:
            NotFound: the source is unknown (or foreign).
            ConflictError: the target thread exists (its checkpoints are left as they are).
        """
        now = _now()

        async def work(conn: AsyncConnection) -> None:
            owner_query = select(_threads.c.owner).where(_threads.c.thread_id == source)
            visible = self._visible(_threads.c.thread_id)
            if visible is not None:
                owner_query = owner_query.where(visible)
            found = (await conn.execute(owner_query)).first()
            if found is None:
                raise NotFound(f"thread {source!r} not found")
            ins = _dialects.insert(self._dialect, _threads).values(
                thread_id=target, owner=found[0], created_at=now, updated_at=now
            )
            created = ins.on_conflict_do_nothing(index_elements=[_threads.c.thread_id])
            if (await conn.execute(created.returning(_threads.c.thread_id))).first() is None:
                raise ConflictError(f"thread {target!r} already exists")
            for table in (_cps, _chans, _blobs, _writes):
                names = [c.name for c in table.columns]
                cols = [
                    literal(target, type_=table.c.thread_id.type).label("thread_id")
                    if c.name == "thread_id"
                    else c
                    for c in table.columns
                ]
                await conn.execute(
                    table.insert().from_select(
                        names, select(*cols).where(table.c.thread_id == source)
                    )
                )

        await self._run("write", f"copying thread {source!r}", work)

    async def _lock_visible(
        self, conn: AsyncConnection, thread_ids: Sequence[str]
    ) -> builtins.list[str]:
        """Lock the thread rows (in id order) this view may see; returns their ids."""
        query = select(_threads.c.thread_id).where(_threads.c.thread_id.in_(list(thread_ids)))
        if self._owner is not None:
            query = query.where(_threads.c.owner == self._owner)
        query = _dialects.for_update(self._dialect, query.order_by(_threads.c.thread_id))
        return [r[0] for r in await conn.execute(query)]

    async def _collect_blobs(self, conn: AsyncConnection, thread_id: str, ns: str) -> None:
        """Delete the namespace's channel values that no remaining checkpoint reads."""
        listed = select(_chans.c.channel, _chans.c.version).where(
            _chans.c.thread_id == thread_id, _chans.c.checkpoint_ns == ns
        )
        used = {(c, v) for c, v in await conn.execute(listed)}
        stored = select(_blobs.c.channel, _blobs.c.version).where(
            _blobs.c.thread_id == thread_id, _blobs.c.checkpoint_ns == ns
        )
        unused = sorted({(c, v) for c, v in await conn.execute(stored)} - used)
        for chunk in _chunks(unused):
            await conn.execute(
                delete(_blobs).where(
                    _blobs.c.thread_id == thread_id,
                    _blobs.c.checkpoint_ns == ns,
                    tuple_(_blobs.c.channel, _blobs.c.version).in_(list(chunk)),
                )
            )


def _row(r: Any) -> _Row:
    return _Row(
        thread_id=r[0],
        checkpoint_ns=r[1],
        checkpoint_id=r[2],
        parent_checkpoint_id=r[3],
        type=r[4],
        checkpoint=bytes(r[5]),
        metadata=r[6],
    )


def _bytes(value: Any) -> bytes | None:
    return None if value is None else bytes(value)


def _same_blob() -> ColumnElement[bool]:
    """Join condition: the blob a checkpoint's channel row names."""
    return and_(
        _blobs.c.thread_id == _chans.c.thread_id,
        _blobs.c.checkpoint_ns == _chans.c.checkpoint_ns,
        _blobs.c.channel == _chans.c.channel,
        _blobs.c.version == _chans.c.version,
    )


def _stored(r: _Row, values: Iterable[Blob], writes: Iterable[Write]) -> StoredCheckpoint:
    return StoredCheckpoint(
        thread_id=r.thread_id,
        checkpoint_ns=r.checkpoint_ns,
        checkpoint_id=r.checkpoint_id,
        parent_checkpoint_id=r.parent_checkpoint_id,
        type=r.type,
        checkpoint=r.checkpoint,
        metadata=r.metadata,
        values=tuple(sorted(values, key=lambda b: b.channel)),
        writes=tuple(sorted(writes, key=lambda w: (w.task_path, w.task_id, w.idx))),
    )


def _assemble(thread_id: str, ns: str, result: Iterable[Any]) -> StoredCheckpoint | None:
    """A checkpoint from the rows of ``_get_statement`` (``None`` without its row)."""
    row: _Row | None = None
    values: list[Blob] = []
    writes: list[Write] = []
    for kind, s1, s2, s3, s4, data, n in result:
        if kind == "c":
            row = _Row(thread_id, ns, s1, s2, s3, bytes(data), s4)
        elif kind == "b":
            values.append(Blob(s1, s2, s3, _bytes(data)))
        else:
            writes.append(Write(s2, n, s1, s3, bytes(data), s4))
    return None if row is None else _stored(row, values, writes)


def _after(keys: Sequence[ColumnElement[Any]], values: Sequence[Any]) -> ColumnElement[bool]:
    """Rows after ``values`` in the descending order of ``keys`` (keyset paging)."""
    terms = [
        and_(*(keys[j] == values[j] for j in range(i)), keys[i] < values[i])
        for i in range(len(keys))
    ]
    return terms[0] if len(terms) == 1 else or_(*terms)
