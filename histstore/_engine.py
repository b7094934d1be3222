"""From a connect() target to a configured ``AsyncEngine``.

SQLite needs two things the driver does not do by itself:

* Write transactions must take the database's write lock when they begin
  (``BEGIN IMMEDIATE``). With a plain (deferred) ``BEGIN``, a transaction that first
  reads and then writes upgrades its lock half way; when another connection wrote in
  between, SQLite cannot wait for the lock and fails at once with SQLITE_BUSY, whatever
  the busy timeout (https://www.sqlite.org/lang_transaction.html, "BEGIN IMMEDIATE";
  https://www.sqlite.org/c3ref/busy_timeout.html). Taking the lock up front makes
  writers queue on the busy timeout instead. Reads of several statements begin
  deferred (one consistent snapshot); single-statement reads need no BEGIN. In WAL
  mode neither waits for writers.
* Per-connection settings: ``busy_timeout`` and ``synchronous`` (FULL unless
  ``durability="process"``, https://www.sqlite.org/pragma.html#pragma_synchronous).

Both happen in one ``begin`` event hook (SQLAlchemy's documented way to emit our own
BEGIN for pysqlite/aiosqlite), driven by execution options the store sets on the
connections it opens. A borrowed engine's other users are left alone: a connection
without those options begins as it always did.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from sqlalchemy import URL, event, make_url, pool
from sqlalchemy.engine import AdaptedConnection, Connection
from sqlalchemy.exc import ArgumentError, NoSuchModuleError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from ._errors import HistStoreError

__all__ = [
    "BEGIN_OPTION",
    "DEFAULT_FILE",
    "SqliteSettings",
    "install_hooks",
    "is_memory_url",
    "make_engine",
    "resolve_target",
    "sqlite_setup",
]

DEFAULT_FILE = "histstore.db"
ENV_VAR = "HISTSTORE_URL"
BEGIN_OPTION = "histstore_begin"
SETTINGS_OPTION = "histstore_sqlite"
SETUP_KEY = "histstore_ready"
"""Key in a pooled connection's ``info``: the SQLite settings applied to it."""


@dataclass(frozen=True)
class SqliteSettings:
    """Per-connection SQLite settings the begin hook applies once per connection."""

    busy_timeout_ms: int
    synchronous: str  # "FULL" or "NORMAL"


def resolve_target(target: object) -> URL | AsyncEngine:
    """Turn a connect() target into a URL with an async driver, or the given engine.

    Raises:
        ValueError: the target is not a path, URL or ``AsyncEngine``, or names a
            database histstore does not support.
    """
    if target is None:
        target = os.environ.get(ENV_VAR) or DEFAULT_FILE
    if isinstance(target, AsyncEngine):
        return target
    if isinstance(target, os.PathLike):
        return URL.create("sqlite+aiosqlite", database=os.fspath(target))
    if isinstance(target, str):
        if target == ":memory:":
            return URL.create("sqlite+aiosqlite")
        if "://" not in target:
            return URL.create("sqlite+aiosqlite", database=target)
        try:
            url = make_url(target)
        except ArgumentError:
            raise ValueError("not a valid database URL") from None
    elif isinstance(target, URL):
        url = target
    else:
        raise ValueError(
            "connect() takes a file path, a database URL or an AsyncEngine,"
            f" not {type(target).__name__}"
        )
    backend, _, driver = url.drivername.partition("+")
    if backend == "postgres":
        backend = "postgresql"
    wanted = _DRIVERS.get(backend)
    if wanted is None:
        raise ValueError(f"histstore supports sqlite and postgresql URLs, not {backend!r}")
    if driver and driver != wanted:
        raise ValueError(
            f"histstore runs {backend} on {wanted}, not {driver}: use {backend}:// or"
            f" {backend}+{wanted}://"
        )
    return url.set(drivername=f"{backend}+{wanted}")


_DRIVERS = {"sqlite": "aiosqlite", "postgresql": "asyncpg"}
"""The one async driver histstore runs each database on."""


def is_memory_url(url: URL) -> bool:
    """True for an SQLite URL naming a private in-memory database."""
    db = url.database
    return url.get_backend_name() == "sqlite" and (
        not db or db == ":memory:" or url.query.get("mode") == "memory"
    )


def make_engine(url: URL, *, busy_timeout: float) -> AsyncEngine:
    """Create the engine a store owns for ``url``.

    Raises:
        HistStoreError: the URL's driver is not installed (the message says which extra
            installs it).
    """
    # The store always ends its transactions before giving a connection back, so the
    # pool's extra rollback on return would only cost a round trip. Last-in-first-out
    # keeps reusing the warmest connections; 20 kept connections serve a busy agent
    # service without opening and closing connections all the time.
    kwargs: dict[str, Any] = {
        "hide_parameters": True,
        "pool_reset_on_return": None,
        "pool_use_lifo": True,
    }
    if not is_memory_url(url):
        kwargs.update(pool_size=20, max_overflow=20, pool_timeout=busy_timeout)
    if url.get_backend_name() == "sqlite":
        kwargs["connect_args"] = {"timeout": busy_timeout}
        if is_memory_url(url):
            # One connection holds the whole database: tasks queue for it, and it is
            # never closed while the store lives.
            kwargs.update(
                poolclass=pool.AsyncAdaptedQueuePool,
                pool_size=1,
                max_overflow=0,
                pool_timeout=busy_timeout,
                pool_recycle=-1,
            )
    try:
        return create_async_engine(url, **kwargs)
    except (ImportError, NoSuchModuleError) as exc:
        pg = url.get_backend_name() == "postgresql"
        hint = " (pip install 'histstore[postgres]')" if pg else ""
        raise HistStoreError(f"the driver for {url.drivername} is not installed{hint}") from exc
    except ArgumentError as exc:
        raise ValueError(f"cannot open {url.drivername} URL: {exc}") from None


def sqlite_setup(settings: SqliteSettings) -> list[str]:
    """The statements that apply ``settings`` to one SQLite connection."""
    if settings.synchronous not in ("FULL", "NORMAL"):
        raise ValueError("synchronous must be FULL or NORMAL")
    return [
        f"PRAGMA busy_timeout = {int(settings.busy_timeout_ms):d}",
        f"PRAGMA synchronous = {settings.synchronous}",
    ]


def _on_begin(conn: Connection) -> None:
    """Begin the transaction of a histstore connection to SQLite (see module docstring)."""
    opts = conn.get_execution_options()
    settings: SqliteSettings | None = opts.get(SETTINGS_OPTION)
    if settings is None:
        return
    info = conn.info
    if info.get(SETUP_KEY) != settings:
        cursor = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
        try:
            for sql in sqlite_setup(settings):
                cursor.execute(sql)
        finally:
            cursor.close()
        info[SETUP_KEY] = settings
    begin = opts.get(BEGIN_OPTION)
    if begin:
        dbapi = conn.connection.dbapi_connection
        if isinstance(dbapi, AdaptedConnection):
            # One trip to the driver's thread instead of three (cursor, execute, close).
            dbapi.run_async(lambda driver: driver.execute(begin))
        else:
            conn.exec_driver_sql(begin)


def install_hooks(engine: AsyncEngine) -> None:
    """Register the SQLite begin hook on ``engine`` (once; other dialects need none)."""
    sync = engine.sync_engine
    if sync.dialect.name == "sqlite" and not event.contains(sync, "begin", _on_begin):
        event.listen(sync, "begin", _on_begin)
