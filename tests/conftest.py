"""One store fixture over every backend: an SQLite file, SQLite in memory, PostgreSQL
(directly and through PgBouncer).

Each test starts on an empty database at the newest schema, and nothing migrates per
test: SQLite file tests get a copy of a file migrated once per session, in-memory stores
start as a copy of it (SQLite's backup API, ``Backend.connect``), and the Postgres
tests share one database the session migrates, emptied before each test (``PgEmptier``).

PostgreSQL comes from ``HISTSTORE_TEST_PG`` (default: the local server, database
``test``): the session creates one throwaway database there and drops it at the end
(each pytest-xdist worker its own).
Without a server the Postgres cases are skipped, unless ``HISTSTORE_REQUIRE_POSTGRES=1``
(CI sets it), which turns the skip into a failure.

``postgres-pgbouncer`` is the same database through a transaction-mode PgBouncer that
the session starts itself (``pgbouncer_url``), opened with ``pooler="transaction"``;
without a ``pgbouncer`` binary it is skipped (failed under the same variable).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import sqlite3
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing, contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import date, datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest
from helpers import PG_ADMIN_URL, _pg_execute, empty_pg_database
from sqlalchemy import event, make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool, Pool
from sqlalchemy.util import await_only

import histstore
from histstore._storage import schema as _schema
from histstore._storage.engine import resolve_target

REQUIRE_PG = os.environ.get("HISTSTORE_REQUIRE_POSTGRES", "") not in ("", "0")

# sqlite3's default adapters for date and datetime are deprecated from Python 3.12 on
# (a warning, an error here). Without them, a datetime bound to SQLite raw, by histstore
# or by a test, fails the same way on every Python: times go as the store's own text.
for _kind in (date, datetime):
    sqlite3.adapters.pop((_kind, sqlite3.PrepareProtocol), None)


@dataclass
class Backend:
    """A database a test can open stores on (several at once, from several processes)."""

    name: str
    url: str
    options: dict[str, Any] = field(default_factory=dict)
    """What every ``connect()`` of this backend passes (``pooler`` through PgBouncer)."""
    template: sqlite3.Connection | None = None
    """``sqlite-memory``: the migrated database each store's own starts as a copy of."""

    @property
    def shared(self) -> bool:
        """Whether other connections and processes see the same data."""
        return self.name != "sqlite-memory"

    def connect(self, **options: Any) -> Any:
        connecting = histstore.connect(self.url, **{**self.options, **options})
        if self.template is None:
            return connecting
        return _FromTemplate(connecting, self.template)


def _in_thread(fn: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Run a coroutine to completion on a private loop (fixtures may run inside one)."""
    with ThreadPoolExecutor(1) as pool:
        pool.submit(lambda: asyncio.run(fn())).result()


async def _pg_admin(sql: str) -> None:
    await _pg_execute(sql)


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    """A fresh Postgres database at the newest schema, dropped after the session."""
    name = f"histstore_test_{uuid.uuid4().hex[:12]}"
    try:
        _in_thread(lambda: _pg_admin(f'CREATE DATABASE "{name}"'))
    except Exception as exc:  # any failure means "no server"
        if REQUIRE_PG:
            pytest.fail(f"PostgreSQL is required (HISTSTORE_REQUIRE_POSTGRES) but: {exc!r}")
        pytest.skip(f"PostgreSQL not available: {exc!r}")
    url = make_url(PG_ADMIN_URL).set(database=name).render_as_string(hide_password=False)

    async def migrate() -> None:
        store = await histstore.connect(url, migrate=True)
        await store.close()

    _in_thread(migrate)
    try:
        yield url
    finally:
        _in_thread(lambda: _pg_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


class PgEmptier:
    """Empties the session's Postgres database before each test that opens it as a
    backend: one ``DELETE`` per table (children first) in one transaction, on a plain
    connection of its own. Cheaper here than a ``TRUNCATE`` (new files for every table)
    or a ``CREATE DATABASE ... TEMPLATE`` per test (a copy of the whole catalog). Like
    ``TRUNCATE`` before it, it leaves sequences where they were. The session runs as a
    replica (``session_replication_role``), so the schema guard's triggers, which refuse
    deletes from older processes, stay out of it; a role that may not do that empties
    the tables with ``TRUNCATE`` instead.
    """

    def __init__(self, url: str) -> None:
        self._conn = psycopg.connect(url, autocommit=True)
        tables = [table.name for table in reversed(_schema.metadata.sorted_tables)]
        try:
            self._conn.execute("SET session_replication_role = replica")
            self._statements = [f"DELETE FROM {table}" for table in tables]
        except psycopg.errors.InsufficientPrivilege:
            self._statements = [f"TRUNCATE {', '.join(tables)}"]

    def empty(self) -> None:
        with self._conn.transaction():
            for sql in self._statements:
                self._conn.execute(sql)

    def close(self) -> None:
        self._conn.close()


@pytest.fixture(scope="session")
def pg_emptier(pg_url: str) -> Iterator[PgEmptier]:
    """Empties ``pg_url``'s database for each Postgres backend test."""
    emptier = PgEmptier(pg_url)
    try:
        yield emptier
    finally:
        emptier.close()


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An SQLite file at the newest schema (WAL mode, no ``-wal`` left): each
    ``sqlite-file`` test starts on a copy."""
    path = tmp_path_factory.mktemp("template") / "store.db"

    async def migrate() -> None:
        store = await histstore.connect(str(path))
        await store.close()

    _in_thread(migrate)
    assert not path.with_name("store.db-wal").exists()
    return path


@pytest.fixture(scope="session")
def memory_template(sqlite_template: Path) -> Iterator[sqlite3.Connection]:
    """The migrated schema in an in-memory database (journal mode ``memory``), copied
    into each ``sqlite-memory`` store's database when it opens (``Backend.connect``)."""
    plain = sqlite_template.with_name("plain.db")
    shutil.copyfile(sqlite_template, plain)
    with closing(sqlite3.connect(plain)) as conn:
        conn.execute("PRAGMA journal_mode=DELETE")
    memory = sqlite3.connect(":memory:", check_same_thread=False)
    with closing(sqlite3.connect(plain)) as conn:
        conn.backup(memory)
    try:
        yield memory
    finally:
        memory.close()


_MEMORY_TEMPLATE: ContextVar[sqlite3.Connection | None] = ContextVar(
    "_MEMORY_TEMPLATE", default=None
)
_TEMPLATE_LOCK = threading.Lock()


@event.listens_for(Pool, "connect")
def _copy_memory_template(dbapi_connection: Any, _record: Any) -> None:
    """While ``Backend.connect`` opens an in-memory store, its new connection (the one
    that holds the whole database) starts as a copy of the migrated template."""
    source = _MEMORY_TEMPLATE.get()
    if source is None:
        return
    driver = dbapi_connection.driver_connection  # an aiosqlite.Connection

    def copy() -> None:  # on aiosqlite's thread, the one its sqlite3 connection belongs to
        with _TEMPLATE_LOCK:
            source.backup(driver._conn)

    await_only(driver._execute(copy))


class _FromTemplate:
    """``histstore.connect(...)`` of an in-memory store whose database starts as a copy of
    ``template``: awaitable, and an async context manager, like what it wraps."""

    def __init__(self, connecting: Any, template: sqlite3.Connection) -> None:
        self._connecting = connecting
        self._template = template

    def __await__(self) -> Any:
        return self._open(self._connecting.__await__).__await__()

    async def _open(self, opening: Callable[[], Any]) -> Any:
        token = _MEMORY_TEMPLATE.set(self._template)
        try:
            return await _Awaiting(opening)
        finally:
            _MEMORY_TEMPLATE.reset(token)

    async def __aenter__(self) -> Any:
        return await self._open(lambda: self._connecting.__aenter__().__await__())

    async def __aexit__(self, *exc: Any) -> Any:
        return await self._connecting.__aexit__(*exc)


class _Awaiting:
    def __init__(self, opening: Callable[[], Any]) -> None:
        self._opening = opening

    def __await__(self) -> Any:
        return self._opening()


BACKENDS = [
    pytest.param("sqlite-file", marks=pytest.mark.sqlite_file, id="sqlite-file"),
    pytest.param("sqlite-memory", marks=pytest.mark.sqlite_memory, id="sqlite-memory"),
    pytest.param("postgres", marks=pytest.mark.postgres, id="postgres"),
    pytest.param(
        "postgres-pgbouncer", marks=pytest.mark.postgres_pgbouncer, id="postgres-pgbouncer"
    ),
]
SHARED_BACKENDS = [BACKENDS[0], BACKENDS[2]]
POSTGRES_BACKENDS = BACKENDS[2:]


def _make_backend(name: str, request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    """A database at the newest schema holding nothing: SQLite's copied from the
    session's migrated template, Postgres's the session's database, emptied."""
    if name == "sqlite-file":
        path = tmp_path / "store.db"
        shutil.copyfile(request.getfixturevalue("sqlite_template"), path)
        # ``durability="process"``: one task's short writes run on the event loop's thread
        # (``_storage.sqlite_writer``), so the suite's sequential writes take that path; the
        # writes of concurrent tasks, and tests that ask for ``"full"``, take the thread.
        return Backend(name, str(path), {"durability": "process"})
    if name == "sqlite-memory":
        return Backend(name, "sqlite://", template=request.getfixturevalue("memory_template"))
    url: str = request.getfixturevalue("pg_url")
    emptier: PgEmptier = request.getfixturevalue("pg_emptier")
    emptier.empty()
    if name == "postgres-pgbouncer":
        bouncer: str = request.getfixturevalue("pgbouncer_url")
        return Backend(name, bouncer, {"pooler": "transaction"})
    return Backend(name, url)


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    """Every backend; each test starts on an empty database of its own."""
    return _make_backend(request.param, request, tmp_path)


@pytest.fixture(params=SHARED_BACKENDS)
def shared_backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    """The backends several connections and processes can share (file and Postgres)."""
    return _make_backend(request.param, request, tmp_path)


@pytest.fixture(params=POSTGRES_BACKENDS)
def postgres_backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    """The PostgreSQL backends (directly and through PgBouncer), for what only a server
    has: sessions that outlive their client, row locks, a network to cut."""
    return _make_backend(request.param, request, tmp_path)


@pytest.fixture
async def store(backend: Backend) -> AsyncIterator[histstore.Store]:
    """A store on an empty database of every backend."""
    async with backend.connect() as st:
        yield st


@pytest.fixture
def cid() -> str:
    """A fresh conversation id."""
    return f"conv-{uuid.uuid4().hex}"


# ---------------------------------------------------------------------------- PgBouncer


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _pgbouncer_ini(directory: Path, server_url: str, port: int) -> Path:
    """A transaction-mode PgBouncer in ``directory``, in front of ``server_url``'s server.

    A pool of 4 server connections per database and user (fewer than the store's own
    pool and the tests' tasks, so clients queue and their transactions land on whichever
    server session is free). Clients are trusted; PgBouncer logs into the server as the
    URL's user, with its password when it has one.
    """
    url = make_url(server_url)
    server = f"host={url.host or '127.0.0.1'} port={url.port or 5432} user={url.username}"
    if url.password:
        server += f" password={url.password}"
    user = url.username or "postgres"
    (directory / "users.txt").write_text(f'"{user}" "{url.password or ""}"\n')
    ini = directory / "pgbouncer.ini"
    ini.write_text(
        "[databases]\n"
        f"* = {server}\n"
        "[pgbouncer]\n"
        "listen_addr = 127.0.0.1\n"
        f"listen_port = {port}\n"
        "unix_socket_dir =\n"
        "auth_type = trust\n"
        f"auth_file = {directory / 'users.txt'}\n"
        "pool_mode = transaction\n"
        "default_pool_size = 4\n"
        "min_pool_size = 0\n"
        "reserve_pool_size = 0\n"
        "max_client_conn = 200\n"
        f"logfile = {directory / 'pgbouncer.log'}\n"
        f"pidfile = {directory / 'pgbouncer.pid'}\n"
    )
    return ini


@pytest.fixture(scope="session")
def pgbouncer_url(pg_url: str) -> Iterator[str]:
    """The session's Postgres database through a transaction-mode PgBouncer that this
    fixture starts (as the ``postgres`` user when run as root: PgBouncer refuses root)
    on a free port, and stops after the session. Without a ``pgbouncer`` binary the
    PgBouncer cases are skipped, unless ``HISTSTORE_REQUIRE_POSTGRES`` is set."""
    with running_pgbouncer(pg_url) as url:
        yield url


@contextmanager
def running_pgbouncer(server_url: str) -> Iterator[str]:
    """A transaction-mode PgBouncer in front of ``server_url``'s server (see
    ``pgbouncer_url``), stopped at the end: the URL of the same database through it."""
    binary = shutil.which("pgbouncer") or shutil.which("pgbouncer", path="/usr/sbin")
    if binary is None:
        if REQUIRE_PG:
            pytest.fail("pgbouncer is required (HISTSTORE_REQUIRE_POSTGRES) but not installed")
        pytest.skip("pgbouncer is not installed")
    directory = Path(tempfile.mkdtemp(prefix="histstore-pgbouncer-"))
    port = _free_port()
    ini = _pgbouncer_ini(directory, server_url, port)
    command = [binary, str(ini)]
    if os.geteuid() == 0:
        shutil.chown(directory, "postgres")
        command[1:1] = ["-u", "postgres"]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            if proc.poll() is not None or time.monotonic() > deadline:
                log = directory / "pgbouncer.log"
                text = log.read_text() if log.exists() else "(no log)"
                pytest.fail(f"pgbouncer did not start: {text[-2000:]}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.05)
        yield (
            make_url(server_url)
            .set(host="127.0.0.1", port=port)
            .render_as_string(hide_password=False)
        )
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(params=["sqlite-file", "postgres"])
async def empty_url(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    """A new, empty database (no histstore schema) of each shared backend: its URL,
    without a driver name; migration tests bring it to the revision they start from."""
    if request.param == "sqlite-file":
        yield f"sqlite:///{tmp_path / 'migrate.db'}"
    else:
        request.getfixturevalue("pg_url")  # skips (or fails, when required) without a server
        async with empty_pg_database() as url:
            yield url


@pytest.fixture
async def engine(empty_url: str) -> AsyncIterator[AsyncEngine]:
    """A plain engine (no pool) on ``empty_url``, for Alembic and raw SQL."""
    target = resolve_target(empty_url)
    assert not isinstance(target, AsyncEngine)
    eng = create_async_engine(target, poolclass=NullPool)
    try:
        yield eng
    finally:
        await eng.dispose()
