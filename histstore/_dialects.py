"""What differs between the databases, in one place.

Everything else is generic SQLAlchemy Core. Both backends support ``INSERT ... ON
CONFLICT`` (SQLite 3.24+, Postgres 9.5+) with the same SQLAlchemy API, ``RETURNING``
(SQLite 3.35+), and partial indexes; what remains is which ``insert`` construct to use,
how a transaction takes the conversation's write lock, and how migrations serialize.
"""

from __future__ import annotations

from typing import Any, Literal

from sqlalchemy import Table, text
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection, Dialect
from sqlalchemy.sql import Select

from ._engine import BEGIN_OPTION

__all__ = ["Mode", "for_update", "insert", "lock_for_migration", "mode_options"]

Mode = Literal["read", "snapshot", "write"]


def mode_options(dialect: Dialect, mode: Mode) -> dict[str, Any]:
    """Execution options for a transaction of one kind.

    ``read``: a single statement, atomic by itself, so no transaction is begun (on
    Postgres ``AUTOCOMMIT`` saves the BEGIN and COMMIT round trips). ``snapshot``:
    several reads that must agree (SQLite: a deferred BEGIN, which in WAL mode reads one
    snapshot; Postgres: REPEATABLE READ, where a read-only transaction never fails).
    ``write``: SQLite takes the write lock up front (``BEGIN IMMEDIATE``, see
    ``_engine``); Postgres writes at READ COMMITTED and locks the conversation row.
    """
    if dialect.name == "sqlite":
        begin = {"read": "", "snapshot": "BEGIN", "write": "BEGIN IMMEDIATE"}[mode]
        return {BEGIN_OPTION: begin}
    return {
        "read": {"isolation_level": "AUTOCOMMIT"},
        "snapshot": {"isolation_level": "REPEATABLE READ"},
        "write": {},
    }[mode]


def insert(dialect: Dialect, table: Table) -> Any:
    """An INSERT that supports ``on_conflict_do_nothing/do_update`` on this dialect."""
    if dialect.name == "sqlite":
        return sqlite.insert(table)
    if dialect.name == "postgresql":
        return postgresql.insert(table)
    raise NotImplementedError(f"histstore does not support the {dialect.name!r} dialect")


def for_update(dialect: Dialect, stmt: Select[Any]) -> Select[Any]:
    """Lock the selected rows for the rest of the transaction.

    On Postgres a ``FOR UPDATE`` row lock. On SQLite nothing is needed: write
    transactions start with ``BEGIN IMMEDIATE`` (see ``_engine``) and so already hold
    the database's only write lock.
    """
    return stmt if dialect.name == "sqlite" else stmt.with_for_update()


def lock_for_migration(connection: Connection) -> None:
    """Keep concurrent migrators apart for the rest of the transaction.

    Postgres: a transaction-scoped advisory lock (two processes connecting with
    ``migrate=True`` would otherwise both try to create the tables). SQLite: the
    transaction began with ``BEGIN IMMEDIATE`` and already holds the write lock.
    """
    if connection.dialect.name == "postgresql":
        connection.execute(text("SELECT pg_advisory_xact_lock(7458215530061727291)"))
