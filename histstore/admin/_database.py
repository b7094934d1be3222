"""The storage side of ``histstore.admin`` for databases: where a target points, the
schema's revision, the migration SQL and the upgrade (through ``_storage.migrations``)."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import URL
from sqlalchemy.ext.asyncio import AsyncConnection

from .._connect import Pooler, connect
from .._errors import SchemaError
from .._storage import migrations as _migrations
from .._storage.engine import is_memory_url, resolve_target
from .._storage.pg_url import display

__all__ = [
    "DatabaseLocation",
    "MigrationStatus",
    "locate",
    "migrate",
    "migration_sql",
    "migration_status",
    "upgrade_sql",
]

Target = str | os.PathLike[str] | URL | None


@dataclass(frozen=True)
class DatabaseLocation:
    """Where a target points: a printable form (never a password), and the SQLite file."""

    display: str
    """The target as it may be printed (a password as ``***``)."""
    file: Path | None
    """The SQLite database file; ``None`` for PostgreSQL or an in-memory database."""


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
    return DatabaseLocation(display(resolved), None)


@dataclass(frozen=True)
class MigrationStatus:
    """Where a database's schema stands against this histstore's migrations.

    ``current`` is ``None`` when histstore's schema was never created there; ``known``
    is false when the database is at a revision newer than this library knows.
    """

    database: str
    """The database, as it may be printed (never a password)."""
    current: str | None
    head: str
    """The newest revision this histstore knows."""
    known: bool

    @property
    def up_to_date(self) -> bool:
        """Whether the schema is at the newest revision."""
        return self.current == self.head


async def migration_status(
    target: Target = None, *, schema: str | None = None, pooler: Pooler | None = None
) -> MigrationStatus:
    """Read a database's schema revision (in ``schema`` on PostgreSQL), changing nothing.
    ``pooler``: as ``histstore.connect()``'s.

    Raises:
        ValueError: an unsupported target.
        HistStoreError: the database cannot be reached (the reason is said).
    """
    where = locate(target).display
    store = await connect(target, migrate=False, schema=schema, pooler=pooler)
    try:

        async def work(conn: AsyncConnection) -> _migrations.SchemaStatus:
            return await conn.run_sync(_migrations.schema_status, schema)

        found = await store.internals.executor.run(
            work, mode="snapshot", action="reading the schema revision"
        )
    finally:
        await store.close()
    return MigrationStatus(where, found.current, found.head, found.known)


async def migrate(
    target: Target = None,
    *,
    schema: str | None = None,
    lock_timeout: float = _migrations.LOCK_TIMEOUT,
    progress: Callable[[int, int], None] | None = None,
    pooler: Pooler | None = None,
) -> MigrationStatus:
    """Create or upgrade histstore's schema to the newest revision (its tables in
    ``schema`` on PostgreSQL, created when missing), in one transaction.

    No lock is waited for longer than ``lock_timeout`` seconds (PostgreSQL's
    ``lock_timeout``; SQLite's busy timeout): live writers queue behind a migration
    waiting for a table, so the wait is bounded. When it cannot get its locks (or
    meets a deadlock), the transaction rolls back and is tried again, four attempts
    in all. ``progress(done, total)`` is called as the steps are applied. ``pooler``:
    as ``histstore.connect()``'s.

    Returns the status from before the upgrade (``up_to_date``: nothing was done).

    Raises:
        ValueError: ``lock_timeout`` is not a positive number.
        SchemaError: the database is at a revision newer than this library.
        DatabaseFailure: it never got its locks; nothing was changed, and it is safe
            to run again.
        HistStoreError: the database cannot be reached.
    """
    if (
        not isinstance(lock_timeout, (int, float))
        or isinstance(lock_timeout, bool)
        or not lock_timeout > 0
    ):
        raise ValueError("lock_timeout must be a positive number of seconds")
    before = await migration_status(target, schema=schema, pooler=pooler)
    if not before.known:
        _migrations.check(
            _migrations.SchemaStatus(before.current, before.head, before.known), before.database
        )
    if not before.up_to_date:
        how = _migrations.UpgradeOptions(lock_timeout=float(lock_timeout), progress=progress)
        token = _migrations.upgrade_options.set(how)
        try:
            store = await connect(
                target,
                migrate=True,
                schema=schema,
                busy_timeout=float(lock_timeout),
                pooler=pooler,
            )
        finally:
            _migrations.upgrade_options.reset(token)
        await store.close()
    return before


def migration_sql(
    target: Target = None, *, schema: str | None = None, from_revision: str = "base"
) -> str:
    """The SQL that upgrades histstore's schema from ``from_revision`` to the newest on
    this kind of database (nothing is run and nothing is connected to: Alembic's
    offline mode). ``"base"`` (the default): the SQL that creates the schema. At the
    newest revision it is a comment saying so. With ``schema`` (PostgreSQL) the
    statements create that schema and put everything in it. Where a step fills in
    data that SQL cannot compute, the script ends with a comment naming ``histstore
    reindex``, to run once it has been applied.

    Raises:
        ValueError: an unknown ``from_revision`` (the message lists the known ones).
        SchemaError: an SQLite database from any revision but ``"base"`` (SQLite's
            steps copy tables and compute values in Python: ``migrate()`` upgrades it).
    """
    resolved = resolve_target(target)
    if not isinstance(resolved, URL):
        raise TypeError("migration_sql() takes a path or URL")
    known = _migrations.revisions()
    if resolved.get_backend_name() == "sqlite" and from_revision not in ("base", known[-1]):
        if from_revision not in known:
            _migrations.offline_script("sqlite://", start=from_revision)  # ValueError
        raise SchemaError(
            f"--sql prints upgrade scripts for PostgreSQL only; an SQLite database at"
            f" revision {from_revision} is upgraded by 'histstore migrate' (or by opening"
            " it with histstore), in one transaction, as some steps copy tables and"
            " compute values that a script cannot"
        )
    return _migrations.offline_script(
        resolved.render_as_string(hide_password=False), start=from_revision, schema=schema
    )


async def upgrade_sql(
    target: Target = None, *, schema: str | None = None, pooler: Pooler | None = None
) -> str:
    """The SQL that upgrades this database from its current revision to the newest
    (read from the database; otherwise as ``migration_sql``): apply it with ``psql -v
    ON_ERROR_STOP=1``. A missing SQLite file, or a database without histstore's
    schema, gets the SQL that creates it.

    Raises:
        SchemaError: the database is newer than this library, or SQLite at an older
            revision (see ``migration_sql``).
        HistStoreError: the database cannot be reached.
    """
    resolved = resolve_target(target)
    if not isinstance(resolved, URL):
        raise TypeError("upgrade_sql() takes a path or URL")
    file = locate(resolved).file
    if resolved.get_backend_name() == "sqlite" and (file is None or not file.exists()):
        return migration_sql(resolved, schema=schema)  # nothing there yet (or in memory)
    status = await migration_status(resolved, schema=schema, pooler=pooler)
    if not status.known:
        _migrations.check(
            _migrations.SchemaStatus(status.current, status.head, status.known),
            status.database,
        )
    return migration_sql(resolved, schema=schema, from_revision=status.current or "base")
