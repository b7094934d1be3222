"""The compiled statements of editable history (SPEC 11): loading a conversation as a
value, committing its changes, the change log, asides, turn records, and a pop's record.

Parameters as in ``_storage.statements.store``: ``c`` names the conversation, ``owner`` a scoped
view's user (ownership is decided here for these statements, as there for the rest).
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    ColumnElement,
    Text,
    and_,
    bindparam,
    case,
    cast,
    delete,
    exists,
    func,
    literal,
    or_,
    select,
    update,
)

from .. import schema as s
from ..drivers import Driver
from . import dialects as _dialects

__all__ = ["EditStatements"]

_conv = s.conversations
_msg = s.messages


class EditStatements:
    """The statements of editable history for a whole store or (``scoped``) a view."""

    def __init__(self, driver: Driver, scoped: bool) -> None:
        dialect = driver.dialect
        compile_ = driver.compile
        conv_id = bindparam("c", type_=_conv.c.id.type)
        owner = bindparam("owner", type_=_conv.c.owner.type)
        owned: ColumnElement[bool] = _conv.c.id == conv_id
        if scoped:
            owned = and_(owned, _conv.c.owner == owner)
        now = bindparam("now", type_=_conv.c.updated_at.type)
        big = BigInteger

        # ---------------------------------------------------------------- the value
        head = (
            _conv.c.revision,
            _conv.c.next_entry,
            _conv.c.next_aside,
            _conv.c.halted,
            _conv.c.length,
        )
        self.head = compile_(select(*head).where(owned))
        # The same row, locked for a write that changes entries (pop, save, revert).
        self.lock = compile_(_dialects.for_update(dialect, select(*head).where(owned)))
        entry_cols = (
            _msg.c.data,
            _msg.c.position,
            _msg.c.created_at,
            _msg.c.entry_id,
            _msg.c.author,
        )
        self.entries = compile_(
            select(*entry_cols).where(_msg.c.conversation_id == conv_id).order_by(_msg.c.position)
        )
        # The entries from position ``start`` on (the newest of a long history).
        self.entries_from = compile_(
            select(*entry_cols)
            .where(
                _msg.c.conversation_id == conv_id,
                _msg.c.position >= bindparam("start", type_=BigInteger),
            )
            .order_by(_msg.c.position)
        )
        # The entries below position ``stop`` (the oldest of a long history).
        self.entries_below = compile_(
            select(*entry_cols)
            .where(
                _msg.c.conversation_id == conv_id,
                _msg.c.position < bindparam("stop", type_=BigInteger),
            )
            .order_by(_msg.c.position)
        )
        a = s.asides
        self.asides = compile_(
            select(a.c.aside_id, a.c.after, a.c.home, a.c.value)
            .where(a.c.conversation_id == conv_id)
            .order_by(a.c.aside_id)
        )
        t = s.turns
        self.turns = compile_(
            select(t.c.number, t.c.start, t.c.opened_at, t.c.end, t.c.ended_at, t.c.usage)
            .where(t.c.conversation_id == conv_id)
            .order_by(t.c.number)
        )
        # The newest turn record: numbers are dense from 1, so it also counts them.
        self.newest_turn = compile_(
            select(t.c.number, t.c.start, t.c.opened_at, t.c.end, t.c.ended_at, t.c.usage)
            .where(t.c.conversation_id == conv_id)
            .order_by(t.c.number.desc())
            .limit(1)
        )
        # The newest entry ``author`` made (the authored-entries index serves it).
        newest: list[ColumnElement[bool]] = [
            _msg.c.conversation_id == conv_id,
            _msg.c.author == bindparam("author", type_=_msg.c.author.type),
        ]
        if scoped:
            newest.append(exists().where(owned))
        self.newest_by = compile_(
            select(*entry_cols).where(*newest).order_by(_msg.c.position.desc()).limit(1)
        )

        # ---------------------------------------------------------------- the log
        ch, w = s.changes, s.writes
        since = bindparam("since", type_=big)
        upto = bindparam("upto", type_=big)
        changes = select(ch.c.revision, ch.c.kind, ch.c.author, ch.c.at, ch.c.record).where(
            ch.c.conversation_id == conv_id, ch.c.revision > since
        )
        writes = select(w.c.revision, w.c.created_at, w.c.appended).where(
            w.c.conversation_id == conv_id, w.c.revision > since
        )
        self.log_changes = compile_(changes.order_by(ch.c.revision))
        self.log_writes = compile_(writes.order_by(w.c.revision))
        # The same up to revision ``upto`` (the oldest page of a long log).
        self.log_changes_upto = compile_(
            changes.where(ch.c.revision <= upto).order_by(ch.c.revision)
        )
        self.log_writes_upto = compile_(writes.where(w.c.revision <= upto).order_by(w.c.revision))
        # The newest change record that touched an entry below position ``below`` (the
        # (conversation, touched_from) index serves it): when it is not after a revision,
        # the entries below ``below`` stand now as they stood then. ``+ 0``: the maximum
        # of a bare revision would let a planner walk the primary key back from the
        # newest record instead (the whole log when none qualifies).
        self.touched_below = compile_(
            select(func.max(ch.c.revision + literal(0, big))).where(
                ch.c.conversation_id == conv_id,
                ch.c.touched_from < bindparam("below", type_=big),
            )
        )
        # What a read of the records after a revision needs to know of those before:
        # the halt then, set by the newest record up to ``upto`` that is a write (which
        # leaves none) or has a halt part. The newest write record up to there, then the
        # records after it that may hold a halt (the text says so; decoding decides).
        self.last_write = compile_(
            select(func.max(w.c.revision)).where(
                w.c.conversation_id == conv_id, w.c.revision.is_not(None), w.c.revision <= upto
            )
        )
        self.halt_records = compile_(
            select(ch.c.revision, ch.c.kind, ch.c.author, ch.c.at, ch.c.record)
            .where(
                ch.c.conversation_id == conv_id,
                ch.c.revision > since,
                ch.c.revision <= upto,
                or_(ch.c.kind == "write", ch.c.record.contains('"halt":', autoescape=True)),
            )
            .order_by(ch.c.revision.desc())
        )
        self.insert_change = compile_(ch.insert())
        # What a conversation's editable state holds beside its messages (import and
        # copy replace it whole).
        self.delete_edits = [
            compile_(delete(x).where(x.c.conversation_id == conv_id)) for x in (ch, a, t)
        ]
        # Before a conversation's idempotency rows go (save, import): the write records
        # among them move to the changes table, so the log stays whole (a write touched
        # only the positions from its first appended message on).
        self.keep_write_records = compile_(
            ch.insert().from_select(
                ["conversation_id", "revision", "kind", "author", "at", "record", "touched_from"],
                select(
                    w.c.conversation_id,
                    w.c.revision,
                    literal("write", Text),
                    cast(literal(None), Text),
                    w.c.created_at,
                    literal('{"added":', Text) + cast(w.c.appended, Text) + literal("}", Text),
                    w.c.position + w.c.count - w.c.appended,
                ).where(w.c.conversation_id == conv_id, w.c.revision.is_not(None)),
            )
        )

        # ---------------------------------------------------------------- commit
        state = {
            "length": bindparam("length", type_=big),
            "revision": bindparam("revision", type_=big),
            "next_entry": bindparam("next_entry", type_=big),
            "next_aside": bindparam("next_aside", type_=big),
            "halted": bindparam("halted", type_=_conv.c.halted.type),
            "updated_at": now,
        }
        expected = _conv.c.revision == bindparam("expected", type_=big)
        # Optimistic: changes the row only while it is at the revision the value
        # continues; returns the new revision, or nothing (moved on, or not visible).
        self.claim = compile_(
            update(_conv)
            .where(owned, expected)
            .values(**state, **s.LISTED_CHANGE)
            .returning(_conv.c.revision)
        )
        # The same for a value of revision 0, which may create the conversation.
        ins = _dialects.insert(dialect, _conv)
        self.claim_new = compile_(
            ins.values(id=conv_id, owner=owner, created_at=now, listed_changes=1, **state)
            .on_conflict_do_update(
                index_elements=[_conv.c.id],
                set_={**state, **s.LISTED_CHANGE},
                where=and_(expected, _conv.c.owner == owner) if scoped else expected,
            )
            .returning(_conv.c.revision)
        )
        start = bindparam("start", type_=big)
        stop = bindparam("stop", type_=big)
        self.delete_range = compile_(
            delete(_msg).where(
                _msg.c.conversation_id == conv_id, _msg.c.position >= start, _msg.c.position < stop
            )
        )
        # The rows from ``start`` on move by ``shift`` positions, set-based whatever their
        # number: in one UPDATE where the key is checked per statement
        # (``dialects.moves_in_one_update``), else in two, first to negative positions,
        # where none collides with a row that has yet to move (-1 - the new position),
        # then back (each UPDATE makes a new version of every row moved). Then the semantic
        # vectors from ``start`` on go (a vector belongs to a position; the embedder
        # makes them again): after the moves, so a vector stored while they waited for
        # its message's row goes too (no foreign key refuses the move, f7c2a9d3e8b4).
        # The full-text index follows by itself: FTS5 rows are keyed by rowid, which an
        # UPDATE keeps; PostgreSQL's GIN index takes each new row version's entries.
        v, k = s.vectors, s.vector_marks
        shift = bindparam("shift", type_=big)
        tail = (_msg.c.conversation_id == conv_id, _msg.c.position >= start)
        moves = (
            [update(_msg).where(*tail).values(position=_msg.c.position + shift)]
            if _dialects.moves_in_one_update(dialect)
            else [
                update(_msg).where(*tail).values(position=-1 - (_msg.c.position + shift)),
                update(_msg)
                .where(_msg.c.conversation_id == conv_id, _msg.c.position < 0)
                .values(position=-1 - _msg.c.position),
            ]
        )
        self.move_tail = [
            *(compile_(move) for move in moves),
            compile_(delete(v).where(v.c.conversation_id == conv_id, v.c.position >= start)),
            # The semantic index's marks fall below the first moved position, as a
            # delete's trigger lowers them (schema.vector_marks).
            compile_(
                update(k)
                .where(k.c.conversation_id == conv_id)
                .values(
                    position=case((k.c.position < start, k.c.position), else_=start - 1),
                    lowered=k.c.lowered + s.ONE,
                )
            ),
        ]
        a_ins = _dialects.insert(dialect, a)
        self.put_aside = compile_(
            a_ins.on_conflict_do_update(
                index_elements=[a.c.conversation_id, a.c.aside_id],
                set_={
                    "after": a_ins.excluded.after,
                    "home": a_ins.excluded.home,
                    "value": a_ins.excluded.value,
                },
            )
        )
        self.delete_aside = compile_(
            delete(a).where(
                a.c.conversation_id == conv_id,
                a.c.aside_id == bindparam("aside_id", type_=big),
            )
        )
        t_ins = _dialects.insert(dialect, t)
        self.put_turn = compile_(
            t_ins.on_conflict_do_update(
                index_elements=[t.c.conversation_id, t.c.number],
                set_={
                    "start": t_ins.excluded.start,
                    "opened_at": t_ins.excluded.opened_at,
                    "end": t_ins.excluded.end,
                    "ended_at": t_ins.excluded.ended_at,
                    "usage": t_ins.excluded.usage,
                },
            )
        )

        # ---------------------------------------------------------------- pop
        position = bindparam("position", type_=big)
        # The asides after the popped entry follow the entry before it (none: before
        # every entry); returns the ones moved.
        self.move_asides = compile_(
            update(a)
            .where(a.c.conversation_id == conv_id, a.c.after == bindparam("popped", type_=big))
            .values(
                after=select(_msg.c.entry_id)
                .where(_msg.c.conversation_id == conv_id, _msg.c.position == position - 1)
                .scalar_subquery()
            )
            .returning(a.c.aside_id, a.c.after)
        )
        self.popped = compile_(
            update(_conv)
            .where(_conv.c.id == conv_id)
            .values(
                length=_conv.c.length - 1,
                revision=_conv.c.revision + 1,
                halted=None,
                **s.LISTED_CHANGE,
                updated_at=now,
            )
        )
        # Every aside follows no entry (save replaced them all); returns the moved ones.
        self.unplace_asides = compile_(
            select(a.c.aside_id, a.c.after)
            .where(a.c.conversation_id == conv_id, a.c.after.is_not(None))
            .order_by(a.c.aside_id)
        )
        self.clear_aside_places = compile_(
            update(a).where(a.c.conversation_id == conv_id).values(after=None)
        )
