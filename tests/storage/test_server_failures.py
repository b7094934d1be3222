"""A database server that goes away, comes back, or cancels a statement (SPEC 14).

Real servers only: a throwaway cluster stopped with ``pg_ctl -m fast`` and started
again under load, and the CI server with ``lock_timeout``/``statement_timeout`` set on a
database of the test's own, a lock held by another session, a cancel request and a
deadlock. (SQLite's busy timeout, the same ``accepted=0, uncertain=False`` outcome, is
checked in test_sqlite_writers.py.)
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import asyncpg
import pytest
from helpers import PG_ADMIN_URL, empty_pg_database, is_database_error, new_id, user_msgs
from pg_cluster import PASSWORD, Cluster, throwaway_cluster
from sqlalchemy import make_url
from waiting import eventually

import histstore
from histstore import DatabaseFailure, HistStoreError, WriteError, WriteOutcome

pytestmark = pytest.mark.postgres

WRITE_FORMS: list[Any] = [
    pytest.param({}, id="append"),  # on Postgres one statement, its own transaction
    pytest.param({"at": 1}, id="at"),
    pytest.param({"idempotency_key": "mine"}, id="key"),
]


# ---------------------------------------------------------------- a server that restarts


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with throwaway_cluster() as c:
        yield c


def from_the_way_to_the_database(exc: BaseException | None) -> bool:
    """Whether ``exc`` is a driver's, SQLAlchemy's or the socket's own error (SQLAlchemy's
    asyncpg dialect raises emulated DB-API errors while connecting)."""
    if isinstance(exc, OSError) or is_database_error(exc):
        return True
    return exc is not None and type(exc).__module__.split(".")[0] == "sqlalchemy"


def app_url(cluster: Cluster) -> str:
    return cluster.url(user="app", password=PASSWORD, database="app")


async def restart(cluster: Cluster) -> None:
    await asyncio.to_thread(cluster.stop, "fast")
    await asyncio.to_thread(cluster.start)


async def test_fast_restart_under_load_fails_typed_and_loses_nothing(cluster: Cluster) -> None:
    async with histstore.connect(app_url(cluster), migrate=True) as store:
        acknowledged: dict[str, list[str]] = {}
        errors: list[BaseException] = []
        until = time.monotonic() + 3.0

        async def worker(i: int) -> None:
            conversation = f"load-{i}-{new_id()}"
            n = 0
            while time.monotonic() < until:
                n += 1
                text = f"{i}/{n}"
                key = f"k-{i}-{n}" if i % 2 else None
                try:
                    await store.write(
                        conversation, [{"role": "user", "content": text}], idempotency_key=key
                    )
                    acknowledged.setdefault(conversation, []).append(text)
                    await store.read(conversation, limit=3)
                    await store.count(conversation)
                except Exception as exc:  # collected and checked below
                    errors.append(exc)
                    await asyncio.sleep(0.01)

        async def chaos() -> None:
            # The restart comes once every worker has had writes acknowledged.
            await eventually(lambda: len(acknowledged) == 16, "every worker writing")
            await restart(cluster)

        await asyncio.gather(chaos(), *(worker(i) for i in range(16)))

        assert errors, "the restart went unnoticed: nothing was tested"
        raw = [e for e in errors if not isinstance(e, HistStoreError)]
        assert raw == []
        for exc in errors:
            assert isinstance(exc, (DatabaseFailure, WriteError)), exc
            assert from_the_way_to_the_database(exc.__cause__), exc
            assert PASSWORD not in str(exc)
            if isinstance(exc, WriteError):
                assert exc.outcome is not None
                assert exc.outcome.accepted == 0
            else:
                assert exc.transient, exc

        # The same store works again within a few seconds (it did not need a new one).
        after = new_id()

        async def works() -> bool:
            try:
                await store.write(after, user_msgs(1), idempotency_key="after")
            except DatabaseFailure:
                return False
            return len(await store.read(after)) == 1

        await eventually(works, "the store working again", within=5)

        # Nothing acknowledged was lost, in its order.
        for conversation, texts in acknowledged.items():
            stored = [m.content for m in await store.read(conversation)]
            assert [t for t in stored if t in set(texts)] == texts


async def test_an_idle_store_works_right_after_a_restart(cluster: Cluster) -> None:
    """Connections the server closed while the store was idle are dropped before use
    (asyncpg has seen them close), so the first call after a restart succeeds."""
    async with histstore.connect(app_url(cluster), migrate=True) as store:
        conversation = new_id()
        # Several connections, kept by the store and in its pool.
        await asyncio.gather(*(store.write(new_id(), user_msgs(1)) for _ in range(8)))
        await store.write(conversation, user_msgs(2))
        await restart(cluster)
        assert conversation in await store.conversations()  # through SQLAlchemy's pool
        assert len(await store.read(conversation)) == 2
        assert await store.write(conversation, user_msgs(1, "x")) == WriteOutcome(1, False, 3)
        await restart(cluster)
        assert await store.write(conversation, user_msgs(1, "y")) == WriteOutcome(1, False, 4)
        assert await store.count(conversation) == 4


async def test_a_store_opened_or_used_while_the_server_is_down(cluster: Cluster) -> None:
    url = app_url(cluster)
    async with histstore.connect(url, migrate=True) as store:
        conversation = new_id()
        await store.write(conversation, user_msgs(1))
        await asyncio.to_thread(cluster.stop, "fast")
        try:
            with pytest.raises(DatabaseFailure) as opening:
                await histstore.connect(url)
            with pytest.raises(DatabaseFailure) as reading:
                await store.read(conversation)
            with pytest.raises(WriteError) as writing:
                await store.write(conversation, user_msgs(1, "down"))
        finally:
            await asyncio.to_thread(cluster.start)
        for info in (opening, reading):
            assert (
                "refused" in str(info.value).lower()
                or "connect call failed" in str(info.value).lower()
            ), info.value
            assert info.value.transient
            assert PASSWORD not in str(info.value)
        # Nothing was sent: the write is known not stored.
        assert writing.value.outcome == WriteOutcome(0, False, None)
        assert "connect call failed" in str(writing.value).lower()
        assert [m.content for m in await store.read(conversation)] == ["m-0"]


# ---------------------------------------------------------------- statements the server cancels


async def _admin(database: str) -> asyncpg.Connection:
    u = make_url(PG_ADMIN_URL)
    return await asyncpg.connect(
        user=u.username, password=u.password, host=u.host, port=u.port, database=database
    )


@pytest.fixture
async def own_database(pg_url: str) -> AsyncIterator[str]:
    """A database of this test's own (its settings change), empty (``open_with``
    migrates it)."""
    async with empty_pg_database() as url:
        yield url


async def open_with(url: str, **settings: str) -> histstore.Store:
    """A store whose sessions have ``settings`` (set on its database before it opens).

    The database is migrated first, without them: a 300 ms statement timeout must cut
    the blocked write, not a migration step of a busy CI machine.
    """
    database = make_url(url).database
    assert database is not None
    async with histstore.connect(url, migrate=True):
        pass
    admin = await _admin(database)
    try:
        for name, value in settings.items():
            await admin.execute(f"ALTER DATABASE \"{database}\" SET {name} = '{value}'")
    finally:
        await admin.close()
    return await histstore.connect(url, migrate=True)


class RowLock:
    """Another session holding a conversation's row lock (or, with ``table``, the whole
    conversations table, which stops even reads of it), in a transaction."""

    def __init__(self, url: str, *, table: bool = False) -> None:
        self.database = make_url(url).database or ""
        self.table = table
        self.conn: asyncpg.Connection | None = None

    async def take(self, conversation: str) -> None:
        self.conn = await _admin(self.database)
        await self.conn.execute("BEGIN")
        if self.table:
            await self.conn.execute("LOCK TABLE histstore_conversations IN ACCESS EXCLUSIVE MODE")
            return
        await self.conn.execute(
            "SELECT 1 FROM histstore_conversations WHERE id = $1 FOR UPDATE", conversation
        )

    async def release(self) -> None:
        if self.conn is not None:
            await self.conn.execute("ROLLBACK")
            await self.conn.close()
            self.conn = None

    async def waiting_pid(self) -> int:
        """The backend of the session that waits for this lock (polls until one does).

        Each poll drops the transaction's snapshot of the sessions' activity, which would
        otherwise stay as the first poll found it (the writer may still be connecting)."""
        conn = self.conn
        assert conn is not None

        async def pid() -> int | None:
            await conn.execute("SELECT pg_stat_clear_snapshot()")
            found = await conn.fetchval(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
                " AND wait_event_type = 'Lock' AND pid <> pg_backend_pid() LIMIT 1"
            )
            return None if found is None else int(found)

        return int(await eventually(pid, "a session waiting for the lock"))


async def blocked_write(
    store: histstore.Store,
    url: str,
    kwargs: dict[str, Any],
    meanwhile: Callable[[RowLock], Awaitable[None]] | None = None,
    *,
    table: bool = False,
) -> WriteError:
    """Write while another session holds the conversation's row lock; the WriteError."""
    conversation = new_id()
    await store.write(conversation, user_msgs(1, "old"))
    lock = RowLock(url, table=table)
    await lock.take(conversation)
    try:
        task = asyncio.ensure_future(store.write(conversation, user_msgs(2, "new"), **kwargs))
        if meanwhile is not None:
            await meanwhile(lock)
        with pytest.raises(WriteError) as info:
            await task
    finally:
        await lock.release()
    err = info.value
    assert err.outcome == WriteOutcome(0, False, None), err
    assert is_database_error(err.__cause__)
    assert "nothing was stored" in str(err)
    assert "new-" not in str(err)
    # Nothing was stored, and the store goes on.
    assert [m.content for m in await store.read(conversation)] == ["old-0"]
    out = await store.write(conversation, user_msgs(2, "new"), idempotency_key=err.idempotency_key)
    assert out == WriteOutcome(2, False, 3)
    return err


@pytest.mark.parametrize("table", [False, True], ids=["row", "table"])
@pytest.mark.parametrize("kwargs", WRITE_FORMS)
async def test_lock_timeout_stored_nothing(
    own_database: str, kwargs: dict[str, Any], table: bool
) -> None:
    """With the table locked, the store cannot even read whether the batch is stored:
    it must know from the server's answer alone."""
    store = await open_with(own_database, lock_timeout="200ms")
    try:
        err = await blocked_write(store, own_database, kwargs, table=table)
    finally:
        await store.close()
    assert "cancelled by the server (lock timeout)" in str(err)
    assert "55P03" in str(err)


@pytest.mark.parametrize("kwargs", WRITE_FORMS)
async def test_statement_timeout_stored_nothing(own_database: str, kwargs: dict[str, Any]) -> None:
    store = await open_with(own_database, statement_timeout="300ms")
    try:
        err = await blocked_write(store, own_database, kwargs)
    finally:
        await store.close()
    assert "cancelled by the server" in str(err)
    assert "statement timeout" in str(err)
    assert "57014" in str(err)


@pytest.mark.parametrize("kwargs", WRITE_FORMS)
async def test_cancel_request_stored_nothing(own_database: str, kwargs: dict[str, Any]) -> None:
    async def cancel(lock: RowLock) -> None:
        pid = await lock.waiting_pid()
        assert lock.conn is not None
        assert await lock.conn.fetchval("SELECT pg_cancel_backend($1)", pid)

    store = await open_with(own_database)
    try:
        err = await blocked_write(store, own_database, kwargs, cancel)
    finally:
        await store.close()
    assert "cancelled by the server" in str(err)
    assert "user request" in str(err)


@pytest.mark.parametrize("kwargs", WRITE_FORMS)
async def test_deadlock_victim_stored_nothing(own_database: str, kwargs: dict[str, Any]) -> None:
    """The other session, holding the row the write waits for, asks for a table lock
    that conflicts with the write's own: a cycle. The write's session, waiting longer,
    finds it (``deadlock_timeout``) and is the one cancelled."""

    async def close_the_cycle(lock: RowLock) -> None:
        await lock.waiting_pid()
        assert lock.conn is not None
        await lock.conn.execute("SET deadlock_timeout = '10s'")
        await lock.conn.execute("LOCK TABLE histstore_conversations IN SHARE MODE")

    store = await open_with(own_database, deadlock_timeout="100ms")
    try:
        err = await blocked_write(store, own_database, kwargs, close_the_cycle)
    finally:
        await store.close()
    assert "cancelled by the server (deadlock)" in str(err)
    assert "40P01" in str(err)


async def test_a_cancelled_read_is_a_typed_failure(own_database: str) -> None:
    store = await open_with(own_database, statement_timeout="200ms")
    try:
        conversation = new_id()
        await store.write(conversation, user_msgs(1))
        database = make_url(own_database).database or ""
        admin = await _admin(database)
        try:
            await admin.execute("BEGIN")
            await admin.execute("LOCK TABLE histstore_messages IN ACCESS EXCLUSIVE MODE")
            with pytest.raises(DatabaseFailure) as info:
                await store.read(conversation)
        finally:
            await admin.execute("ROLLBACK")
            await admin.close()
        assert "cancelled by the server" in str(info.value)
        assert info.value.sqlstate == "57014"
        assert info.value.transient
        assert len(await store.read(conversation)) == 1
    finally:
        await store.close()
