"""Benchmark: how each public operation's cost grows with what it does not return.

Run from a checkout::

    python bench/growth.py [--backend sqlite|postgres|all] [--pg-url URL] [--quick]
                           [--others N] [--history N] [--factor F] [--repeat R]
                           [--only WORD,...] [--sqlite-dir DIR] [--json FILE]

Every public operation of ``Store`` (and of a scoped view), the ``histstore`` command's
subcommands and the framework adapters' main calls is timed on two stores that differ
only in size, and the report gives the medians and their ratio (the growth). There are
two axes, each with its own pair of stores:

- ``store``: the store around the conversations an operation touches grows. A user
  ``me`` has 10 conversations of 20 messages (and 10 ADK sessions); the store holds
  ``--others`` (default 100) other users' conversations and ADK sessions, all using the
  same metadata keys and the same common word, in the small store and ``--factor``
  (default 20) times as many in the big one.
- ``history``: one conversation grows: ``--history`` (default 100) messages (entries,
  list items, ADK events and memories, Agents items, LangGraph checkpoints) in the
  small store, ``--factor`` times as many in the big one.

An operation marked flat should cost about the same in both (growth <= 2.0); one that
is not is marked ``!`` in the last column. Operations that must read what grows (a whole
conversation's ``read``, ``load``, ``export``, ``fork``, a common word's matches) are
timed too, marked ``(grows)``, and never flagged. Each figure is the median of
``--repeat`` (default 9) calls after one warm-up call; the calls go round robin over
the operations and the two stores, so that a burst of the machine's noise falls on a
few calls of many operations, on both stores alike. Writes that change what the
next call sees are undone between calls (untimed) or are appends, whose growth over a
few calls is negligible. Each store is loaded, closed (which indexes the full-text
index's backlog), settled (SQLite: the WAL checkpointed; PostgreSQL: ``VACUUM
ANALYZE``, as autovacuum would have done in a store that grew over time) and opened
again before it is timed. Stores are opened with ``durability="process"`` (no fsync per
commit: the disk's noise would hide what the operations do; ``--durability full``).

CLI commands run in this process (``histstore.cli.main`` in a worker thread, output
discarded), so their figure includes opening a store, as each command does. The default
run takes a few minutes on a small machine; ``--quick`` is a smoke test.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from _common import asyncpg_kwargs, bench_parser, pg_databases, render_table, run_and_report

# ``bench/langgraph.py`` is named like the package it measures and this folder comes
# first on sys.path when run as a script: drop it (``_common`` is in).
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]

import histstore  # noqa: E402
from histstore import ConversationState, Message, SemanticIndex, Summary, admin  # noqa: E402

APP = "bench-app"
WORD = "common"
FLAT_LIMIT = 2.0


@dataclass
class Config:
    others: int = 100
    history: int = 100
    factor: int = 20
    repeat: int = 9
    only: str = ""
    durability: str = "process"


@dataclass
class Op:
    """One timed call: ``run(world)``; ``undo(world)`` after each call (untimed)."""

    name: str
    axis: str
    run: Callable[[World], Awaitable[Any]]
    undo: Callable[[World], Awaitable[Any]] | None = None
    flat: bool = True


@dataclass
class World:
    """One store of one size, with its adapters and the ids the operations use."""

    url: str
    store: histstore.Store
    size: int
    extra: dict[str, Any] = field(default_factory=dict)
    counter: int = 0

    def fresh(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}-{self.counter}"


def text(i: int, word: str = WORD) -> str:
    return f"message {i} about the {word} topic, with some more words to index {i % 7}"


def _deferred_imports() -> dict[str, Any]:
    """The adapters' names (imported once, before any clock starts)."""
    from google.adk.events import Event
    from google.adk.memory.memory_entry import MemoryEntry
    from google.adk.sessions.base_session_service import GetSessionConfig
    from google.genai import types
    from langgraph.checkpoint.conformance.test_utils import generate_checkpoint, generate_metadata

    from histstore.integrations.adk import HiststoreMemoryService, HiststoreSessionService
    from histstore.integrations.langgraph import HiststoreSaver
    from histstore.integrations.openai_agents import HiststoreSession

    return {
        "Event": Event,
        "MemoryEntry": MemoryEntry,
        "GetSessionConfig": GetSessionConfig,
        "types": types,
        "generate_checkpoint": generate_checkpoint,
        "generate_metadata": generate_metadata,
        "HiststoreMemoryService": HiststoreMemoryService,
        "HiststoreSessionService": HiststoreSessionService,
        "HiststoreSaver": HiststoreSaver,
        "HiststoreSession": HiststoreSession,
    }


M = _deferred_imports()


def adk_event(i: int, author: str = "user") -> Any:
    role = "user" if author == "user" else "model"
    content = M["types"].Content(role=role, parts=[M["types"].Part(text=text(i))])
    return M["Event"](invocation_id="bench", author=author, content=content, timestamp=1e9 + i)


def memory_entry(i: int, tag: str) -> Any:
    content = M["types"].Content(role="user", parts=[M["types"].Part(text=text(i))])
    return M["MemoryEntry"](
        id=f"{tag}-{i}", content=content, author="user", timestamp="2026-01-01T00:00:00+00:00"
    )


async def embed(texts: list[str]) -> list[list[float]]:
    return [[float(len(t) % 7 + 1), float(sum(map(ord, t)) % 11 + 1), 1.0] for t in texts]


async def gather_in(chunk: int, calls: list[Callable[[], Awaitable[Any]]]) -> None:
    for i in range(0, len(calls), chunk):
        await asyncio.gather(*(c() for c in calls[i : i + chunk]))


# ---------------------------------------------------------------- building the stores


async def build_store_axis(store: histstore.Store, others: int) -> dict[str, Any]:
    """``others`` users' conversations and ADK sessions around ``me``'s ten."""
    sessions = M["HiststoreSessionService"](store)
    memory = M["HiststoreMemoryService"](store)

    def other(j: int) -> Callable[[], Awaitable[Any]]:
        async def run() -> None:
            user = f"u{j}"
            meta = {"kind": "chat", "app": APP, "user": user}
            await store.scoped(user).write(
                f"o{j}", [Message.user(text(j)), Message.assistant(text(j + 1))], metadata=meta
            )
            await sessions.create_session(app_name=APP, user_id=user, session_id=f"s{j}")
            await memory.add_memory(app_name=APP, user_id=user, memories=[memory_entry(j, "o")])

        return run

    await gather_in(16, [other(j) for j in range(others)])
    me = store.scoped("me")
    for i in range(10):
        meta = {"kind": "chat", "app": APP, "user": "me"}
        batch = [Message.system("be brief")] + [Message.user(text(k)) for k in range(19)]
        await me.write(f"me-{i}", batch, metadata=meta)
        await sessions.create_session(app_name=APP, user_id="me", session_id=f"me-s{i}")
    await memory.add_memory(
        app_name=APP, user_id="me", memories=[memory_entry(i, "me") for i in range(20)]
    )
    session = await sessions.get_session(app_name=APP, user_id="me", session_id="me-s0")
    return {"sessions": sessions, "session": session, "memory": memory}


async def build_history_axis(store: histstore.Store, length: int) -> dict[str, Any]:
    """One conversation (and one of each adapter's) of ``length``."""
    step = 50
    for s in range(0, length, step):
        batch = [Message.user(text(i)) for i in range(s, min(length, s + step))]
        await store.write("h", batch)
        await store.list_append("h", "items", list(range(s, s + len(batch))))
    for s in range(0, length, 20):  # an editable history: a revision per batch
        await store.write("e", [Message.user(text(i)) for i in range(s, min(length, s + 20))])
    await store.add_summary("h", Summary(start=0, end=9, content="the first ten"))
    index = SemanticIndex(store, embed, model="bench")
    await index.update("h")

    sessions = M["HiststoreSessionService"](store)
    session = await sessions.create_session(app_name=APP, user_id="me", session_id="long")
    for i in range(length):  # the session value follows its appends
        await sessions.append_event(session, adk_event(i, "user" if i % 2 == 0 else "agent"))
    session = await sessions.get_session(app_name=APP, user_id="me", session_id="long")

    memory = M["HiststoreMemoryService"](store)
    for s in range(0, length, 50):
        entries = [memory_entry(i, "m") for i in range(s, min(length, s + 50))]
        await memory.add_memory(app_name=APP, user_id="me", memories=entries)

    agents = M["HiststoreSession"]("agents", store)
    for s in range(0, length, 50):
        await agents.add_items(
            [{"role": "user", "content": text(i)} for i in range(s, min(length, s + 50))]
        )

    saver = M["HiststoreSaver"](store)
    config: Any = {"configurable": {"thread_id": "graph", "checkpoint_ns": ""}}
    for i in range(length):
        config = await put_checkpoint(saver, config, i)
    return {
        "index": index,
        "sessions": sessions,
        "session": session,
        "memory": memory,
        "agents": agents,
        "saver": saver,
        "graph": config,
    }


async def put_checkpoint(saver: Any, config: Any, step: int) -> Any:
    cp = M["generate_checkpoint"](channel_values={"step": step}, channel_versions={"step": step})
    return await saver.aput(config, cp, M["generate_metadata"](step=step), {"step": step})


# ---------------------------------------------------------------- the operations


def cli(*argv: str) -> Callable[[World], Awaitable[Any]]:
    """A ``histstore`` command on the world's database (``{url}`` is replaced)."""
    from histstore.cli import main

    def call(url: str) -> None:
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
            main([a.replace("{url}", url) for a in argv])

    async def run(w: World) -> None:
        await asyncio.to_thread(call, w.url)

    return run


async def _undo_write(w: World, c: str = "me-0") -> None:
    await w.store.pop(c)


def store_ops() -> list[Op]:
    me = "me-0"
    meta3 = {"kind": "chat", "app": APP, "user": "me"}

    async def forked(w: World) -> None:
        await w.store.fork("me-1", w.fresh("fork"))

    async def saved(w: World) -> None:
        state = ConversationState(w.fresh("saved"), messages=(Message.user("hi"),))
        await w.store.save(state)

    async def cleared(w: World) -> None:
        c = w.fresh("clear")
        await w.store.write(c, [Message.user("x")])
        await w.store.clear(c)

    async def popped(w: World) -> None:
        await w.store.write(me, [Message.user("x")])
        await w.store.pop(me)

    async def leased(w: World) -> None:
        async with w.store.lease(me, ttl=30):
            pass

    async def edited(w: World) -> None:
        value = await w.store.edit("me-2")
        value.splice(len(value.messages), len(value.messages), [Message.user("edit")], by="b")
        await w.store.commit(value)

    async def memory_search(w: World) -> Any:
        return await w.extra["memory"].search_memory(app_name=APP, user_id="me", query=WORD)

    async def memory_add(w: World) -> None:
        await w.extra["memory"].add_memory(
            app_name=APP, user_id="me", memories=[memory_entry(0, w.fresh("n"))]
        )

    async def list_sessions(w: World) -> Any:
        return await w.extra["sessions"].list_sessions(app_name=APP, user_id="me")

    async def get_session(w: World) -> Any:
        return await w.extra["sessions"].get_session(
            app_name=APP,
            user_id="me",
            session_id="me-s1",
            config=M["GetSessionConfig"](num_recent_events=20),
        )

    s = "store"
    ops = [
        Op("write one message", s, lambda w: w.store.write(me, [Message.user("x")]), _undo_write),
        Op("write + pop", s, popped),
        Op("read(limit=20)", s, lambda w: w.store.read(me, limit=20)),
        Op("read() of 20", s, lambda w: w.store.read(me)),
        Op("count", s, lambda w: w.store.count(me)),
        Op("exists", s, lambda w: w.store.exists(me)),
        Op("status", s, lambda w: w.store.status(me)),
        Op("system_messages", s, lambda w: w.store.system_messages(me)),
        Op("newest_by", s, lambda w: w.store.newest_by(me, "nobody")),
        Op("write + clear", s, cleared),
        Op("load", s, lambda w: w.store.load("me-1")),
        Op("save (new id)", s, saved),
        Op("fork (new id)", s, forked),
        Op("metadata", s, lambda w: w.store.metadata("me-1")),
        Op("merge_metadata", s, lambda w: w.store.merge_metadata("me-1", {"seen": w.fresh("v")})),
        Op("list_append", s, lambda w: w.store.list_append("me-1", "l", [1])),
        Op("list_len", s, lambda w: w.store.list_len("me-1", "l")),
        Op("summaries", s, lambda w: w.store.summaries("me-1")),
        Op("edit + commit", s, edited),
        Op("changes(limit=5)", s, lambda w: w.store.changes("me-2", limit=5)),
        Op("lease + release", s, leased),
        Op("purge (none idle)", s, lambda w: w.store.purge(idle_for=timedelta(days=1))),
        Op("conversations(limit=20)", s, lambda w: w.store.conversations(limit=20)),
        Op(
            "conversations(updated, desc, 20)",
            s,
            lambda w: w.store.conversations(order="updated", descending=True, limit=20),
        ),
        Op(
            "conversations(created, 20)",
            s,
            lambda w: w.store.conversations(order="created", limit=20),
        ),
        Op("conversations(user=me)", s, lambda w: w.store.conversations(user="me")),
        Op(
            "conversations(metadata user=me)",
            s,
            lambda w: w.store.conversations(metadata={"user": "me"}),
        ),
        Op(
            "conversations(metadata 3 keys)",
            s,
            lambda w: w.store.conversations(metadata=meta3),
        ),
        Op(
            "conversations(metadata 3 keys, updated)",
            s,
            lambda w: w.store.conversations(metadata=meta3, order="updated", limit=5),
        ),
        Op(
            "admin.list_conversations(3 keys)",
            s,
            lambda w: admin.list_conversations(w.store, metadata=meta3),
        ),
        Op(
            "admin.count_conversations(3 keys)",
            s,
            lambda w: admin.count_conversations(w.store, metadata=meta3),
        ),
        Op("search(word, conversation=)", s, lambda w: w.store.search(WORD, conversation=me)),
        Op("search(word) store-wide", s, lambda w: w.store.search(WORD), flat=False),
        Op("search(rare word)", s, lambda w: w.store.search("nowhere")),
        Op("scoped: read(limit=20)", s, lambda w: w.store.scoped("me").read(me, limit=20)),
        Op(
            "scoped: write one message",
            s,
            lambda w: w.store.scoped("me").write(me, [Message.user("x")]),
            _undo_write,
        ),
        Op("scoped: conversations()", s, lambda w: w.store.scoped("me").conversations()),
        Op("scoped: search(word)", s, lambda w: w.store.scoped("me").search(WORD)),
        Op("ADK list_sessions(user=me)", s, list_sessions),
        Op("ADK search_memory(word)", s, memory_search),
        Op("ADK add_memory(one)", s, memory_add),
        Op("ADK get_session(20 recent)", s, get_session),
        Op("cli ls --user me", s, cli("ls", "--url", "{url}", "--user", "me")),
        Op("cli ls --limit 20", s, cli("ls", "--url", "{url}", "--limit", "20")),
        Op("cli search --user me", s, cli("search", "--url", "{url}", "--user", "me", WORD)),
        Op("cli show me-0", s, cli("show", "--url", "{url}", me)),
        Op("cli export me-0", s, cli("export", "--url", "{url}", me)),
        Op("cli stats", s, cli("stats", "--url", "{url}"), flat=False),
    ]
    return ops


def history_ops() -> list[Op]:
    async def semantic_update(w: World) -> None:
        await w.store.write("h", [Message.user(text(w.counter))])
        await w.extra["index"].update("h")

    async def undo_semantic(w: World) -> None:
        await w.store.pop("h")

    async def changes_tail(w: World) -> Any:
        return await w.store.changes("e", since=max(0, w.extra["rev"] - 5), limit=5)

    async def revert_one(w: World) -> None:
        before = w.extra["rev"]
        await w.store.write("e", [Message.user("undo me")])
        w.extra["rev"] = await w.store.revert("e", before, by="bench")

    async def memory_add(w: World) -> None:
        await w.extra["memory"].add_memory(
            app_name=APP, user_id="me", memories=[memory_entry(w.counter + 10**6, w.fresh("n"))]
        )

    async def memory_search(w: World) -> Any:
        return await w.extra["memory"].search_memory(app_name=APP, user_id="me", query=WORD)

    async def adk_append(w: World) -> None:
        sessions = w.extra["sessions"]
        session = await sessions.get_session(
            app_name=APP,
            user_id="me",
            session_id="long",
            config=M["GetSessionConfig"](num_recent_events=1),
        )
        await sessions.append_event(session, adk_event(w.counter, "user"))
        w.counter += 1

    async def adk_get(w: World) -> Any:
        return await w.extra["sessions"].get_session(
            app_name=APP,
            user_id="me",
            session_id="long",
            config=M["GetSessionConfig"](num_recent_events=20),
        )

    async def agents_add(w: World) -> None:
        await w.extra["agents"].add_items([{"role": "user", "content": "x"}])

    async def agents_undo(w: World) -> None:
        await w.extra["agents"].pop_item()

    async def graph_put(w: World) -> None:
        w.extra["graph"] = await put_checkpoint(w.extra["saver"], w.extra["graph"], w.size)

    async def graph_get(w: World) -> Any:
        config = {"configurable": {"thread_id": "graph", "checkpoint_ns": ""}}
        return await w.extra["saver"].aget_tuple(config)

    async def graph_list(w: World) -> Any:
        config = {"configurable": {"thread_id": "graph", "checkpoint_ns": ""}}
        return [t async for t in w.extra["saver"].alist(config, limit=10)]

    h = "history"
    return [
        Op(
            "write one message", h, lambda w: w.store.write("h", [Message.user("x")]), undo_semantic
        ),
        Op("read(limit=20)", h, lambda w: w.store.read("h", limit=20)),
        Op("read() whole", h, lambda w: w.store.read("h"), flat=False),
        Op("count", h, lambda w: w.store.count("h")),
        Op("status", h, lambda w: w.store.status("h")),
        Op("system_messages", h, lambda w: w.store.system_messages("h")),
        Op("write + pop", h, lambda w: _write_pop(w.store, "h")),
        Op("load", h, lambda w: w.store.load("h"), flat=False),
        Op("fork (new id)", h, lambda w: w.store.fork("h", w.fresh("f")), flat=False),
        Op("list_append", h, lambda w: w.store.list_append("h", "items", [0])),
        Op("list_load(last 10)", h, lambda w: w.store.list_load("h", "items", start=w.size - 10)),
        Op("list_len", h, lambda w: w.store.list_len("h", "items")),
        Op("summaries", h, lambda w: w.store.summaries("h")),
        Op(
            "search(word, conversation=)",
            h,
            lambda w: w.store.search(WORD, conversation="h"),
            flat=False,
        ),
        Op(
            "search(rare word, conversation=)",
            h,
            lambda w: w.store.search("nowhere", conversation="h"),
        ),
        Op("write + SemanticIndex.update(c)", h, semantic_update, undo_semantic),
        Op(
            "SemanticIndex.search(c)",
            h,
            lambda w: w.extra["index"].search(WORD, conversation="h"),
            flat=False,
        ),
        Op("edit() whole", h, lambda w: w.store.edit("e"), flat=False),
        Op("changes(since=rev-5, limit=5)", h, changes_tail),
        Op("write + revert(rev-1)", h, revert_one),
        Op("ADK add_memory(one)", h, memory_add),
        Op("ADK search_memory(word)", h, memory_search, flat=False),
        Op("ADK append_event", h, adk_append),
        Op("ADK get_session(20 recent)", h, adk_get),
        Op("Agents add_items(one)", h, agents_add, agents_undo),
        Op("Agents get_items(limit=20)", h, lambda w: w.extra["agents"].get_items(limit=20)),
        Op("LangGraph aput", h, graph_put),
        Op("LangGraph aget_tuple", h, graph_get),
        Op("LangGraph alist(limit=10)", h, graph_list),
        Op("cli show h --last 3", h, cli("show", "--url", "{url}", "h", "--last", "3")),
        Op(
            "cli show h --last 3 --json",
            h,
            cli("show", "--url", "{url}", "h", "--last", "3", "--json"),
        ),
        Op("cli log e --limit 5", h, cli("log", "--url", "{url}", "e", "--limit", "5")),
        Op("cli export h", h, cli("export", "--url", "{url}", "h"), flat=False),
    ]


async def _write_pop(store: histstore.Store, c: str) -> None:
    await store.write(c, [Message.user("x")])
    await store.pop(c)


# ---------------------------------------------------------------- running


async def measure_all(ops: list[Op], pair: list[World], repeat: int) -> list[list[float]]:
    """Median microseconds of each op in each world. Calls go round robin: in each of
    ``repeat`` rounds (after a warm-up round) every op runs once in each world, the
    worlds' order alternating by round, so a burst of the machine's noise falls on a few
    calls of many ops rather than on every call of one."""
    times = [[[] for _ in pair] for _ in ops]
    for round_ in range(repeat + 1):
        order = list(enumerate(pair)) if round_ % 2 else list(enumerate(pair))[::-1]
        for op, spent in zip(ops, times, strict=True):
            for i, w in order:
                started = time.perf_counter()
                await op.run(w)
                took = time.perf_counter() - started
                if op.undo is not None:
                    await op.undo(w)
                if round_:
                    spent[i].append(took)
    return [[statistics.median(t) * 1e6 for t in spent] for spent in times]


def attach(store: histstore.Store, extra: dict[str, Any]) -> None:
    """Make the adapters and the semantic index of ``extra`` again, on ``store``."""
    extra["sessions"] = M["HiststoreSessionService"](store)
    extra["memory"] = M["HiststoreMemoryService"](store)
    extra["index"] = SemanticIndex(store, embed, model="bench")
    extra["agents"] = M["HiststoreSession"]("agents", store)
    extra["saver"] = M["HiststoreSaver"](store)


@contextlib.asynccontextmanager
async def opened(url: str, durability: Any) -> AsyncIterator[histstore.Store]:
    store = await histstore.connect(url, migrate=True, durability=durability)
    try:
        yield store
    finally:
        await store.close()


async def run_backend(
    cfg: Config, urls: dict[str, str], settle: Callable[[str], Awaitable[None]]
) -> dict[str, Any]:
    sizes = {
        "store": (cfg.others, cfg.others * cfg.factor),
        "history": (cfg.history, cfg.history * cfg.factor),
    }
    builders = {"store": build_store_axis, "history": build_history_axis}
    ops = {"store": store_ops(), "history": history_ops()}
    rows: list[dict[str, Any]] = []
    for axis in ("store", "history"):
        wanted = [part for part in cfg.only.split(",") if part] or [""]
        chosen = [op for op in ops[axis] if any(part in op.name for part in wanted)]
        if not chosen:
            continue
        worlds: list[World] = []
        async with contextlib.AsyncExitStack() as stack:
            for which, size in zip(("small", "big"), sizes[axis], strict=True):
                url = urls[f"{axis}_{which}"]
                started = time.perf_counter()
                async with opened(url, cfg.durability) as loading:
                    extra = await builders[axis](loading, size)
                    if axis == "history":
                        extra["rev"] = (await loading.changes("e"))[-1].revision
                # Closed (the full-text index's backlog indexed), then settled: the WAL
                # checkpointed, or VACUUM ANALYZE as autovacuum would have run.
                await settle(url)
                print(
                    f"  built {axis} {which} ({size:,}) in {time.perf_counter() - started:.1f} s",
                    file=sys.stderr,
                )
                store = await stack.enter_async_context(opened(url, cfg.durability))
                attach(store, extra)
                await store.search(WORD, limit=1)  # SQLite: indexes what is still listed
                worlds.append(World(url=_cli_url(url), store=store, size=size, extra=extra))
            medians = await measure_all(chosen, worlds, cfg.repeat)
            for op, (small, big) in zip(chosen, medians, strict=True):
                rows.append(
                    {
                        "op": op.name,
                        "axis": axis,
                        "sizes": list(sizes[axis]),
                        "small_us": small,
                        "big_us": big,
                        "growth": big / small if small else 0.0,
                        "flat": op.flat,
                    }
                )
    return {"rows": rows}


def _cli_url(url: str) -> str:
    """The URL the ``histstore`` command takes (a plain file path for SQLite)."""
    prefix = "sqlite+aiosqlite:///"
    return url[len(prefix) :] if url.startswith(prefix) else url


def report(results: dict[str, dict[str, Any]], cfg: Config) -> str:
    out: list[str] = [f"histstore from {Path(histstore.__file__).parent.parent}", ""]
    for backend, result in results.items():
        table = []
        for r in result["rows"]:
            flag = "" if not r["flat"] else ("!" if r["growth"] > FLAT_LIMIT else "ok")
            table.append(
                [
                    f"{backend} {r['axis']:<7} {r['op']}",
                    f"{r['sizes'][0]:,} -> {r['sizes'][1]:,}",
                    f"{r['small_us']:,.0f}",
                    f"{r['big_us']:,.0f}",
                    f"{r['growth']:.2f}x",
                    flag if r["flat"] else "(grows)",
                ]
            )
        out.append(
            render_table(
                ["backend axis operation", "sizes", "small us", "big us", "growth", "flat"], table
            )
        )
        over = [r["op"] for r in result["rows"] if r["flat"] and r["growth"] > FLAT_LIMIT]
        out.append(
            f"{backend}: {len(over)} flat operation(s) above {FLAT_LIMIT}x: "
            + (", ".join(over) if over else "none")
        )
        out.append("")
    return "\n".join(out)


AXES = ("store_small", "store_big", "history_small", "history_big")


def main() -> int:
    parser: argparse.ArgumentParser = bench_parser(__doc__ or "")
    parser.add_argument("--others", type=int, default=None, help="other users (100; quick: 5)")
    parser.add_argument("--history", type=int, default=None, help="history length (100; quick: 10)")
    parser.add_argument("--factor", type=int, default=20, help="big / small (20)")
    parser.add_argument("--repeat", type=int, default=None, help="calls per figure (9; quick: 2)")
    parser.add_argument(
        "--durability",
        choices=["process", "full"],
        default="process",
        help="connect(durability=...) (process, the default: no fsync per commit, less noise)",
    )
    parser.add_argument(
        "--only", default="", help="only operations whose name holds one of these (comma-separated)"
    )
    args = parser.parse_args()
    cfg = Config(
        others=args.others or (5 if args.quick else 100),
        history=args.history or (10 if args.quick else 100),
        factor=args.factor if not args.quick or args.factor != 20 else 3,
        repeat=args.repeat or (2 if args.quick else 9),
        only=args.only,
        durability=args.durability,
    )

    async def sqlite() -> dict[str, Any]:
        with tempfile.TemporaryDirectory(dir=args.sqlite_dir) as tmp:
            urls = {a: f"sqlite+aiosqlite:///{Path(tmp) / a}.db" for a in AXES}

            async def checkpoint(url: str) -> None:
                with contextlib.closing(sqlite3.connect(_cli_url(url))) as conn:
                    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")

            return await run_backend(cfg, urls, checkpoint)

    async def postgres() -> dict[str, Any]:
        import asyncpg

        async with pg_databases(args.pg_url, AXES) as dbs:
            urls = {
                a: u.replace("postgresql://", "postgresql+asyncpg://", 1) for a, u in dbs.items()
            }

            async def vacuum(url: str) -> None:
                conn = await asyncpg.connect(**asyncpg_kwargs(url.replace("+asyncpg", "")))
                try:
                    await conn.execute("VACUUM ANALYZE")
                finally:
                    await conn.close()

            return await run_backend(cfg, urls, vacuum)

    return run_and_report(args, cfg, sqlite, postgres, report)


if __name__ == "__main__":
    raise SystemExit(main())
