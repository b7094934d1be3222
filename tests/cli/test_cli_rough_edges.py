"""Issue 18, findings 6 and 7: the command's rough edges (confirmations, ``export -o``,
an import the disk stops) and refusals that name the conversation (SPEC 7, 10, 14)."""

from __future__ import annotations

import asyncio
import json
import os
import pty
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
from helpers import PYTHON, new_id, stable_id, subprocess_env
from test_cli import Result, assert_one_line_error, ok, run, run_on_terminal
from waiting import clock_tick

import histstore
from histstore import InvalidMessage, Message, admin
from histstore.cli._render import size

# ---------------------------------------------------------------------------- count_tokens


@pytest.mark.parametrize(
    "result", ["7", -1, 2**31, 1.5, True, None, ValueError("boom")], ids=stable_id
)
async def test_a_bad_count_tokens_result_names_the_conversation(backend: Any, result: Any) -> None:
    def count(m: Message) -> Any:
        if m.content != "bad":
            return 1
        if isinstance(result, Exception):
            raise result
        return result

    cid = new_id("tok")
    async with backend.connect(count_tokens=count) as store:
        with pytest.raises(InvalidMessage) as info:
            await store.write(cid, [Message.user("fine"), Message.user("bad")])
        assert repr(cid) in str(info.value)
        assert "message 1 of the batch" in str(info.value)
        # The message's content is not shown (the id is random hex, which may hold "bad").
        assert "bad" not in str(info.value).replace("batch", "").replace(repr(cid), "")
        if isinstance(result, Exception):
            assert info.value.__cause__ is result
        assert not await store.exists(cid)


# ---------------------------------------------------------------------------- import refusals


def _file(cid: str, message: dict[str, Any], conv: dict[str, Any] | None = None) -> list[bytes]:
    record = {
        "type": "conversation", "id": cid, "user": None, "system_prompt": None,
        "created_at": "2024-01-01T00:00:00+00:00", "updated_at": "2024-01-01T00:00:00+00:00",
        "messages": 1, "metadata": {}, **(conv or {}),
    }  # fmt: skip
    base = {
        "type": "message", "position": 0, "created_at": "2024-01-01T00:00:00+00:00",
        "token_count": None, "data": {"role": "user", "content": "hi"},
    }  # fmt: skip
    lines = [
        {"format": "histstore", "version": 1},
        record,
        {**base, **message},
        {"type": "end", "id": cid},
        {"type": "footer", "conversations": 1, "messages": 1},
    ]
    return [(json.dumps(r) + "\n").encode() for r in lines]


@pytest.mark.parametrize(
    "message",
    [
        {"position": 2**63},
        {"created_at": "0001-01-01T00:00:00+01:00"},
        {"token_count": 2**31},
        {"deep": True},
    ],
    ids=["position", "time", "tokens", "nested"],
)
async def test_import_refusals_name_line_and_conversation(
    store: histstore.Store, message: dict[str, Any]
) -> None:
    cid = new_id("imp")
    lines = _file(cid, message)
    if message.get("deep"):
        lines[2] = b'{"type":"message","data":' + b"[" * 100_000 + b"]" * 100_000 + b"}\n"
    with pytest.raises(admin.FormatError) as info:
        await admin.import_store(store, lines)
    assert "line 3" in str(info.value)
    assert repr(cid) in str(info.value)
    assert not await store.exists(cid)


# ---------------------------------------------------------------------------- full disk


async def _sh(*argv: str) -> subprocess.CompletedProcess[bytes]:
    return await asyncio.to_thread(subprocess.run, argv, capture_output=True)


async def test_an_import_the_disk_stops_names_line_and_conversation(tmp_path: Path) -> None:
    mnt = tmp_path / "small"
    mnt.mkdir()
    mounted = await _sh("mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mnt))
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {mounted.stderr.decode().strip()}")
    try:
        source = str(tmp_path / "src.db")
        ids = [f"conv-{i:02}" for i in range(20)]
        async with histstore.connect(source) as st:
            for cid in ids:
                await st.write(cid, [Message.user(f"{i} " + "w " * 500) for i in range(150)])
        dump = tmp_path / "dump.jsonl"
        await ok("export", "--url", source, "-o", str(dump))
        dst = str(mnt / "dst.db")
        failed = await run("import", str(dump), "--url", dst)
        assert_one_line_error(failed, "line ", "conversation 'conv-", "full", "imported before")
        named = failed.err.split("conversation '", 1)[1].split("'", 1)[0]
        assert (await _sh("mount", "-o", "remount,size=64m", str(mnt))).returncode == 0
        async with histstore.connect(dst) as st:
            stored = await st.conversations()
            for cid in stored:
                assert await st.count(cid) == 150  # whole or not at all
        assert stored == [c for c in ids if c < named]
        assert f"{len(stored)} conversations" in failed.err
    finally:
        await _sh("umount", "-l", str(mnt))


# ---------------------------------------------------------------------------- CLI


async def test_export_to_a_directory_fails_and_leaves_nothing(tmp_path: Path) -> None:
    url = str(tmp_path / "s.db")
    async with histstore.connect(url) as st:
        await st.write(new_id("e"), [Message.user("hi")])
    target = tmp_path / "out"
    target.mkdir()
    assert_one_line_error(await run("export", "--url", url, "-o", str(target)), "is a directory")
    assert not list(tmp_path.rglob("*.part"))  # noqa: ASYNC240
    assert list(target.iterdir()) == []


async def test_confirmations_follow_spec_10(shared_backend: Any) -> None:
    url = shared_backend.url
    ids = [new_id("c") for _ in range(3)]
    async with shared_backend.connect() as st:
        for cid in ids:
            await st.write(cid, [Message.user("hi")])
    # One id: deleted as asked, no --yes needed.
    await ok("clear", ids[0], "--url", url)
    # Several: --yes needed off a terminal; nothing deleted otherwise.
    assert_one_line_error(await run("clear", ids[1], ids[2], "--url", url), "--yes")
    # purge: the same; --dry-run needs nothing.
    assert_one_line_error(await run("purge", "--idle", "0s", "--url", url), "--yes")
    async with shared_backend.connect() as st:
        assert set(await st.conversations()) >= {ids[1], ids[2]}
    await ok("purge", "--idle", "0s", "--dry-run", "--url", url)
    no = await run_on_terminal("purge", "--idle", "0s", "--url", url, answer=b"n\n")
    assert no.code == 1
    assert "[y/N]" in no.err
    assert "nothing deleted" in no.err
    async with shared_backend.connect() as st:
        assert set(await st.conversations()) >= {ids[1], ids[2]}
    yes = await run_on_terminal("purge", "--idle", "0s", "--url", url, answer=b"y\n")
    assert yes.code == 0, yes.err
    async with shared_backend.connect() as st:
        assert not {ids[1], ids[2]} & set(await st.conversations())


# ---------------------------------------------------------------------------- stats, progress


def _real_sizes(path: str) -> dict[str, int]:
    files = {"main": path, "wal": f"{path}-wal", "shm": f"{path}-shm"}
    return {k: os.stat(f).st_size if os.path.exists(f) else 0 for k, f in files.items()}


@pytest.mark.sqlite_file
async def test_stats_shows_the_main_file_wal_and_shm(tmp_path: Path) -> None:
    url = str(tmp_path / "s.db")
    async with histstore.connect(url) as st:
        for _ in range(10):
            await st.write(new_id("w"), [Message.user("w " * 5000)])
        # While a connection is open the log keeps the writes (only the last connection
        # to close folds it into the main file).
        figures = json.loads((await ok("stats", "--json", "--url", url)).out)
        sizes = _real_sizes(url)
        assert sizes["wal"] > 100_000
        assert sizes["shm"] > 0
        assert {k: figures[f"{k}_bytes"] for k in sizes} == sizes
        assert figures["file_bytes"] == sum(sizes.values())
        first = (await ok("stats", "--url", url)).out.splitlines()[0]
        main, wal, shm = (size(sizes[k]) for k in ("main", "wal", "shm"))
        total = size(sum(sizes.values()))
        assert f"(SQLite, {total}: {main} file + {wal} WAL + {shm} shm)" in first
    figures = json.loads((await ok("stats", "--json", "--url", url)).out)
    sizes = _real_sizes(url)
    assert {k: figures[f"{k}_bytes"] for k in sizes} == sizes
    assert figures["file_bytes"] == sum(sizes.values())


TOOK = r" in \d+\.\d s"


async def test_long_commands_end_with_one_timed_line(shared_backend: Any, tmp_path: Path) -> None:
    """SPEC 14: one summary line with the time taken; no progress drawn off a terminal."""
    url = shared_backend.url
    async with shared_backend.connect() as st:
        for _ in range(3):
            await st.write(new_id("s"), [Message.user(f"m{i}") for i in range(4)])
    await clock_tick()  # idle for more than 0s, for the purge
    dump = str(tmp_path / "d.jsonl")
    expected = [
        (
            ("migrate", "--url", str(tmp_path / "new.db")),
            "out",
            r"\S+: schema upgraded from no histstore schema to \w+" + TOOK,
        ),
        (
            ("export", "--url", url, "-o", dump),
            "err",
            rf"exported 3 conversations, 12 messages, 0 threads \(0 checkpoints\) to \S+{TOOK}",
        ),
        (
            ("import", dump, "--url", str(tmp_path / "imported.db")),
            "out",
            rf"imported 3 conversations \(12 messages\) and 0 threads \(0 checkpoints\){TOOK};"
            r" 0 already there unchanged \(and 0 threads\)",
        ),
        (
            ("copy", url, str(tmp_path / "copied.db")),
            "out",
            rf"copied 3 conversations and 0 threads \(0 checkpoints\) from \S+ to \S+{TOOK};"
            r" 0 already there unchanged \(and 0 threads\)",
        ),
        (("reindex", "--url", url), "out", rf"reindexed 0 messages \(12 checked\){TOOK}"),
        (
            ("purge", "--idle", "0s", "--yes", "--url", url),
            "out",
            rf"purged 3 conversations and 0 threads \(idle for more than 0s\){TOOK}",
        ),
    ]
    for argv, stream, line in expected:
        result = await ok(*argv)
        summary = result.err if stream == "err" else result.out
        assert re.fullmatch(line + "\n", summary), (argv, summary)
        assert "\r" not in result.err
        assert "\x1b" not in result.err
        if stream == "out":
            assert result.err == ""


async def _run_with_terminal_stderr(*args: str) -> Result:
    """Run the command with stderr on a pseudo-terminal (stdout a pipe)."""
    env = subprocess_env()
    env.pop("HISTSTORE_URL", None)
    env["NO_COLOR"] = "1"
    leader, follower = pty.openpty()

    def drain() -> bytes:
        chunks = []
        while True:
            try:
                chunk = os.read(leader, 4096)
            except OSError:  # EIO: the command has exited and closed the terminal
                break
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks)

    try:
        try:
            proc = await asyncio.create_subprocess_exec(
                PYTHON,
                "-m",
                "histstore",
                *args,
                env=env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=follower,
            )
        finally:
            os.close(follower)
        err, (out, _) = await asyncio.wait_for(
            asyncio.gather(asyncio.to_thread(drain), proc.communicate()), timeout=120
        )
    finally:
        os.close(leader)
    assert proc.returncode is not None
    return Result(proc.returncode, out.decode(), err.decode())


async def test_reindex_and_purge_draw_progress_on_a_terminal(shared_backend: Any) -> None:
    url = shared_backend.url
    async with shared_backend.connect() as st:
        for _ in range(3):
            await st.write(new_id("t"), [Message.user(f"m{i}") for i in range(5)])
    await clock_tick()  # idle for more than 0s, for the purge
    reindexed = await _run_with_terminal_stderr("reindex", "--url", url)
    assert reindexed.code == 0, reindexed.err
    assert "reindex [" in reindexed.err
    assert "15/15 messages" in reindexed.err
    assert reindexed.err.endswith("\r\x1b[K")  # the line is wiped at the end
    assert re.fullmatch(rf"reindexed 0 messages \(15 checked\){TOOK}\n", reindexed.out)
    purged = await _run_with_terminal_stderr("purge", "--idle", "0s", "--yes", "--url", url)
    assert purged.code == 0, purged.err
    assert "purge [" in purged.err
    assert "3/3 conversations" in purged.err
    assert re.fullmatch(
        rf"purged 3 conversations and 0 threads \(idle for more than 0s\){TOOK}\n", purged.out
    )
