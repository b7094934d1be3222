"""PostgreSQL: the full-text index is a GIN index on the messages' own text, kept by the INSERT.

Until now (revision e9a4c2f8b5d1) every message's ``to_tsvector('simple', text)`` was
stored a second time in ``histstore_search_vectors`` (some 480 bytes a message, plus its
primary key, beside the GIN index), made later by the store from a pending list
(``histstore_search_listed``) that writes filled and that ``close()`` emptied; a search
made the vectors of what was still listed. Now there is one index,
``ix_histstore_messages_text``: GIN on ``to_tsvector('simple', <the message's text>)``
over ``histstore_messages`` itself, the text being the runtime's
``statements.search.message_text`` (``search_text``, else a string ``content``; ``''``
is no text), written here as the same SQL. PostgreSQL keeps it in the statement that
inserts, updates or deletes a message, so nothing is deferred: no list, no indexer, no
triggers, no second copy of each vector.

* Upgrade: the triggers and their functions, the vectors, the pending list and
  ``ix_histstore_messages_entry`` (vectors and runs named messages by entry id) go; the
  index is built from the rows as they are, so listed, edited and deleted messages all
  end up as their text now says.
* An older histstore names the two tables: each becomes a view whose rows raise the
  older-writer guards' message, and writing to it (an older append listing its run)
  runs the guard's trigger function, which raises too (as revision d3a7f1c6b8e2 did for
  the list's first name).
* Downgrade: the views go; the tables, the entry index, the functions and triggers come
  back as revisions e9a4c2f8b5d1, c8d2f4a6e1b9 and b8e1d4f6a2c7 left them, the vectors
  made for every message with text (the list empty); the expression index goes.

SQLite: nothing. All of it is SQL, so ``--sql`` carries it.

Revision ID: 5b7e2d4a9c13
Revises: 6b2d9e4f1a37
Create Date: 2026-12-07 14:00:00.000000

"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

from histstore._storage.revisions import OLDER_WRITER_MESSAGE, schema_prefix

revision: str = "5b7e2d4a9c13"
down_revision: str | None = "6b2d9e4f1a37"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

INDEX = "ix_histstore_messages_text"
VECTORS = "histstore_search_vectors"
LISTED = "histstore_search_listed"
ENTRY_INDEX = "ix_histstore_messages_entry"
VECTOR_ROWS = "histstore_refuse_older_vectors"  # the vectors view's rows: raises
LISTED_ROWS = "histstore_refuse_older_search"  # d3a7f1c6b8e2's (same columns): raises
REFUSE_WRITE = "histstore_refuse_older_writer"  # d5f7a3c1e9b2's trigger function: raises
RAISED = f"RAISE EXCEPTION '{OLDER_WRITER_MESSAGE}' USING ERRCODE = 'P0001';"

_ADDED = "histstore_search_list_added"
_CHANGED = "histstore_search_list_changed"
_REMOVED = "histstore_search_drop_removed"
_TRIGGERS = ("histstore_search_added", "histstore_search_changed", "histstore_search_removed")
_SETTING = "histstore.search_listed"

# The message's text (``statements.search.message_text`` when this revision was made).
# PostgreSQL's JSON functions refuse a document that holds the escape of a NUL anywhere:
# such a row's text is never read from its content (the runtime stores it in
# ``search_text``; ``_NUL_TEXTS`` fills it for the rows already stored).
NUL = "'\\u0000'"
TEXT = (
    f"nullif(coalesce(search_text, CASE WHEN strpos(data, {NUL}) > 0 THEN NULL"
    " WHEN json_typeof(data::json -> 'content') = 'string'"
    " THEN data::json ->> 'content' END), '')"
)
_SPACED = f"replace(data, {NUL}, '\\u0020')::json"
_NUL_TEXTS = (
    "UPDATE {q}histstore_messages SET search_text = " + _SPACED + " ->> 'content'"  # noqa: S608 - names, no input
    f" WHERE search_text IS NULL AND strpos(data, {NUL}) > 0"
    f" AND json_typeof({_SPACED} -> 'content') = 'string'"
)
VECTOR = f"to_tsvector('simple'::regconfig, {TEXT})"


def _up(q: str) -> list[str]:
    return [
        *(f"DROP TRIGGER {t} ON {q}histstore_messages" for t in _TRIGGERS),
        *(f"DROP FUNCTION {q}{f}()" for f in (_ADDED, _CHANGED, _REMOVED)),
        f"DROP TABLE {q}{VECTORS}",
        f"DROP TABLE {q}{LISTED}",
        f"DROP INDEX {q}{ENTRY_INDEX}",
        _NUL_TEXTS.format(q=q),
        # A pending list of 256 kB, as the index on the vectors had.
        f"CREATE INDEX {INDEX} ON {q}histstore_messages USING gin ({VECTOR})"
        " WITH (gin_pending_list_limit = 256)",
        f"CREATE FUNCTION {q}{VECTOR_ROWS}() RETURNS TABLE"
        " (conversation_id varchar(255), entry_id bigint, vector tsvector)"
        f" LANGUAGE plpgsql AS $$ BEGIN {RAISED} END $$",
        f"CREATE VIEW {q}{VECTORS} AS SELECT conversation_id, entry_id, vector"  # noqa: S608 - names, no input
        f" FROM {q}{VECTOR_ROWS}()",
        f"CREATE VIEW {q}{LISTED} AS SELECT conversation_id, first_entry, last_entry"  # noqa: S608 - names, no input
        f" FROM {q}{LISTED_ROWS}()",
        *(
            f"CREATE TRIGGER histstore_guard_older_{name} INSTEAD OF INSERT OR UPDATE OR DELETE"
            f" ON {q}{view} FOR EACH ROW EXECUTE FUNCTION {q}{REFUSE_WRITE}()"
            for name, view in (("vectors", VECTORS), ("listed", LISTED))
        ),
    ]


def _down(q: str) -> list[str]:
    # The trigger functions as c8d2f4a6e1b9 (insert, update) and e9a4c2f8b5d1 (delete)
    # made them, the insert trigger's condition as b8e1d4f6a2c7's.
    fn = "RETURNS trigger LANGUAGE plpgsql SET search_path FROM CURRENT AS $$"
    listed = f"{q}{LISTED} (conversation_id, first_entry, last_entry)"
    return [
        f"DROP VIEW {q}{VECTORS}",
        f"DROP VIEW {q}{LISTED}",
        f"DROP FUNCTION {q}{VECTOR_ROWS}()",
        f"CREATE TABLE {q}{VECTORS} ("
        ' conversation_id varchar(255) COLLATE "C" NOT NULL, entry_id bigint NOT NULL,'
        " vector tsvector NOT NULL,"
        f" CONSTRAINT pk_{VECTORS} PRIMARY KEY (conversation_id, entry_id))",
        f"ALTER TABLE {q}{VECTORS} SET (parallel_workers = 0)",
        f"CREATE TABLE {q}{LISTED} ("
        ' conversation_id varchar(255) COLLATE "C" NOT NULL,'
        " first_entry bigint NOT NULL, last_entry bigint NOT NULL)",
        f"CREATE INDEX {ENTRY_INDEX} ON {q}histstore_messages (conversation_id, entry_id)",
        f"INSERT INTO {q}{VECTORS} (conversation_id, entry_id, vector)"  # noqa: S608 - names, no input
        f" SELECT conversation_id, entry_id, v FROM (SELECT conversation_id, entry_id,"
        f" {VECTOR} AS v FROM {q}histstore_messages) AS m WHERE v IS NOT NULL",
        f"DROP INDEX {q}{INDEX}",
        f"CREATE INDEX ix_{VECTORS}_vector ON {q}{VECTORS}"
        " USING gin (vector) WITH (gin_pending_list_limit = 256)",
        f"CREATE FUNCTION {q}{_ADDED}() {fn}"  # noqa: S608 - names, no input
        " DECLARE c0 text; c1 text; lo bigint; hi bigint; n bigint; BEGIN"
        " SELECT min(conversation_id), max(conversation_id), min(entry_id), max(entry_id),"
        " count(*) INTO c0, c1, lo, hi, n FROM added;"
        " IF n = 0 THEN RETURN NULL; END IF;"
        " IF c0 = c1 AND hi - lo + 1 = n THEN"
        f" INSERT INTO {listed} VALUES (c0, lo, hi); RETURN NULL; END IF;"
        f" INSERT INTO {listed}"
        " SELECT conversation_id, min(entry_id), max(entry_id) FROM (SELECT conversation_id,"
        " entry_id, entry_id - row_number() OVER (PARTITION BY conversation_id"
        " ORDER BY entry_id) AS run FROM added) AS r"
        " GROUP BY conversation_id, run; RETURN NULL; END $$",
        f"CREATE FUNCTION {q}{_CHANGED}() {fn} BEGIN"  # noqa: S608 - names, no input
        f" DELETE FROM {q}{VECTORS}"
        " WHERE conversation_id = OLD.conversation_id AND entry_id = OLD.entry_id;"
        f" INSERT INTO {listed} VALUES (NEW.conversation_id, NEW.entry_id, NEW.entry_id);"
        " RETURN NULL; END $$",
        # Dynamic SQL: planned for each statement's own number of rows.
        f"CREATE FUNCTION {q}{_REMOVED}() {fn} BEGIN"  # noqa: S608 - names, no input
        f" EXECUTE 'DELETE FROM {q.replace(chr(39), chr(39) * 2)}{VECTORS} AS v"
        " USING removed AS r WHERE v.conversation_id = r.conversation_id"
        " AND v.entry_id = r.entry_id'; RETURN NULL; END $$",
        f"CREATE TRIGGER {_TRIGGERS[0]} AFTER INSERT ON {q}histstore_messages"
        " REFERENCING NEW TABLE AS added FOR EACH STATEMENT"
        f" WHEN (current_setting('{_SETTING}', true) IS DISTINCT FROM 'on')"
        f" EXECUTE FUNCTION {q}{_ADDED}()",
        f"CREATE TRIGGER {_TRIGGERS[1]}"
        " AFTER UPDATE OF search_text, data, entry_id, conversation_id"
        f" ON {q}histstore_messages FOR EACH ROW"
        " WHEN (OLD.search_text IS DISTINCT FROM NEW.search_text"
        " OR OLD.data IS DISTINCT FROM NEW.data"
        " OR OLD.entry_id <> NEW.entry_id OR OLD.conversation_id <> NEW.conversation_id)"
        f" EXECUTE FUNCTION {q}{_CHANGED}()",
        f"CREATE TRIGGER {_TRIGGERS[2]} AFTER DELETE ON {q}histstore_messages"
        " REFERENCING OLD TABLE AS removed FOR EACH STATEMENT"
        f" EXECUTE FUNCTION {q}{_REMOVED}()",
    ]


def upgrade() -> None:
    if op.get_context().dialect.name == "postgresql":
        for sql in _up(schema_prefix()):
            op.execute(sql)


def downgrade() -> None:
    if op.get_context().dialect.name == "postgresql":
        for sql in _down(schema_prefix()):
            op.execute(sql)
