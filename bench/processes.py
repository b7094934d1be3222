"""Benchmark: agent turns from several processes on one database, beside one process.

Run from a checkout::

    python bench/processes.py [--backend sqlite|postgres|all] [--pg-url URL] [--quick]
                              [--turns N] [--sqlite-dir DIR] [--json FILE]

An agent turn is ``store.read(c, limit=20)`` then ``store.write(c, [user, assistant])``
(about 200 bytes of JSON each). Two layouts run on each backend, each on a fresh
database (one SQLite file shared by every process; one throwaway Postgres database):

* 4 processes x 8 tasks, and
* 1 process x 32 tasks,

so both have 32 turns in flight. Every process is started with ``multiprocessing``
(spawn) and opens its own store with ``histstore.connect(url)`` (default options);
every task owns 4 conversations (prefilled with 20 messages) and cycles through them.
Each task first runs one untimed turn (so pools hold their connections), then all
processes meet at a barrier and every task runs ``--turns`` timed turns. The figures
come from the children's samples: throughput is all turns over the span from the
earliest start to the latest end (``time.monotonic``, one clock for all processes),
latency is per turn (read + write). Target: the multi-process p99 is at most 3x the
one-process p99. The messages stored afterwards are counted: every turn that returned
must have stored its 2 messages exactly once.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import shutil
import sqlite3
import sys
import tempfile
import time
import traceback
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from _common import (
    bench_parser,
    chat_messages,
    percentile,
    pg_databases,
    pg_server,
    render_table,
    run_and_report,
)

import histstore

READ_LIMIT = 20
PREFILL = 20
CONVERSATIONS_PER_TASK = 4
P99_TARGET = 3.0
LAYOUTS = ((1, 32), (4, 8))  # (processes, tasks per process); the first is the reference
CHILD_TIMEOUT = 600.0


@dataclass(frozen=True)
class Config:
    turns: int  # timed turns per task
    layouts: tuple[tuple[int, int], ...]


FULL = Config(turns=200, layouts=LAYOUTS)
QUICK = Config(turns=5, layouts=LAYOUTS)


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def conversation_ids(layout: str, proc: int, task: int) -> list[str]:
    return [f"{layout}-p{proc}-t{task}-c{k}" for k in range(CONVERSATIONS_PER_TASK)]


# ---------------------------------------------------------------------- the child process


async def child_main(
    url: str, layout: str, proc: int, tasks: int, turns: int, barrier: Any
) -> dict[str, Any]:
    messages = chat_messages(2 * 64, seed=proc + 1)
    pairs = [messages[i : i + 2] for i in range(0, len(messages), 2)]
    latencies: list[float] = []
    errors: dict[str, int] = {}
    async with histstore.connect(url) as store:

        async def one_turn(cid: str, i: int, timed: bool) -> None:
            started = time.perf_counter()
            try:
                await store.read(cid, limit=READ_LIMIT)
                await store.write(cid, pairs[i % len(pairs)])
            except histstore.HistStoreError as exc:
                errors[type(exc).__name__] = errors.get(type(exc).__name__, 0) + 1
                return
            if timed:
                latencies.append(time.perf_counter() - started)

        async def task(t: int, timed: bool) -> None:
            cids = conversation_ids(layout, proc, t)
            if not timed:
                await one_turn(cids[0], t, timed=False)
                return
            for i in range(turns):
                await one_turn(cids[i % len(cids)], t + i, timed=True)

        await asyncio.gather(*(task(t, False) for t in range(tasks)))
        await asyncio.to_thread(barrier.wait, CHILD_TIMEOUT)
        start = time.monotonic()
        await asyncio.gather(*(task(t, True) for t in range(tasks)))
        end = time.monotonic()
    return {"start": start, "end": end, "latencies": latencies, "errors": errors}


def child(url: str, layout: str, proc: int, tasks: int, turns: int, barrier: Any, out: Any) -> None:
    """A process's entry point: run its tasks and put its samples (or an error) on ``out``."""
    try:
        result = asyncio.run(child_main(url, layout, proc, tasks, turns, barrier))
    except BaseException:
        barrier.abort()
        out.put({"proc": proc, "failed": traceback.format_exc(limit=8)})
        return
    out.put({"proc": proc, **result})


# ---------------------------------------------------------------------- the parent


@dataclass
class LayoutResult:
    layout: str
    processes: int
    tasks: int
    turns: int
    errors: dict[str, int]
    seconds: float
    turns_per_s: float
    p50_ms: float
    p99_ms: float
    max_ms: float
    stored_ok: bool


def spawn_layout(url: str, layout: str, processes: int, tasks: int, turns: int) -> list[Any]:
    """Start ``processes`` children together and collect their results (blocking)."""
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(processes)
    out = ctx.Queue()
    procs = [
        ctx.Process(target=child, args=(url, layout, p, tasks, turns, barrier, out), daemon=True)
        for p in range(processes)
    ]
    for p in procs:
        p.start()
    results = []
    deadline = time.monotonic() + CHILD_TIMEOUT
    try:
        for _ in procs:
            results.append(out.get(timeout=max(1.0, deadline - time.monotonic())))
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.terminate()
                p.join()
    failed = [r["failed"] for r in results if "failed" in r]
    if failed:
        raise RuntimeError(f"a child process failed:\n{failed[0]}")
    return results


async def prefill(store: histstore.Store, layout: str, processes: int, tasks: int) -> None:
    history = chat_messages(PREFILL, seed=99)
    for p in range(processes):
        for t in range(tasks):
            for cid in conversation_ids(layout, p, t):
                await store.write(cid, history)


async def run_layout(url: str, processes: int, tasks: int, cfg: Config, label: str) -> LayoutResult:
    layout = f"L{processes}x{tasks}"
    async with histstore.connect(url, migrate=True) as store:
        await prefill(store, layout, processes, tasks)
    log(f"  {label}: {processes} process(es) x {tasks} tasks, {cfg.turns} turns per task")
    results = await asyncio.to_thread(spawn_layout, url, layout, processes, tasks, cfg.turns)
    latencies = sorted(x for r in results for x in r["latencies"])
    errors: dict[str, int] = {}
    for r in results:
        for name, n in r["errors"].items():
            errors[name] = errors.get(name, 0) + n
    seconds = max(r["end"] for r in results) - min(r["start"] for r in results)
    # Every turn that returned stored 2 messages once; the untimed turn each task ran did too.
    expected = processes * tasks * (CONVERSATIONS_PER_TASK * PREFILL + 2) + 2 * len(latencies)
    async with histstore.connect(url) as store:
        stored = 0
        for p in range(processes):
            for t in range(tasks):
                for cid in conversation_ids(layout, p, t):
                    stored += await store.count(cid)
    return LayoutResult(
        layout=f"{processes} process{'es' if processes > 1 else ''} x {tasks} tasks",
        processes=processes,
        tasks=tasks,
        turns=len(latencies),
        errors=errors,
        seconds=seconds,
        turns_per_s=len(latencies) / seconds if seconds > 0 else 0.0,
        p50_ms=percentile(latencies, 50) * 1e3,
        p99_ms=percentile(latencies, 99) * 1e3,
        max_ms=(latencies[-1] if latencies else 0.0) * 1e3,
        stored_ok=stored == expected and not errors,
    )


async def run_all_layouts(urls: dict[str, str], cfg: Config, kind: str) -> dict[str, Any]:
    out: list[dict[str, Any]] = []
    for processes, tasks in cfg.layouts:
        result = await run_layout(urls[f"{processes}x{tasks}"], processes, tasks, cfg, kind)
        out.append(asdict(result))
    return {"layouts": out}


def layout_names(cfg: Config) -> list[str]:
    return [f"{p}x{t}" for p, t in cfg.layouts]


async def run_sqlite(cfg: Config, directory: str | None) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="histstore-bench-procs-", dir=directory))
    try:
        urls = {name: str(tmp / f"{name}.db") for name in layout_names(cfg)}
        result = await run_all_layouts(urls, cfg, "sqlite")
        result["server"] = f"SQLite {sqlite3.sqlite_version}, one file per layout in {tmp}"
        return result
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


async def run_postgres(cfg: Config, admin_url: str) -> dict[str, Any]:
    async with pg_databases(admin_url, layout_names(cfg)) as urls:
        result = await run_all_layouts(urls, cfg, "postgres")
        result["server"] = await pg_server(next(iter(urls.values())))
        return result


# ---------------------------------------------------------------------- report


def report(results: dict[str, dict[str, Any]], cfg: Config) -> str:
    rows = []
    checks = []
    for kind, res in results.items():
        layouts = res["layouts"]
        for r in layouts:
            errors = sum(r["errors"].values())
            rows.append(
                [
                    kind,
                    r["layout"],
                    f"{r['turns']:,}",
                    f"{errors}",
                    f"{r['turns_per_s']:,.0f}",
                    f"{r['p50_ms']:.1f}",
                    f"{r['p99_ms']:.1f}",
                    f"{r['max_ms']:.1f}",
                    "yes" if r["stored_ok"] else "NO",
                ]
            )
        ref = layouts[0]
        for r in layouts[1:]:
            ratio = r["p99_ms"] / ref["p99_ms"] if ref["p99_ms"] else float("inf")
            ok = ratio <= P99_TARGET and r["stored_ok"] and ref["stored_ok"]
            checks.append(
                [
                    kind,
                    f"{r['processes']}x{r['tasks']} vs {ref['processes']}x{ref['tasks']}",
                    f"{r['p99_ms']:.1f} / {ref['p99_ms']:.1f}",
                    f"{ratio:.2f}x",
                    f"{r['turns_per_s'] / ref['turns_per_s']:.2f}x" if ref["turns_per_s"] else "-",
                    f"<= {P99_TARGET:g}x",
                    "PASS" if ok else "FAIL",
                ]
            )
    out = [
        f"agent turns (read newest {READ_LIMIT} + write 2), {cfg.turns} timed turns per task,"
        " latency per turn in ms",
        render_table(
            ["backend", "layout", "turns", "errors", "turns/s", "p50", "p99", "max", "all stored"],
            rows,
        ),
        "",
        "target: multi-process p99 within 3x of the one-process p99",
        render_table(
            ["backend", "layouts", "p99 ms", "p99 ratio", "turns/s ratio", "target", "result"],
            checks,
        ),
        "",
    ]
    out += [f"{kind}: {res['server']}" for kind, res in results.items()]
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    parser = bench_parser(__doc__ or "")
    parser.add_argument("--turns", type=int, default=None, help="timed turns per task")
    args = parser.parse_args(argv)
    cfg = QUICK if args.quick else FULL
    if args.turns is not None:
        cfg = Config(turns=max(1, args.turns), layouts=cfg.layouts)
    return run_and_report(
        args,
        cfg,
        lambda: run_sqlite(cfg, args.sqlite_dir),
        lambda: run_postgres(cfg, args.pg_url),
        report,
    )


if __name__ == "__main__":
    sys.exit(main())
