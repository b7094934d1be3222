"""The tests' one way past a store's public API into its internals (``store.internals``).

What a test waits for or asserts about the write path's objects (the writer, its queue,
the checkpoints, the indexer, kept connections) it reads from ``store.diagnostics()``,
never from here. What is here sets up a state or a fault that nothing public can make,
each helper saying why; keeping them in one module keeps the tests' coupling to the
storage layer in one place to update when it changes.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, TypeVar

from sqlalchemy.ext.asyncio import AsyncConnection

from histstore import Store
from histstore._core.ids import new_key
from histstore._ops.history import History
from histstore._storage.drivers import EXECUTE, FETCH, Program

T = TypeVar("T")


def driver(store: Store) -> Any:
    """The store's driver (``_storage.sqlite_driver`` or ``pg_driver``), to instrument
    with ``monkeypatch``: to count the statements of a write, or to run something between
    two of them. The statements a store sends pass nowhere public."""
    return store.internals.executor.driver


def statements(store: Store) -> Any:
    """The store's compiled statements (``_storage.statements``): to take a lock or to
    recognise a statement the driver is sent; shared between stores, which a test of
    that sharing compares."""
    return store.internals.sql


def next_connection(store: Store) -> AbstractAsyncContextManager[Any]:
    """The driver connection the store's next call takes (its kept one): a fault set on
    it (``PRAGMA query_only``, ``max_page_count``) is met by that call. A connection the
    test opens itself would not be the store's."""
    return store.internals.executor._connection()


@asynccontextmanager
async def write_connection(store: Store) -> AsyncIterator[Any]:
    """The driver connection the store's writes take (SQLite: the writer's one write
    connection, in the writer's turn as every job takes it): a fault set on it
    (``PRAGMA query_only``, ``max_page_count``) is met by the next write."""
    executor = store.internals.executor
    async with executor._writing("probe", None), executor._write_connection() as conn:
        yield conn


@asynccontextmanager
async def holding_the_write_turn(store: Store, lock: str | None = None) -> AsyncIterator[None]:
    """Hold the store's write transaction (SQLite: its write turn and the file's write
    lock; with ``lock``, the conversation's lock on every database) while the block runs:
    writers of this store queue behind it, as behind a long write."""
    ctx = store.internals
    async with ctx.executor.transaction(action="hold the turn") as tx:
        if lock is None:
            await tx.run(_noop(store))
        else:
            await tx.run(_lock(store, lock))
        yield


@asynccontextmanager
async def writing_in_a_transaction(
    store: Store, conversation: str, messages: list[dict[str, Any]]
) -> AsyncIterator[None]:
    """A write transaction of the store's own, of the kind import and copy hold while
    code the store awaits runs (nothing public opens one around a caller's code), that
    appended ``messages`` to ``conversation`` as ``write`` does: uncommitted while the
    block runs, committed when it ends, rolled back when it raises."""
    history = History(store.internals)
    batch = await history.prepare(conversation, messages)
    program = history._append(conversation, batch, None, new_key(), False)
    async with store.internals.executor.transaction(action="write in a transaction") as tx:
        await tx.run(program, conversation=conversation)
        yield


def _noop(store: Store) -> Program[None]:
    yield EXECUTE, statements(store).set_length, {"c": "none", "length": 0, "now": None}


def _lock(store: Store, conversation: str) -> Program[Any]:
    ctx = store.internals
    return (yield FETCH, ctx.sql.lock, ctx.params(conversation))


async def index_pending(store: Store) -> None:
    """Index the full-text index's pending list now, as a search of a writable SQLite
    store does first; on Postgres only the background indexer and ``close`` do, at
    times a test cannot choose."""
    await store.internals.executor.index_list()


async def core(store: Store, work: Callable[[AsyncConnection], Awaitable[T]]) -> T:
    """``work`` on a SQLAlchemy connection as the store's own reads take one (with the
    settings of its read mode), to compare with what its driver connections say."""
    return await store.internals.executor.run(work, mode="snapshot", action="probe")


def shorten_idle_time(store: Store, seconds: float) -> None:
    """Give the connections the store keeps back to the pool after ``seconds`` idle
    (0.5 s), so that a test sees them go without waiting out the real time."""
    executor = store.internals.executor
    for cache in (executor._cache, executor._statement_writes):
        cache._max_idle = seconds


def executor(store: Store) -> Any:
    """The store's executor: to shorten a timer or stand in for an estimate that
    a test cannot wait out (the WAL's pages after a long run), and to check that an
    integration writes through it."""
    return store.internals.executor
