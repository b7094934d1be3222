"""Text search over stored messages, served by the database's full-text index."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .._core import rules as _rules
from .._core.framework_text import envelope
from .._core.ids import validate_id
from .._core.models import as_message, message_data, stored_message
from .._core.search_text import Hit, parse_query
from .._storage.drivers import EXECUTE, EXECUTE_MANY, FETCH, CompiledStatement, Program
from .._storage.rows import TextRule, message_columns
from .._storage.statements import search as _search
from ..envelopes import ROLES
from .context import Context

__all__ = ["TextSearch", "as_written"]


class TextSearch:
    """``Store.search`` (see there for the contract)."""

    def __init__(self, ctx: Context) -> None:
        self._ctx = ctx

    async def search(self, query: str, conversation: str | None, limit: int) -> list[Hit]:
        terms = parse_query(query)
        if conversation is not None:
            validate_id(conversation)
        n = _rules.argument(limit, "limit", allow_none=False)
        assert n is not None
        ctx = self._ctx
        # A term without a letter or digit holds no word the index keeps: it is left
        # out, as punctuation between words is.
        terms = [t for t in terms if any(ch.isalnum() for ch in t)]
        if n == 0 or not terms:
            ctx.executor.check()
            return []
        params = ctx.params(
            conversation or "",
            q=_search.search_terms(ctx.executor.driver.dialect, terms),
            limit=n,
        )
        by = conversation is not None
        stmt = ctx.sql.search[by]
        executor = ctx.executor
        # A store-wide search also reads the index of threads' messages (LangGraph's).
        thread_params: dict[str, Any] | None = None
        if not by:
            thread_params = {"q": params["q"], "limit": n}
            if ctx.owner is not None:
                thread_params["owner"] = ctx.owner
        rows: Sequence[Any] | None = None
        found: Sequence[Any] | None = None
        if executor.pending is not None:  # SQLite: the index is FTS5 and its pending list
            program = self._with_list(stmt, ctx.sql.search_unlisted[by], params, n, thread_params)
            both = await executor.snapshot(program, action="search", conversation=conversation)
            if both is None:
                await executor.index_list()
            else:
                rows, found = both
        if rows is None:
            rows = await executor.fetch(stmt, params, action="search", conversation=conversation)
        convert = ctx.sql.created_at
        hits = [
            Hit(r[0], int(r[1]), stored_message(r[2], int(r[1]), r[3], convert), float(r[4]))
            for r in rows
        ]
        if thread_params is None:
            return hits
        if found is None:
            found = await executor.fetch(ctx.sql.thread_search, thread_params, action="search")
        hits += [
            Hit(r[0], int(r[3]), as_message({"role": r[4], "content": r[5]}), float(r[6]), r[0])
            for r in found
        ]
        # Both indexes rank with the same function (bm25, ts_rank_cd) over the same
        # tokens: the best of the two lists, a conversation's message before a thread's
        # on a tie.
        hits.sort(key=lambda h: (-h.score, h.thread is not None, h.conversation, h.position))
        return hits[:n]

    def _with_list(
        self,
        stmt: CompiledStatement,
        unlisted: CompiledStatement,
        params: Any,
        n: int,
        thread_params: dict[str, Any] | None,
    ) -> Program[tuple[Sequence[Any], Sequence[Any] | None] | None]:
        """The search on SQLite, in one snapshot with the full-text index's pending list
        (``_storage.search_index``) and, with ``thread_params``, the search of threads'
        messages: the message rows and the thread rows (``None`` without
        ``thread_params``). When the list holds messages, a writable store gets ``None``
        (it indexes them, then searches); a read-only store, which cannot, searches them
        through an index of their own and gets the best ``n`` of both (a higher score
        first, then by conversation and position)."""
        executor = self._ctx.executor
        pending = executor.pending
        assert pending is not None
        threads = self._ctx.sql.thread_search
        found: Sequence[Any] | None = None
        if not executor.read_only:
            if (yield FETCH, pending.any, {}):
                return None
            rows: list[Any] | Sequence[Any] = yield FETCH, stmt, params
            if thread_params is not None:
                found = yield FETCH, threads, thread_params
            return rows, found
        listed = yield FETCH, pending.listed, {}
        rows = list((yield FETCH, stmt, params))
        if listed:
            yield EXECUTE, pending.temp_fts, {}
            yield EXECUTE_MANY, pending.temp_fill, [{"r": r, "t": t} for r, t in listed]
            rows += yield FETCH, unlisted, params
            rows.sort(key=lambda r: (-r[4], r[0], r[1]))
        if thread_params is not None:
            found = yield FETCH, threads, thread_params
        return rows[:n], found

    async def reindex(self, batch: int, progress: Callable[[int], None] | None = None) -> int:
        """Make every visible message's row what a write stores now (see ``as_written``),
        ``batch`` messages per transaction; returns how many it found to change.
        ``progress(messages read so far)`` after every batch. A row whose JSON changed
        between its read and its update (a concurrent edit) is left as the edit made it
        (and still counted: the next run finds nothing to change)."""
        _rules.positive(batch, "batch")
        ctx = self._ctx
        sql = ctx.sql
        changed = read = 0

        def page(after: tuple[str, int]) -> Program[tuple[int, int, tuple[str, int] | None]]:
            params = {"after_c": after[0], "after_p": after[1], "limit": batch, "owner": ctx.owner}
            rows = yield FETCH, sql.reindex_page, params
            updates = []
            for cid, position, role, data, stored in rows:
                new_data, new_role, text = as_written(data, sql.text)
                # A role column an older histstore filled for every role means what
                # NULL means now (``_core.rules.role_key``): not a change.
                if (new_data, new_role, text) != (data, _rules.role_key(role), stored):
                    updates.append(
                        {"c_": cid, "p_": position, "old_": data, "d_": new_data}
                        | {"r_": new_role, "t_": text}
                    )
            if updates:
                yield EXECUTE_MANY, sql.set_indexed, updates
            last = (rows[-1][0], int(rows[-1][1])) if len(rows) == batch else None
            return len(updates), len(rows), last

        after: tuple[str, int] | None = ("", -1)  # before every id (ids are not empty)
        while after is not None:
            n, seen, after = await ctx.executor.write(page(after), action="reindex")
            changed += n
            read += seen
            if progress is not None:
                progress(read)
        return changed


def as_written(data: str, rule: TextRule) -> tuple[str, str | None, str | None]:
    """A stored message's JSON, ``role`` column and search text as a write stores them
    now: an adapter envelope stored without its ``role`` (by an adapter older than
    revision f3b8d6a2c915, or before ``histstore migrate --sql`` output that could not
    compute it) gets it (``histstore.envelopes``), as the first key; any other JSON is
    kept as it is."""
    message = stored_message(data, None, None)
    found = envelope(message_data(message))
    if found is not None and "role" not in message_data(message):
        kind, inner = found
        role = ROLES[kind](inner)
        if role is not None:
            message = as_message({"role": role, **message_data(message)})
    role, written, text = message_columns(message, rule)
    return written, role, text
