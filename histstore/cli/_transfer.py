"""``export``, ``import`` and ``copy``: conversations, LangGraph threads and memory items,
moved through ``histstore.admin``'s transfers, with progress and a one-line summary."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from typing import Any

from histstore import HistStoreError, admin

from ._commands import open_store
from ._render import ProgressLine
from ._thread_values import newest_messages

__all__ = ["cmd_copy", "cmd_export", "cmd_import"]


def _batch(args: argparse.Namespace) -> dict[str, Any]:
    return {} if args.batch is None else {"batch": args.batch}


async def cmd_export(args: argparse.Namespace) -> int:
    async with open_store(args.url, schema=args.schema, read_only=True) as store:
        source = store.scoped(args.user) if args.user else store
        bar = ProgressLine("export")

        def progress(st: admin.TransferStats) -> None:
            bar.update(st.messages, st.total_messages, "messages")

        options: dict[str, Any] = {
            "ids": args.ids or (None if args.thread is None else []),
            "threads": args.thread,
            "user": args.user,
            "readable_threads": newest_messages(source),
        }
        target = args.output
        try:
            if target in (None, "-"):
                stats = await admin.export_store(source, sys.stdout, **options, progress=progress)
            else:
                # Written under another name first, so a failed export leaves no
                # file that looks complete.
                if os.path.isdir(target):  # noqa: ASYNC240 - one stat, before any work
                    raise HistStoreError(f"{target}: is a directory (-o takes a file name)")
                part = f"{target}.part"
                try:
                    with open(part, "w", encoding="utf-8", newline="\n") as out:  # noqa: ASYNC230
                        stats = await admin.export_store(source, out, **options, progress=progress)
                    os.replace(part, target)
                except BaseException:
                    with contextlib.suppress(OSError):
                        os.remove(part)  # a failed export leaves nothing behind
                    raise
        finally:
            bar.close()
    if sys.stderr.isatty() or target not in (None, "-"):
        where = "" if target in (None, "-") else f" to {target}"
        print(
            f"exported {stats.conversations:,} conversations, {stats.messages:,} messages,"
            f" {_threads(stats)}{where} {bar.took()}",
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
    try:
        async with open_store(args.url, create=True, schema=args.schema) as store:
            bar = ProgressLine("import")

            def progress(st: admin.TransferStats) -> None:
                bar.update(st.bytes_read, total, "bytes")

            try:
                stats = await admin.import_store(store, stream, **_batch(args), progress=progress)
            finally:
                bar.close()
    finally:
        if stream is not sys.stdin.buffer:
            stream.close()
    print(
        f"imported {stats.conversations:,} conversations ({stats.messages:,} messages) and"
        f" {_threads(stats)} {bar.took()}; {_unchanged(stats)}"
    )
    return 0


async def cmd_copy(args: argparse.Namespace) -> int:
    src = admin.locate(args.source).display
    dst = admin.locate(args.destination).display
    if src == dst:
        raise HistStoreError("the source and the destination are the same database")
    async with (
        open_store(args.source, schema=args.source_schema) as source,
        open_store(args.destination, create=True, schema=args.schema) as target,
    ):
        bar = ProgressLine("copy")

        def progress(st: admin.TransferStats) -> None:
            bar.update(st.messages, st.total_messages, "messages")

        try:
            stats = await admin.copy_store(source, target, **_batch(args), progress=progress)
        finally:
            bar.close()
    print(
        f"copied {stats.conversations:,} conversations and {_threads(stats)} from {src} to"
        f" {dst} {bar.took()}; {_unchanged(stats)}"
    )
    return 0


def _threads(stats: admin.TransferStats) -> str:
    threads = f"{stats.threads:,} threads ({stats.checkpoints:,} checkpoints)"
    return f"{threads}, {stats.items:,} memory items" if stats.items else threads


def _unchanged(stats: admin.TransferStats) -> str:
    more = f", {stats.skipped_items:,} memory items" if stats.skipped_items else ""
    return (
        f"{stats.skipped:,} already there unchanged (and {stats.skipped_threads:,} threads{more})"
    )
