"""Grouped appends (Postgres): concurrent writers' common appends sent as one statement.

The common append is one statement that is its own transaction
(``statements.appends.append_in_one_statement``). A store sends at most ``IN_FLIGHT``
of them at once; the writers that arrive meanwhile queue, and the next free slot sends
up to ``MAX_GROUP`` of them, to distinct conversations, as one statement
(``append_group_statement``): one round trip, one transaction and one commit (one WAL
flush) for them all, where each would pay its own. A writer that finds a free slot and
nobody queued sends its own statement from its own task, at once: a store that is not
busy writes as before.

Every writer gets what its own statement would have given. A group the server refused
(nothing committed: a deadlock, a value one batch holds that the server rejects) is
sent again one batch a statement, so only the batch at fault fails. A group whose
answer was lost (the commit may have happened) fails each member with the phase
``"commit"``, and each settles on its own idempotency key, as a lone append does.

A writer's second append to a conversation waits for the group holding its first (one
statement cannot update a conversation's row twice), so a conversation's appends keep
their order. Groups lock their conversations' rows in sorted order, so that groups of
this store or of other processes never wait for each other in a cycle.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from .completion import end_all, finish_then_cancel
from .dberrors import DatabaseFailure, failure
from .drivers import FETCH, CompiledStatement, Program
from .statements.appends import group_params

__all__ = ["AppendGroups", "statement_sender"]

IN_FLIGHT = 2
"""Appends (a lone one or a group) a store has sent and awaits at once."""

MAX_GROUP = 64
"""Batches in one group statement at most (the rest wait for the next one)."""

Rows = list[Any]
Send = Callable[[CompiledStatement, dict[str, Any], str, str | None], Awaitable[Rows]]
"""Runs a statement as its own transaction and returns its rows; raises
``DatabaseFailure`` (the executor's single-statement write)."""


class _Again:
    """The answer to a member of a group the server refused: send your own."""


_AGAIN = _Again()


@dataclass(slots=True, eq=False)  # members are told apart by identity
class _Member:
    one: CompiledStatement
    group: CompiledStatement
    params: dict[str, Any]
    action: str
    done: asyncio.Future[Rows | _Again]
    started: bool = False

    @property
    def conversation(self) -> str:
        return str(self.params["c"])


class AppendGroups:
    """A store's appends in flight and the writers queued behind them (module doc)."""

    def __init__(self, send: Send) -> None:
        self._send = send
        self._queue: deque[_Member] = deque()
        self._in_flight = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._now: datetime | None = None  # the latest group's stamp

    async def append(
        self,
        one: CompiledStatement,
        group: CompiledStatement | None,
        params: dict[str, Any],
        action: str,
    ) -> Rows:
        """Append as ``one`` with ``params`` would (the rows it returns), alone or in a
        group statement ``group`` (``None``: always alone). A writer cancelled while
        queued leaves nothing done; once its group is sent, the caller sees its
        ``CancelledError`` after the group ends."""
        if group is None or (self._in_flight < IN_FLIGHT and not self._queue):
            self._in_flight += 1
            try:
                return await self._send(one, params, action, params["c"])
            finally:
                self._in_flight -= 1
                self._start()
        member = _Member(one, group, params, action, asyncio.get_running_loop().create_future())
        self._queue.append(member)
        self._start()
        try:
            rows = await asyncio.shield(member.done)
        except asyncio.CancelledError:
            if not member.started:
                self._queue.remove(member)
            else:
                await finish_then_cancel(member.done)
            raise
        if isinstance(rows, _Again):
            return await self._send(one, params, action, params["c"])
        return rows

    async def wait_idle(self) -> None:
        """Return once no group is in flight (the queue empties with them)."""
        while self._tasks:
            await asyncio.wait(set(self._tasks))

    def _start(self) -> None:
        while self._queue and self._in_flight < IN_FLIGHT:
            group = self._take()
            self._in_flight += 1
            task = asyncio.ensure_future(self._run(group))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _take(self) -> list[_Member]:
        """The next group: the first queued member and those behind it sent by the same
        statement, one a conversation, in queue order."""
        statement = self._queue[0].group
        taken: dict[str, _Member] = {}
        kept: deque[_Member] = deque()
        while self._queue:
            member = self._queue.popleft()
            if (
                len(taken) < MAX_GROUP
                and member.group is statement
                and member.conversation not in taken
            ):
                member.started = True
                taken[member.conversation] = member
            else:
                kept.append(member)
        self._queue = kept
        return [taken[c] for c in sorted(taken)]

    async def _run(self, group: list[_Member]) -> None:
        try:
            if len(group) == 1:
                member = group[0]
                rows = await self._send(
                    member.one, member.params, member.action, member.conversation
                )
                _settle(member.done, rows)
            else:
                await self._run_group(group)
        except BaseException as exc:
            end_all((member.done for member in group), exc)
            if not isinstance(exc, Exception):
                raise
        finally:
            self._in_flight -= 1
            self._start()

    async def _run_group(self, group: list[_Member]) -> None:
        stamps = [m.params["now"] for m in group]
        if self._now is not None:
            stamps.append(self._now)
        self._now = now = max(stamps)  # never before an earlier group's
        params = group_params([m.params for m in group], now)
        try:
            rows = await self._send(group[0].group, params, "append to", None)
        except DatabaseFailure as exc:
            if exc.phase == "body":  # nothing committed: each sends its own
                for member in group:
                    _settle(member.done, _AGAIN)
                return
            cause = exc.__cause__ if exc.__cause__ is not None else exc
            for member in group:
                if not member.done.done():
                    mine = failure(member.action, member.conversation, cause, exc.phase)
                    mine.__cause__ = cause
                    member.done.set_exception(mine)
            return
        lengths = {str(c): int(length) for c, length in rows}
        for member in group:
            length = lengths.get(member.conversation)
            _settle(member.done, [] if length is None else [(length,)])


def _settle(done: asyncio.Future[Rows | _Again], value: Rows | _Again) -> None:
    if not done.done():
        done.set_result(value)


def statement_sender(write: Callable[..., Awaitable[Any]]) -> Send:
    """A ``Send`` made of the executor's ``write``: the statement as a one-step program
    that is its own transaction (``single=True``)."""

    async def send(
        statement: CompiledStatement, params: dict[str, Any], action: str, conversation: str | None
    ) -> Rows:
        rows = await write(
            _fetch(statement, params),
            action=action,
            conversation=conversation,
            single=True,
            lists=0,
        )
        return list(rows)

    return send


def _fetch(statement: CompiledStatement, params: dict[str, Any]) -> Program[Any]:
    return (yield FETCH, statement, params)
