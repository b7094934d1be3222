"""The oldest page of the change log is read from the oldest records: each change
record says the lowest position it touched (``histstore_changes.touched_from``), with
an index by (conversation, touched_from, revision).

A record's ``touched_from`` is its change's ``start`` where the record has one, else
the length it met less the entries it removed (a change placed at the end); a record
that touched no entry holds the length it met. When no record after revision ``L``
has one below the length at ``L``, the entries then are the first ones now, so
``store.changes(c, limit=L)`` reads only the records up to ``L`` and those entries.

Backfill: the rows already stored get their values here, each conversation's records
replayed from revision 1 (the lengths come from the write records' ``appended`` and the
change records' own counts); a conversation whose log has gaps, or a record this code
does not read, keeps 0, which claims nothing (its oldest pages are then read from the
whole log, as before). Offline (``--sql``) every row keeps 0. Rows an older histstore
writes get 0 too (the column's default). A downgrade drops the index and the column.

Revision ID: c8e1f4a2d7b6
Revises: f1c3a5e7b9d2
Create Date: 2026-12-07 01:45:00.000000

"""

from __future__ import annotations

import json
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from histstore._storage.revisions import placed_schema

revision: str = "c8e1f4a2d7b6"
down_revision: str | None = "f1c3a5e7b9d2"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLE = "histstore_changes"
COLUMN = "touched_from"
INDEX = "ix_histstore_changes_touched"
ID = sa.String(length=255).with_variant(sa.String(length=255, collation="C"), "postgresql")
BATCH = 500

_changes = sa.Table(
    TABLE,
    sa.MetaData(),
    sa.Column("conversation_id", ID),
    sa.Column("revision", sa.BigInteger()),
    sa.Column("record", sa.Text()),
    sa.Column(COLUMN, sa.BigInteger()),
)
_writes = sa.Table(
    "histstore_writes",
    sa.MetaData(),
    sa.Column("conversation_id", ID),
    sa.Column("revision", sa.BigInteger()),
    sa.Column("appended", sa.Integer()),
)


def upgrade() -> None:
    # Each step may run again: on SQLite, DDL that no DML precedes is committed as it
    # runs, so a failing upgrade or downgrade may leave some of them done.
    schema = placed_schema()
    if op.get_context().as_sql or not _has_column():
        op.add_column(
            TABLE,
            sa.Column(COLUMN, sa.BigInteger(), nullable=False, server_default=sa.text("0")),
            schema=schema,
        )
    if not op.get_context().as_sql:
        _backfill()
    op.create_index(
        INDEX, TABLE, ["conversation_id", COLUMN, "revision"], schema=schema, if_not_exists=True
    )


def _has_column() -> bool:
    """Whether the changes table has the column (online only)."""
    found = sa.inspect(op.get_bind()).get_columns(TABLE, schema=placed_schema())
    return any(c["name"] == COLUMN for c in found)


def _backfill() -> None:
    """Every conversation with change records, ``BATCH`` at a time in id order."""
    bind = op.get_bind()
    ids = sa.select(_changes.c.conversation_id).distinct().order_by(_changes.c.conversation_id)
    fill = (
        sa.update(_changes)
        .where(
            _changes.c.conversation_id == sa.bindparam("c"),
            _changes.c.revision == sa.bindparam("r"),
        )
        .values({COLUMN: sa.bindparam("t")})
    )
    after: str | None = None
    while True:
        stmt = ids if after is None else ids.where(_changes.c.conversation_id > after)
        batch = list(bind.execute(stmt.limit(BATCH)).scalars())
        if not batch:
            return
        for cid in batch:
            values = _touched(bind, cid)
            if values:
                bind.execute(fill, [{"c": cid, "r": r, "t": t} for r, t in values.items()])
        after = batch[-1]


def _touched(bind: sa.Connection, cid: str) -> dict[int, int]:
    """The ``touched_from`` of each of ``cid``'s change records (none when its log
    cannot be replayed)."""
    counts: dict[int, tuple[int | None, int, int] | None] = {}
    for r, appended in bind.execute(
        sa.select(_writes.c.revision, _writes.c.appended).where(
            _writes.c.conversation_id == cid, _writes.c.revision.is_not(None)
        )
    ):
        counts[int(r)] = (None, 0, int(appended or 0))
    changed: set[int] = set()
    for r, text in bind.execute(
        sa.select(_changes.c.revision, _changes.c.record).where(_changes.c.conversation_id == cid)
    ):
        counts[int(r)] = _counts(text)
        changed.add(int(r))
    if sorted(counts) != list(range(1, len(counts) + 1)):
        return {}
    out: dict[int, int] = {}
    length = 0
    for r in range(1, len(counts) + 1):
        got = counts[r]
        if got is None:
            return out  # this and the later records keep 0
        start, removed, added = got
        if r in changed:
            out[r] = length - removed if start is None else start
        length += added - removed
    return out


def _counts(text: str) -> tuple[int | None, int, int] | None:
    """A stored record's ``start``, count of removed entries and count of added ones
    (``None``: not a record this code reads)."""
    try:
        record = json.loads(text)
    except ValueError:
        return None
    if not isinstance(record, dict):
        return None
    start, removed, added = record.get("start"), record.get("removed", []), record.get("added", 0)
    if start is not None and (type(start) is not int or start < 0):
        return None
    if not isinstance(removed, list) or type(added) is not int or added < 0:
        return None
    return start, len(removed), added


def downgrade() -> None:
    schema = placed_schema()
    op.drop_index(INDEX, table_name=TABLE, schema=schema, if_exists=True)
    if op.get_context().as_sql or _has_column():
        op.drop_column(TABLE, COLUMN, schema=schema)
