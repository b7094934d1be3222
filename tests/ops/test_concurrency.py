"""Concurrent writers: tasks, connections and processes on one conversation."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from typing import Any

from helpers import PYTHON, new_id, subprocess_env, user_msgs

import histstore
from histstore import ConflictError, Message, WriteOutcome

# A child process: opens its own store on the URL, runs TASKS tasks that each append
# BATCHES small batches, and prints the contents of every acknowledged message as JSON.
WORKER = """
import asyncio, json, sys
import histstore

url, conversation, proc = sys.argv[1], sys.argv[2], int(sys.argv[3])
TASKS, BATCHES = 8, 5

async def task(store, t, acked):
    for b in range(BATCHES):
        batch = [
            {"role": "user", "content": f"p{proc}-t{t}-b{b}-m{i}"} for i in range(1 + (t + b) % 3)
        ]
        out = await store.write(conversation, batch)
        assert out.accepted == len(batch) and not out.uncertain, out
        acked.extend(m["content"] for m in batch)

async def main():
    acked = []
    async with histstore.connect(url) as store:
        await asyncio.gather(*(task(store, t, acked) for t in range(TASKS)))
    print(json.dumps(acked))

asyncio.run(main())
"""


def assert_dense_and_once(messages: list[Message], acknowledged: list[str]) -> None:
    assert [m.position for m in messages] == list(range(len(messages)))
    stored = Counter(m.content for m in messages)
    assert all(n == 1 for n in stored.values()), "a message is stored twice"
    assert Counter(acknowledged) == stored


async def test_processes_append_to_one_conversation(shared_backend: Any) -> None:
    conversation = new_id()
    procs = [
        await asyncio.create_subprocess_exec(
            PYTHON,
            "-c",
            WORKER,
            shared_backend.url,
            conversation,
            str(p),
            env=subprocess_env(),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        for p in range(3)
    ]
    acknowledged: list[str] = []
    for proc in procs:
        out, err = await asyncio.wait_for(proc.communicate(), timeout=180)
        assert proc.returncode == 0, err.decode(errors="replace")
        acknowledged.extend(json.loads(out))
    assert len(acknowledged) == 3 * sum(1 + (t + b) % 3 for t in range(8) for b in range(5))
    async with shared_backend.connect() as store:
        messages = await store.read(conversation)
        assert await store.count(conversation) == len(messages)
    assert_dense_and_once(messages, acknowledged)
    # Each batch is contiguous: one transaction handed out its positions.
    by_content = {m.content: m.position for m in messages}
    for content, position in by_content.items():
        head, _, i = content.rpartition("-m")
        if int(i) > 0:
            assert by_content[f"{head}-m{int(i) - 1}"] == position - 1


async def test_racing_writes_at_the_same_position(shared_backend: Any) -> None:
    async with shared_backend.connect() as one, shared_backend.connect() as two:
        conversation = new_id()
        await one.write(conversation, user_msgs(2))
        for k in range(2, 12):
            results = await asyncio.gather(
                one.write(conversation, [Message.user(f"one-{k}")], at=k),
                two.write(conversation, [Message.user(f"two-{k}")], at=k),
                return_exceptions=True,
            )
            won = [r for r in results if isinstance(r, WriteOutcome)]
            lost = [r for r in results if isinstance(r, ConflictError)]
            assert len(won) == 1, results
            assert len(lost) == 1, results
            assert won[0] == WriteOutcome(1, False, k + 1)
            assert lost[0].outcome is not None
            assert lost[0].outcome.accepted == 0
            winner = "one" if isinstance(results[0], WriteOutcome) else "two"
            stored = await two.read(conversation, start=k)
            assert [m.content for m in stored] == [f"{winner}-{k}"]
        assert await one.count(conversation) == 12


async def test_racing_to_create_a_conversation(shared_backend: Any) -> None:
    async with shared_backend.connect() as one, shared_backend.connect() as two:
        conversation = new_id()
        stores = [one, two] * 10
        await asyncio.gather(
            *(s.write(conversation, [Message.user(f"w{i}")]) for i, s in enumerate(stores))
        )
        messages = await one.read(conversation)
        assert_dense_and_once(messages, [f"w{i}" for i in range(20)])
        assert await one.conversations() == [conversation]

        fresh = new_id()
        results = await asyncio.gather(
            *(s.write(fresh, [Message.user(f"w{i}")], at=0) for i, s in enumerate(stores)),
            return_exceptions=True,
        )
        assert sum(isinstance(r, WriteOutcome) for r in results) == 1, results
        assert sum(isinstance(r, ConflictError) for r in results) == 19, results
        assert await two.count(fresh) == 1


async def test_racing_to_create_a_conversation_with_idempotency_keys(
    shared_backend: Any,
) -> None:
    async with shared_backend.connect() as one, shared_backend.connect() as two:
        conversation = new_id()
        stores = [one, two] * 10
        outcomes = await asyncio.gather(
            *(
                s.write(conversation, [Message.user(f"w{i}")], idempotency_key=f"key-{i}")
                for i, s in enumerate(stores)
            )
        )
        assert all(o.accepted == 1 for o in outcomes)
        messages = await one.read(conversation)
        assert_dense_and_once(messages, [f"w{i}" for i in range(20)])


async def test_tasks_on_one_store_append_densely(store: histstore.Store, cid: str) -> None:
    async def task(t: int) -> list[str]:
        done: list[str] = []
        for b in range(3):
            batch = [f"t{t}-b{b}-m{i}" for i in range(1 + t % 2)]
            out = await store.write(cid, [Message.user(c) for c in batch])
            assert out.accepted == len(batch)
            done.extend(batch)
        return done

    results = await asyncio.gather(*(task(t) for t in range(50)))
    acknowledged = [c for r in results for c in r]
    messages = await store.read(cid)
    assert_dense_and_once(messages, acknowledged)
    assert await store.count(cid) == len(acknowledged) == 225
