"""The export format: JSON Lines records, written and read back.

The export format (version 4)
-----------------------------

UTF-8 text, one JSON object per line. Times are ISO 8601 strings in UTC with
microseconds (``2025-01-31T12:00:00.123456+00:00``). The first line is the header, the
last the footer; in between, each conversation is a ``conversation`` record, the
records that belong to it, and an ``end`` record::

    {"format": "histstore", "version": 2, "exported_at": TIME}
    {"type": "conversation", "id": ID, "user": OWNER|null, "system_prompt": STR|null,
     "created_at": TIME, "updated_at": TIME, "messages": N, "metadata": {KEY: VALUE},
     "revision": R, "next_entry": E, "next_aside": A, "halted": STR|null}
    {"type": "message", "position": P, "created_at": TIME, "token_count": INT|null,
     "entry_id": ID, "author": STR|null, "data": MESSAGE}
                                            N of these, positions 0 to N-1 in order
    {"type": "aside", "id": ID, "after": ENTRY|null, "home": ENTRY|null, "value": VALUE}
                                            the asides now, by id
    {"type": "turn", "number": K, "start": ENTRY, "opened_at": TIME,
     "end": "completed"|"stopped"|"failed"|"halted"|null, "ended_at": TIME|null,
     "usage": {"input": I, "output": O, "cache_read": C, "cache_write": W}|null}
                                            the turn records, numbered 1, 2, ...
    {"type": "change", "revision": V, "kind": KIND, "author": STR|null, "at": TIME,
     ...the stored record's keys}           R of these, revisions 1 to R in order
    {"type": "summary", "start": S, "end": E, "content": VALUE, "token_count": INT|null,
     "created_at": TIME}                    in the order they were added
    {"type": "list", "name": NAME, "length": K}
    {"type": "item", "value": VALUE}        K of these after their list; a bytes item
    {"type": "item", "bytes": BASE64}       is standard base64
    {"type": "end", "id": ID}
    {"type": "thread", "id": THREAD, "row": {COLUMN: VALUE},
     "rows": {"checkpoint": K, "blob": B, "channel": H, "write": W}}
    {"type": "checkpoint"|"blob"|"channel"|"write", "row": {COLUMN: VALUE}}
                                            the counted rows of each type, in that order
    {"type": "end", "thread": THREAD}
    {"type": "memory", "namespace": [LABEL, ...], "key": KEY, "value": OBJECT, ...}
                                            the memory items (``_transfer.items``)
    {"type": "footer", "conversations": C, "messages": M, "threads": T, "checkpoints": K,
     "items": I}

``MESSAGE`` is the message's JSON object exactly as stored. A conversation's editable
history (SPEC 11) is carried whole: the conversation record holds its revision (the
number of its change records), the next entry and aside ids it hands out and its halt
(the reason, or null); each message its entry id and author (null for what ``write``
stored). An ``aside`` is a JSON value drawn after the entry ``after`` (null: before
every entry); ``home`` is the entry it was put after. A ``change`` record is the change
as the store keeps it (``_editable.change_log``), streamed as it is: beside ``revision``,
``kind``, ``author`` and ``at``, the keys of its parts that it has, ``start`` (null or
missing: at the end), ``removed`` (the entries it removed, in full: ``{"id",
"message", "author"?, "created_at"?}``), ``added`` (how many entries it added: only
counted, as they are recovered from the entries that followed), ``moved`` (``[aside,
from, to]`` triples), ``asides`` (``{"id", "before", "after"}`` states), ``halt``
(``[before, after]``) and ``turn``. A plain write's record is ``{"kind": "write",
"added": N}``: it appended N messages at the end. A reader checks that the records
rebuild the entries and fold to the asides, halt and turn records, and refuses the
conversation otherwise.

After the conversations come the LangGraph threads (``histstore.checkpoints``), each a
``thread`` record, its rows and an ``end`` record. A thread's rows are the rows of the
checkpoint tables as stored (``_transfer.threads.rows``): ``row`` holds every column of
the table but ``thread_id``, by name, each value in its JSON form by the column's type
(bytes as standard base64, so serialized checkpoints, channel values and pending writes
travel byte for byte; times as above; text and numbers as they are). The thread
record's ``row`` is the thread's own row (its owner and times); ``rows`` counts its rows
of each type, and a reader checks them. Its other keys are for people and tools (e.g.
``messages``, its newest messages as JSON); a reader ignores them.

Idempotency records are not exported. The footer counts every conversation record,
message record, thread record, checkpoint record and memory record; a reader checks them.
A reader refuses a file whose ``version`` is newer than it knows. An export that holds
neither a thread nor a memory item is written as version 2 (without their records or
counts), so older histstore versions read it; version 3 is version 4 without memory
records and threads' ``text`` records. Version 1 is version 2 without the editable history (no
such keys or records): its messages get new entry ids, 1 to N, and its
conversations a change log of one record of kind ``"import"`` holding their entries.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, TypeVar

from .._core import rules as _rules
from .._core.codec import MAX_NESTING, nesting_exceeds
from .._core.ids import validate_id
from .._errors import HistStoreError
from .._storage.rows import now

__all__ = [
    "DEFAULT_BATCH",
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "FormatError",
    "Progress",
    "Reader",
    "TransferStats",
    "aside_line",
    "change_line",
    "conversation_line",
    "footer_line",
    "header_line",
    "item_line",
    "message_lines",
    "row_line",
    "summary_line",
    "thread_end_line",
    "thread_line",
    "time_text",
    "turn_line",
]

T = TypeVar("T")
Extra = Mapping[str, Any] | None

FORMAT_NAME = "histstore"
FORMAT_VERSION = 4
DEFAULT_BATCH = 1000


class FormatError(HistStoreError, ValueError):
    """An import file does not follow the export format, or holds a value the store
    refuses; names the line."""


@dataclass
class TransferStats:
    """What an export, import or copy did so far (handed to progress callbacks):
    ``conversations`` written (or exported), ``skipped`` already at the destination
    unchanged, ``messages`` exported, imported or copied; ``threads``, ``skipped_threads``
    and ``checkpoints`` count LangGraph threads and their checkpoints the same way,
    ``items`` and ``skipped_items`` memory items."""

    conversations: int = 0
    skipped: int = 0
    messages: int = 0
    total_messages: int | None = None
    """The messages to transfer in all, when known beforehand (a progress bar's end)."""
    bytes_read: int = 0
    """Bytes of the dump read so far (an import)."""
    threads: int = 0
    skipped_threads: int = 0
    checkpoints: int = 0
    items: int = 0
    skipped_items: int = 0


Progress = Callable[[TransferStats], None]


# ---------------------------------------------------------------------------- writing


def time_text(value: datetime) -> str:
    """A time as the format writes it."""
    return value.astimezone(timezone.utc).isoformat(timespec="microseconds")


def _str(value: str | None) -> str:
    return json.dumps(value, ensure_ascii=False)


def header_line(version: int = FORMAT_VERSION) -> str:
    """The first line of a file."""
    header = {"format": FORMAT_NAME, "version": version, "exported_at": time_text(now())}
    return json.dumps(header, separators=(",", ":")) + "\n"


def footer_line(conversations: int, messages: int, **later: int) -> str:
    """The last line of a file; ``later``: the counts of versions 3 and 4 (``threads``,
    ``checkpoints``, ``items``)."""
    footer = {"type": "footer", "conversations": conversations, "messages": messages, **later}
    return json.dumps(footer, separators=(",", ":")) + "\n"


def thread_line(
    thread_id: str, row: Mapping[str, Any], counts: Mapping[str, int], readable: Extra = None
) -> str:
    """A thread record: its row's record form (``threads.rows.encode_row``), row counts,
    and the ``readable`` mapping's keys (a reader ignores them; its own keys win)."""
    record = {**(readable or {}), "type": "thread", "id": thread_id, "row": row, "rows": counts}
    return json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n"


def row_line(kind: str, row: Mapping[str, Any]) -> str:
    """A checkpoint table's row in its record form."""
    record = {"type": kind, "row": row}
    return json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n"


def thread_end_line(thread_id: str) -> str:
    """The record that ends a thread."""
    return f'{{"type":"end","thread":{_str(thread_id)}}}\n'


def conversation_line(
    cid: str,
    owner: str | None,
    system_prompt: str | None,
    created_at: datetime,
    updated_at: datetime,
    length: int,
    metadata: Iterable[tuple[str, str]],
    editable: tuple[int, int, int, str | None],
) -> str:
    """A conversation record; ``metadata`` holds (key, JSON text) pairs, ``editable`` the
    revision, next entry id, next aside id and halt."""
    md = ",".join(f"{_str(k)}:{v}" for k, v in metadata)
    revision, next_entry, next_aside, halted = editable
    return (
        f'{{"type":"conversation","id":{_str(cid)},"user":{_str(owner)},'
        f'"system_prompt":{_str(system_prompt)},'
        f'"created_at":"{time_text(created_at)}","updated_at":"{time_text(updated_at)}",'
        f'"messages":{length},"metadata":{{{md}}},"revision":{int(revision)},'
        f'"next_entry":{int(next_entry)},"next_aside":{int(next_aside)},'
        f'"halted":{_str(halted)}}}\n'
    )


def message_lines(rows: Sequence[Sequence[Any]]) -> str:
    """Message records for rows of (position, role, data, token_count, created_at,
    search_text, entry_id, author)."""
    parts = []
    last: datetime | None = None
    stamp = ""
    for position, _role, data, tokens, created, _text, entry_id, author, *_ in rows:
        if created != last:  # a batch's messages share their time: format it once
            last, stamp = created, time_text(created)
        count = "null" if tokens is None else int(tokens)
        by = "null" if author is None else _str(author)
        parts.append(
            f'{{"type":"message","position":{position},"created_at":"{stamp}",'
            f'"token_count":{count},"entry_id":{int(entry_id)},"author":{by},"data":{data}}}\n'
        )
    return "".join(parts)


def aside_line(row: Sequence[Any]) -> str:
    """An aside record for a row of (aside_id, after, home, value JSON text)."""
    aside_id, after, home, value = row
    return (
        f'{{"type":"aside","id":{int(aside_id)},"after":{_id(after)},"home":{_id(home)},'
        f'"value":{value}}}\n'
    )


def turn_line(row: Sequence[Any]) -> str:
    """A turn record for a row of (number, start, opened_at, end, ended_at, usage JSON
    text or ``None``)."""
    number, start, opened_at, end, ended_at, usage = row
    ended = "null" if ended_at is None else f'"{time_text(ended_at)}"'
    return (
        f'{{"type":"turn","number":{int(number)},"start":{int(start)},'
        f'"opened_at":"{time_text(opened_at)}","end":{_str(end)},"ended_at":{ended},'
        f'"usage":{"null" if usage is None else usage}}}\n'
    )


def change_line(row: Sequence[Any]) -> str:
    """A change record for a stored one: (revision, kind, author, at, the record's JSON
    object text), its keys spliced in as they are.

    Raises:
        HistStoreError: the stored text is not a JSON object (a damaged database).
    """
    revision, kind, author, at, record = row
    body = record.strip()
    if not (body.startswith("{") and body.endswith("}")):
        raise HistStoreError(f"change record {revision} is damaged (not a JSON object)")
    inner = body[1:-1].strip()
    return (
        f'{{"type":"change","revision":{int(revision)},"kind":{_str(kind)},'
        f'"author":{_str(author)},"at":"{time_text(at)}"{"," if inner else ""}{inner}}}\n'
    )


def _id(value: int | None) -> str:
    return "null" if value is None else str(int(value))


def summary_line(row: Mapping[str, Any]) -> str:
    """A summary record for a row of the summaries table."""
    tokens = row["token_count"]
    return (
        f'{{"type":"summary","start":{row["start"]},"end":{row["end"]},'
        f'"content":{row["content"]},"token_count":{"null" if tokens is None else int(tokens)},'
        f'"created_at":"{time_text(row["created_at"])}"}}\n'
    )


def list_line(name: str, length: int) -> str:
    """A list record."""
    return f'{{"type":"list","name":{_str(name)},"length":{length}}}\n'


def item_line(row: Sequence[Any]) -> str:
    """An item record for a row of (idx, value, blob)."""
    _idx, value, blob = row
    if value is None:
        data = base64.b64encode(bytes(blob)).decode("ascii")
        return f'{{"type":"item","bytes":"{data}"}}\n'
    return f'{{"type":"item","value":{value}}}\n'


def end_line(cid: str) -> str:
    """The record that ends a conversation."""
    return f'{{"type":"end","id":{_str(cid)}}}\n'


# ---------------------------------------------------------------------------- reading


class Reader:
    """Parses a file line by line, naming the line in every error it raises, and the
    conversation being read (``conversation``, set by the caller) when there is one."""

    def __init__(self, lines: Iterable[bytes], stats: TransferStats) -> None:
        self._lines = iter(lines)
        self._stats = stats
        self.number = 0
        self.conversation: str | None = None
        self._last_time: tuple[object, datetime] = (object(), now())  # matches no text

    def error(self, message: str, number: int | None = None) -> FormatError:
        """A ``FormatError`` naming the current line (or line ``number``) and the
        conversation being read, unless ``message`` names it already."""
        where = f"line {self.number if number is None else number}"
        cid = self.conversation
        if cid is not None and repr(cid) not in message:
            where += f", conversation {cid!r}"
        return FormatError(f"{where}: {message}")

    def next(self) -> dict[str, Any] | None:
        """The next record, or ``None`` at the end of the file."""
        for raw in self._lines:
            self.number += 1
            self._stats.bytes_read += len(raw)
            if not raw.strip():
                continue
            if _nests_too_deep(raw):
                raise self.error(f"a value is nested more than {MAX_NESTING} levels deep")
            try:
                # NaN and Infinity parse here, and are refused where a value is stored.
                record = _parse(raw)
            except RecursionError:  # pragma: no cover - the check above comes first
                raise self.error(f"a value is nested more than {MAX_NESTING} levels deep") from None
            except (UnicodeDecodeError, ValueError):
                raise self.error("not a JSON object (is this a histstore export?)") from None
            if not isinstance(record, dict):
                raise self.error("not a JSON object (is this a histstore export?)")
            return record
        return None

    def field(self, record: Mapping[str, Any], key: str, kind: type) -> Any:
        """``record[key]``, which must be of ``kind`` (a bool is no int)."""
        value = record.get(key)
        if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
            raise self.error(f"{record.get('type', 'record')} has no valid {key!r}")
        return value

    def time(self, record: Mapping[str, Any], key: str) -> datetime:
        """A time (``_core.rules.time``: aware, with a UTC form)."""
        text = record.get(key)
        if text == self._last_time[0]:  # neighbouring records often share a time
            return self._last_time[1]
        text = self.field(record, key, str)
        try:
            value = datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            raise self.error(f"{key!r} is not an ISO 8601 time") from None
        if value.tzinfo is None:
            raise self.error(f"{key!r} has no time zone")
        value = self.rule(_rules.time, value, repr(key))
        self._last_time = (text, value)
        return value

    def rule(self, check: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``check(*args)``, its ``InvalidMessage``/``InvalidId`` as a ``FormatError``."""
        try:
            return check(*args, **kwargs)
        except HistStoreError as exc:
            raise self.error(str(exc)) from None

    def count(self, record: Mapping[str, Any], key: str) -> int:
        """A position, length or count (``_core.rules.position``)."""
        return self.rule(_rules.position, record.get(key), repr(key))

    def ident(self, record: Mapping[str, Any], key: str, what: str) -> str:
        """An id (``validate_id``)."""
        return self.rule(validate_id, record.get(key), what=what)

    def item(self, record: Mapping[str, Any]) -> tuple[str | None, bytes | None]:
        """An item record's stored form (``_core.rules.item``)."""
        if record.get("type") != "item":
            raise self.error(f"expected an item record, found {record.get('type')!r}")
        if "bytes" in record:
            try:
                blob = base64.b64decode(self.field(record, "bytes", str), validate=True)
            except ValueError:
                raise self.error("'bytes' is not base64") from None
            return None, blob
        if "value" not in record:
            raise self.error("an item has neither 'value' nor 'bytes'")
        return self.rule(_rules.item, record["value"])

    def metadata(self, cid: str, value: object) -> list[dict[str, Any]]:
        """Metadata rows (``_core.rules.metadata_rows``)."""
        if value is None:
            value = {}
        if not isinstance(value, dict):
            raise self.error("'metadata' must be an object")
        return self.rule(_rules.metadata_rows, cid, value)


_decoder = json.JSONDecoder()
_JSON_SPACE = " \t\n\r"

_RECORD_LEVELS = 3
"""How deep a record holds a stored value at most: a ``change`` record's ``removed``
list, an entry in it, then the message."""


def _nests_too_deep(raw: bytes) -> bool:
    """Whether a line nests deeper than a record of values within the store's limit
    (``_core.codec.MAX_NESTING``) can: checked before parsing, so that what is refused
    does not depend on how deep the interpreter's ``json`` can go. Each stored value
    is checked against the limit itself where it is stored."""
    limit = MAX_NESTING + _RECORD_LEVELS
    if raw.count(b"[") + raw.count(b"{") <= limit:
        return False
    return nesting_exceeds(raw.decode("utf-8", "replace"), limit)


def _parse(raw: bytes) -> Any:
    """``json.loads(raw)``, faster for the lines an export writes.

    A line that starts with ``{`` is UTF-8 to ``json.loads`` too; decoding it here (the
    same way) and parsing the ``str`` skips its encoding detection and wrapper.
    """
    if raw[:1] != b"{":
        return json.loads(raw)
    text = raw.decode("utf-8", "surrogatepass")
    value, end = _decoder.raw_decode(text)
    if end != len(text) and text[end:].strip(_JSON_SPACE):
        raise ValueError("extra data after the JSON value")
    return value
