"""Benchmark: histstore at scale, side by side with raw programs on the same data.

Run from a checkout::

    python bench/scale.py [--size 100k|1M|10M] [--backend sqlite|postgres|all]
                          [--pg-url URL] [--only ROW,...] [--repeat R] [--quick]
                          [--sqlite-dir DIR] [--json FILE] [--tree DIR]

For a size N it builds, on each backend, stores of two shapes: *many* (N/100
conversations of 100 chat messages, each with metadata ``{"app": ..., "group":
c // 10}``) and *long* (one conversation of N messages), plus a *small* many-store of
1% of N for the rows that report a growth (big / small: 100x the conversations). The
same data goes into raw programs doing the minimal SQL: on SQLite one messages table
(the JSON text, keyed by conversation and position) and an external-content FTS5 table
over the messages' text; on PostgreSQL one table and a GIN index on
``to_tsvector('simple', text)``. Raw stores are filled with ``executemany`` (SQLite)
or ``COPY`` (PostgreSQL), their index built after; histstore's with concurrent
``write`` calls of whole conversations (5,000 messages each for the long one),
``close()`` included in the time (it indexes whatever backlog is left).

Rows (``--only`` takes these names):

- ``load``: building the N-message many-store, ratio to raw (+ index build).
- ``bytes``: bytes per message of the many-store (SQLite: the file after a WAL
  checkpoint; PostgreSQL: every relation with its indexes and TOAST).
- ``search_conv``: ``search(common word, conversation=)`` in a fixed 100-message
  conversation; growth and ratio to raw.
- ``search_rare``: ``search(rare word)`` (5 hits in the whole store); ratio to raw.
- ``listing``: ``conversations(metadata=, order="updated", descending=True,
  limit=20)`` with a filter every conversation matches, and one matching 10; growth.
- ``count``: ``count()`` of a 100-message conversation; ratio to raw ``count(*)``.
- ``read``: ``read()`` of the long conversation whole, in a fresh process: time and
  peak RSS, ratio to raw (rows fetched and decoded).
- ``stream``: ``Store.stream`` (the streaming read, an async iterator) over the long
  conversation, fresh process; skipped when this histstore has none.
- ``export``/``import``: the many-store to a JSON Lines file and into an empty
  database, fresh processes; raw: the rows to JSON Lines and back with the index.
- ``purge``: ``purge(idle_for=0)`` of the whole many-store; growth (it runs last).

Timed calls are the median of ``--repeat`` (default 5) after a warm-up. Stores are
opened with ``durability="process"`` and raw SQLite runs WAL with
``synchronous=NORMAL``. ``--tree DIR`` imports histstore from another checkout (for a
before/after comparison in one session). ``--quick`` is a smoke test (N = 2,000).
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from _common import (
    asyncpg_kwargs,
    bench_parser,
    chat_messages,
    encode,
    median,
    pg_databases,
    render_table,
    run_and_report,
)

_HERE = Path(__file__).resolve().parent
# ``bench/langgraph.py`` shadows the package it measures: drop this folder from the path.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
if "--tree" in sys.argv:
    sys.path.insert(0, str(Path(sys.argv[sys.argv.index("--tree") + 1]).resolve()))

import histstore  # noqa: E402

APP = "bench-app"
COMMON = "history"  # in about a quarter of the messages
RARE = "quokka"  # in five messages of the many-store
FIXED = "c-000000"  # the 100-message conversation the scoped rows use
LONG = "long"
PER_CONVERSATION = 100
LONG_BATCH = 5000
LIST_LIMIT = 20
ROWS = (
    "load",
    "bytes",
    "search_conv",
    "search_rare",
    "listing",
    "count",
    "read",
    "stream",
    "export",
    "import",
    "purge",
)
# The streaming read: ``Store.stream(conversation)``, an async iterator of messages.
STREAM_METHOD = "stream"
SIZES = {"100k": 100_000, "1M": 1_000_000, "10M": 10_000_000}
_POOL = chat_messages(4096)


@dataclass
class Config:
    size: int = 100_000
    repeat: int = 5
    only: str = ""

    def wants(self, row: str) -> bool:
        return not self.only or row in self.only.split(",")

    @property
    def small(self) -> int:
        return max(PER_CONVERSATION, self.size // 100)


def message(c: int, i: int, conversations: int) -> dict[str, Any]:
    """Message ``i`` of conversation ``c`` (of ``conversations``): chat text, with the
    rare word at position 50 of five conversations spread over the store."""
    m = _POOL[(c * 31 + i) % len(_POOL)]
    if i == 50 and c % max(1, conversations // 5) == 0:
        return {"role": m["role"], "content": f"{m['content']} {RARE}"}
    return m


def cid(c: int) -> str:
    return f"c-{c:06d}"


def shape(total: int, long: bool) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """The store of ``total`` messages as (conversation, its messages) in write-sized
    pieces: conversations of 100, or one conversation in pieces of ``LONG_BATCH``."""
    if long:
        for start in range(0, total, LONG_BATCH):
            stop = min(total, start + LONG_BATCH)
            yield LONG, [_POOL[i % len(_POOL)] for i in range(start, stop)]
        return
    n = max(1, total // PER_CONVERSATION)
    for c in range(n):
        yield cid(c), [message(c, i, n) for i in range(PER_CONVERSATION)]


def meta(conversation: str) -> dict[str, Any]:
    c = int(conversation.split("-")[1])
    return {"app": APP, "group": c // 10}


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def timed_sync(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


async def timed(fn: Callable[[], Awaitable[Any]]) -> float:
    t0 = time.perf_counter()
    await fn()
    return time.perf_counter() - t0


async def median_of(repeat: int, fn: Callable[[], Awaitable[Any]]) -> float:
    await fn()
    return median([await timed(fn) for _ in range(repeat)])


# ---------------------------------------------------------------- histstore side


async def hs_load(target: str, total: int, long: bool) -> dict[str, float]:
    """Fill a histstore store; the seconds to load (close included) and of close alone."""
    t0 = time.perf_counter()
    store = await histstore.connect(target, migrate=True, durability="process")
    sem = asyncio.Semaphore(8)

    async def one(conversation: str, batch: list[dict[str, Any]]) -> None:
        async with sem:
            md = None if long else meta(conversation)
            await store.write(conversation, batch, metadata=md)

    if long:
        for conversation, batch in shape(total, long):
            await store.write(conversation, batch)
    else:
        pending: set[asyncio.Task[None]] = set()
        for conversation, batch in shape(total, long):
            pending.add(asyncio.create_task(one(conversation, batch)))
            if len(pending) >= 32:
                _, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        for task in pending:
            await task
    t1 = time.perf_counter()
    await store.close()
    t2 = time.perf_counter()
    return {"load_s": t2 - t0, "close_s": t2 - t1}


@asynccontextmanager
async def opened(target: str) -> AsyncIterator[histstore.Store]:
    store = await histstore.connect(target, migrate=True, durability="process")
    try:
        yield store
    finally:
        await store.close()


# ---------------------------------------------------------------- raw SQLite

_RAW_SQLITE = """
PRAGMA journal_mode=WAL;
PRAGMA synchronous=NORMAL;
CREATE TABLE messages (
    id INTEGER PRIMARY KEY,
    conversation_id TEXT NOT NULL,
    position INTEGER NOT NULL,
    data TEXT NOT NULL
);
CREATE UNIQUE INDEX messages_by_position ON messages (conversation_id, position);
CREATE VIEW message_text AS SELECT id, data ->> '$.content' AS text FROM messages;
CREATE VIRTUAL TABLE fts USING fts5(text, content='message_text', content_rowid='id');
"""


def raw_sqlite_load(path: str, rows: Iterator[tuple[str, int, str]]) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.executescript(_RAW_SQLITE)
        chunk: list[tuple[str, int, str]] = []
        for row in rows:
            chunk.append(row)
            if len(chunk) >= 10_000:
                _raw_sqlite_insert(conn, chunk)
                chunk = []
        _raw_sqlite_insert(conn, chunk)
        conn.execute("INSERT INTO fts (fts) VALUES ('rebuild')")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()


def _raw_sqlite_insert(conn: sqlite3.Connection, chunk: list[tuple[str, int, str]]) -> None:
    conn.execute("BEGIN")
    conn.executemany(
        "INSERT INTO messages (conversation_id, position, data) VALUES (?, ?, ?)", chunk
    )
    conn.execute("COMMIT")


def raw_rows(total: int, long: bool) -> Iterator[tuple[str, int, str]]:
    """The raw programs' rows of a shape: (conversation, position, JSON text)."""
    position: dict[str, int] = {}
    for conversation, batch in shape(total, long):
        start = position.get(conversation, 0)
        for k, m in enumerate(batch):
            yield conversation, start + k, encode(m)
        position[conversation] = start + len(batch)


class RawSqlite:
    """The raw SQLite program's queries."""

    def __init__(self, path: str) -> None:
        self.conn = sqlite3.connect(path, isolation_level=None)

    def search(self, word: str, conversation: str | None) -> list[Any]:
        if conversation is None:
            sql = "SELECT rowid FROM fts WHERE fts MATCH ? ORDER BY rank LIMIT 10"
            return self.conn.execute(sql, (word,)).fetchall()
        sql = (
            "SELECT m.conversation_id, m.position FROM fts JOIN messages m ON m.id = fts.rowid"
            " WHERE fts MATCH ? AND m.conversation_id = ? ORDER BY rank LIMIT 10"
        )
        return self.conn.execute(sql, (word, conversation)).fetchall()

    def count(self, conversation: str) -> int:
        sql = "SELECT count(*) FROM messages WHERE conversation_id = ?"
        return int(self.conn.execute(sql, (conversation,)).fetchone()[0])

    def read(self, conversation: str) -> list[Any]:
        sql = "SELECT data FROM messages WHERE conversation_id = ? ORDER BY position"
        return [json.loads(d) for (d,) in self.conn.execute(sql, (conversation,))]


# ---------------------------------------------------------------- raw PostgreSQL

_PG_TEXT = "to_tsvector('simple', data::json ->> 'content')"
_RAW_PG = """
CREATE TABLE messages (
    conversation_id text NOT NULL,
    position bigint NOT NULL,
    data text NOT NULL,
    PRIMARY KEY (conversation_id, position)
)
"""


async def raw_pg_load(url: str, rows: Iterator[tuple[str, int, str]]) -> None:
    import asyncpg

    conn = await asyncpg.connect(**asyncpg_kwargs(url))
    try:
        await conn.execute(_RAW_PG)
        chunk: list[tuple[str, int, str]] = []
        for row in rows:
            chunk.append(row)
            if len(chunk) >= 50_000:
                await conn.copy_records_to_table("messages", records=chunk)
                chunk = []
        await conn.copy_records_to_table("messages", records=chunk)
        await conn.execute(f"CREATE INDEX messages_text ON messages USING gin ({_PG_TEXT})")
        await conn.execute("ANALYZE messages")
    finally:
        await conn.close()


class RawPg:
    """The raw PostgreSQL program's queries (one connection)."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn

    async def search(self, word: str, conversation: str | None) -> list[Any]:
        q = "plainto_tsquery('simple', $1)"
        where = f"{_PG_TEXT} @@ {q}" + ("" if conversation is None else " AND conversation_id = $2")
        sql = (
            f"SELECT conversation_id, position FROM messages WHERE {where}"
            f" ORDER BY ts_rank({_PG_TEXT}, {q}) DESC LIMIT 10"
        )
        args = (word,) if conversation is None else (word, conversation)
        return list(await self.conn.fetch(sql, *args))

    async def count(self, conversation: str) -> int:
        sql = "SELECT count(*) FROM messages WHERE conversation_id = $1"
        return int(await self.conn.fetchval(sql, conversation))

    async def read(self, conversation: str) -> list[Any]:
        sql = "SELECT data FROM messages WHERE conversation_id = $1 ORDER BY position"
        return [json.loads(r[0]) for r in await self.conn.fetch(sql, conversation)]


async def pg_bytes(url: str) -> int:
    """Every relation's size with its indexes and TOAST, outside the system schemas."""
    import asyncpg

    conn = await asyncpg.connect(**asyncpg_kwargs(url))
    try:
        await conn.execute("VACUUM ANALYZE")
        sql = (
            "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c"
            " JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.relkind IN ('r', 'm')"
            " AND n.nspname NOT IN ('pg_catalog', 'information_schema')"
            " AND n.nspname NOT LIKE 'pg_toast%'"
        )
        return int(await conn.fetchval(sql))
    finally:
        await conn.close()


def sqlite_bytes(path: str) -> int:
    conn = sqlite3.connect(path)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()
    return os.path.getsize(path)


# ---------------------------------------------------------------- fresh-process cases

_RAW_DUMP = (
    "SELECT conversation_id, position, data FROM messages ORDER BY conversation_id, position"
)


async def child(case: str, side: str, target: str, file: str) -> dict[str, Any]:
    """One memory case in this (fresh) process: its seconds and peak RSS."""
    t0 = time.perf_counter()
    path = Path(file)
    extra: dict[str, Any] = {}
    if side == "histstore":
        async with opened(target) as store:
            if case == "read":
                extra["messages"] = len(await store.read(LONG))
            elif case == "stream":
                if not callable(getattr(store, STREAM_METHOD, None)):
                    return {"skipped": f"this histstore has no Store.{STREAM_METHOD}"}
                n = 0
                async for _ in getattr(store, STREAM_METHOD)(LONG):
                    n += 1
                extra["messages"] = n
            elif case == "export":
                from histstore._transfer.exporting import export_store

                # This process runs nothing else: a blocking open holds nobody up.
                with path.open("w", encoding="utf-8") as out:  # noqa: ASYNC230
                    await export_store(store, out)
            else:
                from histstore._transfer.importing import import_store

                with path.open("rb") as lines:  # noqa: ASYNC230
                    await import_store(store, lines)
    elif target.startswith("postgresql"):
        await _raw_pg_child(case, target, path, extra)
    else:
        _raw_sqlite_child(case, target, path, extra)
    return {"seconds": time.perf_counter() - t0, "rss_mb": peak_rss_mb(), **extra}


def _raw_sqlite_child(case: str, target: str, path: Path, extra: dict[str, Any]) -> None:
    if case == "import":
        with path.open(encoding="utf-8") as lines:
            raw_sqlite_load(target, (tuple(json.loads(line)) for line in lines))
        return
    raw = RawSqlite(target)
    if case == "read":
        extra["messages"] = len(raw.read(LONG))
        return
    with path.open("w", encoding="utf-8") as out:
        sql = _RAW_DUMP
        for row in raw.conn.execute(sql):
            out.write(json.dumps(row) + "\n")


async def _raw_pg_child(case: str, target: str, path: Path, extra: dict[str, Any]) -> None:
    import asyncpg

    if case == "import":
        with path.open(encoding="utf-8") as lines:
            await raw_pg_load(target, (tuple(json.loads(line)) for line in lines))
        return
    conn = await asyncpg.connect(**asyncpg_kwargs(target))
    try:
        if case == "read":
            extra["messages"] = len(await RawPg(conn).read(LONG))
            return
        sql = _RAW_DUMP
        with path.open("w", encoding="utf-8") as out:
            async with conn.transaction():
                async for row in conn.cursor(sql, prefetch=5000):
                    out.write(json.dumps(list(row)) + "\n")
    finally:
        await conn.close()


async def in_fresh_process(case: str, side: str, target: str, file: str = "") -> dict[str, Any]:
    """Run ``child`` in a new interpreter (so its peak RSS is the case's alone)."""
    argv = [sys.executable, __file__, "--child", case, side, target, file or "-"]
    if "--tree" in sys.argv:
        argv += ["--tree", sys.argv[sys.argv.index("--tree") + 1]]
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    out, err = await proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"{case} ({side}) failed:\n{err.decode()[-3000:]}")
    result: dict[str, Any] = json.loads(out.decode().splitlines()[-1])
    return result


# ---------------------------------------------------------------- one backend


@dataclass
class Targets:
    """Where each store of one backend lives (paths or URLs)."""

    small: str
    many: str
    long: str
    raw_many: str
    raw_long: str
    hs_import: str
    raw_import: str


async def run_backend(
    cfg: Config,
    t: Targets,
    raw_load: Callable[[str, Iterator[tuple[str, int, str]]], Awaitable[None]],
    raw_queries: Callable[[str], Awaitable[Any]],
    size_of: Callable[[str], Awaitable[int]],
    workdir: Path,
) -> dict[str, Any]:
    n, rep = cfg.size, cfg.repeat
    res: dict[str, Any] = {"size": n, "small": cfg.small, "rows": {}}
    rows = res["rows"]
    need_long = any(cfg.wants(r) for r in ("read", "stream"))
    need_raw = any(cfg.wants(r) for r in ROWS if r not in ("listing", "purge", "stream"))

    def log(msg: str) -> None:
        print(f"  [{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    # Building (and the load row).
    log(f"loading histstore many-store ({n:,} messages)")
    load = await hs_load(t.many, n, long=False)
    rows["load"] = {"histstore": load["load_s"], "close_s": load["close_s"], "raw": 0.0}
    if need_raw:
        log(f"loaded in {load['load_s']:.1f} s; raw")
        rows["load"]["raw"] = await timed(lambda: raw_load(t.raw_many, raw_rows(n, long=False)))
    await hs_load(t.small, cfg.small, long=False)
    if need_long:
        log("loading the long conversation")
        rows["load_long"] = {
            **(await hs_load(t.long, n, long=True)),
            "raw": await timed(lambda: raw_load(t.raw_long, raw_rows(n, long=True))),
        }
    if need_raw:
        rows["bytes"] = {
            "histstore": await size_of(t.many) / n,
            "raw": await size_of(t.raw_many) / n,
        }
    raw = await raw_queries(t.raw_many) if need_raw else None
    log("timing queries")
    async with opened(t.small) as small, opened(t.many) as big:

        async def both(fn: Callable[[histstore.Store], Awaitable[Any]]) -> dict[str, float]:
            return {
                "small": await median_of(rep, lambda: fn(small)),
                "big": await median_of(rep, lambda: fn(big)),
            }

        if cfg.wants("search_conv"):
            rows["search_conv"] = {
                **(await both(lambda s: s.search(COMMON, conversation=FIXED))),
                "raw": await median_of(rep, lambda: raw.search(COMMON, FIXED)),
            }
        if cfg.wants("search_rare"):
            found = len(await big.search(RARE))
            rows["search_rare"] = {
                "histstore": await median_of(rep, lambda: big.search(RARE)),
                "raw": await median_of(rep, lambda: raw.search(RARE, None)),
                "hits": found,
            }
        if cfg.wants("listing"):
            for label, md in (("listing", {"app": APP}), ("listing_selective", {"group": 0})):
                rows[label] = await both(
                    lambda s, md=md: s.conversations(
                        metadata=md, order="updated", descending=True, limit=LIST_LIMIT
                    )
                )
        if cfg.wants("count"):
            rows["count"] = {
                "histstore": await median_of(rep, lambda: big.count(FIXED)),
                "raw": await median_of(rep, lambda: raw.count(FIXED)),
            }
    if raw is not None:
        await raw.close()

    for case, source, raw_source in (("read", t.long, t.raw_long), ("stream", t.long, "")):
        if cfg.wants(case) and need_long:
            log(case)
            rows[case] = {"histstore": await in_fresh_process(case, "histstore", source)}
            if raw_source:
                rows[case]["raw"] = await in_fresh_process(case, "raw", raw_source)
    if cfg.wants("export") or cfg.wants("import"):
        log("export / import")
        hs_file, raw_file = str(workdir / "hs.jsonl"), str(workdir / "raw.jsonl")
        rows["export"] = {
            "histstore": await in_fresh_process("export", "histstore", t.many, hs_file),
            "raw": await in_fresh_process("export", "raw", t.raw_many, raw_file),
        }
        if cfg.wants("import"):
            rows["import"] = {
                "histstore": await in_fresh_process("import", "histstore", t.hs_import, hs_file),
                "raw": await in_fresh_process("import", "raw", t.raw_import, raw_file),
            }
    if cfg.wants("purge"):
        log("purge")
        rows["purge"] = {}
        for label, target in (("small", t.small), ("big", t.many)):
            async with opened(target) as store:
                rows["purge"][label] = await timed(lambda: store.purge(idle_for=timedelta(0)))
    log("done")
    return res


class _RawSqliteAsync:
    """``RawSqlite`` behind the awaitable interface the timing loop uses."""

    def __init__(self, path: str) -> None:
        self.raw = RawSqlite(path)

    async def search(self, word: str, conversation: str | None) -> list[Any]:
        return self.raw.search(word, conversation)

    async def count(self, conversation: str) -> int:
        return self.raw.count(conversation)

    async def close(self) -> None:
        self.raw.conn.close()


class _RawPgAsync(RawPg):
    async def close(self) -> None:
        await self.conn.close()


# ---------------------------------------------------------------- report


def _fmt_s(v: float) -> str:
    return f"{v * 1e3:,.2f} ms" if v < 1 else f"{v:,.1f} s"


_LABELS = {
    "read": "read() long whole",
    "stream": "stream long",
    "export": "export many",
    "import": "import many",
}


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b else ""


def backend_rows(r: dict[str, Any], cfg: Config) -> list[list[str]]:
    """One backend's rows: label, histstore, raw, ratio, growth, peak RSS."""
    out: list[list[str]] = []

    def add(label: str, hs: str, raw: str = "", ratio: str = "", growth: str = "") -> None:
        out.append([label, hs, raw, ratio, growth, ""])

    if "load" in r and r["load"]["raw"]:
        x = r["load"]
        add(f"load (close {x['close_s']:.1f} s)", _fmt_s(x["histstore"]), _fmt_s(x["raw"]))
        out[-1][3] = _ratio(x["histstore"], x["raw"])
    if "bytes" in r:
        x = r["bytes"]
        add("bytes per message", f"{x['histstore']:,.0f}", f"{x['raw']:,.0f}")
        out[-1][3] = _ratio(x["histstore"], x["raw"])
    for key, label in (
        ("search_conv", "search(common, conversation=)"),
        ("search_rare", "search(rare), 5 hits"),
        ("listing", "list(all match, updated)"),
        ("listing_selective", "list(10 match, updated)"),
        ("count", "count(100 messages)"),
        ("purge", "purge(idle_for=0) whole"),
    ):
        if key in r:
            x = r[key]
            hs = x.get("histstore", x.get("big", 0.0))
            raw = x.get("raw")
            growth = _ratio(x["big"], x["small"]) if "small" in x else ""
            add(label, _fmt_s(hs), "" if raw is None else _fmt_s(raw), "", growth)
            out[-1][3] = "" if raw is None else _ratio(hs, raw)
    for case, label in _LABELS.items():
        if case not in r:
            continue
        hs, raw = r[case]["histstore"], r[case].get("raw")
        if "skipped" in hs:
            add(label, "skipped (see below)")
            continue
        add(label, _fmt_s(hs["seconds"]))
        out[-1][5] = f"{hs['rss_mb']:,.0f}"
        if raw is not None:
            out[-1][2:4] = [_fmt_s(raw["seconds"]), _ratio(hs["seconds"], raw["seconds"])]
            out[-1][5] += f" / {raw['rss_mb']:,.0f} ({_ratio(hs['rss_mb'], raw['rss_mb'])})"
    return out


def report(results: dict[str, dict[str, Any]], cfg: Config) -> str:
    headers = ["row", "backend", "histstore", "raw", "ratio", "growth", "peak RSS MB hs / raw"]
    table = [
        [row[0], backend, *row[1:]]
        for backend, res in results.items()
        for row in backend_rows(res["rows"], cfg)
    ]
    notes = [
        f"{backend}: {_LABELS[case]} skipped: {res['rows'][case]['histstore']['skipped']}"
        for backend, res in results.items()
        for case in _LABELS
        if "skipped" in res["rows"].get(case, {}).get("histstore", {})
    ]
    return "\n".join(
        [
            f"{cfg.size:,} messages (many: {cfg.size // PER_CONVERSATION:,} conversations"
            f" of 100; long: one conversation); growth: {cfg.size:,} / {cfg.small:,} messages;"
            " ratio: histstore / raw",
            render_table(headers, table),
            *notes,
        ]
    )


# ---------------------------------------------------------------- main


def parse_size(text: str) -> int:
    if text in SIZES:
        return SIZES[text]
    scale = {"k": 1_000, "M": 1_000_000}.get(text[-1:], 1)
    return int(text.rstrip("kM")) * scale


def main() -> int:
    if "--child" in sys.argv:
        case, side, target, file = sys.argv[sys.argv.index("--child") + 1 :][:4]
        print(json.dumps(asyncio.run(child(case, side, target, file))))
        return 0
    parser = bench_parser(__doc__ or "")
    parser.add_argument(
        "--size", default="100k", help="messages per store: 100k, 1M, 10M or a number"
    )
    parser.add_argument("--repeat", type=int, default=None, help="calls per figure (5; quick: 2)")
    parser.add_argument(
        "--only", default="", help="only these rows (comma-separated): " + ",".join(ROWS)
    )
    parser.add_argument("--tree", default=None, help="import histstore from this checkout")
    args = parser.parse_args()
    unknown = [r for r in args.only.split(",") if r and r not in ROWS]
    if unknown:
        parser.error(f"unknown rows: {', '.join(unknown)}")
    cfg = Config(
        size=2000 if args.quick else parse_size(args.size),
        repeat=args.repeat or (2 if args.quick else 5),
        only=args.only,
    )
    print(f"histstore from {Path(histstore.__file__).parent.parent}", file=sys.stderr)

    async def sqlite() -> dict[str, Any]:
        with tempfile.TemporaryDirectory(dir=args.sqlite_dir) as d:
            p = Path(d)
            t = Targets(*(str(p / f"{name}.db") for name in Targets.__dataclass_fields__))

            async def load(path: str, rows: Iterator[tuple[str, int, str]]) -> None:
                await asyncio.to_thread(raw_sqlite_load, path, rows)

            async def size(path: str) -> int:
                return sqlite_bytes(path)

            async def queries(path: str) -> Any:
                return _RawSqliteAsync(path)

            return await run_backend(cfg, t, load, queries, size, p)

    async def postgres() -> dict[str, Any]:
        import asyncpg

        names = list(Targets.__dataclass_fields__)
        async with pg_databases(args.pg_url, names) as urls:
            t = Targets(**urls)

            async def queries(url: str) -> Any:
                return _RawPgAsync(await asyncpg.connect(**asyncpg_kwargs(url)))

            with tempfile.TemporaryDirectory(dir=args.sqlite_dir) as d:
                return await run_backend(cfg, t, raw_pg_load, queries, pg_bytes, Path(d))

    return run_and_report(args, cfg, sqlite, postgres, report)


if __name__ == "__main__":
    sys.exit(main())
