"""What the migration revisions (``migrations/versions``) share: where histstore's
tables are placed. For code that runs inside a revision only (``alembic.op``)."""

from __future__ import annotations

from alembic import op

__all__ = ["placed_schema", "schema_prefix"]


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
