"""Grouped reads (Postgres): concurrent readers' reads of a conversation's newest
messages sent as one statement.

The agent's read before each model call (``read(conversation, limit=n)``) is one
statement. A store sends at most ``IN_FLIGHT`` of them at once; the readers that arrive
meanwhile queue, and the next free slot sends up to ``MAX_GROUP`` of them as one
statement (``statements.grouped_reads``): one round trip, and one server connection,
where each would take its own (a busy store would otherwise open a connection per
concurrent reader, each costing the server a process and its plans). A reader that
finds a free slot and nobody queued sends its own statement at once: a store that is
not busy reads as before (the queue is ``_storage.statement_groups``').

Each member gets exactly the rows its own statement would have given, from a statement
sent after its call began, so it sees every write acknowledged before. A group that
fails is not reported as a whole: each member then sends its own read (a read changes
nothing, so sending it again is safe) and meets its own outcome. A reader cancelled
while queued leaves the queue; one cancelled after its group was sent stops waiting,
and a group all of whose readers stopped waiting is given up (``_storage.deadlines``).
"""

from __future__ import annotations

from typing import Any

from .dberrors import DatabaseFailure
from .statement_groups import AGAIN, IN_FLIGHT, MAX_GROUP, Member, Send, StatementGroups, settle
from .statements.grouped_reads import read_group_params

__all__ = ["IN_FLIGHT", "MAX_GROUP", "ReadGroups"]


class ReadGroups(StatementGroups):
    """A store's grouped reads in flight and the readers queued behind them (module
    doc)."""

    def __init__(self, fetch: Send) -> None:
        super().__init__(fetch, to_end=False)

    async def _run_group(self, group: list[Member]) -> None:
        params = read_group_params([m.params for m in group])
        try:
            rows = await self._send(group[0].group, params, "read", None)
        except DatabaseFailure:
            for member in group:
                settle(member.done, AGAIN)
            return
        mine: list[list[Any]] = [[] for _ in group]
        for row in rows:
            mine[row[0] - 1].append(row[1:])
        for member, own in zip(group, mine, strict=True):
            settle(member.done, own)
