"""Benchmark: editable history (SPEC 11) on long conversations.

Run from a checkout::

    python bench/editable.py [--backend sqlite|postgres|all] [--pg-url URL] [--quick]
                             [--big N] [--small N] [--read-small N] [--edit-size N]
                             [--commits N] [--reads N] [--loads N]
                             [--sqlite-dir DIR] [--json FILE]

It measures, in one run and on each backend:

(a) Commit near the end. A value is loaded once with ``store.edit(c)`` (that load is
    timed too, ``--loads`` times), then ``value.splice(n - 30, n - 20, ten_new,
    by="bench")`` and ``store.commit(value)`` run again and again on the same value (a
    commit leaves it saved and editable), on a conversation of ``--big`` entries
    (100,000) and one of ``--small`` (1,000), alternating between the two. The figure is
    the p50 and p99 of splice + commit (the splice alone, which does no I/O, is given
    too). Target: the 100k / 1k ratio of the p50 is at most 2x (SPEC 11: a commit costs
    O(changed entries + entries after the first changed position)).
(b) ``read(c, limit=20)`` of an edited conversation of ``--big`` written entries (a
    compaction-like splice of entries [1, 5000) into one summary, a splice of 10 entries
    into 5 in the middle and three ``edit_each`` rewrites of one middle entry, each
    committed) beside a plain one of ``--read-small`` (100) entries, alternating. p50 and
    p99; target: the p50 ratio is at most 1.3x (section 4's read cost holds on edited
    conversations).
(c) ``store.edit(c)`` of a conversation of ``--edit-size`` (10,000) entries beside
    ``store.read(c)`` of all of it, alternating: p50 of each and their ratio (no target:
    what building the value costs over the messages alone).

Conversations are built with ``store.write`` in batches of 1,000 on a store opened with
``durability="process"``; everything timed goes through a second store opened as a user
would, ``histstore.connect(url)`` with default options. Databases are temporary: an
SQLite file in a temporary directory; on Postgres a fresh database created and dropped
on the ``--pg-url`` server.
"""

from __future__ import annotations

import functools
import shutil
import sqlite3
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from _common import (
    bench_parser,
    chat_messages,
    median,
    percentile,
    pg_databases,
    pg_server,
    render_table,
    run_and_report,
)

import histstore  # importable once _common has put the checkout on sys.path

COMMIT_TARGET = 2.0
READ_TARGET = 1.3
READ_LIMIT = 20
BATCH = 1000
SPLICE_FROM_END = 30  # the splice replaces [n - 30, n - 20)
SPLICED = 10
COMPACTED = 5000  # the compaction-like splice replaces [1, 5000) with one summary
# (1 / 20 of the entries when there are fewer than 100,000)


@dataclass(frozen=True)
class Config:
    big: int  # entries of the large conversations, (a) and (b)
    small: int  # entries of the small one in (a)
    read_small: int  # entries of the small one in (b)
    edit_size: int  # entries of the conversation in (c)
    commits: int  # timed splice + commits per conversation
    reads: int  # timed reads per conversation
    loads: int  # timed edit() / read() per case
    warmup: int


FULL = Config(
    big=100_000,
    small=1_000,
    read_small=100,
    edit_size=10_000,
    commits=300,
    reads=2000,
    loads=20,
    warmup=10,
)
QUICK = replace(FULL, big=6000, small=300, edit_size=1000, commits=20, reads=50, loads=3, warmup=2)


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def stats(samples: Sequence[float]) -> dict[str, Any]:
    """p50 and p99 (microseconds) of ``samples`` (seconds), and how many there were."""
    return {
        "p50_us": percentile(samples, 50) * 1e6,
        "p99_us": percentile(samples, 99) * 1e6,
        "samples": len(samples),
    }


class Messages:
    """An endless supply of distinct chat messages (a pool of 1,000, numbered)."""

    def __init__(self) -> None:
        self.pool = chat_messages(1000)
        self.count = 0

    def take(self, n: int) -> list[dict[str, Any]]:
        out = []
        for _ in range(n):
            m = self.pool[self.count % len(self.pool)]
            out.append({"role": m["role"], "content": f"{self.count} {m['content']}"})
            self.count += 1
        return out


async def fill(store: histstore.Store, cid: str, n: int, messages: Messages) -> None:
    for lo in range(0, n, BATCH):
        await store.write(cid, messages.take(min(BATCH, n - lo)))


async def alternate(
    calls: dict[str, Callable[[], Awaitable[Any]]], rounds: int, warmup: int
) -> dict[str, list[float]]:
    """Each call's latencies (seconds) over ``rounds`` rounds, alternating which runs
    first; ``warmup`` untimed rounds before."""
    names = list(calls)
    for _ in range(warmup):
        for name in names:
            await calls[name]()
    samples: dict[str, list[float]] = {name: [] for name in names}
    for i in range(rounds):
        for name in names if i % 2 == 0 else names[::-1]:
            t0 = time.perf_counter()
            await calls[name]()
            samples[name].append(time.perf_counter() - t0)
    return samples


# ---------------------------------------------------------------------- (a) commit


async def bench_commit(store: histstore.Store, cids: dict[str, str], cfg: Config) -> dict[str, Any]:
    messages = Messages()
    sizes = {"small": cfg.small, "large": cfg.big}
    values: dict[str, histstore.Conversation] = {}
    loads: dict[str, list[float]] = {}
    for name, cid in cids.items():
        times = []
        for _ in range(max(1, cfg.loads // 4)):
            t0 = time.perf_counter()
            values[name] = await store.edit(cid)
            times.append(time.perf_counter() - t0)
        loads[name] = times
        if len(values[name].entries) != sizes[name]:
            raise RuntimeError(f"edit() gave {len(values[name].entries)} of {sizes[name]}")
        log(f"  store.edit() of {sizes[name]:,} entries: {median(times) * 1e3:,.1f} ms")
    splice_times: dict[str, list[float]] = {name: [] for name in cids}

    async def splice_commit(name: str) -> None:
        value, n = values[name], sizes[name]
        new = messages.take(SPLICED)  # every splice makes new entries
        t0 = time.perf_counter()
        value.splice(n - SPLICE_FROM_END, n - SPLICE_FROM_END + SPLICED, new, by="bench")
        splice_times[name].append(time.perf_counter() - t0)
        await store.commit(value)

    calls: dict[str, Callable[[], Awaitable[Any]]] = {
        name: functools.partial(splice_commit, name) for name in cids
    }
    samples = await alternate(calls, cfg.commits, cfg.warmup)
    result: dict[str, Any] = {"sizes": sizes}
    for name, cid in cids.items():
        value = values[name]
        stored = await store.read(cid, limit=SPLICE_FROM_END)
        if [m.content for m in stored] != [m.content for m in value.messages[-SPLICE_FROM_END:]]:
            raise RuntimeError(f"{name}: the stored tail is not the value's")
        if len(value.entries) != sizes[name] or value.unsaved:
            raise RuntimeError(f"{name}: the value holds {len(value.entries)} entries")
        timed = splice_times[name][cfg.warmup :]
        result[name] = {
            **stats(samples[name]),
            "splice_p50_us": percentile(timed, 50) * 1e6,
            "edit_ms": median(loads[name]) * 1e3,
            "edit_samples": len(loads[name]),
            "revision": value.revision,
        }
        log(
            f"  splice + commit on {sizes[name]:,} entries: p50"
            f" {result[name]['p50_us']:,.0f} us, p99 {result[name]['p99_us']:,.0f} us"
            f" (splice alone {result[name]['splice_p50_us']:,.0f} us)"
        )
    s, g = result["small"], result["large"]
    result["p50_ratio"] = g["p50_us"] / s["p50_us"]
    result["p99_ratio"] = g["p99_us"] / s["p99_us"]
    result["passed"] = result["p50_ratio"] <= COMMIT_TARGET
    return result


# ---------------------------------------------------------------------- (b) read


async def edit_history(store: histstore.Store, cid: str, messages: Messages) -> int:
    """The edits of (b), each committed; returns the entries left."""
    value = await store.edit(cid)
    compacted = min(COMPACTED, len(value.entries) // 20)
    summary = {"role": "user", "content": "Summary of the conversation so far: " + "x " * 200}
    value.splice(1, compacted, [summary], by="bench:compact")
    await store.commit(value)
    mid = len(value.entries) // 2
    value.splice(mid, mid + 10, messages.take(5), by="bench")
    await store.commit(value)
    for k in range(3):
        target = value.entry_id(mid + 100 * (k + 1))

        def rewrite(entry: histstore.Entry, target: int = target) -> dict[str, Any] | None:
            if entry.entry_id != target:
                return None
            return {"role": entry.message.role, "content": f"rewritten: {entry.message.content}"}

        if not value.edit_each(rewrite, by="bench"):
            raise RuntimeError("edit_each rewrote nothing")
        await store.commit(value)
    return len(value.entries)


async def bench_read(store: histstore.Store, cids: dict[str, str], cfg: Config) -> dict[str, Any]:
    result: dict[str, Any] = {"sizes": {"small": cfg.read_small, "large": cfg.big}}
    for name, cid in cids.items():
        got = await store.read(cid, limit=READ_LIMIT)
        if len(got) != READ_LIMIT:
            raise RuntimeError(f"{name}: read {len(got)} messages")
    value = await store.edit(cids["large"])
    tail = [m.content for m in value.messages[-READ_LIMIT:]]
    if [m.content for m in await store.read(cids["large"], limit=READ_LIMIT)] != tail:
        raise RuntimeError("read(limit=20) of the edited conversation is not its tail")
    result["entries"] = len(value.entries)

    def reader(cid: str) -> Callable[[], Awaitable[Any]]:
        return lambda: store.read(cid, limit=READ_LIMIT)

    samples = await alternate(
        {name: reader(cid) for name, cid in cids.items()}, cfg.reads, cfg.warmup * 10
    )
    for name in cids:
        result[name] = stats(samples[name])
    s, g = result["small"], result["large"]
    result["p50_ratio"] = g["p50_us"] / s["p50_us"]
    result["p99_ratio"] = g["p99_us"] / s["p99_us"]
    result["passed"] = result["p50_ratio"] <= READ_TARGET
    log(
        f"  read(limit=20): {cfg.read_small:,} entries p50 {s['p50_us']:,.0f} us,"
        f" edited {result['entries']:,} p50 {g['p50_us']:,.0f} us"
    )
    return result


# ---------------------------------------------------------------------- (c) edit vs read


async def bench_load(store: histstore.Store, cid: str, cfg: Config) -> dict[str, Any]:
    value = await store.edit(cid)
    every = await store.read(cid)
    if len(value.entries) != cfg.edit_size or len(every) != cfg.edit_size:
        raise RuntimeError(f"edit() {len(value.entries)}, read() {len(every)} entries")
    samples = await alternate(
        {"read": lambda: store.read(cid), "edit": lambda: store.edit(cid)},
        cfg.loads,
        max(1, cfg.warmup // 5),
    )
    result: dict[str, Any] = {"entries": cfg.edit_size}
    for name, values in samples.items():
        result[name] = stats(values)
    result["ratio"] = result["edit"]["p50_us"] / result["read"]["p50_us"]
    log(
        f"  {cfg.edit_size:,} entries: read() p50 {result['read']['p50_us'] / 1e3:,.1f} ms,"
        f" edit() p50 {result['edit']['p50_us'] / 1e3:,.1f} ms"
    )
    return result


# ---------------------------------------------------------------------- per backend


async def bench_backend(kind: str, url: str, cfg: Config) -> dict[str, Any]:
    messages = Messages()
    commit_cids = {"small": "commit-small", "large": "commit-large"}
    read_cids = {"small": "read-small", "large": "read-large"}
    load_cid = "load"
    log(f"{kind}: building the conversations")
    started = time.perf_counter()
    async with histstore.connect(url, migrate=True, durability="process") as loader:
        await fill(loader, commit_cids["small"], cfg.small, messages)
        await fill(loader, commit_cids["large"], cfg.big, messages)
        await fill(loader, read_cids["small"], cfg.read_small, messages)
        await fill(loader, read_cids["large"], cfg.big, messages)
        await fill(loader, load_cid, cfg.edit_size, messages)
        built = time.perf_counter() - started
        log(f"  written in {built:,.1f} s; editing {read_cids['large']!r}")
        started = time.perf_counter()
        await edit_history(loader, read_cids["large"], messages)
        edited = time.perf_counter() - started
        log(f"  edited in {edited:,.1f} s")
    result: dict[str, Any] = {"build_s": built, "edit_history_s": edited}
    async with histstore.connect(url) as store:
        log(f"{kind}: (a) splice + commit near the end")
        result["commit"] = await bench_commit(store, commit_cids, cfg)
        log(f"{kind}: (b) read(limit=20) of an edited conversation")
        result["read"] = await bench_read(store, read_cids, cfg)
        log(f"{kind}: (c) edit() beside read() of everything")
        result["load"] = await bench_load(store, load_cid, cfg)
    return result


async def run_sqlite(cfg: Config, directory: str | None) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="histstore-bench-editable-", dir=directory))
    try:
        result = await bench_backend("sqlite", str(tmp / "editable.db"), cfg)
        result["server"] = f"SQLite {sqlite3.sqlite_version}, files in {tmp}"
        return result
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


async def run_postgres(cfg: Config, admin_url: str) -> dict[str, Any]:
    async with pg_databases(admin_url, ["editable"]) as urls:
        result = await bench_backend("postgres", urls["editable"], cfg)
        result["server"] = await pg_server(urls["editable"])
        return result


# ---------------------------------------------------------------------- report


def _us(value: float) -> str:
    return f"{value:,.0f} us" if value < 10_000 else f"{value / 1e3:,.1f} ms"


def report(results: dict[str, dict[str, Any]], cfg: Config) -> str:
    rows = []
    for kind, res in results.items():
        c, r, lo = res["commit"], res["read"], res["load"]
        small, big = f"{cfg.small:,}", f"{cfg.big:,}"
        ok = "PASS" if c["passed"] else "FAIL"
        rows += [
            [
                kind,
                f"splice {SPLICED} at n-{SPLICE_FROM_END} + commit, p50 ({small} vs {big})",
                _us(c["small"]["p50_us"]),
                _us(c["large"]["p50_us"]),
                f"{c['p50_ratio']:.2f}x",
                f"<= {COMMIT_TARGET:g}x",
                ok,
            ],
            [
                kind,
                "  same, p99",
                _us(c["small"]["p99_us"]),
                _us(c["large"]["p99_us"]),
                f"{c['p99_ratio']:.2f}x",
                "",
                "",
            ],
            [
                kind,
                "  of which the splice alone (no I/O), p50",
                _us(c["small"]["splice_p50_us"]),
                _us(c["large"]["splice_p50_us"]),
                f"{c['large']['splice_p50_us'] / c['small']['splice_p50_us']:.2f}x",
                "",
                "",
            ],
            [
                kind,
                f"store.edit() ({small} vs {big}), median",
                _us(c["small"]["edit_ms"] * 1e3),
                _us(c["large"]["edit_ms"] * 1e3),
                f"{c['large']['edit_ms'] / c['small']['edit_ms']:.2f}x",
                "",
                "",
            ],
            [
                kind,
                f"read(limit=20), p50 ({cfg.read_small:,} vs edited {r['entries']:,})",
                _us(r["small"]["p50_us"]),
                _us(r["large"]["p50_us"]),
                f"{r['p50_ratio']:.2f}x",
                f"<= {READ_TARGET:g}x",
                "PASS" if r["passed"] else "FAIL",
            ],
            [
                kind,
                "  same, p99",
                _us(r["small"]["p99_us"]),
                _us(r["large"]["p99_us"]),
                f"{r['p99_ratio']:.2f}x",
                "",
                "",
            ],
            [
                kind,
                f"{lo['entries']:,} entries: read() vs edit(), p50",
                _us(lo["read"]["p50_us"]),
                _us(lo["edit"]["p50_us"]),
                f"{lo['ratio']:.2f}x",
                "",
                "",
            ],
        ]
    out = [
        "Editable history: latency (each pair timed alternately in one run; ratio = right / left)"
    ]
    headers = ["backend", "measurement", "left", "right", "ratio", "target", "result"]
    out.append(render_table(headers, rows))
    out.append("")
    for kind, res in results.items():
        c = res["commit"]
        out.append(
            f"{kind}: {res['server']}; built in {res['build_s']:,.1f} s, edits of (b) in"
            f" {res['edit_history_s']:,.1f} s; {c['small']['samples']} commits per size,"
            f" {res['read']['small']['samples']} reads per size,"
            f" {res['load']['edit']['samples']} edit()/read() each"
        )
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    parser = bench_parser(__doc__ or "")
    parser.add_argument("--big", type=int, default=None, help="large conversations (100,000)")
    parser.add_argument("--small", type=int, default=None, help="small one in (a) (1,000)")
    parser.add_argument("--read-small", type=int, default=None, help="small one in (b) (100)")
    parser.add_argument("--edit-size", type=int, default=None, help="conversation in (c)")
    parser.add_argument("--commits", type=int, default=None, help="timed commits per size")
    parser.add_argument("--reads", type=int, default=None, help="timed reads per size")
    parser.add_argument("--loads", type=int, default=None, help="timed edit()/read() in (c)")
    args = parser.parse_args(argv)
    cfg = QUICK if args.quick else FULL
    for name in ("big", "small", "read_small", "edit_size", "commits", "reads", "loads"):
        if getattr(args, name) is not None:
            cfg = replace(cfg, **{name: max(1, getattr(args, name))})
    if cfg.big < 1000 or min(cfg.small, cfg.read_small) < SPLICE_FROM_END:
        parser.error(f"--big must be at least 1,000; the others at least {SPLICE_FROM_END}")
    return run_and_report(
        args,
        cfg,
        lambda: run_sqlite(cfg, args.sqlite_dir),
        lambda: run_postgres(cfg, args.pg_url),
        report,
    )


if __name__ == "__main__":
    sys.exit(main())
