"""The idempotency keys the store makes for batches written without one."""

from __future__ import annotations

import json
import os
import warnings

import pytest
from faults import Faults

import histstore
from histstore._core.ids import new_key


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")
def test_made_keys_differ_within_a_process_and_in_a_forked_child() -> None:
    before = [new_key() for _ in range(10_000)]
    assert len(set(before)) == len(before)
    read, write = os.pipe()
    with warnings.catch_warnings():  # 3.12+: forking a process that runs threads
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # the child: its keys, then out without running anything of pytest's
        os.write(write, json.dumps([new_key() for _ in range(1_000)]).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        child = json.loads(pipe.read())
    os.waitpid(pid, 0)
    after = [new_key() for _ in range(1_000)]
    assert len(child) == 1_000
    assert not set(child) & set(before + after)
    assert all(len(k) <= 64 for k in before + after + child)


async def test_each_failed_write_carries_its_own_key(
    store: histstore.Store, cid: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    faults = Faults(monkeypatch)
    keys = set()
    for i in range(3):
        faults.commit_mode = "rollback-then-fail"
        with pytest.raises(histstore.WriteError) as info:
            await store.write(cid, [histstore.Message.user(f"m{i}")])
        keys.add(info.value.idempotency_key)
    assert len(keys) == 3
    assert await store.count(cid) == 0
    for key in keys:  # each can be written again under its key, once
        await store.write(cid, [histstore.Message.user("again")], idempotency_key=key)
    assert await store.count(cid) == 3
