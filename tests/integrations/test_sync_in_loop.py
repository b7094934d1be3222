"""Sync adapter calls made inside a running event loop (SPEC section 15): a notebook
cell, or an async handler calling sync code.

An adapter built from a URL or path runs its sync calls on a loop of its own, so they
work where a loop already runs (blocking it meanwhile, as LangGraph's own sync savers
do), and ``close()`` / leaving ``with`` there leaves no connection open. A borrowed
store whose loop runs in another thread serves them too; only a call that would wait on
the loop it blocks refuses. On every backend, PgBouncer included (``connect_options``).
"""

from __future__ import annotations

import asyncio
import operator
import threading
from typing import Annotated, Any, TypedDict

import psycopg
import pytest
from conftest import Backend
from helpers import PG_ADMIN_URL
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.graph import START, StateGraph
from sqlalchemy import make_url
from waiting import settled

import histstore
from histstore.integrations.langchain import HiststoreChatMessageHistory
from histstore.integrations.langgraph import HiststoreSaver


def _target(backend: Backend) -> tuple[str, dict[str, Any]]:
    """What an owned adapter is given for the backend: its URL or path, and the
    ``connect()`` options it needs (``pooler`` through PgBouncer)."""
    options = {k: v for k, v in backend.options.items() if k == "pooler"}
    return backend.url, options


def _open_now(backend: Backend) -> tuple[int, int]:
    """Server sessions on the backend's database (Postgres directly; a pooler keeps its
    server sessions by design, so not counted through PgBouncer), and aiosqlite
    connections still open (each runs a thread until it is closed)."""
    sessions = 0
    if backend.name == "postgres":
        with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE datname = %s AND pid <> pg_backend_pid()",
                (make_url(backend.url).database,),
            ).fetchone()
        assert row is not None
        sessions = int(row[0])
    threads = sum("_connection_worker_thread" in t.name for t in threading.enumerate())
    return sessions, threads


async def _settled(backend: Backend, expected: tuple[int, int]) -> tuple[int, int]:
    """What is open once closed connections are gone, letting this loop run meanwhile
    (a store of this loop is released by a task on it)."""
    # Polled: the server ends a session shortly after its socket closes, with no event.
    return await settled(lambda: _open_now(backend), expected)


@pytest.fixture
async def before(backend: Backend) -> tuple[int, int]:
    """What is open before the test (it must be so again after it)."""
    return await _settled(backend, _open_now(backend))


def _config(thread: str, **extra: str) -> Any:
    return {"configurable": {"thread_id": thread, "checkpoint_ns": "", **extra}}


# ---------------------------------------------------------------------------- LangGraph


async def test_saver_sync_methods_inside_a_running_loop(
    backend: Backend, before: tuple[int, int]
) -> None:
    url, options = _target(backend)
    asyncio.get_running_loop()  # the case under test: this thread's loop is running
    with HiststoreSaver.from_conn_string(url, **options) as saver:
        stored = saver.put(_config("t1"), empty_checkpoint(), {"step": 1}, {})
        saver.put_writes(stored, [("messages", "hi")], "task-1")
        got = saver.get_tuple(_config("t1"))
        assert got is not None
        assert (
            got.config["configurable"]["checkpoint_id"] == stored["configurable"]["checkpoint_id"]
        )
        assert [w[1:] for w in got.pending_writes or []] == [("messages", "hi")]
        assert [t.metadata["step"] for t in saver.list(_config("t1"))] == [1]
        saver.copy_thread("t1", "t2")
        saver.delete_thread("t1")
        assert saver.get_tuple(_config("t1")) is None
        assert saver.get_tuple(_config("t2")) is not None
        if backend.shared:  # (an in-memory target is a database per loop)
            # The same saver's async methods, on this loop, see the same data.
            assert len([t async for t in saver.alist(None)]) == 1
    assert await _settled(backend, before) == before  # the loop's store, and the thread's


class _Chat(TypedDict):
    messages: Annotated[list[Any], operator.add]


def _sync_graph() -> Any:
    """A graph whose only node is sync, for ``graph.invoke``."""

    def reply(state: _Chat) -> dict[str, list[Any]]:
        return {"messages": [AIMessage(f"reply {len(state['messages'])}")]}

    builder = StateGraph(_Chat)
    builder.add_node("reply", reply)
    builder.add_edge(START, "reply")
    return builder


async def test_graph_invoke_inside_a_running_loop(
    backend: Backend, before: tuple[int, int]
) -> None:
    """LangGraph's sync runner, called from async code (as in a notebook cell)."""
    url, options = _target(backend)
    config = _config("chat")
    with HiststoreSaver(url, connect_options=options) as saver:
        graph = _sync_graph().compile(checkpointer=saver)
        graph.invoke({"messages": [HumanMessage("one")]}, config)
        out = graph.invoke({"messages": [HumanMessage("two")]}, config)
        assert [m.content for m in out["messages"]] == ["one", "reply 1", "two", "reply 3"]
        assert len(list(graph.get_state_history(config))) == 6
    assert await _settled(backend, before) == before
    if not backend.shared:
        return  # an in-memory database ends with its store
    async with HiststoreSaver(url, connect_options=options) as again:  # kept
        state = await _sync_graph().compile(checkpointer=again).aget_state(config)
        assert len(state.values["messages"]) == 4
    assert await _settled(backend, before) == before


# ---------------------------------------------------------------------------- LangChain


async def test_chat_history_sync_methods_inside_a_running_loop(
    backend: Backend, before: tuple[int, int], cid: str
) -> None:
    url, options = _target(backend)
    history = HiststoreChatMessageHistory(cid, url, connect_options=options)
    with history:
        history.add_user_message("hi")
        history.add_messages([AIMessage("hello")])
        assert [m.content for m in history.messages] == ["hi", "hello"]
        if backend.shared:  # (an in-memory target is a database per loop)
            assert [m.content for m in await history.aget_messages()] == ["hi", "hello"]
        history.clear()
        assert history.messages == []
    assert await _settled(backend, before) == before


async def test_sync_close_inside_the_loop_its_store_runs_on(
    backend: Backend, before: tuple[int, int], cid: str
) -> None:
    """An owned adapter used from this loop (async) and from sync code, then closed by a
    sync ``close()`` on this loop: this loop's store is released once the loop runs."""
    url, options = _target(backend)
    history = HiststoreChatMessageHistory(cid, url, connect_options=options)
    await history.aadd_messages([HumanMessage("async")])
    history.add_messages([HumanMessage("sync")])
    saver = HiststoreSaver(url, connect_options=options)
    await saver.aput(_config("t1"), empty_checkpoint(), {}, {})
    saver.put(_config("t2"), empty_checkpoint(), {}, {})
    assert saver.get_tuple(_config("t2")) is not None
    history.close()
    saver.close()
    assert await _settled(backend, before) == before
    with pytest.raises(histstore.HistStoreError, match="closed"):
        history.messages  # noqa: B018
    with pytest.raises(histstore.HistStoreError, match="closed"):
        saver.get_tuple(_config("t2"))


# ---------------------------------------------------------------------------- borrowed


async def test_borrowed_store_refuses_a_sync_call_on_its_own_loop(
    store: histstore.Store, cid: str
) -> None:
    """Waiting here would block the loop the call needs: a clear error, not a deadlock."""
    saver = HiststoreSaver(store)
    history = HiststoreChatMessageHistory(cid, store)
    with pytest.raises(RuntimeError, match=r"await saver\.aget_tuple\(\.\.\.\)"):
        saver.get_tuple(_config("t1"))
    with pytest.raises(RuntimeError, match=r"await saver\.aput\(\.\.\.\)"):
        saver.put(_config("t1"), empty_checkpoint(), {}, {})
    with pytest.raises(RuntimeError, match=r"await history\.aget_messages\(\)"):
        history.messages  # noqa: B018
    saver.close()  # a borrowed store is left open, from any loop
    history.close()
    assert not store.closed
    assert await saver.aget_tuple(_config("t1")) is None


async def test_borrowed_store_of_another_threads_loop_serves_this_loop(
    backend: Backend, cid: str
) -> None:
    """A store used on a loop another thread runs (a server's), called from sync code
    inside this thread's running loop."""
    loop = asyncio.new_event_loop()
    runner = threading.Thread(target=loop.run_forever)
    runner.start()
    try:

        async def make() -> tuple[histstore.Store, HiststoreChatMessageHistory]:
            opened = await backend.connect()
            return opened, HiststoreChatMessageHistory(cid, opened)

        store, history = asyncio.run_coroutine_threadsafe(make(), loop).result()
        history.add_messages([HumanMessage("from a running loop")])
        assert [m.content for m in history.messages] == ["from a running loop"]
        asyncio.run_coroutine_threadsafe(store.close(), loop).result()
    finally:
        loop.call_soon_threadsafe(loop.stop)
        runner.join()
        loop.close()


async def test_connect_options_are_checked_when_the_adapter_is_made(
    store: histstore.Store, tmp_path: Any
) -> None:
    with pytest.raises(TypeError, match="not for a Store"):
        HiststoreSaver(store, connect_options={"durability": "full"})
    with pytest.raises(TypeError):
        HiststoreSaver.from_conn_string(str(tmp_path / "x.db"), no_such_option=1)
    with pytest.raises(ValueError, match="pooler"):
        HiststoreChatMessageHistory("c", str(tmp_path / "x.db"), connect_options={"pooler": "x"})
    async with HiststoreSaver.from_conn_string(str(tmp_path / "x.db")) as saver:  # async too
        assert await saver.aget_tuple(_config("t1")) is None
