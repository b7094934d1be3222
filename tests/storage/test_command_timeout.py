"""``command_timeout``: the store's client-side time limit per call, in ``connect()`` and
in the URL, on every backend (a silent server and a stalled COMMIT are in
test_giving_up.py)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
import reach
from conftest import Backend
from helpers import new_id

import histstore
from histstore import WriteError
from histstore._storage.deadlines import GIVE_UP_BOUND

MARGIN = 1.0
"""Seconds a loaded 2-core machine may add to the bound."""


def one(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def with_query(backend: Backend, query: str) -> str:
    """The backend's database as a URL carrying ``query``."""
    url = backend.url if "://" in backend.url else f"sqlite:///{backend.url}"
    return url + ("&" if "?" in url else "?") + query


@pytest.mark.parametrize("bad", [0, -1, float("inf"), float("nan"), True, "soon", [1]], ids=repr)
async def test_command_timeout_must_be_seconds(backend: Backend, bad: Any) -> None:
    with pytest.raises(ValueError, match="command_timeout"):
        backend.connect(command_timeout=bad)
    if isinstance(bad, (int, float)) and not isinstance(bad, bool):
        with pytest.raises(ValueError, match="command_timeout"):
            histstore.connect(with_query(backend, f"command_timeout={bad}"))


async def test_command_timeout_in_the_url_or_connect_leaves_calls_as_they_were(
    backend: Backend,
) -> None:
    conversation = new_id()
    opened = [
        backend.connect(command_timeout=5),
        histstore.connect(with_query(backend, "command_timeout=5"), **backend.options),
    ]
    for connecting in opened:
        async with connecting as store:
            await store.write(conversation, one("a"), idempotency_key=new_id())
            assert (await store.read(conversation, limit=20))[-1].content == "a"
            await store.load(conversation)


async def test_write_waiting_longer_than_command_timeout_is_given_up(backend: Backend) -> None:
    """A write waiting for another writer (the conversation's lock, SQLite's write lock,
    the in-memory database's one connection) fails at ``command_timeout`` with nothing
    stored, though ``busy_timeout`` would wait much longer."""
    conversation = new_id()
    limit = 1.0
    async with backend.connect(command_timeout=limit, busy_timeout=60) as store:
        await store.write(conversation, one("a"))
        async with reach.holding_the_write_turn(store, lock=conversation):
            started = time.monotonic()
            write = store.write(conversation, one("b"), idempotency_key="k")
            with pytest.raises(WriteError) as caught:
                await asyncio.wait_for(write, 30)
            took = time.monotonic() - started
        assert limit - 0.1 <= took < limit + GIVE_UP_BOUND + MARGIN
        assert caught.value.outcome.accepted == 0
        assert not caught.value.outcome.uncertain
        assert caught.value.idempotency_key == "k"
        await store.write(conversation, one("b"), idempotency_key="k")
        assert [m.content for m in await store.read(conversation)] == ["a", "b"]
