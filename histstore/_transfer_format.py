"""The export format: JSON Lines records, written and read back.

The export format (version 1)
-----------------------------

UTF-8 text, one JSON object per line. Times are ISO 8601 strings in UTC with
microseconds (``2025-01-31T12:00:00.123456+00:00``). The first line is the header, the
last the footer; in between, each conversation is a ``conversation`` record, the
records that belong to it, and an ``end`` record::

    {"format": "histstore", "version": 1, "exported_at": TIME}
    {"type": "conversation", "id": ID, "user": OWNER|null, "system_prompt": STR|null,
     "created_at": TIME, "updated_at": TIME, "messages": N, "metadata": {KEY: VALUE}}
    {"type": "message", "position": P, "created_at": TIME, "token_count": INT|null,
     "data": MESSAGE}                       N of these, positions 0 to N-1 in order
    {"type": "summary", "start": S, "end": E, "content": VALUE, "token_count": INT|null,
     "created_at": TIME}                    in the order they were added
    {"type": "list", "name": NAME, "length": K}
    {"type": "item", "value": VALUE}        K of these after their list; a bytes item
    {"type": "item", "bytes": BASE64}       is standard base64
    {"type": "end", "id": ID}
    {"type": "footer", "conversations": C, "messages": M}

``MESSAGE`` is the message's JSON object exactly as stored. Idempotency records are
not exported. The footer counts every conversation record and every message record of
the file; a reader checks them. A reader refuses a file whose ``version`` is newer than
it knows; later versions only add record types or keys, which a version-1 reader
ignores.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, TypeVar

from . import _codec, _rules
from ._errors import HistStoreError
from ._ids import validate_id

__all__ = [
    "DEFAULT_BATCH",
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "FormatError",
    "Progress",
    "Reader",
    "TransferStats",
    "conversation_line",
    "footer_line",
    "header_line",
    "item_line",
    "message_lines",
    "summary_line",
]

T = TypeVar("T")

FORMAT_NAME = "histstore"
FORMAT_VERSION = 1
DEFAULT_BATCH = 1000


class FormatError(HistStoreError, ValueError):
    """An import file does not follow the export format, or holds a value the store
    refuses; names the line."""


@dataclass
class TransferStats:
    """What an export, import or copy did so far (handed to progress callbacks).

    ``conversations`` counts those written (or exported), ``skipped`` those already at
    the destination unchanged; ``messages`` the messages exported, imported or copied.
    """

    conversations: int = 0
    skipped: int = 0
    messages: int = 0
    total_messages: int | None = None
    bytes_read: int = 0


Progress = Callable[[TransferStats], None]


# ---------------------------------------------------------------------------- writing


def now() -> datetime:
    """The current time, aware UTC."""
    return datetime.now(timezone.utc)


def time_text(value: datetime) -> str:
    """A time as the format writes it."""
    return value.astimezone(timezone.utc).isoformat(timespec="microseconds")


def _str(value: str | None) -> str:
    return json.dumps(value, ensure_ascii=False)


def header_line() -> str:
    """The first line of a file."""
    header = {"format": FORMAT_NAME, "version": FORMAT_VERSION, "exported_at": time_text(now())}
    return json.dumps(header, separators=(",", ":")) + "\n"


def footer_line(conversations: int, messages: int) -> str:
    """The last line of a file."""
    footer = {"type": "footer", "conversations": conversations, "messages": messages}
    return json.dumps(footer, separators=(",", ":")) + "\n"


def conversation_line(
    cid: str,
    owner: str | None,
    system_prompt: str | None,
    created_at: datetime,
    updated_at: datetime,
    length: int,
    metadata: Iterable[tuple[str, str]],
) -> str:
    """A conversation record; ``metadata`` holds (key, JSON text) pairs."""
    md = ",".join(f"{_str(k)}:{v}" for k, v in metadata)
    return (
        f'{{"type":"conversation","id":{_str(cid)},"user":{_str(owner)},'
        f'"system_prompt":{_str(system_prompt)},'
        f'"created_at":"{time_text(created_at)}","updated_at":"{time_text(updated_at)}",'
        f'"messages":{length},"metadata":{{{md}}}}}\n'
    )


def message_lines(rows: Sequence[Sequence[Any]]) -> str:
    """Message records for rows of (position, role, data, token_count, created_at)."""
    parts = []
    last: datetime | None = None
    stamp = ""
    for position, _role, data, tokens, created, *_ in rows:
        if created != last:  # a batch's messages share their time: format it once
            last, stamp = created, time_text(created)
        count = "null" if tokens is None else int(tokens)
        parts.append(
            f'{{"type":"message","position":{position},"created_at":"{stamp}",'
            f'"token_count":{count},"data":{data}}}\n'
        )
    return "".join(parts)


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
    """Parses a file line by line, naming the line in every error it raises."""

    def __init__(self, lines: Iterable[bytes], stats: TransferStats) -> None:
        self._lines = iter(lines)
        self._stats = stats
        self.number = 0
        self._last_time: tuple[object, datetime] = (object(), now())  # matches no text

    def error(self, message: str, number: int | None = None) -> FormatError:
        """A ``FormatError`` naming the current line (or line ``number``)."""
        return FormatError(f"line {self.number if number is None else number}: {message}")

    def next(self) -> dict[str, Any] | None:
        """The next record, or ``None`` at the end of the file."""
        for raw in self._lines:
            self.number += 1
            self._stats.bytes_read += len(raw)
            if not raw.strip():
                continue
            try:
                # NaN and Infinity parse here, and are refused where a value is stored.
                record = _parse(raw)
            except RecursionError:
                raise self.error("the JSON is nested too deeply") from None
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
        """A time (``_rules.time``: aware, with a UTC form)."""
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
        """A position, length or count (``_rules.position``)."""
        return self.rule(_rules.position, record.get(key), repr(key))

    def ident(self, record: Mapping[str, Any], key: str, what: str) -> str:
        """An id (``validate_id``)."""
        return self.rule(validate_id, record.get(key), what=what)

    def item(self, record: Mapping[str, Any]) -> tuple[str | None, bytes | None]:
        """An item record's stored form (``_rules.item``)."""
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
        """Metadata rows (``_rules.metadata_rows``)."""
        if value is None:
            value = {}
        if not isinstance(value, dict):
            raise self.error("'metadata' must be an object")
        return self.rule(_rules.metadata_rows, cid, value)


_decoder = json.JSONDecoder()
_JSON_SPACE = " \t\n\r"


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


def decode_stored(text: str) -> Any:
    """A JSON text read from a store (copy), decoded."""
    return _codec.decode(text)
