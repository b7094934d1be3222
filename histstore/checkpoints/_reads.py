"""Checkpoint reads: one checkpoint (``get``) and listing (``list``), a page of checkpoints
per statement, each with its channel values and pending writes.

Every read is one compiled statement (``_storage.statements.checkpoints.read``), atomic
by itself: a page of checkpoint keys, then their rows, the channel versions they read,
those values (with the versions they extend, down to a full value) and their writes.
"""

from __future__ import annotations

import builtins
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from typing import Any

from ._records import Blob, StoredCheckpoint, Write, as_bytes
from ._scope import CheckpointScope

__all__ = ["CheckpointReads"]

_PAGE = 100
"""Checkpoints read per statement when listing."""

Key = tuple[str, str, str]


class CheckpointReads(CheckpointScope):
    """``get`` and ``list``: checkpoints with the values they read and their writes."""

    async def get(
        self, thread_id: str, checkpoint_ns: str, checkpoint_id: str | None = None
    ) -> StoredCheckpoint | None:
        """The checkpoint with that id, or the newest of the namespace; ``None`` if none.

        One statement: the checkpoint's id by index (the newest is the end of the primary
        key's range), then its row, its values and its writes by primary key.
        """
        params = {
            "t": thread_id,
            "ns": checkpoint_ns,
            "id": checkpoint_id,
            "n": 1,
            "owner": self._owner,
        }
        rows = await self._executor.fetch(
            self._sql.read((True, True, checkpoint_id is not None, False, False)),
            params,
            action=f"reading a checkpoint of thread {thread_id!r}",
        )
        found = _assemble(rows)
        return found[0] if found else None

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

        Reads a page of rows per statement, so a long listing holds no transaction open
        between pages and sees checkpoints stored meanwhile only on later pages (a
        checkpoint ``where`` accepted that is deleted before its values are read is
        skipped).
        """
        if limit is not None and limit <= 0:
            return
        params: dict[str, Any] = {
            "t": thread_id,
            "ns": checkpoint_ns,
            "id": checkpoint_id,
            "before": before,
            "owner": self._owner,
        }
        cursor = False
        left = limit
        while True:
            shape = (
                thread_id is not None,
                checkpoint_ns is not None,
                checkpoint_id is not None,
                before is not None,
                cursor,
            )
            size = _PAGE if where is not None or left is None else min(left, _PAGE)
            params["n"] = size
            if where is None:
                rows = await self._executor.fetch(
                    self._sql.read(shape), params, action="listing checkpoints"
                )
                page = found = _assemble(rows)
            else:
                rows = await self._executor.fetch(
                    self._sql.read(shape, parts=False), params, action="listing checkpoints"
                )
                page = _assemble(rows)
                found = await self._complete([r for r in page if where(r.metadata)], left)
            if left is not None:
                found = found[:left]
            for item in found:
                yield item
            if left is not None:
                left -= len(found)
                if left <= 0:
                    return
            if len(page) < size:
                return
            last = page[-1]
            cursor = True
            params.update(
                after_id=last.checkpoint_id, after_t=last.thread_id, after_ns=last.checkpoint_ns
            )

    async def _complete(
        self, rows: Sequence[StoredCheckpoint], limit: int | None
    ) -> builtins.list[StoredCheckpoint]:
        """The checkpoints ``rows`` name, with their values and writes (at most
        ``limit``; those deleted meanwhile are left out)."""
        out: list[StoredCheckpoint] = []
        for r in rows:
            if limit is not None and len(out) >= limit:
                break
            params = {
                "t": r.thread_id,
                "ns": r.checkpoint_ns,
                "id": r.checkpoint_id,
                "n": 1,
                "owner": self._owner,
            }
            found = _assemble(
                await self._executor.fetch(
                    self._sql.read((True, True, True, False, False)),
                    params,
                    action="listing checkpoints",
                )
            )
            out.extend(found)
        return out


def _assemble(result: Iterable[Any]) -> builtins.list[StoredCheckpoint]:
    """The checkpoints in the rows of a ``read`` statement, newest first (by id, then
    thread and namespace, descending), each with its values and writes."""
    heads: dict[Key, tuple[Any, ...]] = {}
    channels: dict[Key, list[tuple[str, str]]] = {}
    blobs: dict[tuple[str, str], dict[tuple[str, str], Blob]] = {}
    writes: dict[Key, list[Write]] = {}
    for kind, t, ns, a, b, c, d, e, data, n in result:
        if kind == "c":
            heads[t, ns, a] = (b, c, d, data)
        elif kind == "m":
            channels.setdefault((t, ns, a), []).append((b, c))
        elif kind == "b":
            blobs.setdefault((t, ns), {})[a, b] = Blob(a, b, c, as_bytes(data), d)
        else:
            writes.setdefault((t, ns, a), []).append(Write(c, n, b, d, bytes(data), e))
    out = []
    for key in sorted(heads, key=lambda k: (k[2], k[0], k[1]), reverse=True):
        parent, type_, metadata, data = heads[key]
        chans = tuple(sorted(channels.get(key, ())))
        known = blobs.get((key[0], key[1]), {})
        values: dict[tuple[str, str], Blob] = {}
        for channel, version in chans:
            blob = known.get((channel, version))
            while blob is not None and (channel, blob.version) not in values:
                values[channel, blob.version] = blob
                blob = None if blob.base is None else known.get((channel, blob.base))
        out.append(
            StoredCheckpoint(
                thread_id=key[0],
                checkpoint_ns=key[1],
                checkpoint_id=key[2],
                parent_checkpoint_id=parent,
                type=type_,
                checkpoint=bytes(data),
                metadata=metadata,
                values=tuple(values[k] for k in sorted(values)),
                writes=tuple(
                    sorted(writes.get(key, ()), key=lambda w: (w.task_path, w.task_id, w.idx))
                ),
                channels=chans,
            )
        )
    return out
