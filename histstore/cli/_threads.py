"""``threads ls``, ``threads show THREAD`` and ``threads prune``: LangGraph threads, through
``histstore.checkpoints.CheckpointStore`` (its public catalog and prune)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any

from histstore import HistStoreError
from histstore.checkpoints import CheckpointStore, ThreadInfo

from ._commands import UsageError, confirm, open_store
from ._render import ProgressLine, Style, print_listing, span, table, when
from ._thread_values import channel_values, print_value

__all__ = ["add_threads_command"]


def add_threads_command(
    sub: Any,
    url: argparse.ArgumentParser,
    duration: Callable[[str], Any],
    count: Callable[[str], Any],
) -> None:
    """The ``threads`` command and its subcommands (``duration``, ``count``: argument
    types for ``--idle`` and ``--limit``)."""
    about = "LangGraph threads (HiststoreSaver's checkpoints): list, show, prune"
    threads = sub.add_parser("threads", help=about, description=about)
    inner = threads.add_subparsers(dest="threads_command", metavar="ACTION", required=True)

    def action(name: str, handler: Any, help: str) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = inner.add_parser(
            name, help=help, description=help, parents=[url]
        )
        p.set_defaults(handler=handler)
        return p

    def user(p: argparse.ArgumentParser) -> None:
        p.add_argument("--user", metavar="USER", help="only this user's threads")

    p = action("ls", cmd_threads_ls, "list threads, most recently changed first")
    user(p)
    p.add_argument("--limit", type=count, default=50, help="at most N (0: all; 50)")
    p.add_argument(
        "--idle", type=duration, metavar="DURATION", help="only those idle longer (e.g. 30d)"
    )
    out = p.add_mutually_exclusive_group()
    out.add_argument("-q", "--quiet", action="store_true", help="print only the ids")
    out.add_argument("--json", action="store_true", help="one JSON object per thread")

    p = action(
        "show",
        cmd_threads_show,
        "print a thread's messages (its newest checkpoint's) and its checkpoints, newest first",
    )
    p.add_argument("thread", metavar="THREAD")
    user(p)
    p.add_argument("--limit", type=count, default=50, help="at most N checkpoints (0: all; 50)")
    p.add_argument("--json", action="store_true", help="one JSON object per checkpoint")
    p.add_argument(
        "--channel", default="messages", metavar="NAME", help="the channel shown (messages)"
    )
    shown = p.add_mutually_exclusive_group()
    shown.add_argument(
        "--every", action="store_true", help="the channel of every checkpoint listed"
    )
    shown.add_argument(
        "--checkpoints", action="store_true", help="the checkpoints only (nothing decoded)"
    )

    p = action(
        "prune",
        cmd_threads_prune,
        "keep only the latest checkpoint of each namespace of threads, or delete them",
    )
    p.add_argument("threads", nargs="*", metavar="THREAD")
    p.add_argument(
        "--idle", type=duration, metavar="DURATION", help="every thread idle longer (e.g. 30d)"
    )
    how = p.add_mutually_exclusive_group()
    how.add_argument(
        "--keep-latest",
        dest="delete",
        action="store_false",
        help="keep each namespace's latest checkpoint with its values and writes (default)",
    )
    how.add_argument("--delete", dest="delete", action="store_true", help="delete the threads")
    p.set_defaults(delete=False)
    user(p)
    p.add_argument("--dry-run", action="store_true", help="list them, change nothing")
    p.add_argument("-y", "--yes", action="store_true", help="do not ask (needed without a tty)")


def _namespaces(info: ThreadInfo) -> str:
    names = [ns or "(root)" for ns in info.namespaces]
    shown = ", ".join(names[:3])
    return f"{shown} +{len(names) - 3}" if len(names) > 3 else shown or "-"


async def cmd_threads_ls(args: argparse.Namespace) -> int:
    limit = None if args.limit == 0 else args.limit
    async with open_store(args.url, schema=args.schema, read_only=True) as store:
        view = CheckpointStore(store.scoped(args.user) if args.user else store)
        infos = await view.threads(limit=limit, idle_for=args.idle)
        if args.quiet or args.json:
            for info in infos:
                print(json.dumps(info.as_dict()) if args.json else info.thread_id)
            return 0
        total = await view.count_threads(idle_for=args.idle)
    style = Style(sys.stdout)
    rows = [
        (i.thread_id, i.user or "-", f"{i.checkpoints:,}", when(i.updated_at), _namespaces(i))
        for i in infos
    ]
    head = ("THREAD", "USER", "CHECKPOINTS", "UPDATED (UTC)", "NAMESPACES")
    print_listing(style, head, rows, total=total, noun="threads")
    return 0


async def cmd_threads_show(args: argparse.Namespace) -> int:
    async with open_store(args.url, schema=args.schema, read_only=True) as store:
        view = store.scoped(args.user) if args.user else store
        catalog = CheckpointStore(view)
        info = await catalog.thread(args.thread)
        shown = await catalog.checkpoints(
            args.thread, limit=None if args.limit == 0 else args.limit
        )
        values: dict[str, Any] = {}
        if not args.checkpoints:
            wanted = [cp.checkpoint_id for cp in shown if cp.checkpoint_ns == ""]
            values = await channel_values(
                view, args.thread, args.channel, wanted[: 1 if not args.every else None]
            )
    if args.json:
        for cp in shown:
            record = cp.as_dict()
            if cp.checkpoint_ns == "" and cp.checkpoint_id in values:
                record[args.channel] = values[cp.checkpoint_id]
            print(json.dumps(record, ensure_ascii=False))
        return 0
    style = Style(sys.stdout)
    details = [
        ("thread", info.thread_id),
        ("user", info.user or "-"),
        ("checkpoints", f"{info.checkpoints:,}"),
        ("namespaces", ", ".join(ns or "(root)" for ns in info.namespaces) or "-"),
        ("created", when(info.created_at) + " UTC"),
        ("updated", when(info.updated_at) + " UTC"),
    ]
    for key, value in details:
        print(f"{style.dim(f'{key:<12}')} {value}")
    print()
    for checkpoint_id, value in values.items():
        print(style.bold(f"{args.channel} of checkpoint {checkpoint_id}"))
        print_value(sys.stdout, value)
        print()
    rows = [
        (
            cp.checkpoint_id,
            cp.parent_checkpoint_id or "-",
            cp.checkpoint_ns or "(root)",
            "-" if cp.step is None else str(cp.step),
            "-" if cp.source is None else str(cp.source),
            str(cp.writes),
            ", ".join(cp.channels) or "-",
        )
        for cp in shown
    ]
    head = ("CHECKPOINT", "PARENT", "NAMESPACE", "STEP", "SOURCE", "WRITES", "CHANNELS")
    first, *rest = table(head, rows, right=(3, 5))
    print(style.bold(first))
    for line in rest:
        print(line)
    if len(rows) < info.checkpoints:
        print(
            style.dim(
                f"{len(rows)} of {info.checkpoints:,} checkpoints shown (--limit 0 shows all)"
            )
        )
    return 0


async def cmd_threads_prune(args: argparse.Namespace) -> int:
    if bool(args.threads) == (args.idle is not None):
        raise UsageError("threads prune needs thread ids or --idle DURATION (not both)")
    scope = f" of user {args.user!r}" if args.user is not None else ""
    async with open_store(args.url, schema=args.schema) as store:
        view = CheckpointStore(store.scoped(args.user) if args.user else store)
        if args.threads:  # every id is looked up before anything changes
            infos = [await view.thread(t) for t in dict.fromkeys(args.threads)]
            what = f"{infos[0].thread_id!r}" if len(infos) == 1 else f"{len(infos):,} threads"
        else:
            infos = await view.threads(idle_for=args.idle)
            what = f"{len(infos):,} threads{scope} idle for more than {span(args.idle)}"
        verb = "delete" if args.delete else "prune to their latest checkpoints"
        if args.dry_run:
            for info in infos:
                print(info.thread_id)
            print(f"would {verb} {what} (dry run: nothing changed)", file=sys.stderr)
            return 0
        several = len(infos) > 1 or not args.threads
        if infos and several and not await confirm(f"{verb} {what}?", args.yes):
            print("histstore: nothing changed", file=sys.stderr)
            return 1
        bar = ProgressLine("prune")
        try:
            for done, info in enumerate(infos, 1):
                await _prune(view, info.thread_id, args.delete)
                bar.update(done, len(infos), "threads")
        finally:
            bar.close()
    _report(infos, args.delete, bar.took())
    return 0


async def _prune(view: CheckpointStore, thread_id: str, delete: bool) -> None:
    try:
        await view.prune([thread_id], keep_latest=not delete)
    except NotImplementedError as exc:
        raise HistStoreError(f"{exc} (use --delete, or leave it)") from None


def _report(infos: Sequence[ThreadInfo], delete: bool, took: str) -> None:
    total = sum(i.checkpoints for i in infos)
    if delete:
        print(f"deleted {len(infos):,} threads ({total:,} checkpoints) {took}")
        return
    removed = total - sum(len(i.namespaces) for i in infos)
    print(f"pruned {len(infos):,} threads: removed {removed:,} of {total:,} checkpoints {took}")
