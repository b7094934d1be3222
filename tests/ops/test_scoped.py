"""SPEC 6: ownership. A scoped view never reads, changes or deletes what is not its user's.

Every public ``Store`` method is called through ``store.scoped("alice")`` on a conversation
owned by "bob" and on one owned by no one: the answer must be the one for a missing
conversation, and a full snapshot (state, lists, raw rows of every table) must not move.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from helpers import new_id, raw_rows, user_msgs
from sqlalchemy import update

import histstore
from histstore import Conversation, ConversationState, InvalidId, Message, NotFound, Summary
from histstore._storage import schema as _schema

Store = histstore.Store
ALICE = "alice"
MISSING = object()  # "raises NotFound"


async def make_old(store: Store, conversation: str) -> None:
    conv = _schema.conversations
    async with store.engine.begin() as conn:
        await conn.execute(
            update(conv)
            .where(conv.c.id == conversation)
            .values(updated_at=datetime.now(timezone.utc) - timedelta(days=3))
        )


async def fill(store: Store, c: str) -> None:
    """Give ``c`` something of every kind, through ``store`` (which decides the owner)."""
    await store.write(c, [Message.system("secret rules"), *user_msgs(3, "secret")])
    await store.write(c, [Message.assistant("secret answer")], idempotency_key="k1")
    await store.add_summary(c, Summary(0, 2, "secret summary"))
    await store.merge_metadata(c, {"topic": "tests", "n": 1})
    await store.list_append(c, "events", [{"e": 1}, b"\x01raw"])
    await histstore.SemanticIndex(store, _embed, model="m").update(c)
    value = await store.edit(c)  # an edited entry, an aside, a halt and a turn record
    value.push(histstore.Entry(Message.user("secret note"), author="editor"))
    value.add_aside("secret aside", after=value.entry_id(0))
    value.halt("secret halt")
    value.open_turn()
    await store.commit(value)


async def _embed(texts: list[str]) -> list[list[float]]:
    return [[1.0, float(len(t))] for t in texts]


async def snapshot(store: Store, c: str) -> Any:
    """Everything of ``c``, read through the unscoped store."""
    state = await store.load(c)
    return (
        state.user,
        state.system_prompt,
        [(m.position, m.created_at, m.to_dict()) for m in state.messages],
        state.summaries,
        state.metadata,
        state.created_at,
        state.updated_at,
        await store.list_load(c, "events"),
        await store.list_len(c, "events"),
        await raw_rows(store, c),
    )


@dataclass
class World:
    store: Store
    view: Store
    victim: str  # owned by bob, or by no one
    mine: str  # alice's own conversation
    fresh: str  # an id nobody uses


Call = Callable[[World], Awaitable[Any]]


async def _lease(view: Store, conversation: str) -> None:
    async with view.lease(conversation, wait=False):
        pass


async def _commit(view: Store, value: Conversation) -> int:
    value.push(Message.user("x"))
    return await view.commit(value)


async def _edit_and_commit(view: Store, conversation: str) -> int:
    return await _commit(view, await view.edit(conversation))


async def _streamed(messages: AsyncIterator[Message]) -> list[Message]:
    return [m async for m in messages]


async def _refreshed(view: Store, conversation: str) -> Conversation:
    value = Conversation(conversation)
    await view.refresh(value)
    return value


# name -> (call through alice's view, the answer a missing conversation gives)
CASES: dict[str, tuple[Call, Any]] = {
    "read": (lambda w: w.view.read(w.victim), []),
    "read-page": (lambda w: w.view.read(w.victim, start=1, stop=4, limit=2), []),
    "stream": (lambda w: _streamed(w.view.stream(w.victim)), []),
    "stream-page": (lambda w: _streamed(w.view.stream(w.victim, start=1, stop=4, page=1)), []),
    "count": (lambda w: w.view.count(w.victim), 0),
    "system_messages": (lambda w: w.view.system_messages(w.victim), []),
    "status": (lambda w: w.view.status(w.victim), "empty"),
    "lease": (lambda w: _lease(w.view, w.victim), MISSING),
    "exists": (lambda w: w.view.exists(w.victim), False),
    "write": (lambda w: w.view.write(w.victim, [Message.user("x")]), MISSING),
    "write-at-0": (lambda w: w.view.write(w.victim, [Message.user("x")], at=0), MISSING),
    "write-at-end": (lambda w: w.view.write(w.victim, [Message.user("x")], at=5), MISSING),
    # A retry that would only confirm stored messages must not reveal them either.
    "write-confirm": (
        lambda w: w.view.write(w.victim, [Message.system("secret rules")], at=0),
        MISSING,
    ),
    "write-key": (
        lambda w: w.view.write(w.victim, [Message.user("x")], idempotency_key="k2"),
        MISSING,
    ),
    "write-key-reused": (
        lambda w: w.view.write(
            w.victim, [Message.assistant("secret answer")], idempotency_key="k1"
        ),
        MISSING,
    ),
    "pop": (lambda w: w.view.pop(w.victim), None),
    "clear": (lambda w: w.view.clear(w.victim), None),
    "conversations": (lambda w: w.view.conversations(), [("mine",)]),
    "conversations-user": (lambda w: w.view.conversations(user="bob"), []),
    "conversations-metadata": (
        lambda w: w.view.conversations(metadata={"topic": "tests"}),
        [],
    ),
    "conversations-updated": (
        lambda w: w.view.conversations(order="updated", descending=True),
        [("mine",)],
    ),
    "load": (lambda w: w.view.load(w.victim), MISSING),
    "save": (
        lambda w: w.view.save(ConversationState(w.victim, messages=user_msgs(1), user="bob")),
        MISSING,
    ),
    "save-empty": (lambda w: w.view.save(ConversationState(w.victim)), MISSING),
    "fork-source": (lambda w: w.view.fork(w.victim, w.fresh), MISSING),
    "fork-source-upto": (lambda w: w.view.fork(w.victim, w.fresh, upto=1), MISSING),
    "fork-target": (lambda w: w.view.fork(w.mine, w.victim), MISSING),
    "add_summary": (lambda w: w.view.add_summary(w.victim, Summary(0, 0, "x")), MISSING),
    "summaries": (lambda w: w.view.summaries(w.victim), []),
    "metadata": (lambda w: w.view.metadata(w.victim), MISSING),
    "merge_metadata": (lambda w: w.view.merge_metadata(w.victim, {"topic": "x"}), MISSING),
    "merge_metadata-remove": (lambda w: w.view.merge_metadata(w.victim, {"topic": None}), MISSING),
    "merge_metadata-empty": (lambda w: w.view.merge_metadata(w.victim, {}), MISSING),
    "list_append": (lambda w: w.view.list_append(w.victim, "events", ["x"]), MISSING),
    "list_append-new-list": (lambda w: w.view.list_append(w.victim, "new", ["x"]), MISSING),
    "list_append-nothing": (lambda w: w.view.list_append(w.victim, "events", []), MISSING),
    "list_load": (lambda w: w.view.list_load(w.victim, "events"), MISSING),
    "list_load-unwritten": (lambda w: w.view.list_load(w.victim, "never"), MISSING),
    "list_len": (lambda w: w.view.list_len(w.victim, "events"), MISSING),
    "list_len-unwritten": (lambda w: w.view.list_len(w.victim, "never"), MISSING),
    "search": (lambda w: w.view.search("secret"), []),
    "search-conversation": (lambda w: w.view.search("secret", conversation=w.victim), []),
    "edit": (lambda w: w.view.edit(w.victim), Conversation()),
    "changes": (lambda w: w.view.changes(w.victim), []),
    "changes-since": (lambda w: w.view.changes(w.victim, since=1, limit=1), []),
    "commit": (lambda w: _commit(w.view, Conversation(w.victim)), MISSING),
    "commit-edited": (lambda w: _edit_and_commit(w.view, w.victim), MISSING),
    "refresh": (lambda w: _refreshed(w.view, w.victim), Conversation()),
    "revert": (lambda w: w.view.revert(w.victim, 0, by="alice"), MISSING),
    "revert-1": (lambda w: w.view.revert(w.victim, 1, by="alice"), MISSING),
    "newest_by": (lambda w: w.view.newest_by(w.victim, "editor"), None),
    "purge": (lambda w: w.view.purge(idle_for=timedelta(hours=1)), 0),
    "purge-all": (lambda w: w.view.purge(idle_for=timedelta(0)), 1),  # alice's own only
}

PUBLIC_METHODS = {
    "read", "stream", "count", "write", "pop", "clear", "conversations", "exists", "load", "save",
    "fork", "add_summary", "summaries", "metadata", "merge_metadata", "list_append",
    "list_load", "list_len", "purge", "system_messages", "status", "lease", "search",
    "edit", "changes", "commit", "refresh", "revert", "newest_by",
}  # fmt: skip


def test_cases_cover_every_public_method() -> None:
    covered = {name.split("-")[0] for name in CASES}
    assert covered == PUBLIC_METHODS
    coroutines = {
        n
        for n in dir(Store)
        if not n.startswith("_")
        and callable(getattr(Store, n))
        # ``diagnostics`` reads the store's own objects, never a conversation.
        and n not in ("close", "scoped", "diagnostics")
    }
    assert coroutines <= PUBLIC_METHODS, coroutines - PUBLIC_METHODS


@pytest.mark.parametrize("owner", ["bob", None], ids=["bob", "unowned"])
@pytest.mark.parametrize("case", list(CASES))
async def test_view_cannot_touch_others(store: Store, owner: str | None, case: str) -> None:
    victim, mine, fresh = new_id(), new_id(), new_id()
    await fill(store.scoped(owner) if owner else store, victim)
    await make_old(store, victim)  # so a purge would take it if it could
    view = store.scoped(ALICE)
    await view.write(mine, user_msgs(2, "alice"))
    before, mine_before = await snapshot(store, victim), await snapshot(store, mine)

    call, expected = CASES[case]
    world = World(store, view, victim, mine, fresh)
    if expected is MISSING:
        with pytest.raises(NotFound) as info:
            await call(world)
        assert "secret" not in str(info.value)
    else:
        result = await call(world)
        if isinstance(expected, list) and expected and expected[0] == ("mine",):
            expected = [mine]
        assert result == expected

    assert await snapshot(store, victim) == before
    if case != "purge-all":
        assert await snapshot(store, mine) == mine_before
    assert not await store.exists(fresh)
    assert all(rows == [] for rows in (await raw_rows(store, fresh)).values())


@pytest.mark.parametrize("owner", ["bob", None], ids=["bob", "unowned"])
async def test_view_answers_as_for_an_unknown_id(store: Store, owner: str | None) -> None:
    """Whatever the view says about another's conversation, it says about an unused id."""
    victim, unknown, mine = new_id(), new_id(), new_id()
    await fill(store.scoped(owner) if owner else store, victim)
    view = store.scoped(ALICE)
    await view.write(mine, user_msgs(1))
    for c in (victim, unknown):
        assert await view.read(c) == []
        assert [m async for m in view.stream(c)] == []
        assert await view.count(c) == 0
        assert not await view.exists(c)
        assert await view.summaries(c) == []
        assert await view.pop(c) is None
        for fn in (view.load, view.metadata):
            with pytest.raises(NotFound):
                await fn(c)
        with pytest.raises(NotFound):
            await view.list_len(c, "events")
        with pytest.raises(NotFound):
            await view.fork(c, new_id())
    assert await store.exists(victim)


CREATORS: dict[str, Callable[[Store, str], Awaitable[Any]]] = {
    "write": lambda v, c: v.write(c, [Message.user("hi")]),
    "write-at-0": lambda v, c: v.write(c, [Message.user("hi")], at=0),
    "write-key": lambda v, c: v.write(c, [Message.user("hi")], idempotency_key="k"),
    "merge_metadata": lambda v, c: v.merge_metadata(c, {"a": 1}),
    "list_append": lambda v, c: v.list_append(c, "l", [1]),
    "add_summary": lambda v, c: v.add_summary(c, Summary(0, 0, "s")),
    "save": lambda v, c: v.save(ConversationState(c, user="mallory", messages=user_msgs(1))),
    "save-unowned": lambda v, c: v.save(ConversationState(c, user=None)),
}


@pytest.mark.parametrize("how", [*CREATORS, "fork"])
async def test_created_through_view_is_owned_by_user(store: Store, how: str) -> None:
    view = store.scoped(ALICE)
    c = new_id()
    if how == "fork":
        src = new_id()
        await view.write(src, user_msgs(2))
        await view.fork(src, c)
    else:
        await CREATORS[how](view, c)
    assert (await store.load(c)).user == ALICE
    assert (await view.load(c)).user == ALICE
    assert await view.exists(c)
    assert c in await view.conversations()
    assert await store.conversations(user=ALICE) == await view.conversations()
    other = store.scoped("bob")
    assert not await other.exists(c)
    assert await other.conversations() == []


async def test_save_through_view_keeps_view_owner(store: Store) -> None:
    view = store.scoped(ALICE)
    c = new_id()
    await view.write(c, user_msgs(1))
    await view.save(ConversationState(c, user="bob", messages=user_msgs(2), metadata={"a": 1}))
    state = await view.load(c)
    assert state.user == ALICE
    assert [m.to_dict() for m in state.messages] == user_msgs(2)
    assert not await store.scoped("bob").exists(c)


async def test_view_lists_only_its_users(store: Store) -> None:
    alice, bob = store.scoped(ALICE), store.scoped("bob")
    mine = sorted(new_id("a") for _ in range(4))
    theirs = [new_id("b") for _ in range(3)]
    nobodys = [new_id("n") for _ in range(2)]
    for c in mine:
        await alice.merge_metadata(c, {"kind": "x"})
    for c in theirs:
        await bob.merge_metadata(c, {"kind": "x"})
    for c in nobodys:
        await store.merge_metadata(c, {"kind": "x"})
    assert await alice.conversations() == mine
    assert await alice.conversations(user=ALICE) == mine
    assert await alice.conversations(user="bob") == []
    assert await alice.conversations(metadata={"kind": "x"}) == mine
    assert await alice.conversations(limit=2, offset=1) == mine[1:3]
    assert await alice.conversations(descending=True) == mine[::-1]
    assert sorted(await alice.conversations(order="created")) == mine
    assert await bob.conversations() == sorted(theirs)
    assert await store.conversations() == sorted([*mine, *theirs, *nobodys])


async def test_purge_through_view_deletes_only_users(store: Store) -> None:
    alice, bob = store.scoped(ALICE), store.scoped("bob")
    mine, theirs, nobodys = new_id(), new_id(), new_id()
    await fill(alice, mine)
    await fill(bob, theirs)
    await fill(store, nobodys)
    for c in (mine, theirs, nobodys):
        await make_old(store, c)
    before = {c: await snapshot(store, c) for c in (theirs, nobodys)}
    assert await alice.purge(idle_for=timedelta(hours=1)) == 1
    assert not await store.exists(mine)
    assert all(rows == [] for rows in (await raw_rows(store, mine)).values())
    for c, snap in before.items():
        assert await snapshot(store, c) == snap
    assert await bob.purge(idle_for=timedelta(hours=1)) == 1
    assert await store.conversations() == [nobodys]


async def test_view_works_on_its_own_conversations(store: Store) -> None:
    view = store.scoped(ALICE)
    c, branch = new_id(), new_id()
    await fill(view, c)
    assert await view.count(c) == 6  # with the edited-in entry
    assert [m.content for m in await view.read(c, limit=2)] == ["secret answer", "secret note"]
    found = await view.newest_by(c, "editor")
    assert found is not None
    assert found.content == "secret note"
    value = await view.edit(c)
    assert value.halted == "secret halt"
    assert len(value.turns()) == 1
    assert histstore.Conversation.fold(await view.changes(c)) == value
    revision = await view.revert(c, 2, by=ALICE)
    assert await view.count(c) == 5
    assert (await view.edit(c)).revision == revision
    await view.revert(c, revision - 1, by=ALICE)
    assert await view.summaries(c) == await store.summaries(c)
    assert await view.metadata(c) == {"topic": "tests", "n": 1}
    assert await view.list_load(c, "events") == [{"e": 1}, b"\x01raw"]
    assert await view.list_len(c, "events") == 2
    await view.fork(c, branch, upto=2)
    assert await view.count(branch) == 2
    assert (await view.pop(branch)) == Message.user("secret-0")
    await view.clear(branch)
    assert not await store.exists(branch)
    await view.save(ConversationState(c, messages=user_msgs(1)))
    assert await view.count(c) == 1


async def test_one_id_two_users(store: Store) -> None:
    """An id taken by alice cannot be created, read or probed by bob."""
    alice, bob = store.scoped(ALICE), store.scoped("bob")
    c = new_id()
    await alice.write(c, [Message.user("alice's")])
    with pytest.raises(NotFound):
        await bob.write(c, [Message.user("bob's")])
    with pytest.raises(NotFound):
        await bob.save(ConversationState(c))
    assert await bob.read(c) == []
    assert [m.content for m in await alice.read(c)] == ["alice's"]


async def test_scoped_arguments(store: Store) -> None:
    view = store.scoped(ALICE)
    assert view.user == ALICE
    assert store.user is None
    assert view.scoped(ALICE).user == ALICE
    with pytest.raises(ValueError, match="scoped"):
        view.scoped("bob")
    for bad in ("", " alice", "a\x00", 3):
        with pytest.raises(InvalidId):
            store.scoped(bad)  # type: ignore[arg-type]
