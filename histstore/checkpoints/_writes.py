"""Checkpoint writes: storing a checkpoint (with the channel values it brings) and the
pending writes of its tasks, each one write transaction (a program of compiled
statements: on SQLite one trip to the connection's thread) that first locks the thread."""

from __future__ import annotations

from collections.abc import Generator, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from .._errors import NotFound
from .._storage.drivers import EXECUTE, EXECUTE_MANY, FETCH, Rollback, Step
from .._storage.rows import now as clock
from ._records import Blob, ItemText, Write
from ._scope import CheckpointScope

__all__ = ["CheckpointWrites"]

_FRESH = timedelta(seconds=1)
"""How long a thread's ``updated_at`` may lag behind its latest write (SQLite)."""


class CheckpointWrites(CheckpointScope):
    """``put`` and ``put_writes``: a checkpoint's rows and its tasks' pending writes."""

    def _touch(self, thread_id: str, now: datetime) -> Generator[Step, Any, None]:
        """Create the thread (owned by this view's user) or mark it changed, locking it
        (on SQLite the transaction's write lock is the lock, and ``updated_at`` may lag
        a write by up to a second).

        Raises ``NotFound`` when the thread belongs to another owner.
        """
        sql = self._sql
        params = {"thread_id": thread_id, "owner": self._owner, "now": now}
        if sql.thread_owner is None:
            if not (yield FETCH, sql.touch, params):
                raise NotFound(f"thread {thread_id!r} not found")
            return
        params["stale"] = now - _FRESH
        found = yield FETCH, sql.thread_owner, params
        if not found:
            yield FETCH, sql.create, params  # the write lock is held: it is created
        elif self._owner is not None and found[0][0] != self._owner:
            raise NotFound(f"thread {thread_id!r} not found")
        elif found[0][1]:
            yield EXECUTE, sql.refresh, params

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
        texts: Sequence[ItemText] = (),
        text_ends: Mapping[str, int] | None = None,
    ) -> bool:
        """Store a checkpoint (replacing one with the same id) in one transaction.

        Args:
            blobs: channel -> version of every value the checkpoint reads from the blobs.
            new_blobs: values to store; a version already stored is kept as it is. A
                value with a ``base`` (the version it extends) is stored only while
                that version is stored.
            metadata: a JSON object, as text.
            run_id: the run that made it (``delete_runs`` finds it by this).
            texts: the searchable text of list items this put stores (each replaces the
                text stored at its channel and index), stored with the values.
            text_ends: channel -> length of a list value stored whole: its channel's
                text past that index is deleted.

        Returns:
            ``True``; ``False`` when a new value's ``base`` is not stored (nor the value
            itself): then nothing was stored, and the caller stores it whole instead.
        """
        now = clock()
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
        whole: list[dict[str, Any]] = []
        deltas: list[dict[str, Any]] = []
        for b in new_blobs:
            blob_row = {
                **key,
                "channel": b.channel,
                "version": b.version,
                "type": b.type,
                "blob": b.blob,
                "base": b.base,
            }
            (whole if b.base is None else deltas).append(blob_row)
        channel_rows = [
            {**key, "checkpoint_id": checkpoint_id, "channel": channel, "version": version}
            for channel, version in blobs.items()
        ]
        text_rows = [
            {**key, "channel": t.channel, "idx": t.idx, "role": t.role, "text": t.text}
            for t in texts
        ]
        end_rows = [
            {**key, "channel": channel, "length": length}
            for channel, length in (text_ends or {}).items()
        ]
        sql = self._sql
        action = f"saving a checkpoint of thread {thread_id!r}"
        if sql.put_alone is not None:
            params: dict[str, Any] = {**row, "owner": self._owner, "now": now}
            params.update(_arrays("d", deltas + whole))
            params.update(_arrays("c", channel_rows))
            params.update(_arrays("t", text_rows))
            params.update(_arrays("e", end_rows))
            alone = sql.put_alone

            def one() -> Generator[Step, Any, bool]:
                touched, stored = (yield FETCH, alone, params)[0]
                if not touched:
                    raise NotFound(f"thread {thread_id!r} not found")
                # Not stored: a value's base is gone (the thread was deleted or pruned
                # meanwhile); only the thread's row was touched.
                return bool(stored)

            return await self._executor.write(one(), action=action, single=True)

        def program() -> Generator[Step, Any, bool | Rollback[bool]]:
            yield from self._touch(thread_id, now)
            for delta in deltas:
                stored = yield FETCH, sql.store_delta, delta
                # None stored: its base is gone (the thread was deleted or pruned
                # meanwhile), or this version is stored already (then kept as it is).
                if not stored and not (yield FETCH, sql.blob_stored, delta):
                    return Rollback(False)
            if whole:
                yield EXECUTE_MANY, sql.store_blobs, whole
            if channel_rows:
                yield EXECUTE_MANY, sql.store_channels, channel_rows
            yield EXECUTE, sql.store_checkpoint, row
            for end in end_rows:
                yield EXECUTE, sql.trim_text, end
            if text_rows:
                yield EXECUTE_MANY, sql.store_text, text_rows
            return True

        return await self._executor.write(program(), action=action)

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
        action = f"saving pending writes of thread {thread_id!r}"
        alone = self._sql.writes_alone.get(replace)
        if alone is not None:
            params = {
                "thread_id": thread_id,
                "owner": self._owner,
                "now": clock(),
                "checkpoint_ns": checkpoint_ns,
                "checkpoint_id": checkpoint_id,
                **_arrays("p", rows),
            }

            def one() -> Generator[Step, Any, None]:
                if not (yield FETCH, alone, params):
                    raise NotFound(f"thread {thread_id!r} not found")

            await self._executor.write(one(), action=action, single=True)
            return
        stmt = self._sql.store_writes[replace]

        def program() -> Generator[Step, Any, None]:
            yield from self._touch(thread_id, clock())
            yield EXECUTE_MANY, stmt, rows

        await self._executor.write(program(), action=action)


_ARRAY_COLUMNS = {
    "d": ("channel", "version", "type", "blob", "base"),
    "c": ("channel", "version"),
    "t": ("channel", "idx", "role", "text"),
    "e": ("channel", "length"),
    "p": ("task_id", "idx", "task_path", "channel", "type", "blob"),
}


def _arrays(prefix: str, rows: Sequence[Mapping[str, Any]]) -> dict[str, list[Any]]:
    """``rows`` as the array parameters ``<prefix>_<column>`` of the one-statement
    writes (``_storage.statements.checkpoints``)."""
    return {f"{prefix}_{c}": [r[c] for r in rows] for c in _ARRAY_COLUMNS[prefix]}
