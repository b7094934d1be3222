"""Editable history in a store (SPEC 11, "Changes and revisions", "Saving"): entry ids and
authors on read, edit/commit/refresh/changes/revert, plain writes and pops as change
records, asides, halts and turn records kept, scoped views. Every backend."""

from __future__ import annotations

import asyncio
import json
import random
import sys
from dataclasses import replace
from typing import Any

import pytest
from faults import Faults
from helpers import PYTHON, subprocess_env

import histstore
from histstore import ConflictError, Conversation, Entry, InvalidMessage, Message, NotFound, Store


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def bot(text: str) -> dict[str, Any]:
    return {"role": "assistant", "content": text}


async def contents(store: Store, cid: str) -> list[Any]:
    return [m.content for m in await store.read(cid)]


async def ids(store: Store, cid: str) -> list[int | None]:
    return [m.entry_id for m in await store.read(cid)]


async def folds(store: Store, cid: str) -> Conversation:
    """The value the change log folds to; checks it equals ``edit`` and the reads."""
    log = await store.changes(cid)
    folded = Conversation.fold(log)
    value = await store.edit(cid)
    assert folded == value
    assert value.revision == len(log) == (log[-1].revision if log else 0)
    assert [c.revision for c in log] == list(range(1, len(log) + 1))
    stored = await store.read(cid)
    assert value.messages == stored
    assert [e.entry_id for e in value.entries] == [m.entry_id for m in stored]
    assert [e.author for e in value.entries] == [m.author for m in stored]
    return value


async def test_read_carries_entry_ids_and_authors(store: Store, cid: str) -> None:
    await store.write(cid, [user("a"), bot("b")])
    await store.write(cid, [user("c")])
    got = await store.read(cid)
    assert [m.entry_id for m in got] == [1, 2, 3]
    assert [m.author for m in got] == [None, None, None]
    assert [m.entry_id for m in await store.read(cid, limit=1)] == [3]
    log = await store.changes(cid)
    assert [(c.kind, c.revision, len(c.added)) for c in log] == [("write", 1, 2), ("write", 2, 1)]
    assert all(c.at is not None and c.at.tzinfo is not None for c in log)
    assert log[0].added[0].message == Message.from_dict(user("a"))
    await folds(store, cid)


async def test_a_write_that_stores_nothing_is_no_change(store: Store, cid: str) -> None:
    await store.write(cid, [])
    await store.write(cid, [user("a")])
    await store.write(cid, [], idempotency_key="empty")
    await store.write(cid, [user("a")], at=0)  # confirms, stores nothing
    await store.write(cid, [user("a")], at=0, idempotency_key="k")
    assert [c.revision for c in await store.changes(cid)] == [1]
    await folds(store, cid)


async def test_edit_of_an_unknown_conversation_is_empty_and_creates_nothing(
    store: Store, cid: str
) -> None:
    value = await store.edit(cid)
    assert value.revision == 0
    assert value.entries == []
    assert value.conversation_id == cid
    assert not await store.exists(cid)
    assert await store.changes(cid) == []


async def test_commit_a_splice(store: Store, cid: str) -> None:
    await store.write(cid, [user("q1"), bot("a1"), user("q2"), bot("a2")])
    value = await store.edit(cid)
    assert value.revision == 1
    spliced = value.splice(0, 2, [user("summary")], by="plugin:compact")
    assert spliced.removed == [1, 2]
    assert spliced.added == [5]
    assert await store.commit(value) == 2
    assert value.revision == 2
    assert value.unsaved == ()
    got = await store.read(cid)
    assert [m.content for m in got] == ["summary", "q2", "a2"]
    assert [m.position for m in got] == [0, 1, 2]
    assert [m.entry_id for m in got] == [5, 3, 4]
    assert [m.author for m in got] == ["plugin:compact", None, None]
    assert got[0].created_at is not None
    assert await store.count(cid) == 3
    log = await store.changes(cid)
    assert [c.kind for c in log] == ["write", "splice"]
    assert log[1].author == "plugin:compact"
    assert [e.entry_id for e in log[1].removed] == [1, 2]
    assert [e.entry_id for e in log[1].added] == [5]
    await folds(store, cid)
    # The value goes on being edited after a commit.
    value.push(user("q3"))
    assert await store.commit(value) == 3
    assert await contents(store, cid) == ["summary", "q2", "a2", "q3"]
    await folds(store, cid)


async def test_edit_in_the_middle_keeps_the_rest_in_place(store: Store, cid: str) -> None:
    await store.write(cid, [user(f"m{i}") for i in range(6)])
    value = await store.edit(cid)
    changed = value.edit_each(
        lambda e: user("M2") if e.message.content == "m2" else None, by="moderator"
    )
    assert changed == [3]
    await store.commit(value)
    assert await contents(store, cid) == ["m0", "m1", "M2", "m3", "m4", "m5"]
    assert await ids(store, cid) == [1, 2, 3, 4, 5, 6]
    await folds(store, cid)
    found = await store.search("M2", conversation=cid)
    assert [h.position for h in found] == [2]
    assert await store.search("m2", conversation=cid) == found  # case-folded, one hit


async def test_a_write_in_between_makes_commit_conflict(store: Store, cid: str) -> None:
    await store.write(cid, [user("a")])
    value = await store.edit(cid)
    value.push(bot("b"))
    await store.write(cid, [user("other")])
    with pytest.raises(ConflictError):
        await store.commit(value)
    assert len(value.unsaved) == 1
    assert value.revision == 1
    assert await contents(store, cid) == ["a", "other"]
    with pytest.raises(ConflictError):
        await store.refresh(value)
    value.discard()
    await store.refresh(value)
    assert value.revision == 2
    assert [m.content for m in value.messages] == ["a", "other"]
    value.push(bot("b"))
    assert await store.commit(value) == 3
    await folds(store, cid)


async def test_a_pop_in_between_makes_commit_conflict(store: Store, cid: str) -> None:
    await store.write(cid, [user("a"), bot("b")])
    value = await store.edit(cid)
    value.splice(0, 1, [user("A")], by="x")
    assert (await store.pop(cid)) == Message.from_dict(bot("b"))
    with pytest.raises(ConflictError):
        await store.commit(value)
    assert await contents(store, cid) == ["a"]


async def test_commit_of_a_new_conversation(store: Store, cid: str) -> None:
    value = Conversation(cid)
    value.extend([user("hi"), bot("hello")])
    assert await store.commit(value) == 1
    assert await contents(store, cid) == ["hi", "hello"]
    other = Conversation(cid)
    other.push(user("late"))
    with pytest.raises(ConflictError):
        await store.commit(other)
    assert await contents(store, cid) == ["hi", "hello"]
    await folds(store, cid)


async def test_pop_is_a_change_and_ids_are_never_given_again(store: Store, cid: str) -> None:
    await store.write(cid, [user("a"), bot("b")])
    value = await store.edit(cid)
    aside = value.add_aside({"note": 1}, after=2)
    await store.commit(value)
    popped = await store.pop(cid)
    assert popped is not None
    assert popped.entry_id == 2
    assert popped.position == 1
    log = await store.changes(cid)
    assert log[-1].kind == "pop"
    assert [e.entry_id for e in log[-1].removed] == [2]
    assert log[-1].moved == ((aside, 2, 1),)
    value = await folds(store, cid)
    assert value.asides()[0].after == 1  # follows the entry before the popped one
    await store.write(cid, [bot("c")])
    assert await ids(store, cid) == [1, 3]
    await folds(store, cid)


async def test_revert_brings_back_ids_authors_and_times(store: Store, cid: str) -> None:
    await store.write(cid, [user("q1"), bot("a1"), user("q2"), bot("a2")])
    before = await store.read(cid)
    value = await store.edit(cid)
    value.splice(0, 3, [user("summary")], by="plugin:compact")
    await store.commit(value)
    await store.write(cid, [user("q3")])
    assert await store.revert(cid, 1, by="user:undo") == 4
    got = await store.read(cid)
    assert got == before
    assert [m.entry_id for m in got] == [m.entry_id for m in before]
    assert [m.created_at for m in got] == [m.created_at for m in before]
    log = await store.changes(cid)
    assert log[-1].kind == "revert"
    assert log[-1].author == "user:undo"
    await folds(store, cid)
    # A revert can be reverted; reverting to the current revision changes nothing.
    assert await store.revert(cid, 3, by="user:redo") == 5
    assert await contents(store, cid) == ["summary", "a2", "q3"]
    assert await store.revert(cid, 5, by="x") == 5
    assert await store.revert(cid, 0, by="x") == 6
    assert await store.read(cid) == []
    await folds(store, cid)


AWKWARD: list[dict[str, Any]] = [
    user('},{"id":7,"message":{"role":"user"}}],"start":1'),
    {"role": "assistant", "content": [{"id": 1, "message": "x"}, {"id": 2, "text": "]}"}]},
    {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function"}]},
    {"role": "tool", "tool_call_id": "c1", "content": 'é 中文 \u2028 \\ " \n'},
]


async def test_reverts_give_back_messages_that_look_like_their_records(
    store: Store, cid: str
) -> None:
    """A revert reads the entries a change removed from its record (their messages kept
    as text until they are needed): whatever the messages hold, they come back as they
    were, with their ids, authors and times."""
    await store.write(cid, AWKWARD)
    value = await store.edit(cid)
    value.splice(1, 2, [Entry(user("in between"), author='plugin:"q"')], by="plugin:x")
    await store.commit(value)
    after_edit = await store.read(cid)
    await store.write(cid, AWKWARD[::-1])
    assert await store.revert(cid, 1, by="undo") == 4
    assert [m.to_dict() for m in await store.read(cid)] == AWKWARD
    assert await store.revert(cid, 2, by="redo") == 5
    got = await store.read(cid)
    assert got == after_edit
    assert [(m.entry_id, m.author, m.created_at) for m in got] == [
        (m.entry_id, m.author, m.created_at) for m in after_edit
    ]
    assert await store.revert(cid, 3, by="redo") == 6
    assert [m.to_dict() for m in await store.read(cid)][-4:] == AWKWARD[::-1]
    await folds(store, cid)


async def test_a_value_is_not_kept_once_its_caller_lets_go(store: Store, cid: str) -> None:
    """What a call returned (here a conversation's whole value) is the caller's alone:
    nothing of the store's, on its event loop or a connection's thread, still holds it."""
    await store.write(cid, [user("a"), bot("b")])
    value = await store.edit(cid)
    await asyncio.sleep(0)  # the loop's own callbacks for the call have run
    assert sys.getrefcount(value) == 2  # ``value`` and the argument


async def test_revert_of_bad_revisions(store: Store, cid: str) -> None:
    with pytest.raises(NotFound):
        await store.revert(cid, 0, by="x")
    await store.write(cid, [user("a")])
    for bad in (-1, 2):
        with pytest.raises(NotFound):
            await store.revert(cid, bad, by="x")
    for by in ("", None, 3):
        with pytest.raises(InvalidMessage):
            await store.revert(cid, 0, by=by)  # type: ignore[arg-type]
    assert await store.changes(cid) != []
    assert (await store.edit(cid)).revision == 1


async def test_asides_halt_and_turn_records_are_kept(store: Store, cid: str) -> None:
    value = Conversation(cid)
    first = value.push(user("question"))
    value.open_turn()
    note = value.add_aside({"shown": "to the user only"}, after=first)
    assert value.halt("user pressed stop")
    value.end_turn("halted", usage={"input": 100, "cache_read": 20, "output": 5})
    await store.commit(value)
    loaded = await store.edit(cid)
    assert loaded == value
    assert loaded.halted == "user pressed stop"
    assert not loaded.awaits_model
    assert [(a.aside_id, a.after, a.value) for a in loaded.asides()] == [
        (note, first, {"shown": "to the user only"})
    ]
    (turn,) = loaded.turns()
    assert (turn.number, turn.start, turn.end) == (1, first, "halted")
    assert turn.opened_at is not None
    assert turn.ended_at is not None
    assert loaded.context_used() == 120
    assert loaded.request_view() == [Message.from_dict(user("question"))]
    await folds(store, cid)
    # A plain write clears the halt.
    await store.write(cid, [bot("answer")])
    assert (await folds(store, cid)).halted is None
    loaded = await store.edit(cid)
    loaded.replace_aside(note, "changed")
    loaded.open_turn()
    await store.commit(loaded)
    again = await store.edit(cid)
    assert [a.value for a in again.asides()] == ["changed"]
    assert len(again.turns()) == 2
    again.remove_aside(note)
    await store.commit(again)
    assert (await folds(store, cid)).asides() == []


async def test_save_fork_and_clear_keep_the_log_whole(store: Store, cid: str) -> None:
    await store.write(cid, [user("a"), bot("b")])
    state = await store.load(cid)
    await store.save(
        histstore.ConversationState(cid, messages=[*state.messages, Message.user("c")])
    )
    log = await store.changes(cid)
    assert [c.kind for c in log] == ["write", "save"]
    assert len(log[1].removed) == 2
    assert len(log[1].added) == 3
    assert await ids(store, cid) == [3, 4, 5]
    await folds(store, cid)
    await store.write(cid, [user("retry")], idempotency_key="k")
    target = cid + "-fork"
    await store.fork(cid, target, upto=2)
    assert [c.kind for c in await store.changes(target)] == ["fork"]
    assert await ids(store, target) == [3, 4]
    await folds(store, target)
    await store.clear(cid)
    assert await store.changes(cid) == []
    assert (await store.edit(cid)).revision == 0
    await store.write(cid, [user("again")])
    assert await ids(store, cid) == [1]  # a conversation made again starts over


async def test_changes_since_and_limit(store: Store, cid: str) -> None:
    for i in range(5):
        await store.write(cid, [user(f"m{i}")])
    assert [c.revision for c in await store.changes(cid, since=2)] == [3, 4, 5]
    assert [c.revision for c in await store.changes(cid, since=1, limit=2)] == [2, 3]
    assert await store.changes(cid, since=5) == []
    with pytest.raises(InvalidMessage):
        await store.changes(cid, since=-1)
    with pytest.raises(InvalidMessage):
        await store.changes(cid, limit=-1)
    with pytest.raises(TypeError):
        await store.changes(cid, since="1")  # type: ignore[arg-type]


async def test_a_commit_that_fails_writes_nothing(store: Store, cid: str) -> None:
    small = await histstore.connect(store.engine, max_message_bytes=100)
    try:
        await small.write(cid, [user("a")])
        value = await small.edit(cid)
        value.push(user("x" * 200))
        with pytest.raises(InvalidMessage):
            await small.commit(value)
        assert len(value.unsaved) == 1
        assert await contents(small, cid) == ["a"]
        with pytest.raises(InvalidMessage):
            value.splice(0, 1, [user("b")], by="")
        with pytest.raises(TypeError):
            await small.commit("not a value")  # type: ignore[arg-type]
        with pytest.raises(InvalidMessage):
            await small.commit(Conversation())
    finally:
        await small.close()


async def test_a_commit_that_fails_half_way_leaves_everything_as_it_was(
    store: Store, cid: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The entries go in, then the change record fails: the store and the value's
    outbox are as they were, and the same value commits afterwards."""
    await store.write(cid, [user("a"), bot("b"), user("c")])
    value = await store.edit(cid)
    value.splice(0, 2, [user("summary")], by="x")
    value.add_aside("note", after=value.entry_id(0))
    faults = Faults(monkeypatch)
    faults.fail_insert_into = "histstore_changes"
    with pytest.raises(histstore.HistStoreError):
        await store.commit(value)
    faults.fail_insert_into = None
    assert await contents(store, cid) == ["a", "b", "c"]
    assert (await store.edit(cid)).asides() == []
    assert len(value.unsaved) == 2
    assert value.revision == 1
    assert await store.search("summary", conversation=cid) == []
    assert await store.commit(value) == 3
    assert await contents(store, cid) == ["summary", "c"]
    await folds(store, cid)


async def test_scoped_views(store: Store, cid: str) -> None:
    alice, bob = store.scoped("alice"), store.scoped("bob")
    await alice.write(cid, [user("mine")])
    assert (await alice.edit(cid)).revision == 1
    foreign = await bob.edit(cid)
    assert foreign.revision == 0
    assert foreign.entries == []
    assert await bob.changes(cid) == []
    assert await bob.newest_by(cid, "x") is None
    with pytest.raises(NotFound):
        await bob.revert(cid, 0, by="bob")
    foreign.push(user("intrusion"))
    with pytest.raises(NotFound):
        await bob.commit(foreign)
    value = await alice.edit(cid)
    value.splice(0, 1, [user("edited")], by="alice")
    await alice.commit(value)
    assert await contents(store, cid) == ["edited"]
    assert (await store.load(cid)).user == "alice"
    fresh = Conversation(cid + "-b")
    fresh.push(user("new"))
    await bob.commit(fresh)
    assert (await store.load(cid + "-b")).user == "bob"


async def test_newest_by(store: Store, cid: str) -> None:
    await store.write(cid, [user("a"), bot("b")])
    assert await store.newest_by(cid, "plugin:compact") is None
    value = await store.edit(cid)
    value.splice(0, 0, [user("s1")], by="plugin:compact")
    value.push(user("c"))
    value.splice(3, 3, [user("s2")], by="plugin:compact")
    await store.commit(value)
    found = await store.newest_by(cid, "plugin:compact")
    assert found is not None
    assert found.content == "s2"
    assert found.position == 3
    assert found.author == "plugin:compact"


async def test_concurrent_writes_commits_and_pops_never_lose_an_entry(
    shared_backend: Any, cid: str
) -> None:
    async with shared_backend.connect() as store:
        await store.write(cid, [user("seed")])
        written: list[str] = []
        popped: list[str] = []

        async def writer(i: int) -> None:
            for j in range(6):
                text = f"w{i}-{j}"
                await store.write(cid, [user(text)])
                written.append(text)

        async def editor(i: int) -> None:
            for j in range(4):
                while True:
                    value = await store.edit(cid)
                    text = f"e{i}-{j}"
                    value.push(Entry(bot(text), author=f"editor{i}"))
                    try:
                        await store.commit(value)
                    except ConflictError:
                        await asyncio.sleep(0)
                        continue
                    written.append(text)
                    break

        async def popper() -> None:
            for _ in range(5):
                m = await store.pop(cid)
                if m is not None:
                    popped.append(m.content)
                await asyncio.sleep(0)

        await asyncio.gather(
            *(writer(i) for i in range(3)), *(editor(i) for i in range(2)), popper()
        )
        value = await folds(store, cid)
        held = [m.content for m in value.messages]
        assert sorted(held + popped) == sorted(["seed", *written])
        entry_ids = [e.entry_id for e in value.entries]
        assert len(set(entry_ids)) == len(entry_ids)


# A child process: writes, commits edits (retrying on conflict) and pops on one
# conversation, and prints what it stored and what it popped.
EDITOR = """
import asyncio, json, sys
import histstore

url, conversation, proc = sys.argv[1], sys.argv[2], int(sys.argv[3])

async def main():
    stored, popped = [], []
    async with histstore.connect(url) as store:
        async def writer(t):
            for j in range(5):
                text = f"p{proc}-w{t}-{j}"
                await store.write(conversation, [{"role": "user", "content": text}])
                stored.append(text)

        async def editor(t):
            for j in range(3):
                text = f"p{proc}-e{t}-{j}"
                while True:
                    value = await store.edit(conversation)
                    value.push(histstore.Entry({"role": "assistant", "content": text}, author="ed"))
                    if len(value.entries) > 3:
                        value.edit_each(
                            lambda e: {**e.message.to_dict(), "seen": True}
                            if e.entry_id == value.entry_id(1) else None,
                            by="ed",
                        )
                    try:
                        await store.commit(value)
                        break
                    except histstore.ConflictError:
                        await asyncio.sleep(0.001)
                stored.append(text)

        async def popper():
            for _ in range(3):
                m = await store.pop(conversation)
                if m is not None:
                    popped.append(m.content)

        await asyncio.gather(writer(0), writer(1), editor(0), popper())
    print(json.dumps([stored, popped]))

asyncio.run(main())
"""


async def test_processes_write_commit_and_pop_one_conversation(
    shared_backend: Any, cid: str
) -> None:
    async with shared_backend.connect() as store:
        await store.write(cid, [user("seed")])
    procs = [
        await asyncio.create_subprocess_exec(
            PYTHON,
            "-c",
            EDITOR,
            shared_backend.url,
            cid,
            str(p),
            env=subprocess_env(),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        for p in range(3)
    ]
    stored, popped = ["seed"], []
    for proc in procs:
        out, err = await asyncio.wait_for(proc.communicate(), timeout=180)
        assert proc.returncode == 0, err.decode(errors="replace")
        got = json.loads(out)
        stored.extend(got[0])
        popped.extend(got[1])
    async with shared_backend.connect() as store:
        value = await folds(store, cid)
    held = [m.content for m in value.messages]
    assert sorted(held + popped) == sorted(stored)  # nothing lost, nothing twice
    entry_ids = [e.entry_id for e in value.entries]
    assert len(set(entry_ids)) == len(entry_ids)


async def test_random_histories_fold_to_the_stored_value(store: Store, cid: str) -> None:
    """Any mix of writes, pops, commits of edits and reverts: the log folds to the
    stored value, and the reads show it."""
    rnd = random.Random(20261201)
    kinds = ["write", "write", "pop", "splice", "restore", "aside", "revert"]
    for step in range(60):
        await random_edit(store, cid, rnd, step, kinds, reach=None)
        await folds(store, cid)


async def random_edit(
    store: Store,
    cid: str,
    rnd: random.Random,
    step: int,
    kinds: list[str],
    reach: int | None,
    near: int | None = None,
) -> None:
    """One of ``kinds``: a write, pop, splice, restore, aside, halt or resume, turn
    record, or a revert to one of the last ``reach`` revisions (any: ``None``); edits
    among the last ``near`` entries (anywhere: ``None``)."""
    action = rnd.choice(kinds)
    if action == "write":
        await store.write(cid, [user(f"s{step}-{k}") for k in range(rnd.randint(1, 3))])
    elif action == "pop":
        await store.pop(cid)
    elif action == "revert":
        top = (await store.edit(cid)).revision
        low = 0 if reach is None else max(top - reach, 0)
        await store.revert(cid, rnd.randint(low, top), by="undo")
    else:
        value = await store.edit(cid)
        n = len(value.entries)
        a = rnd.randint(0 if near is None else max(n - near, 0), n)
        b = rnd.randint(a, n)
        if action == "splice":
            value.splice(a, b, [bot(f"x{step}")] * rnd.randint(0, 2), by="ed")
        elif action == "restore":
            value.restore(a, b, value.entries[a:b][::-1], by="ed")
        elif action == "halt":
            value.halt(f"h{step}") if value.halted is None else value.resume()
        elif action == "turn":
            if value.turns() and value.turns()[-1].end is None:
                value.end_turn("completed")
            else:
                value.open_turn()
        elif n:
            value.add_aside(step, after=value.entry_id(rnd.randrange(n)))
        await store.commit(value)


async def random_edits(
    store: Store, cid: str, rnd: random.Random, steps: int, near: int | None = None
) -> None:
    """``steps`` edits of every kind, reverts to one of the last 4 revisions, edits
    among the last ``near`` entries (anywhere: ``None``)."""
    kinds = ["write", "write", "pop", "splice", "restore", "aside", "halt", "turn", "revert"]
    for step in range(steps):
        await random_edit(store, cid, rnd, step, kinds, reach=4, near=near)


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_paged_change_reads_equal_the_whole_log(store: Store, cid: str, seed: int) -> None:
    """``changes(since=, limit=)`` reads only the records after ``since`` (and the
    entries they touched): every page equals that part of the whole log, which is
    rebuilt from every entry and checked to build them."""
    rnd = random.Random(seed)
    await random_edits(store, cid, rnd, 40)
    whole = await store.changes(cid)
    top = len(whole)
    for since in range(top + 2):
        for limit in (None, 0, 1, 3):
            if since == 0 and limit is None:
                continue
            end = None if limit is None else since + limit
            assert await store.changes(cid, since=since, limit=limit) == whole[since:end]


@pytest.mark.parametrize(("seed", "near"), [(1, None), (7, 3), (8, 3), (9, 1)])
async def test_oldest_pages_equal_the_start_of_the_whole_log(
    store: Store, cid: str, seed: int, near: int | None
) -> None:
    """``changes(limit=)`` (no ``since``: the oldest page, ``histstore log --limit``)
    reads the records up to ``limit`` and the entries they left, unless a later record
    touched one of those: every size of page equals the start of the whole log, for
    histories edited anywhere and near their end."""
    rnd = random.Random(seed)
    await random_edits(store, cid, rnd, 40, near=near)
    whole = await store.changes(cid)
    for limit in range(len(whole) + 2):
        assert await store.changes(cid, limit=limit) == whole[:limit]


@pytest.mark.parametrize("seed", [4, 5, 6])
async def test_a_revert_reading_only_recent_records_records_what_the_whole_log_says(
    store: Store, cid: str, seed: int
) -> None:
    """A revert reads the records after its target and the entries they touched; what it
    records is the change ``Conversation.revert_to`` makes of the value and the fold of
    the whole log up to the target, and the log still folds to the stored value."""
    rnd = random.Random(seed)
    for _ in range(12):
        await random_edits(store, cid, rnd, 5)
        whole = await store.changes(cid)
        top = len(whole)
        target = rnd.randint(max(top - 6, 0), top)
        expected = await store.edit(cid)
        changed = expected.revert_to(Conversation.fold(whole[:target]), by="undo")
        revision = await store.revert(cid, target, by="undo")
        value = await folds(store, cid)
        if not changed:
            assert revision == top
            continue
        (made,) = expected.unsaved
        (stored,) = await store.changes(cid, since=top)
        assert replace(stored, at=None, revision=None) == made
        assert value.entries == expected.entries
        assert value.asides() == expected.asides()
        assert value.halted == expected.halted
