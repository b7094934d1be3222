"""A page of ``conversations(metadata=..., order="created"|"updated", limit=...)`` is the
same whichever plan finds it (``_ops.listing.read_page``): the walk over the newest (or
oldest) conversations of the order, taken when every equality of the filter is common,
or the metadata index, taken when one is rare or the walk's window held too few."""

from __future__ import annotations

from typing import Any

import pytest

import histstore
from histstore import Message
from histstore._ops import listing

# Conversation i: "app" in two values (about half each), "k" common to every third,
# "rare" on two only.
N = 40


def _metadata(i: int) -> dict[str, Any]:
    md: dict[str, Any] = {"app": "a" if i % 2 else "b", "k": i % 3}
    if i in (5, 31):
        md["rare"] = True
    return md


FILTERS: list[dict[str, Any]] = [
    {"app": "a"},  # common, dense: the walk finds every page
    {"app": "a", "k": 0},  # both common, together sparser: some pages need the index
    {"rare": True},  # rare: the walk is skipped
    {"app": "b", "rare": True},  # one rare equality: skipped
    {"app": "nobody"},  # no match
]


@pytest.mark.parametrize("order", ["created", "updated"])
async def test_a_page_is_the_filtered_order_whichever_plan_finds_it(
    store: histstore.Store, order: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A window of 2 x (limit + offset) conversations, taken when every equality matches
    # at least 8: small enough that this store exercises both plans.
    monkeypatch.setattr(listing, "WALK_FROM", 8)
    monkeypatch.setattr(listing, "WALK_WINDOW", 2)
    ids = [f"lw-{i:02d}" for i in range(N)]
    for i, cid in enumerate(ids):
        await store.write(cid, [Message.user("hi")], metadata=_metadata(i))
    # Touch some in another order, so that "updated" differs from "created" and from id.
    for cid in ids[::7]:
        await store.write(cid, [Message.user("again")])
    for md in FILTERS:
        for descending in (False, True):
            every = await store.conversations(metadata=md, order=order, descending=descending)
            assert set(every) == {
                c for i, c in enumerate(ids) if md.items() <= _metadata(i).items()
            }
            for limit in (1, 3, 10):
                for offset in (0, 2, 7):
                    got = await store.conversations(
                        metadata=md, order=order, descending=descending, limit=limit, offset=offset
                    )
                    assert got == every[offset : offset + limit], (md, descending, limit, offset)
