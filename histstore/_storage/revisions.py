"""What the migration revisions (``migrations/versions``) share: where histstore's
tables are placed, and the older-writer guards' message. For code that runs inside a
revision only (``alembic.op``)."""

from __future__ import annotations

from alembic import op

__all__ = ["OLDER_WRITER_MESSAGE", "placed_schema", "schema_prefix"]

OLDER_WRITER_MESSAGE = (
    "histstore: the database schema is newer than this version of histstore;"
    " upgrade the histstore package"
)
"""What the guards against older histstore processes raise (revisions d5f7a3c1e9b2,
a2f6c8e4d0b3)."""


def placed_schema() -> str | None:
    """The schema histstore's tables are in (``connect(schema=)``), online: what DDL that
    is not translated like the other operations (ALTER TABLE, SQL text) must name.
    Offline, ``search_path`` places them (see revision c4e8a1f2d9b7): ``None``."""
    if op.get_context().as_sql:
        return None
    placed = op.get_bind().get_execution_options().get("schema_translate_map") or {}
    schema = placed.get(None)
    return str(schema) if schema else None


def schema_prefix() -> str:
    """``placed_schema()`` as SQL text puts it before a name (quoted, then a dot), or
    nothing."""
    schema = placed_schema()
    return "" if schema is None else '"' + schema.replace('"', '""') + '".'
