"""The programs import and copy run: make a stored conversation equal to an incoming one.

An incoming conversation (``Incoming``) has been validated by ``_core.rules`` before any of
these programs sees it. They create it when the id is free; otherwise they lock it,
compare what it holds with what comes in, range by range, and write only from the first
difference on (so running a file again writes nothing, and a corrected file repairs
what differs). A conversation that nothing changed counts as skipped.

Messages are compared with their entry ids and authors when those come in (format
version 2, copy); the editable state besides them (revision, next ids, halt, asides,
turn records, change log: ``_transfer.editable``, checked whole before these programs
run) is compared whole, and a conversation that differs anywhere gets it whole,
replacing what it held. A version-1 file carries none of it: its entries get new ids
and its change log is one record of kind ``"import"``.

The steps are sub-programs (``yield from``): a small conversation runs them all as one
program inside a shared transaction, a large one runs them batch by batch in a
transaction of its own; the steps are the same.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar

from .._editable.changes import Change
from .._ops.context import Context
from .._storage import schema as s
from .._storage.drivers import EXECUTE, EXECUTE_MANY, FETCH, CompiledStatement, Step
from .._storage.rows import change_row, message_row
from . import editable as edits_steps
from .editable import Edits

__all__ = ["Incoming", "MessageRows", "Steps", "Target"]

T = TypeVar("T")

Row = dict[str, Any]
Steps = Generator[Step, Any, T]
"""Statements of a program; the sub-programs here are run with ``yield from``."""


@dataclass
class Incoming:
    """A validated conversation row, its metadata rows and its summary rows; ``edits``
    its editable state (``None`` for a version-1 file: its entries get new ids and its
    change log is one record of kind ``"import"``)."""

    id: str
    owner: str | None
    system_prompt: str | None
    length: int
    created_at: datetime
    updated_at: datetime
    metadata: list[Row] = field(default_factory=list)
    summaries: list[Row] = field(default_factory=list)
    edits: Edits | None = None

    @property
    def revision(self) -> int:
        """The revision the conversation is stored at."""
        if self.edits is not None:
            return self.edits.revision
        return 1 if self.length else 0


@dataclass
class MessageRows:
    """Validated message rows of one conversation by column, at positions ``first`` on.

    Columns, not a dict per row: Postgres takes them as arrays in one statement, and a
    dict per row is made only where the driver needs one (SQLite's ``executemany``).
    """

    first: int
    roles: list[str | None]
    datas: list[str]
    tokens: list[int | None]
    times: list[datetime]
    texts: list[str | None]
    """Each message's ``search_text`` as a write stores it (``rows.stored_search_text``)."""
    entry_ids: list[int] | None = None
    """The entries' ids; ``None``: new ids, ``entry_base`` + position."""
    authors: list[str | None] | None = None
    """The entries' authors; ``None``: none."""

    def __len__(self) -> int:
        return len(self.datas)

    def ids(self, entry_base: int, skip: int) -> list[int]:
        """The entry ids of the rows from ``skip`` on."""
        if self.entry_ids is not None:
            return self.entry_ids[skip:]
        start = entry_base + self.first
        return list(range(start + skip, start + len(self.datas)))

    def arrays(self, cid: str, skip: int, entry_base: int) -> dict[str, Any]:
        """Parameters of ``insert_message_arrays`` for the rows from ``skip`` on."""
        authors = self.authors if self.authors is not None else [None] * len(self.datas)
        return {
            "c": cid,
            "first": self.first + skip,
            "roles": self.roles[skip:],
            "datas": self.datas[skip:],
            "tokens": self.tokens[skip:],
            "times": self.times[skip:],
            "texts": self.texts[skip:],
            "entry_ids": self.ids(entry_base, skip),
            "authors": authors[skip:],
        }

    def dicts(self, cid: str, skip: int, entry_base: int) -> list[Row]:
        """Rows of ``insert_messages`` for the rows from ``skip`` on."""
        first = self.first
        ids = self.ids(entry_base, skip)
        authors = self.authors
        return [
            message_row(
                cid,
                first + i,
                role=self.roles[i],
                data=self.datas[i],
                token_count=self.tokens[i],
                created_at=self.times[i],
                search_text=self.texts[i],
                entry_id=ids[i - skip],
                author=None if authors is None else authors[i],
            )
            for i in range(skip, len(self.datas))
        ]

    def same(self, stored: Sequence[Sequence[Any]], time: Callable[[Any], Any]) -> int:
        """How many leading rows of ``stored`` (position, data, token_count, created_at
        as the driver reads them, entry_id, author) equal these rows (their entry ids and
        authors too, when these rows have them)."""
        first, datas, tokens, times = self.first, self.datas, self.tokens, self.times
        ids, authors = self.entry_ids, self.authors
        for i, (position, data, count, created, entry_id, author) in enumerate(stored):
            if (position, data, count, time(created)) != (first + i, datas[i], tokens[i], times[i]):
                return i
            if ids is not None and (
                entry_id != ids[i] or author != (None if authors is None else authors[i])
            ):
                return i
        return len(stored)


class _Sequence:
    """One ordered run of rows of the conversation (its messages, or a list's items)."""

    def __init__(self, stored: int, fresh: bool, key: str, params: dict[str, Any]) -> None:
        self.stored = stored  # how many rows the destination held
        self.fresh = fresh  # nothing stored to compare with any more: insert
        self.key = key  # the column holding the row's index
        self.params = params  # what names the sequence in statements
        self.received = 0


class Target:
    """Makes the stored conversation ``incoming.id`` equal to ``incoming`` (see module)."""

    def __init__(self, ctx: Context, incoming: Incoming) -> None:
        self.ctx = ctx
        self.incoming = incoming
        self.owner = ctx.owner if ctx.owner is not None else incoming.owner
        self.new = False
        self.changed = False
        self._row: Sequence[Any] | None = None
        self._lists: dict[str, int] = {}
        self._messages = _Sequence(0, True, "position", {"c": incoming.id})
        self._items: _Sequence | None = None
        self._messages_done = False
        # Entries of a version-1 file (no ids of their own) take ids from here on
        # (+ position): above every id the stored conversation ever gave.
        self._entry_base = 1
        convert = ctx.executor.driver.result_processor
        self._time: Callable[[Any], Any] = convert(s.messages.c.created_at.type) or _same

    # ---------------------------------------------------------------- steps

    def open(self) -> Steps[bool]:
        """Create or lock the conversation; ``False`` when a view may not see it."""
        sql, inc = self.ctx.sql, self.incoming
        created = yield (
            FETCH,
            sql.create,
            self.ctx.params(
                inc.id,
                owner=self.owner,
                system_prompt=inc.system_prompt,
                n=inc.length,
                revision=inc.revision,
                next_entry=self._next_entry(),
                created_at=inc.created_at,
                updated_at=inc.updated_at,
            ),
        )
        if created:
            self.new = self.changed = True
            return True
        rows = yield FETCH, sql.lock_whole, self.ctx.params(inc.id)
        if not rows:
            return False
        self._row = rows[0]
        self._entry_base = int(rows[0][5])
        self._messages = _Sequence(int(rows[0][2]), False, "position", {"c": inc.id})
        listed = yield FETCH, sql.list_rows, {"c": inc.id}
        self._lists = {name: int(length) for name, length in listed}
        return True

    def messages(self, rows: MessageRows) -> Steps[None]:
        """Put message rows (the next positions, in order)."""
        sql, cid = self.ctx.sql, self.incoming.id

        def insert(skip: int) -> Steps[None]:
            base = self._entry_base
            if sql.insert_message_arrays is not None:
                yield EXECUTE, sql.insert_message_arrays, rows.arrays(cid, skip, base)
            else:
                inserted = rows.dicts(cid, skip, base)
                yield from sql.listed(
                    [(EXECUTE_MANY, sql.insert_messages, inserted)], len(inserted)
                )

        yield from self._put(
            self._messages,
            len(rows),
            sql.message_rows,
            sql.delete_messages_from,
            lambda stored: rows.same(stored, self._time),
            insert,
        )

    def open_list(self, name: str, length: int) -> Steps[None]:
        """Start the list ``name`` of ``length`` items (after every message)."""
        yield from self._end_messages()
        yield from self._end_list()
        cid = self.incoming.id
        stored = self._lists.pop(name, None)
        self._items = _Sequence(stored or 0, stored is None, "idx", {"c": cid, "name": name})
        if stored is None:
            self.changed = True
            row = {"conversation_id": cid, "name": name, "length": length}
            yield EXECUTE, self.ctx.sql.insert_list, row
        elif stored != length:
            self.changed = True
            yield EXECUTE, self.ctx.sql.set_list_length, {"c": cid, "name": name, "k": length}

    def items(self, rows: list[Row]) -> Steps[None]:
        """Put item rows of the open list (the next indexes, in order)."""
        assert self._items is not None
        sql = self.ctx.sql

        def same(stored: Sequence[Sequence[Any]]) -> int:
            for i, (idx, value, blob) in enumerate(stored):
                row = rows[i]
                blob = None if blob is None else bytes(blob)
                if (idx, value, blob) != (row["idx"], row["value"], row["blob"]):
                    return i
            return len(stored)

        def insert(skip: int) -> Steps[None]:
            yield EXECUTE_MANY, sql.insert_list_items, rows[skip:]

        yield from self._put(
            self._items, len(rows), sql.item_rows, sql.delete_items_from, same, insert
        )

    def finish(self) -> Steps[bool]:
        """Summaries, metadata, the lists not sent, the row; whether anything changed."""
        yield from self._end_messages()
        yield from self._end_list()
        sql, inc, cid = self.ctx.sql, self.incoming, self.incoming.id
        summaries = [
            (r["start"], r["end"], r["content"], r["token_count"], r["created_at"])
            for r in inc.summaries
        ]
        if not self.new:
            got = yield FETCH, sql.summary_rows, {"c": cid}
            stored = [(r[0], r[1], r[2], r[3], self._time(r[4])) for r in got]
            if stored != summaries:
                self.changed = True
                yield EXECUTE, sql.delete_summaries, {"c": cid}
            else:
                summaries = []
        if summaries:
            yield EXECUTE_MANY, sql.insert_summary, inc.summaries
        metadata = inc.metadata
        if not self.new:
            got = yield FETCH, sql.metadata_rows, {"c": cid}
            if {r[0]: r[1] for r in got} != {r["key"]: r["value"] for r in metadata}:
                self.changed = True
                yield EXECUTE, sql.delete_all_metadata, {"c": cid}
            else:
                metadata = []
        if metadata:
            yield EXECUTE_MANY, sql.insert_metadata, metadata
        for name in list(self._lists):  # lists the incoming conversation does not have
            self.changed = True
            yield EXECUTE, sql.delete_items_from, {"c": cid, "name": name, "start": 0}
            yield EXECUTE, sql.delete_list, {"c": cid, "name": name}
        self._lists.clear()
        edits = inc.edits
        if self.new:
            yield from self._edits(1, None)
            return True
        row = self._row
        assert row is not None
        same_row = (row[0], row[1], int(row[2]), self._time(row[3]), self._time(row[4])) == (
            self.owner,
            inc.system_prompt,
            inc.length,
            inc.created_at,
            inc.updated_at,
        )
        next_aside, halted = int(row[7]), row[8]
        if edits is not None and same_row and not self.changed:
            # The entries are equal, ids and authors included; so must the rest be.
            state = (int(row[6]), int(row[5]), next_aside, halted)
            same_row = state == (edits.revision, edits.next_entry, edits.next_aside, edits.halted)
            if same_row and (yield from edits_steps.differs(self.ctx, cid, edits, next_aside)):
                self.changed = True
        if self.changed or not same_row:
            self.changed = True
            # A replaced conversation keeps no idempotency records (as ``save``), and
            # its editable state and change log become what came in.
            yield EXECUTE, sql.delete_writes, {"c": cid}
            for stmt in sql.edit.delete_edits:
                yield EXECUTE, stmt, {"c": cid}
            yield (
                EXECUTE,
                sql.replace_row,
                self.ctx.params(
                    cid,
                    owner=self.owner,
                    system_prompt=inc.system_prompt,
                    n=inc.length,
                    revision=inc.revision,
                    next_entry=self._next_entry(),
                    created_at=inc.created_at,
                    updated_at=inc.updated_at,
                ),
            )
            yield from self._edits(next_aside, None)
        return self.changed

    def _next_entry(self) -> int:
        """The next entry id the conversation is stored with."""
        edits = self.incoming.edits
        if edits is not None:
            return edits.next_entry
        return self._entry_base + self.incoming.length

    def _edits(self, next_aside: int, halted: str | None) -> Steps[None]:
        """Store the incoming editable state of a conversation that holds none, whose
        row has ``next_aside`` and ``halted`` (and the revision and next entry id that
        came in)."""
        inc, edits = self.incoming, self.incoming.edits
        if edits is None:
            yield from self._record_import()
            return
        if (edits.next_aside, edits.halted) != (next_aside, halted):
            params = self.ctx.params(
                inc.id,
                expected=edits.revision,
                length=inc.length,
                revision=edits.revision,
                next_entry=edits.next_entry,
                next_aside=edits.next_aside,
                halted=edits.halted,
                now=inc.updated_at,
            )
            yield FETCH, self.ctx.sql.edit.claim, params
        yield from edits_steps.write(self.ctx, edits)

    def _record_import(self) -> Steps[None]:
        """The change log of a conversation from a version-1 file: one record of its
        entries."""
        inc = self.incoming
        if inc.length:
            record = change_row(inc.id, 1, Change("import", start=0), inc.updated_at, 0, inc.length)
            yield EXECUTE, self.ctx.sql.edit.insert_change, record

    # ---------------------------------------------------------------- helpers

    def _end_messages(self) -> Steps[None]:
        if not self._messages_done:
            self._messages_done = True
            yield from self._cut(self._messages, self.ctx.sql.delete_messages_from)

    def _end_list(self) -> Steps[None]:
        if self._items is not None:
            yield from self._cut(self._items, self.ctx.sql.delete_items_from)
            self._items = None

    def _put(
        self,
        seq: _Sequence,
        n: int,
        fetch: CompiledStatement,
        delete: CompiledStatement,
        same: Callable[[Sequence[Sequence[Any]]], int],
        insert: Callable[[int], Steps[None]],
    ) -> Steps[None]:
        """Put the next ``n`` rows of ``seq``: compare them with what is stored (``same``
        counts the leading rows equal), cut the rest and ``insert(skip)`` the new ones."""
        if not n:
            return
        first = seq.received
        seq.received += n
        keep = 0
        if not seq.fresh:
            if first < seq.stored:
                got = yield FETCH, fetch, {**seq.params, "start": first, "stop": seq.received}
                keep = same(got)
                if keep == n:
                    return  # all equal: nothing to write
                yield EXECUTE, delete, {**seq.params, "start": first + keep}
            seq.fresh = True
            self.changed = True
        yield from insert(keep)

    def _cut(self, seq: _Sequence, delete: CompiledStatement) -> Steps[None]:
        if not seq.fresh and seq.stored > seq.received:
            self.changed = True
            yield EXECUTE, delete, {**seq.params, "start": seq.received}
        seq.fresh = True


def _same(value: Any) -> Any:
    return value
