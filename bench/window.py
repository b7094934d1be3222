"""Benchmark: a WindowStore read costs what the window holds, not the history's length.

Measures ``WindowStore.read`` (one merged system message plus the newest whole turns)
on conversations of 100 and of 100,000 messages, with a message limit and with a token
limit, on SQLite and Postgres. Target: the 100k read costs at most 1.3x the 100 read.

    python bench/window.py [--backend sqlite|postgres|all] [--pg-url URL] [--quick]

Conversations are built from turns of four messages (user, assistant with a tool call,
tool result, assistant answer) after one system message, written in batches of 4,000.
"""

from __future__ import annotations

import argparse
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from _common import DEFAULT_PG_URL, median, pg_databases, render_table, run_backends

import histstore
from histstore import Message, WindowStore

TARGET = 1.3
SIZES = (100, 100_000)


def turn(i: int) -> list[Message]:
    call = {"id": f"call_{i}", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    return [
        Message.user(f"question {i}: what is the state of item {i}?"),
        Message.assistant(None, tool_calls=[call]),
        Message.tool(f'{{"item": {i}, "state": "ok"}}', tool_call_id=f"call_{i}"),
        Message.assistant(f"Item {i} is fine."),
    ]


async def fill(store: histstore.Store, size: int) -> str:
    cid = f"bench-{uuid.uuid4().hex}"
    batch: list[Message] = [Message.system("You are terse.")]
    i = 0
    while i * 4 + 1 < size:
        batch.extend(turn(i))
        i += 1
        if len(batch) >= 4000:
            await store.write(cid, batch)
            batch = []
    if batch:
        await store.write(cid, batch)
    return cid


async def measure(window: WindowStore, cid: str, reads: int) -> float:
    for _ in range(max(5, reads // 10)):
        await window.read(cid)
    times = []
    for _ in range(reads):
        started = time.perf_counter()
        await window.read(cid)
        times.append(time.perf_counter() - started)
    return median(times) * 1e6


async def run(url: str, reads: int) -> dict[str, Any]:
    results: dict[str, Any] = {}
    async with histstore.connect(url, migrate=True) as store:
        cids = {size: await fill(store, size) for size in SIZES}
        windows = {
            "max_messages=40": WindowStore(store, max_messages=40),
            "max_tokens=600": WindowStore(
                store, max_tokens=600, count_tokens=lambda m: m.size // 4
            ),
        }
        for label, window in windows.items():
            got = {size: await measure(window, cids[size], reads) for size in SIZES}
            results[label] = {"us": got, "ratio": got[SIZES[-1]] / got[SIZES[0]]}
    return results


async def run_sqlite(reads: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="histstore-bench-window-") as tmp:
        return await run(str(Path(tmp) / "window.db"), reads)


async def run_postgres(admin_url: str, reads: int) -> dict[str, Any]:
    async with pg_databases(admin_url, ["window"]) as urls:
        return await run(urls["window"], reads)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=["sqlite", "postgres", "all"], default="all")
    parser.add_argument("--pg-url", default=DEFAULT_PG_URL)
    parser.add_argument("--quick", action="store_true", help="fewer reads (smoke test)")
    args = parser.parse_args(argv)
    reads = 50 if args.quick else 500
    kinds = ["sqlite", "postgres"] if args.backend == "all" else [args.backend]
    results = run_backends(
        kinds, lambda: run_sqlite(reads), lambda: run_postgres(args.pg_url, reads)
    )
    rows = []
    for kind, by_window in results.items():
        for label, r in by_window.items():
            small, large = (r["us"][size] for size in SIZES)
            verdict = "PASS" if r["ratio"] <= TARGET else "FAIL"
            rows.append(
                [kind, label, f"{small:,.0f}", f"{large:,.0f}", f"{r['ratio']:.2f}x", verdict]
            )
    headers = ["backend", "window", "100 msgs us", "100k msgs us", "100k/100", "<=1.3x"]
    print("WindowStore.read, median latency")
    print(render_table(headers, rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
