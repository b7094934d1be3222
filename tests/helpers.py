"""Small helpers shared by the behaviour tests (not fixtures: see conftest.py)."""

from __future__ import annotations

import asyncio
import os
import re
import sqlite3
import sys
import sysconfig
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from alembic import command
from hypothesis import strategies as st
from sqlalchemy import exc as sa_exc
from sqlalchemy import make_url, select
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncEngine

import histstore
from histstore._storage import schema as _schema
from histstore._storage.migrations import alembic_config

REPO = Path(__file__).resolve().parent.parent
PG_ADMIN_URL = os.environ.get("HISTSTORE_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")


def new_id(prefix: str = "conv") -> str:
    """A fresh, unguessable id."""
    return f"{prefix}-{uuid.uuid4().hex}"


def user_msgs(n: int, tag: str = "m") -> list[dict[str, Any]]:
    """``n`` distinct user message dicts, ``{tag}-0`` ... ``{tag}-{n-1}``."""
    return [{"role": "user", "content": f"{tag}-{i}"} for i in range(n)]


async def agent_turns(store: histstore.Store, tasks: int, turns: int) -> list[str]:
    """``tasks`` tasks at once, each doing ``turns`` agent turns (read the newest 20,
    write 2) on a conversation of its own; checks every message landed and returns
    the conversations."""
    ids = [new_id() for _ in range(tasks)]

    async def run(c: str) -> None:
        for _ in range(turns):
            await store.read(c, limit=20)
            await store.write(c, user_msgs(2))

    await asyncio.gather(*(run(c) for c in ids))
    assert [await store.count(c) for c in ids] == [2 * turns] * tasks
    return ids


async def snapshot(store: histstore.Store, conversation: str) -> tuple[bool, int, list[Any]]:
    """What a conversation holds, for before/after comparisons."""
    messages = await store.read(conversation)
    return (
        await store.exists(conversation),
        await store.count(conversation),
        [(m.position, m.to_dict()) for m in messages],
    )


def subprocess_env() -> dict[str, str]:
    """The environment for a child Python that must import this checkout's histstore."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    return env


PYTHON = sys.executable
"""The interpreter running the tests: every child Python is started with it."""

ALEMBIC = Path(sysconfig.get_path("scripts")) / "alembic"
"""The ``alembic`` script of the environment running the tests (never a fixed venv)."""


def connections_in_use(store: histstore.Store) -> int:
    """Connections checked out of the store's pool for calls under way: 0 between calls
    (the connections the store keeps for its next calls, and an SQLite writer's own
    connection, do not count)."""
    checked_out: int = store.engine.pool.checkedout()  # type: ignore[attr-defined]
    now = store.diagnostics()
    return checked_out - now.idle_connections - now.writer_connection


CLI_WITHOUT_LANGGRAPH = (
    "import sys\n"
    "for name in ('langgraph', 'langgraph.checkpoint', 'langchain_core'):\n"
    "    sys.modules[name] = None\n"
    "from histstore.cli import main\n"
    "sys.exit(main(sys.argv[1:]))\n"
)
"""A ``python -c`` program: the ``histstore`` command as it runs where LangGraph is not
installed (its arguments follow the program)."""


def is_database_error(exc: BaseException | None) -> bool:
    """Whether ``exc`` comes from the database layer: SQLAlchemy's or a driver's own error."""
    if isinstance(exc, (sa_exc.SQLAlchemyError, sqlite3.Error)):
        return True
    return exc is not None and type(exc).__module__.split(".")[0] == "asyncpg"


# Arbitrary JSON that Python's json module round-trips exactly.
json_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()
)
json_values = st.recursive(
    json_scalars,
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=10), children, max_size=5)
    ),
    max_leaves=25,
)


def deep(levels: int) -> Any:
    """A value nested ``levels`` deep, alternating lists and objects."""
    value: Any = "bottom"
    for i in range(levels):
        value = [value] if i % 2 else {"k": value}
    return value


async def _pg_execute(sql: str, database: str | None = None) -> None:
    import asyncpg

    url = make_url(PG_ADMIN_URL)
    conn = await asyncpg.connect(
        user=url.username,
        password=url.password,
        host=url.host,
        port=url.port,
        database=database or url.database,
    )
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


async def pg_fetch(url: str, sql: str) -> list[Sequence[Any]]:
    """Run a query on the Postgres database at ``url`` with a separate asyncpg session."""
    import asyncpg

    u = make_url(url)
    conn = await asyncpg.connect(
        user=u.username, password=u.password, host=u.host, port=u.port, database=u.database
    )
    try:
        return list(await conn.fetch(sql))
    finally:
        await conn.close()


@asynccontextmanager
async def empty_pg_database() -> AsyncIterator[str]:
    """A new, empty Postgres database (no histstore schema); dropped afterwards.

    Yields its URL without a driver name (``postgresql://...``).
    """
    name = f"histstore_empty_{uuid.uuid4().hex[:12]}"
    await _pg_execute(f'CREATE DATABASE "{name}"')
    try:
        yield make_url(PG_ADMIN_URL).set(database=name).render_as_string(hide_password=False)
    finally:
        await _pg_execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


async def raw_rows(store: histstore.Store, conversation: str) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every histstore table that belongs to ``conversation``."""
    out: dict[str, list[tuple[Any, ...]]] = {}
    async with store.engine.connect() as conn:
        for table in (_schema.conversations, *_schema.CONVERSATION_TABLES):
            col = table.c.id if table is _schema.conversations else table.c.conversation_id
            rows = (await conn.execute(select(table).where(col == conversation))).all()
            out[table.name] = sorted((tuple(r) for r in rows), key=repr)
    return out


def stable_id(value: object) -> str:
    """A parameter's test id: its ``repr`` without memory addresses, so that every
    process (each pytest-xdist worker) names the same test alike."""
    return re.sub(r" at 0x[0-9a-fA-F]+", "", repr(value))


async def alembic(engine: AsyncEngine, action: str, *args: str) -> None:
    """``alembic <action> <args>`` (``upgrade``, ``downgrade``, ``check``...) on one
    connection of ``engine``, in one transaction: committed, or rolled back with
    everything it did when it raises (on SQLite too: its driver would run the DDL
    outside any transaction, as histstore's own migrations never do)."""

    def run(conn: Connection) -> None:
        getattr(command, action)(alembic_config(conn), *args)

    async with engine.begin() as conn:
        if conn.dialect.name == "sqlite":
            await conn.exec_driver_sql("BEGIN")
        await conn.run_sync(run)


@asynccontextmanager
async def writing_as_before_listing(engine: AsyncEngine) -> AsyncIterator[None]:
    """Today's store writes, meanwhile, as the histstore of a revision before
    a2f6c8e4d0b3 did, into a database at that revision: the columns its statements set
    (``listed_changes``, and ``touched_from`` of c8e1f4a2d7b6) stand in while it runs,
    its writes list no messages for the
    full-text index (that revision's INSERT trigger lists or indexes them), and they
    store every message's text in ``search_text`` (before c8d2f4a6e1b9 NULL there is
    no text)."""
    from sqlalchemy import text

    from histstore._core.search_text import indexed_text
    from histstore._storage import rows
    from histstore._storage.statements.search import ListedInserts

    def unlisted(self: ListedInserts, steps: Any, count: int | None = None) -> Any:
        yield from steps

    def every_text(message: Any, written: str = "") -> str | None:
        return rows.searchable(indexed_text(message))

    rules = ("sqlite_stored_text", "pg_stored_text")
    stored = {name: getattr(rows, name) for name in rules}

    async def column(change: str, table: str = "histstore_conversations") -> None:
        async with engine.begin() as conn:
            await conn.execute(text(f"ALTER TABLE {table} {change}"))

    await column("ADD COLUMN listed_changes BIGINT NOT NULL DEFAULT 0")
    await column("ADD COLUMN touched_from BIGINT NOT NULL DEFAULT 0", "histstore_changes")
    listed = ListedInserts.__call__
    ListedInserts.__call__ = unlisted  # type: ignore[method-assign]
    for name in rules:
        setattr(rows, name, every_text)
    try:
        yield
    finally:
        ListedInserts.__call__ = listed  # type: ignore[method-assign]
        for name, rule in stored.items():
            setattr(rows, name, rule)
        await column("DROP COLUMN listed_changes")
        await column("DROP COLUMN touched_from", "histstore_changes")
