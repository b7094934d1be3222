"""What differs between the databases, in one place.

Everything else is generic SQLAlchemy Core. Both backends support ``INSERT ... ON
CONFLICT`` (SQLite 3.24+, Postgres 9.5+) with the same SQLAlchemy API, ``RETURNING``
(SQLite 3.35+), and partial indexes; what remains is which ``insert`` construct to use,
how a transaction takes the conversation's write lock, how rows move positions, how
migrations serialize, and
which full-text engine search asks (SQLite FTS5 or a Postgres ``tsvector``), which
vector index the semantic index may use, how a part of a JSON text is read, and in what
form a read of messages receives their time.
"""

from __future__ import annotations

import importlib.util
import sqlite3
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta, timezone
from typing import Any, Literal

from sqlalchemy import (
    BigInteger,
    ColumnElement,
    DateTime,
    Float,
    Integer,
    Table,
    Text,
    bindparam,
    case,
    cast,
    extract,
    func,
    literal_column,
    select,
    text,
    true,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection, Dialect
from sqlalchemy.sql import Select
from sqlalchemy.sql.elements import TextClause

from .. import schema as s
from ..engine import BEGIN_OPTION

__all__ = [
    "Mode",
    "can_create_tables",
    "clock",
    "delete_listed_in_rowid_order",
    "find_vector_index",
    "for_update",
    "insert",
    "json_at",
    "limit_when",
    "lock_for_migration",
    "lock_patience",
    "message_columns",
    "message_time",
    "messages_from_arrays",
    "mode_options",
    "text_arrays",
]

Mode = Literal["read", "snapshot", "write"]


def mode_options(dialect: Dialect, mode: Mode) -> dict[str, Any]:
    """Execution options for a transaction of one kind.

    ``read``: a single statement, atomic by itself, so no transaction is begun (on
    Postgres ``AUTOCOMMIT`` saves the BEGIN and COMMIT round trips). ``snapshot``:
    several reads that must agree (SQLite: a deferred BEGIN, which in WAL mode reads one
    snapshot; Postgres: REPEATABLE READ, where a read-only transaction never fails).
    ``write``: SQLite takes the write lock up front (``BEGIN IMMEDIATE``, see
    ``_storage.engine``); Postgres writes at READ COMMITTED and locks the conversation row.
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


def moves_in_one_update(dialect: Dialect) -> bool:
    """Whether one ``UPDATE`` may move a conversation's messages by a number of
    positions. On PostgreSQL the messages' primary key is checked at the end of each
    statement (``DEFERRABLE INITIALLY IMMEDIATE``, revision a6d3f9c2e4b8), so rows may
    pass through each other's positions; SQLite checks a key row by row, so the rows
    move through negative positions first."""
    return dialect.name == "postgresql"


def for_update(dialect: Dialect, stmt: Select[Any]) -> Select[Any]:
    """Lock the selected rows for the rest of the transaction.

    On Postgres a ``FOR UPDATE`` row lock. On SQLite nothing is needed: write
    transactions start with ``BEGIN IMMEDIATE`` (see ``_storage.engine``) and so already hold
    the database's only write lock.
    """
    return stmt if dialect.name == "sqlite" else stmt.with_for_update()


def limit_when(
    dialect: Dialect, stmt: Select[Any], condition: ColumnElement[bool], n: int
) -> Select[Any]:
    """``stmt`` limited to its first ``n`` rows when ``condition`` holds, else to none;
    ``condition`` is a one-time test (no column of ``stmt``'s rows, e.g. a comparison of
    an uncorrelated scalar subquery) and ``n`` is written into the statement.

    Postgres tests such a condition once, before the scan (a one-time filter), and plans
    for the literal limit. SQLite would test it on every row the scan visits, reading
    the whole index when it is false: there it chooses the LIMIT itself, and a LIMIT of
    0 reads nothing.
    """
    most: ColumnElement[int] = literal_column(str(int(n)), Integer)
    if dialect.name == "sqlite":
        return stmt.limit(case((condition, most), else_=literal_column("0")))
    return stmt.where(condition).limit(most)


def delete_listed_in_rowid_order(dialect: Dialect, table: Table) -> TextClause | None:
    """SQLite: a DELETE of ``table``'s rows whose ``conversation_id`` is in ``:listed`` (a
    JSON array of ids), visiting them in rowid order; None on Postgres.

    Deleting a message adds its text's tombstones to FTS5's pending changes, which FTS5
    writes out as a new segment at the end of every statement that changed it (its
    savepoint) and whenever a change's rowid is below the last one's: a purge deleting
    conversation by conversation wrote a segment, and paid a merge step, per
    conversation; one statement in rowid order writes one segment per MB of them.
    """
    if dialect.name != "sqlite":
        return None
    name = table.name
    return text(
        f"DELETE FROM {name} WHERE rowid IN (SELECT rowid FROM {name}"  # noqa: S608 - names, no input
        " WHERE conversation_id IN (SELECT value FROM json_each(:listed)))"
    ).bindparams(bindparam("listed", type_=Text))


def lock_for_migration(connection: Connection) -> None:
    """Keep concurrent migrators apart for the rest of the transaction.

    Postgres: a transaction-scoped advisory lock (two processes connecting with
    ``migrate=True`` would otherwise both try to create the tables). SQLite: the
    transaction began with ``BEGIN IMMEDIATE`` and already holds the write lock.
    """
    if connection.dialect.name == "postgresql":
        connection.execute(text("SELECT pg_advisory_xact_lock(7458215530061727291)"))


def limit_lock_waits(connection: Connection, seconds: float) -> None:
    """Bound every lock wait for the rest of the transaction (PostgreSQL).

    Taken after the advisory lock on purpose: waiting for another migrator is fine,
    waiting behind live writers is not. While a migration waits for a table lock
    (ALTER TABLE wants ACCESS EXCLUSIVE), every later writer of that table queues
    behind it, so the wait is what the application feels. ``lock_timeout`` applies to
    each wait on its own, so one setting bounds every statement of the migration; no
    per-statement setting is needed. SQLite takes its one lock at BEGIN IMMEDIATE,
    bounded by the connection's busy timeout.
    """
    if connection.dialect.name == "postgresql":
        ms = max(1, int(seconds * 1000))
        connection.exec_driver_sql(f"SET LOCAL lock_timeout = {ms:d}")


def lock_patience(dialect: Dialect) -> Select[Any] | None:
    """A statement that bounds each lock wait for the rest of its transaction to the
    duration in its parameter ``patience`` (text such as ``"10s"``): PostgreSQL's
    transaction-local ``lock_timeout``, so a wait that outlasts it fails as cancelled
    (SQLSTATE 55P03). ``None`` on SQLite, where the busy timeout bounds the one wait."""
    if dialect.name != "postgresql":
        return None
    setting = func.set_config("lock_timeout", bindparam("patience", type_=Text), true())
    return select(setting)


def clock(dialect: Dialect) -> ColumnElement[float]:
    """The database's clock as seconds since the epoch (what leases expire by): one
    clock for every holder, whatever process or machine it runs on."""
    if dialect.name == "postgresql":
        return literal_column("extract(epoch from clock_timestamp())::float8")
    return literal_column("((julianday('now') - 2440587.5) * 86400.0)")


def can_create_tables(connection: Connection, schema: str | None) -> bool:
    """Whether the connection's role may create histstore's tables (in ``schema``, or
    the default one): it needs CREATE on the schema, or on the database when the schema
    does not exist yet. Always true on SQLite, where the file's owner decides."""
    if connection.dialect.name != "postgresql":
        return True
    query = text(
        "SELECT CASE WHEN EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = :s)"
        " THEN has_schema_privilege(:s, 'CREATE')"
        " ELSE has_database_privilege(current_database(), 'CREATE') END"
    )
    name = schema
    if name is None:
        name = connection.execute(text("SELECT current_schema()")).scalar()
    return bool(connection.execute(query, {"s": name}).scalar())


def find_vector_index(connection: Connection) -> str | None:
    """The vector index the database offers the semantic index: ``"pgvector"`` where
    the extension is installed (Postgres); ``"sqlite-vec"`` where Python's ``sqlite3``
    can load extensions and the ``sqlite_vec`` package is installed (SQLite, which
    is not asked); else ``None``."""
    if connection.dialect.name == "postgresql":
        found = connection.execute(text("SELECT 1 FROM pg_extension WHERE extname = 'vector'"))
        return "pgvector" if found.first() is not None else None
    if not hasattr(sqlite3.Connection, "enable_load_extension"):  # sqlite3 built without
        return None
    return "sqlite-vec" if importlib.util.find_spec("sqlite_vec") is not None else None


def messages_from_arrays(dialect: Dialect) -> Any:
    """An INSERT of a run of one conversation's messages from arrays, where the database
    has them (Postgres), else ``None``.

    One statement per batch instead of one per row (bulk import and copy). Parameters:
    ``c`` (the conversation), ``first`` (the first row's position; the rows take the
    positions that follow in order) and the arrays ``roles``, ``datas``, ``tokens``,
    ``times`` (aware datetimes, already checked by ``_core.rules.time``), ``texts``,
    ``entry_ids`` and ``authors``, all of one length.
    """
    if dialect.name != "postgresql":
        return None
    msg = s.messages
    rows = (
        func.unnest(
            bindparam("roles", type_=postgresql.ARRAY(Text, dimensions=1)),
            bindparam("datas", type_=postgresql.ARRAY(Text, dimensions=1)),
            bindparam("tokens", type_=postgresql.ARRAY(Integer, dimensions=1)),
            bindparam("times", type_=postgresql.ARRAY(DateTime(timezone=True), dimensions=1)),
            bindparam("texts", type_=postgresql.ARRAY(Text, dimensions=1)),
            bindparam("entry_ids", type_=postgresql.ARRAY(BigInteger, dimensions=1)),
            bindparam("authors", type_=postgresql.ARRAY(Text, dimensions=1)),
        )
        .table_valued(
            "role",
            "data",
            "token_count",
            "created_at",
            "search_text",
            "entry_id",
            "author",
            with_ordinality="ord",
        )
        .render_derived()
    )
    placed = select(
        bindparam("c", type_=msg.c.conversation_id.type),
        bindparam("first", type_=BigInteger) + rows.c.ord - 1,
        rows.c.role,
        rows.c.data,
        rows.c.token_count,
        rows.c.created_at,
        rows.c.search_text,
        rows.c.entry_id,
        rows.c.author,
    )
    return msg.insert().from_select([c.name for c in msg.columns], placed)  # in their order


def message_columns(dialect: Dialect | None) -> tuple[ColumnElement[Any], ...]:
    """What a read of messages selects (``History.messages``): ``data``, ``position``,
    ``created_at``, ``entry_id``, ``author``; with ``None`` each column as stored.

    Postgres sends ``created_at`` as whole microseconds since 1970 (a ``bigint``, exact):
    asyncpg decodes a ``bigint`` for a fraction of what a ``timestamptz`` costs it (a
    ``datetime`` made per row, about 0.5 s per million rows), and ``message_time``
    makes the datetime once per distinct value (a write's messages share theirs). SQLite
    sends the column as stored.
    """
    m = s.messages
    at: ColumnElement[Any] = m.c.created_at
    if dialect is not None and dialect.name == "postgresql":
        micros = extract("epoch", m.c.created_at) * literal_column("1000000")
        at = cast(micros, BigInteger).label("created_at")
    return (m.c.data, m.c.position, at, m.c.entry_id, m.c.author)


def message_time(
    dialect: Dialect, stored: Callable[[Any], Any] | None
) -> Callable[[Any], Any] | None:
    """The aware UTC datetime of a ``created_at`` as ``message_columns`` selects it;
    ``stored``: the column's own result processor (what the driver gives elsewhere)."""
    return _from_micros if dialect.name == "postgresql" else stored


_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def _from_micros(micros: int) -> datetime:
    return _EPOCH + timedelta(microseconds=micros)


def text_arrays(*names: str) -> Any:
    """PostgreSQL: ``unnest`` of text array parameters ``names`` (asyncpg knows ``text[]``
    on every connection; an ``int4[]`` parameter costs it a type lookup per new
    connection)."""
    return func.unnest(*(bindparam(n, type_=postgresql.ARRAY(Text)) for n in names))


JsonPart = Literal["string", "number", "boolean", "null", "object", "length"]


def json_at(
    dialect: Dialect, column: ColumnElement[Any], path: Sequence[str | int], part: JsonPart
) -> ColumnElement[Any]:
    """What is at ``path`` (object keys and array indexes) in the JSON text ``column``,
    read as one kind of value: NULL where something else (or nothing) is there.

    ``"string"``: the text of a string; ``"number"``: a number as a float; ``"boolean"``:
    1 for true, 0 for false; ``"length"``: the length of an array; ``"null"``: a
    condition, true where the path holds JSON ``null`` or nothing; ``"object"``: a
    condition, true where it holds an object (NULL where it holds nothing). The path is a bound
    parameter (SQLite: a JSON path whose keys are quoted, so a key must hold no ``"``;
    Postgres: a ``text[]`` for ``#>`` on the value cast to ``jsonb``).
    """
    if dialect.name == "postgresql":
        steps = bindparam(None, [str(p) for p in path], type_=postgresql.ARRAY(Text))
        at = cast(column, postgresql.JSONB).op("#>")(steps)
        kind = func.jsonb_typeof(at)
        whole = at.op("#>>")(bindparam(None, [], type_=postgresql.ARRAY(Text)))
        if part == "null":
            return at.is_(None) | (kind == "null")
        if part == "object":
            return kind == "object"
        found = {
            "string": (kind == "string", whole),
            "number": (kind == "number", cast(whole, Float(precision=53))),
            "boolean": (kind == "boolean", case((whole == "true", 1), else_=0)),
            "length": (kind == "array", func.jsonb_array_length(at)),
        }[part]
        return case(found, else_=None)
    where = "$" + "".join(f"[{p}]" if isinstance(p, int) else f'."{p}"' for p in path)
    spot = bindparam(None, where, type_=Text)
    kind = func.json_type(column, spot)
    if part == "null":
        return kind.is_(None) | (kind == "null")
    if part == "object":
        return kind == "object"
    found = {
        "string": (kind == "text", func.json_extract(column, spot)),
        "number": ((kind == "integer") | (kind == "real"), func.json_extract(column, spot)),
        "boolean": ((kind == "true") | (kind == "false"), func.json_extract(column, spot)),
        "length": (kind == "array", func.json_array_length(column, spot)),
    }[part]
    return case(found, else_=None)
