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

import asyncio
import os
import sqlite3
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, unquote

from sqlalchemy import URL, event, make_url, pool
from sqlalchemy.engine import AdaptedConnection, Connection
from sqlalchemy.exc import ArgumentError, DisconnectionError, NoSuchModuleError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from .._errors import HistStoreError
from .pg_driver import (
    abandon,
    close_without_waiting,
    never_switch_jit,
    terminate_without_waiting,
)
from .pg_url import multi_host, normalize, split
from .pool_options import PoolOptions, pool_arguments
from .sqlite_driver import restore_on_checkin
from .sqlite_files import create_private
from .statements.kinds import is_sqlite

__all__ = [
    "BEGIN_OPTION",
    "DEFAULT_FILE",
    "POOLERS",
    "SqliteSettings",
    "install_hooks",
    "install_pooler_hooks",
    "is_memory_url",
    "make_engine",
    "plain_sqlite_url",
    "read_only_sqlite_url",
    "resolve_target",
    "sqlite_setup",
    "transaction_pooler_args",
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
            url = make_url(multi_host(target))
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
    return normalize(url.set(drivername=f"{backend}+{wanted}"))


_DRIVERS = {"sqlite": "aiosqlite", "postgresql": "asyncpg"}
"""The one async driver histstore runs each database on."""


def is_memory_url(url: URL) -> bool:
    """True for an SQLite URL naming a private in-memory database."""
    db = url.database
    return url.get_backend_name() == "sqlite" and (
        not db or db == ":memory:" or url.query.get("mode") == "memory"
    )


_RO_MODES = ({"mode": "ro"}, {"mode": "ro", "immutable": "1"})
"""SQLite's read-only opens, in the order tried: ``mode=ro`` shares the file with its
writers (in WAL mode it needs the ``-shm`` file, existing or creatable);
``immutable=1`` reads a file that nobody can change (a read-only filesystem, no
``-shm``), without locks."""


def read_only_sqlite_url(url: URL) -> URL:
    """The URL that opens the SQLite file of ``url`` read-only (a ``file:`` URI).

    ``mode=ro`` when the file can be read that way, else ``immutable=1`` (only where
    ``mode=ro`` cannot read it: a read-only directory or filesystem without the WAL
    index). Probes the file with a blocking open: call it off the event loop.

    Raises:
        HistStoreError: the file does not exist or cannot be read either way.
    """
    path = os.path.abspath(url.database or "")
    if not os.path.isfile(path):
        raise HistStoreError(f"no SQLite database at {path} to open read-only")
    uri = "file:" + quote(path)
    last: sqlite3.Error | None = None
    for mode in _RO_MODES:
        query = "&".join(f"{k}={v}" for k, v in mode.items())
        try:
            conn = sqlite3.connect(f"{uri}?{query}", uri=True)
            try:
                conn.execute("SELECT count(*) FROM sqlite_master").fetchall()
            finally:
                conn.close()
        except sqlite3.Error as exc:
            last = exc
            continue
        return URL.create(url.drivername, database=uri, query={**mode, "uri": "true"})
    raise HistStoreError(f"cannot open {path} read-only: {last}") from last


def plain_sqlite_url(url: URL) -> URL:
    """``url`` as the user gave it: a read-only ``file:`` URI back to its file path."""
    db = url.database or ""
    if url.get_backend_name() != "sqlite" or url.query.get("uri") != "true":
        return url
    if not db.startswith("file:"):
        return url
    return URL.create(url.drivername, database=unquote(db[len("file:") :]))


POOLERS = (None, "transaction")
"""The values of ``connect(pooler=...)``."""


def _unnamed() -> str:
    return ""


def transaction_pooler_args() -> dict[str, Any]:
    """asyncpg's connect arguments behind a transaction-mode pooler (PgBouncer's
    ``pool_mode=transaction``), where consecutive transactions, and even the protocol
    messages of one statement outside a transaction, may run on different server
    sessions.

    Named prepared statements live in a server session, so none are made: asyncpg's own
    statement cache is off, under which it prepares every statement unnamed and sends
    the Parse again with the Bind and Execute (asyncpg ``Connection._get_statement``),
    so each execution is self-contained on whatever session runs it. SQLAlchemy's
    asyncpg dialect names the statements it prepares and caches them: its cache is off
    and the name it asks for is the empty one, the unnamed statement, which asyncpg then
    treats the same way (asyncpg's FAQ on pgbouncer; SQLAlchemy's asyncpg dialect docs,
    "Prepared Statement Name with PGBouncer"). Use with ``install_pooler_hooks``.

    The client encoding asyncpg asks for is spelled the way the server reports it
    (``UTF8``, not asyncpg's default ``utf-8``): PgBouncer compares the two spellings and
    otherwise sends a ``SET client_encoding`` to the server before every transaction.
    """
    return {
        "statement_cache_size": 0,
        "prepared_statement_cache_size": 0,
        "prepared_statement_name_func": _unnamed,
        "server_settings": {"client_encoding": "UTF8"},
    }


_TYPES_SQL = (
    "SELECT NULL::int4[], NULL::int8[], NULL::text[], NULL::timestamptz[],"
    " NULL::float8[], NULL::bytea[], NULL::bool[]"
)
"""Every array type histstore binds or reads (and a few more): asyncpg looks each up in
the catalog the first time a connection meets it."""


async def _settle_pooled(conn: Any) -> None:
    """Make a new asyncpg connection change no session setting (see ``install_pooler_hooks``)."""
    transaction = conn.transaction()
    try:
        await transaction.start()
        await conn.fetch(_TYPES_SQL)
        await transaction.commit()
    except asyncio.CancelledError:
        # Its call was given up: closing the connection would first wait for the
        # cancel request to be answered (seconds on a server that does not answer).
        # (After an error the connection is closed unused, which rolls back.)
        await abandon(conn)
        raise
    never_switch_jit(conn)


def _on_pooled_connect(dbapi_connection: Any, record: Any) -> None:
    dbapi_connection.run_async(_settle_pooled)


def install_pooler_hooks(engine: AsyncEngine) -> None:
    """Keep ``engine``'s new connections from leaving session state behind a
    transaction-mode pooler (once per engine; with ``transaction_pooler_args``).

    asyncpg looks up a type it meets for the first time (an array's) with JIT turned
    off by a session-level ``set_config`` and set back by a later statement; behind the
    pooler those can run on two server sessions, leaving one with JIT off for the
    other clients that use it. So each new connection looks up histstore's types in one
    transaction (one session, where JIT ends as it was), and asyncpg is then told the
    server has no JIT to switch (its private ``_server_caps``; when that is missing,
    nothing is changed): a type met later is looked up with the server's own setting,
    slower (JIT compiles the lookup) but leaving nothing behind.
    """
    sync = engine.sync_engine
    if not event.contains(sync, "connect", _on_pooled_connect):
        event.listen(sync, "connect", _on_pooled_connect)


def make_engine(
    url: URL,
    *,
    busy_timeout: float,
    read_only: bool = False,
    pooler: str | None = None,
    sizes: PoolOptions | None = None,
) -> AsyncEngine:
    """Create the engine a store owns for ``url``.

    ``read_only``: PostgreSQL sessions start with ``default_transaction_read_only``
    (a guard behind the store's own refusal of writes); an SQLite URL must already be
    ``read_only_sqlite_url``'s. Otherwise an SQLite file that does not exist yet is
    created here, readable by its owner only (``sqlite_files.create_private``).

    ``pooler``: ``"transaction"`` for a PostgreSQL server reached through a
    transaction-mode pooler (see ``transaction_pooler_args``); then no session-level
    setting is sent at startup either (a pooler refuses or drops them).

    ``sizes``: the pool's size and overflow (``_storage.pool_options``; not in memory).

    Raises:
        HistStoreError: the URL's driver is not installed (the message says which extra
            installs it).
    """
    # The store always ends its transactions before giving a connection back, so the
    # pool's extra rollback on return would only cost a round trip. Last-in-first-out
    # keeps reusing the warmest connections. The pool's size: ``_storage.pool_options``.
    kwargs: dict[str, Any] = {
        "hide_parameters": True,
        "pool_reset_on_return": None,
        "pool_use_lifo": True,
    }
    if not is_memory_url(url):
        sqlite = url.get_backend_name() == "sqlite"
        kwargs.update(pool_arguments(sizes or PoolOptions(), sqlite=sqlite))
        kwargs["pool_timeout"] = busy_timeout
    if url.get_backend_name() == "sqlite":
        kwargs["connect_args"] = {"timeout": busy_timeout, "check_same_thread": False}
        if not read_only and not is_memory_url(url) and not url.query:
            create_private(url.database or "")  # 0600, before SQLite makes it (sqlite_files)
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
    if pooler not in POOLERS:
        raise ValueError("pooler must be None or 'transaction'")
    if pooler is not None and url.get_backend_name() != "postgresql":
        raise ValueError("pooler= is for PostgreSQL behind a pooler, not for SQLite")
    if read_only and pooler is None and url.get_backend_name() == "postgresql":
        connect_args = kwargs.setdefault("connect_args", {})
        connect_args.setdefault("server_settings", {})["default_transaction_read_only"] = "on"
    if pooler == "transaction":
        kwargs.setdefault("connect_args", {}).update(transaction_pooler_args())
    # The libpq parameters of a postgresql:// URL become asyncpg's connect arguments.
    url, kwargs["connect_args"] = split(url, kwargs.get("connect_args", {}))
    try:
        engine = create_async_engine(url, **kwargs)
    except (ImportError, NoSuchModuleError) as exc:
        pg = url.get_backend_name() == "postgresql"
        hint = " (pip install 'histstore[postgres]')" if pg else ""
        raise HistStoreError(f"the driver for {url.drivername} is not installed{hint}") from exc
    except ArgumentError as exc:
        raise ValueError(f"cannot open {url.drivername} URL: {exc}") from None
    if pooler == "transaction":
        install_pooler_hooks(engine)
    if url.get_backend_name() == "postgresql":
        event.listen(engine.sync_engine.pool, "checkout", _drop_closed)
        event.listen(engine.sync_engine, "close", close_without_waiting)
        dialect: Any = engine.sync_engine.dialect  # this engine's own dialect object
        dialect.do_terminate = terminate_without_waiting
    return engine


def _drop_closed(dbapi_connection: Any, record: Any, proxy: Any) -> None:
    """Make the pool replace a connection the server closed while it sat idle in the
    pool (a restart, an idle timeout), before anything is sent on it: the driver has
    seen it close, so this costs no round trip (SQLAlchemy's documented way: raising
    ``DisconnectionError`` from a checkout hook; the executor's own connections are
    checked the same way in ``Executor.checkout``)."""
    driver = getattr(dbapi_connection, "driver_connection", None)
    is_closed = getattr(driver, "is_closed", None)
    if callable(is_closed) and is_closed():
        raise DisconnectionError("the server closed the connection while it was idle")


def sqlite_setup(settings: SqliteSettings) -> list[str]:
    """The statements that apply ``settings`` to one SQLite connection."""
    if settings.synchronous not in ("FULL", "NORMAL"):
        raise ValueError("synchronous must be FULL or NORMAL")
    return [
        f"PRAGMA busy_timeout = {int(settings.busy_timeout_ms):d}",
        f"PRAGMA synchronous = {settings.synchronous}",
        f"PRAGMA wal_autocheckpoint = {WAL_NET_PAGES:d}",
        f"PRAGMA journal_size_limit = {WAL_LIMIT_BYTES:d}",
    ]


WAL_NET_PAGES = 10_000
"""The WAL size (pages) at which a commit checkpoints by itself: a net for when the
store's background checkpoints (``_storage.wal_checkpoints``) fall behind or do not run
(another program's writes, a store that only runs multi-step transactions)."""

WAL_LIMIT_BYTES = 32 * 1024 * 1024
"""The size the -wal file is cut back to when a write starts it from its beginning again
(SQLite's ``journal_size_limit``). A reader holding a snapshot keeps the WAL from being
restarted, so it grows with every write meanwhile; without a limit the file would keep
that high-water size until the last connection closes. Above the size the WAL reaches
between background checkpoints (``wal_checkpoints.CHECKPOINT_PAGES``), so ordinary
traffic never pays for truncating and growing the file again."""


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
    """Register the SQLite begin hook on ``engine``, and the pool hook that sets a
    connection's busy timeout back as it returns (``sqlite_driver.restore_on_checkin``);
    once each; other dialects need none."""
    sync = engine.sync_engine
    if not is_sqlite(sync.dialect):
        return
    if not event.contains(sync, "begin", _on_begin):
        event.listen(sync, "begin", _on_begin)
    if not event.contains(sync, "checkin", restore_on_checkin):
        event.listen(sync, "checkin", restore_on_checkin)
