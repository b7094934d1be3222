"""The statements of the checkpoint storage (``histstore.checkpoints``), built once per
engine and kind of store.

Two forms. The thread operations (delete, prune, copy, import) run SQLAlchemy Core on a
Core connection: ``touch_thread``, ``create_thread``, ``lock_threads`` and the row
upserts are Core statements for them. The hot path (``put``, ``put_writes``, ``get``,
``list``) runs compiled statements through the executor's driver seam: one driver call
each, and on SQLite a whole write in one trip to the connection's thread. ``owner`` is a
scoped view's user: with ``scoped`` a thread it did not create is neither touched,
locked nor read.

Reading (``read``) is one statement per page of checkpoints, built in
``_storage.statements.checkpoint_reads``.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    BigInteger,
    Integer,
    LargeBinary,
    Text,
    bindparam,
    delete,
    exists,
    func,
    literal_column,
    select,
    update,
)
from sqlalchemy.dialects import postgresql
from sqlalchemy.types import TypeEngine

from .. import schema as s
from ..drivers import CompiledStatement, Driver
from . import dialects as _dialects
from .checkpoint_reads import ReadShape, read_statement
from .kinds import is_sqlite

__all__ = ["CheckpointStatements"]

_threads = s.checkpoint_threads
_cp = s.checkpoints
_blobs = s.checkpoint_blobs
_chans = s.checkpoint_channels
_writes = s.checkpoint_writes
_text = s.checkpoint_text


class CheckpointStatements:
    """The checkpoint storage's statements for a whole store (``scoped=False``) or a view."""

    def __init__(self, driver: Driver, scoped: bool) -> None:
        dialect = driver.dialect
        self._driver = driver
        self._scoped = scoped
        self._reads: dict[tuple[ReadShape, bool], CompiledStatement] = {}
        compile_ = driver.compile
        thread = bindparam("thread_id", type_=_threads.c.thread_id.type)
        owner = bindparam("owner", type_=_threads.c.owner.type)
        now = bindparam("now", type_=_threads.c.updated_at.type)
        new_thread = _dialects.insert(dialect, _threads).values(
            thread_id=thread, owner=owner, created_at=now, updated_at=now
        )
        # Create the thread (``owner``'s) or mark it changed, locking its row; no row
        # back when it belongs to someone else. Params: thread_id, owner, now.
        self.touch_thread: Any = new_thread.on_conflict_do_update(
            index_elements=[_threads.c.thread_id],
            set_={"updated_at": now},
            where=(_threads.c.owner == owner) if scoped else None,
        ).returning(_threads.c.thread_id)
        # Create a thread that does not exist yet; no row back when it does.
        self.create_thread: Any = new_thread.on_conflict_do_nothing(
            index_elements=[_threads.c.thread_id]
        ).returning(_threads.c.thread_id)
        # Lock the listed threads (``threads``, a list) the store sees, in id order.
        lock = select(_threads.c.thread_id).where(
            _threads.c.thread_id.in_(bindparam("threads", expanding=True))
        )
        if scoped:
            lock = lock.where(_threads.c.owner == owner)
        self.lock_threads = _dialects.for_update(dialect, lock.order_by(_threads.c.thread_id))

        # Row inserts, each run with a list of rows (every column of its table).
        ins = _dialects.insert(dialect, _cp)
        replaced = ("parent_checkpoint_id", "run_id", "type", "checkpoint", "metadata")
        self.put_checkpoint: Any = ins.on_conflict_do_update(
            index_elements=list(_cp.primary_key.columns),
            set_={name: ins.excluded[name] for name in replaced},
        )
        # A channel value already stored under its version is kept as it is.
        self.keep_blobs: Any = _dialects.insert(dialect, _blobs).on_conflict_do_nothing(
            index_elements=list(_blobs.primary_key.columns)
        )
        chans = _dialects.insert(dialect, _chans)
        self.set_channels: Any = chans.on_conflict_do_update(
            index_elements=list(_chans.primary_key.columns),
            set_={"version": chans.excluded["version"]},
        )
        keys = list(_writes.primary_key.columns)
        ins = _dialects.insert(dialect, _writes)
        # Pending writes: a write stored under the same key is replaced, or kept.
        self.replace_writes: Any = ins.on_conflict_do_update(
            index_elements=keys,
            set_={c: ins.excluded[c] for c in ("task_path", "channel", "type", "blob")},
        )
        self.keep_writes: Any = ins.on_conflict_do_nothing(index_elements=keys)

        # The same, compiled for the driver seam (``put`` and ``put_writes``).
        self.touch = compile_(self.touch_thread)
        self.store_checkpoint = compile_(self.put_checkpoint)
        self.store_blobs = compile_(self.keep_blobs)
        self.store_channels = compile_(self.set_channels)
        self.store_writes = {True: compile_(self.replace_writes), False: compile_(self.keep_writes)}
        # A value stored as an extension of ``base``: only while ``base`` is stored (the
        # thread is locked, so it stays so until the commit). Returns its version when
        # stored; nothing when ``base`` is missing or the version was already stored.
        # Params: the blob's columns.
        other = _blobs.alias("stored")
        cols = [c.name for c in _blobs.columns]
        source = select(*(bindparam(c.name, type_=c.type) for c in _blobs.columns)).where(
            exists().where(
                other.c.thread_id == bindparam("thread_id"),
                other.c.checkpoint_ns == bindparam("checkpoint_ns"),
                other.c.channel == bindparam("channel"),
                other.c.version == bindparam("base"),
            )
        )
        delta = _dialects.insert(dialect, _blobs).from_select(cols, source)
        self.store_delta = compile_(
            delta.on_conflict_do_nothing(index_elements=list(_blobs.primary_key.columns)).returning(
                _blobs.c.version
            )
        )
        # The searchable text of list items (``ItemText``; params: its columns and the
        # thread's): the newest item stored at an index replaces the one before.
        text_ins = _dialects.insert(dialect, _text)
        self.upsert_text: Any = text_ins.on_conflict_do_update(
            index_elements=list(_text.primary_key.columns),
            set_={"role": text_ins.excluded["role"], "text": text_ins.excluded["text"]},
        )
        self.store_text = compile_(self.upsert_text)
        # A value stored whole ends its channel's items at ``length``.
        self.trim_text = compile_(
            delete(_text).where(
                _text.c.thread_id == bindparam("thread_id"),
                _text.c.checkpoint_ns == bindparam("checkpoint_ns"),
                _text.c.channel == bindparam("channel"),
                _text.c.idx >= bindparam("length", type_=BigInteger),
            )
        )
        # Whether a channel value is stored (params: thread_id, checkpoint_ns, channel,
        # version).
        self.blob_stored = compile_(
            select(_blobs.c.version).where(
                _blobs.c.thread_id == bindparam("thread_id"),
                _blobs.c.checkpoint_ns == bindparam("checkpoint_ns"),
                _blobs.c.channel == bindparam("channel"),
                _blobs.c.version == bindparam("version"),
            )
        )

        # SQLite: a writer holds the database's write lock from BEGIN IMMEDIATE on, so
        # the thread needs no row lock; it is looked up (``thread_owner``: its owner and
        # whether its ``updated_at`` is before ``stale``, no row when unknown), created
        # when missing (``create``) and marked changed at most once per second
        # (``refresh``: params thread_id, now, stale), which spares most writes a
        # rewrite of the thread's row.
        self.thread_owner: CompiledStatement | None = None
        if is_sqlite(dialect):
            stale = bindparam("stale", type_=_threads.c.updated_at.type)
            self.thread_owner = compile_(
                select(_threads.c.owner, _threads.c.updated_at < stale).where(
                    _threads.c.thread_id == thread
                )
            )
            self.create = compile_(self.create_thread)
            self.refresh = compile_(
                update(_threads)
                .where(_threads.c.thread_id == thread, _threads.c.updated_at < stale)
                .values(updated_at=now)
            )
        # Where the database can (Postgres), each write is one statement that is its own
        # transaction (one round trip): ``put`` (see ``_put_alone``) and ``put_writes``.
        self.put_alone: CompiledStatement | None = None
        self.writes_alone: dict[bool, CompiledStatement] = {}
        if not is_sqlite(dialect):
            self.put_alone = compile_(_put_alone(self.touch_thread))
            self.writes_alone = {
                replace: compile_(_writes_alone(self.touch_thread, replace))
                for replace in (True, False)
            }

    def read(self, shape: ReadShape, *, parts: bool = True) -> CompiledStatement:
        """The statement reading a page of checkpoints with everything they hold (see the
        module doc; ``n`` is the page's size, ``owner`` a scoped view's user); without
        ``parts``, only the checkpoint rows (kind ``c``)."""
        stmt = self._reads.get((shape, parts))
        if stmt is None:
            built = read_statement(shape, self._scoped, parts)
            stmt = self._reads[shape, parts] = self._driver.compile(built)
        return stmt


def _arrays(prefix: str, **columns: TypeEngine[Any]) -> Any:
    """Rows from array parameters ``<prefix>_<column>``, all of one length (Postgres).

    Each array is read through a scalar subquery, so no plan knows its length: a
    custom plan then costs what the generic one does, and the server keeps the generic
    plan after its first few runs instead of planning every execution again.
    """
    return (
        func.unnest(
            *(
                select(
                    bindparam(f"{prefix}_{name}", type_=postgresql.ARRAY(type_, dimensions=1))
                ).scalar_subquery()
                for name, type_ in columns.items()
            )
        )
        .table_valued(*columns)
        .render_derived()
    )


def _put_alone(touch: Any) -> Any:
    """A ``put`` as one statement, its own transaction (Postgres).

    The thread is touched first (``touch``'s parameters), which takes its row lock; then
    every new value that extends another version (arrays ``d_*``, whose ``base`` is not
    null) is checked against what is stored *now*: its ``base`` (or its own version) is
    locked ``FOR KEY SHARE``, so a value deleted by a transaction that held the thread
    until a moment ago counts as gone (the statement's snapshot may predate that
    commit) and stays until this commit. Only when every such value can be stored are
    the rows written: the values (``d_*``, whole ones with a null ``base``), the
    versions the checkpoint reads (``c_*``) and the checkpoint row (its columns as
    parameters). Returns one row: whether the
    thread was touched (no: another owner's), and whether the rows were stored.
    """
    touched = touch.cte("touched")
    thread = touched.c.thread_id
    ns = bindparam("checkpoint_ns", type_=Text())
    text_ = Text()
    blob_cols = [c.name for c in _blobs.columns]
    blob_key = list(_blobs.primary_key.columns)
    new = _arrays("d", channel=text_, version=text_, type=text_, blob=LargeBinary(), base=text_)
    other = _blobs.alias("stored")
    held = (
        select(other.c.version)
        .where(
            other.c.thread_id == thread,
            other.c.checkpoint_ns == ns,
            other.c.channel == new.c.channel,
            other.c.version.in_([new.c.base, new.c.version]),
        )
        .correlate(touched, new)
        .with_for_update(read=True, key_share=True, of=other)
    )
    unstorable = select(new.c.channel).where(new.c.base.is_not(None), ~held.exists())
    ok = select(thread).where(~unstorable.exists()).cte("ok")
    # Every insert reads ``ok``: nothing is written before the check, or after it fails.
    values = (
        postgresql.insert(_blobs)
        .from_select(
            blob_cols,
            select(
                ok.c.thread_id, ns, new.c.channel, new.c.version, new.c.type, new.c.blob, new.c.base
            ).select_from(ok.join(new, literal_column("true"))),
        )
        .on_conflict_do_nothing(index_elements=blob_key)
        .cte("stored_values")
    )
    checkpoint_id = bindparam("checkpoint_id", type_=_cp.c.checkpoint_id.type)
    read = _arrays("c", channel=text_, version=text_)
    new_chans = postgresql.insert(_chans).from_select(
        [c.name for c in _chans.columns],
        select(ok.c.thread_id, ns, checkpoint_id, read.c.channel, read.c.version).select_from(
            ok.join(read, literal_column("true"))
        ),
    )
    chans = new_chans.on_conflict_do_update(
        index_elements=list(_chans.primary_key.columns),
        set_={"version": new_chans.excluded["version"]},
    ).cte("chans")
    own = [c for c in _cp.columns if c.name not in ("thread_id", "checkpoint_ns")]
    new_row = postgresql.insert(_cp).from_select(
        [c.name for c in _cp.columns],
        select(ok.c.thread_id, ns, *(bindparam(c.name, type_=c.type) for c in own)),
    )
    replaced = ("parent_checkpoint_id", "run_id", "type", "checkpoint", "metadata")
    row = new_row.on_conflict_do_update(
        index_elements=list(_cp.primary_key.columns),
        set_={name: new_row.excluded[name] for name in replaced},
    ).cte("row")
    items = _arrays("t", channel=text_, idx=BigInteger(), role=text_, text=text_)
    new_text = postgresql.insert(_text).from_select(
        [c.name for c in _text.columns],
        select(
            ok.c.thread_id, ns, items.c.channel, items.c.idx, items.c.role, items.c.text
        ).select_from(ok.join(items, literal_column("true"))),
    )
    texts = new_text.on_conflict_do_update(
        index_elements=list(_text.primary_key.columns),
        set_={"role": new_text.excluded["role"], "text": new_text.excluded["text"]},
    ).cte("texts")
    ends = _arrays("e", channel=text_, length=BigInteger())
    trimmed = (
        delete(_text)
        .where(
            _text.c.thread_id.in_(select(ok.c.thread_id)),
            _text.c.checkpoint_ns == ns,
            exists().where(ends.c.channel == _text.c.channel, _text.c.idx >= ends.c.length),
        )
        .cte("trimmed")
    )
    counted = [
        select(func.count()).select_from(touched).scalar_subquery(),
        select(func.count()).select_from(ok).scalar_subquery(),
    ]
    return (
        select(*counted).add_cte(values).add_cte(chans).add_cte(row).add_cte(texts).add_cte(trimmed)
    )


def _writes_alone(touch: Any, replace: bool) -> Any:
    """``put_writes`` as one statement, its own transaction (Postgres): the thread
    touched (``touch``'s parameters) and the writes from arrays ``p_*``, with the
    ``checkpoint_ns`` and ``checkpoint_id`` parameters. Returns the thread's id; no row
    (and nothing stored) when the thread belongs to someone else."""
    touched = touch.cte("touched")
    text_ = Text()
    rows = _arrays(
        "p",
        task_id=text_,
        idx=Integer(),
        task_path=text_,
        channel=text_,
        type=text_,
        blob=LargeBinary(),
    )
    ins = postgresql.insert(_writes).from_select(
        [c.name for c in _writes.columns],
        select(
            touched.c.thread_id,
            bindparam("checkpoint_ns", type_=Text()),
            bindparam("checkpoint_id", type_=_writes.c.checkpoint_id.type),
            rows.c.task_id,
            rows.c.idx,
            rows.c.task_path,
            rows.c.channel,
            rows.c.type,
            rows.c.blob,
        ).select_from(touched.join(rows, literal_column("true"))),
    )
    keys = list(_writes.primary_key.columns)
    if replace:
        ins = ins.on_conflict_do_update(
            index_elements=keys,
            set_={c: ins.excluded[c] for c in ("task_path", "channel", "type", "blob")},
        )
    else:
        ins = ins.on_conflict_do_nothing(index_elements=keys)
    return select(touched.c.thread_id).add_cte(ins.cte("stored"))
