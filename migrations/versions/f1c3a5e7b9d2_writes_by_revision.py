"""The change log is read by revision: an index of write records by (conversation,
revision), so that reading the records after a revision (``store.changes(since=)``, a
revert to a recent revision, ``histstore log --since``) reads only those, not every
idempotency row of the conversation.

The index covers the rows already stored (its creation is the backfill); a downgrade
drops it.

Revision ID: f1c3a5e7b9d2
Revises: d2b7e4a9c1f3
Create Date: 2026-12-07 01:00:00.000000

"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "f1c3a5e7b9d2"
down_revision: str | None = "d2b7e4a9c1f3"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

INDEX = "ix_histstore_writes_revision"


def upgrade() -> None:
    written = sa.text("revision IS NOT NULL")
    op.create_index(
        INDEX,
        "histstore_writes",
        ["conversation_id", "revision"],
        sqlite_where=written,
        postgresql_where=written,
    )


def downgrade() -> None:
    op.drop_index(INDEX, table_name="histstore_writes", if_exists=True)
