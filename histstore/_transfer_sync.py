"""The programs import and copy run: make a stored conversation equal to an incoming one.

An incoming conversation (``Incoming``) has been validated by ``_rules`` before any of
these programs sees it. They create it when the id is free; otherwise they lock it,
compare what it holds with what comes in, range by range, and write only from the first
difference on (so running a file again writes nothing, and a corrected file repairs
what differs). A conversation that nothing changed counts as skipped.

The steps are sub-programs (``yield from``): a small conversation runs them all as one
program inside a shared transaction, a large one runs them batch by batch in a
transaction of its own; the steps are the same.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar

from . import _schema as s
from ._context import Context
from ._drivers import EXECUTE, EXECUTE_MANY, FETCH, CompiledStatement, Step

__all__ = ["Incoming", "Steps", "Target"]

T = TypeVar("T")

Row = dict[str, Any]
Steps = Generator[Step, Any, T]
"""Statements of a program; the sub-programs here are run with ``yield from``."""


@dataclass
class Incoming:
    """A validated conversation row, its metadata rows and its summary rows."""

    id: str
    owner: str | None
    system_prompt: str | None
    length: int
    created_at: datetime
    updated_at: datetime
    metadata: list[Row] = field(default_factory=list)
    summaries: list[Row] = field(default_factory=list)


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
        self._messages = _Sequence(int(rows[0][2]), False, "position", {"c": inc.id})
        listed = yield FETCH, sql.list_rows, {"c": inc.id}
        self._lists = {name: int(length) for name, length in listed}
        return True

    def messages(self, rows: list[Row]) -> Steps[None]:
        """Put message rows (the next positions, in order)."""
        sql = self.ctx.sql
        yield from self._put(
            self._messages,
            rows,
            sql.message_rows,
            sql.delete_messages_from,
            sql.insert_messages,
            lambda r: (r[0], r[1], r[2], self._time(r[3])),
            lambda r: (r["position"], r["data"], r["token_count"], r["created_at"]),
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
        yield from self._put(
            self._items,
            rows,
            sql.item_rows,
            sql.delete_items_from,
            sql.insert_list_items,
            lambda r: (r[0], r[1], None if r[2] is None else bytes(r[2])),
            lambda r: (r["idx"], r["value"], r["blob"]),
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
        if self.new:
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
        if self.changed or not same_row:
            self.changed = True
            # A replaced conversation keeps no idempotency records (as ``save``).
            yield EXECUTE, sql.delete_writes, {"c": cid}
            yield (
                EXECUTE,
                sql.replace_row,
                self.ctx.params(
                    cid,
                    owner=self.owner,
                    system_prompt=inc.system_prompt,
                    n=inc.length,
                    created_at=inc.created_at,
                    updated_at=inc.updated_at,
                ),
            )
        return self.changed

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
        rows: list[Row],
        fetch: CompiledStatement,
        delete: CompiledStatement,
        insert: CompiledStatement,
        stored_key: Callable[[Sequence[Any]], tuple[Any, ...]],
        incoming_key: Callable[[Row], tuple[Any, ...]],
    ) -> Steps[None]:
        if not rows:
            return
        first = seq.received
        seq.received += len(rows)
        if not seq.fresh:
            keep = 0
            if first < seq.stored:
                got = yield FETCH, fetch, {**seq.params, "start": first, "stop": seq.received}
                for stored, row in zip(got, rows, strict=False):
                    if stored_key(stored) != incoming_key(row):
                        break
                    keep += 1
                if keep == len(rows):
                    return  # all equal: nothing to write
                yield EXECUTE, delete, {**seq.params, "start": first + keep}
            seq.fresh = True
            self.changed = True
            rows = rows[keep:]
        yield EXECUTE_MANY, insert, rows

    def _cut(self, seq: _Sequence, delete: CompiledStatement) -> Steps[None]:
        if not seq.fresh and seq.stored > seq.received:
            self.changed = True
            yield EXECUTE, delete, {**seq.params, "start": seq.received}
        seq.fresh = True


def _same(value: Any) -> Any:
    return value
