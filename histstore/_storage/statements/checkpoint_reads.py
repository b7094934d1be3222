"""The statement that reads checkpoints (``histstore.checkpoints``): a page of them with
everything they hold, in one statement.

Reading (``read``) is one statement per page of checkpoints: a ``page`` of checkpoint
keys (newest first), then in one ``UNION ALL`` the page's checkpoint rows (kind ``c``),
the version of each channel they read (``m``), the channel values those versions need
(``b``: a value stored as an extension of another version, ``base``, brings that one
too, found by a recursive walk over the primary key) and their pending writes (``w``).
Every part has the same columns, see ``READ_COLUMNS``.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    ColumnElement,
    Integer,
    LargeBinary,
    Text,
    and_,
    bindparam,
    cast,
    exists,
    literal,
    null,
    or_,
    select,
    union_all,
)

from .. import schema as s

__all__ = ["READ_COLUMNS", "ReadShape", "read_statement"]

_threads = s.checkpoint_threads
_cp = s.checkpoints
_blobs = s.checkpoint_blobs
_chans = s.checkpoint_channels
_writes = s.checkpoint_writes

READ_COLUMNS = ("kind", "thread_id", "checkpoint_ns", "a", "b", "c", "d", "e", "data", "n")
"""The columns of every row ``read`` returns. By kind:

* ``c``: a, b, c, d = checkpoint id, parent id, type, metadata; data = the checkpoint.
* ``m``: a, b, c = checkpoint id, channel, version.
* ``b``: a, b, c, d = channel, version, type, base; data = the value (or ``NULL``).
* ``w``: a, b, c, d, e = checkpoint id, channel, task id, type, task path; data = the
  value; n = the index.
"""

ReadShape = tuple[bool, bool, bool, bool, bool]
"""Which of a page's conditions a ``read`` statement has: a thread (``t``), a namespace
(``ns``), a checkpoint id (``id``), an upper bound (``before``), a keyset cursor
(``after_id``, ``after_t``, ``after_ns``: the last row of the previous page)."""


def read_statement(shape: ReadShape, scoped: bool, parts: bool) -> Any:
    """The statement for pages of ``shape`` (a view's when ``scoped``: parameter
    ``owner``); without ``parts``, only the checkpoint rows."""
    by_thread, by_ns, by_id, before, after = shape
    conds: list[ColumnElement[bool]] = []
    order = [_cp.c.checkpoint_id]
    cursor = [bindparam("after_id", type_=_cp.c.checkpoint_id.type)]
    if by_thread:
        conds.append(_cp.c.thread_id == bindparam("t", type_=_cp.c.thread_id.type))
    else:
        order.append(_cp.c.thread_id)
        cursor.append(bindparam("after_t", type_=_cp.c.thread_id.type))
    if by_ns:
        conds.append(_cp.c.checkpoint_ns == bindparam("ns", type_=Text()))
    else:
        order.append(_cp.c.checkpoint_ns)
        cursor.append(bindparam("after_ns", type_=Text()))
    if by_id:
        conds.append(_cp.c.checkpoint_id == bindparam("id", type_=_cp.c.checkpoint_id.type))
    if before:
        conds.append(_cp.c.checkpoint_id < bindparam("before", type_=_cp.c.checkpoint_id.type))
    if after:
        conds.append(_after(order, cursor))
    if scoped:
        owner = bindparam("owner", type_=_threads.c.owner.type)
        conds.append(
            exists().where(_threads.c.thread_id == _cp.c.thread_id, _threads.c.owner == owner)
        )
    page = (
        select(_cp.c.thread_id, _cp.c.checkpoint_ns, _cp.c.checkpoint_id)
        .where(*conds)
        .order_by(*(k.desc() for k in order))
        .limit(bindparam("n", type_=Integer))
        .cte("page")
    )

    def in_page(table: Any) -> ColumnElement[bool]:
        return and_(
            table.c.thread_id == page.c.thread_id,
            table.c.checkpoint_ns == page.c.checkpoint_ns,
            table.c.checkpoint_id == page.c.checkpoint_id,
        )

    def text(value: Any) -> Any:
        return cast(value, Text)

    none, no_bytes, no_int = cast(null(), Text), cast(null(), LargeBinary), cast(null(), Integer)
    rows = select(
        literal("c", Text).label("kind"),
        text(_cp.c.thread_id).label("thread_id"),
        text(_cp.c.checkpoint_ns).label("checkpoint_ns"),
        text(_cp.c.checkpoint_id).label("a"),
        text(_cp.c.parent_checkpoint_id).label("b"),
        text(_cp.c.type).label("c"),
        text(_cp.c.metadata).label("d"),
        none.label("e"),
        _cp.c.checkpoint.label("data"),
        no_int.label("n"),
    ).join_from(_cp, page, in_page(_cp))
    if not parts:
        return rows
    channels = select(
        literal("m", Text),
        text(_chans.c.thread_id),
        text(_chans.c.checkpoint_ns),
        text(_chans.c.checkpoint_id),
        _chans.c.channel,
        _chans.c.version,
        none,
        none,
        no_bytes,
        no_int,
    ).join_from(_chans, page, in_page(_chans))

    # The keys of the values the page's channels read, and of the versions they extend:
    # a walk where every step is a lookup by primary key (correlated subqueries, so that
    # no plan scans the thread's values, whatever the planner's statistics say); UNION
    # keeps each key once, however many checkpoints of the page share it.
    def stored(key: tuple[Any, Any, Any, Any], column: str) -> Any:
        found = _blobs.alias("stored")
        return (
            select(found.c[column])
            .where(
                found.c.thread_id == key[0],
                found.c.checkpoint_ns == key[1],
                found.c.channel == key[2],
                found.c.version == key[3],
            )
            .scalar_subquery()
        )

    read_key = (_chans.c.thread_id, _chans.c.checkpoint_ns, _chans.c.channel, _chans.c.version)
    start = (
        select(
            _chans.c.thread_id.label("thread_id"),
            _chans.c.checkpoint_ns.label("checkpoint_ns"),
            _chans.c.channel.label("channel"),
            _chans.c.version.label("version"),
            stored(read_key, "base").label("base"),
            stored(read_key, "type").label("type"),
        )
        .join_from(_chans, page, in_page(_chans))
        .cte("chain", recursive=True)
    )
    base_key = (start.c.thread_id, start.c.checkpoint_ns, start.c.channel, start.c.base)
    chain = start.union(
        select(
            start.c.thread_id,
            start.c.checkpoint_ns,
            start.c.channel,
            start.c.base,
            stored(base_key, "base"),
            stored(base_key, "type"),
        ).where(start.c.base.is_not(None))
    )
    key = (chain.c.thread_id, chain.c.checkpoint_ns, chain.c.channel, chain.c.version)
    values = select(
        literal("b", Text),
        text(chain.c.thread_id),
        text(chain.c.checkpoint_ns),
        chain.c.channel,
        chain.c.version,
        chain.c.type,
        chain.c.base,
        none,
        stored(key, "blob"),
        no_int,
    ).where(chain.c.type.is_not(None))  # a version that is not stored has no type
    writes = select(
        literal("w", Text),
        text(_writes.c.thread_id),
        text(_writes.c.checkpoint_ns),
        text(_writes.c.checkpoint_id),
        _writes.c.channel,
        _writes.c.task_id,
        _writes.c.type,
        _writes.c.task_path,
        _writes.c.blob,
        _writes.c.idx,
    ).join_from(_writes, page, in_page(_writes))
    return union_all(rows, channels, values, writes)


def _after(keys: list[Any], values: list[Any]) -> ColumnElement[bool]:
    """Rows after ``values`` in the descending order of ``keys`` (keyset paging)."""
    terms = [
        and_(*(keys[j] == values[j] for j in range(i)), keys[i] < values[i])
        for i in range(len(keys))
    ]
    return terms[0] if len(terms) == 1 else or_(*terms)
