"""Concurrent reads of the newest messages sent together (``_storage.read_groups``).

The queue's rules are checked against a recording ``fetch``; the behaviour tests run
on every backend (SQLite reads alone: it has no group statement), and one checks that
Postgres's concurrent readers share a few server sessions.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
from conftest import Backend
from helpers import empty_pg_database
from sqlalchemy import text

import histstore
from histstore import Message
from histstore._storage import read_groups
from histstore._storage.dberrors import DatabaseFailure
from histstore._storage.read_groups import ReadGroups

ONE, GROUP = object(), object()


def _params(c: str, limit: int = 2, start: int = 0) -> dict[str, Any]:
    return {"c": c, "owner": None, "start": start, "stop": None, "limit": limit}


class Server:
    """A ``fetch`` that records what it was given and answers from ``stored`` (each
    conversation's messages, as rows ``(data, position)``) as the statements would; it
    holds each statement until ``release`` so that readers queue meanwhile."""

    def __init__(self) -> None:
        self.sent: list[tuple[object, dict[str, Any], str, str | None]] = []
        self.stored = {c: [(f"{c}{p}", p) for p in range(5)] for c in "abcdef"}
        self.gate = asyncio.Event()
        self.group_gate = asyncio.Event()  # holds group statements once ``gate`` is set
        self.group_gate.set()
        self.fail_groups = False
        self.fail: set[str] = set()  # conversations whose own read fails

    def _newest(self, c: str, start: int, limit: int) -> list[tuple[str, int]]:
        return [r for r in reversed(self.stored.get(c, [])) if r[1] >= start][:limit]

    async def fetch(
        self, statement: Any, params: dict[str, Any], action: str, conversation: str | None
    ) -> list[Any]:
        self.sent.append((statement, params, action, conversation))
        await self.gate.wait()
        if statement is ONE:
            if params["c"] in self.fail:
                raise DatabaseFailure(f"{action} {conversation!r} failed", phase="body")
            return self._newest(params["c"], params["start"], params["limit"])
        await self.group_gate.wait()
        if self.fail_groups:
            raise DatabaseFailure("read failed", phase="body")
        rows = []
        members = zip(params["cs"], params["starts"], params["limits"], strict=True)
        for i, (c, start, limit) in enumerate(members, 1):
            rows += [(i, *r) for r in self._newest(c, int(start), int(limit))]
        return rows


async def _settled() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def _busy(groups: ReadGroups) -> list[asyncio.Future[Any]]:
    """Fill every slot with a lone read, held by the server."""
    busy = [
        asyncio.ensure_future(groups.submit(ONE, GROUP, _params(f"busy{i}"), "read", None))
        for i in range(read_groups.IN_FLIGHT)
    ]
    await _settled()
    return busy


@pytest.fixture
def server() -> Server:
    return Server()


async def test_a_lone_reader_sends_its_own_statement(server: Server) -> None:
    groups = ReadGroups(server.fetch)
    server.gate.set()
    assert await groups.submit(ONE, GROUP, _params("a"), "read", "a") == [("a4", 4), ("a3", 3)]
    assert [s for s, *_ in server.sent] == [ONE]


async def test_readers_arriving_meanwhile_go_in_one_statement(server: Server) -> None:
    groups = ReadGroups(server.fetch)
    busy = await _busy(groups)
    asks = [_params("b", 3), _params("a", 2, start=4), _params("b", 1), _params("zz", 2)]
    later = [asyncio.ensure_future(groups.submit(ONE, GROUP, p, "read", None)) for p in asks]
    await _settled()
    server.gate.set()
    await asyncio.gather(*busy)
    results = await asyncio.gather(*later)
    # Each reader its own rows, as its own statement would give them (the number gone).
    assert results == [
        [("b4", 4), ("b3", 3), ("b2", 2)],
        [("a4", 4)],
        [("b4", 4)],
        [],
    ]
    assert len(server.sent) == read_groups.IN_FLIGHT + 1
    statement, params, *_ = server.sent[-1]
    assert statement is GROUP
    assert params == {
        "cs": ["b", "a", "b", "zz"],
        "owners": [None] * 4,
        "starts": ["0", "4", "0", "0"],
        "limits": ["3", "2", "1", "2"],
    }


async def test_a_group_is_at_most_max_group_readers(server: Server) -> None:
    groups = ReadGroups(server.fetch)
    busy = await _busy(groups)
    many = read_groups.MAX_GROUP + 3
    later = [
        asyncio.ensure_future(groups.submit(ONE, GROUP, _params("a", 1), "read", None))
        for _ in range(many)
    ]
    await _settled()
    server.gate.set()
    await asyncio.gather(*busy)
    assert await asyncio.gather(*later) == [[("a4", 4)]] * many
    sizes = [len(p["cs"]) if s is GROUP else 1 for s, p, *_ in server.sent[len(busy) :]]
    assert sizes == [read_groups.MAX_GROUP, 3]


async def test_a_failed_group_reads_each_member_on_its_own(server: Server) -> None:
    groups = ReadGroups(server.fetch)
    busy = await _busy(groups)
    server.fail_groups = True
    server.fail.add("bad")
    names = ["a", "bad", "c"]
    later = [asyncio.ensure_future(groups.submit(ONE, GROUP, _params(c), "read", c)) for c in names]
    await _settled()
    server.gate.set()
    await asyncio.gather(*busy)
    results = await asyncio.gather(*later, return_exceptions=True)
    assert results[0] == [("a4", 4), ("a3", 3)]
    assert results[2] == [("c4", 4), ("c3", 3)]
    assert isinstance(results[1], DatabaseFailure)
    assert "'bad'" in str(results[1])  # its own failure, naming its conversation
    assert [s for s, *_ in server.sent[len(busy) :]] == [GROUP, ONE, ONE, ONE]


async def test_a_lone_queued_reader_meets_its_own_failure(server: Server) -> None:
    groups = ReadGroups(server.fetch)
    busy = await _busy(groups)
    server.fail.add("bad")
    bad = asyncio.ensure_future(groups.submit(ONE, GROUP, _params("bad"), "read", "bad"))
    await _settled()
    server.gate.set()
    await asyncio.gather(*busy)
    with pytest.raises(DatabaseFailure, match="'bad'"):
        await bad
    assert server.sent[-1][2:] == ("read", "bad")


async def test_a_reader_cancelled_while_queued_is_not_sent(server: Server) -> None:
    groups = ReadGroups(server.fetch)
    busy = await _busy(groups)
    gone = asyncio.ensure_future(groups.submit(ONE, GROUP, _params("gone"), "read", None))
    kept = asyncio.ensure_future(groups.submit(ONE, GROUP, _params("a"), "read", None))
    await _settled()
    gone.cancel()
    await _settled()
    server.gate.set()
    assert await kept == [("a4", 4), ("a3", 3)]
    await asyncio.gather(*busy)
    await groups.wait_idle()
    assert gone.cancelled()
    assert all(p.get("c") != "gone" and "gone" not in p.get("cs", []) for _, p, *_ in server.sent)


async def test_a_reader_cancelled_in_a_sent_group_leaves_the_others_theirs(
    server: Server,
) -> None:
    groups = ReadGroups(server.fetch)
    busy = await _busy(groups)
    later = [
        asyncio.ensure_future(groups.submit(ONE, GROUP, _params(c), "read", None)) for c in "ab"
    ]
    await _settled()
    server.group_gate.clear()
    server.gate.set()
    await asyncio.gather(*busy)
    await _settled()
    assert server.sent[-1][0] is GROUP  # sent, its answer not yet handed out
    later[0].cancel()
    await _settled()
    server.group_gate.set()
    assert await later[1] == [("b4", 4), ("b3", 3)]
    await groups.wait_idle()
    assert later[0].cancelled()


# ---------------------------------------------------------------------------- every backend


async def test_concurrent_readers_each_read_their_newest(backend: Backend) -> None:
    """Many tasks reading the newest messages of their conversations while others
    write: each read is exactly the newest ``limit`` from ``start`` of its own
    conversation, and holds every write its task made before it (read your writes)."""
    names = [f"conv-{i}-{uuid.uuid4().hex[:6]}" for i in range(6)]

    async def agent(t: int) -> None:
        c = names[t % len(names)]
        for turn in range(6):
            mine = f"t{t}-turn{turn}"
            await store.write(c, [Message.user(mine)])
            assert mine in [m.content for m in await store.read(c, limit=24)]
            tail = await store.read(c, limit=3)
            stored = await store.read(c)
            # The newest three at the time of the read: consecutive messages, as stored.
            contents = [m.content for m in stored]
            at = contents.index(tail[-1].content)
            assert [m.content for m in tail] == contents[at - len(tail) + 1 : at + 1]
            assert [m.position for m in tail] == list(range(at - len(tail) + 1, at + 1))
            later = await store.read(c, limit=2, start=1)
            assert all(m.position >= 1 for m in later)

    async with backend.connect() as store:
        await asyncio.gather(*(agent(t) for t in range(24)))
        for c in names:
            stored = await store.read(c)
            assert [m.position for m in stored] == list(range(24))
            assert [m.content for m in await store.read(c, limit=5)] == [
                m.content for m in stored[-5:]
            ]
        assert await store.read("no-such-conversation", limit=5) == []


async def test_postgres_concurrent_readers_share_a_few_server_sessions(pg_url: str) -> None:
    """32 readers at once take at most ``IN_FLIGHT`` more server sessions, not one
    each: their reads go together (SQLite reads on the loop's thread or its own)."""
    async with empty_pg_database() as url, histstore.connect(url, migrate=True) as store:

        async def sessions() -> int:
            async with store.engine.connect() as conn:
                sql = "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                return int((await conn.execute(text(sql))).scalar_one())

        names = [f"c{i}" for i in range(32)]
        for c in names:
            await store.write(c, [Message.user(f"{c} {i}") for i in range(3)])
            await store.read(c, limit=2)
        before = await sessions()
        for _ in range(3):
            tails = await asyncio.gather(*(store.read(c, limit=2) for c in names))
            assert [[m.content for m in t] for t in tails] == [[f"{c} 1", f"{c} 2"] for c in names]
        assert await sessions() - before <= read_groups.IN_FLIGHT


async def test_views_read_only_their_own_together(backend: Backend) -> None:
    """Concurrent reads through two users' views: each sees its own conversations, and
    another user's conversation reads as empty, as a read alone does."""
    async with backend.connect() as store:
        alice, bob = store.scoped("alice"), store.scoped("bob")
        for i in range(4):
            await alice.write(f"a{i}", [Message.user(f"alice {i}")])
            await bob.write(f"b{i}", [Message.user(f"bob {i}")])
        reads = [alice.read(f"a{i}", limit=5) for i in range(4)]
        reads += [bob.read(f"b{i}", limit=5) for i in range(4)]
        reads += [bob.read(f"a{i}", limit=5) for i in range(4)]
        results = await asyncio.gather(*reads)
        assert [[m.content for m in r] for r in results[:8]] == [
            *([f"alice {i}"] for i in range(4)),
            *([f"bob {i}"] for i in range(4)),
        ]
        assert results[8:] == [[]] * 4
