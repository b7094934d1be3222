"""LangGraph threads in export, import and copy (format version 3, ``_transfer.format``).

Export writes each thread the source sees as a ``thread`` record, its rows and an
``end`` record, after the conversations; import checks every record
(``threads.rows.decode_row``: the columns, their kinds, what the database can store, the
counts the thread record announces) and stores each thread whole through
``threads.write.ThreadTarget``, as copy does with the rows it reads from the source.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import IO, Any, TypeVar

from ..._errors import HistStoreError
from ..format import Progress, Reader, TransferStats, row_line, thread_end_line, thread_line
from .read import StoredThread, ThreadSource
from .rows import KINDS, OPTIONAL_KINDS, THREADS, check_row, check_thread, decode_row, encode_row
from .write import ThreadTarget

__all__ = ["Readable", "copy_threads", "export_threads", "import_threads"]

T = TypeVar("T")


Readable = Callable[[str], Awaitable[Mapping[str, Any]]]
"""What adds readable keys to a thread's record, given its id (``export_store``)."""


async def export_threads(
    source: ThreadSource,
    out: IO[str],
    stats: TransferStats,
    progress: Progress | None,
    readable: Readable | None = None,
) -> None:
    """Write every thread of ``source`` (each read in a snapshot of its own), each record
    with the keys ``readable`` gives for it (asked before its snapshot opens)."""
    async for tid in source.ids():
        extra = None if readable is None else await readable(tid)
        async with source.read(tid) as thread:
            if thread is None:
                continue  # deleted since it was listed
            row = encode_row(THREADS, thread.row)
            out.write(thread_line(tid, row, thread.counts, extra))
            for kind, table in KINDS.items():
                async for rows in thread.rows(kind):
                    for r in rows:
                        out.write(row_line(kind, encode_row(table, r)))
            out.write(thread_end_line(tid))
        stats.threads += 1
        stats.checkpoints += thread.counts["checkpoint"]
        if progress is not None:
            progress(stats)


async def copy_threads(
    source: ThreadSource, target: ThreadTarget, stats: TransferStats, progress: Progress | None
) -> None:
    """Store every thread of ``source`` at ``target``, checked by the destination's rules.

    Raises:
        InvalidMessage, InvalidId: a source thread the target refuses (named); the
            threads before it are kept.
    """
    async for tid in source.ids():
        async with source.read(tid) as thread:
            if thread is None:
                continue
            row = _named(tid, check_thread, dict(thread.row))
            changed = await target.apply(row, _source_rows(thread))
        _count(stats, changed, thread.counts["checkpoint"])
        if progress is not None:
            progress(stats)


async def _source_rows(thread: StoredThread) -> AsyncIterator[tuple[str, dict[str, Any]]]:
    for kind, table in KINDS.items():
        async for rows in thread.rows(kind):
            for row in rows:
                yield kind, _named(thread.id, check_row, table, dict(row))


def _count(stats: TransferStats, changed: bool, checkpoints: int) -> None:
    if changed:
        stats.threads += 1
        stats.checkpoints += checkpoints
    else:
        stats.skipped_threads += 1


def _named(tid: str, check: Callable[..., T], *args: Any) -> T:
    """``check(*args)``; a refusal names the thread."""
    try:
        return check(*args)
    except HistStoreError as exc:
        raise type(exc)(f"thread {tid!r}: {exc}") from None


async def import_threads(
    reader: Reader,
    record: dict[str, Any],
    target: ThreadTarget,
    stats: TransferStats,
    progress: Progress | None,
) -> tuple[dict[str, Any], tuple[int, int]]:
    """Store the file's threads, from ``record`` (the first thread record) to the footer
    or the first memory record; returns that record and how many thread and checkpoint
    records were read.

    Raises:
        FormatError: a record that is not what the format says (names the line); the
            threads before it are stored, the one it belongs to is not.
    """
    threads = checkpoints = 0
    while True:
        kind = record.get("type")
        if kind in ("footer", "memory"):
            return record, (threads, checkpoints)
        if kind != "thread":
            raise reader.error(f"expected a thread record or the footer, found {kind!r}")
        threads += 1
        tid = reader.ident(record, "id", "thread id")
        row = _checked(reader, tid, decode_row, THREADS, record.get("row"), tid)
        row = _checked(reader, tid, check_thread, row)
        counts = _counts(reader, tid, record.get("rows"))
        changed = await target.apply(row, _file_rows(reader, tid, counts))
        checkpoints += counts["checkpoint"]
        _count(stats, changed, counts["checkpoint"])
        if progress is not None:
            progress(stats)
        following = reader.next()
        if following is None:
            raise reader.error("the file ends before its footer (truncated?)")
        record = following


def _checked(reader: Reader, tid: str, check: Callable[..., T], *args: Any) -> T:
    try:
        return check(*args)
    except HistStoreError as exc:
        raise reader.error(f"thread {tid!r}: {exc}") from None


def _counts(reader: Reader, tid: str, value: object) -> dict[str, int]:
    if not isinstance(value, Mapping) or not set(KINDS) - OPTIONAL_KINDS <= set(value) <= set(
        KINDS
    ):
        raise reader.error(f"thread {tid!r}: 'rows' must count {', '.join(KINDS)}")
    return {kind: reader.count(value, kind) if kind in value else 0 for kind in KINDS}


async def _file_rows(
    reader: Reader, tid: str, counts: dict[str, int]
) -> AsyncIterator[tuple[str, dict[str, Any]]]:
    """The thread's rows, checked, then its end record (read before the thread commits)."""
    for kind, table in KINDS.items():
        for _ in range(counts[kind]):
            record = reader.next()
            if record is None:
                raise reader.error(f"the file ends inside thread {tid!r} (truncated?)")
            if record.get("type") != kind:
                raise reader.error(
                    f"thread {tid!r}: expected a {kind} record, found {record.get('type')!r}"
                    " (its 'rows' counts do not match)"
                )
            yield kind, _checked(reader, tid, decode_row, table, record.get("row"), tid)
    end = reader.next()
    if end is None or end.get("type") != "end" or end.get("thread") != tid:
        raise reader.error(f"thread {tid!r}: expected its end record")
