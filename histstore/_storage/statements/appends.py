"""The common append as one Postgres statement, alone or for a group of writers.

Data-modifying CTEs grow the conversation's length (locking its row), record the batch
under its key and insert the messages from arrays, in one statement that is its own
transaction. ``append_group_statement`` does the same for the batches of several
conversations at once (``_storage.append_groups`` sends concurrent writers' appends
together); ``group_params`` builds its parameters from the members' own.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Integer,
    bindparam,
    cast,
    null,
    select,
    true,
)
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import Dialect
from sqlalchemy.sql import Select

from .. import schema as s
from .dialects import text_arrays

__all__ = [
    "append_group_statement",
    "append_in_one_statement",
    "group_params",
]

# The columns the appends insert, in the tables' order (their selects give them so):
# every column of a message but its author (a new entry has none), and of a write record.
_MESSAGE_COLUMNS = [c.name for c in s.messages.columns if c.name != "author"]
_RECORD_COLUMNS = [c.name for c in s.writes.columns]


def _grown(created: Any, scoped: bool, *returning: Any) -> Any:
    """The CTE ``grown``: ``created`` (an INSERT of conversation rows, each holding its
    batch's count as ``length``) or, for a conversation that exists, its length and
    next entry id grown by that count, its revision by one and its halt cleared,
    locking its row; a view's batch for another owner's conversation changes nothing
    and returns no row. Returns ``returning`` of each row."""
    conv, excluded = s.conversations, created.excluded
    return (
        created.on_conflict_do_update(
            index_elements=[conv.c.id],
            set_={
                "length": conv.c.length + excluded.length,
                "revision": conv.c.revision + s.ONE,
                **s.LISTED_CHANGE,
                "next_entry": conv.c.next_entry + excluded.length,
                "halted": null(),
                "updated_at": excluded.updated_at,
            },
            where=(conv.c.owner == excluded.owner) if scoped else None,
        )
        .returning(*returning)
        .cte("grown")
    )


def append_in_one_statement(dialect: Dialect, scoped: bool) -> Select[Any] | None:
    """The common append as one statement, where the database can (Postgres).

    Data-modifying CTEs grow the conversation's length (locking its row), record the
    batch under its key and insert the messages from arrays, in one statement that is
    its own transaction: one round trip instead of five (BEGIN, three statements,
    COMMIT). Parameters as the store's other statements, plus ``key``, ``digest`` and
    the arrays ``roles``, ``datas``, ``texts`` and ``tokens`` (token counts as text).
    Returns the new length, or no row when
    a view may not see the conversation (then nothing was written). ``None`` where the
    dialect has no such statement (SQLite runs the append's program in one trip to its
    thread instead).
    """
    if dialect.name != "postgresql":
        return None
    conv, msg, writes = s.conversations, s.messages, s.writes
    c = bindparam("c", type_=conv.c.id.type)
    owner = bindparam("owner", type_=conv.c.owner.type)
    n = bindparam("n", type_=BigInteger)
    now = bindparam("now", type_=conv.c.updated_at.type)
    created = postgresql.insert(conv).values(
        id=c,
        owner=owner,
        length=n,
        revision=s.ONE,
        next_entry=n + s.ONE,
        listed_changes=s.ONE,
        created_at=now,
        updated_at=now,
    )
    grown = _grown(created, scoped, conv.c.length, conv.c.revision, conv.c.next_entry)
    # The batch's idempotency row is its change record (at the new revision).
    record = select(
        c,
        bindparam("key", type_=writes.c.key.type),
        grown.c.length - n,
        n,
        bindparam("digest", type_=writes.c.digest.type),
        now,
        grown.c.revision,
        n,
    )
    recorded = (
        writes.insert()
        .from_select(_RECORD_COLUMNS, record)
        .returning(writes.c.position)
        .cte("recorded")
    )
    rows = (
        text_arrays("roles", "datas", "tokens", "texts")
        .table_valued("role", "data", "token_count", "search_text", with_ordinality="ord")
        .render_derived()
    )
    placed = select(
        c,
        recorded.c.position + rows.c.ord - s.ONE,
        rows.c.role,
        rows.c.data,
        cast(rows.c.token_count, Integer),
        now,
        rows.c.search_text,
        grown.c.next_entry - n + rows.c.ord - s.ONE,
    ).select_from(recorded.join(rows, true()).join(grown, true()))
    inserted = msg.insert().from_select(_MESSAGE_COLUMNS, placed)
    return select(grown.c.length).add_cte(recorded).add_cte(inserted.cte("inserted"))


def append_group_statement(dialect: Dialect, scoped: bool) -> Select[Any] | None:
    """The appends of several writers, to distinct conversations, as one statement
    (Postgres; ``None`` elsewhere): one round trip and one commit for them all.

    Parameters (``group_params``): per batch the arrays ``cs``, ``owners``, ``ns`` (as
    text), ``keys``, ``digests``; per message ``mcs`` (its batch's conversation),
    ``slots`` (its index in its batch, as text), ``roles``, ``datas``, ``tokens``,
    ``texts``; and ``now``. Each batch has exactly the effect of
    ``append_in_one_statement``. Returns ``(conversation, new length)`` for each batch
    written; a batch a view may not see (another owner's conversation) writes nothing
    and has no row. The conversations are locked in the order of ``cs``: sorted, so
    that two groups never wait for each other's rows in a cycle.
    """
    if dialect.name != "postgresql":
        return None
    conv, msg, writes = s.conversations, s.messages, s.writes
    now = bindparam("now", type_=conv.c.updated_at.type)
    b = select(
        text_arrays("cs", "owners", "ns", "keys", "digests")
        .table_valued("c", "owner", "n", "key", "digest")
        .render_derived()
    ).cte("batches")
    n = cast(b.c.n, BigInteger)
    created = postgresql.insert(conv).from_select(
        [
            "id",
            "owner",
            "length",
            "revision",
            "next_entry",
            "listed_changes",
            "created_at",
            "updated_at",
        ],
        select(b.c.c, b.c.owner, n, s.ONE, n + s.ONE, s.ONE, now, now),
    )
    grown = _grown(created, scoped, conv.c.id, conv.c.length, conv.c.revision, conv.c.next_entry)
    record = select(
        b.c.c, b.c.key, grown.c.length - n, n, b.c.digest, now, grown.c.revision, n
    ).select_from(b.join(grown, grown.c.id == b.c.c))
    recorded = (
        writes.insert()
        .from_select(_RECORD_COLUMNS, record)
        .returning(writes.c.conversation_id, writes.c.position, writes.c.count)
        .cte("recorded")
    )
    rows = (
        text_arrays("mcs", "slots", "roles", "datas", "tokens", "texts")
        .table_valued("c", "slot", "role", "data", "token_count", "search_text")
        .render_derived()
    )
    slot = cast(rows.c.slot, BigInteger)
    placed = select(
        rows.c.c,
        recorded.c.position + slot,
        rows.c.role,
        rows.c.data,
        cast(rows.c.token_count, Integer),
        now,
        rows.c.search_text,
        grown.c.next_entry - recorded.c.count + slot,
    ).select_from(
        rows.join(recorded, recorded.c.conversation_id == rows.c.c).join(
            grown, grown.c.id == rows.c.c
        )
    )
    inserted = msg.insert().from_select(_MESSAGE_COLUMNS, placed)
    return select(grown.c.id, grown.c.length).add_cte(recorded).add_cte(inserted.cte("inserted"))


def group_params(members: Sequence[Mapping[str, Any]], now: datetime) -> dict[str, Any]:
    """The parameters of ``append_group_statement`` for ``members``: each the
    parameters ``append_in_one_statement`` takes for one batch, for distinct
    conversations, in the order their rows are to be locked. ``now`` stamps them all."""
    params: dict[str, Any] = {
        name: [] for name in ("cs", "owners", "ns", "keys", "digests", "mcs", "slots")
    }
    for name in ("roles", "datas", "tokens", "texts"):
        params[name] = []
    for m in members:
        c, count = m["c"], m["n"]
        params["cs"].append(c)
        params["owners"].append(m["owner"])
        params["ns"].append(str(count))
        params["keys"].append(m["key"])
        params["digests"].append(m["digest"])
        params["mcs"].extend([c] * count)
        params["slots"].extend(map(str, range(count)))
        for name in ("roles", "datas", "tokens", "texts"):
            params[name].extend(m[name])
    params["now"] = now
    return params
