"""Turn leases: one holder per conversation id for a turn, until release or expiry.

Revision ID: 5c1e0a7d2b41
Revises: 9feaf481e2b1
Create Date: 2026-12-01 13:00:00.000000

"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# Ids compare by code point: Postgres needs the "C" collation for that.
ID = sa.String(length=255).with_variant(sa.String(length=255, collation="C"), "postgresql")

revision: str = "5c1e0a7d2b41"
down_revision: str | None = "9feaf481e2b1"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "histstore_leases",
        sa.Column("id", ID, nullable=False),
        sa.Column("holder", sa.String(length=64), nullable=False),
        sa.Column("expires_at", sa.Float(precision=53), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_histstore_leases")),
    )


def downgrade() -> None:
    op.drop_table("histstore_leases")
