"""Benchmark: what a 100-message append costs SQLite itself, by the shape of its INSERT.

Run from a checkout::

    python bench/sqlite_inserts.py [--quick] [--repeat N] [--sqlite-dir DIR] [--json FILE]

SQLite only (``--backend postgres`` measures nothing). No histstore code runs in the
timed part: with the ``sqlite3`` module, each write is the transaction histstore's
append runs (``BEGIN IMMEDIATE``, the conversation's upsert, the batch's row in the
writes table, the messages, the statement listing them for the full-text index,
``COMMIT``) on a file ``histstore.connect`` made, with the messages inserted ``rows`` at
a time (1: ``executemany``; more: multi-row ``INSERT ... VALUES``). Each shape runs on
that schema as made and on a copy given back the two INSERT triggers of the messages
table that revision a2f6c8e4d0b3 dropped (one listed each row, so that write lists
nothing itself): SQLite copies the rows of a multi-row INSERT into a temporary table
first when the table has row triggers, which this shows. Beside them, the raw program
of ``../shared/peers`` (one upsert, one ``executemany`` of three columns). WAL,
``synchronous=NORMAL``. Figures: the first write (which compiles the statements) and
the median of the others, in microseconds; the cases alternate ``--repeat`` times on
fresh copies.
"""

from __future__ import annotations

import shutil
import sqlite3
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from _common import (
    bench_parser,
    chat_messages,
    encode,
    median,
    render_table,
    repeated_config,
    run_and_report,
)

import histstore


@dataclass(frozen=True)
class Config:
    batches: int = 200
    messages: int = 100
    repeat: int = 3
    shapes: tuple[int, ...] = (1, 8, 32, 64)


FULL = Config()
QUICK = Config(batches=5, messages=20, repeat=1, shapes=(1, 8))

_COLUMNS = (
    "conversation_id, position, role, data, token_count, created_at, search_text, entry_id, author"
)
_UPSERT = (
    "INSERT INTO histstore_conversations (id, owner, length, created_at, updated_at,"
    " revision, next_entry, next_aside, listed_changes) VALUES (?, NULL, ?, ?, ?, 1, ?, 1, 1)"
    " ON CONFLICT (id) DO UPDATE SET length = length + excluded.length,"
    " updated_at = excluded.updated_at, revision = revision + 1,"
    " next_entry = next_entry + excluded.length, listed_changes = listed_changes + 1"
    " RETURNING length, revision, next_entry"
)
_LIST = (
    "INSERT OR IGNORE INTO histstore_messages_fts_queued (message_rowid)"
    " SELECT rowid FROM histstore_messages"
    " WHERE rowid > (SELECT last_insert_rowid() - ?)"
)
# The INSERT triggers of the messages table before revision a2f6c8e4d0b3 (the listing
# one without its ``WHEN new.search_text IS NOT NULL``: since c8d2f4a6e1b9 a string
# content's text is NULL there, and every row is listed).
_TRIGGERS = (
    "CREATE TRIGGER histstore_messages_fts_insert AFTER INSERT ON histstore_messages"
    " BEGIN INSERT OR IGNORE INTO"
    " histstore_messages_fts_queued(message_rowid) VALUES (new.rowid); END",
    "CREATE TRIGGER histstore_guard_entry_id BEFORE INSERT ON histstore_messages"
    " WHEN NEW.entry_id IS NULL OR NEW.entry_id < 1 BEGIN SELECT RAISE(ABORT, 'older'); END",
)
_RECORD = (
    "INSERT INTO histstore_writes (conversation_id, key, position, count, digest,"
    " created_at, revision, appended) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
)
_RAW_SCHEMA = (
    "CREATE TABLE conversations (id TEXT PRIMARY KEY, n INTEGER NOT NULL) WITHOUT ROWID;"
    "CREATE TABLE messages (conversation_id TEXT NOT NULL, position INTEGER NOT NULL,"
    " data TEXT NOT NULL, PRIMARY KEY (conversation_id, position));"
)
_RAW_UPSERT = (
    "INSERT INTO conversations (id, n) VALUES (?, ?)"
    " ON CONFLICT (id) DO UPDATE SET n = n + excluded.n RETURNING n"
)


def _open(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    return conn


def _insert_triggers(path: Path) -> list[str]:
    """The names of the INSERT triggers of the messages table in ``path``."""
    conn = _open(path)
    try:
        return [
            name
            for name, sql in conn.execute(
                "SELECT name, sql FROM sqlite_master WHERE type = 'trigger'"
                " AND tbl_name = 'histstore_messages'"
            )
            if " INSERT ON " in sql.upper()
        ]
    finally:
        conn.close()


def _add_insert_triggers(path: Path) -> None:
    conn = _open(path)
    try:
        for sql in _TRIGGERS:
            conn.execute(sql)
    finally:
        conn.close()


def _histstore_write(
    conn: sqlite3.Connection,
    conversation: str,
    messages: list[dict[str, Any]],
    rows_each: int,
    lists: bool,
) -> None:
    now = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")
    n = len(messages)
    conn.execute("BEGIN IMMEDIATE")
    ((length, revision, next_entry),) = conn.execute(
        _UPSERT, (conversation, n, now, now, n + 1)
    ).fetchall()
    first = length - n
    conn.execute(_RECORD, (conversation, uuid.uuid4().hex, first, n, "0" * 64, now, revision, n))
    rows = [
        (conversation, first + i, m["role"], encode(m), None, now, None,
         next_entry - n + i, None)
        for i, m in enumerate(messages)
    ]  # fmt: skip
    one = "(" + ", ".join("?" * 9) + ")"
    if rows_each == 1:
        conn.executemany(f"INSERT INTO histstore_messages ({_COLUMNS}) VALUES {one}", rows)
    else:
        for start in range(0, n, rows_each):
            chunk = rows[start : start + rows_each]
            values = ", ".join([one] * len(chunk))
            conn.execute(
                f"INSERT INTO histstore_messages ({_COLUMNS}) VALUES {values}",
                [v for row in chunk for v in row],
            )
    if lists:
        conn.execute(_LIST, (n,))
    conn.execute("COMMIT")


def _raw_write(conn: sqlite3.Connection, conversation: str, messages: list[dict[str, Any]]) -> None:
    conn.execute("BEGIN")
    ((n_after,),) = conn.execute(_RAW_UPSERT, (conversation, len(messages))).fetchall()
    first = n_after - len(messages)
    conn.executemany(
        "INSERT INTO messages (conversation_id, position, data) VALUES (?, ?, ?)",
        [(conversation, first + i, encode(m)) for i, m in enumerate(messages)],
    )
    conn.execute("COMMIT")


def _timed(conn: sqlite3.Connection, cfg: Config, write: Any) -> list[float]:
    batches = [chat_messages(cfg.messages, seed=b) for b in range(cfg.batches)]
    times = []
    for b, messages in enumerate(batches):
        start = time.perf_counter()
        write(conn, f"conversation-{b}", messages)
        times.append((time.perf_counter() - start) * 1e6)
    return times


async def _made(path: Path) -> None:
    store = await histstore.connect(str(path))
    await store.close()


async def run_sqlite(cfg: Config, sqlite_dir: str | None) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="hs-inserts-", dir=sqlite_dir))
    try:
        made = root / "made.db"
        await _made(made)
        return _measure(cfg, root, made)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _measure(cfg: Config, root: Path, made: Path) -> dict[str, Any]:
    """The cases, alternating, each on a fresh copy of ``made`` (or a raw file)."""
    triggered = root / "triggered.db"
    shutil.copy(made, triggered)
    _add_insert_triggers(triggered)
    cases: list[tuple[str, Path | None, int]] = [("raw program", None, 1)]
    for rows_each in cfg.shapes:
        cases.append(("histstore schema", made, rows_each))
        cases.append(("with the INSERT triggers", triggered, rows_each))
    samples: dict[int, list[list[float]]] = {i: [] for i in range(len(cases))}
    for r in range(cfg.repeat):
        order = list(range(len(cases)))
        for i in order if r % 2 == 0 else reversed(order):
            label, source, rows_each = cases[i]
            path = root / f"case-{i}.db"
            if source is None:
                conn = _open(path)
                conn.executescript(_RAW_SCHEMA)
                times = _timed(conn, cfg, _raw_write)
            else:
                shutil.copy(source, path)
                conn = _open(path)
                lists = source == made  # else the trigger lists each row

                def write(
                    c: Any, conv: str, m: Any, k: int = rows_each, lists: bool = lists
                ) -> None:
                    _histstore_write(c, conv, m, k, lists)

                times = _timed(conn, cfg, write)
            conn.close()
            for suffix in ("", "-wal", "-shm"):
                Path(f"{path}{suffix}").unlink(missing_ok=True)
            samples[i].append(times)
    rows = []
    for i, (label, _, rows_each) in enumerate(cases):
        runs = samples[i]
        rows.append(
            {
                "case": label,
                "rows_per_statement": rows_each,
                "first_us": median([t[0] for t in runs]),
                "median_us": median([x for t in runs for x in t[1:]]),
            }
        )
    return {
        "sqlite": sqlite3.sqlite_version,
        "insert_triggers": _insert_triggers(made),
        "rows": rows,
    }


async def run_postgres() -> dict[str, Any]:
    return {"rows": [], "note": "SQLite only"}


def report(results: dict[str, dict[str, Any]], cfg: Config) -> str:
    out = []
    for kind, res in results.items():
        if not res["rows"]:
            out.append(f"{kind}: nothing measured ({res.get('note', '')})")
            continue
        out.append(
            f"{kind} {res['sqlite']}: a write of {cfg.messages} messages, {cfg.batches} writes"
            f" x {cfg.repeat}; INSERT triggers of the messages table as made:"
            f" {', '.join(res['insert_triggers']) or 'none'}"
        )
        raw = res["rows"][0]["median_us"]
        table = [
            [
                r["case"],
                str(r["rows_per_statement"]),
                f"{r['first_us']:,.0f}",
                f"{r['median_us']:,.0f}",
                f"{r['median_us'] / raw:.2f}",
            ]
            for r in res["rows"]
        ]
        headers = ["case", "rows/statement", "first us", "median us", "vs raw"]
        out.append(render_table(headers, table))
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    parser = bench_parser(__doc__ or "")
    parser.add_argument("--repeat", type=int, default=None, help="alternating runs (3)")
    args = parser.parse_args(argv)
    cfg = repeated_config(args, QUICK, FULL)
    return run_and_report(args, cfg, lambda: run_sqlite(cfg, args.sqlite_dir), run_postgres, report)


if __name__ == "__main__":
    sys.exit(main())
