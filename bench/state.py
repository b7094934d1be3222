# ruff: noqa: E402
"""Benchmark: conversation state (SPEC 5) at scale, on SQLite and PostgreSQL.

Run from a checkout::

    python bench/state.py [--backend sqlite|postgres|all] [--pg-url URL] [--quick]
                          [--sqlite-dir DIR] [--json FILE]

It measures, on each backend, through ``histstore.connect(url)`` with default options:

(a) ``list_append(c, name, [item])`` of one small JSON item to a list of 10 items and to
    one of 100,000 items (filled with bulk inserts on the histstore tables). The appends
    alternate between the two lists; the figure is the median latency of each. Target:
    the 100k append costs at most 1.3x the 10-item one (SPEC: O(len(items)) however long
    the list is).
(b) ``merge_metadata`` throughput with 16 concurrent tasks, each merging one key per
    call: into 16 conversations (one per task), and all into one conversation (every
    merge then queues on that conversation's row lock). The run checks that no key is
    lost.
(c) ``conversations(limit=100)`` on a store of 100,000 conversations (10 owners, two
    metadata entries each: ``kind`` shared by all, ``tenant`` one of 10 values, plus one
    conversation with a unique ``tag``), without and with filters and orders: median
    latency, and the query plan of the exact statement the store sent (captured with a
    ``before_cursor_execute`` listener; ``EXPLAIN QUERY PLAN`` on SQLite, ``EXPLAIN
    (ANALYZE, BUFFERS)`` on Postgres). A plan that sorts or scans a whole table is flagged.

SQLite files go to a temporary directory; Postgres gets throwaway databases created and
dropped by the run.
"""

from __future__ import annotations

import os
import sys

# ``python bench/state.py`` puts bench/ first on sys.path, where bench/copy.py would
# shadow the standard library's ``copy``: move the folder last (``_common`` is there).
_BENCH = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _BENCH]
sys.path.append(_BENCH)

import asyncio
import json
import shutil
import sqlite3
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from _common import (
    asyncpg_kwargs,
    bench_parser,
    median,
    pg_databases,
    pg_server,
    render_table,
    run_and_report,
)
from sqlalchemy import event

import histstore  # importable once _common has put the checkout on sys.path
from histstore._core import codec as _codec

APPEND_TARGET = 1.3
TASKS = 16
PAGE = 100
SLOW_LISTING = 10.0  # a listing this many times slower than the plain one is flagged


@dataclass(frozen=True)
class Config:
    big_list: int
    appends: int  # timed appends per list
    merges_per_task: int
    conversations: int
    listings: int  # timed calls per conversations() variant


FULL = Config(
    big_list=100_000, appends=400, merges_per_task=100, conversations=100_000, listings=200
)
QUICK = Config(big_list=10_000, appends=40, merges_per_task=10, conversations=10_000, listings=20)


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------- bulk fill


class Filler:
    """Bulk inserts straight into the histstore tables (the store's own SQL is too slow
    for 100k rows, and what is measured is reading them, not writing them)."""

    def __init__(self, kind: str, url: str) -> None:
        self.kind = kind
        self.url = url

    async def insert(self, table: str, columns: Sequence[str], rows: list[tuple[Any, ...]]) -> None:
        if self.kind == "postgres":
            import asyncpg

            conn = await asyncpg.connect(**asyncpg_kwargs(self.url))
            try:
                await conn.copy_records_to_table(table, columns=list(columns), records=rows)
            finally:
                await conn.close()
            return
        marks = ", ".join("?" * len(columns))
        cols = ", ".join(f'"{c}"' for c in columns)

        def work() -> None:
            conn = sqlite3.connect(self.url, isolation_level=None)
            try:
                conn.execute("BEGIN IMMEDIATE")
                conn.executemany(f"INSERT INTO {table} ({cols}) VALUES ({marks})", rows)
                conn.execute("COMMIT")
            finally:
                conn.close()

        await asyncio.to_thread(work)

    def time(self, dt: datetime) -> Any:
        """A timestamp as the column holds it (SQLite keeps naive UTC text)."""
        if self.kind == "postgres":
            return dt
        return dt.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")

    async def analyze(self) -> None:
        if self.kind == "postgres":
            import asyncpg

            conn = await asyncpg.connect(**asyncpg_kwargs(self.url))
            try:
                await conn.execute("ANALYZE")
            finally:
                await conn.close()
            return

        def work() -> None:
            conn = sqlite3.connect(self.url, isolation_level=None)
            try:
                conn.execute("ANALYZE")
            finally:
                conn.close()

        await asyncio.to_thread(work)


# ---------------------------------------------------------------------- (a) list_append


@dataclass
class AppendResult:
    sizes: list[int]
    median_us: list[float]
    ratio: float
    target: float
    passed: bool


async def bench_list_append(kind: str, url: str, cfg: Config) -> AppendResult:
    fill = Filler(kind, url)
    now = fill.time(datetime.now(timezone.utc))
    sizes = [10, cfg.big_list]
    cids = {n: f"bench-list-{n}-{uuid.uuid4().hex}" for n in sizes}
    await fill.insert(
        "histstore_conversations",
        ["id", "length", "created_at", "updated_at"],
        [(c, 0, now, now) for c in cids.values()],
    )
    await fill.insert(
        "histstore_lists",
        ["conversation_id", "name", "length"],
        [(c, "events", n) for n, c in cids.items()],
    )
    for n, c in cids.items():
        await fill.insert(
            "histstore_list_items",
            ["conversation_id", "name", "idx", "value"],
            [(c, "events", i, json.dumps({"step": i, "ok": True})) for i in range(n)],
        )
        log(f"  filled a list of {n:,} items")
    await fill.analyze()
    samples: dict[int, list[float]] = {n: [] for n in sizes}
    async with histstore.connect(url) as store:
        for n, c in cids.items():  # warm up; also checks the fill is what the store sees
            assert await store.list_len(c, "events") == n
            for _ in range(20):
                await store.list_append(c, "events", [{"warm": True}])
        for i in range(cfg.appends):
            order = sizes if i % 2 == 0 else sizes[::-1]
            for n in order:
                t0 = time.perf_counter()
                await store.list_append(cids[n], "events", [{"step": i, "ok": True}])
                samples[n].append(time.perf_counter() - t0)
        for n, c in cids.items():
            assert await store.list_len(c, "events") == n + 20 + cfg.appends
    med = [median(samples[n]) * 1e6 for n in sizes]
    ratio = med[1] / med[0]
    for n, m in zip(sizes, med, strict=True):
        log(f"  list_append of 1 item to a list of {n:,}: {m:,.0f} us")
    return AppendResult(sizes, med, ratio, APPEND_TARGET, ratio <= APPEND_TARGET)


# ---------------------------------------------------------------------- (b) merge_metadata


@dataclass
class MergeResult:
    scenario: str
    merges: int
    seconds: float
    per_second: float


async def bench_merges(url: str, cfg: Config) -> list[MergeResult]:
    results = []
    async with histstore.connect(url) as store:
        for scenario in ("16 conversations", "1 conversation"):
            tag = uuid.uuid4().hex
            one = f"bench-merge-{tag}"
            cids = [one if scenario == "1 conversation" else f"{one}-{t}" for t in range(TASKS)]
            for c in set(cids):
                await store.merge_metadata(c, {"warm": True})

            async def task(t: int, cids: list[str] = cids) -> None:
                for j in range(cfg.merges_per_task):
                    await store.merge_metadata(cids[t], {f"t{t}-k{j}": {"j": j}})

            t0 = time.perf_counter()
            await asyncio.gather(*(task(t) for t in range(TASKS)))
            elapsed = time.perf_counter() - t0
            total = TASKS * cfg.merges_per_task
            for t in range(TASKS):
                meta = await store.metadata(cids[t])
                missing = [j for j in range(cfg.merges_per_task) if f"t{t}-k{j}" not in meta]
                if missing:
                    raise RuntimeError(f"merge_metadata lost {len(missing)} keys of task {t}")
            results.append(MergeResult(scenario, total, elapsed, total / elapsed))
            log(f"  merge_metadata, {TASKS} tasks into {scenario}: {total / elapsed:,.0f} merges/s")
    return results


# ---------------------------------------------------------------------- (c) conversations()


@dataclass
class ListingResult:
    call: str
    median_us: float
    returned: int
    indexed: bool
    statement: str
    plan: list[str] = field(default_factory=list)


LISTINGS: dict[str, dict[str, Any]] = {
    "limit=100": {},
    "limit=100, metadata={kind: chat} (all match)": {"metadata": {"kind": "chat"}},
    "limit=100, metadata={tenant: t3} (10% match)": {"metadata": {"tenant": "t3"}},
    "limit=100, metadata={tag: unique} (1 match)": {"metadata": {"tag": "unique"}},
    "limit=100, metadata={kind, tenant} (10%)": {"metadata": {"kind": "chat", "tenant": "t3"}},
    "limit=100, user=u7": {"user": "u7"},
    "limit=100, user=u7, metadata={tenant: t3}": {"user": "u7", "metadata": {"tenant": "t3"}},
    "limit=100, order=updated, descending": {"order": "updated", "descending": True},
    "limit=100, order=created, metadata={tenant: t3}": {
        "order": "created",
        "metadata": {"tenant": "t3"},
    },
    "limit=100, offset=1000": {"offset": 1000},
}


def plan_uses_indexes(kind: str, plan: Sequence[str]) -> bool:
    """False when the plan scans the conversations table whole, sorts, or hashes a full scan."""
    text = "\n".join(plan)
    if kind == "sqlite":
        if "TEMP B-TREE" in text:
            return False
        return not any(
            line.strip(" |-`").startswith("SCAN ") and "INDEX" not in line for line in plan
        )
    return "Seq Scan" not in text and "Sort" not in text


async def explain(store: histstore.Store, kind: str, statement: str, params: Any) -> list[str]:
    prefix = "EXPLAIN QUERY PLAN " if kind == "sqlite" else "EXPLAIN (ANALYZE, BUFFERS) "
    async with store.engine.connect() as conn:
        rows: list[Any] = list((await conn.exec_driver_sql(prefix + statement, params)).all())
    if kind == "sqlite":
        # (id, parent, notused, detail): indent by depth.
        depth: dict[int, int] = {0: -1}
        out = []
        for row in rows:
            d = depth.get(row[1], -1) + 1
            depth[row[0]] = d
            out.append("  " * d + str(row[3]))
        return out
    return [str(r[0]) for r in rows]


async def capture(
    store: histstore.Store, call: Callable[[], Awaitable[Any]]
) -> tuple[Any, str, Any]:
    """Run ``call`` and return its result and the one SELECT it sent (with parameters)."""
    seen: list[tuple[str, Any]] = []

    def hook(conn: Any, cursor: Any, statement: str, parameters: Any, *rest: Any) -> None:
        if statement.lstrip().upper().startswith("SELECT"):
            seen.append((statement, parameters))

    sync = store.engine.sync_engine
    event.listen(sync, "before_cursor_execute", hook)
    try:
        result = await call()
    finally:
        event.remove(sync, "before_cursor_execute", hook)
    if len(seen) != 1:
        raise RuntimeError(f"expected one SELECT, saw {len(seen)}")
    return result, seen[0][0], seen[0][1]


async def fill_conversations(kind: str, url: str, n: int) -> None:
    fill = Filler(kind, url)
    base = datetime(2024, 1, 1, tzinfo=timezone.utc)
    ids = [f"c-{uuid.UUID(int=i * 2654435761 % (1 << 64)).hex}" for i in range(n)]
    await fill.insert(
        "histstore_conversations",
        ["id", "owner", "length", "created_at", "updated_at"],
        [
            (
                c,
                f"u{i % 10}",
                0,
                fill.time(base + timedelta(seconds=i)),
                fill.time(base + timedelta(seconds=(i * 7919) % n)),
            )
            for i, c in enumerate(ids)
        ],
    )
    rows = []
    for i, c in enumerate(ids):
        for key, value in (("kind", "chat"), ("tenant", f"t{(i // 10) % 10}")):
            text = _codec.encode(value)[0]
            rows.append((c, key, _codec.key_digest(key), text, _codec.canonical_digest(value)))
    rows.append(
        (
            ids[n // 2],
            "tag",
            _codec.key_digest("tag"),
            '"unique"',
            _codec.canonical_digest("unique"),
        )
    )
    await fill.insert(
        "histstore_metadata", ["conversation_id", "key", "key_digest", "value", "digest"], rows
    )
    await fill.analyze()
    log(f"  filled {n:,} conversations and {len(rows):,} metadata entries")


async def bench_listing(kind: str, url: str, cfg: Config) -> list[ListingResult]:
    await fill_conversations(kind, url, cfg.conversations)
    results = []
    async with histstore.connect(url) as store:
        for label, kwargs in LISTINGS.items():
            opts = {"limit": PAGE, **kwargs}

            async def call(opts: dict[str, Any] = opts) -> list[str]:
                return await store.conversations(**opts)

            got, statement, params = await capture(store, call)
            for _ in range(5):
                await call()
            samples = []
            for _ in range(cfg.listings):
                t0 = time.perf_counter()
                await call()
                samples.append(time.perf_counter() - t0)
            plan = await explain(store, kind, statement, params)
            res = ListingResult(
                label,
                median(samples) * 1e6,
                len(got),
                plan_uses_indexes(kind, plan),
                " ".join(statement.split()),
                plan,
            )
            results.append(res)
            log(f"  conversations({label}): {res.median_us:,.0f} us, {len(got)} ids")
    return results


# ---------------------------------------------------------------------- per backend


async def bench_backend(kind: str, urls: dict[str, str], cfg: Config) -> dict[str, Any]:
    for url in urls.values():
        await (await histstore.connect(url, migrate=True)).close()
    log(f"{kind}: list_append scaling")
    appends = await bench_list_append(kind, urls["lists"], cfg)
    log(f"{kind}: merge_metadata throughput")
    merges = await bench_merges(urls["merges"], cfg)
    log(f"{kind}: conversations() on {cfg.conversations:,} conversations")
    listing = await bench_listing(kind, urls["listing"], cfg)
    return {
        "appends": asdict(appends),
        "merges": [asdict(m) for m in merges],
        "listing": [asdict(r) for r in listing],
    }


NAMES = ("lists", "merges", "listing")


async def run_sqlite(cfg: Config, directory: str | None) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="histstore-bench-state-", dir=directory))
    try:
        result = await bench_backend("sqlite", {n: str(tmp / f"{n}.db") for n in NAMES}, cfg)
        result["server"] = f"SQLite {sqlite3.sqlite_version}, files in {tmp}"
        return result
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


async def run_postgres(cfg: Config, admin_url: str) -> dict[str, Any]:

    async with pg_databases(admin_url, list(NAMES)) as urls:
        result = await bench_backend("postgres", urls, cfg)
        result["server"] = await pg_server(urls["lists"])
        return result


# ---------------------------------------------------------------------- report


def report(results: dict[str, dict[str, Any]], cfg: Config) -> str:
    out: list[str] = []
    rows = []
    for kind, res in results.items():
        a = res["appends"]
        rows.append(
            [
                kind,
                f"{a['median_us'][0]:,.0f}",
                f"{a['median_us'][1]:,.0f}",
                f"{a['ratio']:.2f}x",
                f"<= {a['target']}x",
                "PASS" if a["passed"] else "FAIL",
            ]
        )
    out.append(f"(a) list_append of 1 item: median us ({cfg.appends} appends per list)")
    big = f"{cfg.big_list:,} items us"
    out.append(render_table(["backend", "10 items us", big, "ratio", "target", "result"], rows))
    rows = [
        [kind, m["scenario"], f"{m['merges']:,}", f"{m['seconds']:.2f}", f"{m['per_second']:,.0f}"]
        for kind, res in results.items()
        for m in res["merges"]
    ]
    out.append("")
    out.append(f"(b) merge_metadata throughput, {TASKS} concurrent tasks (no key lost)")
    out.append(render_table(["backend", "into", "merges", "seconds", "merges/s"], rows))
    rows = []
    notes = []
    for kind, res in results.items():
        plain = res["listing"][0]["median_us"]
        for r in res["listing"]:
            slower = r["median_us"] / plain
            rows.append(
                [
                    kind,
                    r["call"],
                    f"{r['median_us']:,.0f}",
                    f"{slower:.1f}x",
                    str(r["returned"]),
                    "yes" if r["indexed"] else "NO",
                ]
            )
            if slower > SLOW_LISTING:
                notes.append(
                    f"NOTE {kind}: conversations({r['call']}) costs {slower:.0f}x the plain"
                    " listing: its plan visits far more rows than it returns (see its plan)"
                )
    out.append("")
    out.append(f"(c) conversations() on {cfg.conversations:,} conversations: median us;")
    out.append("'x plain' compares with conversations(limit=100); 'no sort/table scan' reads")
    out.append(
        "the plan (no Seq Scan or Sort on Postgres, no TEMP B-TREE or index-less SCAN on SQLite)"
    )
    headers = ["backend", "call", "us", "x plain", "ids", "no sort/table scan"]
    out.append(render_table(headers, rows))
    out.extend(notes)
    for kind, res in results.items():
        out.append("")
        out.append(f"--- {kind} query plans ({res['server']})")
        for r in res["listing"]:
            out.append(f"conversations({r['call']}):")
            out.append(f"  SQL: {r['statement']}")
            out.extend("    " + line for line in r["plan"])
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    parser = bench_parser(__doc__ or "")
    args = parser.parse_args(argv)
    cfg = QUICK if args.quick else FULL
    return run_and_report(
        args,
        cfg,
        lambda: run_sqlite(cfg, args.sqlite_dir),
        lambda: run_postgres(cfg, args.pg_url),
        report,
    )


if __name__ == "__main__":
    sys.exit(main())
