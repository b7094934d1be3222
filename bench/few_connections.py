"""Benchmark: processes sharing a PostgreSQL server that allows few connections.

Run from a checkout (needs the PostgreSQL server programs, as the tests' clusters)::

    python bench/few_connections.py [--tree DIR ...] [--processes 10] [--tasks 9]
                                    [--seconds 15] [--retries 0] [--rounds 1]
                                    [--max-connections 20]

A throwaway cluster with ``max_connections = 20`` (``superuser_reserved_connections =
1``: 19 sessions for the application) is started once (``--max-connections 200``: a
server with room for every process, the reference for what the machine itself costs).
Then, for each ``--tree`` (a histstore checkout; default: this one), in turn and
``--rounds`` times, the database is made anew and ``--processes`` children
(``sys.executable``, in the tree, with it on ``PYTHONPATH``) each open a store with
``histstore.connect(url)`` (default options) and run agent turns from ``--tasks`` tasks
for ``--seconds``: ``read(c, limit=20)`` then ``write(c, [one message])``. With
``--retries N`` a failed call is tried again up to N times (the write with its
idempotency key). Printed per tree: processes that could not open, turns acknowledged,
turns failed, the p99 turn latency of each process, the most sessions seen at once on
the server (all, and the most of one process), and whether every acknowledged write is
stored exactly once.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent

WORKER = """
import asyncio, json, sys, time, uuid
import histstore
from histstore import HistStoreError, Message

async def main(url, name, tasks, seconds, retries):
    try:
        store = await histstore.connect(url)
    except HistStoreError as exc:
        print(json.dumps({"opened": False, "error": type(exc).__name__}))
        return
    acked, failed, lat = {}, 0, []
    stop = time.monotonic() + seconds

    async def call(fn):
        for attempt in range(retries + 1):
            try:
                return await fn()
            except HistStoreError:
                if attempt == retries:
                    raise
                await asyncio.sleep(0.05)

    async def agent(t):
        nonlocal failed
        c = f"{name}-{t}"
        acked[c] = []
        i = 0
        while time.monotonic() < stop:
            text, key = f"{c}-{i}", uuid.uuid4().hex
            i += 1
            began = time.perf_counter()
            try:
                await call(lambda: store.read(c, limit=20))
                await call(lambda: store.write(c, [Message.user(text)], idempotency_key=key))
            except HistStoreError:
                failed += 1
                continue
            lat.append(time.perf_counter() - began)
            acked[c].append(text)

    await asyncio.gather(*(agent(t) for t in range(tasks)))
    await store.close()
    lat.sort()
    p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))] if lat else None
    print(json.dumps({"opened": True, "acked": acked, "failed": failed, "p99": p99}))

asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])))
"""


async def _sessions(watcher: Any) -> tuple[int, int]:
    rows = await watcher.fetch(
        "SELECT application_name, count(*) FROM pg_stat_activity WHERE usename = 'app' GROUP BY 1"
    )
    counts = [int(n) for _name, n in rows]
    return sum(counts), max(counts, default=0)


async def _stored(url: str, acked: dict[str, list[str]], tree: Path) -> bool:
    """Whether each conversation holds exactly its acknowledged messages, in order."""
    code = (
        "import asyncio, json, sys, histstore\n"
        "async def main():\n"
        "    acked = json.load(sys.stdin)\n"
        "    async with histstore.connect(sys.argv[1]) as s:\n"
        "        for c, texts in acked.items():\n"
        "            if [m.content for m in await s.read(c)] != texts:\n"
        "                print('mismatch', c); return\n"
        "    print('ok')\n"
        "asyncio.run(main())\n"
    )
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        code,
        url,
        env={**os.environ, "PYTHONPATH": str(tree)},
        cwd=tree,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await proc.communicate(json.dumps(acked).encode())
    return out.decode().strip() == "ok"


async def _round(cluster: Any, tree: Path, args: argparse.Namespace) -> dict[str, Any]:
    import asyncpg

    cluster.psql("DROP DATABASE IF EXISTS app WITH (FORCE)")
    cluster.psql("CREATE DATABASE app OWNER app")
    from pg_cluster import PASSWORD

    url = cluster.url(user="app", password=PASSWORD, database="app")
    env = {**os.environ, "PYTHONPATH": str(tree)}
    migrate = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "histstore", "migrate", "--url", url, env=env, cwd=tree
    )
    await migrate.wait()
    watcher = await asyncpg.connect(
        host=str(cluster.datadir.parent), port=cluster.port, user="postgres", database="app"
    )
    children = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            WORKER,
            f"{url}?application_name=p{k}",
            f"p{k}",
            str(args.tasks),
            str(args.seconds),
            str(args.retries),
            env=env,
            cwd=tree,  # ``-c`` puts the working directory first on the path
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
        )
        for k in range(args.processes)
    ]
    finished = asyncio.gather(*(c.communicate() for c in children))
    most_all = most_one = 0
    while not finished.done():
        total, one = await _sessions(watcher)
        most_all, most_one = max(most_all, total), max(most_one, one)
        await asyncio.wait({finished}, timeout=0.05)
    await watcher.close()
    reports = [json.loads(out.decode().strip().splitlines()[-1]) for out, _ in await finished]
    acked: dict[str, list[str]] = {}
    for r in reports:
        acked.update(r.get("acked", {}))
    p99s = sorted(r["p99"] for r in reports if r.get("p99") is not None)
    return {
        "open failures": sum(1 for r in reports if not r["opened"]),
        "turns": sum(len(v) for v in acked.values()),
        "failed": sum(r.get("failed", 0) for r in reports),
        "p99 per process (s)": [round(p, 3) for p in p99s],
        "most sessions (all, one process)": [most_all, most_one],
        "stored once": await _stored(url, acked, tree),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", action="append", type=Path, help="a histstore checkout")
    parser.add_argument("--processes", type=int, default=10)
    parser.add_argument("--tasks", type=int, default=9)
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--retries", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--max-connections", type=int, default=20)
    args = parser.parse_args()
    trees = [t.resolve() for t in (args.tree or [REPO])]
    sys.path.insert(0, str(REPO / "tests"))
    from pg_cluster import throwaway_cluster

    settings = [f"max_connections = {args.max_connections}", "superuser_reserved_connections = 1"]
    with throwaway_cluster(settings=settings) as cluster:
        for _ in range(args.rounds):
            for tree in trees:
                started = time.monotonic()
                result = asyncio.run(_round(cluster, tree, args))
                took = time.monotonic() - started
                print(json.dumps({"tree": str(tree), **result, "took (s)": round(took, 1)}))


if __name__ == "__main__":
    main()
