"""How ``HiststoreSaver`` stores channel values: a list that extends the channel's
previous value is stored as the items it adds, read back whole, with reads bounded and
every thread operation keeping what a stored value needs."""

from __future__ import annotations

import asyncio
import random
import string
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from helpers import alembic
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.checkpoint.conformance.test_utils import generate_checkpoint, generate_metadata
from langgraph.graph import START, MessagesState, StateGraph
from sqlalchemy import bindparam, delete, func, insert, select, text, update

import histstore
from histstore import SchemaError
from histstore._storage import schema as _schema
from histstore.integrations._langgraph_values import parts
from histstore.integrations.langgraph import HiststoreSaver

BLOBS = _schema.checkpoint_blobs


class Chat:
    """A thread written through a saver's ``aput``, one checkpoint per step."""

    def __init__(self, saver: HiststoreSaver, thread: str | None = None) -> None:
        self.saver = saver
        self.thread = thread or f"t-{uuid.uuid4().hex}"
        self.parent: str | None = None
        self.version: Any = None
        self.values: list[Any] = []
        self.ids: list[str] = []
        self.seen: list[list[Any]] = []

    async def step(self, value: list[Any]) -> dict[str, Any]:
        self.values = value
        self.version = self.saver.get_next_version(self.version, None)
        cp = generate_checkpoint(
            channel_values={"messages": value, "step": len(self.ids)},
            channel_versions={"messages": self.version, "step": self.version},
        )
        configurable: dict[str, Any] = {"thread_id": self.thread, "checkpoint_ns": ""}
        if self.parent is not None:
            configurable["checkpoint_id"] = self.parent
        stored = await self.saver.aput(
            {"configurable": configurable},
            cp,
            generate_metadata(step=len(self.ids), run_id=f"run-{len(self.ids) // 5}"),
            {"messages": self.version, "step": self.version},
        )
        self.parent = cp["id"]
        self.ids.append(cp["id"])
        self.seen.append(list(value))
        return stored

    async def grow(self, steps: int) -> None:
        for _ in range(steps):
            n = len(self.values)
            await self.step([*self.values, {"role": "user", "content": f"message {n}"}])

    def config(self, checkpoint_id: str | None = None) -> Any:
        configurable = {"thread_id": self.thread, "checkpoint_ns": ""}
        if checkpoint_id is not None:
            configurable["checkpoint_id"] = checkpoint_id
        return {"configurable": configurable}

    async def assert_every_checkpoint_reads_whole(self) -> None:
        listed = [t async for t in self.saver.alist(self.config())]
        assert [t.checkpoint["id"] for t in listed] == self.ids[::-1]
        for t, expected in zip(listed, self.seen[::-1], strict=True):
            assert t.checkpoint["channel_values"]["messages"] == expected
        for checkpoint_id, expected in zip(self.ids, self.seen, strict=True):
            got = await self.saver.aget_tuple(self.config(checkpoint_id))
            assert got is not None
            assert got.checkpoint["channel_values"]["messages"] == expected


async def blob_rows(store: histstore.Store, thread: str) -> list[tuple[str, str | None, int]]:
    """(version, base, size) of each stored value of the thread's ``messages``."""
    query = (
        select(BLOBS.c.version, BLOBS.c.base, func.length(BLOBS.c.blob))
        .where(BLOBS.c.thread_id == thread, BLOBS.c.channel == "messages")
        .order_by(BLOBS.c.version)
    )
    async with store.engine.connect() as conn:
        return [tuple(r) for r in await conn.execute(query)]  # type: ignore[misc]


async def test_an_extended_list_is_stored_as_the_items_it_adds(store):
    chat = Chat(HiststoreSaver(store))
    await chat.grow(40)
    rows = await blob_rows(store, chat.thread)
    assert len(rows) == 40
    versions = [version for version, _, _ in rows]
    for i, (_, base, _) in enumerate(rows):
        assert base is None or base in versions[:i]  # a part extends an earlier version
    # Whole copies are few: each at least about twice the items of the one before.
    assert 2 <= sum(base is None for _, base, _ in rows) <= 4
    # What is stored grows with the messages, not with messages x checkpoints.
    largest_whole = max(size for _, base, size in rows if base is None)
    assert sum(size for *_, size in rows) < 5 * largest_whole
    await chat.assert_every_checkpoint_reads_whole()
    latest = await chat.saver.aget_tuple(chat.config())
    assert latest is not None
    assert latest.checkpoint["channel_values"] == {"messages": chat.values, "step": 39}


def _random_words(rng: random.Random, size: int = 300) -> str:
    """Text that compresses poorly: random letters in words."""
    words: list[str] = []
    while sum(len(w) + 1 for w in words) < size:
        words.append("".join(rng.choices(string.ascii_lowercase, k=rng.randint(2, 10))))
    return " ".join(words)


async def thread_bytes(store: histstore.Store, thread: str) -> int:
    """The bytes a thread's rows hold: values, checkpoints with metadata, writes."""
    cps, writes = _schema.checkpoints, _schema.checkpoint_writes
    queries = [
        select(func.sum(func.length(BLOBS.c.blob))).where(BLOBS.c.thread_id == thread),
        select(func.sum(func.length(cps.c.checkpoint) + func.length(cps.c.metadata))).where(
            cps.c.thread_id == thread
        ),
        select(func.sum(func.length(writes.c.blob))).where(writes.c.thread_id == thread),
    ]
    total = 0
    async with store.engine.connect() as conn:
        for query in queries:
            total += int((await conn.execute(query)).scalar() or 0)
    return total


async def test_a_threads_bytes_per_turn_stay_flat_as_it_grows(store):
    """Two checkpoints a turn (the user's message, then the model's), 300 characters of
    random words each: bytes per turn at 1,000 turns within 1.3x those at 50, and the
    newest value rebuilt from about twice the square root of its items in parts."""
    rng = random.Random(5)
    per_turn = {}
    for turns in (50, 1000):
        chat = Chat(HiststoreSaver(store))
        for _ in range(2 * turns):
            await chat.step([*chat.values, {"role": "user", "content": _random_words(rng)}])
        per_turn[turns] = await thread_bytes(store, chat.thread) / turns
        rows = await blob_rows(store, chat.thread)
        base = {version: b for version, b, _ in rows}
        chain, version = 1, rows[-1][0]
        while base[version] is not None:
            chain, version = chain + 1, base[version]
        assert chain <= 2 * parts(2 * turns) + 1
        latest = await chat.saver.aget_tuple(chat.config())
        assert latest is not None
        assert latest.checkpoint["channel_values"]["messages"] == chat.values
    assert per_turn[1000] <= 1.3 * per_turn[50]


async def test_a_list_changed_otherwise_is_stored_whole(store):
    chat = Chat(HiststoreSaver(store))
    await chat.grow(3)
    await chat.step(chat.values[:-1])  # shorter
    await chat.step([{"role": "user", "content": "replaced"}, *chat.values[1:]])
    await chat.step([*chat.values])  # equal, a new version
    await chat.step(list(reversed(chat.values)))
    await chat.grow(1)
    equal_items = [dict(m) for m in chat.values] + [{"role": "user", "content": "new"}]
    await chat.step(equal_items)  # equal items, not the same objects
    rows = await blob_rows(store, chat.thread)
    assert [base is None for _, base, _ in rows] == [
        True,
        False,
        False,
        True,
        True,
        True,
        True,
        False,
        True,
    ]
    await chat.assert_every_checkpoint_reads_whole()


async def test_a_list_extended_in_place_keeps_every_version(store):
    chat = Chat(HiststoreSaver(store))
    shared: list[Any] = [{"n": 0}]
    for n in range(1, 5):
        await chat.step(shared)
        shared.append({"n": n})  # the same list object, grown after it was stored
    await chat.step(shared)
    assert [base is None for _, base, _ in await blob_rows(store, chat.thread)] == [
        True,
        False,
        False,
        False,
        False,
    ]
    await chat.assert_every_checkpoint_reads_whole()


async def test_another_saver_continues_a_thread_from_what_it_reads(store):
    first = Chat(HiststoreSaver(store))
    await first.grow(3)
    later = Chat(HiststoreSaver(store), first.thread)  # as another process would
    got = await later.saver.aget_tuple(later.config())
    assert got is not None
    later.parent, later.version = got.checkpoint["id"], got.checkpoint["channel_versions"]["step"]
    later.values, later.ids, later.seen = got.checkpoint["channel_values"]["messages"], [], []
    await later.grow(2)
    rows = await blob_rows(store, first.thread)
    assert [base is None for _, base, _ in rows] == [True, False, False, False, False]
    first.ids += later.ids
    first.seen += later.seen
    await first.assert_every_checkpoint_reads_whole()


async def test_a_value_whose_base_was_deleted_meanwhile_is_stored_whole(store):
    chat = Chat(HiststoreSaver(store))
    await chat.grow(3)
    await HiststoreSaver(store).adelete_thread(chat.thread)  # another process's delete
    chat.parent = None
    chat.ids, chat.seen = [], []
    await chat.grow(2)
    assert [base is None for _, base, _ in await blob_rows(store, chat.thread)] == [True, False]
    await chat.assert_every_checkpoint_reads_whole()


async def test_a_put_waiting_for_the_thread_sees_the_delete_it_waited_for(shared_backend):
    """A put that waits while another transaction holds the thread and deletes its
    values stores the new value whole once that transaction commits."""
    async with shared_backend.connect() as store, shared_backend.connect() as other:
        chat = Chat(HiststoreSaver(store))
        await chat.grow(3)
        threads = _schema.checkpoint_threads
        async with other.engine.begin() as conn:
            # The thread's row first (its lock), then everything it holds.
            await conn.execute(
                update(threads)
                .where(threads.c.thread_id == chat.thread)
                .values(updated_at=datetime.now(timezone.utc))
            )
            for table in (_schema.checkpoint_channels, _schema.checkpoints, BLOBS):
                await conn.execute(delete(table).where(table.c.thread_id == chat.thread))
            waiting = asyncio.create_task(chat.grow(1))
            await asyncio.sleep(0.3)
            assert not waiting.done()
        await waiting
        assert [base is None for _, base, _ in await blob_rows(store, chat.thread)] == [True]
        got = await chat.saver.aget_tuple(chat.config())
        assert got is not None
        assert got.checkpoint["channel_values"]["messages"] == chat.values


async def test_a_write_marks_an_idle_thread_changed(store):
    chat = Chat(HiststoreSaver(store))
    await chat.grow(2)
    threads = _schema.checkpoint_threads
    idle = datetime(2020, 1, 1, tzinfo=timezone.utc)
    which = threads.c.thread_id == chat.thread
    async with store.engine.begin() as conn:
        await conn.execute(update(threads).where(which).values(updated_at=idle))
    await chat.grow(1)
    async with store.engine.connect() as conn:
        changed = (await conn.execute(select(threads.c.updated_at).where(which))).scalar_one()
    assert changed > datetime.now(timezone.utc) - timedelta(minutes=1)


async def test_deleting_runs_pruning_and_copying_keep_what_values_extend(store):
    saver = HiststoreSaver(store)
    chat = Chat(saver)
    await chat.grow(12)  # runs 0, 1, 2 (five steps each)
    await saver.acopy_thread(chat.thread, f"{chat.thread}-copy")
    copy = Chat(saver, f"{chat.thread}-copy")
    copy.ids, copy.seen = list(chat.ids), list(chat.seen)
    await copy.assert_every_checkpoint_reads_whole()

    await saver.adelete_for_runs(["run-0"])
    chat.ids, chat.seen = chat.ids[5:], chat.seen[5:]
    await chat.assert_every_checkpoint_reads_whole()
    # The first versions stay: the kept ones extend them.
    assert len(await blob_rows(store, chat.thread)) == 12

    await saver.aprune([chat.thread])
    latest = await saver.aget_tuple(chat.config())
    assert latest is not None
    assert latest.checkpoint["channel_values"]["messages"] == chat.seen[-1]
    assert [t.checkpoint["id"] async for t in saver.alist(chat.config())] == [chat.ids[-1]]
    await chat.grow(1)  # and the thread goes on
    assert (await saver.aget_tuple(chat.config())).checkpoint["channel_values"][  # type: ignore[union-attr]
        "messages"
    ] == chat.values


async def test_a_chat_graph_stores_each_message_about_once(store):
    saver = HiststoreSaver(store)

    def answer(state: MessagesState) -> dict[str, Any]:
        return {"messages": [AIMessage(content=f"answer {len(state['messages'])}")]}

    builder = StateGraph(MessagesState)
    builder.add_node("answer", answer)
    builder.add_edge(START, "answer")
    graph = builder.compile(checkpointer=saver)
    config: Any = {"configurable": {"thread_id": f"chat-{uuid.uuid4().hex}"}}
    for turn in range(20):
        await graph.ainvoke({"messages": [HumanMessage(content=f"question {turn}")]}, config)
    state = await graph.aget_state(config)
    assert [m.content for m in state.values["messages"]] == [
        text for turn in range(20) for text in (f"question {turn}", f"answer {2 * turn + 1}")
    ]
    history = [s async for s in graph.aget_state_history(config)]
    lengths = [len(s.values.get("messages", [])) for s in history]
    assert lengths[0] == 40
    assert lengths == sorted(lengths, reverse=True)
    thread = config["configurable"]["thread_id"]
    rows = await blob_rows(store, thread)
    whole = [size for _, base, size in rows if base is None]
    assert len(whole) <= 4
    assert sum(size for *_, size in rows) < 5 * max(whole)


def test_the_sync_api_stores_and_reads_extensions(tmp_path: Path):
    with HiststoreSaver(tmp_path / "sync.db") as saver:
        thread = f"t-{uuid.uuid4().hex}"
        parent: str | None = None
        version: Any = None
        values: list[Any] = []
        for n in range(4):
            values = [*values, {"n": n}]
            version = saver.get_next_version(version, None)
            cp = generate_checkpoint(
                channel_values={"messages": values}, channel_versions={"messages": version}
            )
            configurable: dict[str, Any] = {"thread_id": thread, "checkpoint_ns": ""}
            if parent is not None:
                configurable["checkpoint_id"] = parent
            saver.put({"configurable": configurable}, cp, {}, {"messages": version})
            parent = cp["id"]
        got = saver.get_tuple({"configurable": {"thread_id": thread, "checkpoint_ns": ""}})
        assert got is not None
        assert got.checkpoint["channel_values"]["messages"] == values
    rows = _sqlite_rows(tmp_path / "sync.db")
    assert [base is None for base in rows] == [True, False, False, False]


def _sqlite_rows(path: Path) -> list[str | None]:
    import sqlite3
    from contextlib import closing

    with closing(sqlite3.connect(path)) as conn:
        found = conn.execute(
            "SELECT base FROM histstore_checkpoint_blobs ORDER BY version"
        ).fetchall()
    return [r[0] for r in found]


# ---------------------------------------------------------------- the migration


BEFORE = "d5f7a3c1e9b2"


async def test_the_upgrade_keeps_stored_checkpoints_and_the_downgrade_refuses_deltas(
    empty_url,
):
    async with histstore.connect(empty_url, migrate=False) as store:
        await alembic(store.engine, "upgrade", BEFORE)
        # A thread as the previous revision stored it: whole values, no ``base``.
        saver = HiststoreSaver(store)
        old = Chat(saver)
        now = datetime.now(timezone.utc)
        async with store.engine.begin() as conn:
            await conn.execute(
                insert(_schema.checkpoint_threads).values(
                    thread_id=old.thread, owner=None, created_at=now, updated_at=now
                )
            )
        version = saver.get_next_version(None, None)
        cp = generate_checkpoint(
            channel_values={"messages": [{"n": 0}]}, channel_versions={"messages": version}
        )
        type_, checkpoint = saver.serde.dumps_typed({**cp, "channel_values": {}})
        blob_type, blob = saver.serde.dumps_typed([{"n": 0}])
        key = {"thread_id": old.thread, "checkpoint_ns": ""}
        async with store.engine.begin() as conn:
            await conn.execute(
                text(
                    "INSERT INTO histstore_checkpoints (thread_id, checkpoint_ns,"
                    " checkpoint_id, parent_checkpoint_id, run_id, type, checkpoint, metadata,"
                    " created_at) VALUES (:thread_id, :checkpoint_ns, :id, NULL, NULL, :type,"
                    " :checkpoint, '{}', :now)"
                ).bindparams(bindparam("now", type_=_schema.UTCDateTime)),
                {**key, "id": cp["id"], "type": type_, "checkpoint": checkpoint, "now": now},
            )
            await conn.execute(
                text(
                    "INSERT INTO histstore_checkpoint_blobs (thread_id, checkpoint_ns, channel,"
                    " version, type, blob) VALUES (:thread_id, :checkpoint_ns, 'messages',"
                    " :version, :type, :blob)"
                ),
                {**key, "version": version, "type": blob_type, "blob": blob},
            )
            await conn.execute(
                text(
                    "INSERT INTO histstore_checkpoint_channels (thread_id, checkpoint_ns,"
                    " checkpoint_id, channel, version) VALUES (:thread_id, :checkpoint_ns,"
                    " :id, 'messages', :version)"
                ),
                {**key, "id": cp["id"], "version": version},
            )

        await alembic(store.engine, "upgrade", "head")
        await alembic(store.engine, "check")
        saver = HiststoreSaver(store)
        old.saver = saver
        got = await saver.aget_tuple(old.config())
        assert got is not None
        assert got.checkpoint["channel_values"]["messages"] == [{"n": 0}]
        old.parent, old.version = cp["id"], version
        old.values = got.checkpoint["channel_values"]["messages"]
        old.ids, old.seen = [cp["id"]], [[{"n": 0}]]
        await old.grow(2)  # extends the value stored before the upgrade
        assert [base is None for _, base, _ in await blob_rows(store, old.thread)] == [
            True,
            False,
            False,
        ]
        await old.assert_every_checkpoint_reads_whole()

        with pytest.raises(SchemaError, match="stored as extensions"):
            await alembic(store.engine, "downgrade", BEFORE)
        assert len(await blob_rows(store, old.thread)) == 3  # left as it was
        await saver.adelete_thread(old.thread)
        await alembic(store.engine, "downgrade", BEFORE)
        await alembic(store.engine, "upgrade", "head")
        await alembic(store.engine, "check")


async def test_listed_checkpoints_hold_items_of_their_own(store):
    saver = HiststoreSaver(store)
    chat = Chat(saver)
    await chat.grow(6)
    listed = [t async for t in saver.alist(chat.config())]
    firsts = [t.checkpoint["channel_values"]["messages"][0] for t in listed]
    assert all(f == {"role": "user", "content": "message 0"} for f in firsts)
    assert len({id(f) for f in firsts}) == len(firsts)
    firsts[0]["content"] = "changed"  # changes that checkpoint's value only
    assert [f["content"] for f in firsts[1:]] == ["message 0"] * 5
    got = await saver.aget_tuple(chat.config(chat.ids[-1]))
    assert got is not None
    assert got.checkpoint["channel_values"]["messages"] == chat.seen[-1]
