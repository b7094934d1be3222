"""Text search over stored messages, served by the database's full-text index."""

from __future__ import annotations

from . import _dialects, _rules
from ._context import Context
from ._ids import validate_id
from ._models import Message
from ._search import Hit, parse_query

__all__ = ["TextSearch"]


class TextSearch:
    """``Store.search`` (see there for the contract)."""

    def __init__(self, ctx: Context) -> None:
        self._ctx = ctx

    async def search(self, query: str, conversation: str | None, limit: int) -> list[Hit]:
        terms = parse_query(query)
        if conversation is not None:
            validate_id(conversation)
        n = _rules.argument(limit, "limit", allow_none=False)
        ctx = self._ctx
        # A term without a letter or digit holds no word the index keeps: it is left
        # out, as punctuation between words is.
        terms = [t for t in terms if any(ch.isalnum() for ch in t)]
        if n == 0 or not terms:
            ctx.executor.check()
            return []
        params = ctx.params(
            conversation or "",
            q=_dialects.search_terms(ctx.executor.driver.dialect, terms),
            limit=n,
        )
        stmt = ctx.sql.search[conversation is not None]
        rows = await ctx.executor.fetch(stmt, params, action="search", conversation=conversation)
        convert = ctx.sql.created_at
        return [
            Hit(r[0], int(r[1]), Message._stored(r[2], int(r[1]), r[3], convert), float(r[4]))
            for r in rows
        ]
