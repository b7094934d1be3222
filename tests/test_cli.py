"""SPEC 10: the ``histstore`` command, run as a subprocess against an SQLite file and Postgres.

Stores are seeded and inspected in-process through the public API; every command runs
in a child process exactly as a user would run it.
"""

from __future__ import annotations

import asyncio
import json
import textwrap
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any
from uuid import uuid4

import pytest
from helpers import PYTHON, empty_pg_database, new_id, subprocess_env

import histstore
from histstore import ConversationState, Message, Summary, turns
from histstore.cli import parse_duration


@dataclass
class Result:
    code: int
    out: str
    err: str


async def run(*args: str, cwd: Path | None = None, stdin: bytes | None = None) -> Result:
    """Run ``python -m histstore ARGS`` and wait for it."""
    env = subprocess_env()
    env.pop("HISTSTORE_URL", None)
    env["NO_COLOR"] = "1"
    proc = await asyncio.create_subprocess_exec(
        PYTHON,
        "-m",
        "histstore",
        *args,
        cwd=cwd,
        env=env,
        stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(stdin), timeout=600)
    assert proc.returncode is not None
    return Result(proc.returncode, out.decode(), err.decode())


async def ok(*args: str, **kw: Any) -> Result:
    result = await run(*args, **kw)
    assert result.code == 0, result.err
    assert "Traceback" not in result.err
    return result


def assert_one_line_error(result: Result, *fragments: str) -> None:
    """A user mistake: non-zero exit, one line on stderr, no traceback."""
    assert result.code != 0
    lines = result.err.splitlines()
    assert len(lines) == 1, result.err
    assert lines[0].startswith("histstore: error: "), result.err
    for fragment in fragments:
        assert fragment in lines[0], result.err


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
    assert (header["format"], header["version"]) == ("histstore", 1)
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

    cleared = await ok("clear", long_id, "--url", url)
    assert "2,500 messages" in cleared.out
    async with shared_backend.connect() as store:
        assert not await store.exists(long_id)
    assert_one_line_error(await run("clear", long_id, "--url", url), long_id, "not found")

    dry = await ok("purge", "--idle", "30d", "--dry-run", "--url", url)
    assert dry.out.startswith("0 conversations")
    await asyncio.sleep(1.1)
    purged = await ok("purge", "--idle", "1s", "--url", url)
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
    await fill(small, 2, 10_000)  # 20k messages
    await fill(large, 2, 100_000)  # 200k messages, ~90 MB of JSON
    rss_small = await export_peak_rss(small, tmp_path / "small.jsonl")
    rss_large = await export_peak_rss(large, tmp_path / "large.jsonl")
    assert (tmp_path / "large.jsonl").stat().st_size > 80_000_000
    assert rss_large / rss_small < 1.5, (rss_small, rss_large)


@pytest.mark.postgres
async def test_export_memory_stays_flat_on_postgres(tmp_path: Path, pg_url: str) -> None:
    del pg_url  # only for its skip-or-fail check of the server
    async with empty_pg_database() as small, empty_pg_database() as large:
        for url, n in ((small, 10_000), (large, 100_000)):
            store = await histstore.connect(url, migrate=True)
            await store.close()
            await fill(url, 2, n)
        rss_small = await export_peak_rss(small, tmp_path / "small.jsonl")
        rss_large = await export_peak_rss(large, tmp_path / "large.jsonl")
    assert rss_large / rss_small < 1.5, (rss_small, rss_large)
