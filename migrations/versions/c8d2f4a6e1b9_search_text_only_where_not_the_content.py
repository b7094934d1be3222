"""A message's search text is stored only where it is not the message's string content.

For the common message, ``{"role": ..., "content": "<text>"}``, ``search_text`` held a
second copy of the content: about half of the bytes a write stored. Now a write leaves
``search_text`` NULL where the text is the string ``content``
(``_storage.rows.stored_search_text``), and every index reads the text back through one
expression (``_storage.statements.search.message_text``): ``search_text``, else the
content when it is a JSON string. A message with no text but a string content (an
adapter's envelope) stores ``''``; NULL with no string content is no text, as before.
Rows stored before keep their text, so nothing is computed again for them, except:

* NULL ``search_text`` beside a non-empty string content becomes ``''`` (still no text).
* SQLite: the FTS5 table is made again, its external content being the view
  ``histstore_messages_fts_content`` of that expression (bm25 reads the text of a
  match through it), and filled from it; the delete and update triggers pass FTS5 the
  old text through the same expression, and the update trigger follows ``data`` too.
* PostgreSQL: the trigger functions list every new or changed row (the indexer leaves
  those without text); the update trigger follows ``data`` too.

An older process would index the text it finds in ``search_text`` (nothing, for the
messages written from now on) and take them off the pending list for good, so the list
is renamed on both databases (``histstore_messages_fts_listed``,
``histstore_search_listed``): an older process's search and indexing fail, and so do
its writes that list their own messages, instead of losing messages from the index.
Its reads go on working.

Downgrade: ``search_text`` is filled from the content where it is NULL and ``''`` is
NULL again; the lists get their names back, the triggers and functions their bodies,
and SQLite's FTS5 table its content table (rebuilt). All of it is SQL, so ``--sql``
carries it.

Revision ID: c8d2f4a6e1b9
Revises: a2f6c8e4d0b3
Create Date: 2026-12-04 18:30:00.000000

"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from histstore._storage.revisions import placed_schema, schema_prefix

revision: str = "c8d2f4a6e1b9"
down_revision: str | None = "a2f6c8e4d0b3"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# ----------------------------------------------------------------------------- SQLite

_FTS = "histstore_messages_fts"
_VIEW = "histstore_messages_fts_content"
_LISTED = "histstore_messages_fts_listed"
_PENDING = "histstore_messages_fts_pending"
_TOKENS = "tokenize='unicode61 remove_diacritics 0', columnsize=0"


def _sqlite_text(m: str) -> str:
    """The text of the message row ``m`` (``statements.search.SQLITE_MESSAGE_TEXT``)."""
    return (
        f"nullif(coalesce({m}.search_text, CASE WHEN json_type({m}.data, '$.content') = 'text'"
        f" THEN json_extract({m}.data, '$.content') END), '')"
    )


# Trigger statements: the old row out of FTS5 (with the text it was indexed with) unless
# it is listed (that first: a listed row's text is not read), and off the list.
_UNINDEX = (
    f" INSERT INTO {_FTS}({_FTS}, rowid, search_text) SELECT 'delete', old.rowid, t"  # noqa: S608 - names, no input
    f" FROM (SELECT {_sqlite_text('old')} AS t WHERE NOT EXISTS"
    f" (SELECT 1 FROM {_LISTED} WHERE message_rowid = old.rowid)) WHERE t IS NOT NULL;"
    f" DELETE FROM {_LISTED} WHERE message_rowid = old.rowid;"
)
_SQLITE_TRIGGERS = {
    "histstore_messages_fts_delete": f"AFTER DELETE ON histstore_messages BEGIN{_UNINDEX} END",
    "histstore_messages_fts_update": (
        f"AFTER UPDATE OF search_text, data ON histstore_messages BEGIN{_UNINDEX}"  # noqa: S608 - names, no input
        f" INSERT OR IGNORE INTO {_LISTED}(message_rowid) VALUES (new.rowid); END"
    ),
}
# What revisions b1e6f0c4a7d3 and a9c3e5f7b1d2 made, for the downgrade.
_OLD_UNINDEX = (
    f" INSERT INTO {_FTS}({_FTS}, rowid, search_text) SELECT 'delete', old.rowid,"  # noqa: S608 - names, no input
    " old.search_text WHERE old.search_text IS NOT NULL AND NOT EXISTS"
    f" (SELECT 1 FROM {_PENDING} WHERE message_rowid = old.rowid);"
    f" DELETE FROM {_PENDING} WHERE message_rowid = old.rowid;"
)
_SQLITE_OLD_TRIGGERS = {
    "histstore_messages_fts_delete": (
        f"AFTER DELETE ON histstore_messages WHEN old.search_text IS NOT NULL BEGIN{_OLD_UNINDEX}"
        " END"
    ),
    "histstore_messages_fts_update": (
        f"AFTER UPDATE OF search_text ON histstore_messages BEGIN{_OLD_UNINDEX}"
        f" INSERT OR IGNORE INTO {_PENDING}(message_rowid)"
        " SELECT new.rowid WHERE new.search_text IS NOT NULL; END"
    ),
}
# A NULL search_text beside a non-empty string content: no text, stored as '' from now on
# (and the content's text again after a downgrade).
_SQLITE_STRING_CONTENT = (
    "search_text IS NULL AND json_type(data, '$.content') = 'text'"
    " AND json_extract(data, '$.content') <> ''"
)


def _sqlite_upgrade() -> None:
    # DML first: what follows is then in its transaction (see the downgrade).
    op.execute(
        f"UPDATE histstore_messages SET search_text = '' WHERE {_SQLITE_STRING_CONTENT}"  # noqa: S608 - names, no input
    )
    for name in _SQLITE_TRIGGERS:
        op.execute(f"DROP TRIGGER {name}")
    op.execute(f"ALTER TABLE {_PENDING} RENAME TO {_LISTED}")
    op.execute(f"DROP TABLE {_FTS}")
    op.execute(
        f"CREATE VIEW {_VIEW} AS SELECT m.rowid AS message_rowid,"  # noqa: S608 - names, no input
        f" {_sqlite_text('m')} AS search_text FROM histstore_messages AS m"
    )
    op.execute(
        f"CREATE VIRTUAL TABLE {_FTS} USING fts5(search_text, content='{_VIEW}',"
        f" content_rowid='message_rowid', {_TOKENS})"
    )
    # Every message with text, the listed ones too: the list is then empty.
    op.execute(
        f"INSERT INTO {_FTS}(rowid, search_text) SELECT message_rowid, search_text"  # noqa: S608 - names, no input
        f" FROM {_VIEW} WHERE search_text IS NOT NULL"
    )
    op.execute(f"DELETE FROM {_LISTED}")  # noqa: S608 - names, no input
    for name, body in _SQLITE_TRIGGERS.items():
        op.execute(f"CREATE TRIGGER {name} {body}")


def _sqlite_downgrade() -> None:
    # Each step may run again: on SQLite, DDL that no DML precedes is committed as it
    # runs, so a failing downgrade leaves the steps before it done.
    for name in _SQLITE_TRIGGERS:
        op.execute(f"DROP TRIGGER IF EXISTS {name}")
    op.execute(f"DROP TABLE IF EXISTS {_FTS}")
    op.execute(f"DROP VIEW IF EXISTS {_VIEW}")
    op.execute(
        "UPDATE histstore_messages SET search_text = json_extract(data, '$.content')"  # noqa: S608 - names, no input
        f" WHERE {_SQLITE_STRING_CONTENT}"
    )
    op.execute("UPDATE histstore_messages SET search_text = NULL WHERE search_text = ''")
    if _has_table(_LISTED):
        op.execute(f"ALTER TABLE {_LISTED} RENAME TO {_PENDING}")
    op.execute(
        f"CREATE VIRTUAL TABLE IF NOT EXISTS {_FTS} USING fts5(search_text,"
        f" content='histstore_messages', content_rowid='rowid', {_TOKENS})"
    )
    op.execute(f"INSERT INTO {_FTS}({_FTS}) VALUES ('rebuild')")  # noqa: S608 - names, no input
    op.execute(f"DELETE FROM {_PENDING}")  # noqa: S608 - names, no input
    for name, body in _SQLITE_OLD_TRIGGERS.items():
        op.execute(f"CREATE TRIGGER IF NOT EXISTS {name} {body}")


# ------------------------------------------------------------------------- PostgreSQL

_PG_LISTED = "histstore_search_listed"
_PG_PENDING = "histstore_search_pending"
_ADDED = "histstore_search_list_added"
_CHANGED = "histstore_search_list_changed"
_CHANGED_TRIGGER = "histstore_search_changed"


def _pg_functions(q: str, table: str, only_text: bool) -> list[str]:
    """The functions of the insert and update triggers (revision e9a4c2f8b5d1), listing
    in ``table``: with ``only_text`` the rows whose ``search_text`` is not NULL (what
    that revision listed), else every row."""
    has_text = " WHERE search_text IS NOT NULL" if only_text else ""
    listed = f"{q}{table} (conversation_id, first_entry, last_entry)"
    when = "IF NEW.search_text IS NOT NULL THEN " if only_text else ""
    end = " END IF;" if only_text else ""
    return [
        f"CREATE OR REPLACE FUNCTION {q}{_ADDED}() RETURNS trigger LANGUAGE plpgsql"  # noqa: S608 - names, no input
        " SET search_path FROM CURRENT AS $$"
        " DECLARE c0 text; c1 text; lo bigint; hi bigint; n bigint; BEGIN"
        " SELECT min(conversation_id), max(conversation_id), min(entry_id), max(entry_id),"
        f" count(*) INTO c0, c1, lo, hi, n FROM added{has_text};"
        " IF n = 0 THEN RETURN NULL; END IF;"
        " IF c0 = c1 AND hi - lo + 1 = n THEN"
        f" INSERT INTO {listed} VALUES (c0, lo, hi); RETURN NULL; END IF;"
        f" INSERT INTO {listed}"
        " SELECT conversation_id, min(entry_id), max(entry_id) FROM (SELECT conversation_id,"
        " entry_id, entry_id - row_number() OVER (PARTITION BY conversation_id"
        f" ORDER BY entry_id) AS run FROM added{has_text}) AS r"
        " GROUP BY conversation_id, run; RETURN NULL; END $$",
        f"CREATE OR REPLACE FUNCTION {q}{_CHANGED}() RETURNS trigger LANGUAGE plpgsql"  # noqa: S608 - names, no input
        " SET search_path FROM CURRENT AS $$ BEGIN"
        f" DELETE FROM {q}histstore_search_vectors"
        " WHERE conversation_id = OLD.conversation_id AND entry_id = OLD.entry_id;"
        f" {when}INSERT INTO {listed}"
        f" VALUES (NEW.conversation_id, NEW.entry_id, NEW.entry_id);{end}"
        " RETURN NULL; END $$",
    ]


def _pg_changed_trigger(q: str, with_data: bool) -> list[str]:
    """The update trigger: on a change of the text (with ``with_data``, of ``data``
    too) or of the row's entry."""
    columns = "search_text, data" if with_data else "search_text"
    data = " OR OLD.data IS DISTINCT FROM NEW.data" if with_data else ""
    return [
        f"DROP TRIGGER IF EXISTS {_CHANGED_TRIGGER} ON {q}histstore_messages",
        f"CREATE TRIGGER {_CHANGED_TRIGGER}"
        f" AFTER UPDATE OF {columns}, entry_id, conversation_id"
        f" ON {q}histstore_messages FOR EACH ROW"
        f" WHEN (OLD.search_text IS DISTINCT FROM NEW.search_text{data}"
        " OR OLD.entry_id <> NEW.entry_id OR OLD.conversation_id <> NEW.conversation_id)"
        f" EXECUTE FUNCTION {q}{_CHANGED}()",
    ]


# A message whose search_text is NULL beside a non-empty string content (``->`` keeps the
# JSON text of the value, so the test needs no unescaping, which a NUL would refuse).
_CONTENT = "(data::json -> 'content')"
_PG_STRING_CONTENT = (
    f"search_text IS NULL AND json_typeof({_CONTENT}) = 'string' AND {_CONTENT}::text <> '\"\"'"
)


def _pg_upgrade(q: str) -> list[str]:
    return [
        f"DROP TRIGGER {_CHANGED_TRIGGER} ON {q}histstore_messages",
        f"UPDATE {q}histstore_messages SET search_text = '' WHERE {_PG_STRING_CONTENT}",  # noqa: S608 - names, no input
        *_pg_functions(q, _PG_LISTED, only_text=False),
        f"ALTER TABLE {q}{_PG_PENDING} RENAME TO {_PG_LISTED}",
        *_pg_changed_trigger(q, with_data=True),
    ]


def _pg_downgrade(q: str) -> list[str]:
    return [
        f"DROP TRIGGER {_CHANGED_TRIGGER} ON {q}histstore_messages",
        f"UPDATE {q}histstore_messages SET search_text = data::json ->> 'content'"  # noqa: S608 - names, no input
        f" WHERE {_PG_STRING_CONTENT}",
        f"UPDATE {q}histstore_messages SET search_text = NULL WHERE search_text = ''",  # noqa: S608 - names, no input
        *_pg_functions(q, _PG_PENDING, only_text=True),
        f"ALTER TABLE {q}{_PG_LISTED} RENAME TO {_PG_PENDING}",
        *_pg_changed_trigger(q, with_data=False),
    ]


def upgrade() -> None:
    dialect = op.get_context().dialect.name
    if dialect == "sqlite":
        _sqlite_upgrade()
    elif dialect == "postgresql":
        for sql in _pg_upgrade(schema_prefix()):
            op.execute(sql)


def downgrade() -> None:
    dialect = op.get_context().dialect.name
    if dialect == "sqlite":
        _sqlite_downgrade()
    elif dialect == "postgresql":
        for sql in _pg_downgrade(schema_prefix()):
            op.execute(sql)


def _has_table(name: str) -> bool:
    """Whether the database has the table ``name`` (offline: it has)."""
    if op.get_context().as_sql:
        return True
    return name in sa.inspect(op.get_bind()).get_table_names(schema=placed_schema())
