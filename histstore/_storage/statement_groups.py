"""Statements sent alone or in groups (Postgres): the queue behind grouped appends
(``_storage.append_groups``) and grouped reads (``_storage.read_groups``).

A store sends at most ``IN_FLIGHT`` statements of a kind at once. A caller that finds
a free slot and nobody queued sends its own statement from its own task, at once: a
store that is not busy runs as before. The callers that arrive meanwhile queue, and
the next free slot sends up to ``MAX_GROUP`` of them as one group statement; a queued
caller left alone in its group sends its own statement from the group's task. Each
caller gets the rows its own statement would have given; what a group's failure means
for its members is the kind's (``_run_group``).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from .completion import end_all, finish_then_cancel
from .deadlines import WRITE_GRACE
from .drivers import CompiledStatement

__all__ = [
    "AGAIN",
    "IN_FLIGHT",
    "MAX_GROUP",
    "Member",
    "Rows",
    "Send",
    "StatementGroups",
    "settle",
    "take_group",
]

M = TypeVar("M")

IN_FLIGHT = 2
"""Statements of a kind (a lone one or a group) a store has sent and awaits at once."""

MAX_GROUP = 64
"""Members of one group at most, in both batching queues (``take_group``): a group
statement on Postgres, a group commit of the SQLite writer."""

Rows = Sequence[Any]
Send = Callable[[CompiledStatement, Mapping[str, Any], str, str | None], Awaitable[Rows]]
"""Runs one statement and returns its rows; raises ``DatabaseFailure``."""


class Again:
    """The answer to a member of a group that failed as a whole: send your own."""


AGAIN = Again()


@dataclass(slots=True, eq=False)  # members are told apart by identity
class Member:
    """A queued caller: its own statement and parameters, the group statement that
    can carry it, and where its rows go."""

    one: CompiledStatement
    group: CompiledStatement
    params: Mapping[str, Any]
    action: str
    conversation: str | None
    done: asyncio.Future[Rows | Again]
    started: bool = False
    gone: bool = False
    """Its caller stopped waiting once the group was sent."""
    sending: asyncio.Task[None] | None = None
    """The task sending its group."""
    peers: list[Member] = field(default_factory=list)
    """The members of its group (itself included), once sent."""


class StatementGroups:
    """The statements of one kind in flight and the callers queued behind them (module
    doc). A kind gives ``_run_group`` and may narrow ``_take``."""

    def __init__(self, send: Send, *, to_end: bool) -> None:
        self._send = send
        self._to_end = to_end
        """A caller cancelled once its group was sent waits for the group to end (a
        write, whose outcome it then knows); else it just stops waiting (a read)."""
        self._queue: deque[Member] = deque()
        self._in_flight = 0
        self._tasks: set[asyncio.Task[None]] = set()

    async def submit(
        self,
        one: CompiledStatement,
        group: CompiledStatement | None,
        params: Mapping[str, Any],
        action: str,
        conversation: str | None,
    ) -> Rows:
        """The rows of ``one`` with ``params``, sent alone or with others' by ``group``
        (``None``: always alone). A caller cancelled while queued leaves nothing sent."""
        if group is None or (self._in_flight < IN_FLIGHT and not self._queue):
            self._in_flight += 1
            try:
                return await self._send(one, params, action, conversation)
            finally:
                self._in_flight -= 1
                self._start()
        done: asyncio.Future[Rows | Again] = asyncio.get_running_loop().create_future()
        member = Member(one, group, params, action, conversation, done)
        self._queue.append(member)
        self._start()
        try:
            rows = await (asyncio.shield(done) if self._to_end else done)
        except asyncio.CancelledError:
            if not member.started:
                self._queue.remove(member)
            else:
                if self._to_end:
                    await finish_then_cancel(done, WRITE_GRACE)
                self._leave(member)
            raise
        if isinstance(rows, Again):
            return await self._send(one, params, action, conversation)
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
            for member in group:
                member.sending, member.peers = task, group

    @staticmethod
    def _leave(member: Member) -> None:
        """``member``'s caller stopped waiting for its sent group (cancelled; a write
        after ``WRITE_GRACE``): once every member has, the group is given up
        (``_storage.deadlines``), so that nothing waits on a server that does not answer."""
        member.gone = True
        task = member.sending
        if task is not None and not task.done() and all(m.gone for m in member.peers):
            task.cancel()

    def _admits(self, member: Member, taken: list[Member]) -> bool:
        """Whether ``member`` joins the group being taken (``taken``, not empty, holds
        the first queued and those admitted so far): here, one of the same statement."""
        return member.group is taken[0].group

    def _take(self) -> list[Member]:
        """The next group (``take_group``): the first queued member and up to
        ``MAX_GROUP - 1`` behind it that ``_admits``, in queue order."""
        taken, self._queue = take_group(self._queue, self._admits)
        for member in taken:
            member.started = True
        return taken

    async def _run(self, group: list[Member]) -> None:
        try:
            if len(group) == 1:  # its own statement; its failure is its own
                m = group[0]
                settle(m.done, await self._send(m.one, m.params, m.action, m.conversation))
            else:
                await self._run_group(group)
        except BaseException as exc:
            end_all((member.done for member in group), exc)
            if not isinstance(exc, Exception):
                raise
        finally:
            self._in_flight -= 1
            self._start()

    async def _run_group(self, group: list[Member]) -> None:
        """Send ``group`` (two members or more) as one statement and settle each."""
        raise NotImplementedError


def take_group(
    queue: deque[M], admits: Callable[[M, list[M]], bool | None]
) -> tuple[list[M], deque[M]]:
    """The next group of ``queue`` and what stays queued, both in queue order: the
    first member, then up to ``MAX_GROUP - 1`` behind it that ``admits(member, taken)``
    (``True``: it joins; ``False``: it waits for a later group; ``None``: the group ends
    before it). The one rule of both batching queues: the SQLite writer's (a turn ends
    a group) and Postgres's statements (one statement, one batch a conversation)."""
    taken: list[M] = []
    kept: deque[M] = deque()
    rest = iter(queue)
    for member in rest:
        verdict = True if not taken else None if len(taken) >= MAX_GROUP else admits(member, taken)
        if verdict is None:
            kept.append(member)
            kept.extend(rest)
            break
        (taken if verdict else kept).append(member)
    return taken, kept


def settle(done: asyncio.Future[Rows | Again], value: Rows | Again) -> None:
    """Give a member its answer, unless it stopped waiting."""
    if not done.done():
        done.set_result(value)
