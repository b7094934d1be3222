"""``histstore threads`` (ls, show, prune), and threads in ``stats``, ``purge``, ``export``,
``import`` and ``copy``, on the backends a command can reach by URL."""

from __future__ import annotations

import asyncio
import json
import shlex
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from cli_runner import assert_one_line_error, ok, run
from helpers import CLI_WITHOUT_LANGGRAPH, PYTHON, subprocess_env
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langgraph.checkpoint.conformance.test_utils import generate_checkpoint, generate_metadata
from langgraph.graph import START, MessagesState, StateGraph
from sqlalchemy import update

import histstore
from histstore import Message
from histstore._storage import schema as _schema
from histstore.integrations.langgraph import HiststoreSaver


def new_thread() -> str:
    return f"thread-{uuid.uuid4().hex[:12]}"


async def chat(saver: HiststoreSaver, thread: str, turns: int) -> None:
    """A real graph: ``turns`` invocations on the thread (3 checkpoints each)."""
    model = GenericFakeChatModel(messages=iter([AIMessage(f"reply {i}") for i in range(turns)]))

    async def agent(state: MessagesState) -> dict[str, list[BaseMessage]]:
        return {"messages": [await model.ainvoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("agent", agent)
    builder.add_edge(START, "agent")
    graph = builder.compile(checkpointer=saver)
    for i in range(turns):
        config = {"configurable": {"thread_id": thread}}
        await graph.ainvoke({"messages": [HumanMessage(f"hello {i}")]}, config)


async def child_checkpoint(saver: HiststoreSaver, thread: str) -> None:
    """A checkpoint in a subgraph's namespace."""
    config = {"configurable": {"thread_id": thread, "checkpoint_ns": "child:1"}}
    cp = generate_checkpoint(channel_values={"items": [1, 2]})
    cp["channel_versions"] = {"items": saver.get_next_version(None, None)}
    await saver.aput(config, cp, generate_metadata(step=0, source="loop"), cp["channel_versions"])


async def latest(saver: HiststoreSaver, thread: str, ns: str = "") -> Any:
    found = await saver.aget_tuple({"configurable": {"thread_id": thread, "checkpoint_ns": ns}})
    assert found is not None
    return found.checkpoint["channel_values"]


async def age(backend: Any, thread: str, days: int) -> None:
    """Make the thread look last changed ``days`` ago."""
    async with backend.connect() as store, store.engine.begin() as conn:
        table = _schema.checkpoint_threads
        old = datetime.now(timezone.utc) - timedelta(days=days)
        await conn.execute(update(table).where(table.c.thread_id == thread).values(updated_at=old))


async def test_ls_and_show_describe_threads(shared_backend: Any) -> None:
    url = shared_backend.url
    one, two = new_thread(), new_thread()
    async with shared_backend.connect() as store:
        saver = HiststoreSaver(store)
        await chat(saver, one, 2)
        await child_checkpoint(saver, one)
        await chat(HiststoreSaver(store.scoped("alice")), two, 1)

    listed = await ok("threads", "ls", "--url", url)
    head, *rows = listed.out.splitlines()
    assert head.split() == ["THREAD", "USER", "CHECKPOINTS", "UPDATED", "(UTC)", "NAMESPACES"]
    assert rows[0].split()[:3] == [two, "alice", "3"]  # the most recently changed first
    assert rows[1].split()[:3] == [one, "-", "7"]
    assert rows[1].endswith("(root), child:1")

    as_json = await ok("threads", "ls", "--json", "--url", url)
    records = [json.loads(x) for x in as_json.out.splitlines()]
    assert {r["thread_id"]: (r["checkpoints"], r["namespaces"]) for r in records} == {
        one: (7, ["", "child:1"]),
        two: (3, [""]),
    }
    mine = await ok("threads", "ls", "-q", "--user", "alice", "--url", url)
    assert mine.out.split() == [two]
    assert "1 of 2 threads shown" in (await ok("threads", "ls", "--limit", "1", "--url", url)).out

    shown = await ok("threads", "show", one, "--url", url)
    lines = shown.out.splitlines()
    assert lines[0].split() == ["thread", one]
    table = lines[next(i for i, x in enumerate(lines) if x.startswith("CHECKPOINT")) :]
    assert table[0].split() == [
        "CHECKPOINT", "PARENT", "NAMESPACE", "STEP", "SOURCE", "WRITES", "CHANNELS"
    ]  # fmt: skip
    assert len(table) == 8
    shown_json = await ok("threads", "show", one, "--json", "--url", url)
    checkpoints = [json.loads(x) for x in shown_json.out.splitlines()]
    ids = [c["checkpoint_id"] for c in checkpoints]
    assert ids == sorted(ids, reverse=True)
    root = [c for c in checkpoints if c["checkpoint_ns"] == ""]
    assert [c["step"] for c in root] == [4, 3, 2, 1, 0, -1]
    assert [c["source"] for c in root] == ["loop", "loop", "input"] * 2
    assert root[0]["parent_checkpoint_id"] == root[1]["checkpoint_id"]
    assert "messages" in root[0]["channels"]
    assert any(c["writes"] for c in root)
    assert table[1].split()[0] == ids[0]

    missing = await run("threads", "show", new_thread(), "--url", url)
    assert_one_line_error(missing, "not found")
    hidden = await run("threads", "show", two, "--user", "bob", "--url", url)
    assert_one_line_error(hidden, "not found")


async def test_prune_keeps_the_latest_checkpoint_of_each_namespace(shared_backend: Any) -> None:
    url = shared_backend.url
    one, two, three = new_thread(), new_thread(), new_thread()
    async with shared_backend.connect() as store:
        saver = HiststoreSaver(store)
        for thread in (one, two, three):
            await chat(saver, thread, 2)
        await child_checkpoint(saver, one)
        before = await latest(saver, one), await latest(saver, one, "child:1")

    pruned = await ok("threads", "prune", one, "--url", url)
    assert pruned.out.startswith("pruned 1 threads: removed 5 of 7 checkpoints in ")
    async with shared_backend.connect() as store:
        saver = HiststoreSaver(store)
        assert (await latest(saver, one), await latest(saver, one, "child:1")) == before
        listed = [c async for c in saver.alist({"configurable": {"thread_id": one}})]
        assert len(listed) == 2
        assert all(c.parent_config is None for c in listed)
        await chat(saver, one, 1)  # the graph goes on from the kept checkpoint
        assert len((await latest(saver, one))["messages"]) == len(before[0]["messages"]) + 2

    several = await run("threads", "prune", two, three, "--delete", "--url", url)
    assert_one_line_error(several, "--yes")
    deleted = await ok("threads", "prune", two, three, "--delete", "--yes", "--url", url)
    assert deleted.out.startswith("deleted 2 threads (12 checkpoints)")
    assert (await ok("threads", "ls", "-q", "--url", url)).out.split() == [one]

    usage = await run("threads", "prune", "--url", url)
    assert usage.code == 2


async def test_prune_idle_threads(shared_backend: Any) -> None:
    url = shared_backend.url
    old, fresh = new_thread(), new_thread()
    async with shared_backend.connect() as store:
        saver = HiststoreSaver(store)
        await chat(saver, old, 2)
        await chat(saver, fresh, 2)
    await age(shared_backend, old, 40)

    dry = await ok("threads", "prune", "--idle", "30d", "--dry-run", "--url", url)
    assert dry.out.split() == [old]
    assert "1 threads idle for more than 30d" in dry.err
    assert (await ok("threads", "ls", "--idle", "30d", "-q", "--url", url)).out.split() == [old]
    done = await ok("threads", "prune", "--idle", "30d", "--yes", "--url", url)
    assert done.out.startswith("pruned 1 threads: removed 5 of 6 checkpoints")
    counts = {
        json.loads(x)["thread_id"]: json.loads(x)["checkpoints"]
        for x in (await ok("threads", "ls", "--json", "--url", url)).out.splitlines()
    }
    assert counts == {old: 1, fresh: 6}


async def test_stats_and_purge_count_threads(shared_backend: Any) -> None:
    url = shared_backend.url
    old, fresh = new_thread(), new_thread()
    async with shared_backend.connect() as store:
        saver = HiststoreSaver(store)
        await chat(saver, old, 1)
        await chat(saver, fresh, 2)
    await age(shared_backend, old, 40)

    figures = json.loads((await ok("stats", "--json", "--url", url)).out)
    assert (figures["threads"], figures["checkpoints"]) == (2, 9)
    assert "2 LangGraph threads (9 checkpoints)" in (await ok("stats", "--url", url)).out

    dry = await ok("purge", "--idle", "30d", "--dry-run", "--url", url)
    assert "0 conversations idle for more than 30d would be purged, and 1 threads" in dry.err
    purged = await ok("purge", "--idle", "30d", "--yes", "--url", url)
    assert purged.out.startswith("purged 0 conversations and 1 threads (idle for more than 30d)")
    assert (await ok("threads", "ls", "-q", "--url", url)).out.split() == [fresh]


async def test_copy_export_and_import_carry_threads(shared_backend: Any, tmp_path: Path) -> None:
    """The README's move: ``histstore copy lg.db <database>`` keeps every thread."""
    source = str(tmp_path / "lg.db")
    thread = new_thread()
    async with HiststoreSaver(source) as saver:
        await chat(saver, thread, 3)
        wanted = [c.checkpoint async for c in saver.alist({"configurable": {"thread_id": thread}})]
    copied = await ok("copy", source, shared_backend.url)
    assert copied.out.startswith("copied 0 conversations and 1 threads (9 checkpoints) from ")
    async with shared_backend.connect() as store:
        saver = HiststoreSaver(store)
        got = [c.checkpoint async for c in saver.alist({"configurable": {"thread_id": thread}})]
        assert got == wanted
        await store.write("conv-1", [Message.user("hi")])

    dump = str(tmp_path / "dump.jsonl")
    exported = await ok("export", "--url", shared_backend.url, "-o", dump)
    assert "exported 1 conversations, 1 messages, 1 threads (9 checkpoints) to " in exported.err
    only = str(tmp_path / "thread.jsonl")
    await ok("export", "--thread", thread, "--url", shared_backend.url, "-o", only)
    with open(only) as part:  # noqa: ASYNC230 - a small file
        types = {json.loads(line).get("type") for line in part}
    assert "conversation" not in types
    assert "thread" in types

    target = str(tmp_path / "imported.db")
    imported = await ok("import", dump, "--url", target)
    assert imported.out.startswith(
        "imported 1 conversations (1 messages) and 1 threads (9 checkpoints) in "
    )
    again = await ok("import", dump, "--url", target)
    assert again.out.endswith("; 1 already there unchanged (and 1 threads)\n")
    async with HiststoreSaver(target) as saver:
        got = [c.checkpoint async for c in saver.alist({"configurable": {"thread_id": thread}})]
    assert got == wanted


async def test_export_into_a_pipe_closed_early_exits_quietly(tmp_path: Path) -> None:
    """``histstore export | head``: the reader leaves while a thread is being written;
    the command stops without a word (issue 38: it said "read failed: the database is
    unavailable ... BrokenPipeError")."""
    url = str(tmp_path / "threads.db")
    async with histstore.connect(url) as store:
        saver = HiststoreSaver(store)
        for _ in range(3):
            await chat(saver, new_thread(), 4)
    command = shlex.join([PYTHON, "-m", "histstore", "export", "--url", url])
    proc = await asyncio.create_subprocess_exec(
        "bash",
        "-c",
        f"{command} | head -c 3000 > /dev/null; echo ${{PIPESTATUS[0]}}",
        env={**subprocess_env(), "NO_COLOR": "1"},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    assert err.decode() == ""
    assert out.decode().strip() in ("0", "1")  # 1 when the pipe closed before the end


def _reach(backend: Any) -> tuple[str, ...]:
    """The options a command reaches the backend by (its URL; the pooler behind PgBouncer)."""
    if not backend.shared:
        pytest.skip("a command cannot reach another process's in-memory database")
    pooled = ("--pooler", "transaction") if backend.options.get("pooler") else ()
    return ("--url", backend.url, *pooled)


async def test_show_prints_a_threads_messages(backend: Any) -> None:
    """``threads show`` prints the messages channel of the newest checkpoint (of every
    checkpoint listed with ``--every``), as messages; ``--json`` adds it as readable JSON;
    ``--checkpoints`` decodes nothing."""
    reach = _reach(backend)
    thread = new_thread()
    async with backend.connect() as store:
        await chat(HiststoreSaver(store), thread, 2)
        newest = await latest(HiststoreSaver(store), thread)
    assert [m.content for m in newest["messages"]] == ["hello 0", "reply 0", "hello 1", "reply 1"]

    shown = await ok("threads", "show", thread, *reach)
    lines = shown.out.splitlines()
    heads = [x for x in lines if x.startswith("messages of checkpoint ")]
    assert len(heads) == 1
    said = [x.split()[1:] for x in lines[lines.index(heads[0]) + 1 : lines.index(heads[0]) + 5]]
    assert said == [
        ["user", "hello", "0"],
        ["assistant", "reply", "0"],
        ["user", "hello", "1"],
        ["assistant", "reply", "1"],
    ]
    as_json = await ok("threads", "show", thread, "--json", *reach)
    records = [json.loads(x) for x in as_json.out.splitlines()]
    assert heads[0].split()[-1] == records[0]["checkpoint_id"]
    messages = records[0]["messages"]
    assert [(m["role"], m["type"], m["content"]) for m in messages] == [
        ("user", "human", "hello 0"),
        ("assistant", "ai", "reply 0"),
        ("user", "human", "hello 1"),
        ("assistant", "ai", "reply 1"),
    ]
    assert all("messages" not in r for r in records[1:])

    every = await ok("threads", "show", thread, "--every", "--limit", "3", *reach)
    counts = [x for x in every.out.splitlines() if x.startswith("messages of checkpoint ")]
    assert len(counts) == 3
    every_json = await ok("threads", "show", thread, "--every", "--json", *reach)
    sizes = [len(json.loads(x).get("messages", [])) for x in every_json.out.splitlines()]
    assert sizes == [4, 3, 2, 2, 1, 0]
    bare = await ok("threads", "show", thread, "--checkpoints", *reach)
    assert "messages of" not in bare.out
    assert "CHECKPOINT" in bare.out


async def test_show_without_langgraph_says_what_to_install(tmp_path: Path) -> None:
    url = str(tmp_path / "lg.db")
    thread = new_thread()
    async with HiststoreSaver(url) as saver:
        await chat(saver, thread, 1)
    script = CLI_WITHOUT_LANGGRAPH
    proc = await asyncio.create_subprocess_exec(
        PYTHON, "-c", script, "threads", "show", thread, "--url", url,
        env={**subprocess_env(), "NO_COLOR": "1"},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await proc.communicate()
    assert proc.returncode == 0
    assert "pip install 'histstore[langgraph]'" in err.decode()
    assert "CHECKPOINT" in out.decode()


async def test_export_writes_a_threads_messages_as_json(backend: Any, tmp_path: Path) -> None:
    """Beside the rows (base64 values), a thread record holds its newest checkpoint's
    messages as readable JSON; an import ignores them and stores the rows."""
    reach = _reach(backend)
    thread = new_thread()
    async with backend.connect() as store:
        await chat(HiststoreSaver(store), thread, 2)
        newest = await HiststoreSaver(store).aget_tuple({"configurable": {"thread_id": thread}})
    assert newest is not None
    dump = tmp_path / "dump.jsonl"
    await ok("export", "--thread", thread, "-o", str(dump), *reach)
    records = [json.loads(line) for line in dump.read_text().splitlines()]
    (record,) = [r for r in records if r.get("type") == "thread"]
    assert record["messages_checkpoint"] == newest.checkpoint["id"]
    assert [(m["role"], m["content"]) for m in record["messages"]] == [
        ("user", "hello 0"),
        ("assistant", "reply 0"),
        ("user", "hello 1"),
        ("assistant", "reply 1"),
    ]
    target = str(tmp_path / "imported.db")
    await ok("import", str(dump), "--url", target)
    async with HiststoreSaver(target) as saver:
        again = await saver.aget_tuple({"configurable": {"thread_id": thread}})
    assert again is not None
    assert again.checkpoint == newest.checkpoint
