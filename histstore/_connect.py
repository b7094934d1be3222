"""``histstore.connect()``: open a store on a path, a URL or an engine."""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import Callable, Generator
from types import TracebackType
from typing import Any, Literal

from sqlalchemy import URL
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from ._core.models import Message
from ._errors import HistStoreError
from ._storage import migrations as _migrations
from ._storage.completion import run_to_completion
from ._storage.dberrors import translate_errors
from ._storage.deadlines import checked_limit, limit_from_url
from ._storage.drivers import for_dialect
from ._storage.engine import (
    POOLERS,
    SETTINGS_OPTION,
    SqliteSettings,
    install_hooks,
    is_memory_url,
    make_engine,
    plain_sqlite_url,
    read_only_sqlite_url,
    resolve_target,
)
from ._storage.pg_url import display
from ._storage.pool_options import PoolOptions, capacity, checked, pool_options
from ._storage.refusals import Backoff, connection
from ._storage.statements.dialects import can_create_tables, mode_options
from ._storage.statements.kinds import is_sqlite
from ._store import Store, StoreSettings

__all__ = ["connect"]

_SCHEMA_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_$]{0,62}")

Durability = Literal["full", "process"]
Pooler = Literal["transaction"]


class _Connecting:
    """What ``connect()`` returns: await it for a Store, or use it with ``async with``."""

    def __init__(self, target: object, migrate: bool | None, options: dict[str, Any]) -> None:
        self._target = target
        self._migrate = migrate
        self._options = options
        self._store: Store | None = None

    def __await__(self) -> Generator[Any, None, Store]:
        return _open(self._target, self._migrate, **self._options).__await__()

    async def __aenter__(self) -> Store:
        self._store = await _open(self._target, self._migrate, **self._options)
        return self._store

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._store is not None:
            store, self._store = self._store, None
            await store.close()


def connect(
    target: str | os.PathLike[str] | URL | AsyncEngine | None = None,
    *,
    migrate: bool | None = None,
    count_tokens: Callable[[Message], int] | None = None,
    durability: Durability = "full",
    busy_timeout: float = 30.0,
    max_message_bytes: int = 16 * 1024 * 1024,
    max_batch: int = 10_000,
    schema: str | None = None,
    read_only: bool = False,
    pooler: Pooler | None = None,
    pool_size: int | None = None,
    max_overflow: int | None = None,
    refused_wait: float | None = None,
    command_timeout: float | None = None,
) -> _Connecting:
    """Open a store. Await the result, or use it as an async context manager.

    Args:
        target: a file path (an SQLite database), a SQLAlchemy URL (``sqlite://`` and
            ``postgresql://`` without a driver mean aiosqlite and asyncpg;
            ``sqlite://`` or ``":memory:"`` is a private in-memory database living as
            long as the store), or an ``AsyncEngine`` (borrowed: ``close()`` leaves it
            open). ``None``: the ``HISTSTORE_URL`` environment variable, else
            ``histstore.db`` in the current directory.
        migrate: ``None``: SQLite is upgraded to the newest schema by itself; other
            databases must already be at it (else ``SchemaError`` naming the upgrade
            command). ``True``: upgrade any database. ``False``: neither upgrade nor
            check. A schema newer than this library is a ``SchemaError`` unless
            ``False``.
        count_tokens: ``Message -> int``; when given, each message's count is recorded
            as it is written and ``ConversationState.token_count`` sums them.
        durability: ``"full"`` (default): an acknowledged write survives a power loss
            (SQLite ``synchronous=FULL``). ``"process"``: it survives a crash of the
            process (SQLite ``synchronous=NORMAL``); on Postgres the server rules.
        busy_timeout: seconds an SQLite write waits for another writer's lock before
            failing with ``WriteError`` (and, in memory, a task for the connection).
        max_message_bytes: the largest message, as UTF-8 JSON.
        max_batch: the most messages one write takes.
        schema: PostgreSQL only: keep every histstore table, the version table
            included, in this schema (``migrate=True`` and ``histstore migrate
            --schema`` create it when missing). Two schemas in one database are two
            independent stores.
        read_only: never change the database: the schema is checked, not upgraded
            (an older one is a ``SchemaError`` naming ``histstore migrate``), and every
            call that would write raises ``DatabaseFailure`` (``write``: ``WriteError``
            with nothing accepted) before reaching the database. An SQLite file is
            opened read-only, so one on a read-only filesystem or without write
            permission can be read. Not with ``migrate=True``.
        pooler: PostgreSQL only. ``"transaction"``: the URL reaches the server through
            a transaction-mode pooler (PgBouncer's ``pool_mode=transaction`` or
            ``statement``, the pooled port of a managed provider), which may run
            consecutive transactions on different server sessions; the store then
            makes no named prepared statements and relies on no session state (each
            statement is parsed on every execution). ``None`` (default): a direct
            connection or a session-mode pooler. Not with an ``AsyncEngine``, which
            must be made for the pooler by its owner.
        pool_size: connections the store keeps open while idle. ``None``: the URL's
            ``?pool_size=``, else 2 on PostgreSQL (sized for a server shared by
            several processes: docs/deploying-postgres.md) and 20 on an SQLite file.
            Not for an in-memory database (one connection) or an ``AsyncEngine``.
        max_overflow: connections opened beyond ``pool_size`` under load, each closed
            when its call ends; the store never holds more than ``pool_size +
            max_overflow``. ``None``: the URL's ``?max_overflow=``, else 3 on
            PostgreSQL and 20 on an SQLite file. Not in memory or with an engine.
        refused_wait: seconds a connection the server refuses for now (SQLSTATE
            53300 too many connections, 57P03 starting up or shutting down) is waited
            for, retried after jittered pauses of at most 0.5 s, before the call (or
            ``connect()`` itself) fails with a transient ``DatabaseFailure`` whose
            ``__cause__`` is the driver's error. ``None``: the URL's
            ``?refused_wait=``, else 30. ``0`` fails at the first refusal.
        command_timeout: seconds after which each call is given up, on the client's
            side, also when the server does not answer at all (``None``, the default:
            no limit). A URL may carry it too (``?command_timeout=5``); this argument
            wins. PostgreSQL: a read or any other call then raises ``DatabaseFailure``
            (``transient``); a write raises ``WriteError``: nothing stored when it was
            given up before committing, ``outcome.uncertain`` with the batch's
            ``idempotency_key`` when it was given up while committing. SQLite: waits
            for another writer's lock end by then (it caps ``busy_timeout``). See
            docs/concurrency-guarantees.md.

    Raises:
        ValueError: the target or an option is not valid.
        SchemaError: see ``migrate``.
        HistStoreError: the database cannot be opened.
    """
    if durability not in ("full", "process"):
        raise ValueError("durability must be 'full' or 'process'")
    if not isinstance(busy_timeout, (int, float)) or busy_timeout < 0:
        raise ValueError("busy_timeout must be a number of seconds >= 0")
    for name, value in (("max_message_bytes", max_message_bytes), ("max_batch", max_batch)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a positive int")
    if migrate not in (None, True, False):
        raise ValueError("migrate must be None, True or False")
    if not isinstance(read_only, bool):
        raise ValueError("read_only must be True or False")
    if read_only and migrate is True:
        raise ValueError("read_only=True cannot upgrade the schema (migrate=True)")
    if schema is not None and (
        not isinstance(schema, str) or _SCHEMA_NAME.fullmatch(schema) is None
    ):
        raise ValueError(
            "schema must be a PostgreSQL identifier: a letter or _, then letters,"
            " digits, _ or $, at most 63 characters"
        )
    limit = checked_limit(command_timeout)
    resolved = resolve_target(target)
    if isinstance(resolved, URL):
        resolved, in_url = limit_from_url(resolved)
        limit = in_url if limit is None else limit
    pool = _pool_options(resolved, checked(pool_size, max_overflow, refused_wait))
    if pooler not in POOLERS:
        raise ValueError("pooler must be None or 'transaction'")
    if pooler is not None:
        if isinstance(resolved, AsyncEngine):
            raise ValueError(
                "pooler= configures the engine connect() makes from a URL; an AsyncEngine"
                " must be created for the pooler by its owner"
            )
        if resolved.get_backend_name() != "postgresql":
            raise ValueError("pooler= is for PostgreSQL behind a pooler, not for SQLite")
    options = {
        "count_tokens": count_tokens,
        "durability": durability,
        "busy_timeout": float(busy_timeout),
        "max_message_bytes": max_message_bytes,
        "max_batch": max_batch,
        "schema": schema,
        "read_only": bool(read_only),
        "pooler": pooler,
        "pool": pool,
        "command_timeout": limit,
    }
    return _Connecting(resolved, migrate, options)


def _pool_options(resolved: URL | AsyncEngine, given: PoolOptions) -> PoolOptions:
    """``connect()``'s pool options over the URL's (``_storage.pool_options``).

    Raises:
        ValueError: a pool size for an engine connect() does not make, or for an
            in-memory database (one connection, always).
    """
    sized = given.pool_size is not None or given.max_overflow is not None
    if isinstance(resolved, AsyncEngine):
        if sized:
            raise ValueError(
                "pool_size= and max_overflow= size the engine connect() makes from a URL;"
                " an AsyncEngine's pool is its owner's"
            )
        return given
    if sized and is_memory_url(resolved):
        raise ValueError("an in-memory database has one connection: no pool_size= or max_overflow=")
    return given.over(pool_options(resolved))


async def _open(
    target: object,
    migrate: bool | None,
    *,
    count_tokens: Callable[[Message], int] | None,
    durability: Durability,
    busy_timeout: float,
    max_message_bytes: int,
    max_batch: int,
    schema: str | None,
    read_only: bool,
    pooler: Pooler | None,
    pool: PoolOptions,
    command_timeout: float | None,
) -> Store:
    resolved = resolve_target(target)
    owns = not isinstance(resolved, AsyncEngine)
    if command_timeout is not None:
        busy_timeout = min(busy_timeout, command_timeout)  # a lock or pool wait ends by then
    if (
        read_only
        and isinstance(resolved, URL)
        and resolved.get_backend_name() == "sqlite"
        and not is_memory_url(resolved)
    ):
        resolved = await asyncio.to_thread(read_only_sqlite_url, resolved)
    engine = (
        resolved
        if isinstance(resolved, AsyncEngine)
        else make_engine(
            resolved, busy_timeout=busy_timeout, read_only=read_only, pooler=pooler, sizes=pool
        )
    )
    sqlite = is_sqlite(engine.dialect)
    in_memory = is_memory_url(engine.url)
    settings = StoreSettings(
        count_tokens=count_tokens,
        max_message_bytes=max_message_bytes,
        max_batch=max_batch,
        sqlite=SqliteSettings(
            busy_timeout_ms=int(busy_timeout * 1000),
            synchronous="FULL" if durability == "full" else "NORMAL",
        )
        if sqlite
        else None,
        schema=schema,
        read_only=read_only,
        pooled=pooler is not None,
        refused_wait=pool.wait,
        capacity=capacity(pool, sqlite=sqlite) if owns and not in_memory else None,
        command_timeout=command_timeout,
    )
    try:
        for_dialect(engine.dialect, schema)  # ValueError: a driver or option it cannot run
        install_hooks(engine)
        if migrate is not False:
            shown = display(resolved) if isinstance(resolved, URL) and not sqlite else None
            # On PostgreSQL a cancelled open is cut off at once (``_storage.deadlines``):
            # the server rolls back what it began.
            grace = None if sqlite else 0.0
            preparing = _prepare_schema(engine, settings, migrate, shown)
            await run_to_completion(preparing, grace=grace)
    except BaseException:
        if owns:
            await engine.dispose()
        raise
    return Store(engine, owns_engine=owns, settings=settings)


async def _prepare_schema(
    engine: AsyncEngine, settings: StoreSettings, migrate: bool | None, shown: str | None = None
) -> None:
    """Check the schema and, where asked (or on SQLite by default), upgrade it; ``shown``:
    the URL as the upgrade command in a ``SchemaError`` shows it (default: the engine's)."""
    options: dict[str, Any] = {}
    if settings.sqlite is not None:
        options[SETTINGS_OPTION] = settings.sqlite
    upgrade = not settings.read_only and (
        migrate is True or (migrate is None and settings.sqlite is not None)
    )
    backoff = Backoff(settings.refused_wait)
    with translate_errors("opening the database"):
        if settings.sqlite is not None and not is_memory_url(engine.url) and not settings.read_only:
            # WAL lets readers go on while one process writes. The mode is kept in
            # the file, so this runs once per open, outside any transaction.
            async with connection(engine, backoff) as conn:
                mode = await _journal_mode(conn)
                if mode != "wal":
                    raise HistStoreError(f"SQLite refused WAL mode (journal_mode={mode})")
        schema = settings.schema
        snapshot = engine.execution_options(**options, **mode_options(engine.dialect, "snapshot"))
        async with connection(snapshot, backoff) as conn:
            status = await conn.run_sync(_migrations.schema_status, schema)
            can_create = status.up_to_date or await conn.run_sync(can_create_tables, schema)
            await conn.rollback()
        if status.up_to_date:
            return
        if not upgrade or not status.known or not can_create:
            url = shown or plain_sqlite_url(engine.url).render_as_string(hide_password=True)
            _migrations.check(status, url, schema=schema, can_create=can_create)
        write_options = {**options, **mode_options(engine.dialect, "write")}
        # Rolls back and tries again when it cannot get its locks (lock timeout,
        # deadlock, SQLite busy), then fails saying nothing was changed.
        await _migrations.upgrade_retrying(
            engine, write_options, status, schema, refused_wait=settings.refused_wait
        )


async def _journal_mode(conn: AsyncConnection) -> str:
    result = await conn.exec_driver_sql("PRAGMA journal_mode=WAL")
    mode = str(result.scalar()).lower()
    await conn.commit()
    return mode
