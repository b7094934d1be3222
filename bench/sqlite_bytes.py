"""Benchmark: SQLite bytes per message and a scoped search, histstore beside a raw program.

Run from a checkout::

    python bench/sqlite_bytes.py [--conversations N] [--sides raw,histstore] [--dir DIR]

Both sides store ``--conversations`` (default 1,000) conversations of 100 chat messages
(10 to 60 words each, drawn with Zipf's law from 4,000 made-up words; one seed), one
write per conversation. The raw program is the minimal SQLite store with full-text
search: one table ``(conversation_id, position, data, created_at)`` keyed by
conversation and position, the message's compact JSON and histstore's time format, and
an external-content FTS5 table over the content (made as histstore makes its own).
Reported per side: bytes per message (the file after ``wal_checkpoint(TRUNCATE)`` and
``VACUUM``), the tables and indexes over 0.5% of it (``dbstat``), and for histstore the
median time of ``search(word, conversation="conv-5")`` for words held by about 95%, 80%,
7% and 0.1% of the messages.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sqlite3
import statistics
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import histstore
from histstore import Message

PER = 100
WORDS = [f"w{i}" for i in range(4000)]
WEIGHTS = [1 / (i + 1) for i in range(4000)]


def chats(n: int) -> list[list[tuple[str, str]]]:
    rng = random.Random(7)
    return [
        [
            (
                "user" if i % 2 == 0 else "assistant",
                " ".join(rng.choices(WORDS, WEIGHTS, k=rng.randint(10, 60))),
            )
            for i in range(PER)
        ]
        for _ in range(n)
    ]


def raw(path: Path, data: list[list[tuple[str, str]]]) -> None:
    con = sqlite3.connect(path)
    con.executescript(
        "CREATE TABLE messages(conversation_id TEXT NOT NULL, position INTEGER NOT NULL,"
        " data TEXT NOT NULL, created_at TEXT NOT NULL, PRIMARY KEY(conversation_id, position));"
        "CREATE VIEW messages_text AS SELECT rowid AS rid, json_extract(data, '$.content') AS t"
        " FROM messages;"
        "CREATE VIRTUAL TABLE messages_fts USING fts5(t, content='messages_text',"
        " content_rowid='rid', tokenize='unicode61 remove_diacritics 0', columnsize=0);"
    )
    at = datetime.now(timezone.utc).isoformat(" ")[:26]
    for c, msgs in enumerate(data):
        rows = [
            (f"conv-{c}", i, json.dumps({"role": r, "content": t}, separators=(",", ":")), at)
            for i, (r, t) in enumerate(msgs)
        ]
        with con:
            con.executemany("INSERT INTO messages VALUES (?, ?, ?, ?)", rows)
            con.execute(
                "INSERT INTO messages_fts(rowid, t) SELECT rowid, json_extract(data, '$.content')"
                " FROM messages WHERE conversation_id = ?",
                (f"conv-{c}",),
            )
    con.close()


async def hist(path: Path, data: list[list[tuple[str, str]]]) -> str:
    async with histstore.connect(path, durability="process") as store:
        for c, msgs in enumerate(data):
            made = [Message.user(t) if r == "user" else Message.assistant(t) for r, t in msgs]
            await store.write(f"conv-{c}", made)
    times = []
    async with histstore.connect(path) as store:
        for word in ("w0", "w1", "w50", "w3000"):
            await store.search(word, conversation="conv-5")
            took = []
            for _ in range(5):
                start = time.perf_counter()
                await store.search(word, conversation="conv-5")
                took.append(time.perf_counter() - start)
            times.append(f"{word} {statistics.median(took) * 1e3:.2f} ms")
    return "search(conversation=): " + ", ".join(times)


def sizes(path: Path, n: int) -> list[str]:
    con = sqlite3.connect(path)
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    con.execute("VACUUM")
    total = path.stat().st_size
    rows = con.execute("SELECT name, sum(pgsize) FROM dbstat GROUP BY name ORDER BY 2 DESC")
    lines = [f"{total / n:.1f} B/msg"]
    lines += [f"  {name:45} {size / n:7.1f}" for name, size in rows if size > 0.005 * total]
    con.close()
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--conversations", type=int, default=1000)
    parser.add_argument("--sides", default="raw,histstore")
    parser.add_argument("--dir", default=None)
    args = parser.parse_args()
    data = chats(args.conversations)
    n = args.conversations * PER
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        for side in args.sides.split(","):
            path = Path(tmp) / f"{side}.db"
            note = ""
            if side == "raw":
                raw(path, data)
            else:
                note = asyncio.run(hist(path, data))
            print(side, *sizes(path, n), note, sep="\n")


if __name__ == "__main__":
    main()
