"""The editable state that export, import and copy carry (SPEC 11), checked and written.

An incoming conversation (format version 2, or a store read by copy) comes with its
entry ids and authors (on its message rows), its revision, next entry and aside ids and
halt (on its row), its asides, its turn records, and its change log as a store keeps it
(``_editable.change_log``: each record's parts, with the entries it added only counted; a plain
write's record says how many messages it appended at the end). ``Edits`` receives
those parts as they stream in, checks each, and ``Edits.check`` checks them whole before
the conversation is stored:

- the change records' revisions run 1, 2, ... and their number is the revision;
- entry ids are unique and below the next entry id; aside ids below the next aside id;
- ``_editable.change_log.rebuild`` recovers every record's added entries from the incoming
  entries, and folding the rebuilt records gives the incoming asides, halt and turn
  records. A log of appends only (the usual large conversation: plain writes, pushes,
  one import record) is checked by counting, which is equivalent: it builds the
  entries when each record appends at the then end and the counts add up.

Every refusal is ``InvalidMessage``, naming the conversation and never quoting a
message. The program steps ``differs`` and ``write`` compare the parts with what a
store holds and store them (``_transfer.sync.Target`` runs them).
"""

from __future__ import annotations

from array import array
from collections.abc import Generator, Sequence
from datetime import datetime
from typing import Any, TypeVar

from .._core import codec as _codec
from .._core.models import Message
from .._editable.change_log import Logged, logged, rebuild
from .._editable.entries import Entry, TurnRecord, check_author, check_by, check_count, optional_id
from .._editable.fold import EditableState
from .._errors import HistStoreError, InvalidMessage
from .._ops.context import Context
from .._storage.drivers import EXECUTE_MANY, FETCH, Step
from .._storage.rows import record_row, turn_row

__all__ = ["Edits", "LogRow", "differs", "write", "write_record"]

T = TypeVar("T")
Row = dict[str, Any]
Steps = Generator[Step, Any, T]
LogRow = tuple[int, str, "str | None", datetime, str]
"""A change record as stored: revision, kind, author, time, the record's JSON text."""

_BLANK = Message.user("")  # the message of the id-only entries a check rebuilds with
_EPOCH = datetime.fromisoformat("2000-01-01T00:00:00+00:00")


def write_record(appended: int) -> str:
    """The stored record text of a plain write that appended ``appended`` messages (what
    a write's idempotency row becomes in the changes table)."""
    return f'{{"added":{appended}}}' if appended else "{}"


class Edits:
    """One incoming conversation's editable state, received part by part, then checked
    whole (see the module doc). ``asides``, ``turns`` and ``changes`` are the rows its
    tables get."""

    def __init__(
        self, cid: str, revision: int, next_entry: int, next_aside: int, halted: str | None
    ) -> None:
        self.cid = cid
        self.revision = check_count(revision, what="revision")
        self.next_entry = check_count(next_entry, what="next_entry", low=1)
        self.next_aside = check_count(next_aside, what="next_aside", low=1)
        self.halted = check_author(halted, what="halted")
        self.asides: list[Row] = []
        self.turns: list[Row] = []
        self.changes: list[Row] = []
        self._ids = array("q")
        self._increasing = True
        self._states: dict[int, tuple[int | None, int | None, str]] = {}
        self._records: list[TurnRecord] = []
        self._log: list[Logged] = []
        self._appends_only = True  # so far every record appends at the then end
        self._length = 0  # the entries the records so far leave, when they only append
        self._left = 0  # the entries the records so far leave (as their counts say)

    @property
    def size(self) -> int:
        """The rows these parts add to a transaction."""
        return len(self.asides) + len(self.turns) + len(self.changes)

    # ---------------------------------------------------------------- receiving

    def entry_id(self, value: object) -> int:
        """A message's entry id: an int from 1, below the next entry id."""
        if type(value) is not int or not 0 < value < self.next_entry:
            raise InvalidMessage(
                f"conversation {self.cid!r}: a message's entry id must be an int from 1"
                f" below the conversation's next entry id ({self.next_entry})"
            )
        return value

    def take_ids(self, ids: Sequence[int]) -> None:
        """Note the entry ids (checked by ``entry_id``) of the next messages, in order."""
        if self._increasing:
            last = self._ids[-1] if self._ids else 0
            for i in ids:
                if i <= last:
                    self._increasing = False
                    break
                last = i
        self._ids.extend(ids)

    def aside(self, aside_id: object, after: object, home: object, value: Any, text: str) -> None:
        """An aside (``value`` decoded, ``text`` its JSON); ids must come in order."""
        aid = check_count(aside_id, what="an aside's id", low=1)
        if aid >= self.next_aside:
            raise InvalidMessage(
                f"conversation {self.cid!r}: aside {aid} is not below the conversation's"
                f" next aside id ({self.next_aside})"
            )
        if self.asides and aid <= self.asides[-1]["aside_id"]:
            raise InvalidMessage(f"conversation {self.cid!r}: aside {aid} is out of order")
        where = optional_id(after, what="an aside's 'after'")
        first = optional_id(home, what="an aside's 'home'")
        self._states[aid] = (where, first, _codec.canonical(value))
        self.asides.append(
            {
                "conversation_id": self.cid,
                "aside_id": aid,
                "after": where,
                "home": first,
                "value": text,
            }
        )

    def turn(
        self,
        number: object,
        start: object,
        opened_at: datetime,
        end: object,
        ended_at: datetime | None,
        usage: object,
    ) -> None:
        """A turn record; they must be numbered 1, 2, ... and only the newest be open."""
        if end is not None and not isinstance(end, str):
            raise InvalidMessage("a turn record's end must be a str or null")
        record = TurnRecord(
            number,  # type: ignore[arg-type]  # TurnRecord checks them
            start,  # type: ignore[arg-type]
            opened_at=opened_at,
            end=end,
            ended_at=ended_at,
            usage=usage,  # type: ignore[arg-type]
        )
        if record.number != len(self._records) + 1:
            raise InvalidMessage(
                f"conversation {self.cid!r}: turn record {record.number} where"
                f" {len(self._records) + 1} was expected"
            )
        if self._records and self._records[-1].end is None:
            raise InvalidMessage(
                f"conversation {self.cid!r}: turn record {record.number} follows an open one"
            )
        self._records.append(record)
        self.turns.append(turn_row(self.cid, record, None))

    def change(
        self, revision: object, kind: object, author: object, at: datetime, text: str
    ) -> None:
        """The next change record as a store keeps it (``text``: its JSON object)."""
        cid = self.cid
        expected = len(self.changes) + 1
        if type(revision) is not int or revision != expected:
            raise InvalidMessage(
                f"conversation {cid!r}: a change record at revision {_shown(revision)} where"
                f" {expected} was expected"
            )
        if revision > self.revision:
            raise InvalidMessage(
                f"conversation {cid!r} has more change records than its revision ({self.revision})"
            )
        name = check_by(kind, what="a change record's kind")
        by = check_author(author, what="a change record's author")
        try:
            record = logged(revision, name, by, at, text)
        except HistStoreError as exc:
            raise InvalidMessage(f"conversation {cid!r}: change record {revision}: {exc}") from None
        except (TypeError, ValueError, AttributeError):  # not the JSON of a record
            raise InvalidMessage(
                f"conversation {cid!r}: change record {revision} is not a change record"
            ) from None
        if self._appends_only:
            c = record.change
            at_end = c.start is None or c.start == self._length
            plain = not (c.removed or record.moved or c.asides or c.turn) and c.halt is None
            if at_end and plain:
                self._length += record.added
            else:
                self._appends_only = False
        self._log.append(record)
        c, met = record.change, self._left
        low = met - len(c.removed) if c.start is None else c.start
        self._left = met - len(c.removed) + record.added
        self.changes.append(record_row(cid, revision, name, by, at, text, low))

    # ---------------------------------------------------------------- checking

    def check(self) -> None:
        """Check the parts whole (see the module doc); afterwards only the rows are kept.

        Raises:
            InvalidMessage: they do not fit together.
        """
        cid, ids = self.cid, self._ids
        if len(self.changes) != self.revision:
            raise InvalidMessage(
                f"conversation {cid!r} has {len(self.changes)} change records where its"
                f" revision is {self.revision}"
            )
        if not self._increasing and len(set(ids)) != len(ids):
            raise InvalidMessage(f"conversation {cid!r} holds an entry id twice")
        simple = not (self.asides or self._records) and self.halted is None
        if self._appends_only and simple:
            if self._length != len(ids):
                raise InvalidMessage(
                    f"the change log of conversation {cid!r} does not build its entries"
                )
        else:
            self._fold(cid, ids)
        self._ids, self._log, self._states, self._records = array("q"), [], {}, []

    def _fold(self, cid: str, ids: Sequence[int]) -> None:
        """Rebuild the log from the entries (their ids), fold it, compare the rest."""
        entries = [Entry(_BLANK, entry_id=i, created_at=_EPOCH) for i in ids]
        try:
            records = rebuild(cid, entries, self._log)
        except HistStoreError as exc:
            raise InvalidMessage(str(exc)) from None
        state = EditableState()
        for record in records:
            state.apply(record)
        asides = {
            aid: (s.after, s.home, _codec.canonical(s.value)) for aid, s in state.asides.items()
        }
        if asides != self._states or state.halted != self.halted or state.turns != self._records:
            raise InvalidMessage(
                f"the change log of conversation {cid!r} does not build its asides, halt"
                " and turn records"
            )
        if state.next_entry > self.next_entry or state.next_aside > self.next_aside:
            raise InvalidMessage(
                f"the change log of conversation {cid!r} gives ids above its next ids"
            )


def _shown(value: object) -> str:
    return str(value) if type(value) is int else "that is not an int"


# ---------------------------------------------------------------- program steps


_TURN_KEYS = ("number", "start", "opened_at", "end", "ended_at", "usage")
_LOG_KEYS = ("kind", "author", "at", "record")


def differs(ctx: Context, cid: str, edits: Edits, next_aside: int) -> Steps[bool]:
    """Program steps: whether the stored asides (``next_aside``: the stored next aside
    id), turn records or change log of ``cid`` differ from ``edits``."""
    sql = ctx.sql.edit
    time = ctx.sql.created_at or _same
    params = {"c": cid}
    if edits.asides or next_aside > 1:
        got = yield FETCH, sql.asides, params
        stored = [(int(r[0]), r[1], r[2], r[3]) for r in got]
        if stored != [(a["aside_id"], a["after"], a["home"], a["value"]) for a in edits.asides]:
            return True
    got = yield FETCH, sql.turns, params
    turns = [
        (int(r[0]), int(r[1]), time(r[2]), r[3], None if r[4] is None else time(r[4]), r[5])
        for r in got
    ]
    if turns != [tuple(t[k] for k in _TURN_KEYS) for t in edits.turns]:
        return True
    since = {"c": cid, "since": 0}
    log: dict[int, tuple[Any, ...]] = {}
    for r in (yield FETCH, sql.log_writes, since):
        log[int(r[0])] = ("write", None, time(r[1]), write_record(int(r[2] or 0)))
    for r in (yield FETCH, sql.log_changes, since):
        log[int(r[0])] = (r[1], r[2], time(r[3]), r[4])
    return log != {c["revision"]: tuple(c[k] for k in _LOG_KEYS) for c in edits.changes}


def write(ctx: Context, edits: Edits) -> Steps[None]:
    """Program steps: store the asides, turn records and change records of ``edits`` (the
    conversation holds none)."""
    sql = ctx.sql.edit
    if edits.changes:
        yield EXECUTE_MANY, sql.insert_change, edits.changes
    if edits.asides:
        yield EXECUTE_MANY, sql.put_aside, edits.asides
    if edits.turns:
        yield EXECUTE_MANY, sql.put_turn, edits.turns


def _same(value: Any) -> Any:
    return value
