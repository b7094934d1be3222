# ruff: noqa: E402
"""Benchmark: bytes stored per turn and turn time of the OpenAI Agents and ADK adapters.

Run from a checkout::

    python bench/session_bytes.py [--backend sqlite|postgres|all] [--pg-url URL]
                                  [--turns N] [--sessions N] [--quick]
                                  [--sqlite-dir DIR] [--json FILE]

Side by side in one run, each on a fresh database of its own:

* OpenAI Agents SDK: histstore's ``HiststoreSession`` against the SDK's own store,
  ``SQLiteSession`` (an SQLite file) and, on Postgres, ``SQLAlchemySession`` (asyncpg);
* Google ADK: histstore's ``HiststoreSessionService`` against ADK's own
  ``DatabaseSessionService`` (an SQLite file through aiosqlite; Postgres through asyncpg).

A turn is the framework's own runner (``agents.Runner.run``; ADK's ``Runner.run_async``)
driving an agent with a scripted model and one function tool: a user message of 10 to
60 words, then on every other turn a tool call and its output, then an answer of 20 to
120 words. Words are drawn from a vocabulary of 4,000 made-up words with Zipf's law, the
same for both sides (one seed), so the full-text index sees text like a chat's.

The sides take turns (in alternating order), ``--turns`` turns on each of
``--sessions`` sessions. Reported per turn:

* bytes: the database's size after the turns minus its size before them (SQLite: the
  file after ``wal_checkpoint(TRUNCATE)`` and ``VACUUM``, with every connection closed,
  histstore's search index flushed as closing does; Postgres: ``pg_total_relation_size``
  of every table of the database, indexes and TOAST included, after ``VACUUM FULL``),
  divided by the turns stored;
* turn time: the mean and p99 of a whole runner turn, and the mean of the time spent in
  the store's own calls during the turn (``get_items``/``add_items``;
  ``get_session``/``append_event``/``create_session``).

Target: histstore at most 1.0x the framework's own store, bytes and turn time.
"""

from __future__ import annotations

import os
import sys

_BENCH = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _BENCH]
sys.path.append(_BENCH)

import functools
import json
import logging
import random
import sqlite3
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from _common import (
    asyncpg_kwargs,
    bench_parser,
    percentile,
    pg_databases,
    pg_server,
    render_table,
    run_backends,
)
from sqlalchemy import make_url

import histstore

TARGET = 1.0


@dataclass(frozen=True)
class Config:
    turns: int
    sessions: int
    seed: int = 41


# ---------------------------------------------------------------- realistic text


def vocabulary(rng: random.Random, size: int = 4000) -> list[str]:
    """``size`` distinct made-up lowercase words of 2 to 10 letters."""
    consonants, vowels = "bcdfghjklmnprstvwz", "aeiou"
    words: set[str] = set()
    while len(words) < size:
        syllables = rng.randint(1, 4)
        w = "".join(rng.choice(consonants) + rng.choice(vowels) for _ in range(syllables))
        if rng.random() < 0.3:
            w += rng.choice(consonants)
        words.add(w)
    return sorted(words)


@dataclass
class Script:
    """The turns both sides are given: the same words, the same tool calls."""

    seed: int
    words: list[str] = field(default_factory=list)
    weights: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        rng = random.Random(self.seed)
        self.words = vocabulary(rng)
        rng.shuffle(self.words)
        self.weights = [1.0 / (rank + 1) for rank in range(len(self.words))]

    def turn(self, n: int) -> tuple[str, str | None, str]:
        """Turn ``n``'s user text, its tool call's city (``None``: no call) and answer."""
        rng = random.Random(self.seed * 1_000_003 + n)

        def sentence(low: int, high: int) -> str:
            words = rng.choices(self.words, self.weights, k=rng.randint(low, high))
            text = " ".join(words)
            return text[0].upper() + text[1:] + "."

        user = sentence(10, 60)
        city = rng.choice(self.words).title() if n % 2 == 1 else None
        return user, city, sentence(20, 120)


def weather(city: str) -> str:
    return f"In {city}: sunny, 21 degrees, wind 9 km/h from the west."


# ---------------------------------------------------------------- timing of the store's calls


class Clock:
    """Sums the time spent in wrapped calls (the store's own), per turn."""

    def __init__(self) -> None:
        self.spent = 0.0

    def wrap(self, obj: Any, *names: str) -> None:
        for name in names:
            method = getattr(obj, name)

            @functools.wraps(method)
            async def timed(*args: Any, __m: Any = method, **kwargs: Any) -> Any:
                started = time.perf_counter()
                try:
                    return await __m(*args, **kwargs)
                finally:
                    self.spent += time.perf_counter() - started

            setattr(obj, name, timed)


@dataclass
class Side:
    """One side of a comparison: how to run a turn on a session, and its timings."""

    name: str
    turn: Callable[[int, int], Awaitable[None]]
    clock: Clock
    prime: Callable[[], Awaitable[Any]]
    """Makes the store's tables (some stores make them on first use)."""
    times: list[float] = field(default_factory=list)
    store_times: list[float] = field(default_factory=list)

    async def run(self, session: int, n: int) -> None:
        self.clock.spent = 0.0
        started = time.perf_counter()
        await self.turn(session, n)
        self.times.append(time.perf_counter() - started)
        self.store_times.append(self.clock.spent)

    def summary(self) -> dict[str, float]:
        return {
            "turn_mean_ms": sum(self.times) / len(self.times) * 1e3,
            "turn_p99_ms": percentile(self.times, 99) * 1e3,
            "store_mean_ms": sum(self.store_times) / len(self.store_times) * 1e3,
        }


async def alternate(sides: Sequence[Side], cfg: Config) -> None:
    """Every side runs every turn of every session, the sides taking turns."""
    step = 0
    for n in range(cfg.turns):
        for session in range(cfg.sessions):
            for side in sides if step % 2 == 0 else list(sides)[::-1]:
                await side.run(session, n)
            step += 1


# ---------------------------------------------------------------- OpenAI Agents SDK


def openai_agent(script: Script) -> Any:
    from agents import Agent, function_tool
    from agents.items import ModelResponse
    from agents.models.interface import Model
    from agents.usage import Usage
    from openai.types.responses import (
        ResponseFunctionToolCall,
        ResponseOutputMessage,
        ResponseOutputText,
    )

    class ScriptedModel(Model):
        """Answers turn ``n`` as ``script`` says: a tool call first on odd turns."""

        def __init__(self) -> None:
            self.turn = 0

        async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
            items = args[1] if len(args) > 1 else kwargs["input"]
            _, city, answer = script.turn(self.turn)
            called = isinstance(items, list) and items[-1].get("type") == "function_call_output"
            if city is not None and not called:
                output: Any = ResponseFunctionToolCall(
                    id=f"fc_{uuid.uuid4().hex}",
                    type="function_call",
                    name="get_weather",
                    arguments=json.dumps({"city": city}),
                    call_id=f"call_{uuid.uuid4().hex[:24]}",
                    status="completed",
                )
            else:
                output = ResponseOutputMessage(
                    id=f"msg_{uuid.uuid4().hex}",
                    type="message",
                    role="assistant",
                    status="completed",
                    content=[ResponseOutputText(type="output_text", text=answer, annotations=[])],
                )
            return ModelResponse(output=[output], usage=Usage(), response_id=None)

        def stream_response(self, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError

    @function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        return weather(city)

    model = ScriptedModel()
    return Agent(name="assistant", model=model, tools=[get_weather]), model


def openai_side(name: str, sessions: Sequence[Any], script: Script) -> Side:
    from agents import Runner

    agent, model = openai_agent(script)
    clock = Clock()
    for s in sessions:
        clock.wrap(s, "get_items", "add_items")

    async def turn(session: int, n: int) -> None:
        model.turn = n
        user, _, answer = script.turn(n)
        result = await Runner.run(agent, user, session=sessions[session])
        assert result.final_output == answer

    async def prime() -> None:
        for s in sessions:
            await s.get_items()

    return Side(name, turn, clock, prime)


# ---------------------------------------------------------------- Google ADK

APP, USER = "bench-app", "bench-user"


def adk_side(name: str, service: Any, script: Script, sessions: int) -> Side:
    from google.adk.agents import LlmAgent
    from google.adk.models.base_llm import BaseLlm
    from google.adk.models.llm_request import LlmRequest
    from google.adk.models.llm_response import LlmResponse
    from google.adk.runners import Runner
    from google.genai import types

    class ScriptedLlm(BaseLlm):
        model: str = "scripted"
        turn: int = 0

        async def generate_content_async(
            self, llm_request: LlmRequest, stream: bool = False
        ) -> AsyncIterator[LlmResponse]:
            _, city, answer = script.turn(self.turn)
            last = llm_request.contents[-1].parts or []
            called = any(p.function_response is not None for p in last)
            if city is not None and not called:
                call = types.FunctionCall(name="get_weather", args={"city": city})
                part = types.Part(function_call=call)
            else:
                part = types.Part(text=answer)
            yield LlmResponse(content=types.Content(role="model", parts=[part]))

    def get_weather(city: str) -> str:
        """The weather in a city."""
        return weather(city)

    llm = ScriptedLlm()
    agent = LlmAgent(name="assistant", model=llm, tools=[get_weather])
    runner = Runner(app_name=APP, agent=agent, session_service=service)
    clock = Clock()
    clock.wrap(service, "get_session", "append_event", "create_session")
    ids = [f"s{i}-{uuid.uuid4().hex[:8]}" for i in range(sessions)]
    made: set[str] = set()

    async def turn(session: int, n: int) -> None:
        sid = ids[session]
        if sid not in made:
            await service.create_session(app_name=APP, user_id=USER, session_id=sid)
            made.add(sid)
        llm.turn = n
        user, _, answer = script.turn(n)
        message = types.Content(role="user", parts=[types.Part(text=user)])
        final = None
        async for event in runner.run_async(user_id=USER, session_id=sid, new_message=message):
            if event.content and event.content.parts and event.content.parts[0].text:
                final = event.content.parts[0].text
        assert final == answer

    async def prime() -> None:
        await service.list_sessions(app_name=APP, user_id=USER)

    return Side(name, turn, clock, prime)


# ---------------------------------------------------------------- sizes


def sqlite_bytes(path: Path) -> int:
    conn = sqlite3.connect(path)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        conn.execute("VACUUM")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()
    return path.stat().st_size


async def pg_bytes(url: str) -> int:
    """Every table of the database, with its indexes and TOAST, after ``VACUUM FULL``."""
    import asyncpg

    conn = await asyncpg.connect(**asyncpg_kwargs(url))
    try:
        await conn.execute("VACUUM FULL")
        total = await conn.fetchval(
            "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c"
            " JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE c.relkind IN ('r', 'p', 'm')"
            " AND n.nspname NOT IN ('pg_catalog', 'information_schema')"
        )
    finally:
        await conn.close()
    return int(total)


def async_url(url: str) -> str:
    u = make_url(url)
    driver = "sqlite+aiosqlite" if u.get_backend_name() == "sqlite" else "postgresql+asyncpg"
    return u.set(drivername=driver).render_as_string(hide_password=False)


# ---------------------------------------------------------------- the comparisons


@asynccontextmanager
async def openai_sides(
    hs_target: str,
    own: Callable[[str], Any],
    close_own: Callable[[], Awaitable[None]],
    own_name: str,
    script: Script,
    cfg: Config,
) -> AsyncIterator[list[Side]]:
    from histstore.integrations.openai_agents import HiststoreSession

    async with histstore.connect(hs_target, migrate=True) as store:
        ids = [f"chat-{i}-{uuid.uuid4().hex[:8]}" for i in range(cfg.sessions)]
        ours = [HiststoreSession(i, store) for i in ids]
        theirs = [own(i) for i in ids]
        try:
            yield [
                openai_side("histstore HiststoreSession", ours, script),
                openai_side(own_name, theirs, script),
            ]
        finally:
            await close_own()


async def compare(
    label: str,
    sizes: Callable[[], Awaitable[dict[str, int]]],
    sides: Callable[[], Any],
    cfg: Config,
) -> dict[str, Any]:
    """Sizes before, the turns, sizes after (everything closed), per turn."""
    async with sides() as made:
        for side in made:
            await side.prime()
    empty = await sizes()
    async with sides() as made:
        await alternate(made, cfg)
        timings = {side.name: side.summary() for side in made}
    full = await sizes()
    turns = cfg.turns * cfg.sessions
    names = list(timings)
    out: dict[str, Any] = {"label": label, "sides": {}}
    for name, key in zip(names, ("histstore", "own"), strict=True):
        out["sides"][name] = {
            **timings[name],
            "bytes_per_turn": (full[key] - empty[key]) / turns,
        }
    return out


async def run_sqlite(directory: str | None, cfg: Config) -> dict[str, Any]:
    from agents import SQLiteSession
    from google.adk.sessions import DatabaseSessionService

    from histstore.integrations.adk import HiststoreSessionService

    script = Script(cfg.seed)
    results = []
    with tempfile.TemporaryDirectory(prefix="histstore-bench-bytes-", dir=directory) as tmp:
        root = Path(tmp)

        # OpenAI Agents: HiststoreSession vs SQLiteSession
        oa = {"histstore": root / "oa-histstore.db", "own": root / "oa-own.db"}
        own_sessions: list[Any] = []

        def own(session_id: str) -> Any:
            s = SQLiteSession(session_id, oa["own"])
            own_sessions.append(s)
            return s

        async def close_own() -> None:
            for s in own_sessions:
                s.close()
            own_sessions.clear()

        async def oa_sizes() -> dict[str, int]:
            return {k: sqlite_bytes(p) for k, p in oa.items()}

        results.append(
            await compare(
                "OpenAI Agents",
                oa_sizes,
                lambda: openai_sides(
                    str(oa["histstore"]), own, close_own, "SDK SQLiteSession", script, cfg
                ),
                cfg,
            )
        )

        # ADK: HiststoreSessionService vs DatabaseSessionService
        adk = {"histstore": root / "adk-histstore.db", "own": root / "adk-own.db"}

        @asynccontextmanager
        async def adk_sides() -> AsyncIterator[list[Side]]:
            ours = HiststoreSessionService(str(adk["histstore"]))
            theirs = DatabaseSessionService(async_url(f"sqlite:///{adk['own']}"))
            try:
                yield [
                    adk_side("histstore SessionService", ours, script, cfg.sessions),
                    adk_side("ADK DatabaseSessionService", theirs, script, cfg.sessions),
                ]
            finally:
                await ours.close()
                await theirs.close()

        async def adk_sizes() -> dict[str, int]:
            return {k: sqlite_bytes(p) if p.exists() else 0 for k, p in adk.items()}

        results.append(await compare("ADK", adk_sizes, adk_sides, cfg))
    return {"comparisons": results}


async def run_postgres(admin_url: str, cfg: Config) -> dict[str, Any]:
    from agents.extensions.memory.sqlalchemy_session import SQLAlchemySession
    from google.adk.sessions import DatabaseSessionService
    from sqlalchemy.ext.asyncio import create_async_engine

    from histstore.integrations.adk import HiststoreSessionService

    script = Script(cfg.seed)
    results = []
    names = ["oa_hs", "oa_own", "adk_hs", "adk_own"]
    async with pg_databases(admin_url, names) as urls:
        engines: list[Any] = []

        def own(session_id: str) -> Any:
            if not engines:
                engines.append(create_async_engine(async_url(urls["oa_own"])))
            return SQLAlchemySession(session_id, engine=engines[0], create_tables=True)

        async def close_own() -> None:
            for e in engines:
                await e.dispose()
            engines.clear()

        async def oa_sizes() -> dict[str, int]:
            return {
                "histstore": await pg_bytes(urls["oa_hs"]),
                "own": await pg_bytes(urls["oa_own"]),
            }

        @asynccontextmanager
        async def oa_sides() -> AsyncIterator[list[Side]]:
            async with openai_sides(
                urls["oa_hs"], own, close_own, "SDK SQLAlchemySession", script, cfg
            ) as sides:
                yield sides

        results.append(await compare("OpenAI Agents", oa_sizes, oa_sides, cfg))

        async with histstore.connect(urls["adk_hs"], migrate=True):
            pass  # Postgres is migrated on request only

        @asynccontextmanager
        async def adk_sides() -> AsyncIterator[list[Side]]:
            ours = HiststoreSessionService(urls["adk_hs"])
            theirs = DatabaseSessionService(async_url(urls["adk_own"]))
            try:
                yield [
                    adk_side("histstore SessionService", ours, script, cfg.sessions),
                    adk_side("ADK DatabaseSessionService", theirs, script, cfg.sessions),
                ]
            finally:
                await ours.close()
                await theirs.close()

        async def adk_sizes() -> dict[str, int]:
            return {
                "histstore": await pg_bytes(urls["adk_hs"]),
                "own": await pg_bytes(urls["adk_own"]),
            }

        results.append(await compare("ADK", adk_sizes, adk_sides, cfg))
        server = await pg_server(admin_url)
    return {"comparisons": results, "server": server}


def report(results: dict[str, dict[str, Any]], cfg: Config) -> str:
    rows = []
    for kind, r in results.items():
        for comparison in r["comparisons"]:
            (hs_name, hs), (own_name, own) = comparison["sides"].items()
            b_ratio = hs["bytes_per_turn"] / own["bytes_per_turn"]
            t_ratio = hs["turn_mean_ms"] / own["turn_mean_ms"]
            for name, side, b, t in ((hs_name, hs, b_ratio, t_ratio), (own_name, own, None, None)):
                rows.append(
                    [
                        kind,
                        name,
                        f"{side['bytes_per_turn']:,.0f}",
                        "" if b is None else f"{b:.2f}x",
                        f"{side['turn_mean_ms']:.2f}",
                        f"{side['turn_p99_ms']:.2f}",
                        "" if t is None else f"{t:.2f}x",
                        f"{side['store_mean_ms']:.2f}",
                        ""
                        if b is None or t is None
                        else ("PASS" if b <= TARGET and t <= TARGET else "FAIL"),
                    ]
                )
    headers = [
        "backend",
        "store",
        "bytes/turn",
        "ratio",
        "turn ms",
        "p99 ms",
        "ratio",
        "in store ms",
        f"<={TARGET}x",
    ]
    lines = [
        f"{cfg.turns} turns x {cfg.sessions} sessions per store, the sides alternating;"
        " bytes and turn time per runner turn (ratio: histstore / the framework's own store)",
        render_table(headers, rows),
    ]
    if "postgres" in results:
        lines.append(results["postgres"]["server"])
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = bench_parser(__doc__ or "")
    parser.add_argument("--turns", type=int, default=None, help="turns per session")
    parser.add_argument("--sessions", type=int, default=None, help="sessions per store")
    args = parser.parse_args(argv)
    logging.disable(logging.WARNING)  # the frameworks' notes on missing usage and tracing
    from agents import set_tracing_disabled

    set_tracing_disabled(True)
    cfg = Config(
        turns=args.turns or (20 if args.quick else 200),
        sessions=args.sessions or (1 if args.quick else 2),
    )
    kinds = ["sqlite", "postgres"] if args.backend == "all" else [args.backend]
    results = run_backends(
        kinds,
        lambda: run_sqlite(args.sqlite_dir, cfg),
        lambda: run_postgres(args.pg_url, cfg),
    )
    print(report(results, cfg))
    if args.json:
        doc = {"config": asdict(cfg), "results": results}
        Path(args.json).write_text(json.dumps(doc, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
