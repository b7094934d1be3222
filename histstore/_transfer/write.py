"""Writing incoming conversations (import, copy) through the store's executor.

Callers hand over one validated conversation at a time: ``begin``, its message rows,
summary rows, lists and item rows in file order, then ``end``. Each conversation is
stored whole or not at all, by the programs of ``_transfer.sync``:

* a conversation of at most ``batch`` rows (messages, list items) is kept in memory
  until it is complete (so every one of its records was checked) and then joins a shared
  transaction, committed once it holds about ``batch`` rows;
* a larger one is written as it streams, in a transaction of its own, and rolled back
  when anything of it is refused.

So what a failed import or copy leaves does not depend on ``batch``: the conversations
before the refused one are stored, the refused one is not (nor anything after it).
The database work (a group's transaction, a streamed batch, the end and commit of a
streamed conversation) runs in a task while the caller reads and checks the next rows;
at most one such task is in flight.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack, suppress
from typing import Any, TypeVar

from .._errors import HistStoreError
from .._ops.context import Context, not_found
from .._storage.transaction import Transaction
from .sync import Incoming, MessageRows, Steps, Target

__all__ = ["Writer"]

T = TypeVar("T")
Row = dict[str, Any]
Done = Callable[[Incoming, bool], None]
"""Called once a conversation is committed, with whether it changed anything."""

_MESSAGES, _LIST, _ITEMS = 0, 1, 2


class _Current:
    """The conversation being received: buffered while small, else streaming."""

    def __init__(self, incoming: Incoming) -> None:
        self.incoming = incoming
        self.ops: list[tuple[int, Any]] = []
        self.size = 0  # rows received: messages, list items and lists
        self.target: Target | None = None
        self.tx: Transaction | None = None
        self.stack: AsyncExitStack | None = None


def _replay(target: Target, op: tuple[int, Any]) -> Steps[None]:
    kind, value = op
    if kind == _MESSAGES:
        return target.messages(value)
    if kind == _LIST:
        return target.open_list(*value)
    return target.items(value)


def _messages_in(ops: list[tuple[int, Any]]) -> int:
    """How many messages ``ops`` write (what they list for the full-text index)."""
    return sum(len(value) for kind, value in ops if kind == _MESSAGES)


def _whole(target: Target, ops: list[tuple[int, Any]]) -> Steps[bool | None]:
    """A small conversation in one program: ``None`` when a view may not see it."""
    if not (yield from target.open()):
        return None
    for op in ops:
        yield from _replay(target, op)
    return (yield from target.finish())


class Writer:
    """Stores incoming conversations in ``ctx``'s store (see the module doc)."""

    def __init__(self, ctx: Context, *, batch: int, action: str, done: Done) -> None:
        self._ctx = ctx
        self._batch = batch
        self._action = action
        self._done = done
        self._group: list[_Current] = []
        self._group_size = 0
        self._current: _Current | None = None
        self._inflight: asyncio.Future[None] | None = None
        self._failed = False
        self.text = ctx.sql.text
        """What the store's ``search_text`` holds for a message (``rows.text_rule``)."""

    async def __aenter__(self) -> Writer:
        return self

    async def __aexit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        if exc is None:
            await self._flush_group()
            await self._settle()
            return
        current, self._current = self._current, None
        if current is not None and current.stack is not None:
            with suppress(Exception):
                await self._settle()
            await current.stack.__aexit__(type(exc), exc, tb)
            return
        if isinstance(exc, HistStoreError) and not self._failed:
            # A refused conversation: the complete ones before it are kept.
            await self._flush_group()
            await self._settle()
        else:
            self._group = []
            with suppress(Exception):
                await self._settle()

    # ---------------------------------------------------------------- receiving

    def begin(self, incoming: Incoming) -> None:
        """Start receiving ``incoming`` (its summaries are added with ``summary``, its
        editable state to ``incoming.edits``, checked before ``end``)."""
        self._current = _Current(incoming)

    def summary(self, row: Row) -> None:
        """Add a summary row of the current conversation."""
        assert self._current is not None
        self._current.incoming.summaries.append(row)

    async def messages(self, rows: MessageRows) -> None:
        """Add message rows of the current conversation, the next positions in order."""
        await self._add((_MESSAGES, rows), len(rows))

    async def open_list(self, name: str, length: int) -> None:
        """Start a list of the current conversation (after its messages)."""
        await self._add((_LIST, (name, length)), 1)

    async def items(self, rows: list[Row]) -> None:
        """Add item rows of the list opened last, the next indexes in order."""
        await self._add((_ITEMS, rows), len(rows))

    async def end(self) -> None:
        """The current conversation is complete: store it (now, or with its group)."""
        cur, self._current = self._current, None
        assert cur is not None
        if cur.target is not None:
            await self._settle()
            self._start(self._finish(cur))
            return
        self._group.append(cur)
        edits = cur.incoming.edits
        extra = len(cur.incoming.summaries) + (0 if edits is None else edits.size)
        self._group_size += 1 + cur.size + extra
        if self._group_size >= self._batch:
            await self._flush_group()

    # ---------------------------------------------------------------- writing

    async def _add(self, op: tuple[int, Any], size: int) -> None:
        cur = self._current
        assert cur is not None
        if cur.target is not None:
            await self._step(cur, _replay(cur.target, op), _messages_in([op]))
            return
        cur.ops.append(op)
        cur.size += size
        if cur.size > self._batch:
            await self._stream(cur)

    async def _stream(self, cur: _Current) -> None:
        """Go on with ``cur`` in a transaction of its own, from what was buffered."""
        await self._flush_group()
        await self._settle()
        stack = AsyncExitStack()
        cur.tx = await stack.enter_async_context(
            self._ctx.executor.transaction(action=self._action)
        )
        cur.stack = stack
        target = Target(self._ctx, cur.incoming)
        if not await cur.tx.run(target.open(), conversation=cur.incoming.id):
            raise not_found(cur.incoming.id)
        cur.target = target
        ops, cur.ops = cur.ops, []
        for op in ops:
            await self._step(cur, _replay(target, op), _messages_in([op]))

    async def _finish(self, cur: _Current) -> None:
        """End a streamed conversation and commit its transaction (rolled back on error)."""
        assert cur.tx is not None
        assert cur.stack is not None
        assert cur.target is not None
        try:
            changed = await cur.tx.run(cur.target.finish(), conversation=cur.incoming.id)
        except BaseException as exc:
            await cur.stack.__aexit__(type(exc), exc, exc.__traceback__)
            raise
        await cur.stack.aclose()  # commits
        self._done(cur.incoming, changed)

    async def _step(self, cur: _Current, program: Steps[None], lists: int) -> None:
        assert cur.tx is not None
        await self._settle()
        self._start(cur.tx.run(program, conversation=cur.incoming.id, lists=lists))

    async def _flush_group(self) -> None:
        group, self._group, self._group_size = self._group, [], 0
        if group:
            await self._settle()
            self._start(self._write_group(group))

    async def _write_group(self, group: list[_Current]) -> None:
        results: list[tuple[Incoming, bool]] = []
        refused: str | None = None
        async with self._ctx.executor.transaction(action=self._action) as tx:
            for cur in group:
                target = Target(self._ctx, cur.incoming)
                changed = await tx.run(
                    _whole(target, cur.ops),
                    conversation=cur.incoming.id,
                    lists=_messages_in(cur.ops),
                )
                if changed is None:
                    refused = cur.incoming.id
                    break
                results.append((cur.incoming, changed))
        for incoming, changed in results:
            self._done(incoming, changed)
        if refused is not None:
            raise not_found(refused)

    def _start(self, work: Awaitable[Any]) -> None:
        self._inflight = asyncio.ensure_future(work)

    async def _settle(self) -> None:
        """Wait for the work in flight (raising its error, if any)."""
        task, self._inflight = self._inflight, None
        if task is not None:
            try:
                await task
            except BaseException:
                self._failed = True  # nothing after a refused conversation is written
                raise
