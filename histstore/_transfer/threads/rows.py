"""LangGraph threads in transfers: the checkpoint tables' rows, as the export format
carries them, and the checks every incoming row passes.

Rows are handled by their table's columns (``_storage.schema``), not by what they
mean: a record holds every column but ``thread_id`` (the thread's), each value in its
JSON form by the column's Python type (bytes as standard base64, times as ISO 8601 in
UTC, text and numbers as they are). So a column added to a checkpoint table is carried
without changes here, and the serialized values travel byte for byte.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import Column, Table
from sqlalchemy.types import TypeDecorator

from ..._core import codec as _codec
from ..._core import rules as _rules
from ..._core.ids import validate_id
from ..._errors import InvalidMessage
from ..._storage import schema as s
from ..format import time_text

__all__ = [
    "KINDS",
    "OPTIONAL_KINDS",
    "ROW_BATCH",
    "THREADS",
    "RowDigest",
    "check_row",
    "decode_row",
    "encode_row",
]

THREADS = s.checkpoint_threads
KINDS: dict[str, Table] = {
    "checkpoint": s.checkpoints,
    "blob": s.checkpoint_blobs,
    "channel": s.checkpoint_channels,
    "write": s.checkpoint_writes,
    "text": s.checkpoint_text,
}
"""The record type of each checkpoint table's rows, in the order a thread carries them.
``text`` (the search's text of the thread's messages, revision 6b2d9e4f1a37) may be
missing from a file's counts (one exported before it): its thread is imported
unindexed."""
OPTIONAL_KINDS = frozenset({"text"})
"""Record types a thread's ``rows`` counts may leave out (as none)."""

ROW_BATCH = 100
"""Checkpoint rows read or written at a time, at most (fewer when a transfer's ``batch``
is smaller): they hold serialized states, often far larger than a message."""


def _columns(table: Table) -> Iterable[Column[Any]]:
    return (c for c in table.columns if c.name != "thread_id")


def _kind(column: Column[Any]) -> type:
    """The Python type of a column's values (a ``TypeDecorator``'s: its implementation's)."""
    type_ = column.type
    if isinstance(type_, TypeDecorator):
        type_ = type_.impl_instance
    return type_.python_type


def encode_row(table: Table, row: Mapping[str, Any]) -> dict[str, Any]:
    """A row's record form: every column but ``thread_id``, by column name."""
    out: dict[str, Any] = {}
    for column in _columns(table):
        value = row[column.name]
        if value is None:
            out[column.name] = None
        elif isinstance(value, (bytes, bytearray, memoryview)):
            out[column.name] = base64.b64encode(bytes(value)).decode("ascii")
        elif isinstance(value, datetime):
            out[column.name] = time_text(value)
        else:
            out[column.name] = value
    return out


def decode_row(table: Table, record: object, thread_id: str) -> dict[str, Any]:
    """The row a record stands for (``thread_id`` set), checked by ``check_row``.

    Raises:
        InvalidMessage: not an object, a column missing or unknown, a value of the
            wrong kind or one the database cannot store (the column is named).
    """
    if not isinstance(record, dict):
        raise InvalidMessage(f"a {table.name} row must be a JSON object")
    names = {c.name for c in _columns(table)}
    unknown = sorted(set(record) - names)
    if unknown:
        raise InvalidMessage(f"unknown column {unknown[0]!r} (written by a newer histstore?)")
    row: dict[str, Any] = {"thread_id": thread_id}
    for column in _columns(table):
        if column.name not in record:
            raise InvalidMessage(f"column {column.name!r} is missing")
        value = record[column.name]
        kind = _kind(column)
        if value is not None and kind is bytes:
            if not isinstance(value, str):
                raise InvalidMessage(f"column {column.name!r} must be base64 text")
            try:
                value = base64.b64decode(value, validate=True)
            except (binascii.Error, ValueError):
                raise InvalidMessage(f"column {column.name!r} is not base64") from None
        elif value is not None and kind is datetime:
            if not isinstance(value, str):
                raise InvalidMessage(f"column {column.name!r} must be an ISO 8601 time")
            try:
                value = datetime.fromisoformat(value.replace("Z", "+00:00"))
            except ValueError:
                raise InvalidMessage(f"column {column.name!r} is not an ISO 8601 time") from None
        row[column.name] = value
    return check_row(table, row)


def check_row(table: Table, row: dict[str, Any]) -> dict[str, Any]:
    """``row`` (every column of ``table``) if the destination can store it as it is.

    Raises:
        InvalidMessage: a value of the wrong kind, a NULL where the column has none, text
            a text column cannot hold (a NUL, past its length), a naive time.
    """
    for column in table.columns:
        value = row.get(column.name)
        what = f"column {column.name!r}"
        if value is None:
            if not column.nullable:
                raise InvalidMessage(f"{what} may not be null")
            continue
        kind = _kind(column)
        if kind is str:
            _codec.check_text(value, what=what)
            length = getattr(column.type, "length", None)
            if length is not None and len(value) > length:
                raise InvalidMessage(f"{what} is longer than {length} characters")
        elif kind is bytes:
            if not isinstance(value, (bytes, bytearray, memoryview)):
                raise InvalidMessage(f"{what} must be bytes")
            row[column.name] = bytes(value)
        elif kind is datetime:
            row[column.name] = _rules.time(value, what)
        elif kind is int:
            if type(value) is not int or not -(2**31) <= value < 2**31:
                raise InvalidMessage(f"{what} must be an integer of 32 bits")
        elif not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
            raise InvalidMessage(f"{what} must be a {kind.__name__}")
    return row


def check_thread(row: dict[str, Any]) -> dict[str, Any]:
    """A thread row: its id and owner follow histstore's id rules, then ``check_row``."""
    validate_id(row.get("thread_id"), what="thread id")
    if row.get("owner") is not None:
        validate_id(row["owner"], what="user")
    return check_row(THREADS, row)


class RowDigest:
    """What a set of rows holds, whatever their order: their count and a sum of their
    hashes. Two equal digests mean the same rows (up to a 128-bit hash collision)."""

    def __init__(self) -> None:
        self.count = 0
        self._sum = 0

    def add(self, kind: str, record: Mapping[str, Any]) -> None:
        """Count one row, in its record form."""
        text = json.dumps([kind, record], sort_keys=True, separators=(",", ":"))
        digest = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16)
        self._sum = (self._sum + int.from_bytes(digest.digest(), "big")) % (1 << 128)
        self.count += 1

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RowDigest):
            return NotImplemented
        return (self.count, self._sum) == (other.count, other._sum)

    __hash__ = None  # type: ignore[assignment]
