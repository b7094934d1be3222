# ruff: noqa: E402
"""Benchmark: loading an ADK session's newest events costs what it returns.

Run from a checkout::

    python bench/adk.py [--backend sqlite|postgres|all] [--pg-url URL] [--quick]
                        [--sqlite-dir DIR] [--json FILE] [--fresh-only]

Measures ``get_session`` with ``GetSessionConfig(num_recent_events=20)`` and with
``after_timestamp`` set to the 20th newest event's time, on sessions of 100 and of
10,000 events (``--quick``: 1,000), for histstore's ``HiststoreSessionService`` and,
side by side in the same run, ADK's own ``DatabaseSessionService`` on the same kind of
database (an SQLite file through aiosqlite; with ``--backend postgres`` both on
PostgreSQL through asyncpg), each on a database of its own. The figure is the median
latency of a read; a read returns 20 events plus the merged state. Target for
histstore: the 10,000-event read costs at most 1.3x the 100-event one.

Sessions are filled with turns of four events (user text, model function call, function
response, model text) through each service's own storage layout: histstore's as one
batch per 2,000 events, ADK's rows through its own ORM classes, in one transaction.

A second table times a fresh process, as a Runner drives a service: each side runs in a
process of its own (``python bench/adk.py --fresh-worker``, alternating sides, 3 rounds;
``--quick``: 1) that makes the service, creates a session (its first call: it opens the
store, or ADK's engine and tables), then runs turns of ``get_session`` and four
``append_event`` calls until 150 events are stored (``--quick``: 40). The figures are the
mean latency of those first calls (the median over rounds), so every first-use cost of a
process (statement compilation, prepares, new connections) is in them; imports are not
(both sides import before the clock starts). Target for histstore: ``append_event`` and
``get_session`` at most 1.0x ADK's ``DatabaseSessionService`` (the first call is shown,
not judged: histstore's checks the schema against its migration scripts).
The databases are migrated (histstore) and created (ADK's tables) beforehand by the
parent process.
"""

from __future__ import annotations

import os
import sys

# ``python bench/adk.py`` puts bench/ first on sys.path, where a bench module could
# shadow a library one: move the folder last (``_common`` is there).
_BENCH = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _BENCH]
sys.path.append(_BENCH)

import asyncio
import json
import subprocess
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from _common import bench_parser, median, pg_databases, render_table, run_backends
from google.adk.events import Event, EventActions
from google.adk.sessions import BaseSessionService, DatabaseSessionService, Session
from google.adk.sessions.base_session_service import GetSessionConfig
from google.adk.sessions.schemas.v1 import StorageEvent
from google.genai import types
from sqlalchemy import make_url

import histstore
from histstore.integrations.adk import HiststoreSessionService, _event_record, _session_conversation

TARGET = 1.3
SIZES = (100, 10_000)
QUICK_SIZES = (100, 1_000)
RECENT = 20
APP, USER = "bench-app", "bench-user"
T0 = 1_800_000_000.0


def session_events(count: int) -> list[Event]:
    """``count`` events in turns of four, one second apart."""
    events: list[Event] = []
    for i in range(count):
        turn, step = divmod(i, 4)
        if step == 0:
            parts = [types.Part(text=f"Question {turn}: what is the weather in city {turn}?")]
            role, author = "user", "user"
        elif step == 1:
            call = types.FunctionCall(name="get_weather", args={"city": f"c{turn}"}, id=f"c{i}")
            parts, role, author = [types.Part(function_call=call)], "model", "forecaster"
        elif step == 2:
            reply = types.FunctionResponse(
                name="get_weather", response={"sky": "sunny", "deg": 21}, id=f"c{i - 1}"
            )
            parts, role, author = [types.Part(function_response=reply)], "user", "forecaster"
        else:
            parts = [types.Part(text=f"City {turn} is sunny, 21 degrees. Anything else?")]
            role, author = "model", "forecaster"
        delta = {"last_city": f"c{turn}"} if step == 3 else {}
        events.append(
            Event(
                invocation_id=f"inv-{turn}",
                author=author,
                content=types.Content(role=role, parts=parts),
                actions=EventActions(state_delta=delta),
                timestamp=T0 + i,
            )
        )
    return events


async def fill_histstore(
    service: HiststoreSessionService, store: histstore.Store, size: int
) -> str:
    session = await service.create_session(app_name=APP, user_id=USER, state={"app:units": "C"})
    conversation = _session_conversation(APP, USER, session.id)
    records = [_event_record(e) for e in session_events(size)]
    for start in range(0, len(records), 2000):
        await store.write(conversation, records[start : start + 2000])
    return session.id


async def fill_adk(service: DatabaseSessionService, size: int) -> str:
    session = await service.create_session(app_name=APP, user_id=USER, state={"app:units": "C"})
    async with service.database_session_factory() as db:
        db.add_all([StorageEvent.from_event(session, e) for e in session_events(size)])
        await db.commit()
    return session.id


async def measure(
    service: BaseSessionService, ids: dict[int, str], label: str, reads: int
) -> dict[int, float]:
    """Median latency per session size; the sizes' reads alternate, so load hits both."""

    async def once(size: int) -> Session | None:
        config = configs(size)[label]
        return await service.get_session(
            app_name=APP, user_id=USER, session_id=ids[size], config=config
        )

    for size in ids:
        got = await once(size)
        assert got is not None
        assert len(got.events) == RECENT, len(got.events)
    for _ in range(max(3, reads // 10)):
        for size in ids:
            await once(size)
    times: dict[int, list[float]] = {size: [] for size in ids}
    for _ in range(reads):
        for size in ids:
            started = time.perf_counter()
            await once(size)
            times[size].append(time.perf_counter() - started)
    return {size: median(t) * 1e6 for size, t in times.items()}


def configs(size: int) -> dict[str, GetSessionConfig]:
    return {
        f"num_recent_events={RECENT}": GetSessionConfig(num_recent_events=RECENT),
        "after_timestamp (newest 20)": GetSessionConfig(after_timestamp=T0 + size - RECENT),
    }


async def run_service(
    make: Callable[[], Awaitable[tuple[BaseSessionService, Callable[[int], Awaitable[str]]]]],
    close: Callable[[], Awaitable[None]],
    reads: int,
    sizes: Sequence[int],
) -> dict[str, dict[int, float]]:
    service, fill = await make()
    try:
        ids = {size: await fill(size) for size in sizes}
        return {label: await measure(service, ids, label, reads) for label in configs(0)}
    finally:
        await close()


async def run(histstore_url: str, adk_url: str, reads: int, sizes: Sequence[int]) -> dict[str, Any]:
    store = await histstore.connect(histstore_url, migrate=True)
    ours = HiststoreSessionService(store)
    adk = DatabaseSessionService(adk_url)

    async def make_ours() -> tuple[BaseSessionService, Callable[[int], Awaitable[str]]]:
        return ours, lambda size: fill_histstore(ours, store, size)

    async def make_adk() -> tuple[BaseSessionService, Callable[[int], Awaitable[str]]]:
        return adk, lambda size: fill_adk(adk, size)

    results = {
        "histstore": await run_service(make_ours, store.close, reads, sizes),
        "adk DatabaseSessionService": await run_service(make_adk, adk.close, reads, sizes),
    }
    return {
        service: {
            label: {"us": by_size, "ratio": by_size[sizes[-1]] / by_size[sizes[0]]}
            for label, by_size in by_label.items()
        }
        for service, by_label in results.items()
    }


def adk_url(url: str) -> str:
    """The same database as a URL naming the async driver, as ADK's service requires."""
    u = make_url(url)
    driver = "sqlite+aiosqlite" if u.get_backend_name() == "sqlite" else "postgresql+asyncpg"
    return u.set(drivername=driver).render_as_string(hide_password=False)


async def run_sqlite(reads: int, sizes: Sequence[int], where: str | None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="histstore-bench-adk-", dir=where) as tmp:
        ours = str(Path(tmp) / "histstore.db")
        return await run(ours, adk_url(f"sqlite:///{Path(tmp) / 'adk.db'}"), reads, sizes)


async def run_postgres(reads: int, sizes: Sequence[int], admin_url: str) -> dict[str, Any]:
    async with pg_databases(admin_url, ["histstore", "adk"]) as urls:
        return await run(urls["histstore"], adk_url(urls["adk"]), reads, sizes)


# ---------------------------------------------------------------- a fresh process

FRESH_EVENTS, QUICK_FRESH_EVENTS = 150, 40
FRESH_ROUNDS, QUICK_FRESH_ROUNDS = 3, 1
FRESH_TARGET = 1.0
SIDES = ("histstore", "adk DatabaseSessionService")
CALLS = ("create_session", "append_event", "get_session")
"""The calls timed in a fresh process: the first (it opens the store, or ADK's engine and
tables), then the turns."""


async def fresh_worker(side: str, url: str, events: int) -> dict[str, Any]:
    """In a fresh process: make the service, time its first call (``create_session``,
    which opens the store), then turns of one ``get_session`` and four ``append_event``
    calls until ``events`` are stored."""
    service: BaseSessionService
    if side == "histstore":
        service = HiststoreSessionService(url)
        close = service.close
    else:
        service = DatabaseSessionService(url)
        close = service.close
    times: dict[str, list[float]] = {call: [] for call in CALLS}
    cpu: dict[str, list[float]] = {call: [] for call in CALLS}

    async def timed(call: str, op: Awaitable[Any]) -> Any:
        wall, used = time.perf_counter(), time.process_time()
        result = await op
        times[call].append(time.perf_counter() - wall)
        cpu[call].append(time.process_time() - used)
        return result

    try:
        session = await timed("create_session", service.create_session(app_name=APP, user_id=USER))
        todo = session_events(events)
        for start in range(0, events, 4):
            session = await timed(
                "get_session",
                service.get_session(app_name=APP, user_id=USER, session_id=session.id),
            )
            assert session is not None
            for event in todo[start : start + 4]:
                await timed("append_event", service.append_event(session, event))
        return {**times, **{f"{call} cpu": cpu[call] for call in CALLS}}
    finally:
        await close()


async def prepare_fresh(histstore_url: str, adk_url_: str) -> None:
    """Migrate histstore's database and create ADK's tables, so workers find them ready."""
    store = await histstore.connect(histstore_url, migrate=True)
    await store.close()
    adk = DatabaseSessionService(adk_url_)
    try:
        await adk.list_sessions(app_name=APP)  # creates ADK's tables
    finally:
        await adk.close()


def run_fresh_side(side: str, url: str, events: int) -> dict[str, list[float]]:
    """One fresh process's timings (``fresh_worker``), by call."""
    cmd = [sys.executable, os.path.abspath(__file__), "--fresh-worker", side, url, str(events)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"fresh worker {side} failed:\n{proc.stderr[-4000:]}")
    result: dict[str, list[float]] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


async def run_fresh(histstore_url: str, adk_url_: str, events: int, rounds: int) -> dict[str, Any]:
    await prepare_fresh(histstore_url, adk_url_)
    urls = {SIDES[0]: histstore_url, SIDES[1]: adk_url_}
    runs: dict[str, list[dict[str, list[float]]]] = {side: [] for side in SIDES}
    for i in range(rounds):
        order = SIDES if i % 2 == 0 else SIDES[::-1]
        for side in order:
            runs[side].append(await asyncio.to_thread(run_fresh_side, side, urls[side], events))
    out: dict[str, Any] = {}
    for side, results in runs.items():
        out[side] = {
            call: {
                "mean_ms": median([sum(r[call]) / len(r[call]) * 1e3 for r in results]),
                "first_ms": median([r[call][0] * 1e3 for r in results]),
                "cpu_ms": median([sum(r[f"{call} cpu"]) / len(r[call]) * 1e3 for r in results]),
                "calls": len(results[0][call]),
            }
            for call in CALLS
        }
    return out


async def run_fresh_sqlite(events: int, rounds: int, where: str | None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="histstore-bench-adk-fresh-", dir=where) as tmp:
        ours = str(Path(tmp) / "histstore.db")
        return await run_fresh(ours, adk_url(f"sqlite:///{Path(tmp) / 'adk.db'}"), events, rounds)


async def run_fresh_postgres(events: int, rounds: int, admin_url: str) -> dict[str, Any]:
    async with pg_databases(admin_url, ["histstore", "adk"]) as urls:
        return await run_fresh(urls["histstore"], adk_url(urls["adk"]), events, rounds)


def verdict(call: str, ratio: float) -> str:
    """PASS/FAIL against the target; the first call is shown, not judged."""
    if call == "create_session":
        return "-"
    return "PASS" if ratio <= FRESH_TARGET else "FAIL"


def fresh_table(fresh: dict[str, dict[str, Any]], events: int, rounds: int) -> str:
    rows = []
    for kind, by_side in fresh.items():
        for call in CALLS:
            ours, theirs = (by_side[side][call] for side in SIDES)
            ratio = ours["mean_ms"] / theirs["mean_ms"]
            rows.append(
                [
                    call,
                    kind,
                    str(ours["calls"]),
                    f"{ours['mean_ms']:.2f}",
                    f"{theirs['mean_ms']:.2f}",
                    f"{ratio:.2f}x",
                    verdict(call, ratio),
                    f"{ours['first_ms']:.1f}",
                    f"{theirs['first_ms']:.1f}",
                    f"{ours['cpu_ms']:.2f}",
                    f"{theirs['cpu_ms']:.2f}",
                ]
            )
    headers = [
        "call",
        "backend",
        "calls",
        "histstore ms",
        "ADK db ms",
        "ratio",
        f"<={FRESH_TARGET}x",
        "1st hs ms",
        "1st ADK ms",
        "hs CPU ms",
        "ADK CPU ms",
    ]
    title = (
        f"a fresh process: its first call (create_session, which opens the store), then"
        f" the first {events} append_event calls and the get_session of each 4-event turn;"
        f"\nmean latency, median of {rounds} process(es) per side; CPU: the client process's"
        " CPU time per call (the machine's load moves latency, much less CPU time)"
    )
    return title + "\n" + render_table(headers, rows)


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["--fresh-worker"]:
        side, url, events = argv[1], argv[2], int(argv[3])
        print(json.dumps(asyncio.run(fresh_worker(side, url, events))))
        return 0
    parser = bench_parser(__doc__ or "")
    parser.add_argument(
        "--fresh-only", action="store_true", help="only the fresh-process comparison"
    )
    args = parser.parse_args(argv)
    reads = 20 if args.quick else 200
    sizes = QUICK_SIZES if args.quick else SIZES
    kinds = ["sqlite", "postgres"] if args.backend == "all" else [args.backend]
    events = QUICK_FRESH_EVENTS if args.quick else FRESH_EVENTS
    rounds = QUICK_FRESH_ROUNDS if args.quick else FRESH_ROUNDS
    fresh = run_backends(
        kinds,
        lambda: run_fresh_sqlite(events, rounds, args.sqlite_dir),
        lambda: run_fresh_postgres(events, rounds, args.pg_url),
    )
    if args.fresh_only:
        print(fresh_table(fresh, events, rounds))
        if args.json:
            doc = {"fresh": {"events": events, "rounds": rounds, "results": fresh}}
            Path(args.json).write_text(json.dumps(doc, indent=2) + "\n")
        return 0
    results = run_backends(
        kinds,
        lambda: run_sqlite(reads, sizes, args.sqlite_dir),
        lambda: run_postgres(reads, sizes, args.pg_url),
    )
    rows = []
    for kind, by_service in results.items():
        for service, by_label in by_service.items():
            for label, r in by_label.items():
                small, large = (r["us"][size] for size in sizes)
                verdict = "PASS" if r["ratio"] <= TARGET else "FAIL"
                if service != "histstore":
                    verdict = "-"
                rows.append(
                    [
                        kind,
                        service,
                        label,
                        f"{small:,.0f}",
                        f"{large:,.0f}",
                        f"{r['ratio']:.2f}x",
                        verdict,
                    ]
                )
    big = f"{sizes[-1]:,}"
    headers = ["backend", "service", "get_session config", "100 ev us", f"{big} ev us", "ratio"]
    print(f"get_session returning the newest {RECENT} events, median latency ({reads} reads)")
    print(f"ratio: the {big}-event session's latency over the 100-event one's")
    print(render_table([*headers, f"<={TARGET}x"], rows))
    print()
    print(fresh_table(fresh, events, rounds))
    if args.json:
        doc = {
            "reads": reads,
            "sizes": sizes,
            "results": results,
            "fresh": {"events": events, "rounds": rounds, "results": fresh},
        }
        Path(args.json).write_text(json.dumps(doc, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
