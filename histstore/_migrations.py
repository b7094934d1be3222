"""Alembic glue: where the migration scripts are, what revision a database is at, upgrades.

The scripts live in ``migrations/`` at the top of the source tree and are shipped inside
the wheel as ``histstore/migrations``; both layouts are looked for.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util.exc import CommandError
from sqlalchemy.engine import Connection

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


def alembic_config(connection: Connection | None = None, url: str | None = None) -> Config:
    """An Alembic ``Config`` for histstore's scripts, bound to a connection or a URL."""
    cfg = Config()
    cfg.set_main_option("script_location", str(scripts_dir()))
    if url is not None:
        cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    if connection is not None:
        cfg.attributes["connection"] = connection
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


def schema_status(connection: Connection) -> SchemaStatus:
    """Read the database's revision (``None`` when histstore was never installed there)."""
    script = ScriptDirectory.from_config(alembic_config())
    head = script.get_current_head()
    assert head is not None
    ctx = MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE})
    current = ctx.get_current_revision()
    known = True
    if current is not None:
        try:
            script.get_revision(current)
        except CommandError:
            known = False
    return SchemaStatus(current=current, head=head, known=known)


def upgrade_command(url: str) -> str:
    """The shell command that upgrades the database at ``url``."""
    return f"histstore migrate --url '{url}'"


def check(status: SchemaStatus, url: str) -> None:
    """Raise ``SchemaError`` unless the schema is at the newest revision."""
    if not status.known:
        raise SchemaError(
            f"the database schema (revision {status.current}) is newer than this version"
            " of histstore; upgrade the histstore package"
        )
    if status.current is None:
        raise SchemaError(
            f"the database has no histstore schema; create it with: {upgrade_command(url)}"
        )
    if not status.up_to_date:
        raise SchemaError(
            f"the database schema (revision {status.current}) is older than this version"
            f" of histstore ({status.head}); upgrade it with: {upgrade_command(url)}"
        )


def upgrade(connection: Connection) -> None:
    """Upgrade the schema to the newest revision, inside the caller's transaction.

    Raises ``SchemaError`` when the database is newer than the installed scripts.
    """
    lock_for_migration(connection)
    status = schema_status(connection)
    if not status.known:
        check(status, connection.engine.url.render_as_string(hide_password=True))
    if not status.up_to_date:
        command.upgrade(alembic_config(connection), "head")
