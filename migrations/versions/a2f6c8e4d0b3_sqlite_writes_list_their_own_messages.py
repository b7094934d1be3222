"""SQLite: writes list their own messages for the search index; the guard against
older writers moves from the messages table to the conversation row.

With a row trigger on a table, SQLite writes the rows of a multi-row ``INSERT ...
VALUES`` into a temporary table before inserting them. The messages table had two INSERT
triggers: ``histstore_messages_fts_insert`` (b1e6f0c4a7d3), which listed each new row
for the full-text index, and ``histstore_guard_entry_id`` (d5f7a3c1e9b2), which refused
a row without an entry id (an older process's). Together they cost about 140 µs of a
100-message append's 780 (``bench/sqlite_inserts.py``). Both go:

* every program of histstore that inserts messages lists the rows it added, in its
  transaction, with a statement after its INSERTs
  (``_storage.statements.search.ListedInserts``);
* ``histstore_conversations.listed_changes`` counts the changes of a conversation made
  by a histstore that lists its messages itself: every statement of histstore that
  sets a conversation's ``length`` or ``revision`` adds one to it. Two triggers on the
  conversation row (single-row statements, which no temporary table slows) refuse a
  change that does not: an UPDATE of ``length`` or ``revision`` that leaves
  ``listed_changes`` as it was, and an INSERT of a conversation with messages or a
  revision whose ``listed_changes`` is 0. Every older writer of messages changes that
  row so (the ones before editable history grow ``length``; the later ones move the
  revision too), so each fails with the guard's message, storing nothing.

PostgreSQL gets the column (the statements are shared) and nothing else: its insert
trigger already leaves the appends that list themselves (b8e1d4f6a2c7).

Downgrade: the two triggers of the messages table come back and the guards and the
column go (``ALTER TABLE ... DROP COLUMN``, SQLite 3.35 and later). All of it is SQL, so
``--sql`` carries it.

Revision ID: a2f6c8e4d0b3
Revises: b8e1d4f6a2c7
Create Date: 2026-12-04 17:00:00.000000

"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from histstore._storage.revisions import OLDER_WRITER_MESSAGE, placed_schema

revision: str = "a2f6c8e4d0b3"
down_revision: str | None = "b8e1d4f6a2c7"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

MESSAGE = OLDER_WRITER_MESSAGE
COLUMN = "listed_changes"
GUARDS = {
    "histstore_guard_listing": (
        "BEFORE UPDATE OF length, revision ON histstore_conversations"
        f" WHEN NEW.{COLUMN} = OLD.{COLUMN}"
    ),
    "histstore_guard_listing_new": (
        "BEFORE INSERT ON histstore_conversations"
        f" WHEN NEW.{COLUMN} = 0 AND (NEW.length > 0 OR NEW.revision > 0)"
    ),
}
# What b1e6f0c4a7d3 and d5f7a3c1e9b2 made, for the downgrade.
MESSAGE_TRIGGERS = {
    "histstore_messages_fts_insert": (
        "AFTER INSERT ON histstore_messages WHEN new.search_text IS NOT NULL BEGIN"
        " INSERT OR IGNORE INTO histstore_messages_fts_pending(message_rowid)"
        " VALUES (new.rowid); END"
    ),
    "histstore_guard_entry_id": (
        "BEFORE INSERT ON histstore_messages WHEN NEW.entry_id IS NULL OR NEW.entry_id < 1"
        f" BEGIN SELECT RAISE(ABORT, '{MESSAGE}'); END"
    ),
}


def upgrade() -> None:
    op.add_column(
        "histstore_conversations",
        sa.Column(COLUMN, sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        schema=placed_schema(),
    )
    if op.get_context().dialect.name != "sqlite":
        return
    for name in MESSAGE_TRIGGERS:
        op.execute(f"DROP TRIGGER {name}")
    for name, rule in GUARDS.items():
        op.execute(f"CREATE TRIGGER {name} {rule} BEGIN SELECT RAISE(ABORT, '{MESSAGE}'); END")


def downgrade() -> None:
    # Each step may run again: on SQLite, DDL that no DML precedes is committed as it
    # runs, so a later revision's failing downgrade leaves these done.
    if op.get_context().dialect.name == "sqlite":
        for name in GUARDS:
            op.execute(f"DROP TRIGGER IF EXISTS {name}")
        for name, body in MESSAGE_TRIGGERS.items():
            op.execute(f"CREATE TRIGGER IF NOT EXISTS {name} {body}")
    if _has_column():
        op.drop_column("histstore_conversations", COLUMN, schema=placed_schema())


def _has_column() -> bool:
    """Whether the conversations table still has the column (offline: it has)."""
    if op.get_context().as_sql:
        return True
    found = sa.inspect(op.get_bind()).get_columns("histstore_conversations", schema=placed_schema())
    return any(c["name"] == COLUMN for c in found)
