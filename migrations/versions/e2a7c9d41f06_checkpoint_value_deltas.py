"""Checkpoint channel values stored as extensions of an earlier version (``base``).

A LangGraph channel value that extends the same channel's value at another version of
the thread (a list of messages with items appended) is stored as the items it adds,
naming that version in the new nullable column ``histstore_checkpoint_blobs.base``. The
rows already stored are full values (``base`` is ``NULL``) and stay as they are.

Downgrading drops the column, which only a database without such values allows: an
older histstore would read the added items as the whole value. A database holding
any refuses the downgrade (``SchemaError``; offline, the script fails at that
statement) and is left unchanged; delete those threads (or the database) first to go back.

Revision ID: e2a7c9d41f06
Revises: d5f7a3c1e9b2
Create Date: 2026-12-03 14:20:00.000000

"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from histstore._storage.revisions import SchemaError, placed_schema

revision: str = "e2a7c9d41f06"
down_revision: str | None = "d5f7a3c1e9b2"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLE = "histstore_checkpoint_blobs"
REFUSED = (
    "histstore: cannot downgrade below e2a7c9d41f06: LangGraph checkpoint values are"
    " stored as extensions of earlier versions (histstore_checkpoint_blobs.base), which"
    " an older histstore would read wrongly; delete those threads first"
)


def upgrade() -> None:
    op.add_column(TABLE, sa.Column("base", sa.Text(), nullable=True), schema=placed_schema())


def downgrade() -> None:
    context = op.get_context()
    deltas = f"SELECT 1 FROM {TABLE} WHERE base IS NOT NULL"  # noqa: S608 - constant
    if context.as_sql:
        # No data to look at: the script itself fails when there are such values.
        message = REFUSED.replace("'", "''")
        if context.dialect.name == "postgresql":
            op.execute(
                f"DO $$ BEGIN IF EXISTS ({deltas}) THEN RAISE EXCEPTION '{message}'; END IF; END $$"
            )
        else:
            # SQLite has no RAISE outside triggers: json() of a non-JSON text fails, and
            # it is evaluated only when such a row exists.
            op.execute(f"SELECT json('{message}') WHERE EXISTS ({deltas})")
    else:
        blobs = sa.table(TABLE, sa.column("base"), schema=placed_schema())
        found = op.get_bind().execute(
            sa.select(sa.literal(1)).where(blobs.c.base.is_not(None)).limit(1)
        )
        if found.first() is not None:
            raise SchemaError(REFUSED)
    op.drop_column(TABLE, "base", schema=placed_schema())
