"""Long-term memory items (LangGraph's ``BaseStore``, ``histstore.items``): the items
by (namespace, key), with their TTL, and their embeddings.

New tables only; an older histstore never reads them. A downgrade drops them and what
they hold.

Revision ID: a7c3e9f1b5d8
Revises: c8e1f4a2d7b6
Create Date: 2026-12-07 03:40:00.000000

"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "a7c3e9f1b5d8"
down_revision: str | None = "a41c5e0d7b93"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Keys and namespaces compare by code point: Postgres needs the "C" collation for that.
KEY = sa.Text().with_variant(sa.Text(collation="C"), "postgresql")
UTC = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "histstore_items",
        sa.Column("namespace", KEY, nullable=False),
        sa.Column("key", KEY, nullable=False),
        sa.Column("value", sa.Text(), nullable=False),
        sa.Column("created_at", UTC, nullable=False),
        sa.Column("updated_at", UTC, nullable=False),
        sa.Column("ttl", sa.Float(precision=53), nullable=True),
        sa.Column("expires_at", UTC, nullable=True),
        sa.PrimaryKeyConstraint("namespace", "key", name=op.f("pk_histstore_items")),
        if_not_exists=True,
    )
    op.create_index(
        "ix_histstore_items_expires_at",
        "histstore_items",
        ["expires_at"],
        sqlite_where=sa.text("expires_at IS NOT NULL"),
        postgresql_where=sa.text("expires_at IS NOT NULL"),
        if_not_exists=True,
    )
    op.create_table(
        "histstore_item_vectors",
        sa.Column("namespace", KEY, nullable=False),
        sa.Column("key", KEY, nullable=False),
        sa.Column("field", sa.Text(), nullable=False),
        sa.Column("vector", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint(
            "namespace", "key", "field", name=op.f("pk_histstore_item_vectors")
        ),
        if_not_exists=True,
    )


def downgrade() -> None:
    op.drop_table("histstore_item_vectors", if_exists=True)
    op.drop_index("ix_histstore_items_expires_at", "histstore_items", if_exists=True)
    op.drop_table("histstore_items", if_exists=True)
