"""Thread operations on checkpoints: delete a thread or the checkpoints of runs, prune a
thread to its newest checkpoints, copy a thread; each locks the threads it changes."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta

from sqlalchemy import delete, func, literal, select, tuple_, update
from sqlalchemy.ext.asyncio import AsyncConnection

from .._errors import ConflictError, NotFound
from .._ops.listing import idle_cutoff
from .._storage.rows import now as clock
from ._catalog import ThreadCatalog
from ._records import ItemText
from ._scope import BLOBS, CHANNELS, CHECKPOINTS, TEXT, THREADS, WRITES, chunks

__all__ = ["DELTA_KEY", "ThreadOperations"]

DELTA_KEY = "counters_since_delta_snapshot"
"""The metadata key of LangGraph checkpoints whose state has a ``DeltaChannel``."""


class ThreadOperations(ThreadCatalog):
    """Deletes, pruning and copies of whole threads (or of runs' checkpoints)."""

    async def delete_thread(self, thread_id: str) -> None:
        """Remove the thread and everything it holds. Idempotent; a foreign thread is left."""
        await self._delete(thread_id, None)

    async def _delete(self, thread_id: str, idle_before: datetime | None) -> bool:
        """Remove the thread (when it is still idle: not changed since ``idle_before``);
        whether it was removed."""

        async def work(conn: AsyncConnection) -> bool:
            if not await self._lock_visible(conn, [thread_id]):
                return False
            if idle_before is not None:
                changed = select(THREADS.c.updated_at).where(THREADS.c.thread_id == thread_id)
                if (await conn.execute(changed)).scalar_one() >= idle_before:
                    return False
            for table in (WRITES, CHANNELS, BLOBS, TEXT, CHECKPOINTS, THREADS):
                await conn.execute(delete(table).where(table.c.thread_id == thread_id))
            return True

        return await self._run("write", f"deleting thread {thread_id!r}", work)

    async def purge(
        self, *, idle_for: timedelta, progress: Callable[[int, int], None] | None = None
    ) -> int:
        """Delete every thread this view sees that has not changed for ``idle_for`` (a
        checkpoint or pending write stored changes it), each in its own transaction; a
        thread stored to meanwhile is kept. Returns how many were deleted;
        ``progress(done, total)`` is called after each.

        Raises:
            TypeError, ValueError: ``idle_for`` is not a non-negative ``timedelta``.
        """
        cutoff = idle_cutoff(idle_for)
        idle = await self.idle_threads(idle_for)
        deleted = 0
        for done, thread_id in enumerate(idle, 1):
            deleted += await self._delete(thread_id, cutoff)
            if progress is not None:
                progress(done, len(idle))
        return deleted

    async def delete_runs(self, run_ids: Sequence[str]) -> None:
        """Remove the checkpoints made by these runs, their pending writes, and the channel
        values no remaining checkpoint reads. Runs of foreign threads are left."""
        run_ids = sorted(set(run_ids))
        if not run_ids:
            return

        async def work(conn: AsyncConnection) -> None:
            doomed: list[tuple[str, str, str]] = []
            for chunk in chunks(run_ids):
                query = select(
                    CHECKPOINTS.c.thread_id,
                    CHECKPOINTS.c.checkpoint_ns,
                    CHECKPOINTS.c.checkpoint_id,
                )
                query = query.where(CHECKPOINTS.c.run_id.in_(list(chunk)))
                visible = self._visible(CHECKPOINTS.c.thread_id)
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
                for chunk in chunks(sorted(ids)):
                    for table in (WRITES, CHANNELS, CHECKPOINTS):
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

        Raises:
            NotImplementedError: ``keep_latest`` on a thread whose checkpoints use a
                LangGraph ``DeltaChannel`` (their metadata counts delta updates), whose
                state is rebuilt from older checkpoints' writes; that thread (and the
                ones after it) is left as it was.
        """
        for thread_id in dict.fromkeys(thread_ids):
            if not keep_latest:
                await self.delete_thread(thread_id)
                continue

            async def work(conn: AsyncConnection, thread_id: str = thread_id) -> None:
                if not await self._lock_visible(conn, [thread_id]):
                    return
                await _refuse_delta_channels(conn, thread_id)
                heads = await conn.execute(
                    select(CHECKPOINTS.c.checkpoint_ns, func.max(CHECKPOINTS.c.checkpoint_id))
                    .where(CHECKPOINTS.c.thread_id == thread_id)
                    .group_by(CHECKPOINTS.c.checkpoint_ns)
                )
                for ns, head in list(heads):
                    # Older checkpoints go, with their writes; writes of a newer
                    # checkpoint still being saved (there is none under the thread's
                    # lock, but writes may precede their checkpoint) stay.
                    for table in (WRITES, CHANNELS, CHECKPOINTS):
                        await conn.execute(
                            delete(table).where(
                                table.c.thread_id == thread_id,
                                table.c.checkpoint_ns == ns,
                                table.c.checkpoint_id < head,
                            )
                        )
                    await conn.execute(
                        update(CHECKPOINTS)
                        .where(
                            CHECKPOINTS.c.thread_id == thread_id,
                            CHECKPOINTS.c.checkpoint_ns == ns,
                            CHECKPOINTS.c.checkpoint_id == head,
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
        now = clock()

        async def work(conn: AsyncConnection) -> None:
            owner_query = select(THREADS.c.owner).where(THREADS.c.thread_id == source)
            visible = self._visible(THREADS.c.thread_id)
            if visible is not None:
                owner_query = owner_query.where(visible)
            found = (await conn.execute(owner_query)).first()
            if found is None:
                raise NotFound(f"thread {source!r} not found")
            params = {"thread_id": target, "owner": found[0], "now": now}
            if (await conn.execute(self._sql.create_thread, params)).first() is None:
                raise ConflictError(f"thread {target!r} already exists")
            for table in (CHECKPOINTS, CHANNELS, BLOBS, WRITES, TEXT):
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

    async def index_text(
        self, thread_id: str, checkpoint_ns: str, texts: Sequence[ItemText], ends: Mapping[str, int]
    ) -> bool:
        """Make the namespace's searchable text hold ``texts`` (``put``'s ``texts`` and
        ``text_ends``: each replaces the text at its channel and index; a channel of
        ``ends`` loses its text past that index), in one transaction; ``False`` (nothing
        done) for a thread this view does not see. For rebuilding the text of values
        stored before it was kept (``HiststoreSaver.areindex_text``)."""

        async def work(conn: AsyncConnection) -> bool:
            if not await self._lock_visible(conn, [thread_id]):
                return False
            key = (TEXT.c.thread_id == thread_id, TEXT.c.checkpoint_ns == checkpoint_ns)
            for channel, length in sorted(ends.items()):
                await conn.execute(
                    delete(TEXT).where(*key, TEXT.c.channel == channel, TEXT.c.idx >= length)
                )
            rows = [
                {"thread_id": thread_id, "checkpoint_ns": checkpoint_ns, "channel": t.channel}
                | {"idx": t.idx, "role": t.role, "text": t.text}
                for t in texts
            ]
            for chunk in chunks(rows):
                await conn.execute(self._sql.upsert_text, list(chunk))
            return True

        return await self._run("write", f"indexing thread {thread_id!r}", work)

    async def _lock_visible(self, conn: AsyncConnection, thread_ids: Sequence[str]) -> list[str]:
        """Lock the thread rows (in id order) this view may see; returns their ids."""
        params = {"threads": list(thread_ids), "owner": self._owner}
        return [r[0] for r in await conn.execute(self._sql.lock_threads, params)]

    async def _collect_blobs(self, conn: AsyncConnection, thread_id: str, ns: str) -> None:
        """Delete the namespace's channel values that no remaining checkpoint reads (a
        value read as the ``base`` a read value extends is read too), and the text of
        the channels left with no value."""
        listed = select(CHANNELS.c.channel, CHANNELS.c.version).where(
            CHANNELS.c.thread_id == thread_id, CHANNELS.c.checkpoint_ns == ns
        )
        todo = [(c, v) for c, v in await conn.execute(listed)]
        stored = select(BLOBS.c.channel, BLOBS.c.version, BLOBS.c.base).where(
            BLOBS.c.thread_id == thread_id, BLOBS.c.checkpoint_ns == ns
        )
        bases = {(c, v): b for c, v, b in await conn.execute(stored)}
        used: set[tuple[str, str]] = set()
        while todo:
            key = todo.pop()
            if key in bases and key not in used:
                used.add(key)
                if bases[key] is not None:
                    todo.append((key[0], bases[key]))
        unused = sorted(set(bases) - used)
        for chunk in chunks(unused):
            await conn.execute(
                delete(BLOBS).where(
                    BLOBS.c.thread_id == thread_id,
                    BLOBS.c.checkpoint_ns == ns,
                    tuple_(BLOBS.c.channel, BLOBS.c.version).in_(list(chunk)),
                )
            )
        emptied = sorted({c for c, _ in unused} - {c for c, _ in used})
        for chunk in chunks(emptied):
            await conn.execute(
                delete(TEXT).where(
                    TEXT.c.thread_id == thread_id,
                    TEXT.c.checkpoint_ns == ns,
                    TEXT.c.channel.in_(list(chunk)),
                )
            )


async def _refuse_delta_channels(conn: AsyncConnection, thread_id: str) -> None:
    """Raise ``NotImplementedError`` when a checkpoint of the thread uses a ``DeltaChannel``."""
    query = select(CHECKPOINTS.c.metadata).where(
        CHECKPOINTS.c.thread_id == thread_id,
        CHECKPOINTS.c.metadata.contains(DELTA_KEY, autoescape=True),
    )
    for text in (await conn.execute(query)).scalars():
        try:
            metadata = json.loads(text)
        except ValueError:
            continue
        if isinstance(metadata, dict) and DELTA_KEY in metadata:
            raise NotImplementedError(
                f"keep_latest cannot prune thread {thread_id!r}: it uses a DeltaChannel,"
                " whose state is rebuilt from older checkpoints"
            )
