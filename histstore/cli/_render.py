"""Terminal output: styles, a progress line, tables, and messages of every supported shape.

Message shapes drawn: Chat Completions (``tool_calls`` with ``function``, ``tool``
messages with ``tool_call_id``, the older ``function_call``), LangChain's stored form
(``tool_calls`` entries with ``name`` and ``args``, ``invalid_tool_calls``), the
Responses API (``function_call`` / ``function_call_output`` items, reasoning, message
items) and Anthropic content blocks (``tool_use`` / ``tool_result``, ``thinking``).
Nothing here touches the database.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import time
from collections.abc import Sequence
from datetime import datetime, timedelta, timezone
from typing import IO

import histstore
from histstore import Message

from ._messages import compact as compact
from ._messages import message_lines as message_lines

__all__ = [
    "HitPrinter",
    "Printer",
    "ProgressLine",
    "Style",
    "change_summary",
    "compact",
    "message_lines",
    "query_pattern",
    "snippet",
    "span",
    "table",
    "when",
]


_ROLE_COLORS = {
    "user": "1;34",
    "human": "1;34",
    "assistant": "1;32",
    "ai": "1;32",
    "system": "1;35",
    "developer": "1;35",
    "tool": "1;33",
}


class Style:
    """ANSI styling for a terminal. ``color="auto"``: on when the stream is a tty and
    NO_COLOR is not set; ``"always"`` and ``"never"`` decide regardless."""

    def __init__(self, stream: IO[str], color: str = "auto") -> None:
        auto = stream.isatty() and not os.environ.get("NO_COLOR")
        self.on = color == "always" or (color == "auto" and auto)

    def _wrap(self, code: str, text: str) -> str:
        return f"\033[{code}m{text}\033[0m" if self.on else text

    def bold(self, text: str) -> str:
        return self._wrap("1", text)

    def dim(self, text: str) -> str:
        return self._wrap("2", text)

    def role(self, role: str, text: str) -> str:
        return self._wrap(_ROLE_COLORS.get(role, "1"), text)

    def mark(self, text: str) -> str:
        """A search match: bold and reversed."""
        return self._wrap("1;7", text)


class ProgressLine:
    """A self-rewriting progress line on stderr, drawn only when stderr is a terminal."""

    def __init__(self, label: str) -> None:
        self._label = label
        self._on = sys.stderr.isatty()
        self._last = 0.0
        self._start = time.monotonic()
        self._drawn = False
        self.done = 0  # the last count given to update

    def update(self, done: int, total: int | None, unit: str, *, force: bool = False) -> None:
        self.done = done
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

    def took(self) -> str:
        """``in 1.2 s``: the time since the line was made, as a summary line ends."""
        return f"in {time.monotonic() - self._start:.1f} s"


def file_size(path: str) -> int:
    """A file's bytes; 0 when it is gone (SQLite's last connection removes -wal, -shm)."""
    with contextlib.suppress(FileNotFoundError):
        return os.stat(path).st_size
    return 0


def size(n: int) -> str:
    """A number of bytes for people: ``29.2 MB``, ``32.8 kB``, ``0 B``."""
    for unit, scale in (("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if n >= scale:
            return f"{n / scale:,.1f} {unit}"
    return f"{n:,} B"


def when(value: datetime | None) -> str:
    """A time as ``YYYY-MM-DD HH:MM:SS`` in UTC, or ``-``."""
    if value is None:
        return "-"
    return value.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def span(value: timedelta) -> str:
    """A duration in ``--idle`` units, days and smaller: ``1d12h``, ``1h30m``."""
    seconds = int(value.total_seconds())
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if seconds >= size:
            parts.append(f"{seconds // size}{unit}")
            seconds %= size
    return "".join(parts) or "0s"


def table(
    head: Sequence[str], rows: Sequence[Sequence[str]], *, right: Sequence[int] = ()
) -> list[str]:
    """Aligned columns; the first is cut at 60 characters, those in ``right`` align right."""
    widths = [max([len(head[i]), *(len(r[i]) for r in rows)]) for i in range(len(head))]
    widths[0] = min(widths[0], 60)

    def line(cells: Sequence[str]) -> str:
        out = []
        for i, cell in enumerate(cells):
            text = cell if len(cell) <= widths[i] else cell[: widths[i] - 1] + "~"
            out.append(text.rjust(widths[i]) if i in right else text.ljust(widths[i]))
        return "  ".join(out).rstrip()

    return [line(head), *(line(r) for r in rows)]


def print_listing(
    style: Style,
    head: Sequence[str],
    rows: Sequence[Sequence[str]],
    *,
    total: int,
    noun: str,
    right: Sequence[int] = (),
) -> None:
    """A listing on stdout: ``table`` with its head in bold, then how many of ``total``
    ``noun`` it shows when not all, or that there are none."""
    first, *rest = table(head, rows, right=right)
    print(style.bold(first))
    for line in rest:
        print(line)
    if len(rows) < total:
        print(style.dim(f"{len(rows)} of {total:,} {noun} shown (--limit 0 shows all)"))
    elif not rows:
        print(style.dim(f"no {noun}"))


class Printer:
    """Prints messages with positions, roles and times, readable on a terminal; an
    entry an editor made is marked ``(by AUTHOR)``, and asides are drawn as
    ``aside #ID`` lines where they stand."""

    _HEAD = 17  # the width of a message's position and time columns

    def __init__(self, out: IO[str]) -> None:
        self.out = out
        self.style = Style(out)
        self._day: str | None = None

    def message(
        self,
        m: Message,
        *,
        position: int | None = None,
        created_at: datetime | None = None,
        author: str | None = None,
    ) -> None:
        """One message (its own position, time and author unless given)."""
        role = m.role
        position = m.position if position is None else position
        created_at = m.created_at if created_at is None else created_at
        author = m.author if author is None else author
        stamp = created_at.astimezone(timezone.utc) if created_at else None
        day = stamp.strftime("%Y-%m-%d") if stamp else None
        if day is not None and day != self._day:
            self._day = day
            self.out.write(self.style.dim(f"  -- {day} (UTC) --") + "\n")
        clock = stamp.strftime("%H:%M:%S") if stamp else "        "
        lines = message_lines(m.to_dict())
        head = f"{position if position is not None else '':>5}  {clock}  "
        label = self.style.role(role, f"{role:<10}")
        mark = "" if author is None else self.style.bold(f"(by {author})") + " "
        self.out.write(self.style.dim(head) + label + " " + mark + lines[0] + "\n")
        pad = " " * (len(head) + 11)
        for line in lines[1:]:
            self.out.write(pad + line + "\n")

    def aside(self, aside: histstore.Aside) -> None:
        """An aside, drawn where it stands (after the message printed last)."""
        label = self.style.dim(f"{'aside #' + str(aside.aside_id):<10}")
        self.out.write(" " * self._HEAD + label + " " + compact(aside.value) + "\n")


def change_summary(change: histstore.Change) -> str:
    """What a change record did, in a few words and counts (no message content):
    ``-2 +1 at 0`` (entries removed and added at a position; ``at end`` for a plain
    write or pop), asides added, replaced, removed or moved, a halt, a turn record."""
    parts: list[str] = []
    if change.removed or change.added:
        counts = [f"-{len(change.removed)}"] if change.removed else []
        counts += [f"+{len(change.added)}"] if change.added else []
        where = "end" if change.start is None else str(change.start)
        parts.append(f"{' '.join(counts)} at {where}")
    if change.moved:
        parts.append(f"{len(change.moved)} aside{'s' if len(change.moved) > 1 else ''} moved")
    for op in change.asides:
        what = "added" if op.before is None else "removed" if op.after is None else "replaced"
        parts.append(f"aside #{op.aside_id} {what}")
    if change.halt is not None:
        after = change.halt[1]
        parts.append("halt cleared" if after is None else f"halted: {after}")
    if change.turn is not None:
        turn = change.turn
        parts.append(f"turn {turn.number} {'opened' if turn.end is None else turn.end}")
    return ", ".join(parts) or "no change"


# ---------------------------------------------------------------------------- search hits

_WORD = r"[^\W_]+"  # letters and digits; "_" and punctuation separate words, as in the indexes


def query_pattern(query: str) -> re.Pattern[str] | None:
    """Where a search query's words and ``"quoted phrases"`` occur in a text: whole
    words in any case, a phrase's words separated by anything but letters and digits.
    ``None`` when the query holds no word. (For highlighting only; the store decides
    what matches.)"""
    terms: list[str] = []
    for i, chunk in enumerate(query.split('"')):
        words = [re.escape(w) for w in re.findall(_WORD, chunk)]
        if i % 2 and words:
            terms.append(r"[\W_]+".join(words))
        else:
            terms.extend(words)
    if not terms:
        return None
    terms.sort(key=len, reverse=True)  # a phrase before its own first word
    edge = r"[^\W_]"
    return re.compile(rf"(?<!{edge})(?:{'|'.join(terms)})(?!{edge})", re.IGNORECASE)


def snippet(
    text: str, pattern: re.Pattern[str] | None, *, width: int = 100
) -> tuple[str, list[tuple[int, int]]]:
    """About ``width`` characters of ``text`` on one line (whitespace collapsed) around
    the first match of ``pattern`` (the start when nothing matches), cut at spaces where
    one is near, with ``...`` where text was left out; and the spans of the matches that
    lie wholly inside the returned line, in order."""
    flat = " ".join(text.split())
    first = pattern.search(flat) if pattern is not None else None
    start, end = 0, len(flat)
    if len(flat) > width:
        if first is not None:
            start = max(0, first.start() - max(width - len(first.group()), 0) // 3)
        end = min(len(flat), start + width)
        start = max(0, end - width)
        keep_from = first.start() if first is not None else start + 15
        keep_to = first.end() if first is not None else end - 15
        if start > 0 and flat[start - 1] != " ":
            cut = flat.find(" ", start, min(start + 15, keep_from))
            start = cut + 1 if cut != -1 else start
        if end < len(flat) and flat[end] != " ":
            cut = flat.rfind(" ", max(end - 15, keep_to), end)
            end = cut if cut != -1 else end
    start += flat[start:end].startswith(" ")
    end -= flat[start:end].endswith(" ")
    head = "..." if start > 0 else ""
    tail = "..." if end < len(flat) else ""
    line = head + flat[start:end] + tail
    shift = len(head) - start
    spans: list[tuple[int, int]] = []
    if pattern is not None:
        for m in pattern.finditer(flat):
            if m.start() >= start and m.end() <= end:
                spans.append((m.start() + shift, m.end() + shift))
    return line, spans


class HitPrinter:
    """Prints search hits: conversation (``thread <id>`` for a LangGraph thread's
    message), position, role and score, then a snippet of the message's indexed text
    with the query's words marked (plain text off a terminal)."""

    def __init__(self, out: IO[str], query: str, *, color: str = "auto") -> None:
        self.out = out
        self.style = Style(out, color)
        self.pattern = query_pattern(query)

    def hit(self, hit: histstore.Hit) -> None:
        m = hit.message
        style = self.style
        where = style.bold(hit.conversation)
        if hit.thread is not None:  # a LangGraph thread's message, by its index
            where = f"thread {style.bold(hit.thread)}"
        head = f"{where}  #{hit.position}  {style.role(m.role, m.role)}"
        self.out.write(f"{head}  {style.dim(f'score {hit.score:.4g}')}\n")
        text = histstore.indexed_text(m)
        if text is None:
            text = " ".join(message_lines(m.to_dict()))
        line, spans = snippet(text, self.pattern)
        parts, at = [], 0
        for lo, hi in spans:
            parts += [line[at:lo], style.mark(line[lo:hi])]
            at = hi
        self.out.write("    " + "".join(parts) + line[at:] + "\n")
