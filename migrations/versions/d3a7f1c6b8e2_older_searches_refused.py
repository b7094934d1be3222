"""PostgreSQL: an older histstore's search fails saying the schema is newer.

The older-writer guards (d5f7a3c1e9b2) make an older process's writes fail with
``histstore: the database schema is newer than this version of histstore; upgrade the
histstore package``: database objects the older SQL reaches raise it. Searches had no
such guard: they failed on whatever the newer schema no longer has, with the driver's
raw error. Two names come back as guards, each raising the same message:

* ``search_vector``, the generated column searches read before e9a4c2f8b5d1 (they name
  it ``histstore_messages.search_vector``, which PostgreSQL also reads as the function
  ``search_vector(histstore_messages)``): now that function. PostgreSQL finds such a
  function on the ``search_path``, so with the tables in a schema of their own the
  older search is refused this way only when that schema is on the role's
  ``search_path``; otherwise it fails as before (``column ... does not exist``).
* ``histstore_search_pending``, the list searches and indexers read from e9a4c2f8b5d1 on
  and that c8d2f4a6e1b9 renamed: now a view whose rows come from a function that
  raises; writing to it (an older append listing its run) runs the older-writer
  guard's trigger function, which raises too.

Nothing else changes: histstore's own statements name neither. SQLite: nothing (its
older writers are refused since a2f6c8e4d0b3; an older search there fails on the pending
list c8d2f4a6e1b9 renamed). Downgrade drops both. All of it is SQL, so ``--sql`` carries
it.

Revision ID: d3a7f1c6b8e2
Revises: d9e3b5a7c1f4
Create Date: 2026-12-07 00:45:00.000000

"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

from histstore._storage.revisions import OLDER_WRITER_MESSAGE, schema_prefix

revision: str = "d3a7f1c6b8e2"
down_revision: str | None = "d9e3b5a7c1f4"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

MESSAGE = OLDER_WRITER_MESSAGE
VECTOR = "search_vector"  # the column before e9a4c2f8b5d1, now a function of the row
PENDING = "histstore_search_pending"  # the list e9a4c2f8b5d1 made, c8d2f4a6e1b9 renamed
PENDING_ROWS = "histstore_refuse_older_search"  # the view's rows: raises
REFUSE_WRITE = "histstore_refuse_older_writer"  # d5f7a3c1e9b2's trigger function: raises
RAISED = f"RAISE EXCEPTION '{MESSAGE}' USING ERRCODE = 'P0001';"


def _up(q: str) -> list[str]:
    return [
        f"CREATE FUNCTION {q}{VECTOR}({q}histstore_messages) RETURNS tsvector"
        f" LANGUAGE plpgsql AS $$ BEGIN {RAISED} END $$",
        f"CREATE FUNCTION {q}{PENDING_ROWS}() RETURNS TABLE"
        " (conversation_id varchar(255), first_entry bigint, last_entry bigint)"
        f" LANGUAGE plpgsql AS $$ BEGIN {RAISED} END $$",
        f"CREATE VIEW {q}{PENDING} AS SELECT conversation_id, first_entry, last_entry"  # noqa: S608 - names, no input
        f" FROM {q}{PENDING_ROWS}()",
        f"CREATE TRIGGER histstore_guard_older_listing INSTEAD OF INSERT OR UPDATE OR DELETE"
        f" ON {q}{PENDING} FOR EACH ROW EXECUTE FUNCTION {q}{REFUSE_WRITE}()",
    ]


def _down(q: str) -> list[str]:
    return [
        f"DROP VIEW {q}{PENDING}",
        f"DROP FUNCTION {q}{PENDING_ROWS}()",
        f"DROP FUNCTION {q}{VECTOR}({q}histstore_messages)",
    ]


def upgrade() -> None:
    if op.get_context().dialect.name == "postgresql":
        for sql in _up(schema_prefix()):
            op.execute(sql)


def downgrade() -> None:
    if op.get_context().dialect.name == "postgresql":
        for sql in _down(schema_prefix()):
            op.execute(sql)
