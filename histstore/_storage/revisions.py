"""What the migration revisions (``migrations/versions``) share: where histstore's
tables are placed, the older-writer guards' message and the error a revision refuses
with. For code that runs inside a revision only (``alembic.op``).

The one module of ``histstore`` a revision may import (tests/storage/test_revision_imports.py
holds them to it): a revision must do what it did when it was written, so it carries
its own copy of any rule about stored data (or does it in SQL) and never calls the
runtime code, which follows the newest revision's rules. Nothing here decides what a
row holds, and this module imports nothing of ``histstore`` but the error types.
"""

from __future__ import annotations

from alembic import op

from .._errors import SchemaError

__all__ = ["OLDER_WRITER_MESSAGE", "SchemaError", "placed_schema", "schema_prefix"]

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
