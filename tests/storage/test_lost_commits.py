"""A connection lost after the write was sent, while the server can still commit it.

The store reaches PostgreSQL (directly or through PgBouncer) through a proxy that cuts
the connection right after forwarding a write's statement (``CuttingProxy``). The
statement then waits on a lock another session holds, so it is still undecided when
the store settles the write; the lock is released once the store has answered or is
seen waiting itself. Whatever the store answered must stay true once the orphaned
server session has finished: ``accepted=0, uncertain=False`` only for a batch that is
never stored, and writing the batch again with its key stores it exactly once.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import asyncpg
import pytest
from conftest import Backend
from cutting_proxy import CuttingProxy
from helpers import new_id, user_msgs
from sqlalchemy import make_url
from waiting import eventually

import histstore
from histstore import WriteError, WriteOutcome
from histstore._ops import settle

pytestmark = pytest.mark.postgres

_POLLS = 3000  # 30 s at most for the server to reach a state a test waits for


def _starts(*prefixes: str) -> Callable[[str], bool]:
    return lambda sql: sql.lstrip().upper().startswith(prefixes)


LONE_APPEND = _starts("WITH GROWN AS")
GROUP_APPEND = _starts("WITH BATCHES AS")
ANY_APPEND = _starts("WITH GROWN AS", "WITH BATCHES AS")
COMMIT = _starts("COMMIT")


async def _connect(url: str) -> Any:
    u = make_url(url)
    return await asyncpg.connect(
        user=u.username, password=u.password, host=u.host, port=u.port, database=u.database
    )


class Server:
    """The test's own sessions on the server (never through the proxy): one holds
    locks, one watches the others."""

    def __init__(self, holder: Any, watcher: Any) -> None:
        self.holder = holder
        self.watcher = watcher

    async def lock_rows(self, *conversations: str) -> None:
        """Hold the conversations' row locks (in a transaction) until ``release``."""
        await self.holder.execute("BEGIN")
        for c in sorted(conversations):
            await self.holder.execute(
                "SELECT 1 FROM histstore_conversations WHERE id = $1 FOR UPDATE", c
            )

    async def release(self) -> None:
        await self.holder.execute("ROLLBACK")

    async def waiting_now(self) -> list[int]:
        await self.watcher.execute("SELECT pg_stat_clear_snapshot()")
        rows = await self.watcher.fetch(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
            " AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
        )
        return [int(r[0]) for r in rows]

    async def waiting(self, n: int, *, unless: Iterable[asyncio.Future[Any]] = ()) -> list[int]:
        """The sessions waiting for a lock, once there are ``n`` of them (or once every
        one of ``unless`` is done)."""
        futures = list(unless)

        async def found() -> tuple[list[int]] | None:
            pids = await self.waiting_now()
            if len(pids) >= n or (futures and all(f.done() for f in futures)):
                return (pids,)  # a tuple: true even when no session waits
            return None

        (pids,) = await eventually(found, f"{n} sessions waiting for a lock")
        return pids

    async def _busy(self) -> int:
        await self.watcher.execute("SELECT pg_stat_clear_snapshot()")
        busy: int = await self.watcher.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND pid <> pg_backend_pid() AND state <> 'idle'"
        )
        return busy

    async def quiet(self) -> None:
        """Wait until no other session of the database runs a statement or holds a
        transaction open: the cut ones have finished, one way or the other."""

        async def idle() -> bool:
            return await self._busy() == 0

        await eventually(idle, "the server's sessions finished")

    async def settled(self, tasks: Sequence[asyncio.Future[Any]]) -> None:
        """Wait until every task is done or the server stops changing: the same sessions
        wait for locks and the same tasks are done over 30 polls."""
        seen: tuple[Any, ...] = ()
        same = 0
        for _ in range(_POLLS):
            if all(t.done() for t in tasks):
                return
            now = (tuple(sorted(await self.waiting_now())), sum(t.done() for t in tasks))
            same = same + 1 if now == seen else 0
            if same >= 30:
                return
            seen = now
            await asyncio.sleep(0.01)
        raise AssertionError("the writes never settled")


@asynccontextmanager
async def cut_store(
    backend: Backend, pg_url: str
) -> AsyncIterator[tuple[histstore.Store, CuttingProxy, Server]]:
    """A store on ``backend`` through a ``CuttingProxy``, and the test's ``Server``."""
    target = make_url(backend.url)
    proxy = await CuttingProxy(target.host or "127.0.0.1", target.port or 5432).start()
    url = target.set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False)
    holder, watcher = await _connect(pg_url), await _connect(pg_url)
    try:
        async with dataclasses.replace(backend, url=url).connect() as store:
            yield store, proxy, Server(holder, watcher)
    finally:
        await proxy.close()
        await holder.close()
        await watcher.close()


async def outcome(task: asyncio.Future[WriteOutcome]) -> WriteOutcome | WriteError:
    try:
        return await task
    except WriteError as exc:
        return exc


async def assert_true_answer(
    store: histstore.Store,
    conversation: str,
    batch: list[dict[str, Any]],
    answer: WriteOutcome | WriteError,
) -> None:
    """The answer agrees with what is stored now that the old session has finished;
    writing again with the key stores the batch exactly once."""
    texts = [m["content"] for m in batch]

    async def copies() -> int:
        stored = [m.content for m in await store.read(conversation)]
        found = [i for i in range(len(stored)) if stored[i : i + len(texts)] == texts]
        return len(found)

    if isinstance(answer, WriteOutcome):
        assert answer.accepted == len(batch)
        assert not answer.uncertain
        assert await copies() == 1
        return
    assert answer.outcome is not None
    assert answer.outcome.accepted == 0
    if not answer.outcome.uncertain:
        assert await copies() == 0, "answered 'certainly not stored', and it was stored"
    again = await store.write(conversation, batch, idempotency_key=answer.idempotency_key)
    assert again.accepted == len(batch)
    assert await copies() == 1
    await store.write(conversation, batch, idempotency_key=answer.idempotency_key)
    assert await copies() == 1


async def test_a_lone_append_cut_while_it_waits_for_the_row_lock(
    postgres_backend: Backend, pg_url: str
) -> None:
    async with cut_store(postgres_backend, pg_url) as (store, proxy, server):
        c = new_id()
        await store.write(c, user_msgs(1, "old"))
        await server.lock_rows(c)
        proxy.arm(LONE_APPEND)
        batch = user_msgs(2, "new")
        task = asyncio.ensure_future(store.write(c, batch))
        await proxy.cut.wait()
        await server.waiting(1)
        await server.waiting(2, unless=[task])  # the store answered, or waits to settle
        await server.release()
        await server.quiet()
        await assert_true_answer(store, c, batch, await outcome(task))


async def test_a_group_cut_while_it_waits_for_a_row_lock(
    postgres_backend: Backend, pg_url: str
) -> None:
    """Two writers' appends go as one group statement (two others hold the store's
    statement slots meanwhile), which takes the first row and waits for the second."""
    async with cut_store(postgres_backend, pg_url) as (store, proxy, server):
        first, held = f"a-{new_id()}", f"z-{new_id()}"
        quick = [new_id(), new_id()]
        for c in (first, held, *quick):
            await store.write(c, user_msgs(1, "old"))
        await server.lock_rows(held)
        proxy.arm(GROUP_APPEND)
        batches = {c: user_msgs(2, f"new-{c}") for c in (first, held)}
        tasks = [asyncio.ensure_future(store.write(c, user_msgs(1, "q"))) for c in quick]
        tasks += [asyncio.ensure_future(store.write(c, b)) for c, b in batches.items()]
        await proxy.cut.wait()
        await server.waiting(1)
        await server.waiting(3, unless=tasks[2:])
        await server.release()
        await server.quiet()
        answers = [await outcome(task) for task in tasks[2:]]
        for (c, batch), answer in zip(batches.items(), answers, strict=True):
            await assert_true_answer(store, c, batch, answer)
        assert [(await t).accepted for t in tasks[:2]] == [1, 1]


_STALL = 7311842  # the advisory lock a stalled COMMIT waits for


@asynccontextmanager
async def commits_stall(server: Server) -> AsyncIterator[Callable[[], Any]]:
    """COMMITs of batches under keys starting ``stall-`` wait for an advisory lock the
    test holds (a deferred constraint trigger takes it): a commit that stalls, as one
    waiting for a synchronous standby does. Yields the release of that lock."""
    holder = server.holder
    await holder.execute(
        "CREATE FUNCTION histstore_test_stall() RETURNS trigger LANGUAGE plpgsql AS"
        f" $$ BEGIN PERFORM pg_advisory_xact_lock_shared({_STALL}); RETURN NULL; END $$;"
        " CREATE CONSTRAINT TRIGGER histstore_test_stall AFTER INSERT ON histstore_writes"
        " DEFERRABLE INITIALLY DEFERRED FOR EACH ROW WHEN (NEW.key LIKE 'stall-%')"
        " EXECUTE FUNCTION histstore_test_stall()"
    )
    await holder.execute(f"SELECT pg_advisory_lock({_STALL})")
    try:
        yield lambda: holder.execute(f"SELECT pg_advisory_unlock({_STALL})")
    finally:
        await holder.execute("SELECT pg_advisory_unlock_all()")
        await holder.execute(
            "DROP TRIGGER IF EXISTS histstore_test_stall ON histstore_writes;"
            " DROP FUNCTION IF EXISTS histstore_test_stall()"
        )


@pytest.mark.parametrize("outlasts", [False, True], ids=["released", "past-patience"])
@pytest.mark.parametrize("kwargs", [{"at": 1}, {}], ids=["at", "key"])
async def test_a_locked_write_cut_while_its_commit_stalls(
    postgres_backend: Backend,
    pg_url: str,
    kwargs: dict[str, Any],
    outlasts: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The program path (BEGIN, the row lock, the inserts, COMMIT), with a caller's key:
    the connection is cut after the COMMIT was sent, while it waits. Released while the
    store settles, the batch is found stored; stalled past the settling's patience
    (``PATIENCE``), the answer is uncertain."""
    if outlasts:
        monkeypatch.setattr(settle, "PATIENCE", "200ms")
    async with cut_store(postgres_backend, pg_url) as (store, proxy, server):
        c = new_id()
        await store.write(c, user_msgs(1, "old"))
        async with commits_stall(server) as release:
            proxy.arm(COMMIT)
            batch = user_msgs(2, "new")
            write = store.write(c, batch, idempotency_key=f"stall-{new_id()}", **kwargs)
            task = asyncio.ensure_future(write)
            await proxy.cut.wait()
            # PgBouncer may drop a COMMIT whose client is gone before it passes it on.
            await server.waiting(1, unless=[task])
            if outlasts:
                answer = await outcome(task)
                if await server.waiting_now():  # the lost COMMIT still waits
                    assert isinstance(answer, WriteError)
                    assert answer.outcome is not None
                    assert answer.outcome.uncertain
            else:
                await server.waiting(2, unless=[task])
            await release()
            await server.quiet()
            await assert_true_answer(store, c, batch, await outcome(task))


@pytest.mark.parametrize("seed", range(3))
async def test_randomly_cut_grouped_appends_answer_truly(
    postgres_backend: Backend, pg_url: str, seed: int
) -> None:
    """Rounds of concurrent appends to a few conversations, some of whose rows another
    session holds; the proxy cuts a random share of the appends' statements (lone and
    grouped). Every answer is checked once the cut sessions have finished."""
    rng = random.Random(seed)
    async with cut_store(postgres_backend, pg_url) as (store, proxy, server):
        names = [f"{i}-{new_id()}" for i in range(6)]
        for c in names:
            await store.write(c, user_msgs(1, "old"))
        for round_ in range(4):
            held = rng.sample(names, 2)
            await server.lock_rows(*held)
            proxy.cut.clear()
            proxy.arm(ANY_APPEND, times=3, chance=0.5, rng=rng)
            writes = [
                (rng.choice(names), user_msgs(rng.randint(1, 3), f"r{round_}-{i}"))
                for i in range(12)
            ]
            tasks = [asyncio.ensure_future(store.write(c, b)) for c, b in writes]
            await server.settled(tasks)  # hold the rows while the writes can move
            await server.release()
            await asyncio.wait(tasks)
            await server.quiet()
            proxy.disarm()
            answers = [await outcome(task) for task in tasks]
            for (c, batch), answer in zip(writes, answers, strict=True):
                await assert_true_answer(store, c, batch, answer)
