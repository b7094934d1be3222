"""LangGraph threads' messages are searchable: ``histstore_checkpoint_text`` holds the
role and text of each message item of a thread's list channels, by thread, namespace,
channel and index, written by ``HiststoreSaver`` with the values that add the items;
its full-text index is SQLite's FTS5 table ``histstore_checkpoint_text_fts`` (external
content, kept by triggers in every statement's transaction; the same tokenizer as the
messages' index) or Postgres's GIN index on ``to_tsvector('simple', text)``.

Upgrade: the threads stored before are not indexed (their values are the serializer's
bytes, which a revision cannot decode); a thread becomes searchable as its next
checkpoints store messages (a value stored whole indexes all of its items).

Downgrade: drops the table and its index; the threads stay as they are.

Revision ID: 6b2d9e4f1a37
Revises: a41c5e0d7b93
Create Date: 2026-12-07 04:30:00.000000

"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "6b2d9e4f1a37"
down_revision: str | None = "a7c3e9f1b5d8"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

ID = sa.String(length=255).with_variant(sa.String(length=255, collation="C"), "postgresql")
TABLE = "histstore_checkpoint_text"
FTS = "histstore_checkpoint_text_fts"
GIN = "ix_histstore_checkpoint_text_vector"

_SQLITE_UP = [
    "CREATE VIRTUAL TABLE histstore_checkpoint_text_fts USING fts5(text,"
    " content='histstore_checkpoint_text', content_rowid='rowid',"
    " tokenize='unicode61 remove_diacritics 0', columnsize=0)",
    "CREATE TRIGGER histstore_checkpoint_text_fts_insert AFTER INSERT"
    " ON histstore_checkpoint_text BEGIN"
    " INSERT INTO histstore_checkpoint_text_fts(rowid, text) VALUES (new.rowid, new.text); END",
    "CREATE TRIGGER histstore_checkpoint_text_fts_delete AFTER DELETE"
    " ON histstore_checkpoint_text BEGIN"
    " INSERT INTO histstore_checkpoint_text_fts(histstore_checkpoint_text_fts, rowid, text)"
    " VALUES ('delete', old.rowid, old.text); END",
    "CREATE TRIGGER histstore_checkpoint_text_fts_update AFTER UPDATE"
    " ON histstore_checkpoint_text BEGIN"
    " INSERT INTO histstore_checkpoint_text_fts(histstore_checkpoint_text_fts, rowid, text)"
    " VALUES ('delete', old.rowid, old.text);"
    " INSERT INTO histstore_checkpoint_text_fts(rowid, text) VALUES (new.rowid, new.text); END",
]
_SQLITE_DOWN = [
    f"DROP TRIGGER IF EXISTS {FTS}_insert",
    f"DROP TRIGGER IF EXISTS {FTS}_delete",
    f"DROP TRIGGER IF EXISTS {FTS}_update",
    f"DROP TABLE IF EXISTS {FTS}",
]


def upgrade() -> None:
    op.create_table(
        TABLE,
        sa.Column("thread_id", ID, nullable=False),
        sa.Column("checkpoint_ns", sa.Text(), nullable=False),
        sa.Column("channel", sa.Text(), nullable=False),
        sa.Column("idx", sa.BigInteger(), nullable=False),
        sa.Column("role", sa.Text(), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("thread_id", "checkpoint_ns", "channel", "idx"),
    )
    if op.get_context().dialect.name == "postgresql":
        op.create_index(
            GIN,
            TABLE,
            [sa.text("to_tsvector('simple'::regconfig, text)")],
            postgresql_using="gin",
        )
    else:
        for statement in _SQLITE_UP:
            op.execute(statement)


def downgrade() -> None:
    if op.get_context().dialect.name == "postgresql":
        op.drop_index(GIN, table_name=TABLE)
    else:
        for statement in _SQLITE_DOWN:
            op.execute(statement)
    op.drop_table(TABLE)
