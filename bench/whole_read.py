"""Reading one long conversation whole: ``read()``, ``stream()`` and a raw program, each in
a fresh process (peak RSS by ``resource.getrusage``), on SQLite and PostgreSQL.

    python bench/whole_read.py [--n 100000] [--backend sqlite postgres] [--dir /tmp/wr]

The conversation (``--n`` chat messages of about 200 bytes) is written once per size and
kept (``--dir`` for SQLite; a database ``whole_read_<n>`` on ``--pg-url``), so a second
run only reads. The raw program is the minimal one: the driver fetches the rows in one
call (only the JSON texts: no position or time) and each is decoded into a dict.
``read`` keeps the returned list, as a caller does; ``stream`` walks the messages and
keeps none. Each case runs three times in
its own process (with its connection open); the table shows the fastest read (the
fetch and, for raw, the decoding) and the highest peak RSS of the process.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from _common import DEFAULT_PG_URL, asyncpg_kwargs, chat_messages, render_table
from sqlalchemy import make_url

CASES = ("raw", "read", "stream")
_SQL = "SELECT data FROM histstore_messages WHERE conversation_id = {p} ORDER BY position"


def _target(backend: str, args: argparse.Namespace) -> str:
    if backend == "sqlite":
        return str(Path(args.dir) / f"whole_read_{args.n}.db")
    return make_url(args.pg_url).set(database=f"whole_read_{args.n}").render_as_string(False)


async def _build(backend: str, args: argparse.Namespace) -> None:
    import histstore

    if backend == "postgres":
        import asyncpg

        admin = await asyncpg.connect(**asyncpg_kwargs(args.pg_url))
        name = f"whole_read_{args.n}"
        if not await admin.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", name):
            await admin.execute(f'CREATE DATABASE "{name}"')
        await admin.close()
    async with histstore.connect(_target(backend, args), migrate=True) as store:
        have = await store.count("long")
        if have == args.n:
            return
        await store.clear("long")
        step = 10_000
        pattern = chat_messages(step)
        for start in range(0, args.n, step):
            await store.write("long", pattern[: min(step, args.n - start)])


async def _case(backend: str, case: str, args: argparse.Namespace) -> tuple[float, int]:
    import aiosqlite
    import asyncpg

    import histstore

    if case == "raw":
        if backend == "sqlite":
            async with aiosqlite.connect(_target(backend, args)) as conn:
                await conn.execute_fetchall("SELECT 1")
                started = time.perf_counter()
                rows = await conn.execute_fetchall(_SQL.format(p="?"), ("long",))
                got = [json.loads(r[0]) for r in rows]
                seconds = time.perf_counter() - started
        else:
            conn = await asyncpg.connect(**asyncpg_kwargs(_target(backend, args)))
            started = time.perf_counter()
            rows = await conn.fetch(_SQL.format(p="$1"), "long")
            got = [json.loads(r[0]) for r in rows]
            seconds = time.perf_counter() - started
            await conn.close()
        n = len(got)
        del rows
    else:
        async with histstore.connect(_target(backend, args), migrate=False) as store:
            await store.count("long")  # the connection is open, as the raw program's
            started = time.perf_counter()
            if case == "read":
                n = len(await store.read("long"))
            else:
                n = 0
                async for _ in store.stream("long"):
                    n += 1
            seconds = time.perf_counter() - started
    assert n == args.n, (n, args.n)
    return seconds, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--backend", nargs="+", default=["sqlite", "postgres"])
    parser.add_argument("--dir", default="/tmp/whole_read")
    parser.add_argument("--pg-url", default=DEFAULT_PG_URL)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--cases", nargs="+", default=CASES, choices=CASES)
    parser.add_argument("--build", action="store_true", help="only write the conversations")
    parser.add_argument("--case", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case:
        backend, case = args.case.split(":")
        seconds, rss = asyncio.run(_case(backend, case, args))
        print(json.dumps({"seconds": seconds, "rss_kb": rss}))
        return
    table: list[list[str]] = []
    Path(args.dir).mkdir(parents=True, exist_ok=True)
    for backend in args.backend:
        asyncio.run(_build(backend, args))
        if args.build:
            continue
        found: dict[str, tuple[float, int]] = {}
        for case in args.cases:
            runs: list[dict[str, Any]] = []
            for _ in range(args.repeat):
                out = subprocess.run(
                    [sys.executable, __file__, *sys.argv[1:], "--case", f"{backend}:{case}"],
                    capture_output=True,
                    text=True,
                    check=True,
                )
                runs.append(json.loads(out.stdout.splitlines()[-1]))
            found[case] = (min(r["seconds"] for r in runs), max(r["rss_kb"] for r in runs))
        raw_s, raw_kb = found["raw"]
        for case, (sec, kb) in found.items():
            table.append(
                [
                    f"{backend} {case}",
                    f"{sec:.2f}",
                    f"{sec / raw_s:.2f}x",
                    f"{kb / 1024:,.0f}",
                    f"{kb / raw_kb:.2f}x",
                ]
            )
    if args.build:
        return
    print(f"one conversation of {args.n:,} messages, read whole")
    print(render_table(["case", "s", "vs raw", "peak MB", "vs raw"], table))


if __name__ == "__main__":
    main()
