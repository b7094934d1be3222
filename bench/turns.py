"""Benchmark: histstore against the raw driver doing the same minimal SQL.

Run from a checkout::

    python bench/turns.py [--backend sqlite|postgres|all] [--pg-url URL] [--quick]
                          [--repeat N] [--sqlite-dir DIR] [--json FILE]
                          [--pgbouncer URL [--pooled-only]]

It measures, in one run and on each backend:

(a) An agent turn: read the newest 20 messages of a conversation, then write 2 messages
    (a user message and the reply, about 200 bytes of JSON each), over 100
    conversations x 50 turns, first sequentially and then with 16 concurrent tasks.
    The figure is wall time / turns, the median over ``--repeat`` runs; histstore and the
    raw baseline alternate which runs first. Each turn's latency is kept too, for p50
    and p99. Targets: sequential, histstore costs at most 1.1x raw; with 16 tasks its
    throughput is at least 0.9x raw's and its p99 at most 2x raw's p99.
(b) ``read(c, limit=20)`` on conversations of 100, 10,000 and 100,000 messages (filled
    with multi-row inserts on the same schema). The figure is the median latency of many
    reads. Target: the 100k read costs at most 1.3x the 100-message one.

The raw baseline is the physical limit of each driver for the same work, on a separate
database whose schema ``histstore.connect(url, migrate=True)`` created:

* read: ``SELECT data, position, created_at FROM histstore_messages WHERE
  conversation_id = $1 ORDER BY position DESC LIMIT 20`` (rows reversed, not decoded;
  no explicit transaction).
* SQLite write: ``BEGIN IMMEDIATE``, the conversation upsert that returns the new length
  (``INSERT ... ON CONFLICT (id) DO UPDATE SET length = length + 2 ... RETURNING
  length``), an executemany of the 2 message rows, one statement listing them for the
  full-text index (as histstore's writes list theirs), the insert of the batch's idempotency
  record (a uuid key and a SHA-256 of the JSON texts), ``COMMIT``; aiosqlite with
  ``isolation_level=None``, WAL, ``synchronous=FULL`` and a 30 s busy timeout, as
  histstore's defaults, on ONE connection shared by every task (SQLite has one writer
  per file; write transactions take turns on an ``asyncio.Lock``).
* Postgres write: ONE statement (one round trip, its own transaction): data-modifying
  CTEs upsert the conversation's length, record the batch and insert the messages from
  arrays with ``unnest``; asyncpg, a pool of as many connections as tasks (1 or 16), one
  ``acquire`` per turn, with the per-release reset query turned off.
* Messages are encoded with ``json.dumps``; ``search_text`` is NULL, as histstore stores
  it for a string content (the full-text index reads the content), and SQLite's raw
  write lists its rows for the index, so the raw side keeps the full-text index too.

(c) With ``--pgbouncer URL`` (a PgBouncer in transaction mode in front of ``--pg-url``'s
    server, serving every database: ``* = host=... port=...``): the agent turn of (a)
    through it, with ``connect(url, pooler="transaction")``, against histstore on
    Postgres directly, side by side in one run (each on a fresh database, alternating
    which runs first). Target: pooled costs at most 1.3x direct.

histstore is used as a user would: ``histstore.connect(url)`` with default options, one
store shared by all tasks, ``store.read(c, limit=20)`` and ``store.write(c, [dict, dict])``.
"""

from __future__ import annotations

import asyncio
import json
import platform
import re
import shutil
import sqlite3
import sys
import tempfile
import time
import uuid
from collections import deque
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Protocol

from _common import (
    asyncpg_kwargs,
    batch_digest,
    bench_parser,
    chat_messages,
    encode,
    median,
    percentile,
    pg_databases,
    pg_server,
    render_table,
    run_backends,
    sqlite_timestamp,
)
from sqlalchemy import make_url

import histstore  # importable once _common has put the checkout on sys.path

READ_LIMIT = 20
TURN_TARGET = 1.1  # sequential: wall time per turn, histstore / raw
THROUGHPUT_TARGET = 0.9  # 16 tasks: throughput, histstore / raw
P99_TARGET = 2.0  # 16 tasks: p99 latency, histstore / raw
READ_TARGET = 1.3

READ_SQL = (
    "SELECT data, position, created_at FROM histstore_messages"
    " WHERE conversation_id = $1 ORDER BY position DESC LIMIT $2"
)
UPSERT_SQL = (
    "INSERT INTO histstore_conversations (id, owner, length, created_at, updated_at,"
    " listed_changes) VALUES ($1, NULL, $2, $3, $3, 1) ON CONFLICT (id) DO UPDATE"
    " SET length = histstore_conversations.length + $2, updated_at = $3,"
    " listed_changes = histstore_conversations.listed_changes + 1 RETURNING length"
)
# SQLite: the messages a write added, listed for the full-text index (as histstore's
# writes do since a2f6c8e4d0b3; no trigger lists them).
LIST_SQL = (
    "INSERT OR IGNORE INTO histstore_messages_fts_queued (message_rowid) SELECT rowid"
    " FROM histstore_messages WHERE conversation_id = ?1 AND position >= ?2"
)
INSERT_MESSAGE_SQL = (
    "INSERT INTO histstore_messages"
    " (conversation_id, position, role, data, token_count, created_at, search_text, entry_id)"
    " VALUES ($1, $2, $3, $4, NULL, $5, $6, $2 + 1)"
)
INSERT_WRITE_SQL = (
    'INSERT INTO histstore_writes (conversation_id, "key", position, count, digest, created_at)'
    " VALUES ($1, $2, $3, $4, $5, $6)"
)
APPEND_ONE_SQL = (
    "WITH grown AS (INSERT INTO histstore_conversations (id, owner, length, created_at,"
    " updated_at) VALUES ($1, NULL, $2, $3, $3) ON CONFLICT (id) DO UPDATE SET length ="
    " histstore_conversations.length + $2, updated_at = $3 RETURNING length),"
    " recorded AS (INSERT INTO histstore_writes (conversation_id, key, position, count,"
    " digest, created_at) SELECT $1, $4, grown.length - $2, $2, $5, $3 FROM grown"
    " RETURNING position)"
    " INSERT INTO histstore_messages (conversation_id, position, role, data, created_at,"
    " search_text, entry_id) SELECT $1, recorded.position + t.ord - 1, t.role, t.data, $3,"
    " t.search, recorded.position + t.ord"
    " FROM recorded, unnest($6::text[], $7::text[], $8::text[])"
    " WITH ORDINALITY AS t(role, data, search, ord)"
)
INSERT_CONVERSATION_SQL = (
    "INSERT INTO histstore_conversations (id, owner, length, created_at, updated_at,"
    " listed_changes) VALUES ($1, NULL, $2, $3, $3, 1)"
)


def qmark(sql: str) -> str:
    """The Postgres-style ``$n`` placeholders as SQLite's numbered ``?n``."""
    return re.sub(r"\$(\d+)", r"?\1", sql)


@dataclass(frozen=True)
class Config:
    conversations: int
    turns: int
    tasks: int
    repeats: int
    read_sizes: tuple[int, ...]
    reads: int  # timed reads per size and side


FULL = Config(
    conversations=100, turns=50, tasks=16, repeats=3, read_sizes=(100, 10_000, 100_000), reads=2000
)
QUICK = Config(
    conversations=20, turns=5, tasks=16, repeats=1, read_sizes=(100, 1000, 5000), reads=50
)


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------- the two sides


class Side(Protocol):
    name: str

    async def prepare(self, workers: int) -> None: ...
    async def turn(self, worker: int, cid: str, batch: list[dict[str, Any]]) -> None: ...
    async def read(self, worker: int, cid: str) -> Sequence[Any]: ...
    async def length(self, cid: str) -> int: ...
    async def close(self) -> None: ...


class HistSide:
    """histstore, one store shared by every task."""

    name = "histstore"

    def __init__(self, store: histstore.Store) -> None:
        self.store = store
        self.new_connections = 0
        from sqlalchemy import event

        def on_connect(*_: object) -> None:
            self.new_connections += 1

        event.listen(store.engine.sync_engine, "connect", on_connect)

    async def prepare(self, workers: int) -> None:
        return None

    async def turn(self, worker: int, cid: str, batch: list[dict[str, Any]]) -> None:
        await self.store.read(cid, limit=READ_LIMIT)
        await self.store.write(cid, batch)

    async def read(self, worker: int, cid: str) -> Sequence[Any]:
        return await self.store.read(cid, limit=READ_LIMIT)

    async def length(self, cid: str) -> int:
        return await self.store.count(cid)

    async def close(self) -> None:
        await self.store.close()


class RawSqlite:
    """aiosqlite on the same schema; one connection shared by every task."""

    name = "raw"
    read_sql = qmark(READ_SQL)
    upsert_sql = qmark(UPSERT_SQL)
    message_sql = qmark(INSERT_MESSAGE_SQL)
    write_sql = qmark(INSERT_WRITE_SQL)

    def __init__(self, path: str) -> None:
        self.path = path
        self.conn: Any = None
        self.lock = asyncio.Lock()

    async def prepare(self, workers: int) -> None:
        import aiosqlite

        if self.conn is None:
            conn = await aiosqlite.connect(self.path, isolation_level=None)
            await conn.execute("PRAGMA busy_timeout = 30000")
            await conn.execute("PRAGMA synchronous = FULL")
            await conn.execute("PRAGMA journal_mode = WAL")
            self.conn = conn

    async def read(self, worker: int, cid: str) -> Sequence[Any]:
        rows = await self.conn.execute_fetchall(self.read_sql, (cid, READ_LIMIT))
        return list(reversed(list(rows)))

    async def turn(self, worker: int, cid: str, batch: list[dict[str, Any]]) -> None:
        conn = self.conn
        await conn.execute_fetchall(self.read_sql, (cid, READ_LIMIT))
        texts = [encode(m) for m in batch]
        n = len(texts)
        now = sqlite_timestamp(datetime.now(timezone.utc))
        async with self.lock:  # one write transaction at a time on the one connection
            await conn.execute("BEGIN IMMEDIATE")
            try:
                length = (await conn.execute_fetchall(self.upsert_sql, (cid, n, now)))[0][0]
                first = length - n
                rows = [
                    (cid, first + i, m["role"], t, now, None)
                    for i, (m, t) in enumerate(zip(batch, texts, strict=True))
                ]
                await conn.executemany(self.message_sql, rows)
                await conn.execute(LIST_SQL, (cid, first))
                await conn.execute(
                    self.write_sql, (cid, uuid.uuid4().hex, first, n, batch_digest(texts), now)
                )
                await conn.execute("COMMIT")
            except BaseException:
                await conn.execute("ROLLBACK")
                raise

    async def length(self, cid: str) -> int:
        await self.prepare(1)
        rows = await self.conn.execute_fetchall(
            "SELECT length FROM histstore_conversations WHERE id = ?", (cid,)
        )
        return int(next(iter(rows))[0]) if rows else 0

    async def close(self) -> None:
        if self.conn is not None:
            await self.conn.close()
            self.conn = None


def append_args(cid: str, batch: list[dict[str, Any]]) -> list[Any]:
    """The arguments of ``APPEND_ONE_SQL`` for one batch, encoded as the raw baseline does."""
    texts = [encode(m) for m in batch]
    return [
        cid,
        len(texts),
        datetime.now(timezone.utc),
        uuid.uuid4().hex,
        batch_digest(texts),
        [m["role"] for m in batch],
        texts,
        [None] * len(texts),  # the text is the string content, as histstore stores it
    ]


async def _no_reset(conn: Any) -> None:
    return None


class RawPostgres:
    """asyncpg on the same schema; a pool with one connection per task."""

    name = "raw"

    def __init__(self, url: str) -> None:
        self.url = url
        self.pool: Any = None
        self.size = 0

    async def prepare(self, workers: int) -> None:
        import asyncpg

        if self.pool is not None and self.size == workers:
            return
        if self.pool is not None:
            await self.pool.close()
        self.pool = await asyncpg.create_pool(
            min_size=workers,
            max_size=workers,
            max_queries=10**9,
            reset=_no_reset,
            **asyncpg_kwargs(self.url),
        )
        self.size = workers

    async def read(self, worker: int, cid: str) -> Sequence[Any]:
        async with self.pool.acquire() as conn:
            rows: list[Any] = await conn.fetch(READ_SQL, cid, READ_LIMIT)
        return rows[::-1]

    async def turn(self, worker: int, cid: str, batch: list[dict[str, Any]]) -> None:
        async with self.pool.acquire() as conn:
            await conn.fetch(READ_SQL, cid, READ_LIMIT)
            await conn.execute(APPEND_ONE_SQL, *append_args(cid, batch))

    async def length(self, cid: str) -> int:
        await self.prepare(max(self.size, 1))
        async with self.pool.acquire() as conn:
            value = await conn.fetchval(
                "SELECT length FROM histstore_conversations WHERE id = $1", cid
            )
        return int(value or 0)

    async def close(self) -> None:
        if self.pool is not None:
            await self.pool.close()
            self.pool = None


class RawPooledPostgres(RawPostgres):
    """The raw baseline through a transaction-mode pooler, at its physical limit: one
    round trip per statement. Each task has its own connection, on which the statements
    are prepared once without a name; asyncpg, with its statement cache off, sends each
    one's Parse again with its Bind and Execute, so nothing is left on (or expected
    from) a server session."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.conns: list[Any] = []
        self.statements: list[dict[str, Any]] = []

    async def prepare(self, workers: int) -> None:
        import asyncpg

        if len(self.conns) == workers:
            return
        await self.close()
        kwargs = {**asyncpg_kwargs(self.url), "statement_cache_size": 0}
        # the server's spelling of the encoding: PgBouncer then sends no SET before
        # each transaction (as histstore's pooler="transaction" does)
        kwargs["server_settings"] = {
            **kwargs.get("server_settings", {}),
            "client_encoding": "UTF8",
        }
        self.conns = [await asyncpg.connect(**kwargs) for _ in range(workers)]
        self.statements = [{} for _ in range(workers)]

    async def _unnamed(self, worker: int, sql: str) -> Any:
        cached = self.statements[worker]
        if sql not in cached:
            cached[sql] = await self.conns[worker].prepare(sql, name="")
        return cached[sql]

    async def read(self, worker: int, cid: str) -> Sequence[Any]:
        rows: list[Any] = await (await self._unnamed(worker, READ_SQL)).fetch(cid, READ_LIMIT)
        return rows[::-1]

    async def turn(self, worker: int, cid: str, batch: list[dict[str, Any]]) -> None:
        await (await self._unnamed(worker, READ_SQL)).fetch(cid, READ_LIMIT)
        append = await self._unnamed(worker, APPEND_ONE_SQL)
        await append.fetch(*append_args(cid, batch))

    async def length(self, cid: str) -> int:
        await self.prepare(max(len(self.conns), 1))
        value = await self.conns[0].fetchval(
            "SELECT length FROM histstore_conversations WHERE id = $1", cid
        )
        return int(value or 0)

    async def close(self) -> None:
        for conn in self.conns:
            await conn.close()
        self.conns, self.statements = [], []


# ---------------------------------------------------------------------- (a) turns


async def run_turns(
    side: Side,
    *,
    conversations: int,
    turns: int,
    workers: int,
    messages: list[dict[str, Any]],
    latencies: list[float] | None = None,
) -> tuple[float, float, list[str]]:
    """Run ``turns`` turns on each of ``conversations`` new conversations.

    Returns the wall time, this process's CPU time (all its threads) and the ids; each
    turn's latency (seconds) is appended to ``latencies`` when given.

    A conversation is handled by one task at a time: tasks take the next conversation
    from a shared queue, run one turn, and put it back at the end while turns remain.
    """
    cids = [f"bench-{uuid.uuid4().hex}" for _ in range(conversations)]
    queue: deque[tuple[str, int]] = deque((cid, 0) for cid in cids)
    pool_size = len(messages) // 2
    counter = 0

    async def worker(w: int) -> None:
        nonlocal counter
        while queue:
            cid, done = queue.popleft()
            k = counter % pool_size
            counter += 1
            t0 = time.perf_counter()
            await side.turn(w, cid, messages[2 * k : 2 * k + 2])
            if latencies is not None:
                latencies.append(time.perf_counter() - t0)
            if done + 1 < turns:
                queue.append((cid, done + 1))

    await side.prepare(workers)
    start, cpu = time.perf_counter(), time.process_time()
    await asyncio.gather(*(worker(w) for w in range(workers)))
    return time.perf_counter() - start, time.process_time() - cpu, cids


@dataclass
class TurnResult:
    scenario: str
    workers: int
    turns: int
    histstore_us: list[float]
    raw_us: list[float]
    histstore_median_us: float
    raw_median_us: float
    ratio: float
    target: float
    passed: bool
    histstore_cpu_us: list[float]
    raw_cpu_us: list[float]
    cpu_ratio: float
    histstore_new_connections: int
    histstore_p50_us: float
    histstore_p99_us: float
    raw_p50_us: float
    raw_p99_us: float
    p99_ratio: float
    targets: str


async def bench_turns(
    hist: HistSide, raw: Side, cfg: Config, workers: int, label: str, messages: list[dict[str, Any]]
) -> TurnResult:
    sides: list[Side] = [hist, raw]
    warm = max(workers, min(cfg.conversations, 16))
    for side in sides:
        await run_turns(side, conversations=warm, turns=5, workers=workers, messages=messages)
    times: dict[str, list[float]] = {"histstore": [], "raw": []}
    cpu_times: dict[str, list[float]] = {"histstore": [], "raw": []}
    latencies: dict[str, list[float]] = {"histstore": [], "raw": []}
    total = cfg.conversations * cfg.turns
    connects_before = hist.new_connections
    for rep in range(cfg.repeats):
        for side in sides if rep % 2 == 0 else sides[::-1]:
            elapsed, cpu, cids = await run_turns(
                side,
                conversations=cfg.conversations,
                turns=cfg.turns,
                workers=workers,
                messages=messages,
                latencies=latencies[side.name],
            )
            got = await side.length(cids[0])
            if got != 2 * cfg.turns:
                raise RuntimeError(f"{side.name}: a conversation holds {got} messages")
            us = elapsed / total * 1e6
            times[side.name].append(us)
            cpu_times[side.name].append(cpu / total * 1e6)
            log(
                f"  {label} run {rep + 1}/{cfg.repeats}: {side.name} {us:,.0f} us/turn"
                f" (cpu {cpu_times[side.name][-1]:,.0f} us/turn)"
            )
    h, r = median(times["histstore"]), median(times["raw"])
    ratio = h / r
    hp50, hp99 = percentile(latencies["histstore"], 50), percentile(latencies["histstore"], 99)
    rp50, rp99 = percentile(latencies["raw"], 50), percentile(latencies["raw"], 99)
    if workers == 1:
        passed, targets = ratio <= TURN_TARGET, f"time <= {TURN_TARGET}x"
    else:
        passed = 1 / ratio >= THROUGHPUT_TARGET and hp99 / rp99 <= P99_TARGET
        targets = f"thr >= {THROUGHPUT_TARGET}x, p99 <= {P99_TARGET}x"
    return TurnResult(
        scenario=label,
        workers=workers,
        turns=total,
        histstore_us=times["histstore"],
        raw_us=times["raw"],
        histstore_median_us=h,
        raw_median_us=r,
        ratio=ratio,
        target=TURN_TARGET,
        passed=passed,
        histstore_cpu_us=cpu_times["histstore"],
        raw_cpu_us=cpu_times["raw"],
        cpu_ratio=median(cpu_times["histstore"]) / median(cpu_times["raw"]),
        histstore_new_connections=hist.new_connections - connects_before,
        histstore_p50_us=hp50 * 1e6,
        histstore_p99_us=hp99 * 1e6,
        raw_p50_us=rp50 * 1e6,
        raw_p99_us=rp99 * 1e6,
        p99_ratio=hp99 / rp99,
        targets=targets,
    )


# ---------------------------------------------------------------------- (b) reads


async def fill_sqlite(path: str, cid: str, n: int, messages: list[dict[str, Any]]) -> None:
    import aiosqlite

    texts = [(m["role"], encode(m), None) for m in messages]
    now = sqlite_timestamp(datetime.now(timezone.utc))
    async with aiosqlite.connect(path, isolation_level=None) as conn:
        await conn.execute("BEGIN IMMEDIATE")
        await conn.execute(qmark(INSERT_CONVERSATION_SQL), (cid, n, now))
        sql = qmark(INSERT_MESSAGE_SQL)
        chunk = 20_000
        for lo in range(0, n, chunk):
            rows = [
                (cid, p, *texts[p % len(texts)][:2], now, texts[p % len(texts)][2])
                for p in range(lo, min(n, lo + chunk))
            ]
            await conn.executemany(sql, rows)
        await conn.execute("COMMIT")
        await conn.execute("ANALYZE")


async def fill_postgres(url: str, cid: str, n: int, messages: list[dict[str, Any]]) -> None:
    import asyncpg

    texts = [(m["role"], encode(m), None) for m in messages]
    now = datetime.now(timezone.utc)
    conn = await asyncpg.connect(**asyncpg_kwargs(url))
    try:
        async with conn.transaction():
            await conn.execute(INSERT_CONVERSATION_SQL, cid, n, now)
            await conn.copy_records_to_table(
                "histstore_messages",
                columns=[
                    "conversation_id",
                    "position",
                    "role",
                    "data",
                    "created_at",
                    "search_text",
                    "entry_id",
                ],
                records=(
                    (cid, p, *texts[p % len(texts)][:2], now, texts[p % len(texts)][2], p + 1)
                    for p in range(n)
                ),
            )
        await conn.execute("ANALYZE histstore_messages")
    finally:
        await conn.close()


@dataclass
class ReadResult:
    sizes: list[int]
    histstore_us: list[float]
    raw_us: list[float]
    histstore_ratio: float
    raw_ratio: float
    target: float
    passed: bool


async def bench_reads(
    kind: str, url: str, cfg: Config, messages: list[dict[str, Any]]
) -> ReadResult:
    cids: dict[int, str] = {}
    for n in cfg.read_sizes:
        cid = f"bench-read-{n}-{uuid.uuid4().hex}"
        if kind == "sqlite":
            await fill_sqlite(url, cid, n, messages)
        else:
            await fill_postgres(url, cid, n, messages)
        cids[n] = cid
        log(f"  filled a conversation of {n:,} messages")
    hist = HistSide(await histstore.connect(url))
    raw: Side = RawSqlite(url) if kind == "sqlite" else RawPostgres(url)
    await raw.prepare(1)
    sides: list[Side] = [hist, raw]
    lat: dict[str, list[float]] = {"histstore": [], "raw": []}
    try:
        for side in sides:  # warm up connections, statement caches and the page cache
            for cid in cids.values():
                for _ in range(100):
                    await side.read(0, cid)
        for n, cid in cids.items():
            for side in sides:
                got = await side.read(0, cid)
                if len(got) != min(n, READ_LIMIT):
                    raise RuntimeError(f"{side.name}: read {len(got)} messages of {n}")
            samples: dict[str, list[float]] = {"histstore": [], "raw": []}
            for i in range(cfg.reads):
                for side in sides if i % 2 == 0 else sides[::-1]:
                    t0 = time.perf_counter()
                    await side.read(0, cid)
                    samples[side.name].append(time.perf_counter() - t0)
            for name, values in samples.items():
                lat[name].append(median(values) * 1e6)
            log(
                f"  read(limit=20) on {n:,} messages: histstore {lat['histstore'][-1]:,.0f} us,"
                f" raw {lat['raw'][-1]:,.0f} us"
            )
    finally:
        await hist.close()
        await raw.close()
    h_ratio = lat["histstore"][-1] / lat["histstore"][0]
    return ReadResult(
        sizes=list(cfg.read_sizes),
        histstore_us=lat["histstore"],
        raw_us=lat["raw"],
        histstore_ratio=h_ratio,
        raw_ratio=lat["raw"][-1] / lat["raw"][0],
        target=READ_TARGET,
        passed=h_ratio <= READ_TARGET,
    )


# ---------------------------------------------------------------------- per backend


async def bench_backend(kind: str, urls: dict[str, str], cfg: Config) -> dict[str, Any]:
    messages = chat_messages(1000)
    for name in ("raw", "reads"):
        await (await histstore.connect(urls[name], migrate=True)).close()
    hist = HistSide(await histstore.connect(urls["hs"], migrate=True))
    raw: Side = RawSqlite(urls["raw"]) if kind == "sqlite" else RawPostgres(urls["raw"])
    turns: list[TurnResult] = []
    try:
        for workers, label in ((1, "sequential"), (cfg.tasks, f"{cfg.tasks} tasks")):
            log(f"{kind}: turns, {label}")
            turns.append(await bench_turns(hist, raw, cfg, workers, label, messages))
    finally:
        await hist.close()
        await raw.close()
    log(f"{kind}: read scaling")
    reads = await bench_reads(kind, urls["reads"], cfg, messages)
    return {"turns": [asdict(t) for t in turns], "reads": asdict(reads)}


async def run_sqlite(cfg: Config, directory: str | None) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="histstore-bench-", dir=directory))
    try:
        urls = {name: str(tmp / f"{name}.db") for name in ("hs", "raw", "reads")}
        result = await bench_backend("sqlite", urls, cfg)
        result["server"] = f"SQLite {sqlite3.sqlite_version}, files in {tmp}"
        return result
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


async def run_postgres(cfg: Config, admin_url: str) -> dict[str, Any]:

    async with pg_databases(admin_url, ["hs", "raw", "reads"]) as urls:
        result = await bench_backend("postgres", urls, cfg)
        result["server"] = await pg_server(urls["hs"])
        return result


# ---------------------------------------------------------------------- (c) through PgBouncer

POOLED_TARGET = 1.3


POOLED_SIDES = ("direct", "pooled", "raw direct", "raw pooled")


async def bench_pooled(cfg: Config, admin_url: str, bouncer_url: str) -> dict[str, Any]:
    """The agent turn on histstore through PgBouncer (``pooler="transaction"``) against
    histstore on the same server directly, and the raw baseline both ways (what the
    pooler's extra hop costs the minimal program)."""
    messages = chat_messages(1000)
    bouncer = make_url(bouncer_url)

    def through(url: str) -> str:
        moved = make_url(url).set(host=bouncer.host, port=bouncer.port)
        if bouncer.username:
            moved = moved.set(username=bouncer.username, password=bouncer.password)
        return moved.render_as_string(hide_password=False)

    async with pg_databases(admin_url, ["direct", "pooled", "rawdirect", "rawpooled"]) as urls:
        for url in urls.values():
            await (await histstore.connect(url, migrate=True)).close()
        sides: dict[str, Side] = {
            "direct": HistSide(await histstore.connect(urls["direct"])),
            "pooled": HistSide(
                await histstore.connect(through(urls["pooled"]), pooler="transaction")
            ),
            "raw direct": RawPostgres(urls["rawdirect"]),
            "raw pooled": RawPooledPostgres(through(urls["rawpooled"])),
        }
        rows: list[dict[str, Any]] = []
        try:
            for workers, label in ((1, "sequential"), (cfg.tasks, f"{cfg.tasks} tasks")):
                log(f"postgres through pgbouncer: turns, {label}")
                warm = max(workers, min(cfg.conversations, 16))
                for side in sides.values():
                    await side.prepare(workers)
                    await run_turns(
                        side, conversations=warm, turns=5, workers=workers, messages=messages
                    )
                times: dict[str, list[float]] = {name: [] for name in sides}
                latencies: dict[str, list[float]] = {name: [] for name in sides}
                order = list(sides)
                for rep in range(cfg.repeats):
                    for name in order if rep % 2 == 0 else order[::-1]:
                        elapsed, _cpu, cids = await run_turns(
                            sides[name],
                            conversations=cfg.conversations,
                            turns=cfg.turns,
                            workers=workers,
                            messages=messages,
                            latencies=latencies[name],
                        )
                        got = await sides[name].length(cids[0])
                        if got != 2 * cfg.turns:
                            raise RuntimeError(f"{name}: a conversation holds {got} messages")
                        times[name].append(elapsed / (cfg.conversations * cfg.turns) * 1e6)
                        log(f"  {label} run {rep + 1}: {name} {times[name][-1]:,.0f} us/turn")
                med = {name: median(values) for name, values in times.items()}
                p99 = {name: percentile(values, 99) * 1e6 for name, values in latencies.items()}
                rows.append(
                    {
                        "scenario": label,
                        "direct_us": med["direct"],
                        "pooled_us": med["pooled"],
                        "ratio": med["pooled"] / med["direct"],
                        "direct_p99_us": p99["direct"],
                        "pooled_p99_us": p99["pooled"],
                        "raw_direct_us": med["raw direct"],
                        "raw_pooled_us": med["raw pooled"],
                        "raw_ratio": med["raw pooled"] / med["raw direct"],
                        "raw_direct_p99_us": p99["raw direct"],
                        "raw_pooled_p99_us": p99["raw pooled"],
                        "target": POOLED_TARGET,
                        "passed": med["pooled"] / med["direct"] <= POOLED_TARGET,
                    }
                )
        finally:
            for side in sides.values():
                await side.close()
    return {"turns": rows, "server": await pg_server(admin_url)}


def report_pooled(result: dict[str, Any]) -> str:
    rows = [
        [
            r["scenario"],
            f"{r['pooled_us']:,.0f}",
            f"{r['direct_us']:,.0f}",
            f"{r['ratio']:.2f}x",
            f"{r['pooled_p99_us']:,.0f} / {r['direct_p99_us']:,.0f}",
            f"{r['raw_pooled_us']:,.0f} / {r['raw_direct_us']:,.0f}",
            f"{r['raw_ratio']:.2f}x",
            f"<= {r['target']}x",
            "PASS" if r["passed"] else "FAIL",
        ]
        for r in result["turns"]
    ]
    headers = [
        "scenario",
        "pooled us",
        "direct us",
        "ratio",
        "p99 us pooled / direct",
        "raw us pooled / direct",
        "raw ratio",
    ]
    return (
        "Agent turn through PgBouncer (transaction mode, pooler='transaction') vs Postgres"
        " directly: wall time per turn, median of runs. The raw columns: the minimal asyncpg"
        " program (one round trip per statement) the same two ways, i.e. what the pooler's"
        " hop costs by itself\n" + render_table([*headers, "target", "result"], rows)
    )


# ---------------------------------------------------------------------- report


def report(results: dict[str, dict[str, Any]]) -> str:
    out: list[str] = []
    rows = []
    for kind, res in results.items():
        for t in res["turns"]:
            rows.append(
                [
                    kind,
                    t["scenario"],
                    f"{t['histstore_median_us']:,.0f}",
                    f"{t['raw_median_us']:,.0f}",
                    f"{t['ratio']:.2f}x",
                    f"{t['histstore_p99_us']:,.0f} / {t['raw_p99_us']:,.0f}",
                    f"{t['p99_ratio']:.2f}x",
                    t["targets"],
                    "PASS" if t["passed"] else "FAIL",
                    f"{t['cpu_ratio']:.2f}x",
                ]
            )
    out.append("Agent turn (read newest 20 + write 2): wall time per turn, median of runs;")
    out.append("p99 of every turn's latency (histstore / raw); CPU is this process's, all threads")
    headers = ["backend", "scenario", "histstore us", "raw us", "ratio", "p99 us hs / raw"]
    headers += ["p99 ratio", "targets", "result", "cpu ratio"]
    out.append(render_table(headers, rows))
    rows = []
    for kind, res in results.items():
        r = res["reads"]
        for n, h, w in zip(r["sizes"], r["histstore_us"], r["raw_us"], strict=True):
            rows.append(
                [kind, f"{n:,} messages", f"{h:,.0f}", f"{w:,.0f}", f"{h / w:.2f}x", "", ""]
            )
        big, small = r["sizes"][-1], r["sizes"][0]
        rows.append(
            [
                kind,
                f"ratio {big:,}/{small:,}",
                f"{r['histstore_ratio']:.2f}x",
                f"{r['raw_ratio']:.2f}x",
                "",
                f"<= {r['target']}x",
                "PASS" if r["passed"] else "FAIL",
            ]
        )
    out.append("")
    out.append("read(limit=20) latency, median us (raw for reference)")
    out.append(
        render_table(
            ["backend", "conversation", "histstore us", "raw us", "hs/raw", "target", "result"],
            rows,
        )
    )
    out.append("")
    for kind, res in results.items():
        out.append(f"{kind}: {res['server']}")
        for t in res["turns"]:
            if t["histstore_new_connections"]:
                out.append(
                    f"  note: histstore's pool opened {t['histstore_new_connections']} new"
                    f" connections during the timed {t['scenario']} runs"
                )
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    parser = bench_parser(__doc__ or "")
    parser.add_argument("--repeat", type=int, default=None, help="timed runs per scenario")
    parser.add_argument(
        "--pgbouncer",
        metavar="URL",
        default=None,
        help="also run the agent turn through this PgBouncer (transaction mode, in front of"
        " --pg-url's server) with pooler='transaction', beside Postgres directly",
    )
    parser.add_argument(
        "--pooled-only",
        action="store_true",
        help="with --pgbouncer: only the pooled comparison, not (a) and (b)",
    )
    args = parser.parse_args(argv)
    cfg = QUICK if args.quick else FULL
    if args.repeat is not None:
        cfg = Config(**{**asdict(cfg), "repeats": max(1, args.repeat)})
    kinds = ["sqlite", "postgres"] if args.backend == "all" else [args.backend]

    results: dict[str, dict[str, Any]] = {}
    if not (args.pooled_only and args.pgbouncer):
        results = run_backends(
            kinds,
            lambda: run_sqlite(cfg, args.sqlite_dir),
            lambda: run_postgres(cfg, args.pg_url),
        )
        print(report(results))
    if args.pgbouncer:
        results["pgbouncer"] = asyncio.run(bench_pooled(cfg, args.pg_url, args.pgbouncer))
        print()
        print(report_pooled(results["pgbouncer"]))
    if args.json:
        import aiosqlite
        import sqlalchemy

        versions = {"python": platform.python_version(), "sqlalchemy": sqlalchemy.__version__}
        versions["aiosqlite"] = aiosqlite.__version__
        try:
            import asyncpg

            versions["asyncpg"] = asyncpg.__version__
        except ImportError:
            pass
        doc = {"config": asdict(cfg), "versions": versions, "results": results}
        Path(args.json).write_text(json.dumps(doc, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
