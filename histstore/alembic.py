"""Running histstore beside a host application's own Alembic migrations.

A host whose database also holds histstore's tables wants its ``alembic check`` and
autogenerate to leave them alone, and may want its own ``alembic upgrade`` to bring
histstore's schema up too. In the host's ``env.py``::

    import histstore.alembic

    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        include_name=histstore.alembic.include_name,      # autogenerate skips histstore
        include_object=histstore.alembic.include_object,
    )
    with context.begin_transaction():
        context.run_migrations()
    histstore.alembic.upgrade(connection)  # histstore's scripts, its own version table

histstore's revisions are recorded in its own version table
(``histstore_alembic_version``), never in the host's, so each side upgrades on its own.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.engine import Connection

from ._storage.migrations import upgrade as _upgrade
from ._storage.schema import VERSION_TABLE as _VERSION_TABLE

__all__ = ["VERSION_TABLE", "include_name", "include_object", "is_histstore_name", "upgrade"]

VERSION_TABLE = _VERSION_TABLE
"""The name of histstore's own Alembic version table, apart from the host's."""

_PREFIX = "histstore_"


def is_histstore_name(name: str | None) -> bool:
    """Whether a table (or index, or the version table) is histstore's."""
    return name is not None and (name.startswith(_PREFIX) or name.startswith("ix_" + _PREFIX))


def include_name(name: str | None, type_: str, parent_names: Any) -> bool:
    """For the host's ``context.configure(include_name=...)``: false for histstore's
    tables (the version table and any helper tables included) and their indexes."""
    if type_ in ("table", "index", "unique_constraint", "foreign_key_constraint"):
        return not is_histstore_name(name)
    if type_ == "column" and isinstance(parent_names, dict):
        return not is_histstore_name(parent_names.get("table_name"))
    return True


def include_object(
    obj: Any, name: str | None, type_: str, reflected: bool, compare_to: Any
) -> bool:
    """For the host's ``context.configure(include_object=...)``: false for histstore's
    tables and everything that belongs to them."""
    if type_ == "table":
        return not is_histstore_name(name)
    table = getattr(obj, "table", None)
    if table is not None and is_histstore_name(getattr(table, "name", None)):
        return False
    return not is_histstore_name(name)


def upgrade(connection: Connection, schema: str | None = None) -> None:
    """Upgrade histstore's tables to the newest revision on ``connection`` (a sync
    SQLAlchemy connection, e.g. the one the host's ``env.py`` migrates with), inside its
    transaction, recording the revision in histstore's own version table; with
    ``schema`` (PostgreSQL) the tables live in that schema."""
    _upgrade(connection, schema)
