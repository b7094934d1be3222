"""Listing by several metadata keys: the same answer whatever order the keys come in,
served from the key that the fewest conversations hold (``_ops.listing``)."""

from __future__ import annotations

import itertools
from typing import Any

from helpers import new_id

import histstore
from histstore import admin
from histstore._ops.listing import most_selective_first

Store = histstore.Store


async def _fill(store: Store, tag: str) -> dict[str, list[str]]:
    """70 conversations of app ``tag``: 69 of user "many", 1 of user "me" (2 with kind
    "b"); returns the ids by what they hold."""
    made: dict[str, list[str]] = {"me": [], "many": [], "b": []}
    for i in range(70):
        cid = f"{tag}-{i:03d}"
        user = "me" if i in (5, 40) else "many"
        kind = "b" if i in (40, 41) else "a"
        await store.merge_metadata(cid, {"app": tag, "user": user, "kind": kind})
        made[user].append(cid)
        if kind == "b":
            made["b"].append(cid)
    return made


async def test_every_key_order_lists_the_same_page(store: Store) -> None:
    tag = new_id()
    made = await _fill(store, tag)
    query: dict[str, Any] = {"kind": "a", "app": tag, "user": "me", "gone": None}
    want = sorted(c for c in made["me"] if c not in made["b"])
    for keys in itertools.permutations(query):
        ordered = {k: query[k] for k in keys}
        for order in ("id", "created", "updated"):
            got = await store.conversations(metadata=ordered, order=order)  # type: ignore[arg-type]
            assert sorted(got) == want
        assert await store.conversations(metadata=ordered, limit=1, descending=True) == want[-1:]
        listed = await admin.list_conversations(store, metadata=ordered)
        assert [c.id for c in listed] == want
        assert await admin.count_conversations(store, metadata=ordered) == len(want)


async def test_the_key_fewest_conversations_hold_goes_first(store: Store) -> None:
    tag = new_id()
    await _fill(store, tag)

    async def first(metadata: dict[str, Any]) -> list[str]:
        async with store.engine.connect() as conn:
            return list(await most_selective_first(conn, metadata))

    # "user"="me" is held by 2, "kind"="b" by 2 (ties keep the caller's order), the rest by 70.
    assert await first({"app": tag, "kind": "a", "user": "me"}) == ["user", "app", "kind"]
    assert await first({"app": tag, "kind": "b", "user": "me"}) == ["kind", "app", "user"]
    assert await first({"gone": None, "app": tag, "user": "me"}) == ["user", "gone", "app"]
    # A single equality (with or without absent keys) is left as it is.
    assert await first({"gone": None, "app": tag}) == ["gone", "app"]
    # Nobody holds an unknown value: it goes first, and the page is empty.
    assert await first({"app": tag, "user": "nobody"}) == ["user", "app"]
    assert await store.conversations(metadata={"app": tag, "user": "nobody"}) == []


async def test_a_page_by_time_of_a_common_filter_is_that_of_the_filtered_order(
    store: Store,
) -> None:
    # 70 conversations hold the key (a common filter), 40 newer ones do not, and two of
    # the 70 changed last: some pages lie among the newest conversations, some not.
    tag = new_id()
    held = [f"{tag}-{i:03d}" for i in range(70)]
    for cid in held:
        await store.merge_metadata(cid, {"app": tag})
    for i in range(40):
        await store.merge_metadata(f"{tag}-n{i:02d}", {"app": "other"})
    for cid in (held[10], held[20]):
        await store.merge_metadata(cid, {"touched": True})
    for order, descending in itertools.product(("created", "updated"), (False, True)):
        everything = await store.conversations(order=order, descending=descending)  # type: ignore[arg-type]
        ordered = [c for c in everything if c in held]
        for limit, offset in ((1, 0), (2, 1), (5, 0), (20, 50), (3, 68)):
            want = ordered[offset : offset + limit]
            args: dict[str, Any] = {"order": order, "descending": descending}
            page = {"limit": limit, "offset": offset, **args}
            assert await store.conversations(metadata={"app": tag}, **page) == want
            listed = await admin.list_conversations(store, metadata={"app": tag}, **page)
            assert [c.id for c in listed] == want
            two_keys = {"app": tag, "gone": None}
            assert await store.conversations(metadata=two_keys, **page) == want
