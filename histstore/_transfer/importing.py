"""Import: read an export file, check every record by the store's rules, write it.

Every record goes through the rules ``write`` and ``save`` apply (``_core.rules``): message
JSON and size, token counts, times, ids, system prompts, metadata, summaries and list
items; positions must run 0 to N-1 in order and every count (a conversation's messages,
a list's items, the footer's totals) must match what the file holds. A value the store
refuses is a ``FormatError`` naming the line, raised before anything of that
conversation is stored; the conversations before it are kept, whatever ``batch`` is.

A version-2 file carries each conversation's editable history (entry ids and authors,
revision, next ids, halt, asides, turn records, change log), checked by
``_transfer.editable.Edits``: a record's own faults name its line; a log that does not
build the conversation (revisions not 1 to its revision, an entry id twice, counts that
do not fit) names the conversation record's line. A version-1 file's entries get new
ids and its conversations a change log of one ``"import"`` record.

A conversation already at the destination is made equal to the file's, writing only
what differs (``_transfer.sync``); one that is equal already counts as skipped. So
importing a file again, or a corrected file, converges to the same store. Conversations
only at the destination are left alone.

A version-3 file's LangGraph threads follow its conversations; each is checked and
stored whole (``_transfer.threads.moves``), replacing the destination's thread of that
id unless that holds the very same rows (then it counts as skipped). A version-4 file's
memory items follow; each replaces the destination's item of its namespace and key
unless that is the very same (``_transfer.items``).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any, cast

from .._core import codec as _codec
from .._core import rules as _rules
from .._core.models import Summary
from .._editable.entries import check_author
from .._errors import HistStoreError, InvalidMessage
from .._storage.dberrors import DatabaseFailure
from .._storage.rows import batch_columns
from .._store import Store, store_call
from .editable import Edits
from .format import DEFAULT_BATCH, FORMAT_NAME, FORMAT_VERSION, Progress, Reader, TransferStats
from .items import ItemTarget, import_items
from .sync import Incoming, MessageRows
from .threads.moves import import_threads
from .threads.write import ThreadTarget
from .write import Writer

__all__ = ["import_store"]


@store_call
async def import_store(
    store: Store,
    lines: Iterable[bytes],
    *,
    batch: int = DEFAULT_BATCH,
    progress: Progress | None = None,
) -> TransferStats:
    """Import an export file (given as its lines) into ``store`` (see the module doc).

    An import the database fails (a full disk, a lost server) or whose file cannot be
    read raises an error naming the line and the conversation where it stopped (none of
    that conversation is stored, nor anything after it) and what was imported before.

    Through a scoped view every conversation becomes the view's user's; an id taken by
    a conversation the view may not see is ``NotFound``.

    Raises:
        FormatError: the file is not a valid export, or holds a value the store refuses
            (names the line); the conversations before that one are imported.
        NotFound: a scoped view may not see a conversation of the file.
        DatabaseFailure: the database failed (names the line and the conversation).
        HistStoreError: reading the file failed (names the line).
    """
    if batch < 1:
        raise ValueError("batch must be at least 1")
    stats = TransferStats()
    reader = Reader(lines, stats)
    version = _header(reader)
    ctx = store.internals

    # The conversations read but not yet committed, in file order, with the line of
    # their record: the first is where an import that failed stopped.
    pending: dict[int, tuple[str, int]] = {}

    def done(incoming: Incoming, changed: bool) -> None:
        pending.pop(id(incoming), None)
        if changed:
            stats.conversations += 1
            stats.messages += incoming.length
        else:
            stats.skipped += 1

    counted = {"conversations": 0, "messages": 0}  # records read (then threads, ...)
    try:
        async with Writer(ctx, batch=batch, action="import", done=done) as writer:
            while (record := reader.next()) is not None:
                kind = record.get("type")
                if kind == "footer" or version >= _SINCE.get(str(kind), FORMAT_VERSION + 1):
                    break
                if kind != "conversation":
                    raise reader.error(f"expected a conversation record, found {kind!r}")
                counted["conversations"] += 1
                line = reader.number
                incoming = _incoming(reader, record, version)
                pending[id(incoming)] = (incoming.id, line)
                writer.begin(incoming)
                limit = ctx.settings.max_message_bytes
                await _conversation(reader, writer, incoming, batch, limit)
                counted["messages"] += incoming.length
                await writer.end()
                reader.conversation = None
                if progress is not None:
                    progress(stats)
            else:
                raise reader.error(
                    "the file ends before its footer (truncated?);"
                    " the conversations before this point were imported"
                )
        if record.get("type") == "thread":
            target = ThreadTarget(ctx, batch=batch, action="import")
            record, threads = await import_threads(reader, record, target, stats, progress)
            counted["threads"], counted["checkpoints"] = threads
        if record.get("type") == "memory" and version >= 4:
            items = ItemTarget(ctx, action="import")
            record, counted["items"] = await import_items(
                reader, record, items, batch, stats, progress
            )
        _footer(reader, record, counted)
    except (DatabaseFailure, OSError) as exc:
        raise _stopped(exc, reader, next(iter(pending.values()), None), stats) from exc
    return stats


def _stopped(
    exc: DatabaseFailure | OSError,
    reader: Reader,
    first: tuple[str, int] | None,
    stats: TransferStats,
) -> HistStoreError:
    """The error for an import the database (or reading the file) failed: where it
    stopped (the first conversation not stored, its record's line), why, and what was
    imported before."""
    if isinstance(exc, DatabaseFailure):
        why = str(exc)
    else:
        why = f"reading the file failed: {exc.strerror or exc}"  # no filename: the caller's
    if first is None:
        where = f"line {reader.number}"
        lost = "nothing after it was stored"
    else:
        cid, line = first
        where = f"line {line}, conversation {cid!r}"
        lost = "nothing from that conversation on was stored"
        if isinstance(exc, DatabaseFailure) and exc.phase != "body":
            lost = "whether that conversation was stored is unknown, none after it was"
    before = (
        f"{stats.conversations:,} conversations ({stats.messages:,} messages) were"
        f" imported before it, {stats.skipped:,} were there unchanged"
    )
    if stats.threads or stats.skipped_threads:
        before += f", and {stats.threads + stats.skipped_threads:,} threads"
    if stats.items or stats.skipped_items:
        before += f", and {stats.items + stats.skipped_items:,} memory items"
    message = f"{where}: {why}; {lost}; {before} (importing the file again resumes)"
    if isinstance(exc, DatabaseFailure):
        return DatabaseFailure(message, phase=exc.phase)
    return HistStoreError(message)


def _header(reader: Reader) -> int:
    """The file's format version."""
    header = reader.next()
    if header is None or header.get("format") != FORMAT_NAME:
        raise reader.error("not a histstore export (no header)")
    version = header.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise reader.error("the header has no valid 'version'")
    if version > FORMAT_VERSION:
        raise reader.error(
            f"the file is format version {version}; this histstore reads versions 1 to"
            f" {FORMAT_VERSION} (upgrade histstore)"
        )
    return version


_SINCE = {"thread": 3, "memory": 4}
"""The records after the conversations, with the first version that holds them."""


def _footer(reader: Reader, record: dict[str, Any], counted: dict[str, int]) -> None:
    if record.get("type") != "footer":
        raise reader.error(f"expected the footer, found {record.get('type')!r}")
    for key in ("threads", "checkpoints", "items"):
        if key in record:  # a footer may count what the file does not hold
            counted.setdefault(key, 0)
    for key, seen in counted.items():
        said = reader.count(record, key)
        if said != seen:
            raise reader.error(
                f"the footer counts {said} {key} where the file holds {seen}"
                " (conversations missing?)"
            )
    if reader.next() is not None:
        raise reader.error("records after the footer")


def _incoming(reader: Reader, record: dict[str, Any], version: int) -> Incoming:
    cid = reader.ident(record, "id", "conversation id")
    reader.conversation = cid  # named by every error until its end record
    user = record.get("user")
    if user is not None:
        user = reader.ident(record, "user", "user")
    prompt = record.get("system_prompt")
    if prompt is not None:
        prompt = reader.rule(_codec.check_text, prompt, what=f"the system prompt of {cid!r}")
    return Incoming(
        cid,
        user,
        prompt,
        reader.count(record, "messages"),
        reader.time(record, "created_at"),
        reader.time(record, "updated_at"),
        metadata=reader.metadata(cid, record.get("metadata")),
        edits=_edits(reader, record, cid) if version >= 2 else None,
    )


def _edits(reader: Reader, record: dict[str, Any], cid: str) -> Edits:
    """The editable state a version-2 conversation record announces."""
    halted = record.get("halted")
    if halted is not None:
        halted = reader.rule(check_author, halted, what="'halted'")
    return reader.rule(
        Edits,
        cid,
        reader.count(record, "revision"),
        reader.count(record, "next_entry"),
        reader.count(record, "next_aside"),
        halted,
    )


class _Messages:
    """Message records of one conversation, checked and handed over a batch at a time."""

    def __init__(
        self, reader: Reader, writer: Writer, incoming: Incoming, limit: int, batch: int
    ) -> None:
        self.reader, self.writer, self.cid, self.limit = reader, writer, incoming.id, limit
        self.edits = incoming.edits
        self.batch = batch
        self.count = 0
        self._records: list[dict[str, Any]] = []
        self._times: list[datetime] = []
        self._lines: list[int] = []

    def add(self, record: dict[str, Any]) -> bool:
        """Take the next message record; whether a batch is ready to ``flush``."""
        reader = self.reader
        position = record.get("position")
        if position != self.count or type(position) is not int:  # one check when fine
            got = reader.count(record, "position")
            raise reader.error(
                f"conversation {self.cid!r}: message at position {got} where"
                f" {self.count} was expected"
            )
        edits = self.edits
        if edits is not None:
            entry_id = record.get("entry_id")
            if type(entry_id) is not int or not 0 < entry_id < edits.next_entry:
                reader.rule(edits.entry_id, entry_id)  # raises, naming the line
            author = record.get("author")
            if author is not None:
                reader.rule(check_author, author, what="a message's 'author'")
        self.count += 1
        self._records.append(record)
        self._times.append(reader.time(record, "created_at"))
        self._lines.append(reader.number)
        return len(self._records) >= self.batch

    async def flush(self) -> None:
        records = self._records
        if not records:
            return
        first = self.count - len(records)
        data = [r.get("data") for r in records]
        tokens = [r.get("token_count") for r in records]
        checked = self._prepare(data, tokens, self._times)
        if checked is None:  # find the first refused record, to name its line
            for i, line in enumerate(self._lines):
                args = (data[i : i + 1], tokens[i : i + 1], self._times[i : i + 1])
                try:
                    self._prepare(*args, quiet=False)
                except InvalidMessage as exc:
                    raise self.reader.error(str(exc), line) from None
            raise self.reader.error(f"conversation {self.cid!r}: a message is refused")
        self._records, self._times, self._lines = [], [], []
        ids: list[int] | None = None
        authors: list[str | None] | None = None
        if self.edits is not None:  # checked by ``add``
            ids = [r["entry_id"] for r in records]
            authors = [r.get("author") for r in records]
            self.edits.take_ids(ids)
        roles, datas, texts = batch_columns(checked, self.writer.text)
        await self.writer.messages(
            MessageRows(
                first,
                roles,
                datas,
                checked.tokens,
                cast("list[datetime]", checked.times),  # every record has its time
                texts,
                ids,
                authors,
            )
        )

    def _prepare(
        self, data: list[Any], tokens: list[Any], times: list[datetime], *, quiet: bool = True
    ) -> _rules.Batch | None:
        try:
            return _rules.prepare_batch(
                self.cid,
                data,
                max_message_bytes=self.limit,
                count_tokens=None,
                tokens=tokens,
                times=times,
                decoded=True,
            )
        except InvalidMessage:
            if quiet:
                return None
            raise


async def _conversation(
    reader: Reader, writer: Writer, incoming: Incoming, batch: int, limit: int
) -> None:
    cid, edits = incoming.id, incoming.edits
    line = reader.number  # the conversation record's
    messages = _Messages(reader, writer, incoming, limit, batch)
    lists: set[str] = set()
    while True:
        record = reader.next()
        if record is None:
            raise reader.error(f"the file ends inside conversation {cid!r} (truncated?)")
        kind = record.get("type")
        if kind == "message":
            if messages.add(record):
                await messages.flush()
            continue
        await messages.flush()
        if kind == "summary":
            writer.summary(_summary(reader, record, cid, len(incoming.summaries)))
        elif kind == "list":
            name = reader.ident(record, "name", "list name")
            length = reader.count(record, "length")
            if name in lists:
                raise reader.error(f"conversation {cid!r}: list {name!r} comes twice")
            lists.add(name)
            await writer.open_list(name, length)
            await _items(reader, writer, cid, name, length, batch)
        elif kind == "end":
            if record.get("id") != cid:
                raise reader.error(f"the end record does not match conversation {cid!r}")
            break
        elif edits is not None and kind in _EDITS:
            _EDITS[kind](reader, edits, record)
        else:
            raise reader.error(f"unexpected {kind!r} record in conversation {cid!r}")
    if messages.count != incoming.length:
        raise reader.error(
            f"conversation {cid!r} has {messages.count} messages where its record"
            f" says {incoming.length}"
        )
    if edits is not None:
        try:
            edits.check()
        except HistStoreError as exc:
            raise reader.error(str(exc), line) from None


def _aside(reader: Reader, edits: Edits, record: dict[str, Any]) -> None:
    if "value" not in record:
        raise reader.error("an aside has no 'value'")
    value = record["value"]
    text = reader.rule(_codec.encode_decoded, value, what="an aside's value")[0]
    reader.rule(edits.aside, record.get("id"), record.get("after"), record.get("home"), value, text)


def _turn(reader: Reader, edits: Edits, record: dict[str, Any]) -> None:
    opened = reader.time(record, "opened_at")
    ended = None if record.get("ended_at") is None else reader.time(record, "ended_at")
    number, start, end, usage = (record.get(k) for k in ("number", "start", "end", "usage"))
    reader.rule(edits.turn, number, start, opened, end, ended, usage)


_HEAD = ("type", "revision", "kind", "author", "at")


def _change(reader: Reader, edits: Edits, record: dict[str, Any]) -> None:
    at = reader.time(record, "at")
    rest = {k: v for k, v in record.items() if k not in _HEAD}
    text = reader.rule(_codec.encode_decoded, rest, what="a change record")[0]
    kind, author = record.get("kind"), record.get("author")
    reader.rule(edits.change, record.get("revision"), kind, author, at, text)


_EDITS = {"aside": _aside, "turn": _turn, "change": _change}


def _summary(reader: Reader, record: dict[str, Any], cid: str, seq: int) -> dict[str, Any]:
    created = reader.time(record, "created_at")

    def check() -> dict[str, Any]:
        summary = Summary(
            record.get("start"),  # type: ignore[arg-type]  # Summary checks them
            record.get("end"),  # type: ignore[arg-type]
            record.get("content"),
            record.get("token_count"),
            created,
        )
        return _rules.summary_row(cid, seq, summary)

    return reader.rule(check)


async def _items(
    reader: Reader, writer: Writer, cid: str, name: str, length: int, batch: int
) -> None:
    rows: list[dict[str, Any]] = []
    for idx in range(length):
        record = reader.next()
        if record is None or record.get("type") != "item":
            raise reader.error(f"conversation {cid!r}: list {name!r} is missing items")
        value, blob = reader.item(record)
        rows.append(
            {"conversation_id": cid, "name": name, "idx": idx, "value": value, "blob": blob}
        )
        if len(rows) >= batch:
            await writer.items(rows)
            rows = []
    if rows:
        await writer.items(rows)
