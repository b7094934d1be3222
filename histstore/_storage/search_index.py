"""The full-text index's pending lists: moving listed messages into the index proper.

SQLite (``PendingIndex``):

A write does not index its messages itself: it lists the rowids of the messages it
inserted in ``PENDING_TABLE``, in its own transaction (``statements.search.ListedInserts``,
revision a2f6c8e4d0b3; from b1e6f0c4a7d3 an INSERT trigger did, whose presence made SQLite
stage every multi-row INSERT of messages in a temporary table). The index is FTS5 plus
that list: FTS5 holds exactly the messages that have text
(``statements.search.message_text``) and are not listed. Indexing the list
(``PendingIndex.index``) inserts the listed rows that have text into FTS5 in one
statement and takes them all off the list, in one write transaction: FTS5 then writes
one segment for many messages, where a write of its own wrote a small segment, and
merged segments every few writes, inside the write.

Who indexes the list: a store's writers, every so many commits, in a write of its own
(``IndexScheduler``, through the SQLite writer's queue); a store before its search reads FTS5
(``_ops.text_search``); a store that wrote, when it closes. A crash leaves the
list as it was, for the next store that writes or searches. A store opened with
``read_only=True`` cannot write the index: its search reads the listed rows through an
index of its own, made per search in the connection's temporary database
(``schema.UNLISTED_FTS``, read beside FTS5 in a transaction that is rolled back, which
drops it), whose ranks are computed over those messages alone.

PostgreSQL has no pending list: its index is a GIN index on the messages' own text
(``statements.search.PG_TEXT_INDEX``, revision 5b7e2d4a9c13), which the statement that
writes a message keeps.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Generator
from typing import Any, Literal

from sqlalchemy import (
    ColumnElement,
    bindparam,
    column,
    literal_column,
    select,
    table,
    text,
)
from sqlalchemy.types import BigInteger, Text

from . import schema as s
from .drivers import EXECUTE, FETCH, Driver, Program, Step
from .statements.search import message_text
from .states import transition

__all__ = [
    "CHUNK",
    "INDEX_GROUPS",
    "PENDING_TABLE",
    "IndexScheduler",
    "PendingIndex",
]

PENDING_TABLE = s.FTS_LISTED
"""The rowids of messages whose text FTS5 does not hold yet (SQLite; see the name)."""

CHUNK = 20_000
"""Listed messages indexed in one transaction at most by the background indexer (about
25 ms here); a search indexes the whole list at once."""


class PendingIndex:
    """The statements and programs that index SQLite's pending list."""

    def __init__(self, driver: Driver) -> None:
        compile_ = driver.compile
        row = bindparam("upto", type_=BigInteger)
        # The last rowid of the first ``n`` listed (all with -1), and how many they are.
        self._bound = compile_(
            text(
                "SELECT max(message_rowid), count(*) FROM (SELECT message_rowid"  # noqa: S608 - names, no input
                f" FROM {PENDING_TABLE} ORDER BY message_rowid LIMIT :n)"
            ).bindparams(bindparam("n", type_=BigInteger))
        )
        self.any = compile_(text(f"SELECT 1 FROM {PENDING_TABLE} LIMIT 1"))  # noqa: S608 - names, no input
        """One row when the list holds any message."""
        # The listed messages' rowids and text (``statements.search.message_text``), found
        # by rowid from the list (a join lets SQLite walk the messages table instead).
        pending = table(PENDING_TABLE, column("message_rowid"))
        rowid: ColumnElement[int] = literal_column("histstore_messages.rowid")

        def with_text(*listed: ColumnElement[bool]) -> Any:
            found = (
                select(rowid.label("rowid"), message_text(driver.dialect, s.messages).label("t"))
                .where(rowid.in_(select(pending.c.message_rowid).where(*listed)))
                .subquery("listed")
            )
            return select(found.c.rowid, found.c.t).where(found.c.t.is_not(None))

        fts = table(s.FTS_TABLE, column("rowid"), column("search_text"))
        upto = with_text(pending.c.message_rowid <= row)
        self._index = compile_(fts.insert().from_select(["rowid", "search_text"], upto))
        self._unlist = compile_(
            text(
                f"DELETE FROM {PENDING_TABLE} WHERE message_rowid <= :upto"  # noqa: S608 - names, no input
            ).bindparams(row)
        )
        self.listed = compile_(with_text())
        """The listed messages' rowids and text (for ``temp_fts``)."""
        self.temp_fts = compile_(
            text(
                "CREATE VIRTUAL TABLE IF NOT EXISTS temp.histstore_unlisted_fts"
                " USING fts5(search_text, tokenize='unicode61 remove_diacritics 0', columnsize=0)"
            )
        )
        """The read-only store's index, made like the database's (revision b7d4e2a91c30)."""
        self.temp_fill = compile_(
            text(
                "INSERT INTO temp.histstore_unlisted_fts(rowid, search_text) VALUES (:r, :t)"
            ).bindparams(bindparam("r", type_=BigInteger), bindparam("t", type_=Text))
        )

    def index(self, limit: int | None = CHUNK) -> Generator[Step, Any, bool]:
        """A write program: index the first ``limit`` listed messages (all with
        ``None``); returns whether the list may hold more."""
        upto, count = (yield FETCH, self._bound, {"n": -1 if limit is None else limit})[0]
        if upto is None:
            return False
        yield EXECUTE, self._index, {"upto": int(upto)}
        yield EXECUTE, self._unlist, {"upto": int(upto)}
        return bool(count == limit)


INDEX_GROUPS = 256
"""SQLite: commits that may have listed messages after which the store indexes the list
in the background (``IndexScheduler``)."""


class IndexScheduler:
    """Who indexes a writable SQLite store's pending list: one run at a time, a chunk
    per write transaction (``write``) while chunks find more.

    A run starts in the background once ``threshold`` commits (groups of writers) that
    may have listed messages were ``listed`` since the last one began, or once they
    listed ``CHUNK`` messages, whichever comes first (so a bulk load's list stays within
    about a chunk of the index, and ``close`` has little left), or on request (``soon``).
    ``close`` lets a run end, then indexes what was listed since, or what a run left.
    Best effort: a failed run leaves the list to a later run, to close, or to the next
    store (the list is durable).

    States (``state``): ``idle``, ``running`` (a background run), ``closing`` (no run
    starts in the background; ``close`` indexes the rest).
    """

    def __init__(
        self,
        index: Callable[[], Program[bool]],
        write: Callable[[Program[bool]], Awaitable[bool]],
        threshold: int,
        messages: int = CHUNK,
    ) -> None:
        self._index = index
        self._write = write
        self._threshold = threshold
        self._message_threshold = messages
        self.state: Literal["idle", "running", "closing"] = "idle"
        self._unindexed = 0  # commits that listed since the last run began
        self._messages = 0  # about how many messages they listed
        self._more = False  # the last run left more listed
        self._task: asyncio.Task[None] | None = None

    def listed(self, messages: int = 0) -> None:
        """A commit of the store that may have listed messages (about ``messages``)."""
        self._unindexed += 1
        self._messages += max(messages, 0)
        if self._unindexed >= self._threshold or self._messages >= self._message_threshold:
            self.soon()

    def caught_up(self) -> None:
        """A run committed that indexed the whole list after every earlier listing."""
        self._unindexed = self._messages = 0

    def soon(self) -> None:
        """Start a run in the background, unless one is under way or the store closes
        (a run cancelled before it began left its task behind)."""
        if self.state == "closing" or (self._task is not None and not self._task.done()):
            return
        self.state = transition(self.state, "running", _MOVES, "indexer")
        self._task = asyncio.ensure_future(self._background())

    async def _background(self) -> None:
        try:
            await self.run()
        finally:
            self._task = None
            if self.state == "running":
                self.state = transition(self.state, "idle", _MOVES, "indexer")

    async def run(self, *, to_end: bool = False) -> None:
        """Index the list, a chunk per transaction, while chunks find more; unless
        ``to_end``, only until the store starts closing."""
        self._unindexed = self._messages = 0
        try:
            while True:
                self._more = await self._write(self._index())
                if not self._more or (self.state == "closing" and not to_end):
                    return
        except Exception:  # noqa: BLE001 - best effort, see above
            self._unindexed = max(self._unindexed, 1)

    async def close(self) -> None:
        """Before the store closes: let a run end, then index what the store listed
        (again after a ``close`` that was cancelled)."""
        if self.state != "closing":
            self.state = transition(self.state, "closing", _MOVES, "indexer")
        if self._task is not None:
            # Not ``await self._task``: a run cancelled by the loop's shutdown must not
            # make ``close`` raise; a cancelled ``close`` still raises, leaving the run be.
            await asyncio.wait([self._task])
        if self._unindexed or self._more:
            await self.run(to_end=True)


_MOVES: dict[str, tuple[str, ...]] = {
    "idle": ("running", "closing"),
    # running -> running: a run cancelled before it began (loop shutdown) left its task
    # ended and its state behind; the next ``soon`` starts another.
    "running": ("idle", "running", "closing"),
    "closing": (),
}
