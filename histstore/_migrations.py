"""Alembic glue: where the migration scripts are, what revision a database is at, upgrades.

The scripts live in ``migrations/`` at the top of the source tree and are shipped inside
the wheel as ``histstore/migrations``; both layouts are looked for.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.operations import Operations
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util.exc import CommandError
from sqlalchemy.engine import Connection
from sqlalchemy.schema import CreateSchema

from ._dialects import lock_for_migration
from ._errors import SchemaError
from ._schema import VERSION_TABLE

__all__ = ["SchemaStatus", "alembic_config", "schema_status", "scripts_dir", "upgrade"]


def scripts_dir() -> Path:
    """The folder holding ``env.py`` and ``versions/``."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "migrations", here.parent / "migrations"):
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
    return f"histstore migrate --url '{url}'{placed}"


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


def upgrade(connection: Connection, schema: str | None = None) -> None:
    """Upgrade the schema to the newest revision, inside the caller's transaction;
    with ``schema`` (PostgreSQL) the tables and the version table live there (the
    schema is created when missing).

    Raises ``SchemaError`` when the database is newer than the installed scripts.
    """
    lock_for_migration(connection)
    if schema is not None:
        connection.execute(CreateSchema(schema, if_not_exists=True))
    status = schema_status(connection, schema)
    if not status.known:
        check(status, connection.engine.url.render_as_string(hide_password=True))
    if not status.up_to_date:
        _run_upgrade(connection, schema)


def _run_upgrade(connection: Connection, schema: str | None) -> None:
    """Run the scripts up to head on ``connection``.

    This drives Alembic's ``MigrationContext`` directly rather than through ``env.py``
    and Alembic's global environment, so it also works from inside a host
    application's own ``env.py`` (whose environment it must not replace). Alembic has
    no public call for "the steps from here to head"; where its ``_upgrade_revs`` is
    missing, the ``alembic`` command's own upgrade runs instead (outside a host's env).
    """
    script = ScriptDirectory.from_config(alembic_config())
    steps = getattr(script, "_upgrade_revs", None)
    if steps is None:  # pragma: no cover - depends on the installed Alembic
        command.upgrade(alembic_config(connection, schema=schema), "head")
        return
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
                "fn": lambda rev, _ctx: steps("head", rev),
            },
        )
        with Operations.context(ctx):
            ctx.run_migrations()
    finally:
        if schema is not None:
            connection.execution_options(schema_translate_map=before)
