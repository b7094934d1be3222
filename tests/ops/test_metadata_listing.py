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
