"""An adapter given a URL or path works from any event loop (SPEC section 15).

Every adapter, on the backends a URL names (an SQLite file, PostgreSQL): successive
``asyncio.run`` calls, loops of worker threads, a loop another thread keeps running,
sync calls from several threads; ``close()`` from another loop, and after the loop the
store was opened on has closed. Each case checks that nothing leaks: no
``ResourceWarning`` (nor any warning or "exception ignored" of a connection collected
unclosed), no error logged, no server connection left in ``pg_stat_activity``, no
aiosqlite thread left running. A borrowed ``Store`` is never closed by an adapter.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import subprocess
import sys
import textwrap
import threading
import warnings
from collections.abc import Callable, Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from agent_framework import Message as AFMessage
from conftest import Backend
from helpers import PG_ADMIN_URL, PYTHON, subprocess_env
from langchain_core.messages import HumanMessage
from langgraph.checkpoint.base import empty_checkpoint
from llama_index.core.base.llms.types import ChatMessage
from pydantic_ai.messages import ModelRequest, UserPromptPart
from sqlalchemy import make_url
from sqlalchemy.exc import SAWarning
from waiting import eventually, settled_now

import histstore
from histstore.integrations.adk import HiststoreSessionService
from histstore.integrations.agent_framework import HiststoreHistoryProvider
from histstore.integrations.langchain import HiststoreChatMessageHistory
from histstore.integrations.langgraph import HiststoreSaver
from histstore.integrations.llama_index import HiststoreChatStore
from histstore.integrations.openai_agents import HiststoreSession
from histstore.integrations.pydantic_ai import HiststoreMessageHistory

# ---------------------------------------------------------------------------- adapters


@dataclass(frozen=True)
class Kit:
    """How a test makes, writes through, reads through and closes one adapter."""

    name: str
    make: Callable[[Any], Any]
    write: Callable[[Any, str], Coroutine[Any, Any, None]]
    count: Callable[[Any], Coroutine[Any, Any, int]]
    bridged: bool = False
    """The adapter has sync methods (and a sync ``close``) besides its async ones."""

    async def aclose(self, adapter: Any) -> None:
        await (adapter.aclose() if self.bridged else adapter.close())


def _config(thread: str) -> Any:
    return {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}


async def _saver_write(saver: HiststoreSaver, tag: str) -> None:
    await saver.aput(_config(tag), empty_checkpoint(), {}, {})


async def _saver_count(saver: HiststoreSaver) -> int:
    return len([t async for t in saver.alist(None)])


async def _session_write(session: HiststoreSession, tag: str) -> None:
    await session.add_items([{"role": "user", "content": tag}])


async def _session_count(session: HiststoreSession) -> int:
    return len(await session.get_items())


async def _chat_write(history: HiststoreChatMessageHistory, tag: str) -> None:
    await history.aadd_messages([HumanMessage(tag)])


async def _chat_count(history: HiststoreChatMessageHistory) -> int:
    return len(await history.aget_messages())


async def _pydantic_write(history: HiststoreMessageHistory, tag: str) -> None:
    await history.add([ModelRequest(parts=[UserPromptPart(tag)])])


async def _pydantic_count(history: HiststoreMessageHistory) -> int:
    return len(await history.messages())


async def _adk_write(service: HiststoreSessionService, tag: str) -> None:
    await service.create_session(app_name="app", user_id="u", session_id=tag)


async def _adk_count(service: HiststoreSessionService) -> int:
    return len((await service.list_sessions(app_name="app", user_id="u")).sessions)


async def _llama_write(chat_store: HiststoreChatStore, tag: str) -> None:
    await chat_store.add_message("k1", ChatMessage(role="user", content=tag))


async def _llama_count(chat_store: HiststoreChatStore) -> int:
    return await chat_store.count_messages("k1")


async def _maf_write(provider: HiststoreHistoryProvider, tag: str) -> None:
    await provider.save_messages("s1", [AFMessage(role="user", contents=[tag])])


async def _maf_count(provider: HiststoreHistoryProvider) -> int:
    return len(await provider.get_messages("s1"))


KITS = [
    Kit("langgraph", HiststoreSaver, _saver_write, _saver_count, bridged=True),
    Kit(
        "langchain",
        lambda s: HiststoreChatMessageHistory("c1", s),
        _chat_write,
        _chat_count,
        bridged=True,
    ),
    Kit("openai-agents", lambda s: HiststoreSession("s1", s), _session_write, _session_count),
    Kit(
        "pydantic-ai",
        lambda s: HiststoreMessageHistory("c1", s),
        _pydantic_write,
        _pydantic_count,
    ),
    Kit("adk", HiststoreSessionService, _adk_write, _adk_count),
    Kit("llamaindex", HiststoreChatStore, _llama_write, _llama_count),
    Kit("agent-framework", HiststoreHistoryProvider, _maf_write, _maf_count),
]
BRIDGED = [k for k in KITS if k.bridged]


@pytest.fixture(params=KITS, ids=[k.name for k in KITS])
def kit(request: pytest.FixtureRequest) -> Kit:
    return request.param  # type: ignore[no-any-return]


# ---------------------------------------------------------------------------- leak checks


def _server_connections(backend: Backend) -> int:
    """Sessions open on the backend's database (Postgres; 0 for SQLite)."""
    if not backend.url.startswith("postgresql"):
        return 0
    database = make_url(backend.url).database
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
            (database,),
        ).fetchone()
    assert row is not None
    return int(row[0])


def _sqlite_threads() -> int:
    """aiosqlite connections still open (each runs a thread until it is closed)."""
    return sum("_connection_worker_thread" in t.name for t in threading.enumerate())


def _open(backend: Backend) -> tuple[int, int]:
    return _server_connections(backend), _sqlite_threads()


def _settles(backend: Backend, expected: tuple[int, int]) -> tuple[int, int]:
    """What is open once closed connections are gone (the server ends a session shortly
    after its socket closes): ``expected`` when nothing leaked."""
    return settled_now(lambda: _open(backend), expected)


@contextmanager
def no_leaks(backend: Backend, caplog: pytest.LogCaptureFixture) -> Iterator[tuple[int, int]]:
    """Fail unless the block leaves the backend as it found it, with no warning of a
    connection collected unclosed and no error logged. Yields what was open before."""
    before = _settles(backend, _open(backend))
    unraisable: list[Any] = []
    thread_errors: list[Any] = []
    hook, sys.unraisablehook = sys.unraisablehook, unraisable.append
    thread_hook, threading.excepthook = threading.excepthook, thread_errors.append
    caplog.set_level(logging.ERROR)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield before
            gc.collect()
    finally:
        sys.unraisablehook, threading.excepthook = hook, thread_hook
    leaks = (ResourceWarning, RuntimeWarning, SAWarning)
    assert [str(w.message) for w in caught if issubclass(w.category, leaks)] == []
    assert [str(u.exc_value) for u in unraisable] == []
    assert [str(e.exc_value) for e in thread_errors] == []
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
    assert _settles(backend, before) == before


# ---------------------------------------------------------------------------- async use


def test_successive_asyncio_runs(
    kit: Kit, shared_backend: Backend, caplog: pytest.LogCaptureFixture
) -> None:
    with no_leaks(shared_backend, caplog) as before:
        adapter = kit.make(shared_backend.url)

        async def use(tag: str) -> int:
            await kit.write(adapter, tag)
            return await kit.count(adapter)

        assert asyncio.run(use("a1")) == 1
        assert _settles(shared_backend, before) == before  # released as that loop ended
        assert asyncio.run(use("a2")) == 2
        assert asyncio.run(use("a3")) == 3
        asyncio.run(kit.aclose(adapter))


def test_loops_of_worker_threads(
    kit: Kit, shared_backend: Backend, caplog: pytest.LogCaptureFixture
) -> None:
    with no_leaks(shared_backend, caplog):
        adapter = kit.make(shared_backend.url)
        with ThreadPoolExecutor(3) as pool:
            list(pool.map(lambda i: asyncio.run(kit.write(adapter, f"w{i}")), range(6)))
        assert asyncio.run(kit.count(adapter)) == 6
        asyncio.run(kit.aclose(adapter))


def test_close_hands_over_to_a_loop_still_running(
    kit: Kit, shared_backend: Backend, caplog: pytest.LogCaptureFixture
) -> None:
    """A framework's own loop, running in another thread: its store is closed there."""
    with no_leaks(shared_backend, caplog) as before:
        adapter = kit.make(shared_backend.url)
        loop = asyncio.new_event_loop()
        runner = threading.Thread(target=loop.run_forever)
        runner.start()
        try:
            asyncio.run_coroutine_threadsafe(kit.write(adapter, "f1"), loop).result()
            asyncio.run(kit.write(adapter, "m1"))
            assert asyncio.run_coroutine_threadsafe(kit.count(adapter), loop).result() == 2
            asyncio.run(kit.aclose(adapter))  # from another loop, while that one runs
            assert _settles(shared_backend, before) == before
        finally:
            loop.call_soon_threadsafe(loop.stop)
            runner.join()
            loop.close()
        del adapter


def test_close_runs_an_idle_loop(
    kit: Kit, shared_backend: Backend, caplog: pytest.LogCaptureFixture
) -> None:
    """A loop kept between ``run_until_complete`` calls (open, not running)."""
    with no_leaks(shared_backend, caplog) as before:
        adapter = kit.make(shared_backend.url)
        loop = asyncio.new_event_loop()
        try:
            loop.run_until_complete(kit.write(adapter, "i1"))
            loop.run_until_complete(kit.write(adapter, "i2"))
            asyncio.run(kit.aclose(adapter))
            assert _settles(shared_backend, before) == before
        finally:
            loop.close()
        del adapter


CLOSED_LOOP_CASES = [
    pytest.param(k, then, id=f"{k.name}-{then}")
    for k in KITS
    for then in ("use-another-loop", "close-on-another-loop", "close-sync")
    if then != "close-sync" or k.bridged  # only adapters with sync methods close sync
]


@pytest.mark.parametrize(("kit", "then"), CLOSED_LOOP_CASES)
def test_store_of_a_loop_closed_without_shutdown(
    kit: Kit, shared_backend: Backend, caplog: pytest.LogCaptureFixture, then: str
) -> None:
    """``loop.close()`` without ``shutdown_asyncgens()``: the store outlives its loop and
    is released later, its connections terminated without that loop."""
    with no_leaks(shared_backend, caplog) as before:
        adapter = kit.make(shared_backend.url)
        loop = asyncio.new_event_loop()
        loop.run_until_complete(kit.write(adapter, "d1"))
        loop.close()
        assert _open(shared_backend) != before  # still open: the case under test
        if then == "use-another-loop":
            assert asyncio.run(kit.count(adapter)) == 1
            assert _settles(shared_backend, before) == before
            asyncio.run(kit.aclose(adapter))
        elif then == "close-on-another-loop":
            asyncio.run(kit.aclose(adapter))
        else:
            adapter.close()
        assert _settles(shared_backend, before) == before
        del adapter, loop


def test_an_adapter_dropped_unclosed_releases_its_stores(
    kit: Kit, shared_backend: Backend, caplog: pytest.LogCaptureFixture
) -> None:
    """Garbage collected while its loop runs, in a program that goes on: each store it
    opened is closed (on its loop), not left open."""
    with no_leaks(shared_backend, caplog) as before:

        async def main() -> tuple[int, int]:
            adapter = kit.make(shared_backend.url)
            await kit.write(adapter, "g1")
            await asyncio.to_thread(asyncio.run, kit.write(adapter, "g2"))  # a second loop
            del adapter
            gc.collect()
            await eventually(lambda: _open(shared_backend) == before, "its stores closed", within=5)
            return _open(shared_backend)

        assert asyncio.run(main()) == before


def test_a_store_closes_from_another_loop_once_its_own_has_closed(
    shared_backend: Backend, caplog: pytest.LogCaptureFixture
) -> None:
    """What the adapters rely on: ``Store.close()`` after its loop closed (on a live loop
    it still refuses another loop, as any call does)."""
    with no_leaks(shared_backend, caplog) as before:
        loop = asyncio.new_event_loop()

        async def use() -> histstore.Store:
            store = await shared_backend.connect()
            await store.write("c1", [{"role": "user", "content": "hi"}])
            await asyncio.gather(*(store.read("c1") for _ in range(4)))
            return store

        store = loop.run_until_complete(use())
        loop.close()
        assert _open(shared_backend) != before
        asyncio.run(store.close())
        assert store.closed
        assert _settles(shared_backend, before) == before
        del store, loop


# ---------------------------------------------------------------------------- sync use


@pytest.mark.parametrize("bridged", BRIDGED, ids=[k.name for k in BRIDGED])
def test_sync_calls_from_several_threads(
    bridged: Kit, shared_backend: Backend, caplog: pytest.LogCaptureFixture
) -> None:
    with no_leaks(shared_backend, caplog):
        adapter = bridged.make(shared_backend.url)
        if isinstance(adapter, HiststoreSaver):

            def write(i: int) -> None:
                adapter.put(_config(f"s{i}"), empty_checkpoint(), {}, {})

            def count() -> int:
                return len(list(adapter.list(None)))
        else:

            def write(i: int) -> None:
                adapter.add_messages([HumanMessage(f"s{i}")])

            def count() -> int:
                return len(adapter.messages)

        with ThreadPoolExecutor(4) as pool:
            list(pool.map(write, range(8)))
        assert count() == 8
        assert asyncio.run(bridged.count(adapter)) == 8  # the same data from a loop
        asyncio.run(bridged.write(adapter, "s8"))
        assert count() == 9
        adapter.close()


def test_sync_saver_without_with_exits_quietly(shared_backend: Backend) -> None:
    """An owned saver used from sync code and never closed releases its store (and its
    loop thread) at interpreter exit, without a warning: its SQLite connections are
    closed (the last one folds the write-ahead log back into the file), not dropped."""
    before = _settles(shared_backend, _open(shared_backend))
    script = textwrap.dedent(
        """
        import sys
        from langgraph.checkpoint.base import empty_checkpoint
        from histstore.integrations.langgraph import HiststoreSaver

        saver = HiststoreSaver(sys.argv[1])
        config = {"configurable": {"thread_id": "t1", "checkpoint_ns": ""}}
        saver.put(config, empty_checkpoint(), {}, {})
        assert saver.get_tuple(config) is not None
        print("ok")
        """
    )
    strict = ["-W", "error::ResourceWarning", "-W", "error::RuntimeWarning"]
    proc = subprocess.run(
        [PYTHON, *strict, "-c", script, shared_backend.url],
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert (proc.returncode, proc.stdout.strip(), proc.stderr) == (0, "ok", "")
    assert _settles(shared_backend, before) == before
    if shared_backend.name == "sqlite-file":  # closed, not abandoned: WAL folded back
        assert not Path(shared_backend.url + "-wal").exists()


# ---------------------------------------------------------------------------- borrowed


async def test_a_borrowed_store_is_never_closed(kit: Kit, store: histstore.Store) -> None:
    adapter = kit.make(store)
    await kit.write(adapter, "b1")
    await kit.aclose(adapter)
    assert not store.closed
    async with kit.make(store) as again:
        assert await kit.count(again) == 1
    assert not store.closed
