"""The command line's grammar: the argument parser and the parsers of its values."""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any

import histstore

from . import _commands, _demo, _show, _threads, _transfer

__all__ = ["build_parser", "parse_duration", "parse_metadata", "parse_when"]

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


def parse_when(text: str, *, now: datetime | None = None) -> datetime:
    """A point in time: ISO 8601 (``2024-05-01``, ``2024-05-01T12:00``, with an offset or
    ``Z``; no offset means UTC), or a duration such as ``30d`` meaning that long ago.

    Raises:
        ValueError: neither form.
    """
    try:
        ago = parse_duration(text)
    except ValueError:
        pass
    else:
        return (now or datetime.now(timezone.utc)) - ago
    iso = text.strip()
    if iso[-1:] in ("Z", "z"):
        iso = iso[:-1] + "+00:00"
    try:
        value = datetime.fromisoformat(iso)
    except ValueError:
        raise ValueError(
            f"not a time: {text!r} (use ISO 8601 such as 2024-05-01 or"
            " 2024-05-01T12:00:00+02:00, or a duration ago such as 30d)"
        ) from None
    if value.tzinfo is None:
        value = value.replace(tzinfo=timezone.utc)
    return value


def parse_metadata(text: str) -> tuple[str, Any]:
    """``KEY=VALUE``: the value is JSON when it parses as JSON, else the string itself.

    Raises:
        ValueError: no ``=``, or an empty key.
    """
    key, sep, raw = text.partition("=")
    if not sep or not key:
        raise ValueError(f"not KEY=VALUE: {text!r}")
    try:
        value = json.loads(raw)
    except ValueError:
        value = raw
    return key, value


def _argument(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """An argparse type from a parser that raises ``ValueError`` (a usage error, exit 2)."""

    def convert(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    convert.__name__ = parse.__name__
    return convert


def _int_from(lowest: int) -> Callable[[str], int]:
    def number(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise ValueError(f"not a number: {text!r}") from None
        if value < lowest:
            raise ValueError(f"must be at least {lowest}")
        return value

    return number


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"not a number of seconds: {text!r}") from None
    if not 0 < value < float("inf"):
        raise ValueError("must be more than 0 seconds")
    return value


_positive = _argument(_int_from(1))
_non_negative = _argument(_int_from(0))


def _pooler_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--pooler",
        choices=["transaction"],
        default=None,
        help="PostgreSQL: 'transaction' when the URL reaches the server through a"
        " transaction-mode pooler (PgBouncer's pool_mode=transaction, a provider's pooled"
        " port); it applies to every PostgreSQL URL of the command",
    )


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``histstore`` command."""
    parser = argparse.ArgumentParser(
        prog="histstore",
        description="Conversation history for LLM agents, kept in SQL. Start with"
        " 'histstore demo'.",
        epilog="Every command takes --url (a file path or a sqlite:// or postgresql:// URL);"
        " the default is $HISTSTORE_URL, else histstore.db in the current directory.",
    )
    parser.add_argument("--version", action="version", version=f"histstore {histstore.__version__}")
    url = argparse.ArgumentParser(add_help=False)
    url.add_argument(
        "--url",
        metavar="URL",
        default=None,
        help="database: a file path or URL (default: $HISTSTORE_URL, else histstore.db)",
    )
    url.add_argument(
        "--schema",
        metavar="NAME",
        default=None,
        help="PostgreSQL: the schema holding histstore's tables (default: the usual one)",
    )
    _pooler_option(url)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def command(name: str, handler: Any, help: str, *, with_url: bool = True) -> Any:
        p = sub.add_parser(name, help=help, description=help, parents=[url] if with_url else [])
        p.set_defaults(handler=handler)
        return p

    def user_option(p: argparse.ArgumentParser, help: str) -> None:
        p.add_argument("--user", metavar="USER", help=help)

    c = _commands
    command("demo", _demo.cmd_demo, "run a scripted agent conversation and show what was stored")

    p = command("migrate", c.cmd_migrate, "create or upgrade the database schema")
    p.add_argument(
        "--sql",
        action="store_true",
        help="print the SQL from the database's current revision instead of running it",
    )
    p.add_argument(
        "--from",
        dest="from_revision",
        metavar="REV",
        help="with --sql: the SQL from revision REV (base: no schema yet), without connecting",
    )
    p.add_argument(
        "--lock-timeout",
        type=_argument(_seconds),
        metavar="S",
        help="wait at most S seconds for any one lock, then roll back and retry (10)",
    )

    p = command("ls", c.cmd_ls, "list conversations")
    user_option(p, "only this user's conversations")
    p.add_argument("--limit", type=_non_negative, default=50, help="at most N (0: all; 50)")
    p.add_argument(
        "--order", choices=("updated", "created", "id"), default="updated", help="(updated)"
    )
    p.add_argument("--asc", action="store_true", help="oldest (or lowest id) first")
    when = "ISO 8601 time or duration ago (30d)"
    p.add_argument(
        "--since",
        type=_argument(parse_when),
        metavar="WHEN",
        help=f"changed at or after WHEN ({when})",
    )
    p.add_argument(
        "--until", type=_argument(parse_when), metavar="WHEN", help="changed before WHEN"
    )
    p.add_argument(
        "--metadata",
        type=_argument(parse_metadata),
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="only those whose metadata has KEY equal to VALUE (JSON, else a string); repeatable",
    )
    out = p.add_mutually_exclusive_group()
    out.add_argument("-q", "--quiet", action="store_true", help="print only the ids")
    out.add_argument("--json", action="store_true", help="one JSON object per conversation")

    p = command(
        "show",
        _show.cmd_show,
        "print a conversation's messages (an editor's marked 'by'), asides and details",
    )
    p.add_argument("id", metavar="ID")
    p.add_argument("--last", type=_non_negative, metavar="N", help="only the newest N messages")
    p.add_argument("--json", action="store_true", help="messages as JSON Lines")

    p = command("log", _show.cmd_log, "list a conversation's change records, oldest first")
    p.add_argument("id", metavar="ID")
    p.add_argument(
        "--since", type=_non_negative, default=0, metavar="N", help="only those after revision N"
    )
    p.add_argument("--limit", type=_positive, metavar="N", help="at most N records")
    p.add_argument("--json", action="store_true", help="one JSON object per record")

    p = command(
        "revert",
        _show.cmd_revert,
        "make a conversation's messages, asides and halt what they were at REVISION"
        " (a new change; 0: empty)",
    )
    p.add_argument("id", metavar="ID")
    p.add_argument("revision", type=_non_negative, metavar="REVISION")
    p.add_argument(
        "--by", default="cli:revert", metavar="WHO", help="the change's author (cli:revert)"
    )

    p = command("search", c.cmd_search, "find messages by the words in their text")
    p.add_argument(
        "query",
        nargs="+",
        metavar="QUERY",
        help='words (all must match) and "quoted phrases", any case; several are joined',
    )
    p.add_argument("--conversation", metavar="ID", help="only in this conversation")
    user_option(p, "only this user's conversations")
    p.add_argument("--limit", type=_positive, default=10, metavar="N", help="at most N hits (10)")
    p.add_argument("--json", action="store_true", help="one JSON object per hit, best first")
    p.add_argument(
        "--color",
        choices=("auto", "always", "never"),
        default="auto",
        help="mark the matches (auto: when stdout is a terminal and NO_COLOR is unset)",
    )

    p = command(
        "reindex",
        c.cmd_reindex,
        "recompute every message's search text and index (and adapter envelopes' roles)",
    )
    user_option(p, "only this user's conversations (and threads)")
    p.add_argument(
        "--threads",
        action="store_true",
        help="also rebuild LangGraph threads' message text from their newest checkpoints"
        " (needs langgraph installed)",
    )

    p = command(
        "backup",
        c.cmd_backup,
        "copy an SQLite database to a new file while it is in use, and check the copy",
    )
    p.add_argument("dest", metavar="DEST", help="the new file (it must not exist)")

    p = command("stats", c.cmd_stats, "summarize what the database holds")
    user_option(p, "only this user's conversations")
    p.add_argument("--json", action="store_true", help="as one JSON object")

    p = command(
        "export",
        _transfer.cmd_export,
        "write conversations and LangGraph threads as JSON Lines (all by default)",
    )
    p.add_argument("ids", nargs="*", metavar="ID")
    p.add_argument(
        "--thread",
        action="append",
        metavar="THREAD",
        help="export this LangGraph thread (repeatable; with IDs or --thread only those go)",
    )
    user_option(p, "only this user's conversations and threads (someone else's is not found)")
    p.add_argument("-o", "--output", metavar="FILE", help="write to FILE (default: stdout)")

    batch = "conversation rows per transaction (default: the library's)"
    p = command("import", _transfer.cmd_import, "load an export file ('-' for stdin)")
    p.add_argument("file", metavar="FILE")
    p.add_argument("--batch", type=_positive, default=None, help=batch)

    p = command(
        "copy",
        _transfer.cmd_copy,
        "copy every conversation and LangGraph thread from one database to another",
        with_url=False,
    )
    p.add_argument("source", metavar="SRC_URL")
    p.add_argument("destination", metavar="DST_URL")
    p.add_argument("--batch", type=_positive, default=None, help=batch)
    p.add_argument("--source-schema", metavar="NAME", help="PostgreSQL schema of SRC's tables")
    p.add_argument("--schema", metavar="NAME", help="PostgreSQL schema of DST's tables")
    _pooler_option(p)

    p = command("fork", c.cmd_fork, "copy a conversation (or its first N messages) to a new id")
    p.add_argument("source", metavar="SRC")
    p.add_argument("target", metavar="DST")
    p.add_argument("--upto", type=_non_negative, metavar="N", help="copy only N messages")

    p = command("clear", c.cmd_clear, "delete conversations and everything they hold")
    p.add_argument("ids", nargs="*", metavar="ID")
    user_option(p, "every conversation of this user (with IDs: only those, when theirs)")
    p.add_argument("-y", "--yes", action="store_true", help="do not ask (needed without a tty)")

    p = command(
        "purge", c.cmd_purge, "delete conversations and LangGraph threads not changed for a while"
    )
    p.add_argument(
        "--idle",
        required=True,
        type=_argument(parse_duration),
        metavar="DURATION",
        help="e.g. 90m, 12h, 30d",
    )
    user_option(p, "only this user's conversations")
    p.add_argument("--dry-run", action="store_true", help="list them, delete nothing")
    p.add_argument("-y", "--yes", action="store_true", help="do not ask (needed without a tty)")

    _threads.add_threads_command(sub, url, _argument(parse_duration), _non_negative)
    return parser
