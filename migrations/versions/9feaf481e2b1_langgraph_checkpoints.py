"""LangGraph checkpoints: threads, checkpoints, channel values, pending writes.

Revision ID: 9feaf481e2b1
Revises: 3066f0ac1a5e
Create Date: 2026-12-01 12:30:00.000000

"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# Ids compare by code point: Postgres needs the "C" collation for that.
ID = sa.String(length=255).with_variant(sa.String(length=255, collation="C"), "postgresql")

revision: str = "9feaf481e2b1"
down_revision: str | None = "3066f0ac1a5e"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "histstore_checkpoint_blobs",
        sa.Column("thread_id", ID, nullable=False),
        sa.Column("checkpoint_ns", sa.Text(), nullable=False),
        sa.Column("channel", sa.Text(), nullable=False),
        sa.Column("version", sa.Text(), nullable=False),
        sa.Column("type", sa.Text(), nullable=False),
        sa.Column("blob", sa.LargeBinary(), nullable=True),
        sa.PrimaryKeyConstraint(
            "thread_id",
            "checkpoint_ns",
            "channel",
            "version",
            name=op.f("pk_histstore_checkpoint_blobs"),
        ),
    )
    op.create_table(
        "histstore_checkpoint_channels",
        sa.Column("thread_id", ID, nullable=False),
        sa.Column("checkpoint_ns", sa.Text(), nullable=False),
        sa.Column("checkpoint_id", ID, nullable=False),
        sa.Column("channel", sa.Text(), nullable=False),
        sa.Column("version", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint(
            "thread_id",
            "checkpoint_ns",
            "checkpoint_id",
            "channel",
            name=op.f("pk_histstore_checkpoint_channels"),
        ),
    )
    op.create_table(
        "histstore_checkpoint_threads",
        sa.Column("thread_id", ID, nullable=False),
        sa.Column("owner", ID, nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("thread_id", name=op.f("pk_histstore_checkpoint_threads")),
    )
    op.create_table(
        "histstore_checkpoint_writes",
        sa.Column("thread_id", ID, nullable=False),
        sa.Column("checkpoint_ns", sa.Text(), nullable=False),
        sa.Column("checkpoint_id", ID, nullable=False),
        sa.Column("task_id", sa.Text(), nullable=False),
        sa.Column("idx", sa.Integer(), nullable=False),
        sa.Column("task_path", sa.Text(), nullable=False),
        sa.Column("channel", sa.Text(), nullable=False),
        sa.Column("type", sa.Text(), nullable=False),
        sa.Column("blob", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint(
            "thread_id",
            "checkpoint_ns",
            "checkpoint_id",
            "task_id",
            "idx",
            name=op.f("pk_histstore_checkpoint_writes"),
        ),
    )
    op.create_table(
        "histstore_checkpoints",
        sa.Column("thread_id", ID, nullable=False),
        sa.Column("checkpoint_ns", sa.Text(), nullable=False),
        sa.Column("checkpoint_id", ID, nullable=False),
        sa.Column("parent_checkpoint_id", ID, nullable=True),
        sa.Column("run_id", sa.Text(), nullable=True),
        sa.Column("type", sa.Text(), nullable=False),
        sa.Column("checkpoint", sa.LargeBinary(), nullable=False),
        sa.Column("metadata", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint(
            "thread_id", "checkpoint_ns", "checkpoint_id", name=op.f("pk_histstore_checkpoints")
        ),
    )
    op.create_index(
        op.f("ix_histstore_checkpoints_run_id"),
        "histstore_checkpoints",
        ["run_id"],
        unique=False,
    )


def downgrade() -> None:
    op.drop_index(op.f("ix_histstore_checkpoints_run_id"), table_name="histstore_checkpoints")
    op.drop_table("histstore_checkpoints")
    op.drop_table("histstore_checkpoint_writes")
    op.drop_table("histstore_checkpoint_threads")
    op.drop_table("histstore_checkpoint_channels")
    op.drop_table("histstore_checkpoint_blobs")
