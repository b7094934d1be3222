"""Grouped reads (Postgres): concurrent readers' reads of a conversation's newest
messages sent as one statement.

The agent's read before each model call (``read(conversation, limit=n)``) is one
statement. A store sends at most ``IN_FLIGHT`` of them at once; the readers that arrive
meanwhile queue, and the next free slot sends up to ``MAX_GROUP`` of them as one
statement (``statements.grouped_reads``): one round trip, and one server connection,
where each would take its own (a busy store would otherwise open a connection per
concurrent reader, each costing the server a process and its plans). A reader that
finds a free slot and nobody queued sends its own statement at once: a store that is
not busy reads as before.

Each member gets exactly the rows its own statement would have given, from a statement
sent after its call began, so it sees every write acknowledged before. A group that
fails is not reported as a whole: each member then sends its own read (a read changes
nothing, so sending it again is safe) and meets its own outcome. A reader cancelled
while queued leaves the queue; one cancelled after its group was sent stops waiting.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .completion import end_all
from .dberrors import DatabaseFailure
from .drivers import CompiledStatement
from .statements.grouped_reads import read_group_params

__all__ = ["IN_FLIGHT", "MAX_GROUP", "ReadGroups"]

IN_FLIGHT = 2
"""Reads (a lone one or a group) a store has sent and awaits at once."""

MAX_GROUP = 64
"""Reads in one group statement at most (the rest wait for the next one)."""

Rows = Sequence[Any]
Fetch = Callable[[CompiledStatement, dict[str, Any], str, str | None], Awaitable[Rows]]
"""Runs one reading statement and returns its rows; raises ``DatabaseFailure`` (the
executor's fetch)."""


class _Again:
    """The answer to a member of a group that failed: send your own."""


_AGAIN = _Again()


@dataclass(slots=True, eq=False)  # members are told apart by identity
class _Member:
    one: CompiledStatement
    group: CompiledStatement
    params: dict[str, Any]
    action: str
    conversation: str | None
    done: asyncio.Future[Rows | _Again]
    started: bool = False


class ReadGroups:
    """A store's grouped reads in flight and the readers queued behind them (module
    doc)."""

    def __init__(self, fetch: Fetch) -> None:
        self._fetch = fetch
        self._queue: deque[_Member] = deque()
        self._in_flight = 0
        self._tasks: set[asyncio.Task[None]] = set()

    async def fetch(
        self,
        one: CompiledStatement,
        group: CompiledStatement,
        params: dict[str, Any],
        action: str,
        conversation: str | None,
    ) -> Rows:
        """The rows of ``one`` with ``params`` (a read's ``c``, ``owner``, ``start`` and
        ``limit``), read alone or with others' by ``group``."""
        if self._in_flight < IN_FLIGHT and not self._queue:
            self._in_flight += 1
            try:
                return await self._fetch(one, params, action, conversation)
            finally:
                self._in_flight -= 1
                self._start()
        done = asyncio.get_running_loop().create_future()
        member = _Member(one, group, params, action, conversation, done)
        self._queue.append(member)
        self._start()
        try:
            rows = await member.done
        except asyncio.CancelledError:
            if not member.started:
                self._queue.remove(member)
            raise
        if isinstance(rows, _Again):
            return await self._fetch(one, params, action, conversation)
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
        """The next group: the first queued member and up to ``MAX_GROUP - 1`` behind
        it read by the same statement, in queue order."""
        statement = self._queue[0].group
        taken: list[_Member] = []
        kept: deque[_Member] = deque()
        for member in self._queue:
            if len(taken) < MAX_GROUP and member.group is statement:
                member.started = True
                taken.append(member)
            else:
                kept.append(member)
        self._queue = kept
        return taken

    async def _run(self, group: list[_Member]) -> None:
        try:
            if len(group) == 1:  # its own statement; its failure is its own
                m = group[0]
                _settle(m.done, await self._fetch(m.one, m.params, m.action, m.conversation))
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
        params = read_group_params([m.params for m in group])
        try:
            rows = await self._fetch(group[0].group, params, "read", None)
        except DatabaseFailure:
            for member in group:
                _settle(member.done, _AGAIN)
            return
        mine: list[list[Any]] = [[] for _ in group]
        for row in rows:
            mine[row[0] - 1].append(row[1:])
        for member, own in zip(group, mine, strict=True):
            _settle(member.done, own)


def _settle(done: asyncio.Future[Rows | _Again], value: Rows | _Again) -> None:
    if not done.done():
        done.set_result(value)
