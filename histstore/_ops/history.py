"""Messages of a conversation: read, count, write, pop, clear.

Every write is one program (see ``_storage.drivers``) run by the executor in one transaction;
the hot paths (an append, an append at the expected length) cost one statement to lock
the conversation row and hand out positions, then the inserts. What needs deciding
(``at`` overlapping stored messages, an idempotency key seen before) is decided in the
same program, under the same lock: there is no second write path.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Generator, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from .._core import codec as _codec
from .._core import rules as _rules
from .._core.ids import new_key, validate_id
from .._core.models import Message, MessageLike, WriteOutcome, stored_message, stored_messages
from .._editable.changes import Change
from .._errors import ConflictError, HistStoreError, InvalidMessage, WriteError
from .._storage import rows as _rows
from .._storage.dberrors import DatabaseFailure
from .._storage.drivers import EXECUTE, EXECUTE_MANY, FETCH, Program, Rollback, Step
from .context import Context, not_found
from .editing import stored_entries
from .settle import was_stored
from .state import metadata_merge

__all__ = ["ZERO", "History", "delete_conversation"]

ZERO = WriteOutcome(0, False, None)

SHORT_READ = 200
"""Messages a read returns at most (its ``limit``) for it to count as short: on SQLite it
may then run on the event loop's own thread (``Executor.fetch``'s ``inline``)."""

STREAM_PAGE = 1000
"""Messages ``Store.stream`` reads per statement unless told otherwise."""

SHORT_WRITE = 128
"""Messages of a batch at most for its append to count as short (``Executor.write``)."""


def delete_conversation(ctx: Context, conversation: str) -> Generator[Step, Any, None]:
    """Program steps: remove a conversation and everything it holds."""
    params = {"c": conversation}
    for stmt in ctx.sql.delete_children:
        yield EXECUTE, stmt, params
    yield EXECUTE, ctx.sql.delete_conversation, params


class History:
    """The message calls of a store (see ``Store`` for their contracts)."""

    def __init__(self, ctx: Context) -> None:
        self._ctx = ctx

    # ------------------------------------------------------------------ reads

    async def read(
        self, conversation: str, limit: int | None, start: int, stop: int | None
    ) -> list[Message]:
        validate_id(conversation)
        limit = _rules.argument(limit, "limit")
        start = _rules.argument(start, "start", allow_none=False) or 0
        stop = _rules.argument(stop, "stop")
        if limit == 0 or (stop is not None and stop <= start):
            self._ctx.executor.check()
            return []
        ctx = self._ctx
        stmt = ctx.sql.read[limit is not None, stop is not None]
        params = ctx.params(conversation, start=start, stop=stop, limit=limit)
        short = limit is not None and limit <= SHORT_READ
        group = ctx.sql.read_group if short and stop is None else None
        rows = await ctx.executor.fetch(
            stmt, params, action="read", conversation=conversation, inline=short, group=group
        )
        result = self.messages(rows)
        if limit is not None:
            result.reverse()
        return result

    def stream(
        self, conversation: str, start: int, stop: int | None, page: int
    ) -> AsyncIterator[Message]:
        """Check the arguments now; the iterator reads when iterated."""
        validate_id(conversation)
        start = _rules.argument(start, "start", allow_none=False) or 0
        stop = _rules.argument(stop, "stop")
        page = _rules.positive(page, "page")
        return self._stream(conversation, start, stop, page)

    async def _stream(
        self, conversation: str, start: int, stop: int | None, page: int
    ) -> AsyncIterator[Message]:
        """Pages of ``page`` messages by position (keyset), one statement each, up to
        ``stop`` or the length at the start; a short page (it shrank meanwhile) ends it."""
        ctx = self._ctx
        length = await self.count(conversation)
        end = length if stop is None else min(stop, length)
        stmt = ctx.sql.read[False, True]
        position = start
        while position < end:
            upto = min(position + page, end)
            params = ctx.params(conversation, start=position, stop=upto, limit=None)
            rows = await ctx.executor.fetch(
                stmt, params, action="read", conversation=conversation, inline=page <= SHORT_READ
            )
            messages = self.messages(rows)
            del rows
            for message in messages:
                yield message
            if len(messages) < upto - position:
                return
            position = upto

    async def read_system(self, conversation: str) -> list[Message]:
        validate_id(conversation)
        ctx = self._ctx
        params = ctx.params(conversation, start=0)
        rows = await ctx.executor.fetch(
            ctx.sql.read_system, params, action="read", conversation=conversation
        )
        return self.messages(rows)

    def messages(self, rows: Iterable[Sequence[Any]]) -> list[Message]:
        """Messages from the rows of ``Statements.read`` (``dialects.message_columns``)."""
        return stored_messages(rows, self._ctx.sql.read_time)

    async def count(self, conversation: str) -> int:
        validate_id(conversation)
        ctx = self._ctx
        params = ctx.params(conversation)
        rows = await ctx.executor.fetch(
            ctx.sql.count, params, action="count", conversation=conversation, inline=True
        )
        return int(rows[0][0]) if rows else 0

    async def exists(self, conversation: str) -> bool:
        validate_id(conversation)
        ctx = self._ctx
        params = ctx.params(conversation)
        rows = await ctx.executor.fetch(
            ctx.sql.exists, params, action="exists", conversation=conversation, inline=True
        )
        return bool(rows)

    # ------------------------------------------------------------------ write

    async def prepare(self, conversation: str, batch: Iterable[MessageLike]) -> _rules.Batch:
        """Validate a batch (off the event loop when it is large)."""
        if isinstance(batch, (str, bytes, Mapping, Message)):
            raise InvalidMessage("write() takes a sequence of messages, not a single one")
        items = list(batch)
        settings = self._ctx.settings
        _rules.check_batch_size(conversation, len(items), settings.max_batch)

        def prepare() -> _rules.Batch:
            return _rules.prepare_batch(
                conversation,
                items,
                max_message_bytes=settings.max_message_bytes,
                count_tokens=settings.count_tokens,
            )

        raw = [m for m in items if not isinstance(m, Message)]
        if raw and _codec.looks_large(raw):
            return await asyncio.to_thread(prepare)
        return prepare()

    async def write(
        self,
        conversation: str,
        messages: Iterable[MessageLike],
        at: int | None,
        idempotency_key: str | None,
        metadata: Mapping[Any, Any] | None = None,
    ) -> WriteOutcome:
        try:
            validate_id(conversation)
            merge = None if metadata is None else metadata_merge(conversation, metadata)
            at = _rules.argument(at, "at")
            caller_key = idempotency_key is not None
            key = (
                validate_id(idempotency_key, what="idempotency key")
                if idempotency_key is not None
                else new_key()
            )
            batch = await self.prepare(conversation, messages)
        except HistStoreError as exc:
            exc.outcome = ZERO
            raise
        single = (
            at is None
            and merge is None
            and not caller_key
            and bool(batch.messages)
            and self._ctx.sql.append_one is not None
        )
        try:
            if single:
                return await self._append_one(conversation, batch, key)
            program = self._append(conversation, batch, at, key, caller_key)
            if merge is not None:
                program = _then_merge(program, merge(self._ctx))
            return await self._ctx.executor.write(
                program,
                action="write to",
                conversation=conversation,
                lists=len(batch.messages),
                short=len(batch.messages) <= SHORT_WRITE,
            )
        except DatabaseFailure as exc:
            return await self._failed(conversation, batch, key, exc)
        except HistStoreError as exc:
            if exc.outcome is None:
                exc.outcome = ZERO
            raise

    async def _failed(
        self, conversation: str, batch: _rules.Batch, key: str, exc: DatabaseFailure
    ) -> WriteOutcome:
        """The outcome of a write whose transaction failed (see ``Store.write``)."""
        n = len(batch.messages)
        if exc.phase == "done":
            return WriteOutcome(n, False, None)  # committed; only giving back failed
        if exc.phase == "body":
            raise WriteError(
                f"{exc}; nothing was stored", outcome=ZERO, idempotency_key=key
            ) from exc.__cause__
        length = await was_stored(self._ctx, conversation, key, exc)
        return WriteOutcome(n, False, length)

    async def _append_one(self, conversation: str, batch: _rules.Batch, key: str) -> WriteOutcome:
        """The common append as one statement that is its own transaction, or part of
        a group's (``_storage.statements.appends``); the same effect as ``_append``."""
        ctx = self._ctx
        sql = ctx.sql
        assert sql.append_one is not None
        n = len(batch.messages)
        now = _rows.now()
        roles, datas, texts = _rows.batch_columns(batch, sql.text)
        params = ctx.params(
            conversation,
            n=n,
            now=now,
            key=key,
            digest=batch.digest,
            roles=roles,
            datas=datas,
            tokens=[None if t is None else str(t) for t in batch.tokens],
            texts=texts,
        )
        found = await ctx.executor.append(
            sql.append_one, sql.append_group, params, action="write to", lists=n
        )
        if not found:  # only a view's foreign conversation refuses an append
            raise not_found(conversation)
        return WriteOutcome(n, False, int(found[0][0]))

    def _append(
        self, conversation: str, batch: _rules.Batch, at: int | None, key: str, caller_key: bool
    ) -> Program[WriteOutcome]:
        """The write program: append ``batch`` at ``at`` (or at the end) under ``key``."""
        ctx = self._ctx
        sql = ctx.sql
        n = len(batch.messages)
        now = _rows.now()
        params = ctx.params(conversation, n=n, now=now)
        rows: Any = None  # an empty batch changes nothing: no change record
        if n and at is None:
            rows = yield FETCH, sql.append, params
            if not rows:  # only a view's foreign conversation refuses an append
                raise not_found(conversation)
        elif n and at is not None:
            rows = yield FETCH, sql.append_at, {**params, "at": at, "new_length": at + n}
        if rows:
            length, revision, next_entry = (int(v) for v in rows[0])
            record = self._record(conversation, key, length - n, batch, now, revision, n)
            if caller_key and not (yield FETCH, sql.insert_write_once, record):
                # The key is known: its batch decides, and this transaction is undone.
                rows = yield FETCH, sql.find_write, {"c": conversation, "key": key}
                return Rollback((yield from self._known(conversation, batch, rows[0], length - n)))
            if not caller_key:
                yield EXECUTE, sql.insert_write, record
            yield from self._insert(conversation, batch, length - n, 0, now, next_entry - n)
            return WriteOutcome(n, False, length)

        # ``at`` is not the length (or the batch is empty): lock the row (creating the
        # conversation when it is new, which a conflict below undoes), then confirm
        # what is stored already.
        rows = yield FETCH, sql.touch, params
        if not rows:
            raise not_found(conversation)
        length, revision, next_entry = (int(v) for v in rows[0])
        if at is None:
            at = length
        if caller_key:
            rows = yield FETCH, sql.find_write, {"c": conversation, "key": key}
            if rows and rows[0][0] != _rows.CLAIMED:  # a claim stores nothing (``_ops.settle``)
                return Rollback((yield from self._known(conversation, batch, rows[0], length)))
        if at > length:
            raise ConflictError(
                f"write to conversation {conversation!r} at {at} leaves a gap: it holds"
                f" {length} messages",
                outcome=ZERO,
            )
        overlap = min(length - at, n)
        if overlap:
            range_ = {"c": conversation, "start": at, "stop": at + overlap}
            stored = yield FETCH, sql.stored_range, range_
            for i, (text, position) in enumerate(stored):
                if stored_message(text, position, None) != batch.messages[i]:
                    raise ConflictError(
                        f"write to conversation {conversation!r} at {at}: message"
                        f" {at + i} differs from the one stored",
                        outcome=ZERO,
                    )
        appended = n - overlap
        if appended == 0 and not caller_key and n:
            return Rollback(WriteOutcome(n, False, length))  # all of it is stored
        if appended:
            grow = {"c": conversation, "length": length + appended, "n": appended, "now": now}
            yield EXECUTE, sql.set_length, grow
        # A batch that only confirms stored messages is no change record.
        record = self._record(
            conversation, key, at, batch, now, revision + 1 if appended else None, appended
        )
        if caller_key:  # in the place of the key's claim, when there is one
            yield FETCH, sql.insert_write_once, record
        else:
            yield EXECUTE, sql.insert_write, record
        yield from self._insert(conversation, batch, length, overlap, now, next_entry)
        return WriteOutcome(n, False, length + appended)

    @staticmethod
    def _record(
        conversation: str,
        key: str,
        first: int,
        batch: _rules.Batch,
        now: datetime,
        revision: int | None,
        appended: int,
    ) -> dict[str, Any]:
        """The batch's idempotency row; with a ``revision``, also its change record."""
        return {
            "conversation_id": conversation,
            "key": key,
            "position": first,
            "count": len(batch.messages),
            "digest": batch.digest,
            "created_at": now,
            "revision": revision,
            "appended": appended if revision is not None else None,
        }

    def _insert(
        self,
        conversation: str,
        batch: _rules.Batch,
        first: int,
        skip: int,
        now: datetime,
        first_entry: int,
    ) -> Generator[Step, Any, None]:
        sql = self._ctx.sql
        values = _rows.batch_values(
            batch, conversation, first, now, skip, first_entry=first_entry, rule=sql.text
        )
        if values.rows:
            step = (EXECUTE_MANY, sql.insert_messages, values)
            yield from sql.listed([step], len(values.rows))

    def _known(
        self, conversation: str, batch: _rules.Batch, record: Sequence[Any], length: int
    ) -> Generator[Step, Any, WriteOutcome]:
        """A batch whose key is recorded: confirmed when it is the recorded batch (the
        same texts, else equal messages where it went: key order may differ)."""
        digest, count, position = record
        n = len(batch.messages)
        same = count == n and _codec.same_digest(digest, batch.digest)
        if not same and count == n:
            range_ = {"c": conversation, "start": position, "stop": position + count}
            stored = yield FETCH, self._ctx.sql.stored_range, range_
            same = [stored_message(t, p, None) for t, p in stored] == batch.messages
        if not same:
            raise ConflictError(
                f"idempotency key already used for another batch in conversation {conversation!r}",
                outcome=ZERO,
            )
        return WriteOutcome(n, False, length)

    # ------------------------------------------------------------------ pop, clear

    async def pop(self, conversation: str) -> Message | None:
        validate_id(conversation)
        ctx = self._ctx

        def program() -> Program[Message | None]:
            sql, edit = ctx.sql, ctx.sql.edit
            head = yield FETCH, edit.lock, ctx.params(conversation)
            if not head or not head[0][4]:
                return None  # empty, unknown or not visible: nothing changed
            revision, _next_entry, next_aside, halted, length = head[0]
            position = int(length) - 1
            c = {"c": conversation, "position": position}
            rows = yield FETCH, sql.delete_message, c
            if not rows:
                raise HistStoreError(f"conversation {conversation!r} is missing a message")
            data, _position, created_at, entry_id, author = rows[0]
            moved: list[tuple[int, int, int | None]] = []
            if next_aside > 1:  # asides were put: those after the popped entry move back
                got = yield FETCH, edit.move_asides, {**c, "popped": entry_id}
                moved = sorted((int(a), entry_id, after) for a, after in got)
            now = _rows.now()
            yield EXECUTE, edit.popped, {"c": conversation, "now": now}
            (entry,) = stored_entries(ctx, rows)
            change = Change.pop(entry, moved=moved, halted=halted)
            record = _rows.change_row(conversation, int(revision) + 1, change, now, position)
            yield EXECUTE, edit.insert_change, record
            return stored_message(data, position, created_at, sql.created_at, entry_id, author)

        return await ctx.executor.write(program(), action="pop", conversation=conversation)

    async def clear(self, conversation: str) -> None:
        validate_id(conversation)
        ctx = self._ctx

        def program() -> Program[bool]:
            if not (yield FETCH, ctx.sql.lock, ctx.params(conversation)):
                return False  # unknown, or a view's foreign conversation: left alone
            yield from delete_conversation(ctx, conversation)
            return True

        await ctx.executor.write(program(), action="clear", conversation=conversation)


def _then_merge(
    write: Program[WriteOutcome], merge: Generator[Step, Any, None]
) -> Program[WriteOutcome]:
    """``write``, then ``merge`` in the same transaction (under the conversation's row
    lock the write holds), unless the write ends without committing: a batch only
    confirmed (stored before under its key, or all of it at ``at``) merges nothing."""
    outcome = yield from write
    if not isinstance(outcome, Rollback):
        yield from merge
    return outcome
