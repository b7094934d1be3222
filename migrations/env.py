"""Alembic environment for histstore's tables.

Used three ways: by histstore itself (``connect()`` and ``histstore migrate`` hand over a
connection in ``config.attributes["connection"]``), offline (``--sql``), and by the
``alembic`` command from a checkout, with the URL from ``-x url=...`` or HISTSTORE_URL
(and ``-x pooler=transaction`` behind a transaction-mode pooler).
Only tables named ``histstore_*`` are considered, so the migrations can share a database
(and an ``alembic check``) with a host application's own.
"""

from __future__ import annotations

import asyncio
from typing import Any

from alembic import context
from sqlalchemy import URL, make_url
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

from histstore._storage.engine import install_pooler_hooks, resolve_target, transaction_pooler_args
from histstore._storage.pg_url import split
from histstore._storage.schema import VERSION_TABLE, described, metadata

config = context.config


def _include_name(name: str | None, type_: str, parent_names: Any) -> bool:
    if type_ == "table" and not (name is not None and name.startswith("histstore_")):
        return False
    return described(name, type_)


def _schema() -> str | None:
    """The PostgreSQL schema for histstore's tables: ``connect(schema=...)``, ``histstore
    migrate --schema`` or ``-x schema=...``; ``None`` for the default one."""
    schema = config.attributes.get("schema") or context.get_x_argument(as_dictionary=True).get(
        "schema"
    )
    return str(schema) if schema else None


def _options() -> dict[str, Any]:
    return {
        "target_metadata": metadata,
        "version_table": VERSION_TABLE,
        "version_table_schema": _schema(),
        "include_name": _include_name,
        "compare_type": True,
    }


def _url() -> str:
    url = context.get_x_argument(as_dictionary=True).get("url") or config.get_main_option(
        "sqlalchemy.url"
    )
    resolved = resolve_target(url or None)
    if not isinstance(resolved, URL):
        raise TypeError("the migration environment needs a database URL")
    return resolved.render_as_string(hide_password=False)


def _create_schema_if_missing(schema: str) -> str:
    """SQL that creates ``schema`` only when it does not exist yet.

    Not ``CREATE SCHEMA IF NOT EXISTS``: PostgreSQL checks the CREATE privilege on the
    database before it looks for the schema, and the role a DBA applies a reviewed
    script as may own the schema without holding that privilege.
    """
    literal = "'" + schema.replace("'", "''") + "'"
    tag = "$histstore$"
    while tag in literal:
        tag = tag[:-1] + "_$"
    # An offline script has no bound parameters: the name is a quoted string literal.
    return (
        f"DO {tag} BEGIN IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_namespace WHERE nspname"  # noqa: S608
        f" = {literal}) THEN EXECUTE format('CREATE SCHEMA %I', {literal}); END IF; END {tag}"
    )


def run_offline() -> None:
    context.configure(url=_url(), literal_binds=True, **_options())
    schema = _schema()
    with context.begin_transaction():
        if schema is not None:
            # Unqualified names in the scripts resolve into the schema until the script's
            # one transaction ends: LOCAL, so a session the script ran in (psql through
            # a transaction-mode pooler: a server session others go on to use) keeps
            # its own search_path.
            quoted = '"' + schema.replace('"', '""') + '"'
            context.execute(_create_schema_if_missing(schema))
            context.execute(f"SET LOCAL search_path TO {quoted}")
        context.run_migrations()


def _run(connection: Connection) -> None:
    schema = _schema()
    before = connection.get_execution_options().get("schema_translate_map")
    if schema is not None:
        # The scripts name no schema: SQLAlchemy puts every table they touch in it.
        connection.execution_options(schema_translate_map={None: schema})
    try:
        context.configure(connection=connection, **_options())
        with context.begin_transaction():
            context.run_migrations()
    finally:
        if schema is not None:
            connection.execution_options(schema_translate_map=before)


async def _run_async() -> None:
    url, connect_args = split(make_url(_url()))  # libpq parameters -> asyncpg's arguments
    pooled = context.get_x_argument(as_dictionary=True).get("pooler") == "transaction"
    if pooled:  # -x pooler=transaction, as connect()'s
        connect_args.update(transaction_pooler_args())
    engine = create_async_engine(url, poolclass=NullPool, connect_args=connect_args)
    if pooled:
        install_pooler_hooks(engine)
    try:
        async with engine.begin() as conn:
            if conn.dialect.name == "sqlite":
                # SQLite's driver runs DDL outside any transaction unless one is begun:
                # a revision that fails would leave the ones before it half undone.
                await conn.exec_driver_sql("BEGIN")
            await conn.run_sync(_run)
    finally:
        await engine.dispose()


def run_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
    else:
        asyncio.run(_run_async())


if context.is_offline_mode():
    run_offline()
else:
    run_online()
