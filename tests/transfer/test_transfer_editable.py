"""Export format version 2, import and copy carry editable history (SPEC 11 "Everywhere
else"): entry ids, authors, asides, halts, turn records and the change log, on every
backend; version-1 files import as before; a v2 file whose log does not fit writes
nothing of that conversation."""

from __future__ import annotations

import copy
import io
import json
from pathlib import Path
from typing import Any

import pytest
from helpers import new_id

import histstore
from histstore import Conversation, Entry, Message, Store
from histstore._transfer.exporting import FormatError, copy_store, export_store, import_store


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def bot(text: str) -> dict[str, Any]:
    return {"role": "assistant", "content": text}


async def fill(store: Store, cid: str) -> None:
    """A history with every kind of change record: plain writes (one with a key), a
    splice by an author, asides, a halt, turn records, a pop and a revert; it ends
    halted, with two asides and two turn records."""
    await store.write(cid, [user("q1"), bot("a1"), user("q2"), bot("a2")])
    await store.write(cid, [user("q3")], idempotency_key="k-1")
    value = await store.edit(cid)
    value.splice(0, 2, [user("summary")], by="plugin:compact")
    note = value.add_aside({"shown": "to the user only"}, after=value.entry_id(1))
    value.open_turn()
    value.end_turn("completed", usage={"input": 100, "cache_read": 20, "output": 5})
    value.push(Entry(bot("a3"), author="editor"))
    value.push(user("q4"))
    value.open_turn()
    assert value.halt("user pressed stop")
    halted = await store.commit(value)
    await store.write(cid, [bot("a4")])  # clears the halt
    await store.pop(cid)
    await store.revert(cid, halted, by="user:undo")  # halted again
    value = await store.edit(cid)
    value.replace_aside(note, ["changed"])
    value.add_aside(7)
    value.end_turn("halted")
    await store.commit(value)


async def fill_many(store: Store) -> list[str]:
    """Three conversations: the full history, plain writes only, a save and a fork."""
    rich, plain, saved = new_id("rich"), new_id("plain"), new_id("saved")
    await fill(store, rich)
    for i in range(3):
        await store.write(plain, [user(f"p{i}"), bot(f"r{i}")])
    await store.write(saved, [user("s1"), bot("s2")])
    state = await store.load(saved)
    await store.save(
        histstore.ConversationState(saved, messages=[*state.messages, Message.user("s3")])
    )
    await store.fork(rich, saved + "-fork", upto=2)
    return [rich, plain, saved, saved + "-fork"]


async def history(store: Store, cid: str) -> dict[str, Any]:
    """Everything editable history holds of a conversation, comparable with ``==``;
    checks that its change log folds to its value."""
    log = await store.changes(cid)
    value = await store.edit(cid)
    assert Conversation.fold(log) == value
    assert [c.revision for c in log] == list(range(1, value.revision + 1))
    messages = await store.read(cid)
    assert value.messages == messages
    probe = await store.edit(cid)  # the next ids, without storing anything
    return {
        "log": [c.to_record() for c in log],
        "messages": [
            (m.to_dict(), m.position, m.created_at, m.entry_id, m.author) for m in messages
        ],
        "asides": [(a.aside_id, a.after, a.value) for a in value.asides()],
        "halted": value.halted,
        "turns": [
            (t.number, t.start, t.opened_at, t.end, t.ended_at, t.usage) for t in value.turns()
        ],
        "revision": value.revision,
        "next": (probe.push(user("probe")), probe.add_aside(0)),
    }


async def histories(store: Store, ids: list[str]) -> dict[str, dict[str, Any]]:
    return {cid: await history(store, cid) for cid in ids}


async def export_lines(store: Store, **options: Any) -> list[bytes]:
    out = io.StringIO()
    await export_store(store, out, **options)
    return [line.encode() for line in out.getvalue().splitlines(keepends=True)]


def records(lines: list[bytes]) -> list[dict[str, Any]]:
    return [json.loads(line) for line in lines]


def lines_of(recs: list[dict[str, Any]]) -> list[bytes]:
    return [(json.dumps(r, ensure_ascii=False) + "\n").encode() for r in recs]


# ---------------------------------------------------------------------------- round trips


async def test_export_import_carries_editable_history(store: Store, tmp_path: Path) -> None:
    async with histstore.connect(tmp_path / "source.db") as source:
        ids = await fill_many(source)
        before = await histories(source, ids)
        lines = await export_lines(source)
    header, *_rest = records(lines)
    assert (header["format"], header["version"]) == ("histstore", 2)
    stats = await import_store(store, lines)
    assert (stats.conversations, stats.skipped) == (len(ids), 0)
    assert await histories(store, ids) == before
    rich = before[ids[0]]
    assert [m[4] for m in rich["messages"]].count("plugin:compact") == 1
    assert len(rich["asides"]) == 2
    assert len(rich["turns"]) == 2
    assert rich["halted"] == "user pressed stop"
    assert any(r["kind"] == "pop" for r in rich["log"])
    # The same file again changes nothing and counts every conversation as skipped.
    again = await import_store(store, lines, batch=2)
    assert (again.conversations, again.skipped) == (0, len(ids))
    assert await histories(store, ids) == before
    # The destination goes on like the source: a revert works there as here.
    async with histstore.connect(tmp_path / "source.db") as source:
        for cid in ids[:2]:
            assert await store.revert(cid, 1, by="undo") == await source.revert(cid, 1, by="undo")
            here, there = await history(store, cid), await history(source, cid)
            assert here["messages"] == there["messages"]
            assert (here["asides"], here["halted"], here["next"]) == (
                there["asides"],
                there["halted"],
                there["next"],
            )


async def test_an_exported_store_exports_the_same_again(store: Store) -> None:
    ids = await fill_many(store)
    lines = await export_lines(store, batch=2)  # logs longer than a batch stream in pages
    async with histstore.connect("sqlite://") as other:
        await import_store(other, lines, batch=3)
        assert await histories(other, ids) == await histories(store, ids)
        again = await export_lines(other)
    assert records(again)[1:] == records(lines)[1:]  # the header's time differs


async def test_copy_carries_editable_history_both_ways(store: Store, tmp_path: Path) -> None:
    async with histstore.connect(tmp_path / "source.db") as source:
        ids = await fill_many(source)
        before = await histories(source, ids)
        for batch in (1000, 2):
            stats = await copy_store(source, store, batch=batch)
            assert await histories(store, ids) == before
        assert (stats.conversations, stats.skipped) == (0, len(ids))
    async with histstore.connect(tmp_path / "back.db") as back:
        await copy_store(store, back, batch=3)
        assert await histories(back, ids) == before


async def test_import_through_a_scoped_view_keeps_the_history(store: Store) -> None:
    cid = new_id()
    async with histstore.connect("sqlite://") as source:
        await fill(source, cid)
        before = await history(source, cid)
        lines = await export_lines(source)
    alice = store.scoped("alice")
    for _ in range(2):
        await import_store(alice, lines)
        assert (await store.load(cid)).user == "alice"
        assert await history(alice, cid) == before
    with pytest.raises(histstore.NotFound):
        await import_store(store.scoped("bob"), lines)


async def test_a_changed_conversation_is_replaced_whole(store: Store) -> None:
    async with histstore.connect("sqlite://") as source:
        ids = await fill_many(source)
        lines = await export_lines(source)
        await import_store(store, lines)
        expected = await histories(source, ids)
    rich, plain = ids[0], ids[1]
    value = await store.edit(rich)
    value.add_aside("only here")  # asides, turns and log differ; messages are equal
    await store.commit(value)
    await store.write(plain, [user("later")], idempotency_key="later")
    value = await store.edit(plain)
    value.splice(0, 1, [user("P0")], by="moderator")  # an entry's id and author differ
    await store.commit(value)
    stats = await import_store(store, lines)
    assert (stats.conversations, stats.skipped) == (2, len(ids) - 2)
    assert await histories(store, ids) == expected
    # Idempotency rows are not carried: the key is new again.
    outcome = await store.write(plain, [user("later")], idempotency_key="later")
    assert outcome.length == len(expected[plain]["messages"]) + 1


async def test_entries_with_equal_messages_but_other_ids_are_rewritten(store: Store) -> None:
    cid = new_id()
    async with histstore.connect("sqlite://") as source:
        await source.write(cid, [user("a"), user("b")])
        lines = await export_lines(source)
    recs = records(lines)
    for r in recs:
        if r.get("type") == "message":
            r["entry_id"] += 1
        if r.get("type") == "conversation":
            r["next_entry"] += 1
    await import_store(store, lines_of(recs))
    stats = await import_store(store, lines)
    assert stats.conversations == 1
    assert [m.entry_id for m in await store.read(cid)] == [1, 2]
    await history(store, cid)


# ---------------------------------------------------------------------------- version 1


def v1_file(cid: str, n: int) -> list[bytes]:
    t = "2024-01-02T03:04:05.123456+00:00"
    recs: list[dict[str, Any]] = [
        {"format": "histstore", "version": 1, "exported_at": t},
        {
            "type": "conversation",
            "id": cid,
            "user": None,
            "system_prompt": None,
            "created_at": t,
            "updated_at": t,
            "messages": n,
            "metadata": {},
        },
    ]
    for i in range(n):
        data = user(f"m{i}")
        recs.append(
            {"type": "message", "position": i, "created_at": t, "token_count": None, "data": data}
        )
    recs.append({"type": "end", "id": cid})
    recs.append({"type": "footer", "conversations": 1, "messages": n})
    return lines_of(recs)


async def test_a_version_1_file_imports_as_before(store: Store) -> None:
    cid = new_id()
    lines = v1_file(cid, 3)
    stats = await import_store(store, lines)
    assert (stats.conversations, stats.messages) == (1, 3)
    got = await store.read(cid)
    assert [m.entry_id for m in got] == [1, 2, 3]
    assert [m.author for m in got] == [None, None, None]
    (record,) = await store.changes(cid)
    assert (record.kind, record.revision, len(record.added)) == ("import", 1, 3)
    await history(store, cid)
    again = await import_store(store, lines)
    assert (again.conversations, again.skipped) == (0, 1)
    # Editing goes on from there, and a v2 export of it imports elsewhere.
    await store.write(cid, [bot("later")])
    assert (await store.read(cid))[-1].entry_id == 4
    async with histstore.connect("sqlite://") as other:
        await import_store(other, await export_lines(store))
        assert await history(other, cid) == await history(store, cid)


async def test_a_newer_version_is_refused(store: Store) -> None:
    lines = v1_file(new_id(), 1)
    lines[0] = lines[0].replace(b'"version": 1', b'"version": 5')
    with pytest.raises(FormatError, match="version 5"):
        await import_store(store, lines)
    assert await store.conversations() == []


async def test_v2_records_in_a_version_1_file_are_unexpected(store: Store) -> None:
    async with histstore.connect("sqlite://") as source:
        await fill(source, "c")
        recs = records(await export_lines(source))
    recs[0]["version"] = 1
    with pytest.raises(FormatError, match=r"unexpected '(aside|turn|change)' record"):
        await import_store(store, lines_of(recs))


# ---------------------------------------------------------------------------- bad files


def _corrupt(recs: list[dict[str, Any]], cid: str, how: str) -> list[dict[str, Any]]:
    """``recs`` with conversation ``cid`` damaged in one way."""
    out = copy.deepcopy(recs)
    mine: list[dict[str, Any]] = []
    inside = False
    for r in out:
        if r.get("type") == "conversation":
            inside = r["id"] == cid
        if inside:
            mine.append(r)
    head = mine[0]
    messages = [r for r in mine if r["type"] == "message"]
    changes = [r for r in mine if r["type"] == "change"]
    if how == "gap":
        out.remove(changes[1])
        head["revision"] -= 1  # a gap, whatever the count says
    elif how == "count":
        head["revision"] += 1
    elif how == "duplicate id":
        messages[1]["entry_id"] = messages[0]["entry_id"]
    elif how == "id above next":
        messages[0]["entry_id"] = head["next_entry"]
    elif how == "added count":
        first = next(c for c in changes if c.get("added"))
        first["added"] -= 1
    elif how == "removed id":
        pop = next(c for c in changes if c["kind"] == "pop")
        pop["removed"][0]["id"] = messages[0]["entry_id"]  # an entry that stays
    elif how == "aside value":
        aside = next(r for r in mine if r["type"] == "aside")
        aside["value"] = "not what the log says"
    elif how == "halt":
        head["halted"] = "made up"
    elif how == "bad record":
        changes[0]["removed"] = "nonsense"
    elif how == "unknown key":
        changes[0]["surprise"] = 1
    else:
        raise AssertionError(how)
    return out


BAD = [
    ("gap", "revision 3 where 2"),
    ("count", "change records where its revision"),
    ("duplicate id", "entry id twice"),
    ("id above next", "entry id"),
    ("added count", "does not build its entries"),
    ("removed id", "does not build its entries"),
    ("aside value", "does not build its asides"),
    ("halt", "does not build its asides, halt"),
    ("bad record", "removed"),
    ("unknown key", "unknown keys"),
]


@pytest.mark.parametrize(("how", "message"), BAD, ids=[b[0] for b in BAD])
async def test_a_log_that_does_not_fit_writes_nothing_of_its_conversation(
    store: Store, how: str, message: str
) -> None:
    async with histstore.connect("sqlite://") as source:
        ids = await fill_many(source)
        good = records(await export_lines(source))
    rich = ids[0]
    bad = lines_of(_corrupt(good, rich, how))
    for batch in (1000, 2):  # shared transaction, and a conversation streamed alone
        with pytest.raises(FormatError, match=message) as caught:
            await import_store(store, bad, batch=batch)
        assert "line " in str(caught.value)
        assert "q1" not in str(caught.value)  # no message content
        assert rich not in await store.conversations()
    # Over a stored copy of the conversation, nothing of it changes either.
    await import_store(store, lines_of(good))
    before = await histories(store, ids)
    for batch in (1000, 2):
        with pytest.raises(FormatError, match=message):
            await import_store(store, bad, batch=batch)
        assert await histories(store, ids) == before


async def test_a_gap_names_the_record_and_the_end_names_the_conversation(
    store: Store,
) -> None:
    async with histstore.connect("sqlite://") as source:
        await fill(source, "c")
        recs = records(await export_lines(source))
    gap = _corrupt(recs, "c", "gap")
    line = next(i for i, r in enumerate(gap, 1) if r.get("type") == "change" and r["revision"] == 3)
    with pytest.raises(FormatError, match=rf"^line {line}: conversation 'c': a change record"):
        await import_store(store, lines_of(gap))
    fits = _corrupt(recs, "c", "added count")
    with pytest.raises(FormatError, match=r"^line 2: the change log of conversation 'c'"):
        await import_store(store, lines_of(fits))


async def test_copy_refuses_a_damaged_log_naming_the_conversation(
    store: Store, tmp_path: Path
) -> None:
    async with histstore.connect(tmp_path / "source.db") as source:
        ids = await fill_many(source)
        rich = ids[0]
        async with source.engine.begin() as conn:
            await conn.exec_driver_sql(
                f"DELETE FROM histstore_changes WHERE revision = 4 AND conversation_id = '{rich}'"
            )
        with pytest.raises(histstore.InvalidMessage, match=rich):
            await copy_store(source, store)
        assert rich not in await store.conversations()
