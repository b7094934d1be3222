"""Finding conversations: filtered, ordered pages of ids, and purging idle ones."""

from __future__ import annotations

import json
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from sqlalchemy import (
    ColumnElement,
    Integer,
    ScalarSelect,
    Select,
    and_,
    exists,
    func,
    literal_column,
    select,
)
from sqlalchemy.ext.asyncio import AsyncConnection

from .._core import codec as _codec
from .._core import rules as _rules
from .._storage import schema as s
from .._storage.drivers import EXECUTE, FETCH, Program, Step
from .._storage.rows import now
from .._storage.statements import dialects as _dialects
from .context import Context
from .history import delete_conversation

__all__ = [
    "Listing",
    "Order",
    "Page",
    "delete_batch",
    "idle_cutoff",
    "metadata_filter",
    "most_selective_first",
    "read_page",
    "select_filtered",
    "select_ids",
]

Order = Literal["id", "created", "updated"]
_conv = s.conversations
PURGE_BATCH = 500
# The caps of the rounds that count each metadata equality's entries (``most_selective_first``).
PROBE_CAPS = (64, 4096, None)
# A page ordered by time whose filter's every equality matches at least ``WALK_FROM``
# conversations is first looked for among the newest (oldest) ``WALK_WINDOW`` x
# (limit + offset) conversations of that order (``read_page``).
WALK_FROM = 64
WALK_WINDOW = 16


def idle_cutoff(idle_for: timedelta) -> datetime:
    """The time before which a conversation last changed counts as idle for ``idle_for``.

    Raises:
        TypeError: ``idle_for`` is not a ``timedelta``.
        ValueError: it is negative.
    """
    if not isinstance(idle_for, timedelta):
        raise TypeError("idle_for must be a timedelta")
    if idle_for < timedelta(0):
        raise ValueError("idle_for must not be negative")
    return now() - idle_for


class Listing:
    """The listing calls of a store (see ``Store`` for their contracts)."""

    def __init__(self, ctx: Context) -> None:
        self._ctx = ctx

    async def conversations(
        self,
        *,
        user: str | None,
        metadata: Mapping[str, Any] | None,
        limit: int | None,
        offset: int,
        order: Order,
        descending: bool,
    ) -> list[str]:
        page = Page(user, None, None, limit, offset, order, descending)
        if select_ids(self._ctx, metadata=metadata, **page.options()) is None:
            # a view asked for another user's conversations
            self._ctx.executor.check()
            return []

        async def work(conn: AsyncConnection) -> list[str]:
            return await read_page(self._ctx, conn, metadata, page)

        return await self._ctx.executor.run(work, mode="read", action="list conversations")

    async def purge(
        self, idle_for: timedelta, progress: Callable[[int], None] | None = None
    ) -> int:
        """``Store.purge``; ``progress(deleted so far)`` after every batch."""
        ctx = self._ctx
        cutoff = idle_cutoff(idle_for)
        convert = ctx.sql.created_at  # the result processor of a time column

        # Locking the rows first means a conversation changed meanwhile is skipped
        # whole (its lock makes the change wait, or the change makes it recent). Each
        # batch is its own transaction and starts after the last one picked (keyset on
        # updated_at, id): the cost is O(batch) whatever was deleted before (beside
        # FTS5's merging on SQLite, see ``Store.purge``).
        def program(after: tuple[Any, str] | None) -> Program[tuple[int, tuple[Any, str] | None]]:
            params = {"owner": ctx.owner, "cutoff": cutoff, "batch": PURGE_BATCH}
            if after is None:
                rows = yield FETCH, ctx.sql.pick_idle, params
            else:
                at, cid = after
                more = {**params, "after_at": at, "after_id": cid}
                rows = yield FETCH, ctx.sql.pick_idle_after, more
            yield from delete_batch(ctx, [cid for cid, _updated in rows])
            if not rows:
                return 0, None
            last = rows[-1][1] if convert is None else convert(rows[-1][1])
            return len(rows), (last, rows[-1][0])

        total = 0
        after: tuple[Any, str] | None = None
        while True:
            done, after = await ctx.executor.write(program(after), action="purge")
            total += done
            if progress is not None:
                progress(total)
            if done < PURGE_BATCH:
                return total


def delete_batch(ctx: Context, conversations: list[str]) -> Generator[Step, Any, None]:
    """Program steps: ``delete_conversation`` for each of ``conversations``, except that
    where the dialect has ``delete_listed_messages`` (SQLite) their messages go in one
    statement, in rowid order (``statements.dialects.delete_listed_in_rowid_order``),
    after the rows that deleting a message would otherwise delete or update one by one
    (the tables before messages in ``schema.CONVERSATION_TABLES``)."""
    bulk = ctx.sql.delete_listed_messages
    if bulk is None or not conversations:
        for cid in conversations:
            yield from delete_conversation(ctx, cid)
        return
    at = s.CONVERSATION_TABLES.index(s.messages)
    children = ctx.sql.delete_children
    for cid in conversations:
        for stmt in children[:at]:
            yield EXECUTE, stmt, {"c": cid}
    yield EXECUTE, bulk, {"listed": json.dumps(conversations)}
    for cid in conversations:
        for stmt in children[at + 1 :]:
            yield EXECUTE, stmt, {"c": cid}
        yield EXECUTE, ctx.sql.delete_conversation, {"c": cid}


@dataclass(frozen=True)
class Page:
    """What a listing asks for besides its metadata filter (``select_ids``'s options)."""

    user: str | None
    since: datetime | None
    until: datetime | None
    limit: int | None
    offset: int
    order: Order
    descending: bool

    def options(self) -> dict[str, Any]:
        return asdict(self)


async def read_page(
    ctx: Context, conn: AsyncConnection, metadata: Mapping[str, Any] | None, page: Page
) -> list[str]:
    """The ids ``select_ids`` lists, by the cheaper of two plans.

    A filter on metadata is matched from the metadata index and its matches sorted:
    O(matches). A page ordered by time with a limit is first looked for among the
    newest (oldest) ``WALK_WINDOW`` x (limit + offset) conversations of that order, read
    from its index and filtered one by one, when every equality of the filter is held
    by at least ``WALK_FROM`` conversations (counted up to that in the same statement):
    O(limit + offset), whatever the store's size. That window is a prefix of the order,
    so a full page found in it is the answer; otherwise the first plan runs.
    """
    limit = page.limit
    if metadata and limit is not None and page.order != "id":
        walk = _select_window(ctx, metadata, page, WALK_WINDOW * (limit + page.offset))
        if walk is not None:
            ids = list((await conn.execute(walk)).scalars())
            if len(ids) == limit:
                return ids
    found = select_ids(
        ctx,
        metadata=await most_selective_first(conn, metadata) if metadata else None,
        **page.options(),
    )
    return [] if found is None else list((await conn.execute(found)).scalars())


def _select_window(
    ctx: Context, metadata: Mapping[str, Any], page: Page, window: int
) -> Select[Any] | None:
    """``page`` among the first ``window`` conversations of its order, the filter
    checked on each of them; empty, without reading them, unless every equality of the
    filter matches at least ``WALK_FROM`` conversations. ``None`` when there is no
    equality or a view's user rules ``page.user`` out.

    The sizes are written into the statement, so that a plan made for it (a prepared
    statement's generic plan on PostgreSQL) knows the window is small.
    """
    counts = [_capped_count(*terms, WALK_FROM) for terms in _equalities(metadata)]
    key = _conv.c.created_at if page.order == "created" else _conv.c.updated_at
    found = select_filtered(
        ctx, [_conv.c.id, key], user=page.user, since=page.since, until=page.until
    )
    if found is None or not counts:
        return None
    common = and_(*[n >= _literal(WALK_FROM) for n in counts])
    inner = _ordered(found[0], [key, _conv.c.id], page.descending)
    first = _dialects.limit_when(ctx.executor.driver.dialect, inner, common, window).subquery()
    conds, _ = metadata_filter(metadata, first.c.id, join=False)
    stmt = select(first.c.id).where(*conds)
    stmt = _ordered(stmt, [first.c[key.name], first.c.id], page.descending)
    stmt = stmt.limit(_literal(page.limit or 0))
    return stmt.offset(_literal(page.offset)) if page.offset else stmt


def _literal(n: int) -> ColumnElement[int]:
    return literal_column(str(int(n)), Integer)


def _ordered(stmt: Select[Any], keys: Sequence[Any], descending: bool) -> Select[Any]:
    return stmt.order_by(*(k.desc() if descending else k.asc() for k in keys))


def select_filtered(
    ctx: Context,
    columns: Sequence[Any],
    *,
    user: str | None = None,
    metadata: Mapping[str, Any] | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
) -> tuple[Select[Any], ColumnElement[str]] | None:
    """``columns`` over the conversations ``ctx`` sees that pass the filters, and the id
    column to order by; ``None`` when a view's user rules ``user`` out.

    ``since``/``until`` (aware) keep those last changed at or after / before them. The
    first metadata equality is a join, so the planner can start from the metadata index
    (key, digest, conversation_id) when it is selective; ordered by that index's id, a
    page by id needs no sort at all (SQLite never turns a correlated EXISTS into a join).
    Put the most selective equality first (``most_selective_first``): the others are
    checked per row it finds.
    """
    since, until = _aware(since, "since"), _aware(until, "until")
    if metadata is not None and not isinstance(metadata, Mapping):
        raise TypeError("metadata must be a mapping of keys to values")
    conds, driver = metadata_filter(metadata) if metadata else ([], None)
    if not ctx.sees(user):
        return None
    stmt = select(*columns)
    id_key: ColumnElement[str] = _conv.c.id
    if driver is not None:
        md0, on = driver
        stmt = stmt.select_from(_conv.join(md0, on))
        id_key = md0.c.conversation_id
    else:
        stmt = stmt.select_from(_conv)
    scope = ctx.scope(user)
    if scope is not None:
        stmt = stmt.where(scope)
    if since is not None:
        stmt = stmt.where(_conv.c.updated_at >= since)
    if until is not None:
        stmt = stmt.where(_conv.c.updated_at < until)
    return stmt.where(*conds), id_key


def select_ids(
    ctx: Context,
    *,
    user: str | None = None,
    metadata: Mapping[str, Any] | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    limit: int | None = None,
    offset: int = 0,
    order: Order = "id",
    descending: bool = False,
) -> Select[Any] | None:
    """The page of ids ``Store.conversations`` returns (see ``select_filtered``):
    ordered by ``order`` with ties broken by id, every order served by an index."""
    limit = _rules.argument(limit, "limit")
    offset = _rules.argument(offset, "offset", allow_none=False) or 0
    if order not in ("id", "created", "updated"):
        raise ValueError("order must be 'id', 'created' or 'updated'")
    found = select_filtered(
        ctx, [_conv.c.id], user=user, metadata=metadata, since=since, until=until
    )
    if found is None:
        return None
    stmt, id_key = found
    keys = {
        "id": [id_key],
        "created": [_conv.c.created_at, id_key],
        "updated": [_conv.c.updated_at, id_key],
    }[order]
    stmt = _ordered(stmt, keys, descending)
    if limit is not None:
        stmt = stmt.limit(limit)
    if offset:
        stmt = stmt.offset(offset)
    return stmt


def _aware(value: object, name: str) -> datetime | None:
    if value is None:
        return None
    if not isinstance(value, datetime):
        raise TypeError(f"{name} must be a datetime or None")
    if value.tzinfo is None:
        raise ValueError(f"{name} must be an aware datetime (with a time zone)")
    return value


async def most_selective_first(
    conn: AsyncConnection, metadata: Mapping[str, Any]
) -> Mapping[str, Any]:
    """``metadata`` with its equality matched by the fewest conversations first (the
    others after it, in their order), so that a filter starts from its most selective
    key whatever order the caller gave; a mapping with fewer than two equalities as it is.

    The entries of every equality are counted in one statement, up to a cap that grows
    by rounds (``PROBE_CAPS``) until one count falls below it: the counting reads about
    (number of keys) x (the smallest count) index entries, never a whole common key's.
    """
    equalities = [k for k, v in metadata.items() if v is not None]
    if len(equalities) < 2:
        return metadata
    terms = _equalities(metadata)
    counts: list[int] = []
    for cap in PROBE_CAPS:
        probes = [_capped_count(*t, cap) for t in terms]
        counts = [int(n) for n in (await conn.execute(select(*probes))).one()]
        if cap is None or min(counts) < cap:
            break
    key = equalities[min(range(len(counts)), key=counts.__getitem__)]
    return {key: metadata[key], **{k: v for k, v in metadata.items() if k != key}}


def _equalities(
    metadata: Mapping[str, Any],
) -> list[tuple[ColumnElement[bool], ColumnElement[bool]]]:
    """The metadata index's key and value conditions of each equality of ``metadata``."""
    md = s.metadata_entries
    return [
        (
            md.c.key_digest == _rules.metadata_key_digest(k),
            md.c.digest == _codec.canonical_digest(v),
        )
        for k, v in metadata.items()
        if v is not None
    ]


def _capped_count(
    same_key: ColumnElement[bool], same_value: ColumnElement[bool], cap: int | None
) -> ScalarSelect[Any]:
    """How many metadata entries hold the key and value, counted up to ``cap`` (written
    into the statement: a generic plan would count them all)."""
    md = s.metadata_entries
    found: Select[Any] = select(literal_column("1")).select_from(md).where(same_key, same_value)
    if cap is not None:
        found = found.limit(_literal(cap))
    return select(func.count()).select_from(found.subquery()).scalar_subquery()


def metadata_filter(
    metadata: Mapping[str, Any],
    conversation: ColumnElement[str] | None = None,
    *,
    join: bool = True,
) -> tuple[list[ColumnElement[bool]], tuple[Any, ColumnElement[bool]] | None]:
    """Conditions for a metadata filter on the ids ``conversation`` (the conversations
    table's by default), and the first equality as a join.

    With ``join`` false every equality is checked on each row, as its own lookup: its
    subquery has an ``OFFSET 0``, which keeps PostgreSQL from making it a join (a
    generic plan, which does not know the value is common, would read all its matches).

    Returns ``(conditions, (alias, on_clause) | None)``.
    """
    md = s.metadata_entries
    cid = _conv.c.id if conversation is None else conversation
    conds: list[ColumnElement[bool]] = []
    driver: tuple[Any, ColumnElement[bool]] | None = None
    for k, v in metadata.items():
        key = _rules.metadata_key_digest(k)
        if v is None:
            conds.append(~exists().where(md.c.conversation_id == cid, md.c.key_digest == key))
            continue
        _codec.encode(v, what="metadata value")
        digest = _codec.canonical_digest(v)
        if driver is None and join:
            md0 = md.alias("m0")
            on = and_(md0.c.conversation_id == cid, md0.c.key_digest == key, md0.c.digest == digest)
            driver = (md0, on)
            continue
        held: Select[Any] = select(literal_column("1")).select_from(md)
        held = held.where(
            md.c.key_digest == key, md.c.digest == digest, md.c.conversation_id == cid
        )
        conds.append(exists(held if join else held.offset(_literal(0))))
    return conds, driver
