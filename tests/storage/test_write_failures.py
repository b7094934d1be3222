"""Writes that fail: lost connections while committing, cancellation, wrapped driver errors.

Faults are injected into the drivers (see ``Faults``), so they look to SQLAlchemy and
histstore exactly like a connection lost at that moment.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest
from faults import Faults
from helpers import connections_in_use, is_database_error, new_id, pg_fetch, user_msgs

import histstore
from histstore import HistStoreError, Message, WriteError, WriteOutcome


@pytest.fixture
def faults(store: histstore.Store, monkeypatch: pytest.MonkeyPatch) -> Iterator[Faults]:
    f = Faults(monkeypatch)
    yield f
    f.commit_mode = None
    f.unreachable = False


WRITE_FORMS: list[Any] = [
    pytest.param({}, id="append"),
    pytest.param({"at": 2}, id="at"),
    pytest.param({"idempotency_key": "mine"}, id="key"),
]


def stored_contents(messages: list[Message]) -> list[Any]:
    return [m.content for m in messages]


@pytest.mark.parametrize("kwargs", WRITE_FORMS)
async def test_commit_that_succeeded_but_reported_failure_is_settled(
    store: histstore.Store, faults: Faults, cid: str, kwargs: dict[str, Any]
) -> None:
    await store.write(cid, user_msgs(2, "old"))
    faults.commit_mode = "commit-then-fail"
    out = await store.write(cid, user_msgs(3, "new"), **kwargs)
    assert faults.commits_failed == 1
    assert out.accepted == 3
    assert out.uncertain is False
    assert out.length in (5, None)
    got = await store.read(cid)
    assert stored_contents(got) == ["old-0", "old-1", "new-0", "new-1", "new-2"]
    assert [m.position for m in got] == list(range(5))


@pytest.mark.parametrize("kwargs", WRITE_FORMS)
async def test_commit_that_failed_is_reported_as_not_stored(
    store: histstore.Store, faults: Faults, cid: str, kwargs: dict[str, Any]
) -> None:
    await store.write(cid, user_msgs(2, "old"))
    faults.commit_mode = "rollback-then-fail"
    with pytest.raises(WriteError) as info:
        await store.write(cid, user_msgs(3, "new"), **kwargs)
    err = info.value
    assert faults.commits_failed == 1
    assert (err.outcome.accepted, err.outcome.uncertain) == (0, False)
    assert err.idempotency_key
    if "idempotency_key" in kwargs:
        assert err.idempotency_key == kwargs["idempotency_key"]
    assert is_database_error(err.__cause__)
    assert "new-" not in str(err)
    assert stored_contents(await store.read(cid)) == ["old-0", "old-1"]
    # Nothing was stored, so writing again with the key stores the batch once.
    out = await store.write(cid, user_msgs(3, "new"), idempotency_key=err.idempotency_key)
    assert out == WriteOutcome(3, False, 5)
    assert await store.count(cid) == 5


@pytest.mark.parametrize("again", [{}, {"at": 2}], ids=["append", "at"])
async def test_a_key_settled_as_not_stored_stores_its_batch_once_later(
    store: histstore.Store, faults: Faults, cid: str, again: dict[str, Any]
) -> None:
    """Settling claims the key of a batch it answers "not stored" (so the lost write
    can never commit later); the batch written again under that key takes the claim's
    place, once, and the claim is no change of the conversation."""
    await store.write(cid, user_msgs(2, "old"))
    faults.commit_mode = "rollback-then-fail"
    with pytest.raises(WriteError) as info:
        await store.write(cid, user_msgs(3, "new"))
    assert (info.value.outcome.accepted, info.value.outcome.uncertain) == (0, False)
    key = info.value.idempotency_key
    assert len(await store.changes(cid)) == 1  # the first write's
    for _ in range(2):
        out = await store.write(cid, user_msgs(3, "new"), idempotency_key=key, **again)
        assert out == WriteOutcome(3, False, 5)
    assert stored_contents(await store.read(cid)) == [
        *("old-0", "old-1"),
        *("new-0", "new-1", "new-2"),
    ]
    assert [change.revision for change in await store.changes(cid)] == [1, 2]


@pytest.mark.parametrize("kwargs", WRITE_FORMS)
@pytest.mark.parametrize("retry", ["key", "at"])
async def test_unknown_commit_outcome_is_uncertain_and_retry_is_safe(
    store: histstore.Store, faults: Faults, cid: str, kwargs: dict[str, Any], retry: str
) -> None:
    await store.write(cid, user_msgs(2, "old"))
    batch = user_msgs(3, "new")
    faults.commit_mode = "commit-then-fail"
    faults.unreachable_after_commit = True
    with pytest.raises(WriteError) as info:
        await store.write(cid, batch, **kwargs)
    faults.unreachable = False
    err = info.value
    assert err.outcome.uncertain is True
    assert err.outcome.accepted == 0
    assert err.idempotency_key
    if "idempotency_key" in kwargs:
        assert err.idempotency_key == kwargs["idempotency_key"]
    assert is_database_error(err.__cause__)
    assert "new-" not in str(err)
    # The failure the message names is the one the error carries (not the settling
    # read's), so its SQLSTATE is the one the message prints (issue 38).
    named = err.__context__
    assert isinstance(named, histstore.DatabaseFailure)
    assert named.phase == "commit"
    assert str(named) in str(err)
    assert (named.sqlstate is None) == ("SQLSTATE" not in str(err))

    if retry == "key":
        out = await store.write(cid, batch, idempotency_key=err.idempotency_key)
    else:
        out = await store.write(cid, batch, at=2)
    assert (out.accepted, out.uncertain) == (3, False)
    got = await store.read(cid)
    assert stored_contents(got) == ["old-0", "old-1", "new-0", "new-1", "new-2"]


async def test_uncertain_write_that_was_not_stored_retries_once(
    store: histstore.Store, faults: Faults, cid: str
) -> None:
    faults.commit_mode = "rollback-then-fail"
    faults.unreachable_after_commit = True
    with pytest.raises(WriteError) as info:
        await store.write(cid, user_msgs(2))
    faults.unreachable = False
    assert info.value.outcome.uncertain is True
    for _ in range(2):
        await store.write(cid, user_msgs(2), idempotency_key=info.value.idempotency_key)
    assert stored_contents(await store.read(cid)) == ["m-0", "m-1"]


async def test_failure_before_commit_is_certain(
    store: histstore.Store, faults: Faults, cid: str
) -> None:
    """A write whose transaction fails before its commit is known not stored. (The plain
    append on Postgres is one statement that is its own commit: a failure there is a
    lost commit, settled or uncertain, as the tests above check.)"""
    await store.write(cid, user_msgs(1, "old"))
    faults.unreachable = True
    with pytest.raises(WriteError) as info:
        await store.write(cid, user_msgs(2, "new"), at=1)
    faults.unreachable = False
    assert (info.value.outcome.accepted, info.value.outcome.uncertain) == (0, False)
    assert is_database_error(info.value.__cause__)
    assert stored_contents(await store.read(cid)) == ["old-0"]


async def test_driver_errors_are_wrapped_everywhere(
    store: histstore.Store, faults: Faults, cid: str
) -> None:
    await store.write(cid, user_msgs(2))
    calls: list[Callable[[], Awaitable[object]]] = [
        lambda: store.read(cid),
        lambda: store.read(cid, limit=1),
        lambda: store.count(cid),
        lambda: store.exists(cid),
        lambda: store.pop(cid),
        lambda: store.clear(cid),
        lambda: store.conversations(),
        lambda: store.write(cid, user_msgs(1, "x")),
    ]
    faults.unreachable = True
    for call in calls:
        with pytest.raises(HistStoreError) as info:
            await call()
        assert is_database_error(info.value.__cause__)
    faults.unreachable = False
    assert stored_contents(await store.read(cid)) == ["m-0", "m-1"]


# ---------------------------------------------------------------- cancellation


def assert_batches_whole(messages: list[Message], sizes: dict[str, int]) -> dict[str, int]:
    """Every batch tag appears with all its messages, contiguous, or not at all."""
    assert [m.position for m in messages] == list(range(len(messages)))
    seen: dict[str, list[int]] = {}
    for m in messages:
        tag, _, i = str(m.content).rpartition("/")
        seen.setdefault(tag, []).append(int(i))
    for tag, idx in seen.items():
        assert idx == list(range(sizes[tag])), f"batch {tag} stored partly or twice: {idx}"
    return {tag: len(idx) for tag, idx in seen.items()}


def batch(tag: str, n: int) -> list[dict[str, Any]]:
    return [{"role": "user", "content": f"{tag}/{i}"} for i in range(n)]


async def cancel_soon(coro: Awaitable[object], spins: int) -> bool:
    """Run ``coro`` in a task, cancel it after ``spins`` loop iterations; True if cancelled."""
    task = asyncio.ensure_future(coro)
    for _ in range(spins):
        await asyncio.sleep(0)
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        return True
    return False


async def test_cancelled_writes_are_all_or_nothing(store: histstore.Store, cid: str) -> None:
    await store.write(cid, batch("first", 2))
    sizes = {"first": 2}
    cancelled = 0
    for i in range(60):
        tag = f"b{i}"
        sizes[tag] = 1 + i % 4
        cancelled += await cancel_soon(store.write(cid, batch(tag, sizes[tag])), i % 7)
    for i in range(20):
        tag = f"w{i}"
        sizes[tag] = 2
        try:
            await asyncio.wait_for(store.write(cid, batch(tag, 2)), timeout=0.0005 * i)
        except TimeoutError:
            cancelled += 1
    assert cancelled > 0
    stored = assert_batches_whole(await store.read(cid), sizes)
    assert stored["first"] == 2  # the in-memory database survived
    assert connections_in_use(store) == 0
    # The store still works.
    await store.write(cid, batch("after", 1))
    assert (await store.read(cid, limit=1))[0].content == "after/0"


async def test_concurrent_cancellations(store: histstore.Store, cid: str) -> None:
    sizes: dict[str, int] = {}
    tasks = []
    for i in range(30):
        tag = f"c{i}"
        sizes[tag] = 1 + i % 3
        tasks.append(asyncio.ensure_future(store.write(cid, batch(tag, sizes[tag]))))
    for _ in range(3):
        await asyncio.sleep(0)
    for t in tasks[::2]:
        t.cancel()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    for r in results:
        assert isinstance(r, (WriteOutcome, asyncio.CancelledError)), r
    stored = assert_batches_whole(await store.read(cid), sizes)
    for i, r in enumerate(results):
        if isinstance(r, WriteOutcome):
            assert stored[f"c{i}"] == sizes[f"c{i}"]
    assert connections_in_use(store) == 0
    await store.write(cid, batch("after", 1))


async def test_retry_after_cancel_with_own_key_stores_once(
    store: histstore.Store, cid: str
) -> None:
    sizes: dict[str, int] = {}
    for i in range(30):
        tag = f"k{i}"
        sizes[tag] = 2
        await cancel_soon(store.write(cid, batch(tag, 2), idempotency_key=tag), i % 6)
        out = await store.write(cid, batch(tag, 2), idempotency_key=tag)
        assert (out.accepted, out.uncertain) == (2, False)
    stored = assert_batches_whole(await store.read(cid), sizes)
    assert stored == sizes


async def test_cancelled_writes_leave_no_postgres_session_behind(pg_url: str) -> None:
    database = pg_url.rsplit("/", 1)[1]

    async def sessions(state: str | None = None) -> int:
        where = f"datname = '{database}' AND pid <> pg_backend_pid()"
        if state:
            where += f" AND state = '{state}'"
        rows = await pg_fetch(pg_url, f"SELECT count(*) FROM pg_stat_activity WHERE {where}")
        return int(rows[0][0])

    conversation = new_id()
    async with histstore.connect(pg_url) as store:
        await store.write(conversation, batch("warm", 1))
        before = await sessions()
        sizes = {"warm": 1}
        for i in range(40):
            tag = f"b{i}"
            sizes[tag] = 1 + i % 3
            await cancel_soon(store.write(conversation, batch(tag, sizes[tag])), i % 8)
        for _ in range(3):
            assert await sessions("idle in transaction") == 0
            assert await sessions() <= before
            await asyncio.sleep(0.05)
        assert connections_in_use(store) == 0
        assert_batches_whole(await store.read(conversation), sizes)
