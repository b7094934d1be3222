"""Benchmark: growth with the history of four calls that should cost what they return
(issue 45 rows 4-6), at two conversation sizes, on SQLite (a file) and PostgreSQL.

Run from a checkout::

    python bench/growth_edits.py [--backend sqlite|postgres|all] [--pg-url URL]
                                 [--small N] [--big N] [--repeat N]

With ``PYTHONPATH=OTHER_CHECKOUT`` it times that tree's histstore (it uses public calls
and ``histstore.cli._show.show_conversation``, which every tree has), so a tree before
a change and one after it can be run one after the other in one sitting.

Each backend gets a conversation of ``--small`` (1,000) and one of ``--big`` (20,000)
entries, written 10 at a time, with a splice in the middle and an aside; every message
embedded once. Then, alternating between the two, ``--repeat`` (7) times:

- ``semantic``: ``write`` of one message, then ``SemanticIndex.update(c)``;
- ``show --last 3``: the text ``show`` of the newest 3 entries (``show_conversation``),
  and the peak of Python memory (tracemalloc) of another such call;
- ``changes``: ``store.changes(c, since=revision - 5, limit=5)``;
- ``oldest``: ``store.changes(c, limit=5)``, the oldest page (``histstore log --limit
  5``);
- ``revert``: ``store.revert(c, revision - 1)`` of a message just written (the write is
  not timed).

Printed: the median of each at each size and the big/small ratio (target: at most 2.0).
On PostgreSQL autovacuum is off for the new database's tables, so every statement runs
before the first ANALYZE of the freshly loaded tables.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from _common import median, pg_databases, render_table
from sqlalchemy import text

import histstore
from histstore.cli._show import show_conversation

MODEL = "fake"
TABLES = ("histstore_messages", "histstore_vectors", "histstore_writes", "histstore_changes")


async def embed(texts: list[str]) -> list[list[float]]:
    return [[1.0, float(len(t) % 7), 0.5] for t in texts]


async def build(store: histstore.Store, cid: str, size: int) -> None:
    for i in range(0, size, 10):
        await store.write(cid, [{"role": "user", "content": f"m {i + k}"} for k in range(10)])
    value = await store.edit(cid)
    value.splice(size // 2, size // 2 + 3, [{"role": "user", "content": "edited"}], by="ed")
    value.add_aside({"note": 1}, after=value.entry_id(-1))
    await store.commit(value)
    await store.write(cid, [{"role": "user", "content": f"top {k}"} for k in range(2)])
    await histstore.SemanticIndex(store, embed, model=MODEL).update(cid)


async def timed(work: Callable[[], Awaitable[Any]]) -> float:
    start = time.perf_counter()
    await work()
    return time.perf_counter() - start


async def measure(url: str, sizes: dict[str, int], repeat: int, pg: bool) -> dict[str, Any]:
    async with histstore.connect(url, migrate=True) as store:
        if pg:
            async with store.engine.begin() as conn:
                for t in TABLES:
                    await conn.execute(text(f"ALTER TABLE {t} SET (autovacuum_enabled = false)"))
        for name, size in sizes.items():
            await build(store, name, size)
        index = histstore.SemanticIndex(store, embed, model=MODEL)
        times: dict[tuple[str, str], list[float]] = {}
        peaks: dict[str, list[int]] = {}
        for i in range(repeat):
            for name in sizes:

                async def semantic(name: str = name, i: int = i) -> None:
                    await store.write(name, [{"role": "user", "content": f"new {i}"}])
                    await index.update(name)

                async def show(name: str = name) -> None:
                    await show_conversation(store, name, io.StringIO(), last=3)

                times.setdefault(("semantic", name), []).append(await timed(semantic))
                times.setdefault(("show --last 3", name), []).append(await timed(show))
                tracemalloc.start()  # a second show, for its memory only
                await show()
                peaks.setdefault(name, []).append(tracemalloc.get_traced_memory()[1])
                tracemalloc.stop()
                await store.write(name, [{"role": "user", "content": f"undo me {i}"}])
                revision = await revision_of(store, name)
                times.setdefault(("changes since rev-5", name), []).append(
                    await timed(lambda n=name, r=revision: store.changes(n, since=r - 5, limit=5))
                )
                times.setdefault(("changes oldest 5", name), []).append(
                    await timed(lambda n=name: store.changes(n, limit=5))
                )
                times.setdefault(("revert rev-1", name), []).append(
                    await timed(lambda n=name, r=revision: store.revert(n, r - 1, by="bench"))
                )
        return {"times": times, "peaks": peaks}


async def revision_of(store: histstore.Store, cid: str) -> int:
    """The conversation's revision: ``admin.tail`` where the tree has it, else from
    ``store.edit`` (not timed)."""
    from histstore import admin

    tail = getattr(admin, "tail", None)
    if tail is not None:
        return int((await tail(store, cid, last=0)).revision)
    return (await store.edit(cid)).revision  # the older tree: untimed here


def report(label: str, found: dict[str, Any], sizes: dict[str, int]) -> None:
    small, big = list(sizes)
    rows = []
    for op in dict.fromkeys(op for op, _ in found["times"]):
        a = median(found["times"][op, small]) * 1000
        b = median(found["times"][op, big]) * 1000
        rows.append([op, f"{a:.2f}", f"{b:.2f}", f"{b / a:.2f}x"])
    pa = median(found["peaks"][small]) / 1e6
    pb = median(found["peaks"][big]) / 1e6
    rows.append(["show --last 3 peak MB", f"{pa:.2f}", f"{pb:.2f}", f"{pb / pa:.2f}x"])
    head = ["operation", f"{sizes[small]:,} (ms)", f"{sizes[big]:,} (ms)", "growth"]
    print(f"\n{label}")
    print(render_table(head, rows))


async def main(args: argparse.Namespace) -> None:
    sizes = {"small": args.small, "big": args.big}
    print(f"histstore from {Path(histstore.__file__).parent}")
    if args.backend in ("sqlite", "all"):
        with tempfile.TemporaryDirectory() as tmp:
            found = await measure(f"{tmp}/growth.db", sizes, args.repeat, pg=False)
        report("SQLite file", found, sizes)
    if args.backend in ("postgres", "all"):
        async with pg_databases(args.pg_url, ["growth"]) as urls:
            found = await measure(urls["growth"], sizes, args.repeat, pg=True)
        report("PostgreSQL (no ANALYZE)", found, sizes)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=["sqlite", "postgres", "all"], default="all")
    parser.add_argument("--pg-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--small", type=int, default=1000)
    parser.add_argument("--big", type=int, default=20000)
    parser.add_argument("--repeat", type=int, default=7)
    asyncio.run(main(parser.parse_args()))
    sys.exit(0)
