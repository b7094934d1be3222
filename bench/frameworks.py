"""Benchmark: histstore's LangGraph checkpointer against LangGraph's own, side by side.

For each backend, in one run: histstore's ``HiststoreSaver`` and LangGraph's own saver
(``AsyncSqliteSaver`` of langgraph-checkpoint-sqlite, ``AsyncPostgresSaver`` of
langgraph-checkpoint-postgres) on fresh databases, timing

* ``aput`` (with ``aput_writes`` of the step's pending write): one step of a thread;
* ``aget_tuple`` of the thread's newest checkpoint (what every LangGraph run starts with);
* ``alist(limit=10)``: the thread's ten newest checkpoints (state history);

on threads of 10 and of 1,000 checkpoints, reporting the mean and p99 of each and the
ratio of the means (histstore / LangGraph; target <= 1.0). The savers take turns at
each sample. Before a case is timed, what the process holds is frozen for the garbage
collector (``gc.freeze()``), so a collection walks only what the timed calls allocated:
otherwise a full collection walks the whole process (about 70 ms here: the libraries,
the harness's messages) and lands on whichever saver's call crosses the threshold, which
with 200 samples moves a mean by about 10% either way (``--no-freeze`` to see it). Two
thread shapes:

* ``chat``: every checkpoint holds the whole conversation (LangChain messages, about
  200 bytes each), one message longer than the previous one, as ``add_messages`` makes
  it: the thread of 1,000 checkpoints ends with 1,000 messages;
* ``window``: every checkpoint holds the newest 20 messages (as ``bench/langgraph.py``);
  nothing extends the previous value.

Then storage: a real graph (``StateGraph(MessagesState)``, one node answering) run for
200 chat turns on a thread with each saver; the database's size per thread, minus that
of the empty database (SQLite: the file after ``VACUUM``; Postgres: the tables'
``pg_total_relation_size`` after ``VACUUM FULL``). Target: histstore <= 0.25x.

    python bench/frameworks.py [--backend sqlite|postgres|all] [--pg-url URL] [--quick]
                               [--samples N] [--sqlite-dir DIR] [--json FILE]

Each op is sampled for about 20 s per case (at least 20 samples). The default run takes
about 4 minutes on SQLite and 10 on Postgres (LangGraph's savers write and read the
whole conversation at every checkpoint); ``--quick`` uses threads of 10 and 100.
"""

from __future__ import annotations

import gc
import sqlite3
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _common import (
    asyncpg_kwargs,
    bench_parser,
    chat_messages,
    percentile,
    pg_databases,
    pg_server,
    render_table,
    run_and_report,
)

# ``bench/langgraph.py`` is named like the package it measures and this folder comes
# first on sys.path when run as a script: drop it (``_common`` is in).
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

OPS = ("aput+aput_writes", "aget_tuple", "alist(limit=10)")
SPEED_TARGET = 1.0
STORAGE_TARGET = 0.25
WINDOW = 20
BUDGET_S = 20.0
"""Seconds of sampling per op and case, after at least ``MIN_SAMPLES`` samples (the
reads of a 1,000-message thread take LangGraph's savers a tenth of a second each)."""
MIN_SAMPLES = 20
POOL = [
    (HumanMessage if m["role"] == "user" else AIMessage)(content=m["content"], id=f"m{i}")
    for i, m in enumerate(chat_messages(1200))
]


@dataclass(frozen=True)
class Config:
    sizes: tuple[int, ...]
    samples: int
    shapes: tuple[str, ...]
    turns: int
    threads: int
    freeze: bool = True


Saver = BaseCheckpointSaver[Any]


class Thread:
    """A thread being written through one saver, one checkpoint per step."""

    def __init__(self, saver: Saver, shape: str) -> None:
        self.saver = saver
        self.shape = shape
        self.id = f"bench-{uuid.uuid4().hex}"
        self.parent: str | None = None
        self.version: Any = None
        self.messages: list[BaseMessage] = []
        self.steps = 0

    def config(self) -> Any:
        configurable: dict[str, Any] = {"thread_id": self.id, "checkpoint_ns": ""}
        if self.parent is not None:
            configurable["checkpoint_id"] = self.parent
        return {"configurable": configurable}

    async def step(self) -> None:
        """One checkpoint after the previous one, then the step's pending write."""
        new = POOL[self.steps % len(POOL)]
        if self.shape == "chat":
            self.messages = [*self.messages, new]  # a new list of the same items
        else:
            start = self.steps % (len(POOL) - WINDOW)
            self.messages = POOL[start : start + WINDOW]
        self.version = self.saver.get_next_version(self.version, None)
        cp = generate_checkpoint(
            channel_values={"messages": self.messages, "step": self.steps},
            channel_versions={"messages": self.version, "step": self.version},
        )
        stored = await self.saver.aput(
            self.config(),
            cp,
            generate_metadata(step=self.steps, run_id="bench"),
            {"messages": self.version, "step": self.version},
        )
        await self.saver.aput_writes(stored, [("messages", [new])], str(uuid.uuid4()))
        self.parent = cp["id"]
        self.steps += 1

    async def fill(self, count: int) -> Thread:
        while self.steps < count:
            await self.step()
        return self


async def timed(call: Callable[[], Awaitable[Any]]) -> float:
    started = time.perf_counter()
    await call()
    return time.perf_counter() - started


async def measure(
    savers: dict[str, Saver], shape: str, size: int, samples: int, freeze: bool = True
) -> dict[str, dict[str, Any]]:
    """Every op's mean and p99 per saver on threads of ``size`` checkpoints. The savers
    take turns at each sample (in alternating order), so a machine busy with other work
    slows both alike."""
    names = list(savers)
    times: dict[str, dict[str, list[float]]] = {n: {op: [] for op in OPS} for n in names}
    threads = {n: await Thread(s, shape).fill(size) for n, s in savers.items()}

    def latest(name: str) -> Any:
        return {"configurable": {"thread_id": threads[name].id, "checkpoint_ns": ""}}

    async def get(name: str) -> None:
        got = await savers[name].aget_tuple(latest(name))
        assert got is not None
        assert len(got.checkpoint["channel_values"]["messages"]) == len(threads[name].messages)

    async def listing(name: str) -> None:
        found = [t async for t in savers[name].alist(latest(name), limit=10)]
        assert len(found) == min(10, size)

    reads = {"aget_tuple": get, "alist(limit=10)": listing}
    for _ in range(max(3, samples // 10)):  # warm-up
        for name in names:
            for read in reads.values():
                await read(name)
    if freeze:  # see the module's docstring
        gc.collect()
        gc.freeze()
    for op, read in reads.items():
        deadline = time.perf_counter() + BUDGET_S
        for i in range(samples):
            for name in names if i % 2 == 0 else names[::-1]:
                times[name][op].append(await timed(lambda read=read, name=name: read(name)))
            if i + 1 >= MIN_SAMPLES and time.perf_counter() > deadline:
                break
    # Steps of threads of about ``size`` checkpoints: a thread of 10 gives one step,
    # a longer one a tenth of its size before a new thread is filled. A saver's new
    # thread is filled right before its own next timed step: filling every saver's
    # thread first would leave the saver filled first idle while the other fills, and
    # a call after a pause pays for a cold start (thread wake-ups) the other saver's
    # call, right after its own fill, never pays.
    per_thread = max(1, size // 10)
    done = 0
    deadline = time.perf_counter() + BUDGET_S
    while done < samples and (done < MIN_SAMPLES or time.perf_counter() < deadline):
        for name in names if done % 2 == 0 else names[::-1]:
            if threads[name].steps >= size + per_thread:
                threads[name] = await Thread(savers[name], shape).fill(size)
            times[name][OPS[0]].append(await timed(threads[name].step))
        done += 1
    if freeze:
        gc.unfreeze()
    return {
        name: {
            op: {"mean_us": sum(t) / len(t) * 1e6, "p99_us": percentile(t, 99) * 1e6}
            for op, t in by_op.items()
        }
        for name, by_op in times.items()
    }


async def chat_turns(saver: Saver, turns: int, threads: int) -> None:
    """``turns`` turns of a chat graph on each of ``threads`` threads."""
    from langgraph.graph import START, MessagesState, StateGraph

    def answer(state: MessagesState) -> dict[str, Any]:
        n = len(state["messages"])
        return {"messages": [AIMessage(content=POOL[n % len(POOL)].content)]}

    builder = StateGraph(MessagesState)
    builder.add_node("answer", answer)
    builder.add_edge(START, "answer")
    graph = builder.compile(checkpointer=saver)
    for _ in range(threads):
        config: Any = {"configurable": {"thread_id": f"chat-{uuid.uuid4().hex}"}}
        for turn in range(turns):
            message = HumanMessage(content=POOL[(2 * turn) % len(POOL)].content)
            await graph.ainvoke({"messages": [message]}, config)


def sqlite_bytes(path: Path) -> int:
    conn = sqlite3.connect(path)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        conn.execute("VACUUM")
    finally:
        conn.close()
    return path.stat().st_size


async def pg_bytes(url: str, tables: Sequence[str]) -> int:
    import asyncpg

    conn = await asyncpg.connect(**asyncpg_kwargs(url))
    try:
        await conn.execute(f"VACUUM FULL {', '.join(tables)}")
        total = await conn.fetchval(
            "SELECT sum(pg_total_relation_size(t::regclass)) FROM unnest($1::text[]) AS t",
            list(tables),
        )
    finally:
        await conn.close()
    return int(total)


HS_TABLES = [
    "histstore_checkpoint_threads",
    "histstore_checkpoints",
    "histstore_checkpoint_blobs",
    "histstore_checkpoint_channels",
    "histstore_checkpoint_writes",
]
LG_TABLES = ["checkpoints", "checkpoint_blobs", "checkpoint_writes", "checkpoint_migrations"]


@asynccontextmanager
async def sqlite_savers(directory: Path) -> AsyncIterator[dict[str, Saver]]:
    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

    async with (
        histstore.connect(directory / "histstore.db") as store,
        AsyncSqliteSaver.from_conn_string(str(directory / "lg.db")) as lg,
    ):
        await lg.setup()
        yield {"histstore": HiststoreSaver(store), "langgraph": lg}


@asynccontextmanager
async def pg_savers(urls: dict[str, str]) -> AsyncIterator[dict[str, Saver]]:
    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

    async with (
        histstore.connect(urls["hs"], migrate=True) as store,
        AsyncPostgresSaver.from_conn_string(urls["lg"]) as lg,
    ):
        await lg.setup()
        yield {"histstore": HiststoreSaver(store), "langgraph": lg}


async def speed(savers: dict[str, Saver], cfg: Config) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for shape in cfg.shapes:
        for size in cfg.sizes:
            out[f"{shape}/{size}"] = await measure(savers, shape, size, cfg.samples, cfg.freeze)
    return out


async def run_sqlite(directory: str | None, cfg: Config) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="histstore-bench-fw-", dir=directory) as tmp:
        root = Path(tmp)
        speed_dir, size_dir = root / "speed", root / "size"
        speed_dir.mkdir()
        size_dir.mkdir()
        async with sqlite_savers(speed_dir) as savers:
            result: dict[str, Any] = {"speed": await speed(savers, cfg)}
        async with sqlite_savers(size_dir):
            pass
        empty = {n: sqlite_bytes(size_dir / f"{n}.db") for n in ("histstore", "lg")}
        async with sqlite_savers(size_dir) as savers:
            for saver in savers.values():
                await chat_turns(saver, cfg.turns, cfg.threads)
        full = {n: sqlite_bytes(size_dir / f"{n}.db") for n in ("histstore", "lg")}
    result["bytes_per_thread"] = {
        "histstore": (full["histstore"] - empty["histstore"]) / cfg.threads,
        "langgraph": (full["lg"] - empty["lg"]) / cfg.threads,
    }
    return result


async def run_postgres(admin_url: str, cfg: Config) -> dict[str, Any]:
    result: dict[str, Any] = {"server": await pg_server(admin_url)}
    async with pg_databases(admin_url, ["hs", "lg", "hs_size", "lg_size"]) as urls:
        async with pg_savers(urls) as savers:
            result["speed"] = await speed(savers, cfg)
        size_urls = {"hs": urls["hs_size"], "lg": urls["lg_size"]}
        async with pg_savers(size_urls) as savers:
            empty = {
                "histstore": await pg_bytes(size_urls["hs"], HS_TABLES),
                "langgraph": await pg_bytes(size_urls["lg"], LG_TABLES),
            }
            for saver in savers.values():
                await chat_turns(saver, cfg.turns, cfg.threads)
        full = {
            "histstore": await pg_bytes(size_urls["hs"], HS_TABLES),
            "langgraph": await pg_bytes(size_urls["lg"], LG_TABLES),
        }
    result["bytes_per_thread"] = {n: (full[n] - empty[n]) / cfg.threads for n in full}
    return result


def report(results: dict[str, dict[str, Any]], cfg: Config) -> str:
    rows = []
    for kind, r in results.items():
        for case, by_saver in r["speed"].items():
            shape, size = case.split("/")
            for op in OPS:
                hs, lg = by_saver["histstore"][op], by_saver["langgraph"][op]
                ratio = hs["mean_us"] / lg["mean_us"]
                rows.append(
                    [
                        kind,
                        shape,
                        f"{int(size):,}",
                        op,
                        f"{hs['mean_us']:,.0f}",
                        f"{hs['p99_us']:,.0f}",
                        f"{lg['mean_us']:,.0f}",
                        f"{lg['p99_us']:,.0f}",
                        f"{ratio:.2f}x",
                        "PASS" if ratio <= SPEED_TARGET else "FAIL",
                    ]
                )
    headers = [
        "backend",
        "shape",
        "ckpts",
        "op",
        "histstore mean us",
        "p99",
        "langgraph mean us",
        "p99",
        "ratio",
        f"<={SPEED_TARGET}x",
    ]
    lines = [
        f"histstore HiststoreSaver vs LangGraph's own saver, up to {cfg.samples} samples per"
        f" op (at least {MIN_SAMPLES}, for about {BUDGET_S:.0f} s)"
        + ("" if cfg.freeze else "; objects not frozen (--no-freeze)"),
        render_table(headers, rows),
        "",
        f"storage after {cfg.turns} chat turns (a StateGraph(MessagesState)), per thread",
    ]
    size_rows = []
    for kind, r in results.items():
        b = r["bytes_per_thread"]
        ratio = b["histstore"] / b["langgraph"]
        size_rows.append(
            [
                kind,
                f"{b['histstore']:,.0f}",
                f"{b['langgraph']:,.0f}",
                f"{ratio:.3f}x",
                "PASS" if ratio <= STORAGE_TARGET else "FAIL",
            ]
        )
    size_headers = ["backend", "histstore bytes", "langgraph bytes", "ratio"]
    lines.append(render_table([*size_headers, f"<={STORAGE_TARGET}x"], size_rows))
    if "postgres" in results:
        lines.append(results["postgres"]["server"])
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = bench_parser(__doc__ or "")
    parser.add_argument("--samples", type=int, default=None, help="timed calls per op")
    parser.add_argument(
        "--no-freeze",
        action="store_true",
        help="leave the process's objects to every garbage collection (see above)",
    )
    args = parser.parse_args(argv)
    cfg = Config(
        sizes=(10, 100) if args.quick else (10, 1_000),
        samples=args.samples or (20 if args.quick else 200),
        shapes=("chat",) if args.quick else ("chat", "window"),
        turns=20 if args.quick else 200,
        threads=1 if args.quick else 2,
        freeze=not args.no_freeze,
    )
    return run_and_report(
        args,
        cfg,
        lambda: run_sqlite(args.sqlite_dir, cfg),
        lambda: run_postgres(args.pg_url, cfg),
        report,
    )


if __name__ == "__main__":
    raise SystemExit(main())
