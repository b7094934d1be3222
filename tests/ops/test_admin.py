"""``histstore.admin``: figures, particulars and listings, with a view's scope, on every backend."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from helpers import new_id
from sqlalchemy import update
from waiting import clock_tick

import histstore
from histstore import InvalidId, InvalidMessage, Message, NotFound, Summary, admin
from histstore._storage import schema as _schema


async def _fill(store: histstore.Store) -> dict[str, str]:
    ids = {"a1": new_id("a1"), "a2": new_id("a2"), "b1": new_id("b1"), "none": new_id("n")}
    alice, bob = store.scoped("alice"), store.scoped("bob")
    await alice.write(ids["a1"], [Message.user("hi"), Message.assistant("hello")])
    await alice.add_summary(ids["a1"], Summary(0, 1, "greeting"))
    await alice.merge_metadata(ids["a1"], {"team": "blue", "n": 1})
    await alice.list_append(ids["a1"], "steps", [1, 2, 3])
    await alice.merge_metadata(ids["a2"], {"team": "red"})
    await bob.write(ids["b1"], [Message.user("x")] * 3)
    await bob.merge_metadata(ids["b1"], {"team": "blue", "n": 1.5})
    await store.write(ids["none"], [Message.user("y")])
    return ids


async def test_stats_counts_what_the_store_or_view_sees(store: histstore.Store) -> None:
    ids = await _fill(store)
    whole = await admin.stats(store)
    assert (whole.conversations, whole.messages, whole.longest, whole.users) == (4, 6, 3, 2)
    assert (whole.summaries, whole.metadata_entries, whole.lists, whole.list_items) == (1, 5, 1, 3)
    assert whole.write_records == 3
    assert whole.schema_revision is not None
    assert whole.first_created is not None
    assert whole.newest_change is not None
    assert whole.oldest_change is not None
    assert whole.oldest_change <= whole.newest_change
    alice = await admin.stats(store.scoped("alice"))
    assert (alice.conversations, alice.messages, alice.users, alice.user) == (2, 2, 1, "alice")
    assert (alice.summaries, alice.metadata_entries, alice.list_items) == (1, 3, 3)
    assert alice.as_dict()["conversations"] == 2
    assert isinstance(alice.as_dict()["newest_change"], str)
    nobody = await admin.stats(store.scoped("nobody"))
    assert (nobody.conversations, nobody.messages, nobody.first_created) == (0, 0, None)
    del ids


async def test_describe_respects_ownership(store: histstore.Store) -> None:
    ids = await _fill(store)
    await store.scoped("alice").save(
        histstore.ConversationState(ids["a2"], system_prompt="be kind", metadata={"team": "red"})
    )
    info = await admin.describe(store.scoped("alice"), ids["a1"])
    assert (info.id, info.user, info.length, info.summaries) == (ids["a1"], "alice", 2, 1)
    assert info.lists == (("steps", 3),)
    assert info.metadata_keys == ("n", "team")
    assert not info.has_system_prompt
    assert info.created_at <= info.updated_at
    prompt = await admin.describe(store, ids["a2"])
    assert prompt.system_prompt == "be kind"
    assert prompt.as_dict()["lists"] == {}
    for view, cid in ((store.scoped("bob"), ids["a1"]), (store.scoped("alice"), ids["none"])):
        with pytest.raises(NotFound):
            await admin.describe(view, cid)
    with pytest.raises(NotFound):
        await admin.describe(store, new_id())
    with pytest.raises(InvalidId):
        await admin.describe(store, " x")


async def test_listing_pages_as_store_conversations_does(store: histstore.Store) -> None:
    await _fill(store)
    cases: list[dict[str, object]] = [
        {},
        {"order": "updated", "descending": True},
        {"order": "created", "limit": 2, "offset": 1},
        {"user": "alice"},
        {"metadata": {"team": "blue"}},
        {"metadata": {"team": "blue", "n": 1}},
        {"metadata": {"n": None}, "order": "id", "descending": True},
        {"user": "bob", "metadata": {"team": "blue"}},
        {"user": "carol"},
    ]
    for view in (store, store.scoped("alice"), store.scoped("bob")):
        for case in cases:
            listed = await admin.list_conversations(view, **case)  # type: ignore[arg-type]
            assert [i.id for i in listed] == await view.conversations(**case), case  # type: ignore[arg-type]
            filters = {k: v for k, v in case.items() if k in ("user", "metadata")}
            total = await admin.count_conversations(view, **filters)  # type: ignore[arg-type]
            assert total == len(await view.conversations(**filters)), case  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        await admin.list_conversations(store, metadata="x")  # type: ignore[arg-type]
    with pytest.raises(InvalidMessage):
        await admin.list_conversations(store, metadata={"k": float("nan")})
    with pytest.raises(ValueError, match="order"):
        await admin.list_conversations(store, order="size")  # type: ignore[arg-type]


async def test_since_and_until_bound_the_last_change(store: histstore.Store) -> None:
    old, new = new_id("old"), new_id("new")
    await store.write(old, [Message.user("1")])
    between = await clock_tick()  # after old's stamp
    await clock_tick()  # new's stamp is after between
    await store.write(new, [Message.user("2")])

    async def ids(**kw: datetime) -> list[str]:
        return [i.id for i in await admin.list_conversations(store, order="updated", **kw)]

    assert await ids(since=between) == [new]
    assert await ids(until=between) == [old]
    assert await ids(since=between - timedelta(hours=1)) == [old, new]
    assert await ids(since=between, until=between) == []
    assert await admin.count_conversations(store, since=between) == 1
    await store.merge_metadata(old, {"touched": True})  # any change counts
    assert await ids(since=between) == [new, old]
    with pytest.raises(ValueError, match="aware"):
        await admin.list_conversations(store, since=datetime(2024, 1, 1))  # noqa: DTZ001


async def test_purge_candidates_are_what_purge_deletes(store: histstore.Store) -> None:
    ids = await _fill(store)
    await clock_tick()  # every conversation is idle for more than 0
    alice = store.scoped("alice")
    assert await admin.purge_candidates(store, idle_for=timedelta(days=1)) == []
    candidates = await admin.purge_candidates(alice, idle_for=timedelta(0))
    assert candidates == sorted([ids["a1"], ids["a2"]])
    assert await alice.purge(idle_for=timedelta(0)) == len(candidates)
    rest = await admin.purge_candidates(store, idle_for=timedelta(0))
    assert rest == sorted([ids["b1"], ids["none"]])
    with pytest.raises(TypeError):
        await admin.purge_candidates(store, idle_for=30)  # type: ignore[arg-type]


async def test_reindex_reports_progress_batch_by_batch(store: histstore.Store) -> None:
    alice, bob = new_id("a"), new_id("b")
    await store.scoped("alice").write(alice, [Message.user(f"a{i}") for i in range(4)])
    await store.scoped("bob").write(bob, [Message.user(f"b{i}") for i in range(3)])
    calls: list[tuple[int, int]] = []
    assert await admin.reindex(store, batch=3, progress=lambda *c: calls.append(c)) == 0
    assert calls == [(3, 7), (6, 7), (7, 7)]
    # A view reads only its user's messages; the empty page after a full one adds no call.
    calls.clear()
    view = store.scoped("alice")
    assert await admin.reindex(view, batch=2, progress=lambda *c: calls.append(c)) == 0
    assert calls == [(2, 4), (4, 4)]
    with pytest.raises(ValueError, match="batch"):
        await admin.reindex(store, batch=0, progress=lambda *c: calls.append(c))
    assert calls == [(2, 4), (4, 4)]


async def test_purge_reports_progress_batch_by_batch(
    store: histstore.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(histstore._ops.listing, "PURGE_BATCH", 2)
    ids = [new_id("p") for _ in range(6)]
    for cid in ids[:5]:
        await store.write(cid, [Message.user("hi")])
    await store.scoped("bob").write(ids[5], [Message.user("hi")])
    await clock_tick()  # every conversation is idle for more than 0
    calls: list[tuple[int, int]] = []
    bob = store.scoped("bob")
    assert await admin.purge(bob, idle_for=timedelta(0), progress=lambda *c: calls.append(c)) == 1
    assert calls == [(1, 1)]
    calls.clear()
    assert await admin.purge(store, idle_for=timedelta(0), progress=lambda *c: calls.append(c)) == 5
    assert calls == [(2, 5), (4, 5), (5, 5)]
    assert await store.conversations() == []
    calls.clear()
    assert await admin.purge(store, idle_for=timedelta(0), progress=lambda *c: calls.append(c)) == 0
    assert calls == [(0, 0)]
    assert await admin.purge(store, idle_for=timedelta(0)) == 0
    with pytest.raises(ValueError, match="negative"):
        await admin.purge(store, idle_for=timedelta(-1), progress=lambda *c: calls.append(c))
    assert calls == [(0, 0)]


async def test_purge_batches_go_through_conversations_idle_since_the_same_time(
    store: histstore.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each batch starts after the last one picked (by time, then id): ties in time are
    neither skipped nor picked twice."""
    monkeypatch.setattr(histstore._ops.listing, "PURGE_BATCH", 2)
    idle = sorted(new_id("idle") for _ in range(7))
    for cid in idle:
        await store.write(cid, [Message.user("hi")])
    recent = new_id("recent")
    await store.write(recent, [Message.user("hi")])
    conv = _schema.conversations
    async with store.engine.begin() as conn:
        old = datetime.now(timezone.utc) - timedelta(days=3)
        await conn.execute(update(conv).where(conv.c.id.in_(idle)).values(updated_at=old))
    calls: list[tuple[int, int]] = []
    gone = await admin.purge(store, idle_for=timedelta(days=1), progress=lambda *c: calls.append(c))
    assert gone == 7
    assert calls == [(2, 7), (4, 7), (6, 7), (7, 7)]
    assert await store.conversations() == [recent]


def test_progress_ends_at_what_was_done() -> None:
    """Fewer done than counted first (changed meanwhile): the last call lowers the total;
    more: the total follows."""
    calls: list[tuple[int, int]] = []
    report = histstore.admin._maintenance._Reporter(lambda *c: calls.append(c), 5)
    for done in (2, 2, 4):
        report(done)
    report.finish()
    assert calls == [(2, 5), (4, 5), (4, 4)]
    calls.clear()
    report = histstore.admin._maintenance._Reporter(lambda *c: calls.append(c), 1)
    report(3)
    report.finish()
    assert calls == [(3, 3)]


@pytest.mark.sqlite_file
async def test_migration_status_sql_and_migrate(tmp_path: Path) -> None:
    path = tmp_path / "m.db"
    sql = admin.migration_sql(str(path))
    assert "CREATE TABLE histstore_conversations" in sql
    assert not path.exists()
    before = await admin.migrate(str(path))
    assert before.current is None
    assert not before.up_to_date
    now = await admin.migration_status(str(path))
    assert now.up_to_date
    assert now.known
    assert now.current == before.head
    assert (await admin.migrate(str(path))).up_to_date
    where = admin.locate(str(path))
    assert where.file == path
    assert where.display == str(path)
    hidden = admin.locate("postgresql://u:secret@h/db")
    assert hidden.file is None
    assert "secret" not in hidden.display


def test_admin_exports_are_sorted_and_complete() -> None:
    assert admin.__all__ == sorted(admin.__all__)
    public = {n for n in dir(admin) if not n.startswith("_")}
    assert public - {"annotations"} == set(admin.__all__)
