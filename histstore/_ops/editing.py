"""Editable history in a store (SPEC 11): a value, its commit, the log, reverting it.

The programs here are the one way entries are edited in place: ``commit`` and
``revert`` both end in ``persist``, which writes what differs between the value's saved
state and its new one under an optimistic check of the revision. ``save`` and pop
reach the same tables through their own programs (``_ops.state``, ``_ops.history``), keeping
the same records.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import replace

from .._core import codec as _codec
from .._core.ids import validate_id
from .._core.models import Message, stored_message
from .._editable.change_log import Window, asides_before, rebuild
from .._editable.changes import Change, first_touched
from .._editable.conversation import Conversation
from .._editable.entries import AsideState, Entry, check_by
from .._errors import ConflictError, InvalidMessage, NotFound
from .._storage import rows as _rows
from .._storage.drivers import FETCH, Program, Rollback
from .context import Context, not_found
from .edit_reads import (
    Steps,
    identity,
    oldest,
    records_after,
    stored_entries,
    turn_record,
    window_after,
)
from .edit_writes import CommitWrites, commit_writes, persist

__all__ = [
    "CommitWrites",
    "Editing",
    "commit_writes",
    "load",
    "persist",
    "stored_entries",
]

_LARGE = 1000
"""Commits that may write more message rows than this are planned off the event loop."""


def load(ctx: Context, conversation: str, *, lock: bool = False) -> Steps[Conversation | None]:
    """Program steps: the conversation as a value (``None`` when unknown or not
    visible); with ``lock`` its row is locked for the rest of the transaction."""
    sql = ctx.sql.edit
    head = yield FETCH, (sql.lock if lock else sql.head), ctx.params(conversation)
    if not head:
        return None
    revision, next_entry, next_aside, halted, _length = head[0]
    time = ctx.sql.created_at or identity
    entries = stored_entries(ctx, (yield FETCH, sql.entries, {"c": conversation}))
    asides: dict[int, AsideState] = {}
    if next_aside > 1:
        got = yield FETCH, sql.asides, {"c": conversation}
        asides = {int(r[0]): AsideState(r[1], r[2], _codec.decode(r[3])) for r in got}
    got = yield FETCH, sql.turns, {"c": conversation}
    turns = [turn_record(time, r) for r in got]
    return Conversation.from_store(
        conversation,
        revision=int(revision),
        entries=entries,
        asides=asides,
        halted=halted,
        turns=turns,
        next_entry_id=int(next_entry),
        next_aside_id=int(next_aside),
    )


def log(
    ctx: Context, conversation: str, entries: Sequence[Entry], revision: int
) -> Steps[list[Change]]:
    """Program steps: the whole change records of a conversation at ``revision`` whose
    entries are ``entries``, checked to build them (``_editable.change_log.rebuild``)."""
    ordered = yield from records_after(ctx, conversation, 0, revision)
    return rebuild(conversation, entries, ordered)


class Editing:
    """The editable-history calls of a store (see ``Store`` for their contracts)."""

    def __init__(self, ctx: Context) -> None:
        self._ctx = ctx

    async def edit(self, conversation: str) -> Conversation:
        validate_id(conversation)
        ctx = self._ctx

        def program() -> Program[Conversation]:
            value = yield from load(ctx, conversation)
            return Conversation(conversation) if value is None else value

        return await ctx.executor.snapshot(program(), action="edit", conversation=conversation)

    async def refresh(self, conv: Conversation) -> None:
        cid = _conversation_of(conv)
        if conv.unsaved:
            raise ConflictError(f"conversation {cid!r}: the value has unsaved changes")
        fresh = await self.edit(cid)
        conv.take_stored(fresh)

    async def commit(self, conv: Conversation) -> int:
        cid = _conversation_of(conv)
        outbox = conv.unsaved
        if not outbox:
            self._ctx.executor.check()
            return conv.revision
        before, after = conv.saved_state, conv.edit_state
        now = _rows.now()
        stamped = [c.stamped(conv.revision + i + 1, now) for i, c in enumerate(outbox)]
        low = first_touched(stamped)
        if low is not None and len(after.entries) - low > _LARGE:
            work = await asyncio.to_thread(
                commit_writes, self._ctx, cid, before, after, stamped, now
            )
        else:
            work = commit_writes(self._ctx, cid, before, after, stamped, now)
        program = persist(self._ctx, cid, work, stamped, now)
        revision = await self._ctx.executor.write(
            program, action="commit", conversation=cid, lists=len(work.entries)
        )
        conv.mark_saved(stamped)
        return revision

    async def changes(self, conversation: str, since: int, limit: int | None) -> list[Change]:
        validate_id(conversation)
        since = _count(since, "since")
        top = None if limit is None else _count(limit, "limit")
        ctx = self._ctx

        def whole() -> Steps[list[Change]]:
            # The whole log: rebuilt from every entry, and checked to build them.
            value = yield from load(ctx, conversation)
            if value is None or value.revision == 0:
                return []
            entries = value.edit_state.entries
            return (yield from log(ctx, conversation, entries, value.revision))

        def program() -> Program[list[Change]]:
            if since == 0 and top is None:
                return (yield from whole())
            head = yield FETCH, ctx.sql.edit.head, ctx.params(conversation)
            if not head or int(head[0][0]) <= since:
                return []
            if since == 0 and top is not None and top < int(head[0][0]):
                # The oldest page: from the oldest records unless a later one reached
                # back into what they left.
                page = yield from oldest(ctx, conversation, top)
                return (yield from whole())[:top] if page is None else page
            found, _now = yield from window_after(ctx, conversation, head[0], since)
            records: list[Change] = found.changes
            return records if top is None else records[:top]

        return await ctx.executor.snapshot(
            program(), action="read changes of", conversation=conversation
        )

    async def revert(self, conversation: str, revision: int, by: str) -> int:
        validate_id(conversation)
        by = check_by(by)
        if not isinstance(revision, int) or isinstance(revision, bool):
            raise TypeError("revision must be an int")
        if revision < 0:
            raise not_revision(conversation, revision)
        ctx = self._ctx

        def program() -> Program[tuple[int, int]]:
            head = yield FETCH, ctx.sql.edit.lock, ctx.params(conversation)
            if not head:
                raise not_found(conversation)
            current, next_entry, next_aside, halted, _length = head[0]
            current = int(current)
            if revision > current:
                raise not_revision(conversation, revision)
            if revision == current:
                return Rollback((current, 0))
            found: Window
            found, now_entries = yield from window_after(ctx, conversation, head[0], revision)
            got = yield FETCH, ctx.sql.edit.asides, {"c": conversation}
            asides = {int(r[0]): AsideState(r[1], r[2], _codec.decode(r[3])) for r in got}
            offset = found.offset
            value = Conversation.from_store(
                conversation,
                revision=current,
                entries=now_entries,
                asides=asides,
                halted=halted,
                turns=[],
                next_entry_id=int(next_entry),
                next_aside_id=int(next_aside),
            )
            target = Conversation.from_store(
                conversation,
                revision=revision,
                entries=found.entries,
                asides=asides_before(asides, found.changes),
                halted=found.halted,
                turns=[],
                next_entry_id=int(next_entry),
                next_aside_id=int(next_aside),
            )
            if not value.revert_to(target, by=by):
                return Rollback((current, 0))
            now = _rows.now()
            stamped = [c.stamped(current + 1, now) for c in value.unsaved]
            before, after = value.saved_state, value.edit_state
            work = commit_writes(ctx, conversation, before, after, stamped, now)
            # The value holds the entries from ``offset`` on: its positions move by it.
            work = replace(
                work,
                row={**work.row, "length": work.row["length"] + offset},
                start=work.start + offset,
                stop=work.stop + offset,
                tail=work.tail + offset,
            )
            placed = [c if c.start is None else replace(c, start=c.start + offset) for c in stamped]
            stored = yield from persist(ctx, conversation, work, placed, now)
            assert not isinstance(stored, Rollback)  # persist commits or raises
            return stored, len(work.entries)

        # What the revert puts back is known inside its transaction only: it tells the
        # full-text indexer how many messages it listed once it committed.
        reverted, listed = await ctx.executor.write(
            program(), action="revert", conversation=conversation, lists=0
        )
        if listed:
            ctx.executor.listed(listed)
        return reverted

    async def newest_by(self, conversation: str, author: str) -> Message | None:
        validate_id(conversation)
        author = check_by(author, what="author")
        ctx = self._ctx
        rows = await ctx.executor.fetch(
            ctx.sql.edit.newest_by,
            ctx.params(conversation, author=author),
            action="read",
            conversation=conversation,
        )
        if not rows:
            return None
        r = rows[0]
        return stored_message(r[0], r[1], r[2], ctx.sql.created_at, r[3], r[4])


def _conversation_of(conv: object) -> str:
    if not isinstance(conv, Conversation):
        raise TypeError("takes a histstore.Conversation")
    if conv.conversation_id is None:
        raise InvalidMessage("the Conversation names no conversation (give it an id)")
    return conv.conversation_id


def _count(value: object, name: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int")
    if value < 0:
        raise InvalidMessage(f"{name} must not be negative")
    return value


def not_revision(conversation: str, revision: int) -> NotFound:
    return NotFound(f"conversation {conversation!r} has no revision {revision}")
