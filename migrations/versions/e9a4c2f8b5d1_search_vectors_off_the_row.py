"""PostgreSQL: a write lists its messages for the full-text index; the store indexes the list.

Until now every message row carried a generated ``search_vector = to_tsvector('simple',
search_text)``, computed inside the INSERT that stored it: about 40 us of the server's
time for a 500-byte message, three quarters of a bulk write. Now the vectors live in
``histstore_search_vectors``, one row per message keyed by its stable entry id
(``conversation_id, entry_id``), with the GIN index; a write only lists what it stored
in ``histstore_search_pending`` (one row per run of consecutive entry ids, made by a
statement trigger from the INSERT's new rows), in its own transaction. The store moves
listed messages into the vectors in batches of their own (``_storage.search_index``),
and a search reads the vectors plus the listed messages, whose vectors it computes, so
it finds every write that committed before it.

* An update of ``search_text`` drops the message's vector and lists it again (a row
  trigger that only an UPDATE naming the column fires: moving positions does not).
* A delete drops the deleted messages' vectors (a statement trigger, planned per
  statement). A run listed for messages deleted since is dropped by the next indexing.
* ``ix_histstore_messages_entry`` finds a message by entry id (vectors and listed runs
  name messages so). Splices that move positions no longer rewrite index entries of
  vectors: a vector is not part of the row.

Existing vectors are moved, not computed again. SQLite: nothing (revision b1e6f0c4a7d3
gave its FTS5 index a pending list). Downgrade: the generated column and its GIN index
come back (computed again for every message), the tables, triggers and the entry index
go. All of it is SQL, so ``--sql`` carries it.

Revision ID: e9a4c2f8b5d1
Revises: b1e6f0c4a7d3
Create Date: 2026-12-04 10:30:00.000000

"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

from histstore._storage.revisions import schema_prefix

revision: str = "e9a4c2f8b5d1"
down_revision: str | None = "b1e6f0c4a7d3"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_ADDED = "histstore_search_list_added"
_CHANGED = "histstore_search_list_changed"
_REMOVED = "histstore_search_drop_removed"


def _up(q: str) -> list[str]:
    # ``SET search_path FROM CURRENT``: offline, the tables a function names are found
    # where the script put them (online they are named with their schema).
    fn = "RETURNS trigger LANGUAGE plpgsql SET search_path FROM CURRENT AS $$ BEGIN"
    return [
        f"CREATE TABLE {q}histstore_search_vectors ("
        ' conversation_id varchar(255) COLLATE "C" NOT NULL, entry_id bigint NOT NULL,'
        " vector tsvector NOT NULL,"
        " CONSTRAINT pk_histstore_search_vectors PRIMARY KEY (conversation_id, entry_id))",
        f"ALTER TABLE {q}histstore_search_vectors SET (parallel_workers = 0)",
        f"CREATE TABLE {q}histstore_search_pending ("
        ' conversation_id varchar(255) COLLATE "C" NOT NULL,'
        " first_entry bigint NOT NULL, last_entry bigint NOT NULL)",
        f"CREATE INDEX ix_histstore_messages_entry ON {q}histstore_messages"
        " (conversation_id, entry_id)",
        f"INSERT INTO {q}histstore_search_vectors (conversation_id, entry_id, vector)"  # noqa: S608 - names, no input
        f" SELECT conversation_id, entry_id, search_vector FROM {q}histstore_messages"
        " WHERE search_vector IS NOT NULL",
        f"DROP INDEX {q}ix_histstore_messages_search",
        f"ALTER TABLE {q}histstore_messages DROP COLUMN search_vector",
        # A pending list of 256 kB, as the index on the row had.
        f"CREATE INDEX ix_histstore_search_vectors_vector ON {q}histstore_search_vectors"
        " USING gin (vector) WITH (gin_pending_list_limit = 256)",
        # Each run of consecutive entry ids of a conversation among the new rows; first
        # the common case, one run (an append), in one pass over them.
        f"CREATE FUNCTION {q}{_ADDED}() RETURNS trigger LANGUAGE plpgsql"  # noqa: S608 - names, no input
        " SET search_path FROM CURRENT AS $$"
        " DECLARE c0 text; c1 text; lo bigint; hi bigint; n bigint; BEGIN"
        " SELECT min(conversation_id), max(conversation_id), min(entry_id), max(entry_id),"
        " count(*) INTO c0, c1, lo, hi, n FROM added WHERE search_text IS NOT NULL;"
        " IF n = 0 THEN RETURN NULL; END IF;"
        " IF c0 = c1 AND hi - lo + 1 = n THEN"
        f" INSERT INTO {q}histstore_search_pending (conversation_id, first_entry, last_entry)"
        " VALUES (c0, lo, hi); RETURN NULL; END IF;"
        f" INSERT INTO {q}histstore_search_pending (conversation_id, first_entry, last_entry)"
        " SELECT conversation_id, min(entry_id), max(entry_id) FROM (SELECT conversation_id,"
        " entry_id, entry_id - row_number() OVER (PARTITION BY conversation_id"
        " ORDER BY entry_id) AS run FROM added WHERE search_text IS NOT NULL) AS r"
        " GROUP BY conversation_id, run; RETURN NULL; END $$",
        f"CREATE TRIGGER histstore_search_added AFTER INSERT ON {q}histstore_messages"
        f" REFERENCING NEW TABLE AS added FOR EACH STATEMENT EXECUTE FUNCTION {q}{_ADDED}()",
        f"CREATE FUNCTION {q}{_CHANGED}() {fn}"  # noqa: S608 - names, no input
        f" DELETE FROM {q}histstore_search_vectors"
        " WHERE conversation_id = OLD.conversation_id AND entry_id = OLD.entry_id;"
        " IF NEW.search_text IS NOT NULL THEN"
        f" INSERT INTO {q}histstore_search_pending (conversation_id, first_entry, last_entry)"
        " VALUES (NEW.conversation_id, NEW.entry_id, NEW.entry_id); END IF;"
        " RETURN NULL; END $$",
        "CREATE TRIGGER histstore_search_changed"
        " AFTER UPDATE OF search_text, entry_id, conversation_id"
        f" ON {q}histstore_messages FOR EACH ROW"
        " WHEN (OLD.search_text IS DISTINCT FROM NEW.search_text"
        " OR OLD.entry_id <> NEW.entry_id OR OLD.conversation_id <> NEW.conversation_id)"
        f" EXECUTE FUNCTION {q}{_CHANGED}()",
        # Dynamic SQL: planned for each statement's own number of rows (a cached plan
        # made for a clear of thousands would scan the vectors for a pop of one).
        f"CREATE FUNCTION {q}{_REMOVED}() {fn}"  # noqa: S608 - names, no input
        f" EXECUTE 'DELETE FROM {q.replace(chr(39), chr(39) * 2)}histstore_search_vectors AS v"
        " USING removed AS r WHERE v.conversation_id = r.conversation_id"
        " AND v.entry_id = r.entry_id'; RETURN NULL; END $$",
        f"CREATE TRIGGER histstore_search_removed AFTER DELETE ON {q}histstore_messages"
        f" REFERENCING OLD TABLE AS removed FOR EACH STATEMENT EXECUTE FUNCTION {q}{_REMOVED}()",
    ]


def _down(q: str) -> list[str]:
    return [
        f"DROP TRIGGER histstore_search_added ON {q}histstore_messages",
        f"DROP TRIGGER histstore_search_changed ON {q}histstore_messages",
        f"DROP TRIGGER histstore_search_removed ON {q}histstore_messages",
        f"DROP FUNCTION {q}{_ADDED}()",
        f"DROP FUNCTION {q}{_CHANGED}()",
        f"DROP FUNCTION {q}{_REMOVED}()",
        f"ALTER TABLE {q}histstore_messages ADD COLUMN search_vector tsvector"
        " GENERATED ALWAYS AS (to_tsvector('simple'::regconfig, search_text)) STORED",
        f"CREATE INDEX ix_histstore_messages_search ON {q}histstore_messages"
        " USING gin (search_vector) WITH (gin_pending_list_limit = 256)",
        f"DROP TABLE {q}histstore_search_pending",
        f"DROP TABLE {q}histstore_search_vectors",
        f"DROP INDEX {q}ix_histstore_messages_entry",
    ]


def upgrade() -> None:
    if op.get_context().dialect.name != "postgresql":
        return
    for sql in _up(schema_prefix()):
        op.execute(sql)


def downgrade() -> None:
    if op.get_context().dialect.name != "postgresql":
        return
    for sql in _down(schema_prefix()):
        op.execute(sql)
