"""Export, import and copy (issue 9): nothing enters through them that ``write``/``save``
would refuse, on every backend alike, and what a failed import leaves does not depend on
its batch size."""

from __future__ import annotations

import io
import json
import uuid
from pathlib import Path
from typing import Any

import pytest

import histstore
from histstore import InvalidMessage, Message, NotFound
from histstore._core.codec import MAX_NESTING
from histstore._transfer.exporting import FormatError, copy_store, export_store, import_store

T = "2024-01-02T03:04:05.123456+00:00"


def new_id(prefix: str = "c") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def conversation(
    cid: str,
    n: int,
    *,
    user: str | None = None,
    prompt: str | None = None,
    text: str = "m",
    metadata: dict[str, Any] | None = None,
    lists: dict[str, list[Any]] | None = None,
    **overrides: Any,
) -> list[dict[str, Any]]:
    """The records of one conversation; ``overrides`` maps ``"message:<i>"`` or
    ``"conversation"`` to fields replaced in that record."""
    head = {
        "type": "conversation",
        "id": cid,
        "user": user,
        "system_prompt": prompt,
        "created_at": T,
        "updated_at": T,
        "messages": n,
        "metadata": metadata or {},
        **overrides.get("conversation", {}),
    }
    records: list[dict[str, Any]] = [head]
    for i in range(n):
        message = {
            "type": "message",
            "position": i,
            "created_at": T,
            "token_count": 3,
            "data": {"role": "user", "content": f"{text} {i}"},
        }
        message.update(overrides.get(f"message:{i}", {}))
        records.append(message)
    for name, items in (lists or {}).items():
        records.append({"type": "list", "name": name, "length": len(items)})
        records.extend({"type": "item", "value": v} for v in items)
    records.append({"type": "end", "id": cid})
    return records


def dump(*conversations: list[dict[str, Any]], footer: dict[str, Any] | None = None) -> list[bytes]:
    """An export file, as the lines ``import_store`` reads."""
    records = [r for c in conversations for r in c]
    counts = {
        "type": "footer",
        "conversations": sum(r["type"] == "conversation" for r in records),
        "messages": sum(r["type"] == "message" for r in records),
    }
    head = {"format": "histstore", "version": 1, "exported_at": T}
    lines = [head, *records, footer if footer is not None else counts]
    return [(json.dumps(r, ensure_ascii=False) + "\n").encode() for r in lines]


async def snapshot(store: histstore.Store, ids: list[str]) -> dict[str, Any]:
    out = {}
    for cid in ids:
        if not await store.exists(cid):
            continue
        state = await store.load(cid)
        out[cid] = (
            state.user,
            state.system_prompt,
            [(m.to_dict(), m.created_at) for m in state.messages],
            dict(state.metadata or {}),
            state.created_at,
            state.updated_at,
            await store.list_load(cid, "steps"),
        )
    return out


# ---------------------------------------------------------------------------- 1. positions


async def test_every_position_is_checked_whatever_the_batch(store: histstore.Store) -> None:
    good, bad = new_id("good"), new_id("bad")
    swapped = conversation(bad, 6, **{"message:2": {"position": 3}, "message:3": {"position": 2}})
    lines = dump(conversation(good, 2), swapped)
    with pytest.raises(FormatError, match=r"line 9\b.*position 3"):
        await import_store(store, lines, batch=100)
    assert await store.conversations() == [good]
    assert not await store.exists(bad)


async def test_a_corrected_file_repairs_a_conversation(store: histstore.Store) -> None:
    cid = new_id()
    await import_store(store, dump(conversation(cid, 5, text="wrong", lists={"steps": [1, 2]})))
    fixed = dump(conversation(cid, 5, text="right", lists={"steps": [1, 3]}))
    stats = await import_store(store, fixed, batch=2)
    assert (stats.conversations, stats.skipped) == (1, 0)
    assert [m.content for m in await store.read(cid)] == [f"right {i}" for i in range(5)]
    assert await store.list_load(cid, "steps") == [1, 3]
    again = await import_store(store, fixed)
    assert (again.conversations, again.skipped) == (0, 1)
    outcome = await store.write(cid, [Message.user("later")])
    assert outcome.length == 6


# ---------------------------------------------------------------------------- 2. ownership


async def test_export_through_a_scoped_view_exports_only_its_users(
    store: histstore.Store,
) -> None:
    alice, bob = store.scoped("alice"), store.scoped("bob")
    mine, theirs = new_id("alice"), new_id("bob")
    await alice.write(mine, [Message.user("a")])
    await bob.write(theirs, [Message.user("b")])
    out = io.StringIO()
    stats = await export_store(alice, out)
    ids = [json.loads(x).get("id") for x in out.getvalue().splitlines()]
    assert stats.conversations == 1
    assert theirs not in ids
    assert mine in ids
    with pytest.raises(NotFound, match=theirs):
        await export_store(alice, io.StringIO(), ids=[theirs])
    # Importing through a view makes its user the owner; another's id is not found.
    with pytest.raises(NotFound, match=theirs):
        await import_store(alice, dump(conversation(theirs, 1)))
    assert [m.content for m in await store.read(theirs)] == ["b"]


# ---------------------------------------------------------------------------- 3. agreement


async def test_values_are_stored_everywhere_or_refused_everywhere(
    store: histstore.Store,
) -> None:
    odd = new_id("odd")
    role = {"message:0": {"data": {"role": "us\x00er", "content": "x"}}}
    records = conversation(odd, 1, metadata={"k\x00ey": 1, "\x01": 2}, **role)
    await import_store(store, dump(records))
    assert (await store.read(odd))[0].role == "us\x00er"
    assert await store.metadata(odd) == {"k\x00ey": 1, "\x01": 2}
    refused = [
        {"conversation": {"system_prompt": "a\x00b"}},
        {"message:1": {"token_count": 2**31}},
        {"message:1": {"position": 2**63}},
        {"conversation": {"messages": 2**63}},
    ]
    for overrides in refused:
        bad = new_id("bad")
        with pytest.raises(FormatError):
            await import_store(store, dump(conversation(bad, 2, **overrides)))
        assert not await store.exists(bad)


async def test_copy_refuses_a_source_conversation_naming_it(
    store: histstore.Store, tmp_path: Path
) -> None:
    first, bad, last = "a-first", "b-bad", "c-last"
    async with histstore.connect(tmp_path / "source.db") as source:
        for cid in (first, bad, last):
            await source.write(cid, [Message.user(f"{cid} {i}") for i in range(3)])
        async with source.engine.begin() as conn:
            await conn.exec_driver_sql(
                "UPDATE histstore_messages SET token_count = 2147483648"
                f" WHERE conversation_id = '{bad}' AND position = 2"
            )
        for batch in (1, 1000):
            with pytest.raises(InvalidMessage, match=bad):
                await copy_store(source, store, batch=batch)
            assert await store.conversations() == [first]
        async with source.engine.begin() as conn:
            await conn.exec_driver_sql(
                "UPDATE histstore_conversations SET system_prompt = 'x' || char(0)"
                f" WHERE id = '{bad}'"
            )
            await conn.exec_driver_sql("UPDATE histstore_messages SET token_count = NULL")
        with pytest.raises(InvalidMessage, match=bad):
            await copy_store(source, store)
        assert await store.conversations() == [first]


async def test_copy_between_databases_keeps_every_message_found(
    store: histstore.Store, tmp_path: Path
) -> None:
    """A NULL ``search_text`` stands for the text the source's database computes from
    the JSON (SQLite: block content, tool results, ADK events; revision e5c3a9d7f2b4):
    the target stores what its own rule needs, so a copy to any backend and back finds
    every message by the same words."""
    shapes = [
        {"role": "user", "content": "auk"},
        {"role": "assistant", "content": [{"type": "output_text", "text": "puffin"}]},
        {"role": "tool", "type": "function_call_output", "call_id": "c", "output": "tern"},
        {"role": "user", "type": "adk_event",
         "event": {"content": {"role": "user", "parts": [{"text": "skua"}]}}},
    ]  # fmt: skip
    words = ("auk", "puffin", "tern", "skua")
    async with histstore.connect(tmp_path / "source.db") as source:
        await source.write("c", shapes)
        await copy_store(source, store)
        for p, word in enumerate(words):
            assert [h.position for h in await store.search(word)] == [p]
        async with histstore.connect(tmp_path / "back.db") as back:
            await copy_store(store, back)
            for p, word in enumerate(words):
                assert [h.position for h in await back.search(word)] == [p]


# ---------------------------------------------------------------------------- 4. bad files


async def test_bad_values_are_format_errors_naming_the_line(store: histstore.Store) -> None:
    cases: list[tuple[dict[str, Any], str]] = [
        ({"conversation": {"created_at": "0001-01-01T00:00:00+14:00"}}, "line 2"),
        ({"message:1": {"created_at": "0001-01-01T00:00:00+14:00"}}, "line 4"),
        ({"message:1": {"token_count": 2**63}}, "line 4"),
        ({"message:1": {"position": 2**64}}, "line 4"),
    ]
    for overrides, line in cases:
        cid = new_id()
        with pytest.raises(FormatError, match=line):
            await import_store(store, dump(conversation(cid, 2, **overrides)))
        assert not await store.exists(cid)
    # Nesting: the store's own limit, the same on every Python (the message object is
    # level 1); a line too deep for any record is refused before it is parsed.
    for levels in (MAX_NESTING, 5000):
        lines = dump(conversation(new_id(), 2))
        deep = b"[" * levels + b"]" * levels
        lines[3] = lines[3].replace(b'"content": "m 1"', b'"content": ' + deep)
        with pytest.raises(FormatError, match=f"line 4.*nested more than {MAX_NESTING}"):
            await import_store(store, lines)
    assert await store.conversations() == []


async def test_the_footer_counts_are_checked(store: histstore.Store) -> None:
    a = new_id("a")
    complete = {"type": "footer", "conversations": 2, "messages": 4}
    missing = dump(conversation(a, 2), footer=complete)  # b is missing
    with pytest.raises(FormatError, match="footer"):
        await import_store(store, missing)
    wrong = dump(conversation(a, 2), footer={"type": "footer", "conversations": 1, "messages": 3})
    with pytest.raises(FormatError, match="footer"):
        await import_store(store, wrong)


async def test_what_a_failed_import_leaves_does_not_depend_on_batch(
    store: histstore.Store,
) -> None:
    results = []
    for batch in (1, 3, 7, 1000):
        ids = [new_id(p) for p in "abcd"]
        small = conversation(ids[0], 2, lists={"steps": [1]})
        large = conversation(ids[1], 30, metadata={"k": 1})
        bad = conversation(ids[2], 30, **{"message:25": {"token_count": -1}})
        after = conversation(ids[3], 1)
        with pytest.raises(FormatError, match="line"):
            await import_store(store, dump(small, large, bad, after), batch=batch)
        kept = [cid for cid in ids if await store.exists(cid)]
        assert kept == ids[:2], batch
        # The fixed file converges to the same store, whatever the batch.
        fixed = conversation(ids[2], 30)
        await import_store(store, dump(small, large, fixed, after), batch=batch)
        got = await snapshot(store, ids)
        results.append([got[cid] for cid in ids])
    assert all(r == results[0] for r in results)


# ------------------------------------------------------------------- the full-text index


async def test_an_import_is_indexed_while_it_goes_on(store: histstore.Store) -> None:
    """An import counts the messages it lists for SQLite's full-text index, so the
    background indexer keeps up with it: what it leaves to ``close()`` (or to the next
    search) stays within a chunk (``search_index.CHUNK``), however much it imported."""
    from sqlalchemy import text
    from waiting import eventually

    from histstore._storage.search_index import CHUNK, PENDING_TABLE

    indexer = store.internals.executor.indexer
    if indexer is None:
        pytest.skip("this backend has no background indexer")
    n = CHUNK // 100 + 60  # conversations of 100 messages: more than a chunk in all
    lines = dump(*(conversation(new_id(), 100) for _ in range(n)))
    await import_store(store, lines, batch=1_000)
    await eventually(lambda: indexer.state == "idle", "the indexer's run to end")
    async with store.engine.connect() as conn:
        listed = await conn.execute(text(f"SELECT count(*) FROM {PENDING_TABLE}"))
        assert listed.scalar_one() < CHUNK
    assert len(await store.search("m", limit=5)) == 5
