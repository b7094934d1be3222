"""Benchmark: ``histstore copy`` and ``histstore import`` against raw driver inserts.

Run from a checkout::

    python bench/transfer.py [--backend sqlite|postgres|all] [--pg-url URL]
                         [--conversations N] [--messages M] [--batch B] [--repeat R]

A source SQLite store holds N conversations of M chat messages (about 200 bytes of
JSON each; default 100 x 1,000). On each destination backend, starting from an empty
database at the newest schema, it times:

* copy: ``_export.copy_store(source, destination)``, what ``histstore copy`` runs:
  reads the source page by page in snapshot transactions and writes whole
  conversations, ``B`` rows per insert and per transaction (on Postgres one statement
  per ``B`` message rows, from arrays with ``unnest``; on SQLite an ``executemany``);
* import: ``_export.import_store(destination, file)``, what ``histstore import`` runs,
  on a file ``histstore export`` wrote (every message parsed and validated);
* raw: the destination's driver alone (aiosqlite or asyncpg) inserting the same
  conversation and message rows (their search text as histstore stores it: NULL for a
  string content, which the full-text index reads instead; listed for the index on
  both sides), already in memory, in the same batches: an
  ``executemany`` per ``B`` message rows, one transaction per ``B`` rows (SQLite:
  ``BEGIN IMMEDIATE``, WAL, ``synchronous=FULL`` as histstore's default).

The figure is messages per second (median of ``R`` runs); the ratio is histstore's
throughput over raw. Target: at least 0.5. Stores are opened before the clock starts.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from _common import (
    DEFAULT_PG_URL,
    asyncpg_kwargs,
    chat_messages,
    encode,
    median,
    pg_databases,
    render_table,
    sqlite_timestamp,
)

import histstore
from histstore._storage import schema as _schema
from histstore._transfer import exporting as _export

Row = tuple[str, int, str, str, None, datetime, None]  # ..., created_at, search_text


async def make_source(path: Path, conversations: int, messages: int) -> list[Row]:
    """Fill the source store; return its message rows as the raw baseline inserts them."""
    pool = chat_messages(2000)
    async with histstore.connect(path, durability="process") as store:
        for c in range(conversations):
            cid = f"conv-{c:05d}"
            batch = [pool[(c + i) % len(pool)] for i in range(messages)]
            for start in range(0, messages, 5000):
                await store.write(cid, batch[start : start + 5000])
    now = datetime.now(timezone.utc)
    return [
        (
            f"conv-{c:05d}",
            i,
            pool[(c + i) % len(pool)]["role"],
            encode(pool[(c + i) % len(pool)]),
            None,
            now,
            None,  # the text is the string content (``rows.stored_search_text``)
        )
        for c in range(conversations)
        for i in range(messages)
    ]


async def raw_sqlite(path: Path, rows: list[Row], batch: int) -> None:
    import aiosqlite

    db = await aiosqlite.connect(path, isolation_level=None)
    try:
        await db.execute("PRAGMA journal_mode=WAL")
        await db.execute("PRAGMA synchronous=FULL")
        await db.execute("PRAGMA busy_timeout=30000")

        async def flush(convs: list[tuple[Any, ...]], msgs: list[tuple[Any, ...]]) -> None:
            await db.execute("BEGIN IMMEDIATE")
            await db.executemany(
                "INSERT INTO histstore_conversations (id, owner, system_prompt, length,"
                " created_at, updated_at, listed_changes) VALUES (?, NULL, NULL, ?, ?, ?, 1)",
                convs,
            )
            ((last,),) = await db.execute_fetchall("SELECT max(rowid) FROM histstore_messages")
            await db.executemany(
                "INSERT INTO histstore_messages (conversation_id, position, role, data,"
                " token_count, created_at, search_text, entry_id)"
                " VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?2 + 1)",
                msgs,
            )
            # Listed for the full-text index, as histstore's writes list what they add.
            await db.execute(
                "INSERT OR IGNORE INTO histstore_messages_fts_queued (message_rowid)"
                " SELECT rowid FROM histstore_messages WHERE rowid > ?",
                (last or 0,),
            )
            await db.execute("COMMIT")

        await _batches(rows, batch, flush, sqlite_timestamp)
    finally:
        await db.close()


async def raw_postgres(url: str, rows: list[Row], batch: int) -> None:
    import asyncpg

    conn = await asyncpg.connect(**asyncpg_kwargs(url))
    try:

        async def flush(convs: list[tuple[Any, ...]], msgs: list[tuple[Any, ...]]) -> None:
            async with conn.transaction():
                await conn.executemany(
                    "INSERT INTO histstore_conversations (id, owner, system_prompt, length,"
                    " created_at, updated_at, listed_changes)"
                    " VALUES ($1, NULL, NULL, $2, $3, $4, 1)",
                    convs,
                )
                await conn.executemany(
                    "INSERT INTO histstore_messages (conversation_id, position, role, data,"
                    " token_count, created_at, search_text, entry_id)"
                    " VALUES ($1, $2, $3, $4, $5, $6, $7, $2 + 1)",
                    msgs,
                )

        await _batches(rows, batch, flush, lambda t: t)
    finally:
        await conn.close()


async def _batches(
    rows: list[Row],
    batch: int,
    flush: Callable[[list[tuple[Any, ...]], list[tuple[Any, ...]]], Awaitable[None]],
    stamp: Callable[[datetime], Any],
) -> None:
    """Group rows as histstore does: whole conversations, ``batch`` rows a transaction."""
    convs: list[tuple[Any, ...]] = []
    msgs: list[tuple[Any, ...]] = []
    i = 0
    while i < len(rows):
        cid = rows[i][0]
        j = i
        while j < len(rows) and rows[j][0] == cid:
            j += 1
        created = stamp(rows[i][5])
        convs.append((cid, j - i, created, created))
        for k in range(i, j):
            cid_, pos, role, data, tokens, at, search = rows[k]
            msgs.append((cid_, pos, role, data, tokens, stamp(at), search))
            if len(msgs) >= batch and j - k > 1:
                await flush(convs, msgs)  # a long conversation: more than one insert
                convs, msgs = [], []
        if len(msgs) + len(convs) >= batch:
            await flush(convs, msgs)
            convs, msgs = [], []
        i = j
    if convs or msgs:
        await flush(convs, msgs)


async def truncate_pg(url: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(**asyncpg_kwargs(url))
    try:
        names = ", ".join(t.name for t in _schema.metadata.sorted_tables)
        await conn.execute(f"TRUNCATE {names}")
    finally:
        await conn.close()


async def run(args: argparse.Namespace) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="histstore-bench-copy-"))
    try:
        source = tmp / "source.db"
        rows = await make_source(source, args.conversations, args.messages)
        total = len(rows)
        dump = tmp / "dump.jsonl"
        async with histstore.connect(source) as store:
            with dump.open("w", encoding="utf-8") as out:
                await _export.export_store(store, out)
        print(
            f"{args.conversations:,} conversations x {args.messages:,} messages"
            f" ({total:,} messages, export file {dump.stat().st_size / 1e6:,.0f} MB),"
            f" batch {args.batch:,}, median of {args.repeat}"
        )
        backends = ["sqlite", "postgres"] if args.backend == "all" else [args.backend]
        table = []
        for backend in backends:
            results: dict[str, list[float]] = {"copy": [], "import": [], "raw": []}
            for r in range(args.repeat):
                for mode in ("raw", "copy", "import") if r % 2 else ("copy", "import", "raw"):
                    seconds = await one(backend, mode, args, tmp, source, dump, rows)
                    results[mode].append(total / seconds)
            raw = median(results["raw"])
            for mode in ("copy", "import"):
                ours = median(results[mode])
                table.append(
                    [f"{backend} {mode}", f"{ours:,.0f}", f"{raw:,.0f}", f"{ours / raw:.2f}"]
                )
        print(render_table(["destination", "histstore msg/s", "raw msg/s", "ratio"], table))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


async def one(
    backend: str,
    mode: str,
    args: argparse.Namespace,
    tmp: Path,
    source: Path,
    dump: Path,
    rows: list[Row],
) -> float:
    """Seconds one run takes, on an empty destination at the newest schema."""
    if backend == "sqlite":
        target = tmp / f"dest-{mode}-{time.monotonic_ns()}.db"
        async with histstore.connect(target):
            pass
        return await timed(mode, args, str(target), source, dump, rows, sqlite=True)
    async with pg_databases(args.pg_url, ["dest"]) as urls:
        url = urls["dest"]
        async with histstore.connect(url, migrate=True):
            pass
        return await timed(mode, args, url, source, dump, rows, sqlite=False)


async def timed(
    mode: str,
    args: argparse.Namespace,
    target: str,
    source: Path,
    dump: Path,
    rows: list[Row],
    *,
    sqlite: bool,
) -> float:
    if mode == "raw":
        start = time.perf_counter()
        if sqlite:
            await raw_sqlite(Path(target), rows, args.batch)
        else:
            await raw_postgres(target, rows, args.batch)
        return time.perf_counter() - start
    async with histstore.connect(target) as dest, histstore.connect(source) as src:
        start = time.perf_counter()
        if mode == "copy":
            stats = await _export.copy_store(src, dest, batch=args.batch)
        else:
            with dump.open("rb") as lines:
                stats = await _export.import_store(dest, lines, batch=args.batch)
        seconds = time.perf_counter() - start
        assert stats.messages == len(rows), (mode, stats)
        assert await dest.count(rows[-1][0]) == args.messages
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=("sqlite", "postgres", "all"), default="all")
    parser.add_argument("--pg-url", default=DEFAULT_PG_URL)
    parser.add_argument("--conversations", type=int, default=100)
    parser.add_argument("--messages", type=int, default=1000)
    parser.add_argument("--batch", type=int, default=_export.DEFAULT_BATCH)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    asyncio.run(run(args))


if __name__ == "__main__":
    sys.exit(main())
