"""Editable history in a store (SPEC 11): a conversation as a value, its commit, its
change log, and reverting it.

The programs here are the one way entries are edited in place: ``commit`` and
``revert`` both end in ``persist``, which writes what differs between the value's saved
state and its new one under an optimistic check of the revision. ``save`` and pop
reach the same tables through their own programs (``_state``, ``_history``), keeping
the same records.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from datetime import datetime, timezone
from typing import Any, TypeVar

from . import _codec, _rules
from ._change_log import Logged, encode, logged, rebuild, written
from ._changes import Change
from ._context import Context, not_found
from ._drivers import EXECUTE, EXECUTE_MANY, FETCH, Program, Rollback, Step
from ._editable import Conversation
from ._editable_state import State, eid
from ._entries import AsideState, Entry, TurnRecord, check_by
from ._errors import ConflictError, HistStoreError, InvalidMessage, NotFound
from ._ids import validate_id
from ._models import Message
from ._search import indexed_text

__all__ = ["Editing", "load", "message_row", "persist"]

T = TypeVar("T")
Steps = Generator[Step, Any, T]


def _now() -> datetime:
    return datetime.now(timezone.utc)


def load(ctx: Context, conversation: str, *, lock: bool = False) -> Steps[Conversation | None]:
    """Program steps: the conversation as a value (``None`` when unknown or not
    visible); with ``lock`` its row is locked for the rest of the transaction."""
    sql = ctx.sql.edit
    head = yield FETCH, (sql.lock if lock else sql.head), ctx.params(conversation)
    if not head:
        return None
    revision, next_entry, next_aside, halted, _length = head[0]
    time = ctx.sql.created_at or _same
    rows = yield FETCH, sql.entries, {"c": conversation}
    entries = [
        Entry(Message._stored(r[0], None, None), entry_id=r[3], author=r[4], created_at=time(r[2]))
        for r in rows
    ]
    asides: dict[int, AsideState] = {}
    if next_aside > 1:
        got = yield FETCH, sql.asides, {"c": conversation}
        asides = {int(r[0]): AsideState(r[1], r[2], _codec.decode(r[3])) for r in got}
    got = yield FETCH, sql.turns, {"c": conversation}
    turns = [
        TurnRecord(
            int(r[0]),
            int(r[1]),
            opened_at=time(r[2]),
            end=r[3],
            ended_at=None if r[4] is None else time(r[4]),
            usage=None if r[5] is None else _codec.decode(r[5]),
        )
        for r in got
    ]
    return Conversation._load(
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
    entries are ``entries`` (see ``_change_log.rebuild``)."""
    sql = ctx.sql.edit
    params = {"c": conversation, "since": 0}
    time = ctx.sql.created_at or _same
    records: dict[int, Logged] = {}
    for r in (yield FETCH, sql.log_writes, params):
        records[int(r[0])] = written(int(r[0]), time(r[1]), int(r[2] or 0))
    for r in (yield FETCH, sql.log_changes, params):
        records[int(r[0])] = logged(int(r[0]), r[1], r[2], time(r[3]), r[4])
    if sorted(records) != list(range(1, revision + 1)):
        raise HistStoreError(f"the change log of conversation {conversation!r} has gaps")
    return rebuild(conversation, entries, [records[i] for i in range(1, revision + 1)])


def message_row(
    ctx: Context, conversation: str, position: int, entry: Entry, now: datetime
) -> dict[str, Any]:
    """The messages-table row of ``entry`` at ``position``."""
    m = entry.message
    count = ctx.settings.count_tokens
    return {
        "conversation_id": conversation,
        "position": position,
        "role": _rules.role_key(m.role),
        "data": m._text,
        "token_count": None if count is None else _rules.token_count(count(m)),
        "created_at": entry.created_at or now,
        "search_text": indexed_text(m),
        "entry_id": eid(entry),
        "author": entry.author,
    }


def persist(
    ctx: Context,
    conversation: str,
    before: State,
    after: State,
    changes: Sequence[Change],
    now: datetime,
) -> Program[int]:
    """The program that stores ``changes`` (stamped, from revision ``before``'s + 1),
    which turned ``before`` (the stored state at the revision the value continues) into
    ``after``; returns the new revision. It writes only what differs: the entries from
    the first changed position on (those after the last change too when the length
    changed), the asides and turn records that changed, and the conversation row.

    Raises:
        ConflictError: the stored revision is not the one the value continues.
        NotFound: a scoped view may not see the conversation.
    """
    sql = ctx.sql
    expected = changes[0].revision - 1 if changes and changes[0].revision else 0
    revision = expected + len(changes)
    params = ctx.params(
        conversation,
        expected=expected,
        length=len(after.entries),
        revision=revision,
        next_entry=after.next_entry,
        next_aside=after.next_aside,
        halted=after.halted,
        now=now,
    )
    claim = sql.edit.claim_new if expected == 0 else sql.edit.claim
    if not (yield FETCH, claim, params):
        taken = yield FETCH, sql.taken, {"c": conversation}
        if ctx.owner is not None and taken and taken[0][0] != ctx.owner:
            raise not_found(conversation)
        raise ConflictError(
            f"conversation {conversation!r} changed since revision {expected} (commit refused)"
        )
    old, new = before.entries, after.entries
    p = 0
    top = min(len(old), len(new))
    while p < top and old[p] == new[p]:
        p += 1
    stop = len(new)
    if len(old) == len(new):
        while stop > p and old[stop - 1] == new[stop - 1]:
            stop -= 1
        if stop > p:
            yield EXECUTE, sql.edit.delete_range, {"c": conversation, "start": p, "stop": stop}
    elif p < len(old):
        yield EXECUTE, sql.delete_messages_from, {"c": conversation, "start": p}
    rows = [message_row(ctx, conversation, i, new[i], now) for i in range(p, stop)]
    if rows:
        yield EXECUTE_MANY, sql.insert_messages, rows
    for aside_id in before.asides.keys() - after.asides.keys():
        yield EXECUTE, sql.edit.delete_aside, {"c": conversation, "aside_id": aside_id}
    put = [
        {
            "conversation_id": conversation,
            "aside_id": aside_id,
            "after": state.after,
            "home": state.home,
            "value": _codec.encode(state.value)[0],
        }
        for aside_id, state in sorted(after.asides.items())
        if before.asides.get(aside_id) != state
    ]
    if put:
        yield EXECUTE_MANY, sql.edit.put_aside, put
    turns = [
        _turn_row(conversation, t, now)
        for i, t in enumerate(after.turns)
        if i >= len(before.turns) or before.turns[i] != t
    ]
    if turns:
        yield EXECUTE_MANY, sql.edit.put_turn, turns
    records = [
        {
            "conversation_id": conversation,
            "revision": c.revision,
            "kind": c.kind,
            "author": c.author,
            "at": now,
            "record": encode(c),
        }
        for c in changes
    ]
    yield EXECUTE_MANY, sql.edit.insert_change, records
    return revision


def _turn_row(conversation: str, turn: TurnRecord, now: datetime) -> dict[str, Any]:
    return {
        "conversation_id": conversation,
        "number": turn.number,
        "start": turn.start,
        "opened_at": turn.opened_at or now,
        "end": turn.end,
        "ended_at": turn.ended_at or (now if turn.end is not None else None),
        "usage": None if turn.usage is None else _codec.encode(dict(turn.usage))[0],
    }


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
        conv._state, conv._revision, conv._saved = fresh._state, fresh._revision, None

    async def commit(self, conv: Conversation) -> int:
        cid = _conversation_of(conv)
        outbox = list(conv._outbox)
        if not outbox:
            self._ctx.executor.check()
            return conv.revision
        before = conv._saved if conv._saved is not None else State()
        limit = self._ctx.settings.max_message_bytes
        for e in conv._state.entries:
            if e.message.size > limit:
                raise InvalidMessage(
                    f"an entry of conversation {cid!r} is over the size limit ({limit} bytes)"
                )
        now = _now()
        stamped = [c.stamped(conv.revision + i + 1, now) for i, c in enumerate(outbox)]
        program = persist(self._ctx, cid, before, conv._state, stamped, now)
        revision = await self._ctx.executor.write(program, action="commit", conversation=cid)
        conv._saved_as(stamped)
        return revision

    async def changes(self, conversation: str, since: int, limit: int | None) -> list[Change]:
        validate_id(conversation)
        since = _count(since, "since")
        top = None if limit is None else _count(limit, "limit")
        ctx = self._ctx

        def program() -> Program[list[Change]]:
            value = yield from load(ctx, conversation)
            if value is None or value.revision <= since:
                return []
            records = yield from log(ctx, conversation, value._state.entries, value.revision)
            end = None if top is None else since + top
            return records[since:end]

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

        def program() -> Program[int]:
            value = yield from load(ctx, conversation, lock=True)
            if value is None:
                raise not_found(conversation)
            current = value.revision
            if revision > current:
                raise not_revision(conversation, revision)
            if revision == current:
                return Rollback(current)
            records = yield from log(ctx, conversation, value._state.entries, current)
            target = Conversation.fold(records[:revision])
            if not value.revert_to(target, by=by):
                return Rollback(current)
            now = _now()
            stamped = [c.stamped(current + 1, now) for c in value._outbox]
            assert value._saved is not None
            return (yield from persist(ctx, conversation, value._saved, value._state, stamped, now))

        return await ctx.executor.write(program(), action="revert", conversation=conversation)

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
        return Message._stored(r[0], r[1], r[2], ctx.sql.created_at, r[3], r[4])


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


def _same(value: Any) -> Any:
    return value
