"""The storage side of ``histstore.admin`` for databases: where a target points, the
schema's revision, the migration SQL and the upgrade (through ``_migrations``)."""

from __future__ import annotations

import io
import os
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import URL
from sqlalchemy.ext.asyncio import AsyncConnection

from . import _migrations
from ._connect import connect
from ._engine import is_memory_url, resolve_target

__all__ = [
    "DatabaseLocation",
    "MigrationStatus",
    "locate",
    "migrate",
    "migration_sql",
    "migration_status",
]

Target = str | os.PathLike[str] | URL | None


@dataclass(frozen=True)
class DatabaseLocation:
    """Where a target points: a printable form (never a password), and the SQLite file."""

    display: str
    file: Path | None


def locate(target: Target = None) -> DatabaseLocation:
    """Resolve a target as ``histstore.connect()`` does, without opening it.

    Raises:
        ValueError: not a path or URL histstore supports.
    """
    resolved = resolve_target(target)
    if not isinstance(resolved, URL):
        raise TypeError("locate() takes a path or URL")
    if resolved.get_backend_name() == "sqlite" and not is_memory_url(resolved):
        path = Path(resolved.database or "")
        return DatabaseLocation(str(path), path)
    return DatabaseLocation(resolved.render_as_string(hide_password=True), None)


@dataclass(frozen=True)
class MigrationStatus:
    """Where a database's schema stands against this histstore's migrations.

    ``current`` is ``None`` when histstore's schema was never created there; ``known``
    is false when the database is at a revision newer than this library knows.
    """

    database: str
    current: str | None
    head: str
    known: bool

    @property
    def up_to_date(self) -> bool:
        """Whether the schema is at the newest revision."""
        return self.current == self.head


async def migration_status(target: Target = None, *, schema: str | None = None) -> MigrationStatus:
    """Read a database's schema revision (in ``schema`` on PostgreSQL), changing nothing.

    Raises:
        ValueError: an unsupported target.
        HistStoreError: the database cannot be reached (the reason is said).
    """
    where = locate(target).display
    store = await connect(target, migrate=False, schema=schema)
    try:

        async def work(conn: AsyncConnection) -> _migrations.SchemaStatus:
            return await conn.run_sync(_migrations.schema_status, schema)

        found = await store._run(work, mode="snapshot", action="reading the schema revision")
    finally:
        await store.close()
    return MigrationStatus(where, found.current, found.head, found.known)


async def migrate(target: Target = None, *, schema: str | None = None) -> MigrationStatus:
    """Create or upgrade histstore's schema to the newest revision (its tables in
    ``schema`` on PostgreSQL, created when missing).

    Returns the status from before the upgrade (``up_to_date``: nothing was done).

    Raises:
        SchemaError: the database is at a revision newer than this library.
        HistStoreError: the database cannot be reached.
    """
    before = await migration_status(target, schema=schema)
    if not before.known:
        _migrations.check(
            _migrations.SchemaStatus(before.current, before.head, before.known), before.database
        )
    if not before.up_to_date:
        store = await connect(target, migrate=True, schema=schema)
        await store.close()
    return before


def migration_sql(target: Target = None, *, schema: str | None = None) -> str:
    """The SQL that creates histstore's schema on this kind of database (nothing is run
    and no file is made: Alembic's offline mode); with ``schema`` (PostgreSQL) the
    statements create that schema and put everything in it."""
    from alembic import command

    resolved = resolve_target(target)
    if not isinstance(resolved, URL):
        raise TypeError("migration_sql() takes a path or URL")
    cfg = _migrations.alembic_config(
        url=resolved.render_as_string(hide_password=False), schema=schema
    )
    buffer = io.StringIO()
    cfg.output_buffer = buffer
    command.upgrade(cfg, "head", sql=True)
    return buffer.getvalue()
