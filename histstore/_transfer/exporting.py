"""Moving whole conversations, LangGraph threads and memory items: export to JSON Lines
(here), import and copy.

All three stream: memory stays bounded by one batch of rows, however large the store
or a conversation is. The format is described in ``_transfer.format``; import is in
``_transfer.importing``, copy in ``_transfer.copying``; both write through
``_transfer.write``. This module
keeps every transfer name importable from one place (``histstore.admin`` re-exports
them).
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import aclosing
from typing import IO, cast

from .._core import codec as _codec
from .._core.ids import validate_id
from .._store import Store, store_call
from .copying import copy_store
from .format import (
    DEFAULT_BATCH,
    FORMAT_NAME,
    FORMAT_VERSION,
    FormatError,
    Progress,
    TransferStats,
    aside_line,
    change_line,
    conversation_line,
    end_line,
    footer_line,
    header_line,
    item_line,
    list_line,
    message_lines,
    summary_line,
    turn_line,
)
from .importing import import_store
from .items import ItemSource, export_items
from .read import Page, Source, StoredConversation
from .threads.moves import Readable, export_threads
from .threads.read import ThreadSource

__all__ = [
    "DEFAULT_BATCH",
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "FormatError",
    "TransferStats",
    "copy_store",
    "export_store",
    "import_store",
]


@store_call
async def export_store(
    store: Store,
    out: IO[str],
    *,
    ids: Sequence[str] | None = None,
    user: str | None = None,
    threads: Sequence[str] | None = None,
    items: bool | None = None,
    batch: int = DEFAULT_BATCH,
    progress: Progress | None = None,
    readable_threads: Readable | None = None,
) -> TransferStats:
    """Write the store's conversations, LangGraph threads and memory items as JSON Lines
    (format version 4, ``_transfer.format``; version 2 when neither a thread nor a memory
    item is written): everything but idempotency records, editable history
    included (entry ids and authors, asides, halts, turn records and the change log as
    stored), each thread's checkpoints, channel values and pending writes as stored, and
    each unexpired memory item with its times, expiry and vectors as stored.

    With neither ``ids`` nor ``threads`` everything is exported; otherwise exactly the
    conversations ``ids`` and the threads ``threads`` name. ``user`` keeps that user's
    conversations and threads; a scoped view exports only its user's. Memory items
    belong to no user: ``items`` (default: when everything of a whole store is
    exported, without ``user``) says whether they are written.
    ``readable_threads(thread_id)``, when given, is awaited for each thread before it is
    read: the keys it returns are added to the thread's record, for people and tools
    (``histstore export`` adds its messages as JSON); an import ignores them.

    Raises:
        NotFound: one of ``ids`` or ``threads`` does not exist or is not seen by the
            store (checked before anything is written).
        ValueError: ``items`` through a scoped view.
    """
    for cid in ids or ():
        validate_id(cid)
    for tid in threads or ():
        validate_id(tid, what="thread id")
    if user is not None:
        validate_id(user, what="user")
    if batch < 1:
        raise ValueError("batch must be at least 1")
    everything = ids is None and threads is None
    ctx = store.internals
    source = Source(ctx, ids=ids if ids is not None or everything else [], user=user, batch=batch)
    await source.check_ids()
    thread_source = ThreadSource(ctx, ids=threads, user=user, batch=batch)
    await thread_source.check_ids()
    with_threads = (everything or threads is not None) and await thread_source.count() > 0
    if items is None:
        items = everything and user is None and ctx.owner is None
    if items and ctx.owner is not None:
        raise ValueError("a scoped view sees no memory items (export the whole store)")
    item_source = ItemSource(ctx, batch=batch)
    with_items = items and await item_source.any()
    stats = TransferStats()
    if progress is not None:
        stats.total_messages = (await source.totals())[1]
    # The output is written while a snapshot is open; its own failure (a closed pipe, a
    # full disk) is raised as the stream raised it, never taken for the database's.
    writer = cast(IO[str], _Output(out))
    try:
        writer.write(header_line(FORMAT_VERSION if with_items or with_threads else 2))
        async with aclosing(source.pages()) as pages:
            async for page in pages:
                for conv in page.convs:
                    await _export_conversation(page, conv, writer, stats, progress)
                if progress is not None:
                    progress(stats)
        later: dict[str, int] = {}
        if with_threads:
            await export_threads(thread_source, writer, stats, progress, readable_threads)
        if with_threads or with_items:
            later = {"threads": stats.threads, "checkpoints": stats.checkpoints}
        if with_items:
            later["items"] = await export_items(item_source, writer, stats, progress)
        writer.write(footer_line(stats.conversations, stats.messages, **later))
        writer.flush()
    except _OutputFailed as failed:
        raise failed.error from None
    return stats


class _OutputFailed(Exception):
    """The output stream's own ``OSError``, carried past the database's error handling
    (which takes an ``OSError`` for a lost connection)."""

    def __init__(self, error: OSError) -> None:
        super().__init__(str(error))
        self.error = error


class _Output:
    """``out``'s ``write`` and ``flush``, raising ``_OutputFailed`` for its ``OSError``."""

    def __init__(self, out: IO[str]) -> None:
        self._out = out

    def write(self, text: str) -> int:
        try:
            return self._out.write(text)
        except OSError as exc:
            raise _OutputFailed(exc) from exc

    def flush(self) -> None:
        try:
            self._out.flush()
        except OSError as exc:
            raise _OutputFailed(exc) from exc


async def _export_conversation(
    page: Page,
    conv: StoredConversation,
    out: IO[str],
    stats: TransferStats,
    progress: Progress | None,
) -> None:
    metadata = ((_codec.key_from_stored(k), v) for k, v in conv.metadata)
    out.write(
        conversation_line(
            conv.id,
            conv.owner,
            conv.system_prompt,
            conv.created_at,
            conv.updated_at,
            conv.length,
            metadata,
            conv.editable,
        )
    )
    async for rows in page.messages(conv):
        out.write(message_lines(rows))
        stats.messages += len(rows)
        if progress is not None:
            progress(stats)
    out.write("".join(aside_line(r) for r in conv.asides))
    out.write("".join(turn_line(r) for r in conv.turns))
    async for records in page.changes(conv):
        out.write("".join(change_line(r) for r in records))
    out.write("".join(summary_line(r) for r in conv.summaries))
    for name, length in conv.lists:
        out.write(list_line(name, length))
        async for items in page.items(conv, name):
            out.write("".join(item_line(r) for r in items))
    out.write(end_line(conv.id))
    stats.conversations += 1
