"""The upserts and the thread lock of the checkpoint storage (``histstore.checkpoints``),
built once per engine and kind of store.

They are SQLAlchemy Core statements with bind parameters, run on a Core connection
(the checkpoint storage reads and writes with Core); SQLAlchemy caches their compiled
form. ``owner`` is a scoped view's user: with ``scoped`` a thread it did not create is
neither touched nor locked.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import bindparam, select
from sqlalchemy.engine import Dialect

from .. import schema as s
from . import dialects as _dialects

__all__ = ["CheckpointStatements"]

_threads = s.checkpoint_threads


class CheckpointStatements:
    """The checkpoint writes' statements for a whole store (``scoped=False``) or a view."""

    def __init__(self, dialect: Dialect, scoped: bool) -> None:
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
        cp = s.checkpoints
        ins = _dialects.insert(dialect, cp)
        replaced = ("parent_checkpoint_id", "run_id", "type", "checkpoint", "metadata")
        self.put_checkpoint: Any = ins.on_conflict_do_update(
            index_elements=list(cp.primary_key.columns),
            set_={name: ins.excluded[name] for name in replaced},
        )
        # A channel value already stored under its version is kept as it is.
        self.keep_blobs: Any = _dialects.insert(dialect, s.checkpoint_blobs).on_conflict_do_nothing(
            index_elements=list(s.checkpoint_blobs.primary_key.columns)
        )
        chans = _dialects.insert(dialect, s.checkpoint_channels)
        self.set_channels: Any = chans.on_conflict_do_update(
            index_elements=list(s.checkpoint_channels.primary_key.columns),
            set_={"version": chans.excluded["version"]},
        )
        writes = s.checkpoint_writes
        keys = list(writes.primary_key.columns)
        ins = _dialects.insert(dialect, writes)
        # Pending writes: a write stored under the same key is replaced, or kept.
        self.replace_writes: Any = ins.on_conflict_do_update(
            index_elements=keys,
            set_={c: ins.excluded[c] for c in ("task_path", "channel", "type", "blob")},
        )
        self.keep_writes: Any = ins.on_conflict_do_nothing(index_elements=keys)
