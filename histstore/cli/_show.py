"""``show``, ``log`` and ``revert``: a conversation, its change records, and going back.

``show`` prints the conversation as ``admin.tail`` reads it (one snapshot, only the
entries it prints): its details, then its entries with positions, times and roles, an
entry an editor made marked ``(by AUTHOR)``, and each aside drawn after the entry it
follows. ``show --json`` prints the messages as JSON Lines, streamed a page at a time
(``Store.stream``). ``log``
lists ``store.changes`` (never a message's content: counts, positions and entry ids),
``revert`` runs ``store.revert``.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime, timezone
from typing import IO, Any

from histstore import Aside, Change, Store, admin

from ._commands import open_store
from ._render import Printer, Style, change_summary, compact, table, when

__all__ = ["cmd_log", "cmd_revert", "cmd_show", "show_conversation"]

_PAGE = 500


async def cmd_show(args: argparse.Namespace) -> int:
    async with open_store(args.url, schema=args.schema, read_only=True) as store:
        await show_conversation(store, args.id, sys.stdout, last=args.last, as_json=args.json)
    return 0


def _iso(value: datetime | None) -> str | None:
    if value is None:
        return None
    return value.astimezone(timezone.utc).isoformat(timespec="microseconds")


async def show_conversation(
    store: Store, cid: str, out: IO[str], *, last: int | None = None, as_json: bool = False
) -> None:
    """Print a conversation's details, messages (authors marked) and asides; with
    ``as_json`` its messages as JSON Lines, read page by page."""
    info = await admin.describe(store, cid)
    start = 0 if last is None else max(info.length - last, 0)
    if as_json:
        async for m in store.stream(cid, start=start, stop=info.length, page=_PAGE):
            record = {
                "position": m.position,
                "created_at": _iso(m.created_at),
                "entry_id": m.entry_id,
                "author": m.author,
                "data": m.to_dict(),
            }
            out.write(json.dumps(record, ensure_ascii=False) + "\n")
        return
    view = await admin.tail(store, cid, last=last)
    metadata = await store.metadata(cid) if info.metadata_keys else {}
    summaries = await store.summaries(cid) if info.summaries else []
    style = Style(out)
    facts = [
        ("conversation", style.bold(cid)),
        ("user", info.user or "-"),
        ("created", when(info.created_at) + " UTC"),
        ("updated", when(info.updated_at) + " UTC"),
        ("messages", f"{view.length:,}"),
        ("revision", f"{view.revision:,}"),
    ]
    if view.halted is not None:
        facts.append(("halted", view.halted))
    newest = view.newest_turn
    if newest is not None:
        state = "open" if newest.end is None else newest.end
        facts.append(("turns", f"{view.turns:,} recorded (newest: {state})"))
    if info.system_prompt is not None:
        facts.append(("system prompt", info.system_prompt))
    if metadata:
        facts.append(("metadata", json.dumps(metadata, ensure_ascii=False)))
    facts.extend(("summary", f"#{sm.start}-#{sm.end}: {compact(sm.content)}") for sm in summaries)
    if info.lists:
        facts.append(("lists", ", ".join(f"{n} ({k:,} items)" for n, k in info.lists)))
    for key, text in facts:
        out.write(f"{style.dim(f'{key:<13}')} {text}\n")
    out.write("\n")
    start = view.start
    if start > 0:
        out.write(style.dim(f"  ... {start:,} earlier messages (--last shows more)") + "\n")
    drawn: dict[int | None, list[Aside]] = {}
    for aside in view.asides:
        drawn.setdefault(aside.after, []).append(aside)
    printer = Printer(out)
    if start == 0:
        for aside in drawn.get(None, []):
            printer.aside(aside)
    for position, entry in enumerate(view.entries, start):
        printer.message(
            entry.message, position=position, created_at=entry.created_at, author=entry.author
        )
        for aside in drawn.get(entry.entry_id, []):
            printer.aside(aside)


# ---------------------------------------------------------------------------- log


def _record(change: Change) -> dict[str, Any]:
    """A change record as ``log --json`` prints it: entry ids, never message content."""
    turn = change.turn
    return {
        "revision": change.revision,
        "kind": change.kind,
        "author": change.author,
        "at": _iso(change.at),
        "start": change.start,
        "removed": [e.entry_id for e in change.removed],
        "added": [e.entry_id for e in change.added],
        "moved": [list(m) for m in change.moved],
        "asides": [
            {
                "id": op.aside_id,
                "op": "add" if op.before is None else "remove" if op.after is None else "replace",
            }
            for op in change.asides
        ],
        "halt": None if change.halt is None else list(change.halt),
        "turn": None
        if turn is None
        else {
            "number": turn.number,
            "start": turn.start,
            "end": turn.end,
            "usage": None if turn.usage is None else dict(turn.usage),
        },
        "summary": change_summary(change),
    }


async def cmd_log(args: argparse.Namespace) -> int:
    async with open_store(args.url, schema=args.schema, read_only=True) as store:
        await admin.describe(store, args.id)  # an unknown id is "not found", as for show
        changes = await store.changes(args.id, since=args.since, limit=args.limit)
    if args.json:
        for change in changes:
            print(json.dumps(_record(change), ensure_ascii=False))
        return 0
    style = Style(sys.stdout)
    if not changes:
        after = f" after revision {args.since}" if args.since else ""
        print(style.dim(f"no change records{after}"))
        return 0
    rows = [
        (
            str(c.revision),
            when(c.at),
            c.kind,
            c.author or "-",
            change_summary(c),
        )
        for c in changes
    ]
    first, *rest = table(("REV", "TIME (UTC)", "KIND", "AUTHOR", "CHANGE"), rows, right=(0,))
    print(style.bold(first))
    for line in rest:
        print(line)
    return 0


# ---------------------------------------------------------------------------- revert


async def cmd_revert(args: argparse.Namespace) -> int:
    async with open_store(args.url, schema=args.schema) as store:
        before = (await store.edit(args.id)).revision
        revision = await store.revert(args.id, args.revision, by=args.by)
    if revision == before:
        print(
            f"{args.id!r} is already as it was at revision {args.revision};"
            f" nothing changed (revision {revision})"
        )
    else:
        print(f"reverted {args.id!r} to revision {args.revision}: now at revision {revision}")
    return 0
