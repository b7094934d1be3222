"""One store fixture over every backend: an SQLite file, SQLite in memory, PostgreSQL.

PostgreSQL comes from ``HISTSTORE_TEST_PG`` (default: the local server, database
``test``): the session creates one throwaway database there and drops it at the end.
Without a server the Postgres cases are skipped, unless ``HISTSTORE_REQUIRE_POSTGRES=1``
(CI sets it), which turns the skip into a failure.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from helpers import PG_ADMIN_URL, _pg_execute
from sqlalchemy import make_url

import histstore
from histstore import _schema

REQUIRE_PG = os.environ.get("HISTSTORE_REQUIRE_POSTGRES", "") not in ("", "0")


@dataclass
class Backend:
    """A database a test can open stores on (several at once, from several processes)."""

    name: str
    url: str

    @property
    def shared(self) -> bool:
        """Whether other connections and processes see the same data."""
        return self.name != "sqlite-memory"

    def connect(self, **options: Any) -> Any:
        return histstore.connect(self.url, **options)


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


async def _truncate_pg(url: str) -> None:
    tables = ", ".join(t.name for t in _schema.metadata.sorted_tables)
    engine_store = await histstore.connect(url)
    try:
        async with engine_store.engine.begin() as conn:
            await conn.exec_driver_sql(f"TRUNCATE {tables}")
    finally:
        await engine_store.close()


BACKENDS = [
    pytest.param("sqlite-file", marks=pytest.mark.sqlite_file, id="sqlite-file"),
    pytest.param("sqlite-memory", marks=pytest.mark.sqlite_memory, id="sqlite-memory"),
    pytest.param("postgres", marks=pytest.mark.postgres, id="postgres"),
]
SHARED_BACKENDS = [BACKENDS[0], BACKENDS[2]]


async def _make_backend(name: str, request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    if name == "sqlite-file":
        return Backend(name, str(tmp_path / "store.db"))
    if name == "sqlite-memory":
        return Backend(name, "sqlite://")
    url: str = request.getfixturevalue("pg_url")
    await _truncate_pg(url)
    return Backend(name, url)


@pytest.fixture(params=BACKENDS)
async def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    """Every backend; each test starts on an empty database."""
    return await _make_backend(request.param, request, tmp_path)


@pytest.fixture(params=SHARED_BACKENDS)
async def shared_backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    """The backends several connections and processes can share (file and Postgres)."""
    return await _make_backend(request.param, request, tmp_path)


@pytest.fixture
async def store(backend: Backend) -> AsyncIterator[histstore.Store]:
    """A store on an empty database of every backend."""
    async with backend.connect() as st:
        yield st


@pytest.fixture
def cid() -> str:
    """A fresh conversation id."""
    return f"conv-{uuid.uuid4().hex}"
