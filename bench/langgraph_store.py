"""Benchmark: LangGraph's long-term memory store, histstore's beside LangGraph's own.

Times the calls a graph makes on ``runtime.store`` for ``HiststoreMemoryStore`` and, in
the same run, for LangGraph's ``AsyncSqliteStore`` (langgraph-checkpoint-sqlite) or
``AsyncPostgresStore`` (langgraph-checkpoint-postgres): a put of one item, a get by key,
the newest ten items of a namespace, the same filtered (``{"n": {"$gt": ...}}``), and a
page of namespaces under a prefix. Each store first holds ``--items`` items spread over
200 namespaces; the calls then alternate between the stores, round after round, and the
median of the rounds is reported (us a call) with the ratio histstore / LangGraph.

    python bench/langgraph_store.py [--backend sqlite|postgres|all] [--pg-url URL]
                                    [--quick] [--items N] [--sqlite-dir DIR] [--json FILE]
"""

from __future__ import annotations

import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _common import bench_parser, median, pg_databases, render_table, run_and_report

# Named like the package it measures: its folder must not shadow ``langgraph``.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]

from langgraph.store.base import BaseStore, PutOp  # noqa: E402

import histstore  # noqa: E402
from histstore.integrations.langgraph_store import HiststoreMemoryStore  # noqa: E402

CALLS = ("put", "get", "search", "filtered", "list")


@dataclass(frozen=True)
class Config:
    items: int
    calls: int
    rounds: int


QUICK = Config(items=400, calls=5, rounds=2)
FULL = Config(items=5000, calls=100, rounds=5)


async def fill(store: BaseStore, items: int) -> None:
    for start in range(0, items, 500):
        ops = [
            PutOp(("org", f"u{i % 200}"), f"k{i}", {"n": i, "text": "x" * 100})
            for i in range(start, min(items, start + 500))
        ]
        await store.abatch(ops)


def calls(store: BaseStore) -> dict[str, Callable[[], Awaitable[Any]]]:
    return {
        "put": lambda: store.aput(("org", "u7"), "hot", {"n": 1, "text": "y"}),
        "get": lambda: store.aget(("org", "u7"), "k7"),
        "search": lambda: store.asearch(("org", "u7"), limit=10),
        "filtered": lambda: store.asearch(("org", "u7"), filter={"n": {"$gt": 100}}, limit=10),
        "list": lambda: store.alist_namespaces(prefix=("org",), limit=20),
    }


async def compare(ours: BaseStore, theirs: BaseStore, cfg: Config) -> dict[str, Any]:
    await fill(ours, cfg.items)
    await fill(theirs, cfg.items)
    times: dict[str, tuple[list[float], list[float]]] = {name: ([], []) for name in CALLS}
    for _ in range(cfg.rounds):
        for name in CALLS:
            for store, out in ((ours, times[name][0]), (theirs, times[name][1])):
                call = calls(store)[name]
                start = time.perf_counter()
                for _ in range(cfg.calls):
                    await call()
                out.append((time.perf_counter() - start) / cfg.calls * 1e6)
    return {name: [median(a), median(b)] for name, (a, b) in times.items()}


def report(results: dict[str, dict[str, Any]], cfg: Config) -> str:
    rows = [
        [kind, name, f"{a:.0f}", f"{b:.0f}", f"{a / b:.2f}x"]
        for kind, found in results.items()
        for name, (a, b) in found.items()
    ]
    headers = ["backend", "call", "histstore us", "langgraph us", "ratio"]
    return f"{cfg.items} items in 200 namespaces\n" + render_table(headers, rows)


def main() -> int:
    parser = bench_parser(__doc__ or "")
    parser.add_argument("--items", type=int, default=None)
    args = parser.parse_args()
    cfg = QUICK if args.quick else FULL
    if args.items:
        cfg = Config(args.items, cfg.calls, cfg.rounds)

    async def sqlite() -> dict[str, Any]:
        from langgraph.store.sqlite.aio import AsyncSqliteStore

        with tempfile.TemporaryDirectory(dir=args.sqlite_dir) as tmp:
            async with (
                AsyncSqliteStore.from_conn_string(str(Path(tmp) / "langgraph.db")) as theirs,
                histstore.connect(str(Path(tmp) / "histstore.db")) as store,
            ):
                await theirs.setup()
                return await compare(HiststoreMemoryStore(store), theirs, cfg)

    async def postgres() -> dict[str, Any]:
        from langgraph.store.postgres.aio import AsyncPostgresStore

        async with pg_databases(args.pg_url, ["ours", "theirs"]) as urls:  # noqa: SIM117 - the URLs come first
            async with (
                AsyncPostgresStore.from_conn_string(urls["theirs"]) as theirs,
                histstore.connect(urls["ours"], migrate=True) as store,
            ):
                await theirs.setup()
                return await compare(HiststoreMemoryStore(store), theirs, cfg)

    return run_and_report(args, cfg, sqlite, postgres, report)


if __name__ == "__main__":
    raise SystemExit(main())
