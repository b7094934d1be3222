"""Editable history: entry ids and authors, change records, asides and turn records.

New columns: on ``histstore_conversations`` the revision (the number of change
records), the next entry and aside ids and the halt (NULL); on ``histstore_messages``
each entry's ``entry_id`` and ``author`` (NULL), with a partial index on the authored
ones; on ``histstore_writes`` the ``revision`` and ``appended`` count that make a stored
batch a change record. New tables: ``histstore_changes``, ``histstore_asides``,
``histstore_turns``.

``histstore_messages`` is altered in place, never copied: on SQLite a copy would drop
the full-text and vector triggers made by b7d4e2a91c30. SQLite cannot add a NOT NULL
column without a default, so there ``entry_id`` keeps a ``DEFAULT 0`` the metadata
does not describe (histstore always gives the id); on Postgres it is added nullable,
filled, then made NOT NULL.

The data already stored becomes revision-numbered history: every message's entry id
is its position + 1 and ``next_entry`` the length + 1. A conversation whose write
records, in the order they were made (``created_at``, position, key), append one after
the other from position 0 to its length gets them as its change records, revisions 1
to k (``appended`` = their counts; a record of an empty batch stored nothing and stays
NULL). Any other conversation with messages (its history holds pops, saves, forks,
imports or overlapping writes, so it cannot be traced) gets one ``save`` change of
all its messages, at its ``updated_at``, as revision 1; its write records stay for
idempotency only. An empty conversation is at revision 0. This runs in batches of
conversations.

Offline (``--sql``) no Python runs: every conversation with messages gets the single
``save`` change as revision 1, whatever its write records say (they keep a NULL
revision).

Downgrading drops the new tables, index and columns: the messages keep their positions
and content; authors, asides, turn records and the change log are lost. Every column
goes by ``ALTER TABLE ... DROP COLUMN``, SQLite's too (3.35 and later), so no table is
copied there either.

Revision ID: c4e8a1f2d9b7
Revises: 0313065f7133
Create Date: 2026-12-01 20:00:00.000000

"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

from histstore._storage.revisions import placed_schema

# Ids compare by code point: Postgres needs the "C" collation for that.
ID = sa.String(length=255).with_variant(sa.String(length=255, collation="C"), "postgresql")

revision: str = "c4e8a1f2d9b7"
down_revision: str | None = "0313065f7133"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BATCH = 500  # conversations at a time

AUTHORED = "ix_histstore_messages_authored"
AUTHORED_WHERE = "author IS NOT NULL"
# SQLite's trigger re-indexing a message's text on every UPDATE of the table (made by
# b7d4e2a91c30); filling entry_id leaves the text as it is.
FTS_UPDATE_TRIGGER = "histstore_messages_fts_update"

# Tables (not lightweight ``table()``s), so a schema placement translates them.
_meta = sa.MetaData()
_conversations = sa.Table(
    "histstore_conversations",
    _meta,
    sa.Column("id", ID, primary_key=True),
    sa.Column("length", sa.BigInteger),
    sa.Column("updated_at", sa.DateTime(timezone=True)),
    sa.Column("revision", sa.BigInteger),
    sa.Column("next_entry", sa.BigInteger),
)
_messages = sa.Table(
    "histstore_messages",
    _meta,
    sa.Column("conversation_id", ID, primary_key=True),
    sa.Column("position", sa.BigInteger, primary_key=True),
    sa.Column("entry_id", sa.BigInteger),
)
_writes = sa.Table(
    "histstore_writes",
    _meta,
    sa.Column("conversation_id", ID, primary_key=True),
    sa.Column("key", ID, primary_key=True),
    sa.Column("position", sa.BigInteger),
    sa.Column("count", sa.Integer),
    sa.Column("created_at", sa.DateTime(timezone=True)),
    sa.Column("revision", sa.BigInteger),
    sa.Column("appended", sa.Integer),
)
_changes = sa.Table(
    "histstore_changes",
    _meta,
    sa.Column("conversation_id", ID, primary_key=True),
    sa.Column("revision", sa.BigInteger, primary_key=True),
    sa.Column("kind", sa.Text),
    sa.Column("author", sa.Text),
    sa.Column("at", sa.DateTime(timezone=True)),
    sa.Column("record", sa.Text),
)


def upgrade() -> None:
    schema = placed_schema()
    sqlite = op.get_context().dialect.name == "sqlite"
    for column in (
        sa.Column("revision", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.Column("next_entry", sa.BigInteger(), server_default=sa.text("1"), nullable=False),
        sa.Column("next_aside", sa.BigInteger(), server_default=sa.text("1"), nullable=False),
        sa.Column("halted", sa.Text(), nullable=True),
    ):
        op.add_column("histstore_conversations", column, schema=schema)
    if sqlite:
        entry_id = sa.Column(
            "entry_id", sa.BigInteger(), server_default=sa.text("0"), nullable=False
        )
    else:
        entry_id = sa.Column("entry_id", sa.BigInteger(), nullable=True)
    op.add_column("histstore_messages", entry_id, schema=schema)
    op.add_column(
        "histstore_messages", sa.Column("author", sa.Text(), nullable=True), schema=schema
    )
    op.add_column("histstore_writes", sa.Column("revision", sa.BigInteger()), schema=schema)
    op.add_column("histstore_writes", sa.Column("appended", sa.Integer()), schema=schema)
    _create_tables()

    _fill_entry_ids(sqlite, schema)
    op.execute(
        sa.update(_conversations)
        .where(_conversations.c.length > 0)
        .values(next_entry=_conversations.c.length + 1)
    )
    op.create_index(
        AUTHORED,
        "histstore_messages",
        ["conversation_id", "position"],
        unique=False,
        schema=schema,
        sqlite_where=sa.text(AUTHORED_WHERE),
        postgresql_where=sa.text(AUTHORED_WHERE),
    )
    if op.get_context().as_sql:
        _record_saves(_conversations.c.length > 0)
    else:
        _backfill_changes()


def _create_tables() -> None:
    op.create_table(
        "histstore_changes",
        sa.Column("conversation_id", ID, nullable=False),
        sa.Column("revision", sa.BigInteger(), nullable=False),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("author", sa.Text(), nullable=True),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("record", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("conversation_id", "revision", name=op.f("pk_histstore_changes")),
    )
    op.create_table(
        "histstore_asides",
        sa.Column("conversation_id", ID, nullable=False),
        sa.Column("aside_id", sa.BigInteger(), nullable=False),
        sa.Column("after", sa.BigInteger(), nullable=True),
        sa.Column("home", sa.BigInteger(), nullable=True),
        sa.Column("value", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("conversation_id", "aside_id", name=op.f("pk_histstore_asides")),
    )
    op.create_table(
        "histstore_turns",
        sa.Column("conversation_id", ID, nullable=False),
        sa.Column("number", sa.BigInteger(), nullable=False),
        sa.Column("start", sa.BigInteger(), nullable=False),
        sa.Column("opened_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("end", sa.Text(), nullable=True),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("usage", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("conversation_id", "number", name=op.f("pk_histstore_turns")),
    )


def _fill_entry_ids(sqlite: bool, schema: str | None) -> None:
    """Every message's entry id is its position + 1.

    Postgres: the nullable column is filled by rewriting the table once (a change of
    type to its own type ``USING`` the expression), its indexes rebuilt in bulk, then
    made NOT NULL. An UPDATE of every row costs some four times as much: each new row
    version recomputes ``search_vector`` and enters every index, the GIN one included.

    SQLite: one UPDATE; online, the full-text index's UPDATE trigger is set aside
    meanwhile and made again from its own stored definition, as it would delete and
    re-insert the unchanged text of every message (which doubles the cost)."""
    if not sqlite:
        op.alter_column(
            "histstore_messages",
            "entry_id",
            type_=sa.BigInteger(),
            existing_type=sa.BigInteger(),
            postgresql_using="position + 1",
            schema=schema,
        )
        op.alter_column(
            "histstore_messages",
            "entry_id",
            existing_type=sa.BigInteger(),
            nullable=False,
            schema=schema,
        )
        return
    trigger = None
    if not op.get_context().as_sql:
        trigger = (
            op.get_bind()
            .execute(
                sa.text("SELECT sql FROM sqlite_master WHERE type = 'trigger' AND name = :name"),
                {"name": FTS_UPDATE_TRIGGER},
            )
            .scalar()
        )
    if trigger is not None:
        op.execute(f"DROP TRIGGER {FTS_UPDATE_TRIGGER}")
    op.execute(sa.update(_messages).values(entry_id=_messages.c.position + 1))
    if trigger is not None:
        op.execute(trigger)


def _save_record() -> sa.ColumnElement[Any]:
    """A ``save`` change's record of all of a conversation's messages, built by SQL:
    ``{"start":0,"added":<length>}`` (compact, as histstore writes JSON)."""
    added = sa.cast(_conversations.c.length, sa.Text())
    return sa.literal('{"start":0,"added":', sa.Text()) + added + sa.literal("}", sa.Text())


def _record_saves(where: sa.ColumnElement[bool]) -> None:
    """Give each conversation matching ``where`` one ``save`` change, revision 1."""
    c = _conversations
    rows = sa.select(
        c.c.id,
        sa.literal(1, sa.BigInteger()),
        sa.literal("save", sa.Text()),
        sa.null(),
        c.c.updated_at,
        _save_record(),
    ).where(where)
    columns = ["conversation_id", "revision", "kind", "author", "at", "record"]
    op.execute(sa.insert(_changes).from_select(columns, rows))
    op.execute(sa.update(c).where(where).values(revision=1))


def _tiles(length: int, records: list[tuple[int, int]]) -> int | None:
    """How many write records stored something, when the records (``(position, count)``
    in the order made) append one after the other from position 0 to ``length``; else
    ``None``. A record of an empty batch stored nothing and does not count."""
    end = tiles = 0
    for position, count in records:
        if count == 0:
            continue
        if position != end:
            return None
        tiles += 1
        end += count
    return tiles if tiles and end == length else None


def _number_writes(ids: list[str]) -> None:
    """Make the write records of the conversations ``ids`` that stored something their
    change records: revisions 1, 2, ... in the order made, ``appended`` their counts."""
    w = _writes
    made = w.alias("made")
    order = (made.c.created_at, made.c.position, made.c.key)
    ranked = (
        sa.select(
            made.c.conversation_id,
            made.c.key,
            sa.func.row_number()
            .over(partition_by=made.c.conversation_id, order_by=order)
            .label("revision"),
        )
        .where(made.c.conversation_id.in_(ids), made.c.count > 0)
        .subquery("ranked")
    )
    op.execute(
        sa.update(w)
        .where(w.c.conversation_id == ranked.c.conversation_id, w.c.key == ranked.c.key)
        .values(revision=ranked.c.revision, appended=w.c.count)
    )


def _backfill_changes() -> None:
    """Change records for the stored conversations, ``BATCH`` conversations at a time
    in id order (see the module docstring). Python only reads the write records'
    positions and counts; the statements that change rows are one per batch, but the
    conversations' revisions."""
    bind = op.get_bind()
    c, w = _conversations, _writes
    page = sa.select(c.c.id, c.c.length).order_by(c.c.id).limit(BATCH)
    set_revision = (
        sa.update(c).where(c.c.id == sa.bindparam("c")).values(revision=sa.bindparam("r"))
    )
    after: str | None = None
    while True:
        stmt = page if after is None else page.where(c.c.id > after)
        conversations = bind.execute(stmt).all()
        if not conversations:
            return
        first, last = conversations[0][0], conversations[-1][0]
        records: dict[str, list[tuple[int, int]]] = {}
        rows = bind.execute(
            sa.select(w.c.conversation_id, w.c.position, w.c.count)
            .where(w.c.conversation_id >= first, w.c.conversation_id <= last)
            .order_by(w.c.conversation_id, w.c.created_at, w.c.position, w.c.key)
        )
        for cid, position, count in rows:
            records.setdefault(cid, []).append((position, count))
        revisions: list[dict[str, Any]] = []
        saved: list[str] = []
        for cid, length in conversations:
            if not length:
                continue
            tiles = _tiles(length, records.get(cid, []))
            if tiles is None:
                saved.append(cid)
            else:
                revisions.append({"c": cid, "r": tiles})
        if revisions:
            _number_writes([r["c"] for r in revisions])
            bind.execute(set_revision, revisions)
        if saved:
            _record_saves(c.c.id.in_(saved))
        after = last


def downgrade() -> None:
    schema = placed_schema()
    new_tables = ("histstore_turns", "histstore_asides", "histstore_changes")
    if op.get_context().dialect.name == "sqlite" and not op.get_context().as_sql:
        # On a connection that began no transaction itself (histstore's own begin with
        # BEGIN IMMEDIATE; a plain engine's do not) pysqlite opens one only at the first
        # statement that changes rows, and DDL before it is committed as it runs.
        # Emptying the tables first (SQLite truncates them) puts this whole downgrade
        # in the transaction, so that a refusal further down (0313065f7133 refuses long
        # metadata keys) undoes it.
        for name in new_tables:
            op.execute(sa.delete(sa.table(name)))
    for name in new_tables:
        op.drop_table(name, schema=schema)
    op.drop_index(
        AUTHORED,
        table_name="histstore_messages",
        schema=schema,
        sqlite_where=sa.text(AUTHORED_WHERE),
        postgresql_where=sa.text(AUTHORED_WHERE),
    )
    # Each an ALTER TABLE ... DROP COLUMN, SQLite's too (3.35 and later): no table copy,
    # so the messages keep their rowids, which the full-text index refers to.
    drops = {
        "histstore_messages": ("author", "entry_id"),
        "histstore_writes": ("appended", "revision"),
        "histstore_conversations": ("halted", "next_aside", "next_entry", "revision"),
    }
    for table, columns in drops.items():
        for name in columns:
            op.drop_column(table, name, schema=schema)
