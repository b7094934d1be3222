"""SQLite: a batch of rows as a few multi-row INSERTs instead of a statement per row
(``execute_many``, run on a connection's own thread by ``_storage.sqlite_driver``)."""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

__all__ = ["MAX_ROWS", "execute_many"]

MAX_ROWS = 32
"""Rows of one multi-row INSERT at most (see ``execute_many``). SQLite compiles a
multi-row INSERT once per connection, at a cost that grows faster than its rows: a
statement of 64 message rows took about 0.7 ms to prepare (a whole 100-message write's
worth), one of 32 about 0.1 ms, and per row both insert at the same speed."""

_VALUES = re.compile(r"\bVALUES (\((?:\?, )*\?\))")
# Bound parameters of one statement at most: SQLite's default limit (999 before 3.32).
_MAX_VARIABLES = 32766 if sqlite3.sqlite_version_info >= (3, 32) else 999


def execute_many(conn: sqlite3.Connection, sql: str, rows: Sequence[Sequence[Any]]) -> None:
    """Run ``sql`` once per row of arguments, as ``executemany`` does; but an INSERT of
    one ``VALUES`` group whose only parameters are that group's runs as a few multi-row
    INSERTs instead (row counts that are powers of two, at most ``MAX_ROWS``), which
    insert the same rows in the same order.

    One statement of many rows inserts them faster than a statement per row (by a
    tenth or more for a batch of 100 messages). Other statements run as they are, and
    one row as one ``execute``.
    """
    if len(rows) == 1:
        conn.execute(sql, rows[0])
        return
    cap = _rows_per_statement(sql) if rows else 0
    if cap < 2:
        conn.executemany(sql, rows)
        return
    done = 0
    while done < len(rows):
        n = _power_of_two_below(min(cap, len(rows) - done) + 1)
        chunk = rows[done : done + n]
        if n == 1:
            conn.execute(sql, chunk[0])
        else:
            conn.execute(_multi_row(sql, n), [value for row in chunk for value in row])
        done += n


def _power_of_two_below(n: int) -> int:
    """The largest power of two under ``n`` (``n`` > 1)."""
    return 1 << ((n - 1).bit_length() - 1)


@lru_cache(maxsize=256)
def _values_group(sql: str) -> str | None:
    """The one ``VALUES (?, ...)`` group of an INSERT whose every parameter is in it;
    ``None`` for any other statement."""
    if not sql.lstrip().upper().startswith("INSERT"):
        return None
    found = _VALUES.findall(sql)
    if len(found) != 1:
        return None
    return found[0] if sql.count("?") == found[0].count("?") else None


@lru_cache(maxsize=256)
def _rows_per_statement(sql: str) -> int:
    """How many rows of ``sql`` one multi-row INSERT takes (a power of two up to
    ``MAX_ROWS``, under the parameter limit); 0 for a statement that is not such an
    INSERT (see ``_values_group``)."""
    group = _values_group(sql)
    if group is None:
        return 0
    fits = max(1, _MAX_VARIABLES // group.count("?"))
    return _power_of_two_below(min(MAX_ROWS, fits) + 1)


@lru_cache(maxsize=256)
def _multi_row(sql: str, rows: int) -> str:
    """``sql`` (see ``_values_group``) inserting ``rows`` rows of arguments at once."""
    group = _values_group(sql)
    assert group is not None
    return _VALUES.sub(lambda _: "VALUES " + ", ".join([group] * rows), sql, count=1)
