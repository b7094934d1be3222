"""Concurrent appends sent together (``_storage.append_groups``).

The behaviour tests run on every backend: SQLite groups writers' programs in one
transaction (``_storage.sqlite_writer``), Postgres their append statements in one
statement. The queue's own rules are checked against a recording ``send``.
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest
from conftest import Backend
from faults import Faults
from sqlalchemy import text

import histstore
from histstore import Message, NotFound, WriteError
from histstore._storage import append_groups
from histstore._storage.append_groups import AppendGroups
from histstore._storage.dberrors import DatabaseFailure

ONE, GROUP = object(), object()


def _params(c: str, n: int = 1) -> dict[str, Any]:
    return {
        "c": c,
        "owner": None,
        "n": n,
        "now": datetime.now(UTC),
        "key": uuid.uuid4().hex,
        "digest": "d",
        "roles": ["user"] * n,
        "datas": ["{}"] * n,
        "tokens": [None] * n,
        "texts": [""] * n,
    }


class Server:
    """A ``send`` that records what it was given and answers as the statements would;
    it holds each statement until ``release`` so that writers queue meanwhile."""

    def __init__(self) -> None:
        self.sent: list[tuple[object, dict[str, Any]]] = []
        self.lengths: dict[str, int] = {}
        self.gate = asyncio.Event()
        self.refuse: set[str] = set()  # conversations whose batch the server refuses
        self.lose_answer = False

    async def send(
        self, statement: Any, params: dict[str, Any], action: str, conversation: str | None
    ) -> list[Any]:
        self.sent.append((statement, params))
        await self.gate.wait()
        batches = (
            [(params["c"], params["n"])]
            if statement is ONE
            else list(zip(params["cs"], map(int, params["ns"]), strict=True))
        )
        if self.lose_answer:
            raise _failure(action, conversation, "commit")
        if any(c in self.refuse for c, _ in batches):
            raise _failure(action, conversation, "body")
        rows = []
        for c, n in batches:
            self.lengths[c] = self.lengths.get(c, 0) + n
            rows.append((c, self.lengths[c]))
        return [(length,) for _, length in rows] if statement is ONE else rows


def _failure(action: str, conversation: str | None, phase: str) -> DatabaseFailure:
    failure = DatabaseFailure(f"{action} {conversation} failed", phase=phase)
    failure.__cause__ = OSError("lost")
    return failure


async def _settled() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


@pytest.fixture
def server() -> Server:
    return Server()


async def test_lone_writer_sends_its_own_statement(server: Server) -> None:
    groups = AppendGroups(server.send)
    server.gate.set()
    assert await groups.append(ONE, GROUP, _params("a", 2), "write to") == [(2,)]
    assert [s for s, _ in server.sent] == [ONE]


async def test_writers_arriving_meanwhile_go_in_one_statement(server: Server) -> None:
    groups = AppendGroups(server.send)
    busy = [groups.append(ONE, GROUP, _params(f"busy{i}"), "w") for i in range(2)]
    first = [asyncio.ensure_future(a) for a in busy]
    await _settled()
    assert len(server.sent) == append_groups.IN_FLIGHT == 2
    queued = [("c", 1), ("b", 2), ("c", 3), ("a", 1)]
    later = [
        asyncio.ensure_future(groups.append(ONE, GROUP, _params(c, n), "w")) for c, n in queued
    ]
    await _settled()
    server.gate.set()
    results = await asyncio.gather(*first, *later)
    assert results[2:] == [[(1,)], [(2,)], [(4,)], [(1,)]]
    group_params = server.sent[2][1]
    # One batch a conversation, sorted; the second append to "c" waits for the next.
    assert server.sent[2][0] is GROUP
    assert group_params["cs"] == ["a", "b", "c"]
    assert group_params["ns"] == ["1", "2", "1"]
    assert group_params["mcs"] == ["a", "b", "b", "c"]
    assert group_params["slots"] == ["0", "0", "1", "0"]
    assert server.sent[3][0] is ONE
    assert server.sent[3][1]["c"] == "c"
    assert len(server.sent) == 4


async def test_a_refused_group_is_sent_again_batch_by_batch(server: Server) -> None:
    groups = AppendGroups(server.send)
    server.refuse.add("bad")
    busy = [
        asyncio.ensure_future(groups.append(ONE, GROUP, _params(f"x{i}"), "w")) for i in range(2)
    ]
    await _settled()
    names = ["good1", "bad", "good2"]
    queued = [asyncio.ensure_future(groups.append(ONE, GROUP, _params(c), "w")) for c in names]
    await _settled()
    server.gate.set()
    await asyncio.gather(*busy)
    results = await asyncio.gather(*queued, return_exceptions=True)
    assert results[0] == results[2] == [(1,)]
    assert isinstance(results[1], DatabaseFailure)
    assert results[1].phase == "body"
    assert "bad" not in server.lengths


async def test_a_lost_answer_fails_each_member_with_its_own_failure(server: Server) -> None:
    groups = AppendGroups(server.send)
    busy = [
        asyncio.ensure_future(groups.append(ONE, GROUP, _params(f"x{i}"), "w")) for i in range(2)
    ]
    await _settled()
    queued = [
        asyncio.ensure_future(groups.append(ONE, GROUP, _params(c), "write to")) for c in "pq"
    ]
    await _settled()
    server.lose_answer = True
    server.gate.set()
    results = await asyncio.gather(*busy, *queued, return_exceptions=True)
    failures = results[2:]
    assert all(isinstance(f, DatabaseFailure) and f.phase == "commit" for f in failures)
    assert ["'p'" in str(f) for f in failures] == [True, False]
    assert ["'q'" in str(f) for f in failures] == [False, True]
    assert failures[0] is not failures[1]
    assert all(isinstance(f.__cause__, OSError) for f in failures)


async def test_a_writer_cancelled_while_queued_sends_nothing(server: Server) -> None:
    groups = AppendGroups(server.send)
    busy = [
        asyncio.ensure_future(groups.append(ONE, GROUP, _params(f"x{i}"), "w")) for i in range(2)
    ]
    await _settled()
    gone = asyncio.ensure_future(groups.append(ONE, GROUP, _params("gone"), "w"))
    kept = asyncio.ensure_future(groups.append(ONE, GROUP, _params("kept"), "w"))
    await _settled()
    gone.cancel()
    await _settled()
    server.gate.set()
    assert await kept == [(1,)]
    await asyncio.gather(*busy)
    await groups.wait_idle()
    assert gone.cancelled()
    assert "gone" not in server.lengths
    assert all(p.get("c") != "gone" and "gone" not in p.get("cs", []) for _, p in server.sent)


# ---------------------------------------------------------------------------- every backend


async def test_concurrent_appends_all_land_in_order(backend: Backend) -> None:
    """Many writers at once, to their own conversations and to a shared one: every
    batch is stored once, densely, each outcome's length is where its batch ended, and
    a writer's own batches keep their order."""
    shared = f"shared-{uuid.uuid4().hex}"

    async def writer(t: int) -> list[tuple[str, int, list[str]]]:
        done = []
        for b in range(4):
            c = shared if b % 2 else f"own-{t}"
            batch = [f"t{t}-b{b}-m{i}" for i in range(1 + (t + b) % 3)]
            out = await store.write(c, [Message.user(x) for x in batch])
            done.append((c, out.length, batch))
        return done

    async with backend.connect() as store:
        results = await asyncio.gather(*(writer(t) for t in range(24)))
        stored = {c: [m.content for m in await store.read(c)] for c in {shared, "own-0"}}
        shared_messages = stored[shared]
        for done in results:
            for c, length, batch in done:
                if c == shared:
                    assert shared_messages[length - len(batch) : length] == batch
            own = [m.content for m in await store.read(done[0][0])]
            assert own == [x for c, _, batch in done if c == done[0][0] for x in batch]
        expected = sum(len(b) for r in results for c, _, b in r if c == shared)
        assert len(shared_messages) == len(set(shared_messages)) == expected
        if backend.name.startswith("postgres"):
            async with store.engine.connect() as conn:
                commits = (
                    await conn.execute(
                        text("SELECT count(DISTINCT xmin::text) FROM histstore_writes")
                    )
                ).scalar_one()
            assert commits < 24 * 4  # writers went together


async def test_a_view_writes_its_own_beside_another_users(backend: Backend) -> None:
    """Concurrent appends through views: a conversation of another user is refused
    as unknown and gets nothing; the others are written."""
    async with backend.connect() as store:
        alice, bob = store.scoped("alice"), store.scoped("bob")
        await alice.write("alice-c", [Message.user("first")])
        writes = [bob.write("alice-c", [Message.user("not bob's")])]
        writes += [bob.write(f"bob-{i}", [Message.user("bob's")]) for i in range(8)]
        writes += [alice.write("alice-c", [Message.user(f"again {i}")]) for i in range(3)]
        results = await asyncio.gather(*writes, return_exceptions=True)
        assert isinstance(results[0], NotFound)
        assert all(r.accepted == 1 for r in results[1:])  # type: ignore[union-attr]
        assert (await alice.read("alice-c"))[0].content == "first"
        assert await alice.count("alice-c") == 4
        assert [await bob.count(f"bob-{i}") for i in range(8)] == [1] * 8


_REFUSE = {
    "sqlite": [
        "CREATE TRIGGER refuse_bad BEFORE INSERT ON histstore_messages"
        " WHEN NEW.conversation_id = 'bad' BEGIN SELECT RAISE(ABORT, 'refused'); END"
    ],
    "postgresql": [
        "CREATE FUNCTION refuse_bad() RETURNS trigger LANGUAGE plpgsql AS"
        " $$ BEGIN IF NEW.conversation_id = 'bad' THEN RAISE EXCEPTION 'refused'; END IF;"
        " RETURN NEW; END $$",
        "CREATE TRIGGER refuse_bad BEFORE INSERT ON histstore_messages"
        " FOR EACH ROW EXECUTE FUNCTION refuse_bad()",
    ],
}
_ALLOW = {
    "sqlite": ["DROP TRIGGER refuse_bad"],
    "postgresql": ["DROP TRIGGER refuse_bad ON histstore_messages", "DROP FUNCTION refuse_bad()"],
}


async def test_a_batch_the_database_refuses_fails_alone(backend: Backend) -> None:
    """Among writers that go together, the one whose batch the database refuses gets a
    ``WriteError`` and stores nothing; every other batch is stored."""
    async with backend.connect() as store:
        dialect = store.engine.dialect.name

        async def run(statements: list[str]) -> None:
            async with store.engine.begin() as conn:
                for sql in statements:
                    await conn.execute(text(sql))

        await run(_REFUSE[dialect])
        try:
            names = [f"ok-{i}" for i in range(12)]
            names.insert(5, "bad")
            results = await asyncio.gather(
                *(store.write(c, [Message.user(c)]) for c in names), return_exceptions=True
            )
        finally:
            await run(_ALLOW[dialect])
        refused = results.pop(5)
        assert isinstance(refused, WriteError)
        assert refused.outcome == histstore.WriteOutcome(0, False, None)
        assert all(isinstance(r, histstore.WriteOutcome) and r.length == 1 for r in results)
        assert not await store.exists("bad")
        stored = [[m.content for m in await store.read(c)] for c in names if c != "bad"]
        assert stored == [[c] for c in names if c != "bad"]


@pytest.mark.parametrize("mode", ["commit-then-fail", "rollback-then-fail"])
async def test_a_lost_commit_settles_each_writer(
    store: histstore.Store, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    """The answer of a transaction several writers went in is lost: each writer's
    outcome says what is stored, settled by its own key."""
    faults = Faults(monkeypatch)
    faults.own_transactions = ("WITH BATCHES AS",)  # Postgres: a group's statement
    faults.commit_mode = mode
    names = [f"c{i}" for i in range(16)]
    results = await asyncio.gather(
        *(store.write(c, [Message.user(c)]) for c in names), return_exceptions=True
    )
    assert faults.commits_failed == 1
    failed = 0
    for c, result in zip(names, results, strict=True):
        stored = [m.content for m in await store.read(c)]
        if isinstance(result, WriteError):
            failed += 1
            assert result.outcome == histstore.WriteOutcome(0, False, None)
            assert stored == []
        else:
            assert result == histstore.WriteOutcome(1, False, result.length)
            assert result.length in (1, None)
            assert stored == [c]
    if mode == "commit-then-fail":
        assert failed == 0
    else:  # on Postgres the statement that failed was a group's
        assert failed >= (2 if store.engine.dialect.name == "postgresql" else 1)
