"""One coroutine per subcommand, each taking the parsed arguments and returning the exit
status (but ``demo``; ``show``, ``log`` and ``revert`` in ``_show``; ``export``, ``import``
and ``copy`` in ``_transfer``; ``threads`` in ``_threads``). They use only histstore's
public API and ``histstore.admin``."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from contextvars import ContextVar
from typing import Any, Literal

import histstore
from histstore import HistStoreError, SchemaError, Store, admin
from histstore.checkpoints import CheckpointStore

from ._render import (
    HitPrinter,
    ProgressLine,
    Style,
    file_size,
    print_listing,
    size,
    span,
    when,
)

__all__ = ["UsageError", "confirm", "open_store", "pooler"]

_PAGE = 500


class UsageError(Exception):
    """The command line is wrong in a way the parser cannot see (exit status 2)."""


pooler: ContextVar[Literal["transaction"] | None] = ContextVar("pooler", default=None)
"""The command's ``--pooler`` (``main`` sets it): how every PostgreSQL database the command
opens is reached."""


def _pooler_for(where: admin.DatabaseLocation) -> Literal["transaction"] | None:
    """``--pooler`` for one database: a server's URL takes it, an SQLite file ignores it."""
    return pooler.get() if where.file is None else None


@asynccontextmanager
async def open_store(
    url: str | None,
    *,
    create: bool = False,
    schema: str | None = None,
    read_only: bool = False,
) -> AsyncIterator[Store]:
    """Open a store (its tables in ``schema`` on PostgreSQL); a missing SQLite file is
    an error unless ``create``. ``read_only``: for the reading commands, which never
    change the database, its schema included (``connect(read_only=True)``)."""
    where = admin.locate(url)
    if where.file is not None and not create and not where.file.exists():
        raise HistStoreError(
            f"no database at {where.display} (pass --url, or run 'histstore demo' to make one)"
        )
    try:
        store = await histstore.connect(
            url, schema=schema, read_only=read_only, pooler=_pooler_for(where)
        )
    except SchemaError:
        raise
    except HistStoreError as exc:
        raise HistStoreError(f"cannot open {where.display}: {exc}") from exc
    try:
        yield store
    finally:
        await store.close()


async def confirm(question: str, yes: bool) -> bool:
    """Ask on the terminal; without one, only ``--yes`` goes ahead (else an error)."""
    if yes:
        return True
    if not sys.stdin.isatty():
        raise HistStoreError(
            "refusing to delete without confirmation: stdin is not a terminal (pass --yes)"
        )
    sys.stderr.write(f"{question} [y/N] ")
    sys.stderr.flush()
    answer = await asyncio.to_thread(sys.stdin.readline)
    return answer.strip().lower() in ("y", "yes")


# ---------------------------------------------------------------------------- migrate


async def cmd_migrate(args: argparse.Namespace) -> int:
    if args.from_revision is not None and not args.sql:
        raise UsageError("--from goes with --sql (it prints the SQL from that revision)")
    if args.sql:
        if args.lock_timeout is not None:
            raise UsageError(
                "--lock-timeout applies when migrate runs the upgrade; for a script, set"
                " it where it is applied (e.g. PGOPTIONS='-c lock_timeout=10s' psql ...)"
            )
        if args.from_revision is not None:
            script = admin.migration_sql(
                args.url, schema=args.schema, from_revision=args.from_revision
            )
        else:
            script = await admin.upgrade_sql(
                args.url, schema=args.schema, pooler=_pooler_for(admin.locate(args.url))
            )
        sys.stdout.write(script)
        return 0
    where = admin.locate(args.url).display
    bar = ProgressLine("migrate")
    try:
        before = await admin.migrate(
            args.url,
            schema=args.schema,
            lock_timeout=10.0 if args.lock_timeout is None else args.lock_timeout,
            progress=lambda done, total: bar.update(done, total, "revisions", force=True),
            pooler=_pooler_for(admin.locate(args.url)),
        )
    except SchemaError:
        raise
    except HistStoreError as exc:
        raise HistStoreError(f"{where}: {exc}") from exc
    finally:
        bar.close()
    if before.up_to_date:
        print(f"{where}: schema already at the newest revision ({before.head})")
    else:
        was = before.current or "no histstore schema"
        print(f"{where}: schema upgraded from {was} to {before.head} {bar.took()}")
    return 0


# ---------------------------------------------------------------------------- ls, show, stats


async def cmd_ls(args: argparse.Namespace) -> int:
    filters: dict[str, Any] = {
        "user": args.user,
        "metadata": dict(args.metadata) or None,
        "since": args.since,
        "until": args.until,
    }
    async with open_store(args.url, schema=args.schema, read_only=True) as store:
        infos = await admin.list_conversations(
            store,
            **filters,
            limit=None if args.limit == 0 else args.limit,
            order=args.order,
            descending=not args.asc,
        )
        if args.quiet or args.json:
            for info in infos:
                print(json.dumps(info.as_dict(), ensure_ascii=False) if args.json else info.id)
            return 0
        total = await admin.count_conversations(store, **filters)
    style = Style(sys.stdout)
    rows = [
        (i.id, i.user or "-", f"{i.length:,}", when(i.created_at), when(i.updated_at))
        for i in infos
    ]
    head = ("ID", "USER", "MESSAGES", "CREATED (UTC)", "UPDATED (UTC)")
    print_listing(style, head, rows, total=total, noun="conversations", right=(2,))
    return 0


async def cmd_search(args: argparse.Namespace) -> int:
    query = " ".join(args.query)
    async with open_store(args.url, schema=args.schema, read_only=True) as store:
        view = store.scoped(args.user) if args.user is not None else store
        hits = await view.search(query, conversation=args.conversation, limit=args.limit)
    if args.json:
        for h in hits:
            record = {"conversation": h.conversation, "position": h.position, "score": h.score}
            if h.thread is not None:
                record["thread"] = h.thread
            print(json.dumps({**record, "message": h.message.to_dict()}, ensure_ascii=False))
        return 0
    printer = HitPrinter(sys.stdout, query, color=args.color)
    for h in hits:
        printer.hit(h)
    if len(hits) == args.limit:
        print(printer.style.dim(f"the best {len(hits):,} hits shown (--limit N for more)"))
    elif not hits:
        print(printer.style.dim("no messages found"))
    return 0


async def cmd_reindex(args: argparse.Namespace) -> int:
    async with open_store(args.url, schema=args.schema) as store:
        view, bar = store.scoped(args.user) if args.user else store, ProgressLine("reindex")
        try:
            n = await admin.reindex(view, progress=lambda d, t: bar.update(d, t, "messages"))
        finally:
            bar.close()
        print(f"reindexed {n:,} messages ({bar.done:,} checked) {bar.took()}")
        if args.threads:
            return await _reindex_threads(view)
    return 0


async def _reindex_threads(store: Store) -> int:
    """``reindex --threads``: the LangGraph threads' message text, decoded by the saver."""
    try:
        from histstore.integrations.langgraph import HiststoreSaver
    except ImportError:
        print(MISSING_THREAD_SERDE, file=sys.stderr)
        return 1
    bar = ProgressLine("reindex")
    n = await HiststoreSaver(store).areindex_text()
    print(f"indexed {n:,} messages of LangGraph threads {bar.took()}")
    return 0


MISSING_THREAD_SERDE = (
    "histstore: LangGraph threads were not reindexed: decoding them needs LangGraph's"
    " serializer (langgraph-checkpoint), which is not installed; install it with:"
    " pip install 'histstore[langgraph]'"
)


async def cmd_backup(args: argparse.Namespace) -> int:
    bar = ProgressLine("backup")
    done = await admin.backup(args.url, args.dest)
    print(
        f"backed up {done.conversations:,} conversations ({done.messages:,} messages,"
        f" {size(done.bytes)}) to {done.path}, checked {bar.took()}"
    )
    return 0


async def cmd_stats(args: argparse.Namespace) -> int:
    where = admin.locate(args.url)
    async with open_store(args.url, schema=args.schema, read_only=True) as store:
        figures = await admin.stats(store.scoped(args.user) if args.user else store)
    files = {"main": "", "wal": "-wal", "shm": "-shm"} if where.file else {}
    sizes = {key: file_size(f"{where.file}{end}") for key, end in files.items()}
    if args.json:
        extra = {"file_bytes": sum(sizes.values())} if sizes else {}
        extra.update((f"{key}_bytes", n) for key, n in sizes.items())
        print(json.dumps({"database": where.display, **extra, **figures.as_dict()}))
        return 0
    shown = where.display
    if sizes:
        main, wal, shm = (size(n) for n in sizes.values())
        shown += f" (SQLite, {size(sum(sizes.values()))}: {main} file + {wal} WAL + {shm} shm)"
    f = figures
    rows = [
        ("database", shown),
        ("schema", f"revision {f.schema_revision} (newest)"),
        ("conversations", f"{f.conversations:,} (owners: {f.users:,})"),
        ("messages", f"{f.messages:,} (longest conversation: {f.longest:,})"),
        ("summaries", f"{f.summaries:,}"),
        ("metadata entries", f"{f.metadata_entries:,}"),
        ("named lists", f"{f.lists:,}"),
        ("list items", f"{f.list_items:,}"),
        ("write records", f"{f.write_records:,}"),
        ("threads", f"{f.threads:,} LangGraph threads ({f.checkpoints:,} checkpoints)"),
        ("first created", when(f.first_created) + (" UTC" if f.first_created else "")),
        ("last change", when(f.newest_change) + (" UTC" if f.newest_change else "")),
    ]
    if args.user:
        rows.insert(1, ("user", args.user))
    style = Style(sys.stdout)
    for key, value in rows:
        print(f"{style.dim(f'{key:<17}')} {value}")
    return 0


# ---------------------------------------------------------------------------- fork, clear, purge


async def cmd_fork(args: argparse.Namespace) -> int:
    async with open_store(args.url, schema=args.schema) as store:
        await store.fork(args.source, args.target, upto=args.upto)
        n = await store.count(args.target)
    print(f"forked {args.source!r} to {args.target!r} ({n:,} messages)")
    return 0


def _unique(ids: Sequence[str]) -> list[str]:
    return list(dict.fromkeys(ids))


async def cmd_clear(args: argparse.Namespace) -> int:
    if not args.ids and args.user is None:
        raise UsageError("clear needs conversation ids, or --user USER")
    async with open_store(args.url, schema=args.schema) as store:
        view = store.scoped(args.user) if args.user is not None else store
        if args.ids:
            # Every id is looked up before anything is deleted.
            found = [await admin.describe(view, cid) for cid in _unique(args.ids)]
            ids = [(i.id, i.length) for i in found]
            what = f"{ids[0][0]!r}" if len(ids) == 1 else f"{len(ids):,} conversations"
            messages = sum(n for _cid, n in ids)
        else:
            figures = await admin.stats(view)
            if figures.conversations == 0:
                print(f"no conversations of user {args.user!r}")
                return 0
            ids = [(cid, -1) for cid in await view.conversations()]
            what = f"all {len(ids):,} conversations of user {args.user!r}"
            messages = figures.messages
        # SPEC 10: one conversation by id is deleted as asked; several ask first.
        several = len(ids) > 1 or not args.ids
        if several and not await confirm(f"delete {what} ({messages:,} messages)?", args.yes):
            print("histstore: nothing deleted", file=sys.stderr)
            return 1
        bar = ProgressLine("clear")
        try:
            for done, (cid, _n) in enumerate(ids, 1):
                await view.clear(cid)
                bar.update(done, len(ids), "conversations")
        finally:
            bar.close()
    if args.ids:
        for cid, n in ids:
            print(f"cleared {cid!r} ({n:,} messages)")
    else:
        print(f"cleared {len(ids):,} conversations of user {args.user!r} ({messages:,} messages)")
    return 0


async def cmd_purge(args: argparse.Namespace) -> int:
    idle, shown = args.idle, span(args.idle)
    scope = f" of user {args.user!r}" if args.user is not None else ""
    async with open_store(args.url, schema=args.schema) as store:
        view = store.scoped(args.user) if args.user is not None else store
        threads = CheckpointStore(view)
        if args.dry_run:
            ids = await admin.purge_candidates(view, idle_for=idle)
            for cid in ids:
                print(cid)
            idle_threads = len(await threads.idle_threads(idle))
            print(
                f"{len(ids):,} conversations{scope} idle for more than {shown} would be purged,"
                f" and {idle_threads:,} threads (dry run: nothing deleted)",
                file=sys.stderr,
            )
            return 0
        question = f"delete every conversation and thread{scope} idle for more than {shown}?"
        if not await confirm(question, args.yes):
            print("histstore: nothing deleted", file=sys.stderr)
            return 1
        bar = ProgressLine("purge")
        try:
            n = await admin.purge(
                view, idle_for=idle, progress=lambda d, t: bar.update(d, t, "conversations")
            )
            gone = await threads.purge(
                idle_for=idle, progress=lambda d, t: bar.update(d, t, "threads")
            )
        finally:
            bar.close()
    print(
        f"purged {n:,} conversations{scope} and {gone:,} threads"
        f" (idle for more than {shown}) {bar.took()}"
    )
    return 0
