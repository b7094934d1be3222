"""Grouped appends (Postgres): concurrent writers' common appends sent as one statement.

The common append is one statement that is its own transaction
(``statements.appends.append_in_one_statement``). A store sends at most ``IN_FLIGHT``
of them at once; the writers that arrive meanwhile queue, and the next free slot sends
up to ``MAX_GROUP`` of them, to distinct conversations, as one statement
(``append_group_statement``): one round trip, one transaction and one commit (one WAL
flush) for them all, where each would pay its own. A writer that finds a free slot and
nobody queued sends its own statement from its own task, at once: a store that is not
busy writes as before. The queue is ``_storage.statement_groups``'.

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

from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime
from typing import Any

from .dberrors import DatabaseFailure, failure
from .drivers import FETCH, CompiledStatement, Program
from .statement_groups import AGAIN, IN_FLIGHT, Member, Rows, Send, StatementGroups, settle
from .statements.appends import group_params

__all__ = ["IN_FLIGHT", "AppendGroups", "statement_sender"]


class AppendGroups(StatementGroups):
    """A store's appends in flight and the writers queued behind them (module doc)."""

    def __init__(self, send: Send) -> None:
        super().__init__(send, to_end=True)
        self._now: datetime | None = None  # the latest group's stamp

    async def append(
        self,
        one: CompiledStatement,
        group: CompiledStatement | None,
        params: Mapping[str, Any],
        action: str,
    ) -> Rows:
        """Append as ``one`` with ``params`` would (the rows it returns), alone or in a
        group statement ``group`` (``None``: always alone). A writer cancelled while
        queued leaves nothing done; once its group is sent, the caller sees its
        ``CancelledError`` after the group ends, or ``deadlines.WRITE_GRACE`` later
        (the group is given up once all its writers are gone)."""
        return await self.submit(one, group, params, action, params["c"])

    def _admits(self, member: Member, taken: list[Member]) -> bool:
        """One batch a conversation in a group (one statement cannot update a row
        twice): a conversation's next append waits for the next group."""
        return super()._admits(member, taken) and all(
            m.conversation != member.conversation for m in taken
        )

    async def _run_group(self, group: list[Member]) -> None:
        group = sorted(group, key=lambda m: str(m.conversation))  # the rows' lock order
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
                    settle(member.done, AGAIN)
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
            length = lengths.get(str(member.conversation))
            settle(member.done, [] if length is None else [(length,)])


def statement_sender(write: Callable[..., Awaitable[Any]]) -> Send:
    """A ``Send`` made of the executor's ``write``: the statement as a one-step program
    that is its own transaction (``single=True``)."""

    async def send(
        statement: CompiledStatement,
        params: Mapping[str, Any],
        action: str,
        conversation: str | None,
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


def _fetch(statement: CompiledStatement, params: Mapping[str, Any]) -> Program[Any]:
    return (yield FETCH, statement, params)
