"""Turn leases (SPEC 13): one holder per conversation across tasks and processes."""

from __future__ import annotations

import asyncio
import textwrap
import time
from typing import Any

import pytest
from conftest import Backend
from helpers import PYTHON, new_id, subprocess_env, user_msgs

import histstore
from histstore import ConflictError, Message, NotFound, Store


async def test_a_lease_has_one_holder_at_a_time(store: Store, cid: str) -> None:
    async with store.lease(cid) as lease:
        assert lease.conversation == cid
        with pytest.raises(ConflictError):
            async with store.lease(cid, wait=False):
                pass
        await lease.renew()
    async with store.lease(cid, wait=False):  # released on leaving the block
        pass
    assert not await store.exists(cid)  # leasing writes nothing to the conversation


async def test_waiters_get_the_lease_in_turn(store: Store, cid: str) -> None:
    held: list[int] = []
    inside = 0

    async def turn(i: int) -> None:
        nonlocal inside
        async with store.lease(cid, ttl=30):
            inside += 1
            assert inside == 1
            held.append(i)
            await asyncio.sleep(0.01)
            inside -= 1

    tasks = []
    for i in range(8):
        tasks.append(asyncio.ensure_future(turn(i)))
        await asyncio.sleep(0)  # each starts waiting before the next arrives
    await asyncio.gather(*tasks)
    assert held == list(range(8))  # first come, first served within a process


async def test_a_dead_holder_blocks_for_at_most_ttl(store: Store, cid: str) -> None:
    dead = await store.lease(cid, ttl=0.3).__aenter__()  # never released: its holder "died"
    start = time.monotonic()
    async with store.lease(cid, ttl=30) as successor:
        assert time.monotonic() - start >= 0.2
        with pytest.raises(ConflictError):
            await dead.renew()  # it expired, and someone else holds it now
        await dead.release()  # must not release the successor's lease
        with pytest.raises(ConflictError):
            async with store.lease(cid, wait=False):
                pass
        await successor.renew()


async def test_renewing_keeps_the_lease(store: Store, cid: str) -> None:
    async with store.lease(cid, ttl=0.4) as lease:
        for _ in range(4):
            await asyncio.sleep(0.2)
            await lease.renew()
        with pytest.raises(ConflictError):
            async with store.lease(cid, wait=False):
                pass


async def test_leaving_by_an_exception_releases(store: Store, cid: str) -> None:
    with pytest.raises(RuntimeError):
        async with store.lease(cid):
            raise RuntimeError("the turn failed")
    async with store.lease(cid, wait=False):
        pass


async def test_bad_arguments(store: Store, cid: str) -> None:
    for ttl in (0, -1, float("nan"), float("inf"), "60", True):
        with pytest.raises(ValueError, match="ttl"):
            store.lease(cid, ttl=ttl)  # type: ignore[arg-type]
    with pytest.raises(histstore.InvalidId):
        store.lease("bad\x00id")


async def test_a_view_cannot_lease_another_users_conversation(store: Store, cid: str) -> None:
    await store.scoped("bob").write(cid, user_msgs(1))
    with pytest.raises(NotFound):
        async with store.scoped("alice").lease(cid):
            pass
    async with store.scoped("bob").lease(cid, wait=False):
        pass
    async with store.scoped("alice").lease(new_id(), wait=False):  # a fresh id is anyone's
        pass


async def test_status_reports_a_leased_conversation_as_stepping(store: Store, cid: str) -> None:
    assert await store.status(cid) == "empty"
    await store.write(cid, [Message.system("rules"), Message.user("hi")])
    assert await store.status(cid) == "open"
    async with store.lease(cid):
        assert await store.status(cid) == "stepping"
    await store.write(cid, [Message.assistant("hello")])
    assert await store.status(cid) == "closed"
    await store.write(cid, user_msgs(70))
    assert await store.status(cid) == "open"


async def test_serialized_turns_queue_instead_of_failing(store: Store, cid: str) -> None:
    async def model(messages: list[Message]) -> Message:
        await asyncio.sleep(0.005)
        return Message.assistant(f"seen {len(messages)}")

    chat = histstore.with_history(store, model, serialize=True, lease_ttl=5)
    await asyncio.gather(*(chat(cid, [Message.user(f"q{i}")]) for i in range(12)))
    stored = await store.read(cid)
    assert len(stored) == 24
    # Each turn saw every turn before it: replies count the history they were sent.
    assert [m.content for m in stored[1::2]] == [f"seen {2 * i + 1}" for i in range(12)]


_HOLDER = textwrap.dedent(
    """
    import asyncio, sys
    import histstore

    async def main(url, cid):
        async with histstore.connect(url) as store:
            async with store.lease(cid, ttl=30):
                print("held", flush=True)
                sys.stdin.readline()

    asyncio.run(main(sys.argv[1], sys.argv[2]))
    """
)


async def test_a_lease_holds_across_processes(shared_backend: Backend, cid: str) -> None:
    child = await asyncio.create_subprocess_exec(
        PYTHON,
        "-c",
        _HOLDER,
        shared_backend.url,
        cid,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        env=subprocess_env(),
    )
    try:
        assert child.stdout is not None
        line = await asyncio.wait_for(child.stdout.readline(), 60)
        assert line.strip() == b"held"
        async with shared_backend.connect() as store:
            with pytest.raises(ConflictError):
                async with store.lease(cid, wait=False):
                    pass
            assert await store.status(cid) == "stepping"
            waiting: Any = asyncio.ensure_future(_take(store, cid))
            await asyncio.sleep(0.2)
            assert not waiting.done()
            assert child.stdin is not None
            child.stdin.write(b"\n")
            await child.stdin.drain()
            await asyncio.wait_for(waiting, 10)
        await asyncio.wait_for(child.wait(), 30)
    finally:
        if child.returncode is None:
            child.kill()
            await child.wait()
    assert child.returncode == 0


async def _take(store: Store, cid: str) -> None:
    async with store.lease(cid, ttl=5):
        pass
