"""A conversation's state: load and save it whole, fork it, summaries, metadata."""

from __future__ import annotations

from collections.abc import Callable, Generator, Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncConnection

from .._core import codec as _codec
from .._core import rules as _rules
from .._core.ids import validate_id
from .._core.models import ConversationState, Summary, stored_message
from .._editable.changes import Change
from .._editable.entries import Entry
from .._errors import ConflictError
from .._storage import rows as _rows
from .._storage import schema as s
from .._storage.drivers import EXECUTE, EXECUTE_MANY, FETCH, Program, Step
from .context import Context, not_found
from .editing import stored_entries

__all__ = ["Saved", "State", "replace_conversation", "touched"]

_conv = s.conversations
_msg = s.messages


class Saved:
    """A validated whole conversation, ready for ``replace_conversation``."""

    def __init__(
        self,
        state: ConversationState,
        owner: str | None,
        batch: _rules.Batch,
        *,
        keep_times: bool,
    ) -> None:
        cid = state.id
        self.id = cid
        self.owner = owner
        self.system_prompt = state.system_prompt
        self.batch = batch
        self.summaries = [_rules.summary_row(cid, i, sm) for i, sm in enumerate(state.summaries)]
        self.metadata = _rules.metadata_rows(cid, state.metadata or {})
        self.created_at = None if state.created_at is None else _rules.time(state.created_at)
        updated = state.updated_at if keep_times else None
        self.updated_at = None if updated is None else _rules.time(updated)
        self.keep_times = keep_times


def replace_conversation(ctx: Context, saved: Saved) -> Program[bool]:
    """The program that makes a conversation exactly ``saved`` (lists are left alone).

    Creates the conversation or locks it; a view's foreign conversation is
    ``NotFound``. The entries are replaced by new ones (new ids), recorded as one
    ``"save"`` change holding the entries it removed; the write records among the
    idempotency rows it drops stay in the change log.
    """
    sql, edit = ctx.sql, ctx.sql.edit
    now = _rows.now()
    cid = saved.id
    n = len(saved.batch.messages)
    p = ctx.params(
        cid,
        owner=saved.owner,
        system_prompt=saved.system_prompt,
        n=n,
        revision=1 if n else 0,
        next_entry=n + 1,
        created_at=saved.created_at or now,
        updated_at=saved.updated_at or now,
    )
    created = yield FETCH, sql.create, p
    removed: list[Entry] = []
    moved: list[tuple[int, int, None]] = []
    halted: str | None = None
    revision, first_entry = 0, 1
    if not created:
        head = yield FETCH, edit.lock, ctx.params(cid)
        if not head:
            raise not_found(cid)
        revision, first_entry, next_aside, halted, length = (
            int(head[0][0]),
            int(head[0][1]),
            int(head[0][2]),
            head[0][3],
            int(head[0][4]),
        )
        if length:
            rows = yield FETCH, edit.entries, {"c": cid}
            removed = stored_entries(ctx, rows)
        if next_aside > 1 and removed:
            got = yield FETCH, edit.unplace_asides, {"c": cid}
            moved = [(int(a), int(after), None) for a, after in got]
            if moved:
                yield EXECUTE, edit.clear_aside_places, {"c": cid}
        yield EXECUTE, edit.keep_write_records, {"c": cid}
        for stmt in sql.delete_saved:
            yield EXECUTE, stmt, {"c": cid}
        changed = bool(removed or n)
        # An existing conversation keeps its creation time unless times are restored.
        yield (
            EXECUTE,
            sql.replace_row,
            {
                **p,
                "created_at": p["created_at"] if saved.keep_times else None,
                "revision": revision + 1 if changed else revision,
                "next_entry": first_entry + n,
            },
        )
    values = _rows.batch_values(saved.batch, cid, 0, now, first_entry=first_entry, rule=sql.text)
    if values.rows:
        step = (EXECUTE_MANY, sql.insert_messages, values)
        yield from sql.listed([step], len(values.rows))
    if removed or values.rows:
        change = Change(
            "save",
            start=0,
            removed=tuple(removed),
            moved=tuple(moved),
            halt=None if halted is None else (halted, None),
        )
        row = _rows.change_row(cid, revision + 1, change, now, 0, n)
        yield EXECUTE, edit.insert_change, row
    summaries = [{**r, "created_at": r["created_at"] or now} for r in saved.summaries]
    if summaries:
        yield EXECUTE_MANY, sql.insert_summary, summaries
    if saved.metadata:
        yield EXECUTE_MANY, sql.insert_metadata, saved.metadata
    return True


def touched(ctx: Context, conversation: str, now: datetime | None = None) -> Program[int]:
    """Program steps: create the conversation when needed and mark it changed, under its
    lock; returns its length. ``NotFound`` when a view may not see it."""
    rows = yield FETCH, ctx.sql.touch, ctx.params(conversation, now=now or _rows.now())
    if not rows:
        raise not_found(conversation)
    return int(rows[0][0])


class State:
    """The state calls of a store (see ``Store`` for their contracts)."""

    def __init__(self, ctx: Context) -> None:
        self._ctx = ctx

    async def load(self, conversation: str) -> ConversationState:
        validate_id(conversation)
        ctx = self._ctx

        async def work(conn: AsyncConnection) -> ConversationState:
            row = (
                await conn.execute(
                    select(
                        _conv.c.owner, _conv.c.system_prompt, _conv.c.created_at, _conv.c.updated_at
                    ).where(ctx.owned(conversation))
                )
            ).first()
            if row is None:
                raise not_found(conversation)
            rows = (
                await conn.execute(
                    select(
                        _msg.c.data,
                        _msg.c.position,
                        _msg.c.created_at,
                        _msg.c.token_count,
                        _msg.c.entry_id,
                        _msg.c.author,
                    )
                    .where(_msg.c.conversation_id == conversation)
                    .order_by(_msg.c.position)
                )
            ).all()
            metadata = await _metadata(conn, conversation)
            return ConversationState(
                conversation,
                user=row.owner,
                messages=tuple(stored_message(r[0], r[1], r[2], None, r[4], r[5]) for r in rows),
                system_prompt=row.system_prompt,
                summaries=tuple(await _summaries(conn, conversation)),
                metadata=metadata or None,
                token_count=sum(r[3] or 0 for r in rows),
                created_at=row.created_at,
                updated_at=row.updated_at,
            )

        return await ctx.executor.run(
            work, mode="snapshot", action="load", conversation=conversation
        )

    async def save(self, state: ConversationState, *, keep_times: bool = False) -> None:
        if not isinstance(state, ConversationState):
            raise TypeError("save() takes a ConversationState")
        ctx = self._ctx
        settings = ctx.settings
        batch = _rules.prepare_batch(
            state.id,
            state.messages,
            max_message_bytes=settings.max_message_bytes,
            count_tokens=settings.count_tokens,
            times=[m.created_at for m in state.messages],
        )
        owner = ctx.owner if ctx.owner is not None else state.user
        saved = Saved(state, owner, batch, keep_times=keep_times)
        await ctx.executor.write(
            replace_conversation(ctx, saved), action="save", conversation=state.id
        )

    async def fork(self, source: str, target: str, upto: int | None) -> None:
        validate_id(source)
        validate_id(target, what="target conversation id")
        upto = _rules.argument(upto, "upto")
        ctx = self._ctx

        def program() -> Program[bool]:
            sql = ctx.sql
            src = yield FETCH, sql.lock, ctx.params(source)
            if not src:
                raise not_found(source)
            length, owner, prompt, next_entry = src[0]
            length = int(length) if upto is None else min(upto, int(length))
            now = _rows.now()
            created = yield (
                FETCH,
                sql.create,
                {
                    "c": target,
                    "owner": owner,
                    "system_prompt": prompt,
                    "n": length,
                    "revision": 1 if length else 0,
                    "next_entry": next_entry,
                    "created_at": now,
                    "updated_at": now,
                },
            )
            if not created:
                taken = yield FETCH, sql.taken, {"c": target}
                if ctx.owner is not None and (not taken or taken[0][0] != ctx.owner):
                    raise not_found(target)
                raise ConflictError(f"conversation {target!r} already exists")
            copy = {
                "c": target,
                "src": source,
                "upto": length,
                "upto_summary": _rules.MAX_BIGINT if upto is None else upto,
            }
            yield from sql.listed([(EXECUTE, stmt, copy) for stmt in sql.fork_copies])
            if length:  # the target's one change record: the entries it was given
                record = _rows.change_row(target, 1, Change("fork", start=0), now, 0, length)
                yield EXECUTE, sql.edit.insert_change, record
            return True

        await ctx.executor.write(program(), action="fork", conversation=source)

    async def add_summary(self, conversation: str, summary: Summary) -> None:
        validate_id(conversation)
        if not isinstance(summary, Summary):
            raise TypeError("add_summary() takes a Summary")
        row = _rules.summary_row(conversation, 0, summary)
        ctx = self._ctx

        def program() -> Program[bool]:
            now = _rows.now()
            yield from touched(ctx, conversation, now)
            rows = yield FETCH, ctx.sql.next_summary, {"c": conversation}
            values = {**row, "seq": rows[0][0], "created_at": row["created_at"] or now}
            yield EXECUTE, ctx.sql.insert_summary, values
            return True

        await ctx.executor.write(program(), action="add summary", conversation=conversation)

    async def summaries(self, conversation: str) -> list[Summary]:
        validate_id(conversation)
        ctx = self._ctx

        async def work(conn: AsyncConnection) -> list[Summary]:
            if ctx.owner is not None and not await _visible(conn, ctx, conversation):
                return []
            return await _summaries(conn, conversation)

        return await ctx.executor.run(
            work, mode="snapshot", action="summaries", conversation=conversation
        )

    async def metadata(self, conversation: str) -> dict[str, Any]:
        validate_id(conversation)
        ctx = self._ctx
        rows = await ctx.executor.fetch(
            ctx.sql.read_metadata,
            ctx.params(conversation),
            action="metadata",
            conversation=conversation,
        )
        if not rows:
            raise not_found(conversation)
        return {_codec.key_from_stored(k): _codec.decode(v) for k, v in rows if k is not None}

    async def merge_metadata(self, conversation: str, updates: Mapping[Any, Any]) -> None:
        validate_id(conversation)
        merge = metadata_merge(conversation, updates)
        ctx = self._ctx

        def program() -> Program[bool]:
            yield from touched(ctx, conversation)
            yield from merge(ctx)
            return True

        await ctx.executor.write(program(), action="merge metadata", conversation=conversation)


def metadata_merge(
    conversation: str, updates: Mapping[Any, Any]
) -> Callable[[Context], Generator[Step, Any, None]]:
    """The steps that merge ``updates`` into a conversation's metadata (a ``None`` value
    removes its key), checked and encoded now; run them after the conversation is
    locked (``touched``, or a write that holds its row).

    Raises:
        TypeError: ``updates`` is not a mapping.
        InvalidMessage: a key breaks the id rules or a value has no JSON form.
    """
    if not isinstance(updates, Mapping):
        raise TypeError("metadata updates must be a mapping")
    sets = _rules.metadata_rows(conversation, {k: v for k, v in updates.items() if v is not None})
    removals = [_rules.metadata_key_digest(k) for k, v in updates.items() if v is None]

    def steps(ctx: Context) -> Generator[Step, Any, None]:
        if sets:
            yield EXECUTE_MANY, ctx.sql.set_metadata, sets
        if removals:
            gone = [{"c": conversation, "key_digest": d} for d in removals]
            yield EXECUTE_MANY, ctx.sql.delete_metadata, gone

    return steps


async def _visible(conn: AsyncConnection, ctx: Context, conversation: str) -> bool:
    found = await conn.execute(select(_conv.c.id).where(ctx.owned(conversation)))
    return found.first() is not None


async def _summaries(conn: AsyncConnection, conversation: str) -> list[Summary]:
    sm = s.summaries
    rows = await conn.execute(
        select(sm.c.start, sm.c.end, sm.c.content, sm.c.token_count, sm.c.created_at)
        .where(sm.c.conversation_id == conversation)
        .order_by(sm.c.seq)
    )
    return [
        Summary(r.start, r.end, _codec.decode(r.content), r.token_count, r.created_at) for r in rows
    ]


async def _metadata(conn: AsyncConnection, conversation: str) -> dict[str, Any]:
    md = s.metadata_entries
    rows = await conn.execute(
        select(md.c.key, md.c.value).where(md.c.conversation_id == conversation).order_by(md.c.key)
    )
    return {_codec.key_from_stored(r.key): _codec.decode(r.value) for r in rows}


def _same(value: Any) -> Any:
    return value
