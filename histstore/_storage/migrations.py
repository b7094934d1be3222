"""Alembic glue: where the migration scripts are, what revision a database is at, upgrades.

The scripts live in ``migrations/`` at the top of the source tree and are shipped inside
the wheel as ``histstore/migrations``; both layouts are looked for.
"""

from __future__ import annotations

import asyncio
import io
import sqlite3
import time
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.operations import Operations
from alembic.runtime.migration import MigrationContext, MigrationStep
from alembic.script import ScriptDirectory
from alembic.util.exc import CommandError
from sqlalchemy import inspect
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.schema import CreateSchema

from .._errors import SchemaError
from .dberrors import DATABASE_ERRORS, DatabaseFailure, reason
from .pool_options import DEFAULT_REFUSED_WAIT
from .refusals import Backoff, connection
from .schema import VERSION_TABLE
from .statements.dialects import limit_lock_waits, lock_for_migration

__all__ = [
    "LOCK_TIMEOUT",
    "SchemaStatus",
    "UpgradeOptions",
    "alembic_config",
    "offline_script",
    "revisions",
    "schema_status",
    "scripts_dir",
    "upgrade",
    "upgrade_options",
    "upgrade_retrying",
]

LOCK_TIMEOUT = 10.0
"""Seconds a migration waits for any one lock before it rolls back and tries again."""

RETRY_DELAYS = (0.5, 1.0, 2.0)
"""Pauses between the attempts of a migration that could not get its locks: four
attempts in all, so a give-up comes after at most 4 lock timeouts and 3.5 s."""

# SQLSTATEs of a statement that could not get its locks: lock_not_available (the
# lock_timeout ran out) and deadlock_detected. Either way the transaction is rolled back.
_LOCK_SQLSTATES = frozenset({"55P03", "40P01"})
# SQLite's SQLITE_BUSY and SQLITE_LOCKED (primary result codes).
_SQLITE_BUSY_CODES = frozenset({5, 6})


def scripts_dir() -> Path:
    """The folder holding ``env.py`` and ``versions/``."""
    package = Path(__file__).resolve().parents[1]  # histstore/
    # inside the package in a wheel; beside it in a checkout
    for candidate in (package / "migrations", package.parent / "migrations"):
        if (candidate / "env.py").is_file():
            return candidate
    raise SchemaError("histstore's migration scripts are missing from this installation")


def alembic_config(
    connection: Connection | None = None, url: str | None = None, schema: str | None = None
) -> Config:
    """An Alembic ``Config`` for histstore's scripts, bound to a connection or a URL,
    for the tables in ``schema`` (PostgreSQL; ``None``: the default schema)."""
    cfg = Config()
    cfg.set_main_option("script_location", str(scripts_dir()))
    if url is not None:
        cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    if connection is not None:
        cfg.attributes["connection"] = connection
    if schema is not None:
        cfg.attributes["schema"] = schema
    return cfg


@dataclass(frozen=True)
class SchemaStatus:
    """Where a database's schema stands against the installed scripts."""

    current: str | None
    head: str
    known: bool

    @property
    def up_to_date(self) -> bool:
        return self.current == self.head


def schema_status(connection: Connection, schema: str | None = None) -> SchemaStatus:
    """Read the database's revision (``None`` when histstore was never installed there)."""
    script = ScriptDirectory.from_config(alembic_config())
    head = script.get_current_head()
    assert head is not None
    opts = {"version_table": VERSION_TABLE, "version_table_schema": schema}
    ctx = MigrationContext.configure(connection, opts=opts)
    current = ctx.get_current_revision()
    known = True
    if current is not None:
        try:
            script.get_revision(current)
        except CommandError:
            known = False
    return SchemaStatus(current=current, head=head, known=known)


def upgrade_command(url: str, schema: str | None = None) -> str:
    """The shell command that upgrades the database at ``url``."""
    placed = "" if schema is None else f" --schema {schema}"
    hidden = " (passwords are shown as ***: put yours in their place)" if "***" in url else ""
    return f"histstore migrate --url '{url}'{placed}{hidden}"


def check(
    status: SchemaStatus, url: str, *, schema: str | None = None, can_create: bool = True
) -> None:
    """Raise ``SchemaError`` unless the schema is at the newest revision.

    ``can_create`` false (the role may not create tables there) makes the message say
    who must run the upgrade.
    """
    if not status.known:
        raise SchemaError(
            f"the database schema (revision {status.current}) is newer than this version"
            " of histstore; upgrade the histstore package"
        )
    command_ = upgrade_command(url, schema)
    if not can_create:
        where = f"schema {schema!r}" if schema is not None else "its schema"
        command_ += (
            f" as the database owner (or a role that may create tables in {where}):"
            " this role may not"
        )
    if status.current is None:
        raise SchemaError(f"the database has no histstore schema; create it with: {command_}")
    if not status.up_to_date:
        raise SchemaError(
            f"the database schema (revision {status.current}) is older than this version"
            f" of histstore ({status.head}); upgrade it with: {command_}"
        )


def upgrade(
    connection: Connection,
    schema: str | None = None,
    *,
    lock_timeout: float | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> None:
    """Upgrade the schema to the newest revision, inside the caller's transaction;
    with ``schema`` (PostgreSQL) the tables and the version table live there (the
    schema is created when missing).

    ``lock_timeout`` (PostgreSQL): once the migrators' own lock is held, no lock is
    waited for longer than this many seconds (``SET LOCAL lock_timeout``); a longer
    wait fails the statement, and the caller's transaction must roll back.
    ``progress(done, total)`` is called before the first step and after each one.

    Raises ``SchemaError`` when the database is newer than the installed scripts.
    """
    lock_for_migration(connection)
    if lock_timeout is not None:
        limit_lock_waits(connection, lock_timeout)
    if schema is not None and not inspect(connection).has_schema(schema):
        # Only when missing: CREATE SCHEMA needs the CREATE privilege on the database
        # even with IF NOT EXISTS, which a schema's owner need not have.
        connection.execute(CreateSchema(schema, if_not_exists=True))
    status = schema_status(connection, schema)
    if not status.known:
        check(status, connection.engine.url.render_as_string(hide_password=True))
    if not status.up_to_date:
        _run_upgrade(connection, schema, progress)


def _run_upgrade(
    connection: Connection, schema: str | None, progress: Callable[[int, int], None] | None
) -> None:
    """Run the scripts up to head on ``connection``.

    This drives Alembic's ``MigrationContext`` directly rather than through ``env.py``
    and Alembic's global environment, so it also works from inside a host
    application's own ``env.py`` (whose environment it must not replace). The steps
    come from Alembic's public calls only (``_upgrade_steps``).
    """
    script = ScriptDirectory.from_config(alembic_config())
    counted = {"done": 0, "total": 0}

    def plan(rev: Any, _ctx: Any) -> Any:
        found = _upgrade_steps(script, rev)
        counted["total"] = len(found)
        if progress is not None:
            progress(0, counted["total"])
        return found

    def applied(**_kw: Any) -> None:
        counted["done"] += 1
        if progress is not None:
            progress(counted["done"], counted["total"])

    before = connection.get_execution_options().get("schema_translate_map")
    if schema is not None:
        # The scripts name no schema: SQLAlchemy puts every table they touch in it.
        connection.execution_options(schema_translate_map={None: schema})
    try:
        ctx = MigrationContext.configure(
            connection,
            opts={
                "version_table": VERSION_TABLE,
                "version_table_schema": schema,
                "fn": plan,
                "on_version_apply": [applied],
            },
        )
        with Operations.context(ctx):
            ctx.run_migrations()
    finally:
        if schema is not None:
            connection.execution_options(schema_translate_map=before)


def _upgrade_steps(script: ScriptDirectory, current: Any) -> list[MigrationStep]:
    """The upgrade steps from ``current`` (the database's heads, as Alembic hands them
    to a migration ``fn``) to head, oldest first: the revisions that
    ``ScriptDirectory.iterate_revisions`` walks (newest first, ``implicit_base`` as
    ``alembic upgrade`` walks them), each made a step by ``MigrationStep``."""
    revisions = script.iterate_revisions("head", current, implicit_base=True)
    return [
        MigrationStep.upgrade_from_script(script.revision_map, revision)
        for revision in reversed(list(revisions))
    ]


# ---------------------------------------------------------------------------- offline


BASE = "base"
"""The starting point of an offline script for a database without histstore's schema."""


def revisions() -> list[str]:
    """Every revision id of the installed scripts, oldest first."""
    script = ScriptDirectory.from_config(alembic_config())
    return [rev.revision for rev in reversed(list(script.walk_revisions()))]


def offline_script(url: str, *, start: str = BASE, schema: str | None = None) -> str:
    """The SQL of the steps from revision ``start`` (``"base"``: no schema) to head, for
    the kind of database ``url`` names (Alembic's offline mode: nothing is connected to).

    At head it is one SQL comment saying so. A step that fills data in Python online
    (``offline_follow_up`` in its script, e.g. ``histstore reindex``) cannot do so here:
    the script ends with a comment naming the command to run once it has been applied.
    Nothing needs doing after a script from ``"base"`` (there was no data).

    Raises:
        ValueError: ``start`` is not ``"base"`` nor a known revision (the message lists
            them).
    """
    known = revisions()
    if start != BASE and start not in known:
        raise ValueError(
            f"unknown revision {start!r}; this histstore knows: {BASE} (no schema yet),"
            f" {', '.join(known)} (the newest)"
        )
    head = known[-1]
    if start == head:
        return (
            f"-- The database is at revision {head}, the newest this histstore knows:"
            " nothing to upgrade.\n"
        )
    cfg = alembic_config(url=url, schema=schema)
    buffer = io.StringIO()
    cfg.output_buffer = buffer
    command.upgrade(cfg, "head" if start == BASE else f"{start}:head", sql=True)
    script = buffer.getvalue()
    if start == BASE:
        return script
    scripts = ScriptDirectory.from_config(cfg)
    placed = "" if schema is None else f" --schema {schema}"
    for rev in reversed(list(scripts.iterate_revisions("head", start))):
        follow_up = getattr(rev.module, "offline_follow_up", None) if rev is not None else None
        if follow_up:
            script += (
                f"-- Follow-up: revision {rev.revision} fills in data for the rows already"
                " stored, which SQL alone cannot compute.\n"
                "-- Once this script has been applied, run (safe while the store is in use):\n"
                f"--   {follow_up} --url <this database>{placed}\n\n"
            )
    return script


# ---------------------------------------------------------------------------- online


@dataclass(frozen=True)
class UpgradeOptions:
    """How an online upgrade runs: ``lock_timeout`` seconds per lock wait (PostgreSQL;
    SQLite waits the connection's busy timeout), and a ``progress(done, total)``
    callback of the steps."""

    lock_timeout: float = LOCK_TIMEOUT
    progress: Callable[[int, int], None] | None = None


upgrade_options: ContextVar[UpgradeOptions | None] = ContextVar(
    "histstore_upgrade_options", default=None
)
"""The options of the upgrades run in this context (``connect(..., migrate=True)`` has no
parameter for them; ``admin.migrate`` sets them around its ``connect``)."""


def is_lock_failure(exc: BaseException) -> bool:
    """Whether ``exc`` is a statement that could not get its locks, rolled back by the
    database: PostgreSQL's lock timeout or a deadlock, SQLite's busy or locked."""
    seen: BaseException | None = exc
    for _ in range(4):  # the SQLAlchemy error, its DBAPI adapter, the driver's own
        if seen is None:
            return False
        code = getattr(seen, "sqlstate", None) or getattr(seen, "pgcode", None)
        if code in _LOCK_SQLSTATES:
            return True
        if isinstance(seen, sqlite3.OperationalError):
            return getattr(seen, "sqlite_errorcode", 0) & 0xFF in _SQLITE_BUSY_CODES
        orig = getattr(seen, "orig", None)
        seen = orig if isinstance(orig, BaseException) else seen.__cause__
    return False


async def upgrade_retrying(
    engine: AsyncEngine,
    options: Mapping[str, Any],
    status: SchemaStatus,
    schema: str | None = None,
    how: UpgradeOptions | None = None,
    refused_wait: float = DEFAULT_REFUSED_WAIT,
) -> None:
    """Upgrade in one transaction on ``engine`` (with execution ``options``); when it
    cannot get its locks, roll back and try again after each of ``RETRY_DELAYS``. A
    connection the server refuses is waited for up to ``refused_wait`` seconds
    (``_storage.refusals``).

    ``status`` is where the schema stood when the caller looked (for the message).

    Raises:
        DatabaseFailure: it never got its locks; nothing was changed, and the message
            says it is safe to run again.
        SchemaError, HistStoreError: as ``upgrade``; database errors other than lock
            failures are raised as they are, for the caller to translate.
    """
    how = how or upgrade_options.get() or UpgradeOptions()
    started = time.monotonic()
    backoff = Backoff(refused_wait)
    last: BaseException | None = None
    for pause in (*RETRY_DELAYS, None):
        try:
            with_options = engine.execution_options(**options)
            async with connection(with_options, backoff) as conn, conn.begin():
                await conn.run_sync(
                    upgrade, schema, lock_timeout=how.lock_timeout, progress=how.progress
                )
        except DATABASE_ERRORS as exc:
            if not is_lock_failure(exc):
                raise
            last = exc
        else:
            return
        if pause is not None:
            await asyncio.sleep(pause)
    assert last is not None
    attempts = len(RETRY_DELAYS) + 1
    was = f"revision {status.current}" if status.current else "no schema"
    raise DatabaseFailure(
        f"upgrading the schema from {was} to {status.head} could not get its"
        f" locks in {attempts} attempts over {time.monotonic() - started:.0f} s"
        f" ({reason(last)}): other sessions hold locks on histstore's tables (live"
        " writers or long transactions). Nothing was changed; it is safe to run again"
        " (when the database is quieter, or with a longer lock timeout)"
    ) from last
