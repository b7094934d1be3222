"""Helpers shared by the benchmarks: chat messages, throwaway databases, timing, tables."""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import random
import statistics
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from sqlalchemy import URL, make_url

__all__ = [
    "DEFAULT_PG_URL",
    "REPO_ROOT",
    "asyncpg_kwargs",
    "batch_digest",
    "chat_messages",
    "encode",
    "median",
    "pg_databases",
    "render_table",
    "repeated_config",
    "sqlite_timestamp",
]

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_PG_URL = "postgresql://postgres@127.0.0.1:5432/test"

if str(REPO_ROOT) not in sys.path:
    # Lets ``python bench/turns.py`` run from a checkout without installing the package.
    sys.path.insert(0, str(REPO_ROOT))

_WORDS = [
    "the",
    "a",
    "to",
    "of",
    "and",
    "in",
    "that",
    "it",
    "for",
    "you",
    "is",
    "on",
    "with",
    "this",
    "be",
    "can",
    "as",
    "at",
    "we",
    "your",
    "not",
    "are",
    "have",
    "will",
    "an",
    "if",
    "or",
    "by",
    "from",
    "but",
    "so",
    "about",
    "what",
    "how",
    "when",
    "use",
    "file",
    "code",
    "test",
    "run",
    "data",
    "query",
    "table",
    "index",
    "error",
    "value",
    "config",
    "server",
    "request",
    "response",
    "model",
    "agent",
    "tool",
    "call",
    "result",
    "message",
    "history",
    "user",
    "token",
    "window",
    "memory",
    "cache",
    "write",
    "read",
    "commit",
    "retry",
    "timeout",
    "latency",
    "deploy",
    "build",
    "branch",
    "merge",
    "review",
    "schema",
    "migration",
    "function",
    "return",
]


def _sentence(rng: random.Random, chars: int) -> str:
    words: list[str] = []
    size = 0
    while size < chars:
        w = rng.choice(_WORDS)
        words.append(w)
        size += len(w) + 1
    text = " ".join(words)
    return text[0].upper() + text[1:] + "."


def chat_messages(count: int, *, seed: int = 7) -> list[dict[str, Any]]:
    """``count`` chat messages alternating user/assistant, each about 200 bytes of JSON."""
    rng = random.Random(seed)
    out: list[dict[str, Any]] = []
    for i in range(count):
        if i % 2 == 0:
            out.append({"role": "user", "content": _sentence(rng, rng.randint(140, 180))})
        else:
            out.append({"role": "assistant", "content": _sentence(rng, rng.randint(130, 170))})
    return out


def encode(message: dict[str, Any]) -> str:
    """Compact JSON text, as a minimal store would keep it."""
    return json.dumps(message, ensure_ascii=False, separators=(",", ":"))


def batch_digest(texts: Sequence[str]) -> str:
    """A SHA-256 over a batch's JSON texts (the raw baseline's idempotency record)."""
    h = hashlib.sha256()
    for t in texts:
        h.update(t.encode("utf-8"))
    return h.hexdigest()


def sqlite_timestamp(dt: datetime) -> str:
    """A UTC time in the text form SQLAlchemy stores in SQLite ``DATETIME`` columns."""
    return dt.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")


def median(values: Sequence[float]) -> float:
    """The median (0.0 for no values)."""
    return statistics.median(values) if values else 0.0


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank percentile ``q`` (0-100) of ``values`` (0.0 when empty)."""
    ordered = sorted(values)
    if not ordered:
        return 0.0
    rank = max(1, -(-len(ordered) * q // 100))
    return ordered[min(len(ordered), int(rank)) - 1]


def asyncpg_kwargs(url: str | URL) -> dict[str, Any]:
    """``asyncpg.connect`` keyword arguments for a SQLAlchemy-style Postgres URL."""
    u = make_url(url)
    return {
        "user": u.username,
        "password": u.password,
        "host": u.host,
        "port": u.port,
        "database": u.database,
    }


@asynccontextmanager
async def pg_databases(admin_url: str, names: Sequence[str]) -> AsyncIterator[dict[str, str]]:
    """Create throwaway Postgres databases (one per name), yield their URLs, drop them."""
    import asyncpg

    tag = uuid.uuid4().hex[:10]
    real = {name: f"histstore_bench_{tag}_{name}" for name in names}
    admin = await asyncpg.connect(**asyncpg_kwargs(admin_url))
    try:
        created: list[str] = []
        try:
            for db in real.values():
                await admin.execute(f'CREATE DATABASE "{db}"')
                created.append(db)
            base = make_url(admin_url)
            yield {
                name: base.set(database=db).render_as_string(hide_password=False)
                for name, db in real.items()
            }
        finally:
            for db in created:
                await admin.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
    finally:
        await admin.close()


def render_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A plain-text table; the first column is left-aligned, the rest right-aligned."""
    widths = [max(len(str(r[i])) for r in [headers, *rows]) for i in range(len(headers))]

    def line(cells: Sequence[str]) -> str:
        parts = []
        for i, cell in enumerate(cells):
            side = "<" if i == 0 else ">"
            parts.append(f"{cell:{side}{widths[i]}}")
        return "  ".join(parts).rstrip()

    sep = "  ".join("-" * w for w in widths)
    return "\n".join([line(headers), sep, *(line(r) for r in rows)])


def run_backends(
    kinds: Sequence[str],
    sqlite: Callable[[], Awaitable[dict[str, Any]]],
    postgres: Callable[[], Awaitable[dict[str, Any]]],
) -> dict[str, dict[str, Any]]:
    """Run each backend's part of a benchmark in turn, in one event loop."""

    async def run_all() -> dict[str, dict[str, Any]]:
        results: dict[str, dict[str, Any]] = {}
        for kind in kinds:
            results[kind] = await (sqlite() if kind == "sqlite" else postgres())
        return results

    return asyncio.run(run_all())


def run_and_report(
    args: argparse.Namespace,
    cfg: Any,
    sqlite: Callable[[], Awaitable[dict[str, Any]]],
    postgres: Callable[[], Awaitable[dict[str, Any]]],
    report: Callable[[dict[str, dict[str, Any]], Any], str],
) -> int:
    """Run the backends ``args.backend`` names, print the report, and write the results
    (with ``cfg``, a dataclass) to ``args.json`` when asked."""
    from dataclasses import asdict

    kinds = ["sqlite", "postgres"] if args.backend == "all" else [args.backend]
    results = run_backends(kinds, sqlite, postgres)
    print(report(results, cfg))
    if args.json:
        doc = {"config": asdict(cfg), "results": results}
        Path(args.json).write_text(json.dumps(doc, indent=2) + "\n")
    return 0


async def pg_server(url: str) -> str:
    """The Postgres server's version and durability settings, for the report."""
    import asyncpg

    conn = await asyncpg.connect(**asyncpg_kwargs(url))
    try:
        settings = {
            k: await conn.fetchval(f"SHOW {k}")
            for k in ("server_version", "fsync", "synchronous_commit")
        }
    finally:
        await conn.close()
    return "PostgreSQL " + ", ".join(f"{k}={v}" for k, v in settings.items())


def repeated_config(args: argparse.Namespace, quick: Any, full: Any) -> Any:
    """The configuration (a dataclass with a ``repeat`` field) that ``--quick`` picks, with
    ``--repeat`` (an option the script added) applied when given."""
    from dataclasses import replace

    cfg = quick if args.quick else full
    if args.repeat is not None:
        cfg = replace(cfg, repeat=max(1, args.repeat))
    return cfg


def bench_parser(doc: str) -> argparse.ArgumentParser:
    """The options every benchmark takes: --backend, --pg-url, --quick, --sqlite-dir, --json."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--backend", choices=["sqlite", "postgres", "all"], default="all")
    parser.add_argument(
        "--pg-url", default=DEFAULT_PG_URL, help="a database to connect to (default: %(default)s)"
    )
    parser.add_argument("--quick", action="store_true", help="a scaled-down run (smoke test)")
    parser.add_argument("--sqlite-dir", default=None, help="where the SQLite files go")
    parser.add_argument("--json", metavar="FILE", default=None, help="also write results here")
    return parser
