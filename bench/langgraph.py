"""Benchmark: reading a LangGraph thread's latest checkpoint costs the same at 10 and 10,000.

Measures ``aget_tuple`` of a thread's newest checkpoint (no ``checkpoint_id``: what
LangGraph does at the start of every run) on a thread of 10 checkpoints and on one of
10,000, for histstore's ``HiststoreSaver`` and, side by side in the same run, for
LangGraph's own ``AsyncSqliteSaver`` (langgraph-checkpoint-sqlite, aiosqlite) and
``AsyncPostgresSaver`` (langgraph-checkpoint-postgres, psycopg). Target for histstore:
the 10,000 read costs at most 1.3x the 10 read.

    python bench/langgraph.py [--backend sqlite|postgres|all] [--pg-url URL] [--quick]
                              [--checkpoints N] [--reads N] [--sqlite-dir DIR] [--json FILE]

Every checkpoint looks like an agent's: a ``messages`` channel (the newest 20 chat
messages, about 4 KB, a new version at each step), a scalar ``step`` channel, and (the newest
ten) two pending writes. Threads are filled through each saver's own ``aput`` and
``aput_writes``; on Postgres the database is then ANALYZEd (as autovacuum would), for
both savers. The default run takes about two minutes.
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from _common import (
    asyncpg_kwargs,
    bench_parser,
    chat_messages,
    median,
    pg_databases,
    pg_server,
    render_table,
)

# This file is named like the package it measures: run as a script, its folder comes
# first on sys.path and would shadow the real ``langgraph``. Drop it (``_common`` is in).
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]

from langgraph.checkpoint.base import BaseCheckpointSaver  # noqa: E402
from langgraph.checkpoint.conformance.test_utils import (  # noqa: E402
    generate_checkpoint,
    generate_metadata,
)

import histstore  # noqa: E402
from histstore.integrations.langgraph import HiststoreSaver  # noqa: E402

TARGET = 1.3
SMALL = 10
WRITTEN = 10
"""The newest checkpoints of a thread that get pending writes (older ones would only
slow the fill down: reads never look at them)."""
MESSAGES = chat_messages(200)


async def fill(saver: BaseCheckpointSaver[Any], count: int) -> str:
    """A new thread of ``count`` checkpoints, each after the previous one."""
    thread = f"bench-{uuid.uuid4().hex}"
    parent: str | None = None
    version: Any = None
    for step in range(count):
        version = saver.get_next_version(version, None)
        window = MESSAGES[step % 180 : step % 180 + 20]
        cp = generate_checkpoint(
            channel_values={"messages": window, "step": step},
            channel_versions={"messages": version, "step": version},
        )
        configurable: dict[str, Any] = {"thread_id": thread, "checkpoint_ns": ""}
        if parent is not None:
            configurable["checkpoint_id"] = parent
        config: Any = {"configurable": configurable}
        stored = await saver.aput(
            config,
            cp,
            generate_metadata(step=step, run_id="bench"),
            {"messages": version, "step": version},
        )
        if step >= count - WRITTEN:
            await saver.aput_writes(stored, [("messages", window[-1:]), ("step", step + 1)], "task")
        parent = cp["id"]
    return thread


async def latest_read_us(saver: BaseCheckpointSaver[Any], thread: str, reads: int) -> float:
    config: Any = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
    first = await saver.aget_tuple(config)
    assert first is not None
    assert len(first.checkpoint["channel_values"]["messages"]) == 20
    for _ in range(max(5, reads // 10)):
        await saver.aget_tuple(config)
    times = []
    for _ in range(reads):
        started = time.perf_counter()
        await saver.aget_tuple(config)
        times.append(time.perf_counter() - started)
    return median(times) * 1e6


async def measure(
    saver: BaseCheckpointSaver[Any], large: int, reads: int, analyze: str | None = None
) -> dict[str, Any]:
    started = time.perf_counter()
    threads = {SMALL: await fill(saver, SMALL), large: await fill(saver, large)}
    fill_s = time.perf_counter() - started
    if analyze is not None:
        await analyze_database(analyze)
    us = {n: await latest_read_us(saver, t, reads) for n, t in threads.items()}
    return {
        "us": {str(n): v for n, v in us.items()},
        "ratio": us[large] / us[SMALL],
        "fill_s": fill_s,
    }


async def analyze_database(url: str) -> None:
    """Refresh the planner's statistics, as autovacuum would on a live database: right
    after a bulk fill they say the tables are empty, and plans follow that."""
    import asyncpg

    conn = await asyncpg.connect(**asyncpg_kwargs(url))
    try:
        await conn.execute("ANALYZE")
    finally:
        await conn.close()


async def run_sqlite(directory: str | None, large: int, reads: int) -> dict[str, Any]:
    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="histstore-bench-lg-", dir=directory) as tmp:
        async with histstore.connect(Path(tmp) / "histstore.db") as store:
            results["histstore HiststoreSaver"] = await measure(HiststoreSaver(store), large, reads)
        async with AsyncSqliteSaver.from_conn_string(str(Path(tmp) / "lg.db")) as lg:
            await lg.setup()
            results["langgraph AsyncSqliteSaver"] = await measure(lg, large, reads)
    return results


async def run_postgres(admin_url: str, large: int, reads: int) -> dict[str, Any]:
    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

    results: dict[str, Any] = {"server": await pg_server(admin_url)}
    async with pg_databases(admin_url, ["hs", "lg"]) as urls:
        async with histstore.connect(urls["hs"], migrate=True) as store:
            saver = HiststoreSaver(store)
            results["histstore HiststoreSaver"] = await measure(saver, large, reads, urls["hs"])
        async with AsyncPostgresSaver.from_conn_string(urls["lg"]) as lg:
            await lg.setup()
            results["langgraph AsyncPostgresSaver"] = await measure(lg, large, reads, urls["lg"])
    return results


def main(argv: Sequence[str] | None = None) -> int:
    parser = bench_parser(__doc__ or "")
    parser.add_argument("--checkpoints", type=int, default=None, help="the long thread's size")
    parser.add_argument("--reads", type=int, default=None, help="reads measured per thread")
    args = parser.parse_args(argv)
    large = args.checkpoints or (1_000 if args.quick else 10_000)
    reads = args.reads or (50 if args.quick else 300)
    kinds = ["sqlite", "postgres"] if args.backend == "all" else [args.backend]

    async def run_all() -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        for kind in kinds:
            if kind == "sqlite":
                out[kind] = await run_sqlite(args.sqlite_dir, large, reads)
            else:
                out[kind] = await run_postgres(args.pg_url, large, reads)
        return out

    results = asyncio.run(run_all())
    rows = []
    for kind, by_saver in results.items():
        for saver, r in by_saver.items():
            if saver == "server":
                continue
            small_us, large_us = r["us"][str(SMALL)], r["us"][str(large)]
            verdict = ("PASS" if r["ratio"] <= TARGET else "FAIL") if "histstore" in saver else ""
            rows.append(
                [
                    kind,
                    saver,
                    f"{small_us:,.0f}",
                    f"{large_us:,.0f}",
                    f"{r['ratio']:.2f}x",
                    verdict,
                    f"{r['fill_s']:.1f}",
                ]
            )
    headers = [
        "backend",
        "saver",
        f"{SMALL} ckpts us",
        f"{large:,} ckpts us",
        "ratio",
        f"<={TARGET}x",
        "fill s",
    ]
    print(f"aget_tuple of a thread's latest checkpoint, median of {reads} reads")
    print(render_table(headers, rows))
    if "postgres" in results:
        print(results["postgres"]["server"])
    if args.json:
        Path(args.json).write_text(
            json.dumps({"checkpoints": large, "reads": reads, "results": results}, indent=2)
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
