"""Initial schema: conversations, messages, write records, summaries, metadata, lists.

Revision ID: 3066f0ac1a5e
Revises:
Create Date: 2026-11-29 18:17:31.697438

"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# Ids compare by code point: Postgres needs the "C" collation for that.
ID = sa.String(length=255).with_variant(sa.String(length=255, collation="C"), "postgresql")

revision: str = "3066f0ac1a5e"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "histstore_conversations",
        sa.Column("id", ID, nullable=False),
        sa.Column("owner", ID, nullable=True),
        sa.Column("system_prompt", sa.Text(), nullable=True),
        sa.Column("length", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_histstore_conversations")),
    )
    op.create_index(
        op.f("ix_histstore_conversations_created_at_id"),
        "histstore_conversations",
        ["created_at", "id"],
        unique=False,
    )
    op.create_index(
        op.f("ix_histstore_conversations_owner_created_at_id"),
        "histstore_conversations",
        ["owner", "created_at", "id"],
        unique=False,
    )
    op.create_index(
        op.f("ix_histstore_conversations_owner_id"),
        "histstore_conversations",
        ["owner", "id"],
        unique=False,
    )
    op.create_index(
        op.f("ix_histstore_conversations_owner_updated_at_id"),
        "histstore_conversations",
        ["owner", "updated_at", "id"],
        unique=False,
    )
    op.create_index(
        op.f("ix_histstore_conversations_updated_at_id"),
        "histstore_conversations",
        ["updated_at", "id"],
        unique=False,
    )
    op.create_table(
        "histstore_list_items",
        sa.Column("conversation_id", ID, nullable=False),
        sa.Column("name", ID, nullable=False),
        sa.Column("idx", sa.BigInteger(), nullable=False),
        sa.Column("value", sa.Text(), nullable=True),
        sa.Column("blob", sa.LargeBinary(), nullable=True),
        sa.PrimaryKeyConstraint(
            "conversation_id", "name", "idx", name=op.f("pk_histstore_list_items")
        ),
    )
    op.create_table(
        "histstore_lists",
        sa.Column("conversation_id", ID, nullable=False),
        sa.Column("name", ID, nullable=False),
        sa.Column("length", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("conversation_id", "name", name=op.f("pk_histstore_lists")),
    )
    op.create_table(
        "histstore_messages",
        sa.Column("conversation_id", ID, nullable=False),
        sa.Column("position", sa.BigInteger(), nullable=False),
        sa.Column("role", sa.Text(), nullable=True),
        sa.Column("data", sa.Text(), nullable=False),
        sa.Column("token_count", sa.Integer(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("conversation_id", "position", name=op.f("pk_histstore_messages")),
    )
    op.create_index(
        "ix_histstore_messages_system",
        "histstore_messages",
        ["conversation_id", "position"],
        unique=False,
        sqlite_where=sa.text("role = 'system'"),
        postgresql_where=sa.text("role = 'system'"),
    )
    op.create_table(
        "histstore_metadata",
        sa.Column("conversation_id", ID, nullable=False),
        sa.Column("key", ID, nullable=False),
        sa.Column("value", sa.Text(), nullable=False),
        sa.Column("digest", sa.String(length=64), nullable=False),
        sa.PrimaryKeyConstraint("conversation_id", "key", name=op.f("pk_histstore_metadata")),
    )
    op.create_index(
        op.f("ix_histstore_metadata_key_digest_conversation_id"),
        "histstore_metadata",
        ["key", "digest", "conversation_id"],
        unique=False,
    )
    op.create_table(
        "histstore_summaries",
        sa.Column("conversation_id", ID, nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("start", sa.BigInteger(), nullable=False),
        sa.Column("end", sa.BigInteger(), nullable=False),
        sa.Column("content", sa.Text(), nullable=False),
        sa.Column("token_count", sa.Integer(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("conversation_id", "seq", name=op.f("pk_histstore_summaries")),
    )
    op.create_table(
        "histstore_writes",
        sa.Column("conversation_id", ID, nullable=False),
        sa.Column("key", ID, nullable=False),
        sa.Column("position", sa.BigInteger(), nullable=False),
        sa.Column("count", sa.Integer(), nullable=False),
        sa.Column("digest", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("conversation_id", "key", name=op.f("pk_histstore_writes")),
    )


def downgrade() -> None:
    op.drop_table("histstore_writes")
    op.drop_table("histstore_summaries")
    op.drop_index(
        op.f("ix_histstore_metadata_key_digest_conversation_id"), table_name="histstore_metadata"
    )
    op.drop_table("histstore_metadata")
    op.drop_index(
        "ix_histstore_messages_system",
        table_name="histstore_messages",
        sqlite_where=sa.text("role = 'system'"),
        postgresql_where=sa.text("role = 'system'"),
    )
    op.drop_table("histstore_messages")
    op.drop_table("histstore_lists")
    op.drop_table("histstore_list_items")
    op.drop_index(
        op.f("ix_histstore_conversations_updated_at_id"), table_name="histstore_conversations"
    )
    op.drop_index(
        op.f("ix_histstore_conversations_owner_updated_at_id"), table_name="histstore_conversations"
    )
    op.drop_index(op.f("ix_histstore_conversations_owner_id"), table_name="histstore_conversations")
    op.drop_index(
        op.f("ix_histstore_conversations_owner_created_at_id"), table_name="histstore_conversations"
    )
    op.drop_index(
        op.f("ix_histstore_conversations_created_at_id"), table_name="histstore_conversations"
    )
    op.drop_table("histstore_conversations")
