"""A scoped search (``conversation=``, a view's owner) answers exactly what the
store-wide search answers for that scope: the same hits, scores and order, whether the
scope is small (read from the scope first) or large (from the full-text index)."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import Backend

import histstore
from histstore import Hit, Message
from histstore._storage.statements import search as search_statements

WORDS = ["apple", "berry", "cherry", "apple berry", "apple apple cherry", "plum"]


def _text(i: int, j: int) -> str:
    filler = " ".join(["filler"] * ((i * 7 + j * 3) % 5))
    return f"{WORDS[(i + j) % len(WORDS)]} {filler} note {j % 3}"


async def _fill(store: histstore.Store) -> dict[str, list[str]]:
    owned: dict[str, list[str]] = {"me": [], "you": [], "": []}
    for i in range(9):
        user = ("me", "you", "")[i % 3]
        cid = f"c{i}"
        target = store.scoped(user) if user else store
        await target.write(cid, [Message.user(_text(i, j)) for j in range(3 + i)])
        owned[user].append(cid)
    return owned


def _key(hits: list[Hit]) -> list[tuple[str, int, float]]:
    return [(h.conversation, h.position, h.score) for h in hits]


@pytest.mark.parametrize("small", [True, False], ids=["small-scope", "large-scope"])
async def test_scoped_search_equals_the_store_wide_search_filtered(
    backend: Backend, small: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not small:  # every scope counts as large: the full-text index serves it
        monkeypatch.setattr(search_statements, "SCOPE_SET_MESSAGES", 2)
        monkeypatch.setattr(search_statements, "PG_SCOPE_MESSAGES", 2)
        monkeypatch.setattr(search_statements, "SCOPE_SET_CONVERSATIONS", 1)
    async with backend.connect() as store:
        owned = await _fill(store)
        for query in ("apple", "berry apple", "cherry", '"apple berry"', "plum note", "none"):
            everything = await store.search(query, limit=1000)
            for cid in [c for cs in owned.values() for c in cs] + ["missing"]:
                want = [h for h in everything if h.conversation == cid]
                for limit in (1, 3, 100):
                    got = await store.search(query, conversation=cid, limit=limit)
                    assert _key(got) == _key(want[:limit]), (query, cid, limit)
            for user in ("me", "you", "nobody"):
                view = store.scoped(user)
                mine = [h for h in everything if h.conversation in owned.get(user, [])]
                for limit in (1, 4, 100):
                    got = await view.search(query, limit=limit)
                    assert _key(got) == _key(mine[:limit]), (query, user, limit)
                for cid in owned["me"][:2]:
                    want: list[Any] = [h for h in mine if h.conversation == cid]
                    got = await view.search(query, conversation=cid, limit=100)
                    assert _key(got) == _key(want), (query, user, cid)
