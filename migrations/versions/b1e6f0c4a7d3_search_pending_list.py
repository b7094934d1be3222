"""SQLite: a write lists its messages for the full-text index; the store indexes the list.

Until now the FTS5 insert trigger indexed every message in the statement that stored
it: each small write transaction flushed a small FTS5 segment and, every few writes,
merged segments, about half of a bulk write's time. Now the insert trigger only adds
the message's rowid to ``histstore_messages_fts_pending``, the index's pending list,
in the same transaction; the store moves the listed rows into FTS5 in large batches
(``_storage.search_index``): when its writers pause, after many commits without a pause,
when it closes, and before every search, so a search still finds every write that
returned before it. A crash leaves the list as it was; the next store to write or
search indexes it.

The FTS5 table holds exactly the rows whose ``search_text`` is not NULL and that are not
listed. So the delete and update triggers take a row out of FTS5 only when it is not
listed (FTS5's ``delete`` of text it never indexed would corrupt it), and take it off
the list; an update of ``search_text`` lists the row again.

PostgreSQL: nothing (its ``search_vector`` is a generated column of the row).
Downgrade: the listed rows are indexed, the list dropped, the triggers of a9c3e5f7b1d2
made again. Both are SQL, so ``--sql`` carries them.

Revision ID: b1e6f0c4a7d3
Revises: a9c3e5f7b1d2
Create Date: 2026-12-04 04:00:00.000000

"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "b1e6f0c4a7d3"
down_revision: str | None = "a9c3e5f7b1d2"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TRIGGERS = ("insert", "delete", "update")

# Out of FTS5 (when indexed, i.e. not listed) and off the list: the row as it was.
_UNINDEX_OLD = (
    " INSERT INTO histstore_messages_fts(histstore_messages_fts, rowid, search_text)"
    " SELECT 'delete', old.rowid, old.search_text WHERE old.search_text IS NOT NULL"
    " AND NOT EXISTS (SELECT 1 FROM histstore_messages_fts_pending WHERE message_rowid = old.rowid);"
    " DELETE FROM histstore_messages_fts_pending WHERE message_rowid = old.rowid;"
)
_UP = [
    "CREATE TABLE histstore_messages_fts_pending (message_rowid INTEGER PRIMARY KEY)",
    *(f"DROP TRIGGER IF EXISTS histstore_messages_fts_{name}" for name in _TRIGGERS),
    "CREATE TRIGGER histstore_messages_fts_insert AFTER INSERT ON histstore_messages"
    " WHEN new.search_text IS NOT NULL BEGIN"
    " INSERT OR IGNORE INTO histstore_messages_fts_pending(message_rowid) VALUES (new.rowid); END",
    "CREATE TRIGGER histstore_messages_fts_delete AFTER DELETE ON histstore_messages"
    f" WHEN old.search_text IS NOT NULL BEGIN{_UNINDEX_OLD} END",
    "CREATE TRIGGER histstore_messages_fts_update AFTER UPDATE OF search_text ON histstore_messages BEGIN"
    f"{_UNINDEX_OLD}"
    " INSERT OR IGNORE INTO histstore_messages_fts_pending(message_rowid)"
    " SELECT new.rowid WHERE new.search_text IS NOT NULL; END",
]
_DOWN = [
    *(f"DROP TRIGGER IF EXISTS histstore_messages_fts_{name}" for name in _TRIGGERS),
    "INSERT INTO histstore_messages_fts(rowid, search_text)"
    " SELECT m.rowid, m.search_text FROM histstore_messages_fts_pending AS p"
    " JOIN histstore_messages AS m ON m.rowid = p.message_rowid"
    " WHERE m.search_text IS NOT NULL",
    "DROP TABLE histstore_messages_fts_pending",
    "CREATE TRIGGER histstore_messages_fts_insert AFTER INSERT ON histstore_messages"
    " WHEN new.search_text IS NOT NULL BEGIN"
    " INSERT INTO histstore_messages_fts(rowid, search_text) VALUES (new.rowid, new.search_text); END",
    "CREATE TRIGGER histstore_messages_fts_delete AFTER DELETE ON histstore_messages"
    " WHEN old.search_text IS NOT NULL BEGIN"
    " INSERT INTO histstore_messages_fts(histstore_messages_fts, rowid, search_text)"
    " VALUES ('delete', old.rowid, old.search_text); END",
    "CREATE TRIGGER histstore_messages_fts_update AFTER UPDATE OF search_text ON histstore_messages BEGIN"
    " INSERT INTO histstore_messages_fts(histstore_messages_fts, rowid, search_text)"
    " SELECT 'delete', old.rowid, old.search_text WHERE old.search_text IS NOT NULL;"
    " INSERT INTO histstore_messages_fts(rowid, search_text)"
    " SELECT new.rowid, new.search_text WHERE new.search_text IS NOT NULL; END",
]


def _run(statements: list[str]) -> None:
    if op.get_context().dialect.name != "sqlite":
        return
    for sql in statements:
        op.execute(sql)


def upgrade() -> None:
    _run(_UP)


def downgrade() -> None:
    _run(_DOWN)
