"""The ``histstore`` command: a demo, migrations, and tools to look at and move stores.

Every subcommand takes ``--url`` (a file path or a database URL; default as
``histstore.connect()``: ``$HISTSTORE_URL``, else ``histstore.db`` in the current
directory). Errors are one line on stderr, ``histstore: error: ...``, with exit status 1
(2 for a bad command line). Long work shows a progress line on stderr when it is a
terminal.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import IO, Any, NoReturn

from sqlalchemy import URL, distinct, func, select
from sqlalchemy.ext.asyncio import AsyncConnection

from . import _export, _migrations
from . import _schema as s
from ._connect import connect
from ._engine import is_memory_url, resolve_target
from ._errors import HistStoreError, NotFound, SchemaError
from ._ids import validate_id
from ._models import Message
from ._store import Store
from .middleware import with_history

__all__ = ["main", "parse_duration"]

_PAGE = 500


# ---------------------------------------------------------------------------- output


class _Style:
    """ANSI styling for a terminal (off when not a tty, or when NO_COLOR is set)."""

    def __init__(self, stream: IO[str]) -> None:
        self.on = stream.isatty() and not os.environ.get("NO_COLOR")

    def _wrap(self, code: str, text: str) -> str:
        return f"\033[{code}m{text}\033[0m" if self.on else text

    def bold(self, text: str) -> str:
        return self._wrap("1", text)

    def dim(self, text: str) -> str:
        return self._wrap("2", text)

    def role(self, role: str, text: str) -> str:
        code = {"user": "1;34", "assistant": "1;32", "system": "1;35", "tool": "1;33"}
        return self._wrap(code.get(role, "1"), text)


class _ProgressLine:
    """A self-rewriting progress line on stderr, drawn only when stderr is a terminal."""

    def __init__(self, label: str) -> None:
        self._label = label
        self._on = sys.stderr.isatty()
        self._last = 0.0
        self._start = time.monotonic()
        self._drawn = False

    def update(self, done: int, total: int | None, unit: str, *, force: bool = False) -> None:
        now = time.monotonic()
        if not self._on or (not force and now - self._last < 0.1):
            return
        self._last = now
        rate = done / max(now - self._start, 1e-9)
        text = f"{self._label}: {done:,}"
        if total:
            share = min(done / total, 1.0)
            filled = int(share * 24)
            bar = "#" * filled + "-" * (24 - filled)
            text = f"{self._label} [{bar}] {share:6.1%}  {done:,}/{total:,}"
        sys.stderr.write(f"\r{text} {unit}  {rate:,.0f}/s\033[K")
        sys.stderr.flush()
        self._drawn = True

    def close(self) -> None:
        if self._drawn:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()


def _when(value: datetime | None) -> str:
    if value is None:
        return "-"
    return value.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def _compact(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False)


def _arguments(raw: Any) -> str:
    """A tool call's arguments (a JSON string or an object), shown compactly."""
    if isinstance(raw, str):
        text = raw
        try:
            raw = json.loads(text)
        except ValueError:
            return text
    if isinstance(raw, dict):
        return ", ".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in raw.items())
    return _compact(raw)


def _blocks(content: Any) -> list[str]:
    """Lines for a message's content: a string, or a list of content blocks."""
    if content is None:
        return []
    if isinstance(content, str):
        return content.splitlines() or [""]
    if not isinstance(content, list):
        return [_compact(content)]
    lines: list[str] = []
    for block in content:
        if not isinstance(block, dict):
            lines.append(_compact(block))
            continue
        kind = block.get("type")
        if isinstance(block.get("text"), str):
            lines.extend(block["text"].splitlines() or [""])
        elif kind == "tool_use":
            lines.append(
                f"-> {block.get('name')}({_arguments(block.get('input'))})  [{block.get('id')}]"
            )
        elif kind == "tool_result":
            inner = _blocks(block.get("content"))
            lines.append(f"<- [{block.get('tool_use_id')}] " + (inner[0] if inner else ""))
            lines.extend(inner[1:])
        else:
            lines.append(f"[{kind or 'block'}]")
    return lines


def _message_lines(d: dict[str, Any]) -> list[str]:
    """What ``show`` prints for one message dict (any supported shape)."""
    kind = d.get("type")
    if kind == "function_call":
        return [f"-> {d.get('name')}({_arguments(d.get('arguments'))})  [{d.get('call_id')}]"]
    if kind == "function_call_output":
        out = _blocks(d.get("output"))
        return [f"<- [{d.get('call_id')}] " + (out[0] if out else ""), *out[1:]]
    if kind == "reasoning":
        texts = [b.get("text", "") for b in d.get("summary") or [] if isinstance(b, dict)]
        return ["(reasoning) " + " ".join(texts)]
    lines = _blocks(d.get("content"))
    if d.get("role") == "tool" or "tool_call_id" in d:
        first = lines[0] if lines else ""
        lines = [f"<- [{d.get('tool_call_id')}] {first}", *lines[1:]]
    for call in d.get("tool_calls") or []:
        fn = call.get("function") or {} if isinstance(call, dict) else {}
        lines.append(f"-> {fn.get('name')}({_arguments(fn.get('arguments'))})  [{call.get('id')}]")
    if not lines:
        lines = [json.dumps(d, ensure_ascii=False)]
    return lines


class _Printer:
    """Prints messages with positions, roles and times, readable on a terminal."""

    def __init__(self, out: IO[str]) -> None:
        self.out = out
        self.style = _Style(out)
        self._day: str | None = None

    def message(self, m: Message) -> None:
        d = m.to_dict()
        role = m.role
        stamp = m.created_at.astimezone(timezone.utc) if m.created_at else None
        day = stamp.strftime("%Y-%m-%d") if stamp else None
        if day is not None and day != self._day:
            self._day = day
            self.out.write(self.style.dim(f"  -- {day} (UTC) --") + "\n")
        clock = stamp.strftime("%H:%M:%S") if stamp else "        "
        lines = _message_lines(d)
        head = f"{m.position if m.position is not None else '':>5}  {clock}  "
        label = self.style.role(role, f"{role:<10}")
        self.out.write(self.style.dim(head) + label + " " + lines[0] + "\n")
        pad = " " * (len(head) + 11)
        for line in lines[1:]:
            self.out.write(pad + line + "\n")


# ---------------------------------------------------------------------------- opening


def _describe_url(url: str | None) -> tuple[str, Path | None]:
    """A printable form of the target (no password), and its file when it is SQLite."""
    resolved = resolve_target(url)
    assert isinstance(resolved, URL)
    if resolved.get_backend_name() == "sqlite" and not is_memory_url(resolved):
        path = Path(resolved.database or "")
        return str(path), path
    return resolved.render_as_string(hide_password=True), None


@asynccontextmanager
async def _open(url: str | None, *, create: bool = False) -> AsyncIterator[Store]:
    """Open a store; a missing SQLite file is an error unless ``create``."""
    shown, path = _describe_url(url)
    if path is not None and not create and not path.exists():
        raise HistStoreError(
            f"no database at {shown} (pass --url, or run 'histstore demo' to make one)"
        )
    try:
        store = await connect(url)
    except SchemaError:
        raise
    except HistStoreError as exc:
        raise HistStoreError(f"cannot open {shown}: {exc}") from exc
    try:
        yield store
    finally:
        await store.close()


async def _read_only(store: Store, work: Callable[[AsyncConnection], Awaitable[Any]]) -> Any:
    """Run read-only queries on the store's tables in one snapshot."""
    async with _export._engine(store, "snapshot").connect() as conn, conn.begin():
        return await work(conn)


# ---------------------------------------------------------------------------- commands


async def cmd_migrate(args: argparse.Namespace) -> int:
    if args.sql:
        from alembic import command

        resolved = resolve_target(args.url)
        assert isinstance(resolved, URL)
        cfg = _migrations.alembic_config(url=resolved.render_as_string(hide_password=False))
        cfg.output_buffer = sys.stdout
        command.upgrade(cfg, "head", sql=True)
        return 0
    shown, _path = _describe_url(args.url)
    try:
        store = await connect(args.url, migrate=False)
    except HistStoreError as exc:
        raise HistStoreError(f"cannot open {shown}: {exc}") from exc
    try:
        async with store.engine.connect() as conn:
            before = await conn.run_sync(_migrations.schema_status)
    except HistStoreError:
        raise
    except Exception as exc:  # noqa: BLE001 - the driver's errors, named below
        raise HistStoreError(f"cannot open {shown}: {type(exc).__name__}") from None
    finally:
        await store.close()
    if not before.known:
        _migrations.check(before, shown)
    if before.up_to_date:
        print(f"{shown}: schema already at the newest revision ({before.head})")
        return 0
    store = await connect(args.url, migrate=True)
    await store.close()
    was = before.current or "no histstore schema"
    print(f"{shown}: schema upgraded to revision {before.head} (was: {was})")
    return 0


async def cmd_ls(args: argparse.Namespace) -> int:
    async with _open(args.url) as store:
        limit = None if args.limit == 0 else args.limit
        ids = await store.conversations(
            user=args.user, limit=limit, order=args.order, descending=not args.asc
        )
        if args.quiet:
            for cid in ids:
                print(cid)
            return 0
        c = s.conversations.c

        async def work(conn: AsyncConnection) -> tuple[dict[str, Any], int]:
            rows: dict[str, Any] = {}
            for i in range(0, len(ids), _PAGE):
                stmt = select(c.id, c.owner, c.length, c.created_at, c.updated_at).where(
                    c.id.in_(ids[i : i + _PAGE])
                )
                rows.update({r.id: r for r in await conn.execute(stmt)})
            total = select(func.count()).select_from(s.conversations)
            if args.user is not None:
                total = total.where(c.owner == args.user)
            return rows, int((await conn.execute(total)).scalar_one())

        rows, total = await _read_only(store, work)
    style = _Style(sys.stdout)
    table = [
        (cid, r.owner or "-", f"{r.length:,}", _when(r.created_at), _when(r.updated_at))
        for cid in ids
        if (r := rows.get(cid)) is not None
    ]
    head = ("ID", "USER", "MESSAGES", "CREATED (UTC)", "UPDATED (UTC)")
    widths = [max([len(head[i]), *(len(t[i]) for t in table)]) for i in range(5)]
    widths[0] = min(widths[0], 60)

    def line(cells: Sequence[str]) -> str:
        out = []
        for i, cell in enumerate(cells):
            text = cell if len(cell) <= widths[i] else cell[: widths[i] - 1] + "~"
            out.append(text.rjust(widths[i]) if i == 2 else text.ljust(widths[i]))
        return "  ".join(out).rstrip()

    print(style.bold(line(head)))
    for t in table:
        print(line(t))
    if len(table) < total:
        print(style.dim(f"{len(table)} of {total:,} conversations shown (--limit 0 shows all)"))
    elif not table:
        print(style.dim("no conversations"))
    return 0


async def cmd_show(args: argparse.Namespace) -> int:
    async with _open(args.url) as store:
        await show_conversation(store, args.id, sys.stdout, last=args.last, as_json=args.json)
    return 0


async def show_conversation(
    store: Store, cid: str, out: IO[str], *, last: int | None = None, as_json: bool = False
) -> None:
    """Print a conversation's details and messages, reading messages page by page."""
    validate_id(cid)
    c, ls = s.conversations.c, s.lists.c

    async def work(conn: AsyncConnection) -> tuple[Any, list[Any]]:
        row = (
            await conn.execute(
                select(c.owner, c.system_prompt, c.length, c.created_at, c.updated_at).where(
                    c.id == cid
                )
            )
        ).first()
        lists = list(
            await conn.execute(
                select(ls.name, ls.length).where(ls.conversation_id == cid).order_by(ls.name)
            )
        )
        return row, lists

    row, lists = await _read_only(store, work)
    if row is None:
        raise NotFound(f"conversation {cid!r} not found")
    start = 0 if last is None else max(row.length - last, 0)
    if as_json:
        async for page in _pages(store, cid, start, row.length):
            for m in page:
                stamp = _export._time(m.created_at) if m.created_at else None
                record = {"position": m.position, "created_at": stamp}
                out.write(json.dumps({**record, "data": m.to_dict()}, ensure_ascii=False) + "\n")
        return
    metadata = await store.metadata(cid)
    summaries = await store.summaries(cid)
    style = _Style(out)
    facts = [
        ("conversation", style.bold(cid)),
        ("user", row.owner or "-"),
        ("created", _when(row.created_at) + " UTC"),
        ("updated", _when(row.updated_at) + " UTC"),
        ("messages", f"{row.length:,}"),
    ]
    if row.system_prompt is not None:
        facts.append(("system prompt", _compact(row.system_prompt)))
    if metadata:
        facts.append(("metadata", json.dumps(metadata, ensure_ascii=False)))
    for sm in summaries:
        facts.append(("summary", f"#{sm.start}-#{sm.end}: {_compact(sm.content)}"))
    if lists:
        facts.append(("lists", ", ".join(f"{n} ({k:,} items)" for n, k in lists)))
    for key, value in facts:
        out.write(f"{style.dim(f'{key:<13}')} {value}\n")
    out.write("\n")
    if start > 0:
        out.write(style.dim(f"  ... {start:,} earlier messages (--last shows more)") + "\n")
    printer = _Printer(out)
    async for page in _pages(store, cid, start, row.length):
        for m in page:
            printer.message(m)


async def _pages(store: Store, cid: str, start: int, stop: int) -> AsyncIterator[list[Message]]:
    while start < stop:
        page = await store.read(cid, start=start, stop=min(start + _PAGE, stop))
        if not page:
            return
        yield page
        start = (page[-1].position or start) + 1


async def cmd_stats(args: argparse.Namespace) -> int:
    shown, path = _describe_url(args.url)
    async with _open(args.url) as store:
        c = s.conversations.c

        async def work(conn: AsyncConnection) -> dict[str, Any]:
            conv = (
                await conn.execute(
                    select(
                        func.count(),
                        func.coalesce(func.sum(c.length), 0),
                        func.coalesce(func.max(c.length), 0),
                        func.count(distinct(c.owner)),
                        func.min(c.created_at),
                        func.max(c.updated_at),
                    )
                )
            ).one()
            counts = {}
            for name, table in (
                ("summaries", s.summaries),
                ("metadata entries", s.metadata_entries),
                ("named lists", s.lists),
                ("list items", s.list_items),
                ("write records", s.writes),
            ):
                stmt = select(func.count()).select_from(table)
                counts[name] = int((await conn.execute(stmt)).scalar_one())
            status = await conn.run_sync(_migrations.schema_status)
            return {"conv": conv, "counts": counts, "status": status}

        info = await _read_only(store, work)
    conv, counts, status = info["conv"], info["counts"], info["status"]
    where = shown
    if path is not None:
        size = sum(p.stat().st_size for p in (path, Path(f"{path}-wal")) if p.exists())
        where = f"{shown} (SQLite, {size / 1e6:,.1f} MB)"
    rows = [
        ("database", where),
        ("schema", f"revision {status.current} (newest)"),
        ("conversations", f"{conv[0]:,} (owners: {conv[3]:,})"),
        ("messages", f"{conv[1]:,} (longest conversation: {conv[2]:,})"),
        *((name, f"{n:,}") for name, n in counts.items()),
        ("first created", _when(conv[4]) + (" UTC" if conv[4] else "")),
        ("last change", _when(conv[5]) + (" UTC" if conv[5] else "")),
    ]
    style = _Style(sys.stdout)
    for key, value in rows:
        print(f"{style.dim(f'{key:<17}')} {value}")
    return 0


async def cmd_export(args: argparse.Namespace) -> int:
    async with _open(args.url) as store:
        bar = _ProgressLine("export")

        def progress(st: _export.TransferStats) -> None:
            bar.update(st.messages, st.total_messages, "messages")

        target = args.output
        try:
            if target in (None, "-"):
                out: IO[str] = sys.stdout
                stats = await _export.export_store(
                    store, out, ids=args.ids or None, user=args.user, progress=progress
                )
            else:
                # Written under another name first, so a failed export leaves no
                # file that looks complete.
                part = f"{target}.part"
                with open(part, "w", encoding="utf-8", newline="\n") as out:  # noqa: ASYNC230
                    stats = await _export.export_store(
                        store, out, ids=args.ids or None, user=args.user, progress=progress
                    )
                os.replace(part, target)
        finally:
            bar.close()
    if sys.stderr.isatty() or target not in (None, "-"):
        where = "" if target in (None, "-") else f" to {target}"
        print(
            f"exported {stats.conversations:,} conversations, {stats.messages:,} messages{where}",
            file=sys.stderr,
        )
    return 0


async def cmd_import(args: argparse.Namespace) -> int:
    if args.file == "-":
        stream = sys.stdin.buffer
        total = None
    else:
        stream = open(args.file, "rb")  # noqa: ASYNC230, SIM115 - read line by line below
        total = os.fstat(stream.fileno()).st_size or None
    async with _open(args.url, create=True) as store:
        bar = _ProgressLine("import")

        def progress(st: _export.TransferStats) -> None:
            bar.update(st.bytes_read, total, "bytes")

        try:
            stats = await _export.import_store(store, stream, batch=args.batch, progress=progress)
        finally:
            bar.close()
            if stream is not sys.stdin.buffer:
                stream.close()
    print(
        f"imported {stats.conversations:,} conversations ({stats.messages:,} messages);"
        f" {stats.skipped:,} already there unchanged"
    )
    return 0


async def cmd_copy(args: argparse.Namespace) -> int:
    src_shown, _ = _describe_url(args.source)
    dst_shown, _ = _describe_url(args.destination)
    if src_shown == dst_shown:
        raise HistStoreError("the source and the destination are the same database")
    async with _open(args.source) as source, _open(args.destination, create=True) as target:
        bar = _ProgressLine("copy")

        def progress(st: _export.TransferStats) -> None:
            bar.update(st.messages, st.total_messages, "messages")

        try:
            stats = await _export.copy_store(source, target, batch=args.batch, progress=progress)
        finally:
            bar.close()
    print(
        f"copied {stats.conversations:,} conversations from {src_shown} to {dst_shown};"
        f" {stats.skipped:,} already there unchanged"
    )
    return 0


async def cmd_fork(args: argparse.Namespace) -> int:
    async with _open(args.url) as store:
        await store.fork(args.source, args.target, upto=args.upto)
        n = await store.count(args.target)
    print(f"forked {args.source!r} to {args.target!r} ({n:,} messages)")
    return 0


async def cmd_clear(args: argparse.Namespace) -> int:
    async with _open(args.url) as store:
        if not await store.exists(args.id):
            raise NotFound(f"conversation {args.id!r} not found")
        n = await store.count(args.id)
        await store.clear(args.id)
    print(f"cleared {args.id!r} ({n:,} messages)")
    return 0


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_DURATION = re.compile(r"(\d+)([smhdw])")


def parse_duration(text: str) -> timedelta:
    """Parse ``90m``, ``12h``, ``30d``, ``2w`` or a sum such as ``1d12h``.

    Raises:
        ValueError: the text is not such a duration.
    """
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text.strip().lower():
        raise ValueError(f"not a duration: {text!r} (use e.g. 90m, 12h, 30d, 1d12h)")
    return timedelta(seconds=sum(int(n) * _UNITS[u] for n, u in parts))


async def cmd_purge(args: argparse.Namespace) -> int:
    idle = parse_duration(args.idle)
    async with _open(args.url) as store:
        if args.dry_run:
            c = s.conversations.c
            cutoff = datetime.now(timezone.utc) - idle

            async def work(conn: AsyncConnection) -> int:
                stmt = select(func.count()).where(c.updated_at < cutoff)
                return int((await conn.execute(stmt)).scalar_one())

            n = await _read_only(store, work)
            print(f"{n:,} conversations idle for more than {args.idle} (dry run: none deleted)")
            return 0
        n = await store.purge(idle_for=idle)
    print(f"purged {n:,} conversations idle for more than {args.idle}")
    return 0


# ---------------------------------------------------------------------------- demo

_SYSTEM = "You are a concise weather assistant. Use get_weather for current conditions."
_WEATHER = {
    "Paris": {"city": "Paris", "temp_c": 14, "sky": "light rain", "wind_kmh": 18},
    "Tokyo": {"city": "Tokyo", "temp_c": 22, "sky": "clear", "wind_kmh": 7},
}
_SCRIPT = [
    "What's the weather in Paris right now?",
    "Should I take an umbrella?",
    "And how about Tokyo?",
    "Thanks!",
]


class _DemoModel:
    """A scripted stand-in for an LLM: deterministic, no network.

    It only knows what the history it is given says, like a real model: it calls the
    weather tool for a city it has no fresh result for, answers from a tool result, and
    answers a follow-up question from earlier turns.
    """

    def __init__(self) -> None:
        self.seen: list[int] = []

    async def __call__(self, messages: list[Message]) -> Message:
        self.seen.append(len(messages))
        last = messages[-1]
        if last.role == "tool":
            w = json.loads(last.content)
            return Message.assistant(
                f"It's {w['temp_c']} °C in {w['city']}, {w['sky']}, wind {w['wind_kmh']} km/h."
            )
        text = str(last.content)
        for city in _WEATHER:
            if city.lower() in text.lower():
                calls = sum(len(m.get("tool_calls") or []) for m in messages)
                call = {
                    "id": f"call_{calls + 1}",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": json.dumps({"city": city})},
                }
                return Message.assistant(None, tool_calls=[call])
        if "umbrella" in text.lower():
            results = [json.loads(m.content) for m in messages if m.role == "tool"]
            if results:
                w = results[-1]
                wet = "rain" in w["sky"]
                verdict = "Yes, take one" if wet else "No need"
                return Message.assistant(
                    f"{verdict}: I checked {w['city']} a moment ago and it's {w['sky']}."
                )
        if "thank" in text.lower():
            return Message.assistant("You're welcome. Stay dry!")
        return Message.assistant("I can only talk about the weather in Paris or Tokyo.")


def _run_tool(call: dict[str, Any]) -> Message:
    args = json.loads(call["function"]["arguments"])
    return Message.tool(json.dumps(_WEATHER[args["city"]]), tool_call_id=call["id"])


async def cmd_demo(args: argparse.Namespace) -> int:
    shown, path = _describe_url(args.url)
    out = sys.stdout
    style = _Style(out)
    async with _open(args.url, create=True) as store:
        user = "demo-user"
        cid = f"demo-{uuid.uuid4().hex[:8]}"
        view = store.scoped(user)
        model = _DemoModel()
        chat = with_history(view, model)
        where = f"{shown} (SQLite file)" if path is not None else shown
        out.write(
            style.bold("histstore demo") + f": a scripted agent conversation, kept in {where}\n"
        )
        out.write(
            style.dim(
                f"conversation {cid}, owned by {user}. The model is a local script; each call"
                " goes through with_history(), which replays the stored history and stores the"
                " reply."
            )
            + "\n\n"
        )
        await view.write(cid, [Message.system(_SYSTEM)])
        await view.merge_metadata(cid, {"title": "Weather questions", "source": "histstore demo"})
        for text in _SCRIPT:
            out.write(style.role("user", "you   ") + f" {text}\n")
            reply = await chat(cid, [Message.user(text)])
            while True:
                saw = model.seen[-1]
                calls = reply[-1].get("tool_calls") or []
                if not calls:
                    break
                for call in calls:
                    out.write(
                        style.role("assistant", "model ")
                        + f" -> calls {call['function']['name']}("
                        + _arguments(call["function"]["arguments"])
                        + ")"
                        + style.dim(f"   (saw {saw} messages)")
                        + "\n"
                    )
                results = [_run_tool(call) for call in calls]
                for r in results:
                    out.write(style.role("tool", "tool  ") + f" {r.content}\n")
                reply = await chat(cid, results)
            out.write(
                style.role("assistant", "model ")
                + f" {reply[-1].content}"
                + style.dim(f"   (saw {model.seen[-1]} messages)")
                + "\n\n"
            )
        out.write(style.bold("What the store now holds") + "\n\n")
        await show_conversation(store, cid, out)
        total = len(await store.conversations())
    out.write("\n" + style.bold("Next") + "\n")
    url = "" if args.url is None else f" --url {args.url}"
    steps = [
        (f"histstore ls{url}", f"{total} conversation(s) in this database"),
        (f"histstore show {cid}{url}", "this conversation again"),
        (f"histstore export {cid}{url} > demo.jsonl", "as JSON Lines"),
        (f"histstore fork {cid} {cid}-b --upto 5{url}", "branch after the first answer"),
    ]
    width = max(len(cmd) for cmd, _note in steps)
    for cmd, note in steps:
        out.write(f"  {cmd:<{width}}  {style.dim('# ' + note)}\n")
    out.write(
        style.dim("In Python: async with histstore.connect() as store: ...  (see the README)")
        + "\n"
    )
    return 0


# ---------------------------------------------------------------------------- parser


def _int_from(text: str, lowest: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if value < lowest:
        raise argparse.ArgumentTypeError(f"must be at least {lowest}")
    return value


def _positive(text: str) -> int:
    return _int_from(text, 1)


def _non_negative(text: str) -> int:
    return _int_from(text, 0)


def _duration(text: str) -> str:
    try:
        parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``histstore`` command."""
    parser = argparse.ArgumentParser(
        prog="histstore",
        description="Conversation history for LLM agents, kept in SQL. Start with"
        " 'histstore demo'.",
        epilog="Every command takes --url (a file path or a sqlite:// or postgresql:// URL);"
        " the default is $HISTSTORE_URL, else histstore.db in the current directory.",
    )
    from . import __version__

    parser.add_argument("--version", action="version", version=f"histstore {__version__}")
    url = argparse.ArgumentParser(add_help=False)
    url.add_argument(
        "--url",
        metavar="URL",
        default=None,
        help="database: a file path or URL (default: $HISTSTORE_URL, else histstore.db)",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def command(name: str, handler: Any, help: str, *, with_url: bool = True) -> Any:
        p = sub.add_parser(name, help=help, description=help, parents=[url] if with_url else [])
        p.set_defaults(handler=handler)
        return p

    command("demo", cmd_demo, "run a scripted agent conversation and show what was stored")

    p = command("migrate", cmd_migrate, "create or upgrade the database schema")
    p.add_argument("--sql", action="store_true", help="print the SQL instead of running it")

    p = command("ls", cmd_ls, "list conversations")
    p.add_argument("--user", help="only this user's conversations")
    p.add_argument("--limit", type=_non_negative, default=50, help="at most N (0: all; 50)")
    p.add_argument(
        "--order", choices=("updated", "created", "id"), default="updated", help="(updated)"
    )
    p.add_argument("--asc", action="store_true", help="oldest (or lowest id) first")
    p.add_argument("-q", "--quiet", action="store_true", help="print only the ids")

    p = command("show", cmd_show, "print a conversation's messages and details")
    p.add_argument("id", metavar="ID")
    p.add_argument("--last", type=_non_negative, metavar="N", help="only the newest N messages")
    p.add_argument("--json", action="store_true", help="messages as JSON Lines")

    command("stats", cmd_stats, "summarize what the database holds")

    p = command("export", cmd_export, "write conversations as JSON Lines (all by default)")
    p.add_argument("ids", nargs="*", metavar="ID")
    p.add_argument("--user", help="only this user's conversations")
    p.add_argument("-o", "--output", metavar="FILE", help="write to FILE (default: stdout)")

    p = command("import", cmd_import, "load an export file ('-' for stdin)")
    p.add_argument("file", metavar="FILE")
    p.add_argument("--batch", type=_positive, default=_export.DEFAULT_BATCH, help="rows per batch")

    p = command(
        "copy", cmd_copy, "copy every conversation from one database to another", with_url=False
    )
    p.add_argument("source", metavar="SRC_URL")
    p.add_argument("destination", metavar="DST_URL")
    p.add_argument("--batch", type=_positive, default=_export.DEFAULT_BATCH, help="rows per batch")

    p = command("fork", cmd_fork, "copy a conversation (or its first N messages) to a new id")
    p.add_argument("source", metavar="SRC")
    p.add_argument("target", metavar="DST")
    p.add_argument("--upto", type=_non_negative, metavar="N", help="copy only N messages")

    p = command("clear", cmd_clear, "delete a conversation and everything it holds")
    p.add_argument("id", metavar="ID")

    p = command("purge", cmd_purge, "delete conversations not changed for a while")
    p.add_argument(
        "--idle", required=True, type=_duration, metavar="DURATION", help="e.g. 90m, 12h, 30d"
    )
    p.add_argument("--dry-run", action="store_true", help="only count them")
    return parser


def _fail(message: str, code: int = 1) -> NoReturn:
    one_line = " ".join(str(message).split())
    print(f"histstore: error: {one_line}", file=sys.stderr)
    raise SystemExit(code)


def main(argv: Sequence[str] | None = None) -> None:
    """Run the ``histstore`` command (the console script's entry point)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code = asyncio.run(args.handler(args))
    except KeyboardInterrupt:
        print("histstore: interrupted", file=sys.stderr)
        raise SystemExit(130) from None
    except BrokenPipeError:
        # The reader went away (e.g. `histstore export | head`): stop quietly.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        raise SystemExit(1) from None
    except (HistStoreError, ValueError, LookupError) as exc:
        _fail(str(exc))
    except OSError as exc:
        where = f"{exc.filename}: " if exc.filename else ""
        _fail(f"{where}{exc.strerror or exc}")
    raise SystemExit(code)


if __name__ == "__main__":
    main()
