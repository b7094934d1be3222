"""SPEC 10: the ``histstore`` command against an SQLite file and Postgres.

Stores are seeded and inspected through the public API. Commands run in this process
(``run``: ``main(argv)`` on a thread of its own, with its standard streams captured);
a few run as a child process exactly as a user would (``run_subprocess``, the
``histstore`` script, and every command that needs a working directory or a terminal).
"""

from __future__ import annotations

import ast
import asyncio
import json
import os
import re
import sys
import textwrap
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any
from uuid import uuid4

import pytest
from cli_runner import Result, assert_one_line_error, ok, run, run_subprocess
from helpers import PYTHON, empty_pg_database, new_id, subprocess_env
from sqlalchemy import update
from waiting import clock_tick

import histstore
from histstore import ConversationState, Message, Summary, admin, turns
from histstore._storage import schema as _schema
from histstore.cli import parse_duration

T0 = datetime(2024, 1, 2, 3, 4, 5, 123456, tzinfo=timezone.utc)


async def seed(url: str) -> list[str]:
    """A store holding every kind of data, with times that differ from 'now'."""
    ids = [new_id("a"), new_id("b"), new_id("c")]
    async with histstore.connect(url, count_tokens=lambda m: len(m.to_json())) as store:
        msgs = [
            Message.system("be brief"),
            Message.user("weather in Paris?"),
            Message.assistant(
                None,
                tool_calls=[
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
                    }
                ],
            ),
            Message.tool('{"temp_c": 14}', tool_call_id="call_1"),
            Message.assistant("14 °C \u0000 \U0001f327 and rain"),
        ]
        await store.save(
            ConversationState(
                ids[0],
                user="alice",
                messages=msgs,
                system_prompt="You are terse.",
                summaries=(Summary(0, 3, "asked about Paris", token_count=4, created_at=T0),),
                metadata={"title": "Paris", "nested": {"k": [1, 2.5, None]}},
                created_at=T0,
            )
        )
        await store.write(ids[0], [{"type": "reasoning", "summary": []}])
        await store.list_append(ids[0], "steps", [{"n": 1}, "two", b"\x00\xffbytes", [3]])
        await store.list_append(ids[0], "empty-after-this", [])
        await store.write(ids[1], [{"role": "user", "content": f"m{i}"} for i in range(2500)])
        await store.scoped("bob").merge_metadata(ids[2], {"only": "metadata"})
    return ids


async def contents(url: str, ids: list[str] | None = None) -> dict[str, Any]:
    """Everything a store holds, comparable with ``==`` (times and positions included)."""
    async with histstore.connect(url) as store:
        found: dict[str, Any] = {}
        for cid in ids if ids is not None else await store.conversations():
            state = await store.load(cid)
            lists = {}
            for name in ("steps", "empty-after-this"):
                lists[name] = await store.list_load(cid, name)
            found[cid] = (
                state,
                [(m.position, m.created_at) for m in state.messages],
                lists,
            )
        return found


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return str(tmp_path / "store.db")


# ---------------------------------------------------------------------------- demo


async def test_demo_stores_a_multi_turn_conversation_with_a_tool_call(tmp_path: Path) -> None:
    result = await ok("demo", cwd=tmp_path)
    assert (tmp_path / "histstore.db").exists()
    assert "get_weather" in result.out
    async with histstore.connect(tmp_path / "histstore.db") as store:
        (cid,) = await store.conversations()
        assert cid in result.out
        messages = await store.read(cid)
    assert sum(m.role == "user" for m in messages) >= 3
    assert any(m.role == "tool" for m in messages)
    turns.validate_pairing(messages)
    assert turns.status(messages) == "closed"
    for m in messages:  # what was stored is printed, with positions and roles
        assert f"{m.position}  " in result.out
    # One compaction, shown with its author marked, then undone.
    assert "histstore.compact(store, c, summarize, keep_turns=2)" in result.out
    summary = next(line for line in result.out.splitlines() if "(by histstore:compact)" in line)
    assert summary.split()[:3] == ["1", summary.split()[1], "user"]
    assert "the compaction is undone, all 13 messages are back" in result.out
    async with histstore.connect(tmp_path / "histstore.db") as store:
        log = await store.changes(cid)
    assert [c.kind for c in log[-2:]] == ["splice", "revert"]
    assert (log[-2].author, log[-1].author) == ("histstore:compact", "demo:undo")
    assert f"histstore revert {cid} {log[-2].revision}" in result.out
    second = await ok("demo", cwd=tmp_path)
    assert "2 conversation(s)" in second.out


async def test_demo_on_every_shared_backend(shared_backend: Any) -> None:
    result = await ok("demo", "--url", shared_backend.url)
    async with shared_backend.connect() as store:
        ids = await store.conversations()
    assert len(ids) == 1
    assert ids[0] in result.out


# ---------------------------------------------------------------------------- migrate


async def test_migrate_creates_the_schema_that_other_commands_then_find() -> None:
    async with empty_pg_database() as url:
        before = await run("ls", "--url", url)
        assert_one_line_error(before, "histstore migrate")
        sql = await ok("migrate", "--sql", "--url", url)
        assert "CREATE TABLE histstore_messages" in sql.out
        assert_one_line_error(
            await run("ls", "--url", url), "histstore migrate"
        )  # --sql ran nothing
        first = await ok("migrate", "--url", url)
        assert "upgraded" in first.out
        again = await ok("migrate", "--url", url)
        assert "already" in again.out
        listed = await ok("ls", "--url", url)
        assert "no conversations" in listed.out


async def test_migrate_sql_for_sqlite_touches_no_file(tmp_path: Path) -> None:
    path = tmp_path / "x.db"
    result = await ok("migrate", "--sql", "--url", str(path))
    assert "CREATE TABLE histstore_conversations" in result.out
    assert not path.exists()


# ---------------------------------------------------------------------------- ls, show, stats


async def test_ls_filters_orders_and_limits(shared_backend: Any) -> None:
    ids = sorted(new_id("ls") for _ in range(3))
    async with shared_backend.connect() as store:
        await store.scoped("alice").write(ids[0], [Message.user("hi")])
        await store.scoped("alice").write(ids[1], [Message.user("hi"), Message.user("again")])
        await store.write(ids[2], [Message.user("x")])
    url = shared_backend.url
    everything = await ok("ls", "--url", url)
    lines = everything.out.splitlines()
    assert lines[0].split() == ["ID", "USER", "MESSAGES", "CREATED", "(UTC)", "UPDATED", "(UTC)"]
    assert [line.split()[0] for line in lines[1:]] == [ids[2], ids[1], ids[0]]  # newest first
    row = next(line for line in lines if line.startswith(ids[1])).split()
    assert row[1:3] == ["alice", "2"]
    alice = await ok("ls", "--url", url, "--user", "alice", "-q", "--order", "id", "--asc")
    assert alice.out.split() == ids[:2]
    limited = await ok("ls", "--url", url, "--limit", "1", "--order", "id", "--asc")
    assert ids[0] in limited.out
    assert ids[1] not in limited.out
    assert "1 of 3" in limited.out


async def test_show_prints_positions_roles_and_tool_calls(shared_backend: Any) -> None:
    (cid, *_rest) = await seed(shared_backend.url)
    result = await ok("show", cid, "--url", shared_backend.url)
    assert "alice" in result.out
    assert "You are terse." in result.out
    assert "steps (4 items)" in result.out
    lines = result.out.splitlines()
    tool_call = next(line for line in lines if "get_weather" in line)
    assert tool_call.split()[0] == "2"
    assert tool_call.split()[2] == "assistant"
    assert "call_1" in tool_call
    assert any(line.split()[0:3:2] == ["3", "tool"] for line in lines)
    last = await ok("show", cid, "--url", shared_backend.url, "--last", "1", "--json")
    (record,) = [json.loads(line) for line in last.out.splitlines()]
    assert record["position"] == 5
    assert record["data"] == {"type": "reasoning", "summary": []}


async def seed_edits(url: str) -> str:
    """A conversation with an editor's entries, two asides, a halt and turn records."""
    cid = new_id("ed")
    async with histstore.connect(url) as store:
        await store.write(cid, [Message.user("q1"), Message.assistant("a1"), Message.user("q2")])
        value = await store.edit(cid)
        value.splice(0, 2, [Message.user("the summary")], by="plugin:compact")
        value.add_aside({"note": "for the user"}, after=value.entry_id(0))
        value.add_aside("first of all")
        value.open_turn()
        assert value.halt("stop pressed")
        value.end_turn("halted", usage={"input": 10})
        await store.commit(value)
    return cid


async def test_show_marks_authors_and_draws_asides(shared_backend: Any) -> None:
    url = shared_backend.url
    cid = await seed_edits(url)
    result = await ok("show", cid, "--url", url)
    lines = result.out.splitlines()
    facts = {line[:13].strip(): line[13:].strip() for line in lines if line[:1].isalpha()}
    assert facts["revision"] == "7"
    assert facts["halted"] == "stop pressed"
    assert facts["turns"] == "1 recorded (newest: halted)"
    first = next(i for i, line in enumerate(lines) if line.split()[:1] == ["0"])
    assert lines[first].split()[2:] == ["user", "(by", "plugin:compact)", "the", "summary"]
    assert lines[first + 1].split() == ["aside", "#1", '{"note":', '"for', "the", 'user"}']
    assert lines[first + 2].split()[0:3:2] == ["1", "user"]
    assert "(by" not in lines[first + 2]
    before = next(i for i, line in enumerate(lines) if "first of all" in line)
    assert before < first
    assert lines[before].split()[:2] == ["aside", "#2"]
    last = await ok("show", cid, "--url", url, "--last", "1", "--json")
    (record,) = [json.loads(line) for line in last.out.splitlines()]
    assert (record["position"], record["entry_id"], record["author"]) == (1, 3, None)


def _lines_from(out: str, position: int) -> list[str]:
    """The lines of ``show``'s text before every message but the asides drawn there (the
    details), then the day's heading and the lines from the message at ``position`` on
    (every message of ``out`` is of one day)."""
    lines = out.splitlines()
    at = [i for i, line in enumerate(lines) if line.split()[:1] == [str(position)]]
    first = next(i for i, line in enumerate(lines) if line.split()[:1] == ["0"])
    head = [line for line in lines[:first] if not line.lstrip().startswith(("aside", "--"))]
    (day,) = [line for line in lines if line.lstrip().startswith("--")]
    return head + ([day, *lines[at[0] :]] if at else [])


@pytest.mark.parametrize("edited", [True, False])
async def test_show_last_prints_what_the_whole_show_ends_with(
    shared_backend: Any, edited: bool
) -> None:
    url = shared_backend.url
    cid = await seed_edits(url) if edited else (await seed(url))[0]
    async with histstore.connect(url) as store:
        await store.write(cid, [Message.user(f"more {i}") for i in range(4)])
        if edited:
            value = await store.edit(cid)
            value.add_aside("after the newest", after=value.entry_id(-1))
            value.splice(3, 1, [Message.assistant("edited in")], by="moderator")
            await store.commit(value)
        length = await store.count(cid)
    whole = (await ok("show", cid, "--url", url)).out
    for last in (0, 1, 3, length - 1, length, length + 2):
        shown = (await ok("show", cid, "--url", url, "--last", str(last))).out
        start = max(length - last, 0)
        expected = _lines_from(whole, start)
        if start > 0:
            blank = expected.index("")
            expected.insert(blank + 1, f"  ... {start:,} earlier messages (--last shows more)")
        else:
            expected = whole.splitlines()
        assert shown.splitlines() == expected, last


async def test_log_lists_change_records(shared_backend: Any) -> None:
    url = shared_backend.url
    cid = await seed_edits(url)
    result = await ok("log", cid, "--url", url)
    head, *rows = result.out.splitlines()
    assert head.split() == ["REV", "TIME", "(UTC)", "KIND", "AUTHOR", "CHANGE"]
    assert [r.split()[0] for r in rows] == [str(i) for i in range(1, 8)]
    assert rows[0].split()[3:] == ["write", "-", "+3", "at", "end"]
    assert rows[1].split()[3:] == ["splice", "plugin:compact", "-2", "+1", "at", "0"]
    assert rows[2].split()[3:] == ["aside_add", "-", "aside", "#1", "added"]
    assert rows[4].split()[3:] == ["turn_open", "-", "turn", "1", "opened"]
    assert rows[5].split()[3:] == ["halt", "-", "halted:", "stop", "pressed"]
    assert rows[6].split()[3:] == ["turn_end", "-", "turn", "1", "halted"]
    assert "q1" not in result.out  # no message content
    part = await ok("log", cid, "--url", url, "--since", "1", "--limit", "1", "--json")
    (record,) = [json.loads(line) for line in part.out.splitlines()]
    assert record["revision"] == 2
    assert (record["kind"], record["author"], record["start"]) == ("splice", "plugin:compact", 0)
    assert (record["removed"], record["added"], record["summary"]) == ([1, 2], [4], "-2 +1 at 0")
    assert "q1" not in part.out
    assert "a1" not in part.out
    none = await ok("log", cid, "--url", url, "--since", "7")
    assert "no change records after revision 7" in none.out
    assert_one_line_error(await run("log", "nope", "--url", url), "'nope'", "not found")
    assert (await run("log", cid, "--url", url, "--limit", "0")).code == 2


async def test_revert_makes_a_conversation_what_it_was(shared_backend: Any) -> None:
    url = shared_backend.url
    cid = await seed_edits(url)
    async with histstore.connect(url) as store:
        before = await store.read(cid)
    result = await ok("revert", cid, "1", "--url", url)
    assert result.out.strip() == f"reverted {cid!r} to revision 1: now at revision 8"
    again = await ok("revert", cid, "1", "--url", url, "--by", "ops:alice")
    assert "nothing changed (revision 8)" in again.out
    async with histstore.connect(url) as store:
        got = await store.read(cid)
        assert [m.content for m in got] == ["q1", "a1", "q2"]
        assert [m.entry_id for m in got] == [1, 2, 3]
        value = await store.edit(cid)
        assert value.asides() == []
        assert value.halted is None
        (last,) = await store.changes(cid, since=7)
        assert (last.kind, last.author) == ("revert", "cli:revert")
    back = await ok("revert", cid, "7", "--url", url, "--by", "ops:alice")
    assert "now at revision 9" in back.out
    async with histstore.connect(url) as store:
        assert await store.read(cid) == before
        assert (await store.changes(cid, since=8))[0].author == "ops:alice"
    assert_one_line_error(await run("revert", cid, "99", "--url", url), "no revision 99")
    assert_one_line_error(await run("revert", "nope", "0", "--url", url), "'nope'", "not found")
    assert_one_line_error(await run("revert", cid, "1", "--by", "", "--url", url), "by")
    assert (await run("revert", cid, "x", "--url", url)).code == 2


async def test_stats_counts_what_the_store_holds(shared_backend: Any) -> None:
    await seed(shared_backend.url)
    result = await ok("stats", "--url", shared_backend.url)
    facts = {line[:17].strip(): line[17:].strip() for line in result.out.splitlines()}
    assert facts["conversations"].startswith("3 ")
    assert facts["messages"].startswith("2,506 ")
    assert facts["summaries"] == "1"
    assert facts["list items"] == "4"


# ---------------------------------------------------------------------------- export, import


async def test_export_import_round_trip_into_an_empty_database(
    shared_backend: Any, tmp_path: Path
) -> None:
    ids = await seed(shared_backend.url)
    before = await contents(shared_backend.url)
    dump = tmp_path / "dump.jsonl"
    await ok("export", "--url", shared_backend.url, "-o", str(dump))
    header, *records, footer = [json.loads(line) for line in dump.read_text().splitlines()]
    assert (header["format"], header["version"]) == ("histstore", 2)
    assert footer == {"type": "footer", "conversations": 3, "messages": 2506}
    assert sum(r["type"] == "conversation" for r in records) == 3
    target = str(tmp_path / "target.db")
    imported = await ok("import", str(dump), "--url", target)
    assert "imported 3 conversations" in imported.out
    assert await contents(target) == before
    again = await ok("import", str(dump), "--url", target)
    assert "3 already there unchanged" in again.out
    assert await contents(target) == before
    # Selected ids, through a pipe, into a fresh Postgres database.
    async with empty_pg_database() as pg:
        await ok("migrate", "--url", pg)
        part = await ok("export", ids[0], ids[2], "--url", shared_backend.url)
        await ok("import", "-", "--url", pg, stdin=part.out.encode())
        assert await contents(pg) == {k: v for k, v in before.items() if k != ids[1]}
    bobs = await ok("export", "--user", "bob", "--url", shared_backend.url)
    records = [json.loads(line) for line in bobs.out.splitlines()]
    assert [r["id"] for r in records if r.get("type") == "conversation"] == [ids[2]]


async def test_import_replaces_a_changed_conversation(sqlite_url: str, tmp_path: Path) -> None:
    ids = await seed(sqlite_url)
    before = await contents(sqlite_url)
    dump = tmp_path / "dump.jsonl"
    await ok("export", "--url", sqlite_url, "-o", str(dump))
    async with histstore.connect(sqlite_url) as store:
        await store.write(ids[0], [Message.user("later")])
        await store.list_append(ids[0], "steps", ["later"])
        await store.merge_metadata(ids[0], {"title": None})
    result = await ok("import", str(dump), "--url", sqlite_url)
    assert "imported 1 conversations" in result.out
    assert "2 already there unchanged" in result.out
    assert await contents(sqlite_url) == before


async def test_import_rejects_bad_files_with_one_line(sqlite_url: str, tmp_path: Path) -> None:
    ids = await seed(sqlite_url)
    dump = tmp_path / "dump.jsonl"
    await ok("export", "--url", sqlite_url, "-o", str(dump))
    lines = dump.read_text().splitlines(keepends=True)
    target = str(tmp_path / "t.db")

    not_export = tmp_path / "x.jsonl"
    not_export.write_text('{"hello": 1}\n')
    assert_one_line_error(await run("import", str(not_export), "--url", target), "line 1")

    newer = tmp_path / "newer.jsonl"
    newer.write_text(json.dumps({"format": "histstore", "version": 99}) + "\n")
    assert_one_line_error(await run("import", str(newer), "--url", target), "version 99")

    # Cut inside the second conversation: the first is imported, the rest is not.
    second = next(i for i, line in enumerate(lines) if ids[1] in line and '"conversation"' in line)
    cut = tmp_path / "cut.jsonl"
    cut.write_text("".join(lines[: second + 10]))
    result = await run("import", str(cut), "--url", target, "--batch", "1")
    assert_one_line_error(result, "truncated")
    async with histstore.connect(target) as store:
        assert await store.conversations() == [ids[0]]

    bad = tmp_path / "bad.jsonl"
    bad.write_text("".join(lines).replace('"role":"tool"', '"role":7', 1))
    fresh = str(tmp_path / "fresh.db")
    assert_one_line_error(await run("import", str(bad), "--url", fresh), "line ", "role")

    missing = await run("import", str(tmp_path / "nope.jsonl"), "--url", target)
    assert_one_line_error(missing, "nope.jsonl")

    # Values a store refuses are refused in a file too (the test file's messages are
    # spliced in as raw JSON text, so they reach the parser as written).
    for raw in ('"\\ud800"', "NaN", "1e400"):
        line = lines[2].replace('"content":"be brief"', f'"content":{raw}', 1)
        assert line != lines[2]
        odd = tmp_path / "odd.jsonl"
        odd.write_text("".join([*lines[:2], line, *lines[3:]]))
        result = await run("import", str(odd), "--url", str(tmp_path / f"{uuid4()}.db"))
        assert_one_line_error(result, "line 3", "not storable")


async def test_export_of_missing_ids_fails_before_writing(sqlite_url: str) -> None:
    await seed(sqlite_url)
    result = await run("export", "no-such-conversation", "--url", sqlite_url)
    assert_one_line_error(result, "no-such-conversation")
    assert result.out == ""


# ---------------------------------------------------------------------------- copy


async def test_copy_sqlite_to_postgres_and_back_is_equal(tmp_path: Path) -> None:
    src = str(tmp_path / "src.db")
    await seed(src)
    before = await contents(src)
    async with empty_pg_database() as pg:
        unmigrated = await run("copy", src, pg)
        assert_one_line_error(unmigrated, "histstore migrate")
        await ok("migrate", "--url", pg)
        first = await ok("copy", src, pg, "--batch", "100")
        assert "copied 3 conversations" in first.out
        assert await contents(pg) == before
        rerun = await ok("copy", src, pg)
        assert "copied 0 conversations" in rerun.out
        assert "3 already there unchanged" in rerun.out
        back = str(tmp_path / "back.db")
        await ok("copy", pg, back)
        assert await contents(back) == before


async def test_copy_again_brings_changes_over(shared_backend: Any, tmp_path: Path) -> None:
    src = str(tmp_path / "src.db")
    ids = await seed(src)
    await ok("copy", src, shared_backend.url)
    async with histstore.connect(src) as store:
        await store.write(ids[1], [Message.user("one more")])
        await store.add_summary(ids[1], Summary(0, 10, "the start"))
    result = await ok("copy", src, shared_backend.url)
    assert "copied 1 conversations" in result.out
    assert await contents(shared_backend.url, ids) == await contents(src)


async def test_copy_errors_name_the_problem(sqlite_url: str, tmp_path: Path) -> None:
    assert_one_line_error(await run("copy", sqlite_url, sqlite_url), "same database")
    missing = str(tmp_path / "missing.db")
    assert_one_line_error(await run("copy", missing, sqlite_url), "no database at")
    assert_one_line_error(await run("copy", sqlite_url, "mysql://h/db"), "mysql")


# ---------------------------------------------------------------------------- fork, clear, purge


async def test_fork_clear_and_purge(shared_backend: Any) -> None:
    url = shared_backend.url
    (cid, long_id, _meta) = await seed(url)
    target = new_id("fork")
    result = await ok("fork", cid, target, "--upto", "2", "--url", url)
    assert "2 messages" in result.out
    async with shared_backend.connect() as store:
        original = await store.read(cid)
        assert await store.read(target) == original[:2]
        assert await store.list_load(target, "steps") == await store.list_load(cid, "steps")
    assert_one_line_error(await run("fork", cid, target, "--url", url), target)

    cleared = await ok("clear", long_id, "--url", url, "--yes")
    assert "2,500 messages" in cleared.out
    async with shared_backend.connect() as store:
        assert not await store.exists(long_id)
    missing = await run("clear", long_id, "--url", url, "--yes")
    assert_one_line_error(missing, long_id, "not found")

    dry = await ok("purge", "--idle", "30d", "--dry-run", "--url", url)
    assert dry.out == ""
    assert dry.err.startswith("0 conversations")
    await asyncio.sleep(1.1)
    purged = await ok("purge", "--idle", "1s", "--yes", "--url", url)
    assert purged.out.startswith("purged 3 conversations")
    async with shared_backend.connect() as store:
        assert await store.conversations() == []


def test_parse_duration() -> None:
    assert parse_duration("90m") == timedelta(minutes=90)
    assert parse_duration("12h") == timedelta(hours=12)
    assert parse_duration("30d") == timedelta(days=30)
    assert parse_duration("1d12h") == timedelta(days=1, hours=12)
    assert parse_duration("2w") == timedelta(weeks=2)
    for bad in ("", "30", "d", "3x", "1.5h", "-1d", "1d 2h"):
        with pytest.raises(ValueError, match="not a duration"):
            parse_duration(bad)


async def test_bad_duration_is_a_usage_error(sqlite_url: str) -> None:
    result = await run("purge", "--idle", "soon", "--url", sqlite_url)
    assert result.code == 2
    assert "not a duration" in result.err
    assert "Traceback" not in result.err


# ---------------------------------------------------------------------------- operators (issue 9)


async def test_ls_json_lists_particulars(shared_backend: Any) -> None:
    ids = await seed(shared_backend.url)
    result = await ok("ls", "--json", "--order", "id", "--asc", "--url", shared_backend.url)
    records = [json.loads(line) for line in result.out.splitlines()]
    assert [r["id"] for r in records] == sorted(ids)
    first = next(r for r in records if r["id"] == ids[0])
    assert first["user"] == "alice"
    assert first["length"] == 6
    assert first["system_prompt"] == "You are terse."
    assert first["lists"] == {"empty-after-this": 0, "steps": 4}
    assert first["summaries"] == 1
    assert first["metadata_keys"] == ["nested", "title"]
    assert datetime.fromisoformat(first["created_at"]) == T0
    bob = next(r for r in records if r["id"] == ids[2])
    assert (bob["user"], bob["length"], bob["metadata_keys"]) == ("bob", 0, ["only"])
    limited = await ok("ls", "--json", "--limit", "1", "--user", "bob", "--url", shared_backend.url)
    assert [json.loads(line)["id"] for line in limited.out.splitlines()] == [ids[2]]


async def test_ls_since_until_and_metadata_filters(shared_backend: Any) -> None:
    url = shared_backend.url
    old, new = new_id("old"), new_id("new")
    async with shared_backend.connect() as store:
        await store.merge_metadata(old, {"tier": 1, "team": "blue", "tags": ["a", "b"]})
        between = await clock_tick()  # after old's stamp
        await clock_tick()  # new's stamp is after between
        await store.merge_metadata(new, {"tier": "1", "team": "blue"})

    async def listed(*args: str) -> list[str]:
        result = await ok("ls", "-q", "--order", "updated", "--asc", "--url", url, *args)
        return result.out.split()

    assert await listed() == [old, new]
    assert await listed("--since", between.isoformat()) == [new]
    assert await listed("--until", between.isoformat()) == [old]
    zulu = between.astimezone(timezone.utc).replace(tzinfo=None).isoformat() + "Z"
    assert await listed("--since", zulu) == [new]
    assert await listed("--since", "2000-01-01", "--until", "1d") == []
    assert await listed("--since", "1h") == [old, new]
    assert await listed("--metadata", "tier=1") == [old]  # JSON 1, not the string "1"
    assert await listed("--metadata", 'tier="1"') == [new]
    assert await listed("--metadata", "team=blue") == [old, new]  # not JSON: a string
    assert await listed("--metadata", "team=blue", "--metadata", "tier=1") == [old]
    assert await listed("--metadata", 'tags=["a","b"]') == [old]
    assert await listed("--metadata", "team=red") == []
    assert await listed("--metadata", "team=blue", "--since", between.isoformat()) == [new]
    table = await ok("ls", "--url", url, "--metadata", "team=blue", "--limit", "1")
    assert "1 of 2 conversations shown" in table.out
    for bad in (["--since", "yesterday"], ["--until", "2024-13-01"], ["--metadata", "novalue"]):
        result = await run("ls", "--url", url, *bad)
        assert result.code == 2, result.err
        assert "Traceback" not in result.err


async def test_stats_json(shared_backend: Any) -> None:
    await seed(shared_backend.url)
    result = await ok("stats", "--json", "--url", shared_backend.url)
    figures = json.loads(result.out)
    expected = {
        "conversations": 3,
        "messages": 2506,
        "longest": 2500,
        "users": 2,
        "summaries": 1,
        "metadata_entries": 3,
        "lists": 2,
        "list_items": 4,
        "user": None,
    }
    assert {k: figures[k] for k in expected} == expected
    assert figures["schema_revision"]
    assert figures["database"]
    assert datetime.fromisoformat(figures["first_created"]) == T0
    assert datetime.fromisoformat(figures["newest_change"]) > T0
    alice = json.loads(
        (await ok("stats", "--json", "--user", "alice", "--url", shared_backend.url)).out
    )
    assert (alice["conversations"], alice["messages"], alice["list_items"]) == (1, 6, 4)
    assert (alice["users"], alice["metadata_entries"], alice["user"]) == (1, 2, "alice")


async def test_stats_names_the_revision_of_a_schema_of_its_own(pg_url: str) -> None:
    """``stats --schema`` reads the version table where the tables are (issue 38)."""
    del pg_url  # only for its skip-or-fail check of the server
    async with empty_pg_database() as url:
        placed = ("--url", url, "--schema", "placed")
        await ok("migrate", *placed)
        newest = (await admin.migration_status(url, schema="placed")).head
        facts = {
            line[:17].strip(): line[17:].strip()
            for line in (await ok("stats", *placed)).out.splitlines()
        }
        assert facts["schema"] == f"revision {newest} (newest)"
        figures = json.loads((await ok("stats", "--json", *placed)).out)
        assert figures["schema_revision"] == newest


async def test_clear_several_ids_or_a_users_conversations(shared_backend: Any) -> None:
    url = shared_backend.url
    ids = await seed(url)
    extra = [new_id("x"), new_id("y")]
    async with shared_backend.connect() as store:
        for cid in extra:
            await store.scoped("carol").write(cid, [Message.user("hi")])

    async def present() -> set[str]:
        async with shared_backend.connect() as store:
            return set(await store.conversations())

    everything = set(ids) | set(extra)
    # Without a terminal, only --yes deletes several; nothing is deleted otherwise.
    refused = await run("clear", extra[0], ids[1], "--url", url)
    assert refused.code == 1
    assert_one_line_error(refused, "--yes")
    assert await present() == everything
    # One unknown id: an error, and none of the others is deleted.
    missing = await run("clear", extra[0], "nope", "--yes", "--url", url)
    assert_one_line_error(missing, "'nope'", "not found")
    assert await present() == everything
    # --user with ids: only that user's.
    foreign = await run("clear", ids[0], "--user", "carol", "--yes", "--url", url)
    assert_one_line_error(foreign, ids[0], "not found")
    both = await ok("clear", ids[0], ids[2], ids[0], "--yes", "--url", url)
    assert f"cleared {ids[0]!r} (6 messages)" in both.out
    assert f"cleared {ids[2]!r} (0 messages)" in both.out
    assert await present() == {ids[1], *extra}
    carol = await ok("clear", "--user", "carol", "--yes", "--url", url)
    assert "cleared 2 conversations of user 'carol' (2 messages)" in carol.out
    assert await present() == {ids[1]}
    nobody = await ok("clear", "--user", "carol", "--url", url)
    assert "no conversations" in nobody.out
    usage = await run("clear", "--yes", "--url", url)
    assert usage.code == 2
    assert "--user" in usage.err


async def run_on_terminal(*args: str, answer: bytes) -> Result:
    """Run the command with a pseudo-terminal as stdin, typing ``answer`` into it."""
    import pty

    leader, follower = pty.openpty()
    env = subprocess_env()
    env["NO_COLOR"] = "1"
    try:
        proc = await asyncio.create_subprocess_exec(
            PYTHON,
            "-m",
            "histstore",
            *args,
            env=env,
            stdin=follower,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        os.write(leader, answer)
        out, err = await asyncio.wait_for(proc.communicate(), timeout=120)
    finally:
        os.close(follower)
        os.close(leader)
    assert proc.returncode is not None
    return Result(proc.returncode, out.decode(), err.decode())


async def test_clear_asks_on_a_terminal(shared_backend: Any) -> None:
    url = shared_backend.url
    cid, other = new_id("ask"), new_id("ask")
    async with shared_backend.connect() as store:
        await store.write(cid, [Message.user("hi"), Message.user("again")])
        await store.write(other, [Message.user("hi")])
    declined = await run_on_terminal("clear", cid, other, "--url", url, answer=b"n\n")
    assert declined.code == 1
    assert "delete 2 conversations (3 messages)? [y/N]" in declined.err
    assert "nothing deleted" in declined.err
    async with shared_backend.connect() as store:
        assert await store.exists(cid)
    accepted = await run_on_terminal("clear", cid, other, "--url", url, answer=b"y\n")
    assert accepted.code == 0, accepted.err
    assert f"cleared {cid!r}" in accepted.out
    async with shared_backend.connect() as store:
        assert not await store.exists(cid)


async def seed_idle(url: str, tmp_path: Path) -> list[str]:
    """``seed``'s conversations, imported with their last change on 2024-01-03."""
    scratch = str(tmp_path / f"{uuid4()}.db")
    ids = await seed(scratch)
    lines = []
    for line in (await ok("export", "--url", scratch)).out.splitlines():
        record = json.loads(line)
        if record.get("type") == "conversation":
            record["updated_at"] = "2024-01-03T00:00:00.000000+00:00"
        lines.append(json.dumps(record) + "\n")
    await ok("import", "-", "--url", url, stdin="".join(lines).encode())
    return ids


async def test_purge_dry_run_lists_and_user_scopes(shared_backend: Any, tmp_path: Path) -> None:
    url = shared_backend.url
    ids = await seed_idle(url, tmp_path)
    recent = new_id("recent")
    async with shared_backend.connect() as store:
        await store.scoped("alice").write(recent, [Message.user("hi")])
    dry = await ok("purge", "--idle", "30d", "--dry-run", "--url", url)
    assert dry.out.split() == sorted(ids)
    assert "3 conversations idle for more than 30d would be purged" in dry.err
    alice = await ok("purge", "--idle", "30d", "--dry-run", "--user", "alice", "--url", url)
    assert alice.out.split() == [ids[0]]
    async with shared_backend.connect() as store:
        assert set(await store.conversations()) == {*ids, recent}
    bob = await ok("purge", "--idle", "30d", "--user", "bob", "--yes", "--url", url)
    assert bob.out.startswith("purged 1 conversations of user 'bob'")
    async with shared_backend.connect() as store:
        assert set(await store.conversations()) == {ids[0], ids[1], recent}
    rest = await ok("purge", "--idle", "30d", "--yes", "--url", url)
    assert rest.out.startswith("purged 2 conversations")
    async with shared_backend.connect() as store:
        assert await store.conversations() == [recent]


async def test_export_with_user_exports_only_that_users(shared_backend: Any) -> None:
    url = shared_backend.url
    ids = await seed(url)
    foreign = await run("export", ids[0], "--user", "bob", "--url", url)
    assert_one_line_error(foreign, ids[0], "not found")
    assert foreign.out == ""
    mixed = await run("export", ids[2], ids[0], "--user", "bob", "--url", url)
    assert_one_line_error(mixed, ids[0], "not found")
    assert mixed.out == ""
    own = await ok("export", ids[2], "--user", "bob", "--url", url)
    records = [json.loads(line) for line in own.out.splitlines()]
    assert [r["id"] for r in records if r.get("type") == "conversation"] == [ids[2]]
    alices = await ok("export", "--user", "alice", "--url", url)
    records = [json.loads(line) for line in alices.out.splitlines()]
    assert [r["id"] for r in records if r.get("type") == "conversation"] == [ids[0]]


async def test_show_renders_tool_calls_of_every_shape(shared_backend: Any) -> None:
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

    from histstore.integrations.langchain import to_stored

    lc_call = {"name": "get_weather", "args": {"city": "Paris"}, "id": "call_lc"}
    messages: list[dict[str, Any]] = [
        to_stored(HumanMessage("weather?")),
        to_stored(AIMessage("", tool_calls=[lc_call])),
        to_stored(ToolMessage("14 C", tool_call_id="call_lc")),
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_cc",
                    "type": "function",
                    "function": {"name": "get_time", "arguments": '{"tz": "UTC"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_cc", "content": "12:00"},
        {"type": "function_call", "call_id": "fc_1", "name": "lookup", "arguments": '{"q": 1}'},
        {"type": "function_call_output", "call_id": "fc_1", "output": "found"},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Let me check"},
                {"type": "tool_use", "id": "toolu_1", "name": "search", "input": {"q": "tokyo"}},
            ],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"}],
        },
    ]
    cid = new_id("shapes")
    async with shared_backend.connect() as store:
        await store.write(cid, messages)
    result = await ok("show", cid, "--url", shared_backend.url)
    rows = {}
    for line in result.out.splitlines():
        parts = line.split(maxsplit=3)
        if len(parts) == 4 and parts[0].isdigit():
            rows[int(parts[0])] = (parts[2], parts[3])
    assert rows[1] == ("assistant", '-> get_weather(city="Paris")  [call_lc]')
    assert rows[2] == ("tool", "<- [call_lc] 14 C")
    assert rows[3] == ("assistant", '-> get_time(tz="UTC")  [call_cc]')
    assert rows[4] == ("tool", "<- [call_cc] 12:00")
    assert rows[5] == ("function_call", "-> lookup(q=1)  [fc_1]")
    assert rows[6] == ("function_call_output", "<- [fc_1] found")
    assert rows[7] == ("assistant", "Let me check")
    assert '-> search(q="tokyo")  [toolu_1]' in result.out
    assert rows[8] == ("user", "<- [toolu_1] sunny")
    assert "None(" not in result.out
    assert "null" not in result.out


# ---------------------------------------------------------------------------- errors


async def test_user_mistakes_are_one_line_errors(tmp_path: Path, pg_url: str) -> None:
    db = str(tmp_path / "s.db")
    await ok("migrate", "--url", db)
    assert_one_line_error(await run("show", "nope", "--url", db), "'nope'", "not found")
    assert_one_line_error(await run("ls", "--url", "mysql://u@h/db"), "mysql")
    assert_one_line_error(await run("ls", "--url", "postgresql://u@127.0.0.1:1/db"), "cannot open")
    assert_one_line_error(await run("ls", "--url", str(tmp_path / "none.db")), "no database at")
    assert not (tmp_path / "none.db").exists()
    assert_one_line_error(await run("show", " padded", "--url", db), "whitespace")
    async with empty_pg_database() as empty:
        for args in (["ls"], ["show", "x"], ["export"], ["stats"], ["purge", "--idle", "1d"]):
            assert_one_line_error(await run(*args, "--url", empty), "histstore migrate --url")


# ---------------------------------------------------------------------------- layering


def test_the_command_line_uses_only_public_names() -> None:
    """The CLI holds no SQL: no SQLAlchemy, no private histstore module (issue 9)."""
    public = {
        "histstore",
        "histstore.admin",
        "histstore.checkpoints",
        "histstore.envelopes",
        "histstore.turns",
        "histstore.middleware",
        "histstore.integrations.langgraph",  # decodes threads (threads show, export)
    }
    package = Path(histstore.__file__).parent / "cli"
    files = sorted(package.glob("*.py"))
    assert {f.name for f in files} >= {"__init__.py", "_parse.py", "_commands.py", "_render.py"}
    for file in files:
        source = file.read_text()
        assert len(source.splitlines()) <= 420, file.name
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
                if node.module == "histstore":
                    names += [f"histstore.{a.name}" for a in node.names if a.name.startswith("_")]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top == "histstore":
                    assert name in public, (file.name, name)
                else:
                    assert top in sys.stdlib_module_names, (file.name, name)


# ---------------------------------------------------------------------------- memory


RSS = textwrap.dedent(
    """
    import os, subprocess, sys
    proc = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL)
    _pid, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    print(proc.returncode, usage.ru_maxrss)
    """
)


async def export_peak_rss(url: str, out: Path) -> int:
    """Peak RSS (KiB) of one ``histstore export`` process writing to ``out``."""
    env = subprocess_env()
    cmd = [PYTHON, "-m", "histstore", "export", "--url", url, "-o", str(out)]
    proc = await asyncio.create_subprocess_exec(
        PYTHON, "-c", RSS, *cmd, env=env, stdout=asyncio.subprocess.PIPE
    )
    stdout, _ = await proc.communicate()
    code, rss = stdout.split()
    assert int(code) == 0
    return int(rss)


async def fill(url: str, conversations: int, per_conversation: int) -> None:
    body = "x" * 400
    async with histstore.connect(url, durability="process") as store:
        for c in range(conversations):
            cid = f"big-{c:03d}"
            for start in range(0, per_conversation, 5000):
                n = min(5000, per_conversation - start)
                batch = [{"role": "user", "content": f"{start + i} {body}"} for i in range(n)]
                await store.write(cid, batch)


@pytest.mark.sqlite_file
async def test_export_memory_stays_flat(tmp_path: Path) -> None:
    small, large = str(tmp_path / "small.db"), str(tmp_path / "large.db")
    await fill(small, 2, 5_000)  # 10k messages
    await fill(large, 2, 40_000)  # 80k messages, ~36 MB of JSON: held whole, RSS would double
    rss_small = await export_peak_rss(small, tmp_path / "small.jsonl")
    rss_large = await export_peak_rss(large, tmp_path / "large.jsonl")
    assert (tmp_path / "large.jsonl").stat().st_size > 32_000_000
    assert rss_large / rss_small < 1.5, (rss_small, rss_large)


@pytest.mark.postgres
async def test_export_memory_stays_flat_on_postgres(tmp_path: Path, pg_url: str) -> None:
    del pg_url  # only for its skip-or-fail check of the server
    async with empty_pg_database() as small, empty_pg_database() as large:
        for url, n in ((small, 5_000), (large, 40_000)):
            store = await histstore.connect(url, migrate=True)
            await store.close()
            await fill(url, 2, n)
        rss_small = await export_peak_rss(small, tmp_path / "small.jsonl")
        rss_large = await export_peak_rss(large, tmp_path / "large.jsonl")
    assert rss_large / rss_small < 1.5, (rss_small, rss_large)


# ---------------------------------------------------------------------------- search

HIT_LINE = re.compile(r"^(\S+)  #(\d+)  (\S+)  score (\S+)$")
FILLER = " ".join(f"filler{i}" for i in range(40))


def printed_hits(out: str) -> dict[tuple[str, int], tuple[str, str]]:
    """(conversation, position) -> (role, snippet line) of each hit ``search`` printed."""
    lines = out.splitlines()
    found = {}
    for i, line in enumerate(lines):
        if m := HIT_LINE.match(line):
            assert lines[i + 1].startswith("    ")
            found[m[1], int(m[2])] = (m[3], lines[i + 1][4:])
    return found


async def seed_search(url: str) -> tuple[str, str, str]:
    """alice's weather talk (text, tool-call arguments, a tool result), bob's trip, and
    an ownerless message with the word in the middle of a long text."""
    a, b, c = new_id("sa"), new_id("sb"), new_id("sc")
    call = {"id": "call_1", "type": "function"}
    call["function"] = {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    async with histstore.connect(url) as store:
        await store.scoped("alice").write(
            a,
            [
                Message.user("What is the weather in Paris today?"),
                Message.assistant(None, tool_calls=[call]),
                Message.tool('{"temp_c": 14, "sky": "light rain"}', tool_call_id="call_1"),
                Message.assistant("Paris: 14 C with light   rain."),
            ],
        )
        await store.scoped("bob").write(
            b, [Message.user("Paris or Rome for a weekend?"), Message.assistant("Rome.")]
        )
        await store.write(c, [Message.user(f"{FILLER} PARIS {FILLER}")])
    return a, b, c


async def test_search_prints_hits_scoped_and_limited(shared_backend: Any) -> None:
    url = shared_backend.url
    a, b, c = await seed_search(url)
    result = await ok("search", "paris", "--url", url)
    assert "\033[" not in result.out
    hits = printed_hits(result.out)
    assert set(hits) == {(a, 0), (a, 1), (a, 3), (b, 0), (c, 0)}
    assert hits[a, 0] == ("user", "What is the weather in Paris today?")
    assert hits[a, 1] == ("assistant", "Paris")  # the tool call's arguments
    assert hits[a, 3] == ("assistant", "Paris: 14 C with light rain.")
    long = hits[c, 0][1]
    assert long.startswith("...")
    assert long.endswith("...")
    assert "PARIS" in long
    assert 60 <= len(long) <= 130
    assert "hits shown" not in result.out

    async def found(*args: str) -> set[tuple[str, int]]:
        return set(printed_hits((await ok("search", *args, "--url", url)).out))

    assert await found("paris", "--conversation", a) == {(a, 0), (a, 1), (a, 3)}
    assert await found("PARIS", "--user", "bob") == {(b, 0)}
    assert await found('"light rain"', "paris") == {(a, 3)}  # arguments are joined
    nothing = await ok("search", "paris", "--user", "bob", "--conversation", a, "--url", url)
    assert printed_hits(nothing.out) == {}
    assert "no messages found" in nothing.out
    limited = await ok("search", "paris", "--limit", "2", "--url", url)
    assert len(printed_hits(limited.out)) == 2
    assert "the best 2 hits shown" in limited.out


async def test_search_json_and_errors(shared_backend: Any) -> None:
    url = shared_backend.url
    a, b, _c = await seed_search(url)
    result = await ok("search", "paris", "--json", "--user", "alice", "--url", url)
    records = [json.loads(line) for line in result.out.splitlines()]
    assert {(r["conversation"], r["position"]) for r in records} == {(a, 0), (a, 1), (a, 3)}
    async with histstore.connect(url) as store:
        stored = await store.read(a)
    for r in records:
        assert set(r) == {"conversation", "position", "score", "message"}
        assert r["message"] == stored[r["position"]].to_dict()
    scores = [r["score"] for r in records]
    assert scores == sorted(scores, reverse=True)
    one = await ok("search", "rome", "--json", "--limit", "1", "--url", url)
    (record,) = [json.loads(line) for line in one.out.splitlines()]
    assert record["conversation"] == b
    for bad in ('"unclosed', " "):
        failed = await run("search", bad, "--url", url)
        assert failed.code == 1
        assert_one_line_error(failed)
        assert failed.out == ""
    usage = await run("search", "paris", "--limit", "0", "--url", url)
    assert usage.code == 2


async def test_search_marks_matches_when_colored(shared_backend: Any) -> None:
    url = shared_backend.url
    a, _b, c = await seed_search(url)
    mark = "\033[1;7m{}\033[0m".format
    phrase = await ok(
        "search", '"light rain"', "--color", "always", "--conversation", a, "--url", url
    )
    assert f"Paris: 14 C with {mark('light rain')}." in phrase.out
    words = await ok("search", "paris", "--color", "always", "--conversation", c, "--url", url)
    assert mark("PARIS") in words.out
    plain = await ok("search", "paris", "--color", "never", "--conversation", c, "--url", url)
    assert "\033[" not in plain.out
    assert re.sub(r"\033\[[0-9;]*m", "", words.out) == plain.out  # the same text, unmarked


def test_search_snippet_window() -> None:
    from histstore.cli._render import query_pattern, snippet

    pattern = query_pattern('rain "light  RAIN" paris')
    assert pattern is not None
    text = f"{FILLER}\n\nIn Paris: light rain,\tthen more rain. {FILLER}"
    line, spans = snippet(text, pattern)
    assert line.startswith("...")
    assert line.endswith("...")
    assert len(line) <= 106
    assert [line[lo:hi] for lo, hi in spans] == ["Paris", "light rain", "rain"]
    assert line.index("Paris") > 20  # context before the first match
    assert snippet("short Paris text", pattern) == ("short Paris text", [(6, 11)])
    assert snippet("paris_x xparis 2paris", pattern) == ("paris_x xparis 2paris", [(0, 5)])
    none, spans = snippet(FILLER, pattern)
    assert none.startswith("filler0 ")
    assert none.endswith("...")
    assert spans == []
    assert query_pattern('" " ...') is None


async def test_reindex_fills_the_search_text(shared_backend: Any) -> None:
    url = shared_backend.url
    a, _b, _c = await seed_search(url)
    async with histstore.connect(url) as store, store.engine.begin() as conn:
        # As ``migrate --sql`` leaves them: no text (see test_search's reindex test).
        await conn.execute(update(_schema.messages).values(search_text=""))
    assert printed_hits((await ok("search", "paris", "--url", url)).out) == {}
    mine = await ok("reindex", "--user", "alice", "--url", url)
    assert mine.out.startswith("reindexed 4 messages (")  # alice's: the messages of a
    assert {c for c, _ in printed_hits((await ok("search", "paris", "--url", url)).out)} == {a}
    rest = await ok("reindex", "--url", url)
    assert rest.out.startswith("reindexed 3 messages (")  # bob's two, and c
    assert len(printed_hits((await ok("search", "paris", "--url", url)).out)) == 5


# ---------------------------------------------------------------------------- through PgBouncer


@pytest.mark.postgres_pgbouncer
async def test_commands_through_a_transaction_pooler(pgbouncer_url: str, tmp_path: Path) -> None:
    """Command after command through PgBouncer in transaction mode: each process starts
    its own statement numbering on server sessions the previous ones used."""
    url, schema = pgbouncer_url, f"cli_{uuid4().hex[:8]}"
    pooled = ("--url", url, "--schema", schema, "--pooler", "transaction")
    migrated = await ok("migrate", *pooled)
    assert "upgraded" in migrated.out
    assert "already at the newest" in (await ok("migrate", *pooled)).out
    async with histstore.connect(url, schema=schema, pooler="transaction") as store:
        a, b = new_id("a"), new_id("b")
        await store.write(a, [{"role": "user", "content": "bonjour paris"}])
        await store.write(b, [{"role": "user", "content": f"m{i}"} for i in range(5)])
    assert {a, b} <= set((await ok("ls", *pooled, "-q")).out.split())
    assert "bonjour paris" in (await ok("show", a, *pooled)).out
    stats = (await ok("stats", *pooled)).out.splitlines()
    assert {line[:17].strip(): line[17:].strip() for line in stats}["messages"].startswith("6 ")
    assert "paris" in (await ok("search", "paris", *pooled)).out
    dump = tmp_path / "dump.jsonl"
    await ok("export", *pooled, "-o", str(dump))
    other = f"cli_{uuid4().hex[:8]}"
    again = ("--url", url, "--schema", other, "--pooler", "transaction")
    await ok("migrate", *again)
    assert "imported 2 conversations" in (await ok("import", str(dump), *again)).out
    await ok("clear", a, *again)
    copied = await ok(
        "copy", url, str(tmp_path / "copy.db"), "--source-schema", schema, "--pooler", "transaction"
    )
    assert "2" in copied.out
    async with histstore.connect(url, schema=other, pooler="transaction") as store:
        assert not await store.exists(a)
        assert await store.count(b) == 5
    async with histstore.connect(str(tmp_path / "copy.db")) as copy:
        assert await copy.count(b) == 5
    await ok("migrate", "--sql", *pooled)  # reads the database's revision, through the pooler
    bad = await run("ls", "--url", str(tmp_path / "copy.db"), "--pooler", "session")
    assert bad.code == 2


# ---------------------------------------------------------------------------- as a user runs it


async def test_the_installed_script_and_python_m_run_the_command(tmp_path: Path) -> None:
    """The console script and ``python -m histstore`` start the same command as ``run``."""
    url = str(tmp_path / "store.db")
    async with histstore.connect(url) as store:
        await store.write("smoke", [Message.user("hi")])
    script = Path(PYTHON).parent / "histstore"
    proc = await asyncio.create_subprocess_exec(
        str(script),
        "ls",
        "--url",
        url,
        env=subprocess_env(),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout=120)
    as_module = await run_subprocess("ls", "--url", url)
    in_process = await run("ls", "--url", url)
    assert (proc.returncode, err.decode()) == (0, "")
    assert out.decode() == as_module.out == in_process.out
    assert "smoke" in in_process.out
    mistake = await run_subprocess("ls", "--no-such-option")
    assert (mistake.code, await run("ls", "--no-such-option")) == (2, mistake)
