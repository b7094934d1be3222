"""The semantic index remembers how far it got: ``histstore_vector_marks``.

One row per conversation and embedding model: every message at ``position`` or before
had its vector (or no text) when ``SemanticIndex.update`` last looked, so the next update
reads only the messages after it. Deleting messages lowers the mark below the first one
deleted and changes ``lowered``, which an update compares before it raises the mark: on
SQLite a row trigger, on PostgreSQL a statement trigger (dynamic SQL, planned for each
statement's own rows, as in f7c2a9d3e8b4). A splice that moves messages lowers it in its
own statements (``_storage.statements.editing``).

No backfill: a conversation without a row is read from its start once, as before.
Downgrade drops the trigger and the table.

Revision ID: d2b7e4a9c1f3
Revises: d3a7f1c6b8e2
Create Date: 2026-12-07 00:30:00.000000

"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from histstore._storage.revisions import schema_prefix

# Ids compare by code point: Postgres needs the "C" collation for that.
ID = sa.String(length=255).with_variant(sa.String(length=255, collation="C"), "postgresql")

revision: str = "d2b7e4a9c1f3"
down_revision: str | None = "d3a7f1c6b8e2"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLE = "histstore_vector_marks"
_TRIGGER = "histstore_vector_marks_lowered"
_FUNCTION = "histstore_vector_marks_lower"

_SQLITE_UP = (
    f"CREATE TRIGGER {_TRIGGER} AFTER DELETE ON histstore_messages BEGIN"  # noqa: S608 - names, no input
    f" UPDATE {TABLE} SET position = min(position, old.position - 1), lowered = lowered + 1"
    " WHERE conversation_id = old.conversation_id; END"
)


def _pg_up(q: str) -> list[str]:
    quoted = q.replace("'", "''")
    return [
        f"CREATE FUNCTION {q}{_FUNCTION}() RETURNS trigger LANGUAGE plpgsql"  # noqa: S608 - names, no input
        " SET search_path FROM CURRENT AS $$ BEGIN"
        f" EXECUTE 'UPDATE {quoted}{TABLE} AS k"
        " SET position = LEAST(k.position, r.low - 1), lowered = k.lowered + 1"
        " FROM (SELECT conversation_id, min(position) AS low FROM removed"
        " GROUP BY conversation_id) AS r WHERE k.conversation_id = r.conversation_id';"
        " RETURN NULL; END $$",
        f"CREATE TRIGGER {_TRIGGER} AFTER DELETE ON {q}histstore_messages"
        f" REFERENCING OLD TABLE AS removed FOR EACH STATEMENT EXECUTE FUNCTION {q}{_FUNCTION}()",
    ]


def upgrade() -> None:
    op.create_table(
        TABLE,
        sa.Column("conversation_id", ID, nullable=False),
        sa.Column("model", ID, nullable=False),
        sa.Column("position", sa.BigInteger(), nullable=False),
        sa.Column("lowered", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("conversation_id", "model", name=op.f(f"pk_{TABLE}")),
    )
    if op.get_context().dialect.name == "postgresql":
        for sql in _pg_up(schema_prefix()):
            op.execute(sql)
    else:
        op.execute(_SQLITE_UP)


def downgrade() -> None:
    if op.get_context().dialect.name == "postgresql":
        q = schema_prefix()
        op.execute(f"DROP TRIGGER {_TRIGGER} ON {q}histstore_messages")
        op.execute(f"DROP FUNCTION {q}{_FUNCTION}()")
        op.drop_table(TABLE)
    else:
        # SQLite's DDL here is not undone with a later revision's failure: each step can
        # run again.
        op.execute(f"DROP TRIGGER IF EXISTS {_TRIGGER}")
        op.execute(f"DROP TABLE IF EXISTS {TABLE}")
