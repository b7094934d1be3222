"""PostgreSQL: the common append lists its own run for the search index; the insert
trigger lists what other statements insert.

The statement trigger ``histstore_search_added`` (revision e9a4c2f8b5d1) lists the runs
of entry ids every INSERT into ``histstore_messages`` stored. For the common append, a
statement that knows its run already, the trigger cost about 60 µs of server time a
write, and about 2.5 ms the first time each server process ran it (plpgsql compiles
the function and plans its queries). Now the trigger fires only when the setting
``histstore.search_listed`` is not ``on``: the append statements list their run in a
CTE of their own and set it, for their own transaction only (``set_config(...,
true)``). Every other INSERT, an older process's append included, still goes through
the trigger, so nothing is ever left unlisted.

SQLite: nothing. Downgrade: the trigger fires for every INSERT again. Both are SQL, so
``--sql`` carries them.

Revision ID: b8e1d4f6a2c7
Revises: f7c2a9d3e8b4
Create Date: 2026-12-04 13:10:00.000000

"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

from histstore._storage.revisions import schema_prefix

revision: str = "b8e1d4f6a2c7"
down_revision: str | None = "f7c2a9d3e8b4"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TRIGGER = "histstore_search_added"
_FUNCTION = "histstore_search_list_added"
SETTING = "histstore.search_listed"


def _trigger(q: str, when: str) -> list[str]:
    return [
        f"DROP TRIGGER {_TRIGGER} ON {q}histstore_messages",
        f"CREATE TRIGGER {_TRIGGER} AFTER INSERT ON {q}histstore_messages"
        f" REFERENCING NEW TABLE AS added FOR EACH STATEMENT{when}"
        f" EXECUTE FUNCTION {q}{_FUNCTION}()",
    ]


def upgrade() -> None:
    if op.get_context().dialect.name != "postgresql":
        return
    when = f" WHEN (current_setting('{SETTING}', true) IS DISTINCT FROM 'on')"
    for sql in _trigger(schema_prefix(), when):
        op.execute(sql)


def downgrade() -> None:
    if op.get_context().dialect.name != "postgresql":
        return
    for sql in _trigger(schema_prefix(), ""):
        op.execute(sql)
