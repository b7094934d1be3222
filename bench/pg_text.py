"""Benchmark: PostgreSQL's full-text index against a raw asyncpg program doing the minimal SQL.

Run from a checkout (PostgreSQL at ``--pg-url``; each run makes and drops its databases)::

    python bench/pg_text.py [--messages N] [--pg-url URL] [--json FILE]

Loads ``--messages`` (default 100,000) chat messages of about 200 bytes, in
conversations of 100 (one ``write`` of 100 messages each, four writers at a time), into
a histstore store and, alike, into a raw table ``(conversation_id, position, content)``
by ``INSERT ... SELECT FROM unnest(...)``: once without an index and once with the GIN
index on ``to_tsvector('simple', content)`` made before the load. Then prints:

- load: seconds to load, histstore including ``close()`` (whatever indexing that does);
- bytes per message: every histstore table and index (``pg_total_relation_size``), the
  raw table with and without its GIN index;
- rare word: a word in 5 messages of the store, ``search(word)`` against the raw
  ``WHERE to_tsvector(...) @@ q ORDER BY ts_rank_cd(...) DESC LIMIT 10`` (medians of 21);
- conversation search: a common word in one 100-message conversation,
  ``search(word, conversation=)``, in a store of 1/100 the size and in the full one:
  the growth (the raw program the same, with ``AND conversation_id = $1``).

Every ratio is measured in one run, side by side. The run at 100,000 messages takes a few
minutes on a small machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg
from _common import DEFAULT_PG_URL, asyncpg_kwargs, pg_databases, render_table

import histstore

CONVERSATION = 100
WRITERS = 4
RARE = "zyzzyva"
COMMON = "index"  # one of the chat messages' words, in most messages
REPEAT = 21

WORDS = "the a to of and in that it for you is on with this be can as at we your not are have will an if or by from but so about what how when use file code test run data query table index error value config server request response model agent tool call result message history user token window memory cache".split()  # noqa: E501, SIM905


def content(i: int, rng: random.Random) -> str:
    words = [rng.choice(WORDS) for _ in range(rng.randint(28, 36))]
    if i % 20_000 == 7:  # 5 messages in 100,000
        words[3] = RARE
    return " ".join(words)


def corpus(n: int) -> list[list[str]]:
    """``n`` messages' contents, in conversations of ``CONVERSATION``."""
    rng = random.Random(7)
    texts = [content(i, rng) for i in range(n)]
    return [texts[i : i + CONVERSATION] for i in range(0, n, CONVERSATION)]


async def in_turns(jobs: list[Callable[[], Awaitable[Any]]]) -> None:
    queue = list(reversed(jobs))

    async def worker() -> None:
        while queue:
            await queue.pop()()

    await asyncio.gather(*(worker() for _ in range(WRITERS)))


async def median_s(call: Callable[[], Awaitable[Any]]) -> float:
    await call()
    times = []
    for _ in range(REPEAT):
        t = time.perf_counter()
        await call()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


# ---------------------------------------------------------------- histstore


async def load_histstore(url: str, convs: list[list[str]]) -> tuple[float, float]:
    """Seconds to load (including ``close()``), and of ``close()`` alone."""
    await (await histstore.connect(url, migrate=True)).close()
    t = time.perf_counter()
    store = await histstore.connect(url)
    try:

        def job(c: int, texts: list[str]) -> Callable[[], Awaitable[Any]]:
            msgs = [{"role": "user", "content": x} for x in texts]
            return lambda: store.write(f"c{c}", msgs)

        await in_turns([job(c, texts) for c, texts in enumerate(convs)])
    finally:
        closing = time.perf_counter()
        await store.close()
    end = time.perf_counter()
    return end - t, end - closing


async def histstore_bytes(url: str) -> int:
    conn = await asyncpg.connect(**asyncpg_kwargs(url))
    try:
        await conn.execute("VACUUM ANALYZE")
        return int(
            await conn.fetchval(
                "SELECT sum(pg_total_relation_size(c.oid)) FROM pg_class AS c"
                " JOIN pg_namespace AS n ON n.oid = c.relnamespace"
                " WHERE c.relkind IN ('r', 'm') AND n.nspname = 'public'"
                " AND c.relname LIKE 'histstore%'"
            )
        )
    finally:
        await conn.close()


# ---------------------------------------------------------------------- raw

RAW_TABLE = (
    "CREATE TABLE raw_messages (conversation_id text NOT NULL, position bigint NOT NULL,"
    " content text NOT NULL, PRIMARY KEY (conversation_id, position))"
)
RAW_GIN = "CREATE INDEX raw_text ON raw_messages USING gin (to_tsvector('simple', content))"
RAW_INSERT = (
    "INSERT INTO raw_messages (conversation_id, position, content)"
    " SELECT $1, p - 1, t FROM unnest($2::text[]) WITH ORDINALITY AS u(t, p)"
)
RAW_SEARCH = (
    "SELECT conversation_id, position, content, ts_rank_cd(to_tsvector('simple', content), q) AS r"
    " FROM raw_messages, plainto_tsquery('simple', $1) AS q"
    " WHERE to_tsvector('simple', content) @@ q{} ORDER BY r DESC, conversation_id, position"
    " LIMIT 10"
)


async def load_raw(url: str, convs: list[list[str]], gin: bool) -> tuple[float, int]:
    """Seconds to load, and bytes of the table (and its index)."""
    pool = await asyncpg.create_pool(**asyncpg_kwargs(url), min_size=WRITERS, max_size=WRITERS)
    assert pool is not None
    try:
        await pool.execute(RAW_TABLE)
        if gin:
            await pool.execute(RAW_GIN)
        t = time.perf_counter()

        def job(c: int, texts: list[str]) -> Callable[[], Awaitable[Any]]:
            return lambda: pool.execute(RAW_INSERT, f"c{c}", texts)

        await in_turns([job(c, texts) for c, texts in enumerate(convs)])
        elapsed = time.perf_counter() - t
        await pool.execute("VACUUM ANALYZE raw_messages")
        size = int(await pool.fetchval("SELECT pg_total_relation_size('raw_messages')"))
        return elapsed, size
    finally:
        await pool.close()


# ---------------------------------------------------------------------- run


async def searches(hs_url: str, raw_url: str, target: str) -> dict[str, float]:
    conn = await asyncpg.connect(**asyncpg_kwargs(raw_url))
    out: dict[str, float] = {}
    try:
        async with histstore.connect(hs_url, read_only=True) as store:
            found = await store.search(RARE, limit=10)
            raw = await conn.fetch(RAW_SEARCH.format(""), RARE)
            assert [(h.conversation, h.position) for h in found] == [(r[0], r[1]) for r in raw], (
                "histstore and raw disagree"
            )
            out["rare"] = await median_s(lambda: store.search(RARE, limit=10))
            out["rare raw"] = await median_s(lambda: conn.fetch(RAW_SEARCH.format(""), RARE))
            out["conv"] = await median_s(
                lambda: store.search(COMMON, conversation=target, limit=10)
            )
            by_conv = RAW_SEARCH.format(" AND conversation_id = $2")
            out["conv raw"] = await median_s(lambda: conn.fetch(by_conv, COMMON, target))
    finally:
        await conn.close()
    return out


async def run(args: argparse.Namespace) -> dict[str, Any]:
    n = args.messages
    big = corpus(n)
    small = big[: max(1, len(big) // 100)]
    target = "c0"
    names = ["hs_big", "hs_small", "raw_plain", "raw_gin", "raw_small"]
    result: dict[str, Any] = {"messages": n, "histstore": histstore.__file__}
    async with pg_databases(args.pg_url, names) as urls:

        def sa(name: str) -> str:
            return urls[name].replace("postgresql://", "postgresql+asyncpg://", 1)

        result["raw load"], result["raw bytes"] = await load_raw(urls["raw_plain"], big, False)
        result["raw+gin load"], result["raw+gin bytes"] = await load_raw(urls["raw_gin"], big, True)
        result["histstore load"], result["histstore close"] = await load_histstore(
            sa("hs_big"), big
        )
        result["histstore bytes"] = await histstore_bytes(urls["hs_big"])
        await load_histstore(sa("hs_small"), small)
        await histstore_bytes(urls["hs_small"])
        await load_raw(urls["raw_small"], small, True)
        result["big"] = await searches(sa("hs_big"), urls["raw_gin"], target)
        result["small"] = await searches(sa("hs_small"), urls["raw_small"], target)
    return result


def _x(a: float, b: float) -> str:
    return f"{a / b:.2f}x"


def report(r: dict[str, Any]) -> str:
    n = r["messages"]
    big, small = r["big"], r["small"]
    load, raw, gin = r["histstore load"], r["raw load"], r["raw+gin load"]
    size, raw_size, gin_size = r["histstore bytes"], r["raw bytes"], r["raw+gin bytes"]
    conv, conv_small = big["conv"], small["conv"]
    rows = [
        [
            "load (s)",
            f"{load:.1f} (close {r['histstore close']:.2f})",
            f"{raw:.1f} / {gin:.1f}",
            f"{_x(load, raw)} / {_x(load, gin)}",
        ],
        [
            "bytes per message",
            f"{size / n:,.0f}",
            f"{raw_size / n:,.0f} / {gin_size / n:,.0f}",
            f"{_x(size, raw_size)} / {_x(size, gin_size)}",
        ],
        [
            "rare-word search (ms)",
            f"{big['rare'] * 1e3:.2f}",
            f"{big['rare raw'] * 1e3:.2f}",
            _x(big["rare"], big["rare raw"]),
        ],
        [
            "conversation search, 100x store (ms)",
            f"{conv_small * 1e3:.2f} -> {conv * 1e3:.2f} (growth {conv / conv_small:.2f})",
            f"{small['conv raw'] * 1e3:.2f} -> {big['conv raw'] * 1e3:.2f}",
            _x(conv, big["conv raw"]),
        ],
    ]
    head = f"{n:,} messages; histstore from {r['histstore']}"
    headers = ["case", "histstore", "raw (no index / GIN)", "ratio (to raw / raw + GIN)"]
    return head + "\n" + render_table(headers, rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--pg-url", default=DEFAULT_PG_URL)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    result = asyncio.run(run(args))
    print(report(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
