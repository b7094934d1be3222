"""Benchmark: chat turns served over HTTP through ``with_history``, under uvicorn.

Run from a checkout (needs ``pip install 'histstore[bench]'``: starlette, uvicorn, httpx)::

    python bench/service.py [--backend sqlite|postgres|all] [--pg-url URL] [--quick]
                            [--sqlite-dir DIR] [--json FILE]

A Starlette app (``create_app`` below) serves ``POST /chat/{conversation}`` through
``histstore.with_history(store, model)``, where the model sleeps 5 ms and answers one
assistant message. Each uvicorn worker opens its own store (``histstore.connect(url)``,
default options) in the app's lifespan. The benchmark starts uvicorn itself with 2
workers on a free port of 127.0.0.1, waits until both workers answer, sends untimed
warm-up turns, then 500 requests at concurrency 32 from 32 tasks, each with its own
``httpx.AsyncClient`` (one kept connection), and stops the server. Each backend gets a
fresh database per variant (an SQLite file; a throwaway Postgres database).

* ``with_history``: 50 conversations, each owned by one client task (so no two requests
  in flight share a conversation). Target: p99 <= 5x p50.
* ``serialize=True``: the same 500 requests spread over 8 conversations, request ``i``
  on conversation ``i % 8``, so some 4 requests wait on each conversation's turn lease.
  Target: no failed request (turns queue instead of ending in ``CommitError``).

Latency is per request as the client sees it; the ``srv`` columns time the
``with_history`` call inside the worker; ``split`` counts requests per worker; ``cpu`` is
CPU time per request of the client and of both workers (Linux ``/proc``). Afterwards
the conversations are counted: every answered request stored its 2 messages once.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from _common import (
    bench_parser,
    percentile,
    pg_databases,
    pg_server,
    render_table,
    run_and_report,
)

import histstore
from histstore import Message

BENCH_DIR = Path(__file__).resolve().parent
P99_TARGET = 5.0
MODEL_DELAY = 0.005
WORKERS = 2
START_TIMEOUT = 60.0
RUN_TIMEOUT = 600.0
REQUEST_TIMEOUT = 60.0


@dataclass(frozen=True)
class Config:
    requests: int
    concurrency: int
    conversations: int  # for the plain variant; at least ``concurrency``
    shared: int  # conversations the serialize variant's requests share


FULL = Config(requests=500, concurrency=32, conversations=50, shared=8)
QUICK = Config(requests=48, concurrency=8, conversations=10, shared=2)


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------- the app


def create_app() -> Any:
    """The ASGI app a uvicorn worker serves; configured by ``HISTSTORE_BENCH_*`` variables."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    url = os.environ["HISTSTORE_BENCH_URL"]
    serialize = os.environ.get("HISTSTORE_BENCH_SERIALIZE") == "1"
    delay = float(os.environ.get("HISTSTORE_BENCH_MODEL_DELAY", str(MODEL_DELAY)))
    chats: list[histstore.middleware.HistoryChat] = []

    async def model(messages: list[Message]) -> Message:
        await asyncio.sleep(delay)
        return Message.assistant(f"Noted: {len(messages)} messages so far.")

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with histstore.connect(url) as store:
            chats.append(histstore.with_history(store, model, serialize=serialize))
            yield
            chats.clear()

    async def health(request: Request) -> JSONResponse:
        return JSONResponse({"pid": os.getpid()})

    async def chat(request: Request) -> JSONResponse:
        conversation = request.path_params["conversation"]
        body = await request.json()
        started = time.perf_counter()
        try:
            reply = await chats[0](conversation, [Message.user(body["content"])])
        except histstore.CommitError:
            return JSONResponse({"error": "CommitError"}, status_code=409)
        except histstore.HistStoreError as exc:
            return JSONResponse({"error": type(exc).__name__}, status_code=503)
        server_ms = (time.perf_counter() - started) * 1e3
        return JSONResponse({"replies": len(reply), "server_ms": server_ms, "pid": os.getpid()})

    routes = [Route("/health", health), Route("/chat/{conversation}", chat, methods=["POST"])]
    return Starlette(routes=routes, lifespan=lifespan)


# ---------------------------------------------------------------------- the server


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@asynccontextmanager
async def serving(url: str, serialize: bool, logfile: Path) -> AsyncIterator[tuple[str, set[int]]]:
    """Run uvicorn (``WORKERS`` workers, loopback only) until the block ends; yield its URL
    and its workers' pids."""
    import httpx

    port = free_port()
    env = {**os.environ, "HISTSTORE_BENCH_URL": url}
    env["HISTSTORE_BENCH_SERIALIZE"] = "1" if serialize else "0"
    cmd = [sys.executable, "-m", "uvicorn", "--factory", "service:create_app"]
    cmd += ["--app-dir", str(BENCH_DIR), "--host", "127.0.0.1", "--port", str(port)]
    cmd += ["--workers", str(WORKERS), "--lifespan", "on", "--no-access-log"]
    cmd += ["--log-level", "warning", "--timeout-graceful-shutdown", "10"]
    base = f"http://127.0.0.1:{port}"
    with logfile.open("ab") as out:
        proc = await asyncio.create_subprocess_exec(
            *cmd, env=env, stdout=out, stderr=subprocess.STDOUT
        )
    try:
        pids: set[int] = set()
        deadline = time.monotonic() + START_TIMEOUT
        while len(pids) < WORKERS:  # new connections each round: a kept one stays on its worker
            if proc.returncode is not None or time.monotonic() > deadline:
                raise RuntimeError(f"uvicorn did not start; see {logfile}")
            async with httpx.AsyncClient(base_url=base, trust_env=False, timeout=5) as client:
                try:
                    got = await asyncio.gather(*(client.get("/health") for _ in range(8)))
                    pids.update(r.json()["pid"] for r in got if r.status_code == 200)
                except httpx.TransportError:
                    await asyncio.sleep(0.2)
        yield base, pids
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), 30)
            except TimeoutError:
                proc.kill()
                await proc.wait()


# ---------------------------------------------------------------------- the client


@dataclass
class Samples:
    latencies: list[float]
    server_ms: list[float]
    failures: dict[str, int]
    workers: dict[int, int]  # answered requests per worker pid
    seconds: float


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system) a process has used so far; NaN where /proc is missing."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def drive(clients: list[Any], plan: list[list[str]], stagger: float = 0.0) -> Samples:
    """Run ``plan`` (one list of conversation ids per client task, in order); task ``w``
    sends on ``clients[w]``.

    With ``stagger``, task ``w`` starts ``w * stagger`` seconds late, so the connections
    are opened one at a time and the workers' accept loops share them (opened at once,
    one worker's accept loop tends to take them all)."""
    import httpx

    got = Samples([], [], {}, {}, 0.0)

    def fail(name: str) -> None:
        got.failures[name] = got.failures.get(name, 0) + 1

    async def task(w: int, conversations: list[str]) -> None:
        await asyncio.sleep(w * stagger)
        for i, cid in enumerate(conversations):
            started = time.perf_counter()
            try:
                resp = await clients[w].post(f"/chat/{cid}", json={"content": f"Question {i}?"})
            except httpx.HTTPError as exc:
                fail(type(exc).__name__)
                continue
            elapsed = time.perf_counter() - started
            body = resp.json()
            if resp.status_code != 200:
                fail(f"HTTP {resp.status_code} {body.get('error', '')}".strip())
                continue
            got.latencies.append(elapsed)
            got.server_ms.append(float(body["server_ms"]))
            got.workers[body["pid"]] = got.workers.get(body["pid"], 0) + 1

    started = time.perf_counter()
    await asyncio.gather(*(task(w, convs) for w, convs in enumerate(plan)))
    got.seconds = time.perf_counter() - started
    return got


def deal(ids: list[str], concurrency: int) -> list[list[str]]:
    """Request ``i`` goes to ``ids[i]``, dealt round-robin over ``concurrency`` tasks."""
    return [ids[w::concurrency] for w in range(concurrency)]


def plain_plan(cfg: Config, prefix: str) -> list[list[str]]:
    """Each task owns conversations ``w, w + concurrency, ...`` and cycles through them."""
    owned = [
        [f"{prefix}-c{c}" for c in range(w, cfg.conversations, cfg.concurrency)]
        for w in range(cfg.concurrency)
    ]
    counts = [len(range(w, cfg.requests, cfg.concurrency)) for w in range(cfg.concurrency)]
    return [[own[i % len(own)] for i in range(n)] for own, n in zip(owned, counts, strict=True)]


def shared_plan(cfg: Config, prefix: str) -> list[list[str]]:
    ids = [f"{prefix}-c{i % cfg.shared}" for i in range(cfg.requests)]
    return deal(ids, cfg.concurrency)


# ---------------------------------------------------------------------- one variant


@dataclass
class VariantResult:
    variant: str
    conversations: int
    requests: int
    answered: int
    failures: dict[str, int]
    req_per_s: float
    p50_ms: float
    p99_ms: float
    max_ms: float
    server_p50_ms: float
    server_p99_ms: float
    per_worker: list[int]
    client_cpu_ms: float  # CPU time per answered request: the client's, the workers' together
    server_cpu_ms: float
    stored_ok: bool
    target: str
    passed: bool


async def run_variant(url: str, cfg: Config, serialize: bool, logfile: Path) -> VariantResult:
    await (await histstore.connect(url, migrate=True)).close()
    prefix = "serial" if serialize else "plain"
    plan = shared_plan(cfg, prefix) if serialize else plain_plan(cfg, prefix)
    warm = deal([f"warm-{i}" for i in range(cfg.concurrency * 2)], cfg.concurrency)
    import httpx

    # One client (one kept connection) per task: a single AsyncClient with a pool of 32
    # costs about twice the CPU per request, and the client shares the 2 cores.
    async with serving(url, serialize, logfile) as (base, pids), AsyncExitStack() as stack:
        clients = [
            await stack.enter_async_context(
                httpx.AsyncClient(base_url=base, trust_env=False, timeout=REQUEST_TIMEOUT)
            )
            for _ in range(cfg.concurrency)
        ]
        await asyncio.wait_for(drive(clients, warm, stagger=0.02), RUN_TIMEOUT)
        workers = sorted(pids)
        cpu = [time.process_time(), *map(cpu_seconds, workers)]
        got = await asyncio.wait_for(drive(clients, plan), RUN_TIMEOUT)
        after = [time.process_time(), *map(cpu_seconds, workers)]
    cpu = [b - a for a, b in zip(cpu, after, strict=True)]
    ids = sorted({cid for convs in plan for cid in convs})
    async with histstore.connect(url) as store:
        stored = sum([await store.count(cid) for cid in ids])
    lat = sorted(got.latencies)
    server = sorted(got.server_ms)
    p50, p99 = percentile(lat, 50) * 1e3, percentile(lat, 99) * 1e3
    failed = sum(got.failures.values())
    if serialize:
        target, passed = "0 failed", failed == 0
    else:
        target, passed = f"p99 <= {P99_TARGET:g}x p50", failed == 0 and p99 <= P99_TARGET * p50
    return VariantResult(
        variant="serialize=True" if serialize else "with_history",
        conversations=len(ids),
        requests=cfg.requests,
        answered=len(lat),
        failures=got.failures,
        req_per_s=len(lat) / got.seconds if got.seconds > 0 else 0.0,
        p50_ms=p50,
        p99_ms=p99,
        max_ms=(lat[-1] if lat else 0.0) * 1e3,
        server_p50_ms=percentile(server, 50),
        server_p99_ms=percentile(server, 99),
        per_worker=sorted(got.workers.values(), reverse=True),
        client_cpu_ms=cpu[0] * 1e3 / max(1, len(lat)),
        server_cpu_ms=sum(cpu[1:]) * 1e3 / max(1, len(lat)),
        stored_ok=stored == 2 * len(lat),
        target=target,
        passed=passed and stored == 2 * len(lat),
    )


async def run_variants(urls: dict[str, str], cfg: Config, kind: str, logs: Path) -> dict[str, Any]:
    out = []
    for name, serialize in (("plain", False), ("serial", True)):
        log(f"  {kind}: {name}, {cfg.requests} requests at concurrency {cfg.concurrency}")
        result = await run_variant(urls[name], cfg, serialize, logs / f"uvicorn-{kind}-{name}.log")
        out.append(asdict(result))
    return {"variants": out}


async def run_sqlite(cfg: Config, directory: str | None) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="histstore-bench-service-", dir=directory))
    try:
        urls = {name: str(tmp / f"{name}.db") for name in ("plain", "serial")}
        result = await run_variants(urls, cfg, "sqlite", tmp)
    except BaseException:
        log(f"databases and uvicorn logs kept in {tmp}")
        raise
    shutil.rmtree(tmp, ignore_errors=True)
    result["server"] = f"SQLite {sqlite3.sqlite_version}, one file per variant"
    return result


async def run_postgres(cfg: Config, admin_url: str) -> dict[str, Any]:
    logs = Path(tempfile.mkdtemp(prefix="histstore-bench-service-"))
    try:
        async with pg_databases(admin_url, ["plain", "serial"]) as urls:
            result = await run_variants(urls, cfg, "postgres", logs)
            result["server"] = await pg_server(urls["plain"])
    except BaseException:
        log(f"uvicorn logs kept in {logs}")
        raise
    shutil.rmtree(logs, ignore_errors=True)
    return result


# ---------------------------------------------------------------------- report


COLUMNS: list[tuple[str, Callable[[dict[str, Any]], str]]] = [
    ("variant", lambda r: str(r["variant"])),
    ("convs", lambda r: str(r["conversations"])),
    ("answered", lambda r: f"{r['answered']}/{r['requests']}"),
    ("failed", lambda r: str(sum(r["failures"].values()))),
    ("req/s", lambda r: f"{r['req_per_s']:,.0f}"),
    ("p50", lambda r: f"{r['p50_ms']:.1f}"),
    ("p99", lambda r: f"{r['p99_ms']:.1f}"),
    ("max", lambda r: f"{r['max_ms']:.1f}"),
    ("srv p50", lambda r: f"{r['server_p50_ms']:.1f}"),
    ("srv p99", lambda r: f"{r['server_p99_ms']:.1f}"),
    ("split", lambda r: "/".join(str(n) for n in r["per_worker"])),
    ("cli cpu", lambda r: f"{r['client_cpu_ms']:.1f}"),
    ("srv cpu", lambda r: f"{r['server_cpu_ms']:.1f}"),
    ("p99/p50", lambda r: f"{r['p99_ms'] / r['p50_ms']:.1f}x" if r["p50_ms"] else "-"),
    ("stored", lambda r: "yes" if r["stored_ok"] else "NO"),
    ("target", lambda r: str(r["target"])),
    ("result", lambda r: "PASS" if r["passed"] else "FAIL"),
]


def report(results: dict[str, dict[str, Any]], cfg: Config) -> str:
    rows = [
        [kind, *(cell(r) for _, cell in COLUMNS)]
        for kind, res in results.items()
        for r in res["variants"]
    ]
    out = [
        f"chat turns over HTTP: uvicorn, {WORKERS} workers, {cfg.requests} requests at"
        f" concurrency {cfg.concurrency}, model sleeps {MODEL_DELAY * 1e3:g} ms;"
        " latency per request in ms (srv: inside with_history); split: requests per worker;"
        " cpu: CPU ms per request of the client and of the 2 workers",
        render_table(["backend", *(name for name, _ in COLUMNS)], rows),
        "",
    ]
    for kind, res in results.items():
        out.append(f"{kind}: {res['server']}")
        out += [
            f"  {r['variant']} failures: {r['failures']}" for r in res["variants"] if r["failures"]
        ]
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    parser = bench_parser(__doc__ or "")
    args = parser.parse_args(argv)
    cfg = QUICK if args.quick else FULL
    return run_and_report(
        args,
        cfg,
        lambda: run_sqlite(cfg, args.sqlite_dir),
        lambda: run_postgres(cfg, args.pg_url),
        report,
    )


if __name__ == "__main__":
    sys.exit(main())
