"""PostgreSQL: the messages' primary key is checked at the end of each statement.

An edit that changes a conversation's length moves every later message by the same
number of positions. With the key checked row by row, as until now, one ``UPDATE`` can
collide with a row that has yet to move, so the store moved the rows twice (to negative
positions, then back): two new versions of each row, and two sets of entries in every
index, the GIN index of the messages' text included (revision 5b7e2d4a9c13), which makes
each entry's ``tsvector`` again. ``DEFERRABLE INITIALLY IMMEDIATE`` has PostgreSQL check
the key once the statement has run, so the move is one ``UPDATE``. A duplicate key still
fails the statement that makes it; no statement of histstore names this key in an
``ON CONFLICT`` clause (which a deferrable key cannot serve), and no foreign key refers
to it.

* Upgrade: the key is made again, deferrable (its index rebuilt: the table is locked
  while that runs).
* Downgrade: the key is made again as it was. An older histstore moves rows in two
  steps, which a deferrable key accepts as well.

SQLite: nothing (it checks a key row by row whatever the declaration; the store keeps
the two-step move there).

Revision ID: a6d3f9c2e4b8
Revises: e5c3a9d7f2b4
Create Date: 2026-12-07 18:05:00.000000

"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

from histstore._storage.revisions import schema_prefix

revision: str = "a6d3f9c2e4b8"
down_revision: str | None = "e5c3a9d7f2b4"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

KEY = "pk_histstore_messages"


def _remade(prefix: str, deferrable: bool) -> list[str]:
    table = f"{prefix}histstore_messages"
    when = " DEFERRABLE INITIALLY IMMEDIATE" if deferrable else ""
    return [
        f"ALTER TABLE {table} DROP CONSTRAINT {KEY}",
        f"ALTER TABLE {table} ADD CONSTRAINT {KEY} PRIMARY KEY (conversation_id, position){when}",
    ]


def upgrade() -> None:
    if op.get_context().dialect.name == "postgresql":
        for sql in _remade(schema_prefix(), deferrable=True):
            op.execute(sql)


def downgrade() -> None:
    if op.get_context().dialect.name == "postgresql":
        for sql in _remade(schema_prefix(), deferrable=False):
            op.execute(sql)
