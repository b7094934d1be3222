"""Copy: every conversation one store sees into another, through the same rules as import.

The rows read from the source are checked by the destination's rules (``_core.rules``)
exactly as an import file's records are: a conversation the destination would refuse
(a NUL in its system prompt, a token count past 2**31-1, a message over the size
limit, a hole in its positions ...) raises ``InvalidMessage`` (or ``InvalidId``) naming
it, before anything of it is written; the conversations before it are kept. A
conversation already at the destination is made equal to the source's, writing only
what differs (``_transfer.sync``), so copying again converges.

The editable history is carried whole (entry ids and authors, revision, next ids,
halt, asides, turn records and the change log as stored, a plain write's record moving
from the source's idempotency rows to the destination's changes table) and checked as
an import checks a version-2 file (``_transfer.editable.Edits``) before the conversation
is stored.

Then the LangGraph threads: each thread's rows are read in a snapshot of the source and
stored whole at the destination, as import stores a version-3 file's
(``_transfer.threads.moves``). Last the memory items of a whole store, a batch at a
time, stored as import stores a version-4 file's (``_transfer.items``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import aclosing
from datetime import datetime
from typing import Any, TypeVar

from .._core import codec as _codec
from .._core import rules as _rules
from .._core.ids import validate_id
from .._core.models import Summary, message_data, stored_message
from .._editable.entries import check_author
from .._errors import HistStoreError, InvalidMessage
from .._storage.calls import span_calls
from .._storage.rows import TextRule, now
from .._store import Store, store_calls
from .editable import Edits
from .format import DEFAULT_BATCH, Progress, TransferStats
from .items import ItemSource, ItemTarget, copy_items
from .read import Page, Source, StoredConversation
from .sync import Incoming, MessageRows
from .threads.moves import copy_threads
from .threads.read import ThreadSource
from .threads.write import ThreadTarget
from .write import Writer

__all__ = ["copy_store"]

T = TypeVar("T")


@span_calls(store_calls, stores=2)
async def copy_store(
    source: Store,
    target: Store,
    *,
    batch: int = DEFAULT_BATCH,
    progress: Progress | None = None,
) -> TransferStats:
    """Copy every conversation, LangGraph thread and memory item ``source`` sees into
    ``target`` (see the module doc; a scoped source sees no memory items).

    Raises:
        InvalidMessage, InvalidId: a source conversation, thread or item the target
            refuses (named); those copied before it are kept.
        NotFound: a scoped target may not see a conversation of the source, or the
            source holds memory items (a scoped target sees none).
    """
    if batch < 1:
        raise ValueError("batch must be at least 1")
    reader = Source(source.internals, batch=batch)
    stats = TransferStats()
    if progress is not None:
        stats.total_messages = (await reader.totals())[1]

    def done(_incoming: Incoming, changed: bool) -> None:
        if changed:
            stats.conversations += 1
        else:
            stats.skipped += 1

    limit = target.internals.settings.max_message_bytes
    # A NULL ``search_text`` means the text the source's database computes from the
    # JSON: where the target's computes another (``rows.text_rule``), it is made anew.
    same = source.internals.sql.text is target.internals.sql.text
    async with (
        Writer(target.internals, batch=batch, action="copy", done=done) as writer,
        aclosing(reader.pages()) as pages,
    ):
        async for page in pages:
            for conv in page.convs:
                await _copy_conversation(page, conv, writer, limit, same, stats, progress)
            if progress is not None:
                progress(stats)
    await copy_threads(
        ThreadSource(source.internals, batch=batch),
        ThreadTarget(target.internals, batch=batch, action="copy"),
        stats,
        progress,
    )
    items = ItemSource(source.internals, batch=batch)
    await copy_items(items, ItemTarget(target.internals, action="copy"), stats, progress)
    return stats


async def _copy_conversation(
    page: Page,
    conv: StoredConversation,
    writer: Writer,
    limit: int,
    same: bool,
    stats: TransferStats,
    progress: Progress | None,
) -> None:
    cid = conv.id
    incoming = _named(cid, _incoming, conv)
    edits = incoming.edits
    assert edits is not None
    writer.begin(incoming)
    expected = 0
    async for rows in page.messages(conv):
        rule = None if same else writer.text
        checked = _named(cid, _messages, cid, rows, expected, limit, edits, rule)
        expected += len(rows)
        await writer.messages(checked)
        stats.messages += len(rows)
        if progress is not None:
            progress(stats)
    if expected != conv.length:
        raise InvalidMessage(
            f"conversation {cid!r} holds {expected} messages where its row says {conv.length}"
        )
    for aside_id, after, home, value in conv.asides:
        decoded = _named(cid, _codec.decode, value)
        _named(cid, edits.aside, aside_id, after, home, decoded, value)
    for number, start, opened, end, ended, usage in conv.turns:
        opened = _named(cid, _rules.time, opened, "a turn record's opening time")
        if ended is not None:
            ended = _named(cid, _rules.time, ended, "a turn record's end time")
        counts = None if usage is None else _named(cid, _codec.decode, usage)
        _named(cid, edits.turn, number, start, opened, end, ended, counts)
    async for records in page.changes(conv):
        for revision, kind, author, at, text in records:
            at = _named(cid, _rules.time, at, "a change record's time")
            _named(cid, edits.change, revision, kind, author, at, text)
    _named(cid, edits.check)
    for row in conv.summaries:
        writer.summary(_named(cid, _summary, cid, row))
    for name, length in conv.lists:
        await writer.open_list(name, length)
        idx = 0
        async for items in page.items(conv, name):
            await writer.items(_named(cid, _items, cid, name, items, idx))
            idx += len(items)
        if idx != length:
            raise InvalidMessage(
                f"conversation {cid!r}: list {name!r} holds {idx} items where its row says {length}"
            )
    await writer.end()


def _named(cid: str, check: Callable[..., T], *args: Any) -> T:
    """``check(*args)``; a refusal names the conversation."""
    try:
        return check(*args)
    except HistStoreError as exc:
        if repr(cid) in str(exc):
            raise
        raise type(exc)(f"conversation {cid!r}: {exc}") from None
    except ValueError:  # a stored JSON text that does not parse
        raise InvalidMessage(f"conversation {cid!r} holds a value that is not JSON") from None


def _incoming(conv: StoredConversation) -> Incoming:
    validate_id(conv.id)
    if conv.owner is not None:
        validate_id(conv.owner, what="user")
    if conv.system_prompt is not None:
        _codec.check_text(conv.system_prompt, what="the system prompt")
    values = {_codec.key_from_stored(k): _codec.decode(v) for k, v in conv.metadata}
    return Incoming(
        conv.id,
        conv.owner,
        conv.system_prompt,
        _rules.position(conv.length, "length"),
        _rules.time(conv.created_at, "creation time"),
        _rules.time(conv.updated_at, "last change time"),
        metadata=_rules.metadata_rows(conv.id, values),
        edits=Edits(conv.id, *conv.editable),
    )


def _messages(
    cid: str,
    rows: Sequence[Sequence[Any]],
    first: int,
    limit: int,
    edits: Edits,
    rule: TextRule | None = None,
) -> MessageRows:
    """Message rows as import makes them, by the same rules.

    The JSON text was checked by the source store when it was written; what the
    destination decides anew is its size limit, the token counts, the times, the
    role column (``_core.rules.role_key``: ``'system'`` or NULL), the entry ids
    and the authors; with ``rule`` (the target's, where its database computes
    another text than the source's), a NULL ``search_text``.
    """
    roles: list[str | None] = []
    datas: list[str] = []
    tokens: list[int | None] = []
    times: list[datetime] = []
    texts: list[str | None] = []
    ids: list[int] = []
    authors: list[str | None] = []
    stamp: datetime | None = None
    seen: Any = None
    checked = now()
    check_id = edits.entry_id
    for i, (position, role, text, count, created, search, entry_id, author, *_) in enumerate(rows):
        if position != first + i:
            raise InvalidMessage(f"message at position {position} where {first + i} was expected")
        size = len(text) if text.isascii() else len(text.encode("utf-8"))
        if size > limit:
            raise InvalidMessage(
                f"message {position} has {size} bytes of JSON, over the limit of {limit}"
            )
        if role is None and '"system"' in text:
            # NULL: any role but system (or, in an older store, an envelope stored
            # without its role): the JSON says which, when it may be a system message.
            role = stored_message(text, None, None).role
        roles.append(_rules.role_key(role))
        datas.append(text)
        if count is not None:
            count = _rules.token_count(count, f"token count of message {position}")
        tokens.append(count)
        if stamp is None or created != seen:  # a batch's messages share their time
            seen = created
            stamp = checked if created is None else _rules.time(created, "message time")
        times.append(stamp)
        if search is None and rule is not None:
            search = rule(message_data(stored_message(text, None, None)), text)
        texts.append(search)  # the source's ``indexed_text``, made by the same function
        ids.append(check_id(entry_id))
        authors.append(None if author is None else check_author(author))
    edits.take_ids(ids)
    return MessageRows(first, roles, datas, tokens, times, texts, ids, authors)


def _summary(cid: str, row: dict[str, Any]) -> dict[str, Any]:
    summary = Summary(
        row["start"],
        row["end"],
        _codec.decode(row["content"]),
        row["token_count"],
        row["created_at"],
    )
    return _rules.summary_row(cid, row["seq"], summary)


def _items(cid: str, name: str, rows: Sequence[Sequence[Any]], first: int) -> list[dict[str, Any]]:
    validate_id(name, what="list name")
    out = []
    for i, (idx, value, blob) in enumerate(rows):
        if idx != first + i:
            raise InvalidMessage(f"list {name!r}: item {idx} where {first + i} was expected")
        if value is None:
            stored: tuple[str | None, bytes | None] = (None, bytes(blob))
        else:
            stored = _rules.item(_codec.decode(value))
        out.append(
            {
                "conversation_id": cid,
                "name": name,
                "idx": idx,
                "value": stored[0],
                "blob": stored[1],
            }
        )
    return out
