"""Benchmark: what the full-text index costs an agent turn.

Run from a checkout::

    python bench/search_turns.py [--backend sqlite|postgres|all] [--pg-url URL] [--quick]
                                 [--repeat N] [--sqlite-dir DIR] [--json FILE]

An agent turn (``store.read(c, limit=20)``, then ``store.write(c, [user, reply])``,
about 200 bytes of JSON each) is timed on two fresh databases made by
``histstore.connect(url, migrate=True)``: one as made, and one whose full-text index was
then taken away (SQLite: the triggers that keep the FTS5 table, and the statement by
which each write lists its messages, left out of that store's writes; Postgres: the GIN
index on the messages' text). The code is the same
on both, so the difference is what keeping the index
costs the database (the indexed text is computed and stored on both). Sequential (1
task) and 16 concurrent tasks, 20 conversations per task; the two databases alternate
``--repeat`` times and the figure is the median of the wall time per turn. Then a
bulk load: ``batches`` writes of 100 messages to 10 conversations, then one search
(which, on SQLite, first indexes what the writes listed, so the figure includes all of
the indexing; on Postgres the writes kept the index themselves), as wall time per
message. Target: with the index at most 1.25x without it, on both backends.
"""

from __future__ import annotations

import asyncio
import shutil
import sqlite3
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _common import (
    bench_parser,
    chat_messages,
    median,
    pg_databases,
    pg_server,
    render_table,
    repeated_config,
    run_and_report,
)
from sqlalchemy import text

import histstore  # importable once _common has put the checkout on sys.path

TARGET = 1.25
WITHOUT_INDEX = {
    "sqlite": [
        "DROP TRIGGER histstore_messages_fts_delete",
        "DROP TRIGGER histstore_messages_fts_update",
    ],
    "postgresql": ["DROP INDEX ix_histstore_messages_text"],
}


@dataclass(frozen=True)
class Config:
    turns: int  # per task and run
    repeat: int
    batches: int = 100  # of the bulk load, per run


FULL = Config(turns=150, repeat=3)
QUICK = Config(turns=20, repeat=1, batches=5)
SCENARIOS = {"1": "sequential", "16": "16 tasks", "bulk": "bulk + search"}


async def _open(url: str, indexed: bool) -> histstore.Store:
    store = await histstore.connect(url, migrate=True)
    if not indexed:
        async with store.engine.begin() as conn:
            for statement in WITHOUT_INDEX[conn.dialect.name]:
                await conn.execute(text(statement))
        # SQLite: its writes list their messages themselves (revision a2f6c8e4d0b3).
        sql = store._history._ctx.sql
        sql.listed = lambda steps, count=None: steps
    return store


async def _turns(store: histstore.Store, tasks: int, turns: int, tag: str) -> float:
    """Wall time per turn, microseconds."""
    messages = chat_messages(200)

    async def worker(w: int) -> None:
        for i in range(turns):
            c = f"{tag}-{w}-{i % 20}"
            await store.read(c, limit=20)
            await store.write(c, [messages[(2 * i) % 200], messages[(2 * i + 1) % 200]])

    start = time.perf_counter()
    await asyncio.gather(*(worker(w) for w in range(tasks)))
    return (time.perf_counter() - start) / (tasks * turns) * 1e6


async def _bulk(store: histstore.Store, batches: int, tag: str) -> float:
    """Wall time per message of ``batches`` writes of 100 messages and a search after
    them, microseconds."""
    messages = chat_messages(100)
    start = time.perf_counter()
    for b in range(batches):
        await store.write(f"{tag}-{b % 10}", messages)
    await store.search("histstore-bench-absent")
    return (time.perf_counter() - start) / (batches * 100) * 1e6


async def bench(urls: dict[str, str], cfg: Config) -> dict[str, Any]:
    stores = {name: await _open(url, name == "indexed") for name, url in urls.items()}
    try:
        out: dict[str, Any] = {}
        for tasks in (1, 16):
            times: dict[str, list[float]] = {name: [] for name in stores}
            for r in range(cfg.repeat):
                order = list(stores) if r % 2 == 0 else list(reversed(stores))
                for name in order:
                    await _turns(stores[name], tasks, 5, f"warm{r}")
                    times[name].append(await _turns(stores[name], tasks, cfg.turns, f"r{r}"))
            out[str(tasks)] = {name: median(v) for name, v in times.items()}
            print(f"  {tasks} task(s): {out[str(tasks)]}", file=sys.stderr, flush=True)
        bulk: dict[str, list[float]] = {name: [] for name in stores}
        for r in range(cfg.repeat):
            for name in list(stores) if r % 2 == 0 else list(reversed(stores)):
                bulk[name].append(await _bulk(stores[name], cfg.batches, f"bulk{r}"))
        out["bulk"] = {name: median(v) for name, v in bulk.items()}
        print(f"  bulk: {out['bulk']}", file=sys.stderr, flush=True)
        return out
    finally:
        for store in stores.values():
            await store.close()


async def run_sqlite(cfg: Config, directory: str | None) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="histstore-bench-search-turns-", dir=directory))
    try:
        result = await bench({n: str(tmp / f"{n}.db") for n in ("indexed", "bare")}, cfg)
        result["server"] = f"SQLite {sqlite3.sqlite_version}, files in {tmp}"
        return result
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


async def run_postgres(cfg: Config, admin_url: str) -> dict[str, Any]:
    async with pg_databases(admin_url, ["indexed", "bare"]) as urls:
        result = await bench(urls, cfg)
        result["server"] = await pg_server(urls["indexed"])
        return result


def report(results: dict[str, dict[str, Any]], cfg: Config) -> str:
    rows = []
    for backend, result in results.items():
        for scenario, label in SCENARIOS.items():
            t = result[scenario]
            ratio = t["indexed"] / t["bare"]
            rows.append(
                [
                    backend,
                    label,
                    f"{t['indexed']:,.0f}",
                    f"{t['bare']:,.0f}",
                    f"{ratio:.2f}x",
                    f"<= {TARGET}x",
                    "PASS" if ratio <= TARGET else "FAIL",
                ]
            )
    table = render_table(
        ["backend", "scenario", "indexed us", "no index us", "ratio", "target", "result"], rows
    )
    servers = "\n".join(f"{b}: {r['server']}" for b, r in results.items())
    return (
        "Agent turn (read newest 20 + write 2), and a bulk load then a search, with the\n"
        "full-text index and without it: wall time per turn (per message for the bulk\n"
        f"load), median of {cfg.repeat} alternating runs\n{table}\n\n{servers}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = bench_parser(__doc__ or "")
    parser.add_argument("--repeat", type=int, default=None, help="alternating runs (3)")
    args = parser.parse_args(argv)
    cfg = repeated_config(args, QUICK, FULL)
    return run_and_report(
        args,
        cfg,
        lambda: run_sqlite(cfg, args.sqlite_dir),
        lambda: run_postgres(cfg, args.pg_url),
        report,
    )


if __name__ == "__main__":
    sys.exit(main())
