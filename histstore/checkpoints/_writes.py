"""Checkpoint writes: storing a checkpoint (with the channel values it brings) and the
pending writes of its tasks, each in one write transaction that first locks the thread."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncConnection

from .._errors import NotFound
from .._storage.rows import now as clock
from ._records import Blob, Write
from ._scope import CheckpointScope

__all__ = ["CheckpointWrites"]


class CheckpointWrites(CheckpointScope):
    """``put`` and ``put_writes``: a checkpoint's rows and its tasks' pending writes."""

    async def _touch(self, conn: AsyncConnection, thread_id: str, now: datetime) -> None:
        """Create the thread (owned by this view's user) or mark it changed, locking it.

        Raises ``NotFound`` when the thread belongs to another owner.
        """
        params = {"thread_id": thread_id, "owner": self._owner, "now": now}
        if (await conn.execute(self._sql.touch_thread, params)).first() is None:
            raise NotFound(f"thread {thread_id!r} not found")

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
        blob_rows = [
            {**key, "channel": b.channel, "version": b.version, "type": b.type, "blob": b.blob}
            for b in new_blobs
        ]
        channel_rows = [
            {**key, "checkpoint_id": checkpoint_id, "channel": channel, "version": version}
            for channel, version in blobs.items()
        ]
        sql = self._sql

        async def work(conn: AsyncConnection) -> None:
            await self._touch(conn, thread_id, now)
            if blob_rows:
                await conn.execute(sql.keep_blobs, blob_rows)
            if channel_rows:
                await conn.execute(sql.set_channels, channel_rows)
            await conn.execute(sql.put_checkpoint, row)

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
        stmt = self._sql.replace_writes if replace else self._sql.keep_writes

        async def work(conn: AsyncConnection) -> None:
            await self._touch(conn, thread_id, clock())
            await conn.execute(stmt, rows)

        await self._run("write", f"saving pending writes of thread {thread_id!r}", work)
