"""The storage side of ``histstore.admin``: the queries behind stats, describe and listing.

Every query runs through the store's executor (``Store.internals``, the store's one way
to reach the database) and sees what the store sees: through a scoped view only its
user's conversations.
Migrations and database locations are in ``admin._database``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Literal

from sqlalchemy import Select, distinct, func, select
from sqlalchemy.ext.asyncio import AsyncConnection

from .._core import codec as _codec
from .._core.ids import validate_id
from .._errors import NotFound
from .._ops.listing import Page, most_selective_first, read_page, select_filtered, select_ids
from .._storage import migrations as _migrations
from .._storage import schema as s
from .._store import Store, store_call

__all__ = [
    "ConversationInfo",
    "StoreStats",
    "count_conversations",
    "describe",
    "list_conversations",
    "scoped",
    "stats",
    "visible_ids",
]

Order = Literal["id", "created", "updated"]

_conv = s.conversations
_CHUNK = 500  # ids per IN (...) list


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.astimezone(timezone.utc).isoformat()


# ---------------------------------------------------------------------------- values


@dataclass(frozen=True)
class StoreStats:
    """What a store (or a scoped view: its user's part) holds, read in one snapshot.

    Counts cover the conversations the store sees (``threads`` and ``checkpoints``: its
    LangGraph threads and their checkpoints); times are aware UTC ``datetime`` values,
    ``None`` when there is no conversation.
    """

    conversations: int
    """Conversations."""
    messages: int
    """Messages, in all conversations."""
    longest: int
    """The length of the longest conversation."""
    users: int
    """Distinct owners of conversations."""
    summaries: int
    """Summaries."""
    metadata_entries: int
    """Metadata keys set, over all conversations."""
    lists: int
    """Named lists."""
    list_items: int
    """Items in those lists."""
    write_records: int
    """Recorded batches (each under its idempotency key, which confirms a retried batch)."""
    first_created: datetime | None
    """When the oldest conversation was created."""
    oldest_change: datetime | None
    """The oldest of the conversations' last changes."""
    newest_change: datetime | None
    """The newest of the conversations' last changes."""
    schema_revision: str | None
    """The database's schema revision; ``None``: no histstore schema."""
    user: str | None = None
    """The scoped view's user; ``None`` for a whole store."""
    threads: int = 0
    checkpoints: int = 0

    def as_dict(self) -> dict[str, Any]:
        """The figures as a JSON-ready dict (times as ISO 8601 strings)."""
        return {
            "conversations": self.conversations,
            "messages": self.messages,
            "longest": self.longest,
            "users": self.users,
            "summaries": self.summaries,
            "metadata_entries": self.metadata_entries,
            "lists": self.lists,
            "list_items": self.list_items,
            "write_records": self.write_records,
            "first_created": _iso(self.first_created),
            "oldest_change": _iso(self.oldest_change),
            "newest_change": _iso(self.newest_change),
            "schema_revision": self.schema_revision,
            "user": self.user,
            "threads": self.threads,
            "checkpoints": self.checkpoints,
        }


@dataclass(frozen=True)
class ConversationInfo:
    """One conversation's particulars, without its messages.

    ``lists`` holds ``(name, length)`` pairs by name; ``metadata_keys`` is sorted.
    """

    id: str
    """The conversation's id."""
    user: str | None
    """Its owner; ``None``: no owner."""
    system_prompt: str | None
    """Its system prompt, if one was set."""
    length: int
    """How many messages it holds."""
    created_at: datetime
    """When it was created (aware, UTC)."""
    updated_at: datetime
    """When it last changed (aware, UTC)."""
    lists: tuple[tuple[str, int], ...] = ()
    summaries: int = 0
    """How many summaries it holds."""
    metadata_keys: tuple[str, ...] = ()

    @property
    def has_system_prompt(self) -> bool:
        """Whether the conversation has a system prompt."""
        return self.system_prompt is not None

    def as_dict(self) -> dict[str, Any]:
        """The particulars as a JSON-ready dict (times as ISO 8601 strings)."""
        return {
            "id": self.id,
            "user": self.user,
            "system_prompt": self.system_prompt,
            "length": self.length,
            "created_at": _iso(self.created_at),
            "updated_at": _iso(self.updated_at),
            "lists": dict(self.lists),
            "summaries": self.summaries,
            "metadata_keys": list(self.metadata_keys),
        }


# ---------------------------------------------------------------------------- scope


def scoped(store: Store, stmt: Select[Any]) -> Select[Any]:
    """``stmt`` over conversations, kept to those the store sees."""
    scope = store.internals.scope()
    return stmt if scope is None else stmt.where(scope)


def visible_ids(store: Store) -> Select[Any]:
    """The ids of the conversations the store sees."""
    return scoped(store, select(_conv.c.id))


# ---------------------------------------------------------------------------- stats


@store_call
async def stats(store: Store) -> StoreStats:
    """Count what the store holds, in one snapshot. A scoped view counts its user's part."""
    owner = store.user

    async def work(conn: AsyncConnection) -> StoreStats:
        conv = select(
            func.count(),
            func.coalesce(func.sum(_conv.c.length), 0),
            func.coalesce(func.max(_conv.c.length), 0),
            func.count(distinct(_conv.c.owner)),
            func.min(_conv.c.created_at),
            func.min(_conv.c.updated_at),
            func.max(_conv.c.updated_at),
        )
        scope = store.internals.scope()
        if scope is not None:
            conv = conv.where(scope)
        row = (await conn.execute(conv)).one()
        counts: list[int] = []
        for table in (s.summaries, s.metadata_entries, s.lists, s.list_items, s.writes):
            stmt = select(func.count()).select_from(table)
            if owner is not None:
                stmt = stmt.where(table.c.conversation_id.in_(visible_ids(store)))
            counts.append(int((await conn.execute(stmt)).scalar_one()))
        for table in (s.checkpoint_threads, s.checkpoints):
            stmt = select(func.count()).select_from(table)
            if owner is not None:
                mine = select(s.checkpoint_threads.c.thread_id).where(
                    s.checkpoint_threads.c.owner == owner
                )
                stmt = stmt.where(table.c.thread_id.in_(mine))
            counts.append(int((await conn.execute(stmt)).scalar_one()))
        status = await conn.run_sync(_migrations.schema_status, store.schema)
        return StoreStats(
            conversations=int(row[0]),
            messages=int(row[1]),
            longest=int(row[2]),
            users=int(row[3]),
            summaries=counts[0],
            metadata_entries=counts[1],
            lists=counts[2],
            list_items=counts[3],
            write_records=counts[4],
            first_created=row[4],
            oldest_change=row[5],
            newest_change=row[6],
            schema_revision=status.current,
            user=owner,
            threads=counts[5],
            checkpoints=counts[6],
        )

    return await store.internals.executor.run(work, mode="snapshot", action="stats")


# ---------------------------------------------------------------------------- describe


async def _details(store: Store, conn: AsyncConnection, ids: Sequence[str]) -> list[Any]:
    """``ConversationInfo`` for the visible ones of ``ids``, in the order given."""
    rows: dict[str, Any] = {}
    lists: dict[str, list[tuple[str, int]]] = {}
    summaries: dict[str, int] = {}
    keys: dict[str, list[str]] = {}
    ls, sm, md = s.lists.c, s.summaries.c, s.metadata_entries.c
    for i in range(0, len(ids), _CHUNK):
        chunk = list(ids[i : i + _CHUNK])
        stmt = select(
            _conv.c.id,
            _conv.c.owner,
            _conv.c.system_prompt,
            _conv.c.length,
            _conv.c.created_at,
            _conv.c.updated_at,
        ).where(_conv.c.id.in_(chunk))
        scope = store.internals.scope()
        if scope is not None:
            stmt = stmt.where(scope)
        rows.update({r.id: r for r in await conn.execute(stmt)})
        found = [c for c in chunk if c in rows]
        if not found:
            continue
        named = select(ls.conversation_id, ls.name, ls.length).where(ls.conversation_id.in_(found))
        for cid, name, length in await conn.execute(named.order_by(ls.conversation_id, ls.name)):
            lists.setdefault(cid, []).append((name, int(length)))
        counted = (
            select(sm.conversation_id, func.count())
            .where(sm.conversation_id.in_(found))
            .group_by(sm.conversation_id)
        )
        summaries.update({cid: int(n) for cid, n in await conn.execute(counted)})
        keyed = select(md.conversation_id, md.key).where(md.conversation_id.in_(found))
        for cid, key in await conn.execute(keyed.order_by(md.conversation_id, md.key)):
            keys.setdefault(cid, []).append(_codec.key_from_stored(key))
    return [
        ConversationInfo(
            id=r.id,
            user=r.owner,
            system_prompt=r.system_prompt,
            length=int(r.length),
            created_at=r.created_at,
            updated_at=r.updated_at,
            lists=tuple(lists.get(r.id, ())),
            summaries=summaries.get(r.id, 0),
            # Sorted as keys, not as their stored (escaped) forms.
            metadata_keys=tuple(sorted(keys.get(r.id, ()))),
        )
        for cid in ids
        if (r := rows.get(cid)) is not None
    ]


@store_call
async def describe(store: Store, conversation: str) -> ConversationInfo:
    """One conversation's particulars (owner, system prompt, length, times, lists,
    summary count, metadata keys), read in one snapshot.

    Raises:
        InvalidId: a bad id.
        NotFound: the conversation does not exist or the view may not see it.
    """
    validate_id(conversation)

    async def work(conn: AsyncConnection) -> list[Any]:
        return await _details(store, conn, [conversation])

    found = await store.internals.executor.run(
        work, mode="snapshot", action="describe", conversation=conversation
    )
    if not found:
        raise NotFound(f"conversation {conversation!r} not found")
    info: ConversationInfo = found[0]
    return info


# ---------------------------------------------------------------------------- listing


@store_call
async def list_conversations(
    store: Store,
    *,
    user: str | None = None,
    metadata: Mapping[str, Any] | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    limit: int | None = None,
    offset: int = 0,
    order: Order = "id",
    descending: bool = False,
) -> list[ConversationInfo]:
    """A page of conversations with their particulars, read in one snapshot.

    Filters, order and paging are those of ``Store.conversations``; ``since`` and
    ``until`` (aware ``datetime`` values) keep the conversations last changed at or
    after ``since`` and before ``until``. The ids come from the same indexes
    ``Store.conversations`` uses (``updated_at``, ``owner``), so a page costs
    O(limit + offset) when the filters match most conversations.

    Raises:
        InvalidId: a bad ``user``.
        InvalidMessage: a metadata value that is not storable JSON.
        TypeError, ValueError: arguments of the wrong kind or range.
    """

    page = Page(user, since, until, limit, offset, order, descending)
    if select_ids(store.internals, metadata=metadata, **page.options()) is None:
        return []

    async def work(conn: AsyncConnection) -> list[ConversationInfo]:
        ids = await read_page(store.internals, conn, metadata, page)
        return await _details(store, conn, ids)

    return await store.internals.executor.run(work, mode="snapshot", action="list conversations")


@store_call
async def count_conversations(
    store: Store,
    *,
    user: str | None = None,
    metadata: Mapping[str, Any] | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
) -> int:
    """How many conversations ``list_conversations`` with these filters would list in all.

    Counting costs O(matching conversations), read from the same indexes.
    """

    def counting(metadata: Mapping[str, Any] | None) -> Select[Any] | None:
        found = select_filtered(
            store.internals, [func.count()], user=user, metadata=metadata, since=since, until=until
        )
        return None if found is None else found[0]

    if counting(metadata) is None:
        return 0

    async def work(conn: AsyncConnection) -> int:
        found = counting(await most_selective_first(conn, metadata) if metadata else None)
        return 0 if found is None else int((await conn.execute(found)).scalar_one())

    return await store.internals.executor.run(work, mode="read", action="count conversations")
