"""Named append-only lists of JSON values (or bytes) kept per conversation."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncConnection

from .._core import codec as _codec
from .._core import rules as _rules
from .._core.ids import validate_id
from .._errors import InvalidMessage
from .._storage import schema as s
from .._storage.drivers import EXECUTE_MANY, FETCH, Program
from .context import Context, not_found
from .state import touched

__all__ = ["Lists"]


class Lists:
    """The list calls of a store (see ``Store`` for their contracts)."""

    def __init__(self, ctx: Context) -> None:
        self._ctx = ctx

    async def append(self, conversation: str, name: str, items: Iterable[Any]) -> int:
        validate_id(conversation)
        validate_id(name, what="list name")
        if isinstance(items, (str, bytes, bytearray, Mapping)):
            raise InvalidMessage("list_append() takes a sequence of items")
        encoded = [_rules.item(value) for value in items]
        k = len(encoded)
        ctx = self._ctx

        def program() -> Program[int]:
            yield from touched(ctx, conversation)
            params = {"c": conversation, "name": name, "k": k}
            length = int((yield FETCH, ctx.sql.grow_list, params)[0][0])
            if encoded:
                rows = [
                    {
                        "conversation_id": conversation,
                        "name": name,
                        "idx": length - k + i,
                        "value": value,
                        "blob": blob,
                    }
                    for i, (value, blob) in enumerate(encoded)
                ]
                yield EXECUTE_MANY, ctx.sql.insert_list_items, rows
            return length

        return await ctx.executor.write(program(), action="list append", conversation=conversation)

    async def load(self, conversation: str, name: str, start: int, limit: int | None) -> list[Any]:
        validate_id(conversation)
        validate_id(name, what="list name")
        start = _rules.argument(start, "start", allow_none=False) or 0
        limit = _rules.argument(limit, "limit")
        li = s.list_items
        stmt = (
            select(li.c.value, li.c.blob)
            .where(li.c.conversation_id == conversation, li.c.name == name, li.c.idx >= start)
            .order_by(li.c.idx)
        )
        if limit is not None:
            stmt = stmt.limit(limit)
        ctx = self._ctx

        async def work(conn: AsyncConnection) -> list[Any]:
            await _require(conn, ctx, conversation)
            if limit == 0:
                return []
            return [
                bytes(r.blob) if r.value is None else _codec.decode(r.value)
                for r in await conn.execute(stmt)
            ]

        return await ctx.executor.run(
            work, mode="snapshot", action="list load", conversation=conversation
        )

    async def length(self, conversation: str, name: str) -> int:
        validate_id(conversation)
        validate_id(name, what="list name")
        lists = s.lists
        ctx = self._ctx

        async def work(conn: AsyncConnection) -> int:
            await _require(conn, ctx, conversation)
            stmt = select(lists.c.length).where(
                lists.c.conversation_id == conversation, lists.c.name == name
            )
            return int((await conn.execute(stmt)).scalar() or 0)

        return await ctx.executor.run(
            work, mode="snapshot", action="list length", conversation=conversation
        )


async def _require(conn: AsyncConnection, ctx: Context, conversation: str) -> None:
    stmt = select(s.conversations.c.id).where(ctx.owned(conversation))
    if (await conn.execute(stmt)).first() is None:
        raise not_found(conversation)
