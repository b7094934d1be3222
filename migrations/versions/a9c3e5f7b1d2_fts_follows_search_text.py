"""SQLite: the full-text index follows ``search_text``, not every update of a message.

The FTS5 update trigger of revision b7d4e2a91c30 fired on every UPDATE of a message
row, so moving entries (a splice that changes the length shifts every later position)
took each moved row out of the index and put it back. The index holds ``search_text``
by rowid, and an UPDATE keeps the rowid, so only an update of ``search_text`` changes
what the index must hold: the trigger now fires on that column alone.

PostgreSQL: nothing (its ``search_vector`` is a generated column of the row).
Downgrade: the trigger of b7d4e2a91c30 again.

Revision ID: a9c3e5f7b1d2
Revises: f3b8d6a2c915
Create Date: 2026-12-03 15:20:00.000000

"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "a9c3e5f7b1d2"
down_revision: str | None = "f3b8d6a2c915"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_NAME = "histstore_messages_fts_update"
_BODY = (
    " BEGIN"
    " INSERT INTO histstore_messages_fts(histstore_messages_fts, rowid, search_text)"
    " SELECT 'delete', old.rowid, old.search_text WHERE old.search_text IS NOT NULL;"
    " INSERT INTO histstore_messages_fts(rowid, search_text)"
    " SELECT new.rowid, new.search_text WHERE new.search_text IS NOT NULL; END"
)


def _replace(event: str) -> None:
    if op.get_context().dialect.name != "sqlite":
        return
    op.execute(f"DROP TRIGGER IF EXISTS {_NAME}")
    op.execute(f"CREATE TRIGGER {_NAME} {event} ON histstore_messages{_BODY}")


def upgrade() -> None:
    _replace("AFTER UPDATE OF search_text")


def downgrade() -> None:
    _replace("AFTER UPDATE")
