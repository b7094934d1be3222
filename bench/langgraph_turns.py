"""Benchmark: a LangGraph thread's bytes per turn and the read of its newest checkpoint, as
the thread grows from 50 to 5,000 chat turns.

Each turn is two checkpoints, as a chat graph makes them: the user's message appended
to the ``messages`` channel, then the model's (LangChain messages of about 300
characters of random words each, so that compression hides nothing). Every thread is
written through the saver's own ``aput`` into a database of its own, and its size is
that database's growth (SQLite: the file after ``VACUUM``; PostgreSQL: the saver's
tables after ``VACUUM FULL``), divided by the turns. The read is ``aget_tuple`` of the
thread's newest checkpoint (what LangGraph does before each run), made by a fresh
process that opens the database and reads the thread with a new saver, as an
application starting a run would (the writing process's objects would otherwise weigh
on the reads through the garbage collector); ``--rounds`` such processes per thread,
histstore's and LangGraph's in turn, and the median of their figures. A process's time
is the mean of ``--reads`` reads, or of as many as ``--read-seconds`` take if more: a
read allocates an object or more per message, and the collector's full passes, which
such allocations cause, come once every few reads of a large thread but once in dozens
of a small one, so a median would count them at one size and not at the other. Beside
it, ``decode`` is the time the saver's serializer takes to decode the same messages from
one blob, as LangGraph's own savers store them: the floor that any saver's read of that
checkpoint pays. LangGraph's own savers (``AsyncSqliteSaver``, ``AsyncPostgresSaver``)
store every checkpoint's whole list, so their storage grows with the square of the
turns: they run up to 500 turns.

Targets for histstore: bytes per turn at the largest size at most 1.3x those at 50
turns; the read at 500 turns at most 1.2x LangGraph's saver's on the same backend; the
read per message at the largest size at most 1.2x that at 500 turns.

    python bench/langgraph_turns.py [--backend sqlite|postgres|all] [--pg-url URL]
                                    [--quick] [--turns 50,500,5000] [--reads N]
                                    [--read-seconds S] [--rounds N]
                                    [--sqlite-dir DIR] [--json FILE]
"""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from _common import asyncpg_kwargs, bench_parser, median, pg_databases, render_table

# Named like the package it measures: drop its folder from sys.path (see langgraph.py).
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage  # noqa: E402
from langgraph.checkpoint.base import BaseCheckpointSaver  # noqa: E402
from langgraph.checkpoint.conformance.test_utils import (  # noqa: E402
    generate_checkpoint,
    generate_metadata,
)

import histstore  # noqa: E402
from histstore.integrations.langgraph import HiststoreSaver  # noqa: E402

_SCRIPT = str(Path(__file__).resolve())
LANGGRAPH_MAX_TURNS = 500
"""The largest thread LangGraph's own savers are given (their storage is quadratic)."""
BYTES_TARGET = 1.3
READ_TARGET = 1.2

_RNG_WORDS = random.Random(11)
_WORDS = [
    "".join(_RNG_WORDS.choices("abcdefghijklmnopqrstuvwxyz", k=_RNG_WORDS.randint(2, 10)))
    for _ in range(20_000)
]


def _text(rng: random.Random, size: int = 300) -> str:
    words: list[str] = []
    length = 0
    while length < size:
        word = rng.choice(_WORDS)
        words.append(word)
        length += len(word) + 1
    return " ".join(words)


async def write_thread(saver: BaseCheckpointSaver[Any], turns: int) -> str:
    """A new thread of ``turns`` chat turns (two checkpoints each); its id."""
    rng = random.Random(turns)
    thread = f"bench-{uuid.uuid4().hex}"
    parent: str | None = None
    version: Any = None
    messages: list[BaseMessage] = []
    for step in range(2 * turns):
        kind = HumanMessage if step % 2 == 0 else AIMessage
        messages = [*messages, kind(content=_text(rng), id=str(uuid.uuid4()))]
        version = saver.get_next_version(version, None)
        cp = generate_checkpoint(
            channel_values={"messages": messages, "step": step},
            channel_versions={"messages": version, "step": version},
        )
        configurable: dict[str, Any] = {"thread_id": thread, "checkpoint_ns": ""}
        if parent is not None:
            configurable["checkpoint_id"] = parent
        await saver.aput(
            {"configurable": configurable},
            cp,
            generate_metadata(step=step, run_id="bench"),
            {"messages": version, "step": version},
        )
        parent = cp["id"]
    return thread


async def read_us(
    saver: BaseCheckpointSaver[Any], thread: str, turns: int, reads: int, seconds: float
) -> dict[str, float]:
    """The mean and median times of ``aget_tuple`` of the thread's newest checkpoint, and
    the serializer's decode of its messages from one blob (the floor), in µs."""
    config: Any = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
    first = await saver.aget_tuple(config)
    assert first is not None
    messages = first.checkpoint["channel_values"]["messages"]
    assert len(messages) == 2 * turns
    times = await _timed(lambda: saver.aget_tuple(config), reads, seconds)
    blob = saver.serde.dumps_typed(messages)
    del first, messages

    async def decode() -> Any:
        return saver.serde.loads_typed(blob)

    floor = await _timed(decode, reads, seconds)
    return {
        "read_us": statistics.fmean(times) * 1e6,
        "read_p50_us": median(times) * 1e6,
        "decode_us": statistics.fmean(floor) * 1e6,
    }


async def _timed(call: Callable[[], Awaitable[Any]], reads: int, seconds: float) -> list[float]:
    """The times of at least ``reads`` calls, and of more until ``seconds`` have passed."""
    times: list[float] = []
    until = time.perf_counter() + seconds
    while len(times) < reads or time.perf_counter() < until:
        started = time.perf_counter()
        await call()
        times.append(time.perf_counter() - started)
    return times


Size = Callable[[], Awaitable[int]]


Reads = tuple[int, float, int]
"""The fewest reads timed per thread, the seconds they take at least, and how many
reading processes (rounds) time them."""


async def measure(
    saver: BaseCheckpointSaver[Any], size: Size, turns: int, reads: Reads, reader: list[str]
) -> dict[str, Any]:
    """Write a thread of ``turns`` with ``saver``: its bytes per turn and write time, and
    what a reading process is to open (``reader``: the saver's kind and database; see
    ``read_rounds``)."""
    before = await size()
    started = time.perf_counter()
    thread = await write_thread(saver, turns)
    write_s = time.perf_counter() - started
    grown = await size() - before
    spec = ",".join([*reader, thread, str(turns), str(reads[0]), str(reads[1])])
    return {"bytes_per_turn": grown / turns, "write_s": write_s, "reader": spec}


async def read_rounds(out: dict[str, Any], rounds: int) -> None:
    """Time the reads of every thread ``out`` holds: in each round a fresh process per
    thread, the savers of one size in turn, so that both sides see the same moments of
    the machine; each figure is the median over the rounds."""
    sizes = sorted({n for by_size in out.values() for n in by_size})
    for turns in sizes:
        results = [r[turns] for r in out.values() if turns in r]
        seen: list[list[dict[str, float]]] = [[] for _ in results]
        for _ in range(rounds):
            for got, r in zip(seen, results, strict=True):
                child = await asyncio.create_subprocess_exec(
                    sys.executable, _SCRIPT, "--read-child", r["reader"],
                    stdout=asyncio.subprocess.PIPE,
                )  # fmt: skip
                text, _ = await child.communicate()
                if child.returncode != 0:
                    raise RuntimeError(f"the reading process failed ({child.returncode})")
                got.append(json.loads(text))
        for got, r in zip(seen, results, strict=True):
            del r["reader"]
            for key in got[0]:
                r[key] = median([g[key] for g in got])


async def read_child(spec: str) -> dict[str, float]:
    """In the reading process: open the saver ``spec`` names, time its reads."""
    kind, target, thread, turns_, reads_, seconds_ = spec.split(",")
    turns, reads, seconds = int(turns_), int(reads_), float(seconds_)
    if kind == "histstore":
        async with histstore.connect(target) as store:
            return await read_us(HiststoreSaver(store), thread, turns, reads, seconds)
    if kind == "sqlite":
        from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

        async with AsyncSqliteSaver.from_conn_string(target) as lg:
            return await read_us(lg, thread, turns, reads, seconds)
    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

    async with AsyncPostgresSaver.from_conn_string(target) as pg:
        return await read_us(pg, thread, turns, reads, seconds)


def sqlite_size(path: Path) -> Size:
    def vacuumed() -> int:
        import sqlite3

        conn = sqlite3.connect(path)
        try:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            conn.execute("VACUUM")
        finally:
            conn.close()
        return path.stat().st_size

    async def size() -> int:
        return await asyncio.to_thread(vacuumed)

    return size


def pg_size(url: str, like: str) -> Size:
    async def size() -> int:
        import asyncpg

        conn = await asyncpg.connect(**asyncpg_kwargs(url))
        try:
            await conn.execute("VACUUM FULL")
            got = await conn.fetchval(
                "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c"
                " JOIN pg_namespace n ON n.oid = c.relnamespace"
                " WHERE n.nspname = 'public' AND c.relkind = 'r' AND c.relname LIKE $1",
                like,
            )
        finally:
            await conn.close()
        return int(got)

    return size


async def run_sqlite(directory: str | None, sizes: list[int], reads: Reads) -> dict[str, Any]:
    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

    out: dict[str, Any] = {"histstore": {}, "langgraph": {}}
    with tempfile.TemporaryDirectory(prefix="histstore-bench-lgt-", dir=directory) as tmp:
        for turns in sizes:
            path = Path(tmp) / f"hs-{turns}.db"
            async with histstore.connect(path) as store:
                saver = HiststoreSaver(store)
                out["histstore"][turns] = await measure(
                    saver, sqlite_size(path), turns, reads, ["histstore", str(path)]
                )
            if turns > LANGGRAPH_MAX_TURNS:
                continue
            path = Path(tmp) / f"lg-{turns}.db"
            async with AsyncSqliteSaver.from_conn_string(str(path)) as lg:
                await lg.setup()
                out["langgraph"][turns] = await measure(
                    lg, sqlite_size(path), turns, reads, ["sqlite", str(path)]
                )
        await read_rounds(out, reads[2])
    return out


async def run_postgres(admin_url: str, sizes: list[int], reads: Reads) -> dict[str, Any]:
    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

    out: dict[str, Any] = {"histstore": {}, "langgraph": {}}
    names = [f"{kind}{n}" for n in sizes for kind in ("hs", "lg")]
    async with pg_databases(admin_url, names) as urls:
        for turns in sizes:
            url = urls[f"hs{turns}"]
            async with histstore.connect(url, migrate=True) as store:
                size = pg_size(url, "histstore_checkpoint%")
                out["histstore"][turns] = await measure(
                    HiststoreSaver(store), size, turns, reads, ["histstore", url]
                )
            if turns > LANGGRAPH_MAX_TURNS:
                continue
            url = urls[f"lg{turns}"]
            async with AsyncPostgresSaver.from_conn_string(url) as lg:
                await lg.setup()
                size = pg_size(url, "checkpoint%")
                out["langgraph"][turns] = await measure(lg, size, turns, reads, ["postgres", url])
        await read_rounds(out, reads[2])
    return out


def verdicts(result: dict[str, Any], sizes: list[int]) -> list[str]:
    """The targets' checks for one backend, as lines."""
    hs, lg = result["histstore"], result["langgraph"]
    small, large = sizes[0], sizes[-1]
    lines = []
    ratio = hs[large]["bytes_per_turn"] / hs[small]["bytes_per_turn"]
    ok = "PASS" if ratio <= BYTES_TARGET else "FAIL"
    lines.append(f"bytes per turn {large:,} / {small:,} turns: {ratio:.2f}x ({ok})")
    middle = max((n for n in sizes if n <= LANGGRAPH_MAX_TURNS and n in lg), default=None)
    if middle is not None:
        ratio = hs[middle]["read_us"] / lg[middle]["read_us"]
        ok = "PASS" if ratio <= READ_TARGET else "FAIL"
        lines.append(f"read at {middle:,} turns, histstore / langgraph: {ratio:.2f}x ({ok})")
        if large > middle:
            per = (hs[large]["read_us"] / large) / (hs[middle]["read_us"] / middle)
            ok = "PASS" if per <= READ_TARGET else "FAIL"
            floor = (hs[large]["decode_us"] / large) / (hs[middle]["decode_us"] / middle)
            lines.append(
                f"read per message {large:,} / {middle:,} turns: {per:.2f}x ({ok});"
                f" the serializer's decode alone: {floor:.2f}x"
            )
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    if argv is None and len(sys.argv) == 3 and sys.argv[1] == "--read-child":
        print(json.dumps(asyncio.run(read_child(sys.argv[2]))))
        return 0
    parser = bench_parser(__doc__ or "")
    parser.add_argument("--turns", default=None, help="comma-separated thread sizes, in turns")
    parser.add_argument("--reads", type=int, default=None, help="fewest reads timed per thread")
    parser.add_argument(
        "--rounds", type=int, default=None, help="reading processes per thread, alternating"
    )
    parser.add_argument(
        "--read-seconds",
        type=float,
        default=None,
        help="seconds of reads timed per thread, at least",
    )
    args = parser.parse_args(argv)
    default = "20,100,400" if args.quick else "50,500,5000"
    sizes = sorted(int(n) for n in (args.turns or default).split(","))
    reads = (
        args.reads or (5 if args.quick else 30),
        args.read_seconds or (0.2 if args.quick else 3.0),
        args.rounds or (1 if args.quick else 3),
    )
    kinds = ["sqlite", "postgres"] if args.backend == "all" else [args.backend]

    async def run_all() -> dict[str, Any]:
        out: dict[str, Any] = {}
        for kind in kinds:
            if kind == "sqlite":
                out[kind] = await run_sqlite(args.sqlite_dir, sizes, reads)
            else:
                out[kind] = await run_postgres(args.pg_url, sizes, reads)
        return out

    results = asyncio.run(run_all())
    rows = []
    for kind, by_saver in results.items():
        for saver, by_size in by_saver.items():
            for turns, r in sorted(by_size.items()):
                rows.append(
                    [
                        kind,
                        saver,
                        f"{turns:,}",
                        f"{r['bytes_per_turn']:,.0f}",
                        f"{r['read_us']:,.0f}",
                        f"{r['read_p50_us']:,.0f}",
                        f"{r['read_us'] / (2 * turns):,.2f}",
                        f"{r['decode_us'] / (2 * turns):,.2f}",
                        f"{r['write_s']:.1f}",
                    ]
                )
    headers = [
        "backend", "saver", "turns", "bytes/turn", "read us", "p50 us", "read us/msg",
        "decode us/msg", "write s",
    ]  # fmt: skip
    print(
        "a chat thread's storage and its newest checkpoint's read (median over"
        f" {reads[2]} reading processes, alternating, of the mean of at least {reads[0]}"
        f" reads and {reads[1]:g} s each; decode: the messages from one blob)"
    )
    print(render_table(headers, rows))
    for kind, result in results.items():
        for line in verdicts(result, sizes):
            print(f"{kind}: {line}")
    if args.json:
        Path(args.json).write_text(json.dumps({"sizes": sizes, "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
