"""SQLite: the write records are kept by their key alone (a ``WITHOUT ROWID`` table).

``histstore_writes`` was an ordinary SQLite table: each record stored once in the table
under a hidden rowid, and its key (conversation and idempotency key) a second time in
the primary key's own index (143 of the 655 bytes the records took a turn of the OpenAI
Agents session, 410 of 1,330 for ADK's). As a ``WITHOUT ROWID`` table the records are stored in the primary key's order and
that index is gone; the index of records by revision (f1c3a5e7b9d2) now refers to a
record by its key instead of its rowid. Nothing of histstore reads the table's rowid.

Together with this revision the store writes a shorter digest of each batch (22
characters of base64url instead of 64 hex digits, ``_core.codec.digest``); the column
is the same and the records already stored keep their hex digests, which the store still
recognises, so a write retried across the upgrade is confirmed as before.

* Upgrade (SQLite): the table is made again ``WITHOUT ROWID`` with the same columns and
  rows, and its revision index again.
* Downgrade (SQLite): the table is made again as it was (with a rowid); the short
  digests stay, which an older histstore compares as different and then, as it does
  for any batch whose digest differs, compares with the messages stored.

PostgreSQL: nothing (a table there has no rowid, and its records and their key index
are apart by design).

Revision ID: c2e4a6f8b0d1
Revises: a6d3f9c2e4b8
Create Date: 2026-12-07 21:20:00.000000

"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "c2e4a6f8b0d1"
down_revision: str | None = "a6d3f9c2e4b8"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLE = "histstore_writes"
REMADE = "histstore_writes_remade"  # only while the table is made again
INDEX = "ix_histstore_writes_revision"
COLUMNS = 'conversation_id, "key", position, count, digest, created_at, revision, appended'


def _remake(rowid: bool) -> None:
    """Make ``histstore_writes`` again with its rows (with or without a rowid)."""
    op.execute(f"DROP TABLE IF EXISTS {REMADE}")
    op.execute(
        f"CREATE TABLE {REMADE} ("
        " conversation_id VARCHAR(255) NOT NULL,"
        ' "key" VARCHAR(255) NOT NULL,'
        " position BIGINT NOT NULL,"
        " count INTEGER NOT NULL,"
        " digest VARCHAR(64) NOT NULL,"
        " created_at DATETIME NOT NULL,"
        " revision BIGINT,"
        " appended INTEGER,"
        ' CONSTRAINT pk_histstore_writes PRIMARY KEY (conversation_id, "key")'
        ")" + ("" if rowid else " WITHOUT ROWID")
    )
    op.execute(f"INSERT INTO {REMADE} ({COLUMNS}) SELECT {COLUMNS} FROM {TABLE}")  # noqa: S608 - names, no input
    op.execute(f"DROP TABLE {TABLE}")
    op.execute(f"ALTER TABLE {REMADE} RENAME TO {TABLE}")
    op.execute(
        f"CREATE INDEX {INDEX} ON {TABLE} (conversation_id, revision) WHERE revision IS NOT NULL"
    )


def upgrade() -> None:
    if op.get_context().dialect.name == "sqlite":
        _remake(rowid=False)


def downgrade() -> None:
    if op.get_context().dialect.name == "sqlite":
        _remake(rowid=True)
