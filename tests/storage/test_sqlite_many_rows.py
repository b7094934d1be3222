"""SQLite runs a batch of rows as a few multi-row INSERTs (``execute_many``): the same
rows in the same order as ``executemany``, in far fewer statements."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import closing
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from histstore._storage.sqlite_inserts import MAX_ROWS, execute_many


@pytest.fixture
def conn() -> Iterator[sqlite3.Connection]:
    db = sqlite3.connect(":memory:", isolation_level=None)
    db.execute("CREATE TABLE t (k INT PRIMARY KEY, v TEXT, b BLOB)")
    yield db
    db.close()


def _statements(conn: sqlite3.Connection) -> list[str]:
    seen: list[str] = []
    conn.set_trace_callback(seen.append)
    return seen


def _rows(conn: sqlite3.Connection) -> list[Any]:
    return conn.execute("SELECT k, v, b FROM t ORDER BY rowid").fetchall()


@given(n=st.integers(min_value=0, max_value=3 * MAX_ROWS + 7))
def test_a_batch_is_inserted_whole_in_order(n: int) -> None:
    with closing(sqlite3.connect(":memory:", isolation_level=None)) as conn:
        conn.execute("CREATE TABLE t (k INT PRIMARY KEY, v TEXT, b BLOB)")
        rows = [(n - i, None if i % 3 == 0 else f"v{i}", bytes([i % 256])) for i in range(n)]
        seen = _statements(conn)
        execute_many(conn, "INSERT INTO t (k, v, b) VALUES (?, ?, ?)", rows)
        conn.set_trace_callback(None)
        assert _rows(conn) == rows
    # Runs of MAX_ROWS, then a statement per bit of the rest: never one per row.
    assert len(seen) <= n // MAX_ROWS + bin(n % MAX_ROWS).count("1")


def test_an_upsert_meets_earlier_rows_of_its_batch(conn: sqlite3.Connection) -> None:
    sql = "INSERT INTO t (k, v) VALUES (?, ?) ON CONFLICT (k) DO UPDATE SET v = excluded.v"
    execute_many(conn, sql, [(1, "a"), (2, "b"), (1, "c"), (3, "d")])
    assert conn.execute("SELECT k, v FROM t ORDER BY k").fetchall() == [
        (1, "c"),
        (2, "b"),
        (3, "d"),
    ]


@pytest.mark.parametrize(
    ("sql", "rows"),
    [
        # A parameter outside the VALUES group: one statement per row, as executemany.
        (
            "INSERT INTO t (k, v) VALUES (?, ?) ON CONFLICT (k) DO UPDATE SET v = ?",
            [(1, "a", "x"), (1, "b", "y"), (2, "c", "z")],
        ),
        ("UPDATE t SET v = ? WHERE k = ?", [("p", 1), ("q", 2)]),
        ("INSERT INTO t (k, v) SELECT ?, ?", [(7, "s"), (8, "t")]),
    ],
)
def test_other_statements_run_once_per_row(
    conn: sqlite3.Connection, sql: str, rows: list[tuple[Any, ...]]
) -> None:
    conn.executemany("INSERT INTO t (k, v) VALUES (?, ?)", [(1, "o"), (2, "o")])
    expected = sqlite3.connect(":memory:", isolation_level=None)
    expected.execute("CREATE TABLE t (k INT PRIMARY KEY, v TEXT, b BLOB)")
    expected.executemany("INSERT INTO t (k, v) VALUES (?, ?)", [(1, "o"), (2, "o")])
    expected.executemany(sql, rows)
    seen = _statements(conn)
    execute_many(conn, sql, rows)
    conn.set_trace_callback(None)
    assert len(seen) == len(rows)
    assert _rows(conn) == _rows(expected)
    expected.close()


def test_a_failing_row_fails_the_batch(conn: sqlite3.Connection) -> None:
    conn.execute("BEGIN")
    with pytest.raises(sqlite3.IntegrityError):
        execute_many(conn, "INSERT INTO t (k, v) VALUES (?, ?)", [(1, "a"), (2, "b"), (1, "c")])
    conn.execute("ROLLBACK")
    assert _rows(conn) == []
