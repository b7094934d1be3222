"""SPEC 5: metadata keys are any strings, of any length, on every backend.

The metadata table is keyed by a digest of the stored key (``_core.codec.key_digest``), so
a key longer than an index can hold merges, filters, forks and transfers like a short
one, and two keys stay apart however long a prefix they share.
"""

from __future__ import annotations

import hashlib
import io
from pathlib import Path
from typing import Any

from helpers import new_id
from sqlalchemy import select

import histstore
from histstore import ConversationState, Message, admin
from histstore._storage import schema as s

Store = histstore.Store

# 256, 1,000 and 100,000 characters; NUL (stored escaped, so longer), U+0001 and astral
# characters among them.
K256 = "k" * 255 + "\U0001f600"
K1000 = ("nul\x00 \x01 \U00010348 " * 120)[:1000]
K100K = ("\U0001f600\x00" + "long key " * 11_200)[:99_996] + "\x01end"
LONG = {"k256": K256, "k1000": K1000, "k100k": K100K}
assert [len(k) for k in (K256, K1000, K100K)] == [256, 1000, 100_000]


def values() -> dict[str, Any]:
    return {k: {"n": len(k), "tail": k[-3:]} for k in LONG.values()}


async def test_long_keys_round_trip(store: Store, cid: str) -> None:
    other = new_id()
    await store.merge_metadata(other, {"plain": 1})
    await store.merge_metadata(cid, {**values(), "plain": 1})
    assert await store.metadata(cid) == {**values(), "plain": 1}
    for key, value in values().items():
        assert await store.conversations(metadata={key: value}) == [cid]
        # A second condition on a long key (an EXISTS, not the join).
        assert await store.conversations(metadata={"plain": 1, key: value}) == [cid]
        assert await store.conversations(metadata={key: "other"}) == []
        assert await store.conversations(metadata={"plain": 1, key: None}) == [other]
    # Merging again replaces the values in place.
    await store.merge_metadata(cid, {K100K: 2, K256: 3})
    got = await store.metadata(cid)
    assert (got[K100K], got[K256], len(got)) == (2, 3, 4)
    await store.merge_metadata(cid, {K100K: None, K1000: None})
    assert await store.metadata(cid) == {K256: 3, "plain": 1}
    assert await store.conversations(metadata={K100K: 2}) == []


async def test_long_keys_are_stored_whole_beside_their_digest(store: Store, cid: str) -> None:
    await store.merge_metadata(cid, {K100K: 1})
    md = s.metadata_entries
    async with store.engine.connect() as conn:
        row = (
            await conn.execute(select(md.c.key, md.c.key_digest).where(md.c.conversation_id == cid))
        ).one()
    stored = K100K.replace("\x01", "\x01\x01").replace("\x00", "\x01\x02")
    assert row.key == stored
    assert row.key_digest == hashlib.sha256(stored.encode()).hexdigest()


async def test_keys_sharing_a_long_prefix_stay_distinct(store: Store, cid: str) -> None:
    prefix = "p" * 255
    keys = [prefix, prefix + "a", prefix + "b", prefix + "\x00", prefix * 40 + "a"]
    await store.merge_metadata(cid, {k: i for i, k in enumerate(keys)})
    assert await store.metadata(cid) == {k: i for i, k in enumerate(keys)}
    for i, k in enumerate(keys):
        assert await store.conversations(metadata={k: i}) == [cid]
        assert await store.conversations(metadata={k: (i + 1) % len(keys)}) == []
    await store.merge_metadata(cid, {prefix + "a": None, prefix + "b": "new"})
    assert await store.metadata(cid) == {
        prefix: 0,
        prefix + "b": "new",
        prefix + "\x00": 3,
        prefix * 40 + "a": 4,
    }


async def test_save_load_and_fork_keep_long_keys(store: Store, cid: str) -> None:
    state = ConversationState(cid, messages=(Message.user("hi"),), metadata=values())
    await store.save(state)
    assert (await store.load(cid)).metadata == values()
    fork = new_id()
    await store.fork(cid, fork)
    assert await store.metadata(fork) == values()
    assert sorted(await store.conversations(metadata={K100K: values()[K100K]})) == sorted(
        [cid, fork]
    )
    # The fork's keys are its own.
    await store.merge_metadata(fork, {K1000: None})
    assert await store.metadata(cid) == values()
    # Saving again replaces the whole metadata.
    await store.save(ConversationState(cid, metadata={K256: 1}))
    assert (await store.load(cid)).metadata == {K256: 1}


async def test_admin_describes_and_lists_by_long_keys(store: Store, cid: str) -> None:
    await store.merge_metadata(cid, {**values(), "\x00": 0, "\x01": 1})
    info = await admin.describe(store, cid)
    assert info.metadata_keys == tuple(sorted([*LONG.values(), "\x00", "\x01"]))
    listed = await admin.list_conversations(store, metadata={K100K: values()[K100K]})
    assert [i.id for i in listed] == [cid]
    assert await admin.count_conversations(store, metadata={K1000: values()[K1000]}) == 1


async def test_scoped_views_see_only_their_long_keys(store: Store) -> None:
    alice, bob = store.scoped("alice"), store.scoped("bob")
    mine, theirs = new_id("alice"), new_id("bob")
    await alice.merge_metadata(mine, {K100K: "a"})
    await bob.merge_metadata(theirs, {K100K: "b"})
    assert await alice.conversations(metadata={K100K: "a"}) == [mine]
    assert await alice.conversations(metadata={K100K: "b"}) == []
    assert await bob.conversations(metadata={K100K: "b"}) == [theirs]
    await alice.merge_metadata(mine, {K100K: None, K256: 1})
    assert await alice.metadata(mine) == {K256: 1}
    assert await bob.metadata(theirs) == {K100K: "b"}


async def test_export_import_and_copy_keep_long_keys(store: Store, tmp_path: Path) -> None:
    cid = new_id()
    async with histstore.connect(tmp_path / "source.db") as source:
        await source.write(cid, [Message.user("x")])
        await source.merge_metadata(cid, values())
        out = io.StringIO()
        await admin.export_store(source, out)
        lines = [line.encode() for line in out.getvalue().splitlines(keepends=True)]
        stats = await admin.import_store(store, lines)
        assert stats.conversations == 1
        assert await store.metadata(cid) == values()
        assert await store.conversations(metadata={K100K: values()[K100K]}) == [cid]
        again = await admin.import_store(store, lines)
        assert (again.conversations, again.skipped) == (0, 1)  # compared equal, row by row

        # A changed long key is seen as a change by import and by copy.
        await source.merge_metadata(cid, {K1000: None, K100K: "changed"})
        expected = await source.metadata(cid)
        stats = await admin.copy_store(source, store)
        assert stats.conversations == 1
        assert await store.metadata(cid) == expected
        assert (await admin.copy_store(source, store)).skipped == 1

    async with histstore.connect(tmp_path / "target.db") as target:
        out = io.StringIO()
        await admin.export_store(store, out, ids=[cid])
        lines = [line.encode() for line in out.getvalue().splitlines(keepends=True)]
        await admin.import_store(target, lines)
        assert await target.metadata(cid) == expected
        await store.merge_metadata(cid, values())
        await admin.copy_store(store, target)
        assert await target.metadata(cid) == values()
