"""PostgreSQL: a statement trigger, not a foreign key, deletes a message's semantic vectors.

``histstore_vectors`` referenced ``histstore_messages (conversation_id, position)`` with
``ON DELETE CASCADE``. A foreign key checks every row whose key changes: a splice that
moves 100,000 positions (two UPDATEs, out of the key's way and back) made 200,000
such checks, half of the splice's 2.5 s, and a delete cascaded a row at a time. Now a
statement trigger deletes the vectors of the deleted messages, in the same statement,
as SQLite's trigger does (revision b7d4e2a91c30). A splice drops the vectors from the
first moved position on after it moved the rows (``_storage.statements.editing``), so
a vector stored meanwhile for a position that moved goes too.

SQLite: nothing (its table keeps the foreign key it was made with, which SQLite does
not enforce; its trigger does the work). Downgrade: vectors without a message are
deleted and the foreign key comes back. Both are SQL, so ``--sql`` carries them.

Revision ID: f7c2a9d3e8b4
Revises: e9a4c2f8b5d1
Create Date: 2026-12-04 11:10:00.000000

"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

from histstore._storage.revisions import schema_prefix

revision: str = "f7c2a9d3e8b4"
down_revision: str | None = "e9a4c2f8b5d1"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

FOREIGN_KEY = "fk_histstore_vectors_conversation_id_histstore_messages"
_FUNCTION = "histstore_vectors_drop_removed"


def _up(q: str) -> list[str]:
    quoted = q.replace("'", "''")
    return [
        f"ALTER TABLE {q}histstore_vectors DROP CONSTRAINT {FOREIGN_KEY}",
        # Dynamic SQL: planned for each statement's own number of rows (see e9a4c2f8b5d1).
        f"CREATE FUNCTION {q}{_FUNCTION}() RETURNS trigger LANGUAGE plpgsql"  # noqa: S608 - names, no input
        " SET search_path FROM CURRENT AS $$ BEGIN"
        f" EXECUTE 'DELETE FROM {quoted}histstore_vectors AS v USING removed AS r"
        " WHERE v.conversation_id = r.conversation_id AND v.position = r.position';"
        " RETURN NULL; END $$",
        f"CREATE TRIGGER histstore_vectors_removed AFTER DELETE ON {q}histstore_messages"
        f" REFERENCING OLD TABLE AS removed FOR EACH STATEMENT EXECUTE FUNCTION {q}{_FUNCTION}()",
    ]


def _down(q: str) -> list[str]:
    return [
        f"DROP TRIGGER histstore_vectors_removed ON {q}histstore_messages",
        f"DROP FUNCTION {q}{_FUNCTION}()",
        f"DELETE FROM {q}histstore_vectors AS v WHERE NOT EXISTS (SELECT 1"  # noqa: S608 - names, no input
        f" FROM {q}histstore_messages AS m WHERE m.conversation_id = v.conversation_id"
        " AND m.position = v.position)",
        f"ALTER TABLE {q}histstore_vectors ADD CONSTRAINT {FOREIGN_KEY}"
        " FOREIGN KEY (conversation_id, position)"
        f" REFERENCES {q}histstore_messages (conversation_id, position) ON DELETE CASCADE",
    ]


def upgrade() -> None:
    if op.get_context().dialect.name != "postgresql":
        return
    for sql in _up(schema_prefix()):
        op.execute(sql)


def downgrade() -> None:
    if op.get_context().dialect.name != "postgresql":
        return
    for sql in _down(schema_prefix()):
        op.execute(sql)
