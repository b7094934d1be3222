"""The tables, as one ``MetaData``. Alembic migrations create them; this module only describes.

Every table is prefixed ``histstore_`` so it can live in a host application's database,
and every primary key starts with the conversation id, so the schema can be distributed
by conversation. JSON is kept as text: it round-trips exactly (key order, ``"\\u0000"``,
large numbers) on both backends.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from sqlalchemy import (
    BigInteger,
    Column,
    DateTime,
    Dialect,
    Float,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
    literal_column,
    text,
)
from sqlalchemy.types import TypeDecorator

from .statements.kinds import is_sqlite

ONE = literal_column("1", BigInteger)
"""1 written into the SQL: a bound constant costs a conversion at every execution."""

__all__ = [
    "CONVERSATION_TABLES",
    "FTS_LISTED",
    "FTS_TABLE",
    "LISTED_CHANGE",
    "ONE",
    "PG_TEXT_INDEX",
    "THREAD_FTS",
    "THREAD_TEXT_INDEX",
    "VERSION_TABLE",
    "asides",
    "changes",
    "checkpoint_blobs",
    "checkpoint_channels",
    "checkpoint_text",
    "checkpoint_threads",
    "checkpoint_writes",
    "checkpoints",
    "conversations",
    "described",
    "item_vectors",
    "items",
    "leases",
    "list_items",
    "lists",
    "messages",
    "metadata",
    "metadata_entries",
    "summaries",
    "turns",
    "vector_marks",
    "vectors",
    "writes",
]

VERSION_TABLE = "histstore_alembic_version"

FTS_TABLE = "histstore_messages_fts"
"""SQLite's full-text index of ``messages.search_text`` (an FTS5 table; its shadow
tables are named after it)."""
FTS_LISTED = "histstore_messages_fts_queued"
"""SQLite's pending list of the full-text index (``_storage.search_index``): renamed by
revisions c8d2f4a6e1b9 (from ``..._pending``) and e5c3a9d7f2b4 (from ``..._listed``),
so that no older process indexes it."""
UNLISTED_FTS = "histstore_unlisted_fts"
"""A read-only SQLite store's per-search FTS5 table (in the connection's temporary
database) of the messages on the full-text index's pending list (``_storage.search_index``)."""
PG_TEXT_INDEX = "ix_histstore_messages_text"
"""Postgres's full-text index of messages: GIN on the ``to_tsvector`` of their text
(revision 5b7e2d4a9c13; ``_storage.statements.search.pg_vector``)."""
THREAD_FTS = "histstore_checkpoint_text_fts"
"""SQLite's full-text index of ``checkpoint_text.text`` (an FTS5 table kept by triggers)."""
THREAD_TEXT_INDEX = "ix_histstore_checkpoint_text_vector"
"""Postgres's full-text index of ``checkpoint_text.text``: GIN on its ``to_tsvector``."""
VECTORS_FOREIGN_KEY = "fk_histstore_vectors_conversation_id_histstore_messages"
"""The foreign key of semantic vectors to messages, until f7c2a9d3e8b4 (SQLite keeps it)."""


def described(name: str | None, type_: str) -> bool:
    """Whether a histstore table, column or index is one this metadata describes: the
    full-text index (SQLite's FTS5 table and its pending list; Postgres's GIN index on an
    expression of the messages' text) is made by its migration alone, as it
    differs by database, and so is the semantic vectors' foreign key (SQLite only)."""
    if name is None:
        return True
    if type_ == "table":
        return not name.startswith((FTS_TABLE, THREAD_FTS))
    if type_ == "index":
        return name not in (PG_TEXT_INDEX, THREAD_TEXT_INDEX)
    if type_ == "foreign_key_constraint":  # SQLite's tables keep it, unenforced
        return name != VECTORS_FOREIGN_KEY
    return True


metadata = MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "ck": "ck_%(table_name)s_%(constraint_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    }
)


class UTCDateTime(TypeDecorator[datetime]):
    """An aware UTC ``datetime`` on every backend (SQLite keeps naive UTC text)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime")
        value = value.astimezone(timezone.utc)
        return value.replace(tzinfo=None) if is_sqlite(dialect) else value

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=timezone.utc)  # type: ignore[no-any-return]
        return value.astimezone(timezone.utc)  # type: ignore[no-any-return]


# Ids sort by code point everywhere: SQLite compares UTF-8 bytes by default; Postgres
# needs the "C" collation for that (its default collation follows the locale).
ID = String(255).with_variant(String(255, collation="C"), "postgresql")

conversations = Table(
    "histstore_conversations",
    metadata,
    Column("id", ID, nullable=False),
    Column("owner", ID, nullable=True),
    Column("system_prompt", Text, nullable=True),
    # The number of messages: the next position handed out. Changed only under the
    # conversation's write lock, so positions stay dense.
    Column("length", BigInteger, nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
    Column("updated_at", UTCDateTime, nullable=False),
    # Editable history (SPEC 11), changed only under the same lock: the number of change
    # records, the next entry id and aside id handed out (ids are never given twice),
    # and why the model's owed answer is left unasked for (NULL: not halted; a write,
    # a pop or an edit reaching the end clears it).
    Column("revision", BigInteger, nullable=False, server_default=text("0")),
    Column("next_entry", BigInteger, nullable=False, server_default=text("1")),
    Column("next_aside", BigInteger, nullable=False, server_default=text("1")),
    Column("halted", Text, nullable=True),
    # Changes made by a histstore that lists what it inserts for the full-text index
    # (a2f6c8e4d0b3): each statement setting ``length`` or ``revision`` adds one
    # (``LISTED_CHANGE``). On SQLite a change leaving it as it was is an older writer's
    # (relying on a trigger to list its messages): the database refuses it.
    Column("listed_changes", BigInteger, nullable=False, server_default=text("0")),
    PrimaryKeyConstraint("id"),
    Index(None, "created_at", "id"),
    Index(None, "updated_at", "id"),
    Index(None, "owner", "id"),
    Index(None, "owner", "created_at", "id"),
    Index(None, "owner", "updated_at", "id"),
)

LISTED_CHANGE: dict[str, Any] = {"listed_changes": conversations.c.listed_changes + ONE}
"""The SET clause every UPDATE of a conversation's ``length`` or ``revision`` carries (an
INSERT gives ``listed_changes=1``): see the column. ``ONE`` is written into the SQL."""

messages = Table(
    "histstore_messages",
    metadata,
    Column("conversation_id", ID, nullable=False),
    Column("position", BigInteger, nullable=False),
    # 'system' for a system message, NULL for any other (``_core.rules.role_key``): it
    # serves the index of system messages only (older rows hold any role).
    Column("role", Text, nullable=True),
    Column("data", Text, nullable=False),
    Column("token_count", Integer, nullable=True),
    Column("created_at", UTCDateTime, nullable=False),
    # What search finds the message by, where not its string ``content`` (NULL then, or
    # with no text; '' for no text beside a string content: ``rows.stored_search_text``).
    # The full-text index covers ``statements.search.message_text``: SQLite's FTS5 table
    # ``histstore_messages_fts`` (external content), Postgres's ``PG_TEXT_INDEX``; both
    # are the migrations', not described here (``statements.search`` queries them).
    Column("search_text", Text, nullable=True),
    # The entry's stable id in its conversation (SPEC 11) and who edited it in (NULL
    # for what ``write`` stores). No index: reads go by position.
    Column("entry_id", BigInteger, nullable=False),
    Column("author", Text, nullable=True),
    # On PostgreSQL ``DEFERRABLE INITIALLY IMMEDIATE`` (the migrations', revision
    # a6d3f9c2e4b8): checked at the end of each statement, so an edit moves rows in one
    # UPDATE (``statements.dialects.moves_in_one_update``).
    PrimaryKeyConstraint("conversation_id", "position"),
    # System messages are found without reading the history (WindowStore merges them).
    Index(
        "ix_histstore_messages_system",
        "conversation_id",
        "position",
        sqlite_where=text("role = 'system'"),
        postgresql_where=text("role = 'system'"),
    ),
    # Entries an editor made (a compaction's summary, a moderation edit) are found
    # without reading the history; plain writes (author NULL) never touch this index.
    Index(
        "ix_histstore_messages_authored",
        "conversation_id",
        "position",
        sqlite_where=text("author IS NOT NULL"),
        postgresql_where=text("author IS NOT NULL"),
    ),
)

# One row per stored batch under its idempotency key (the caller's or one the store
# made): where it went, a digest of its messages (``_core.codec.digest``; older rows
# hold 64 hex digits; ``rows.CLAIMED``: a claim, no batch). SQLite keeps it WITHOUT
# ROWID (c2e4a6f8b0d1): the key is stored once, in the table's own order.
writes = Table(
    "histstore_writes",
    metadata,
    Column("conversation_id", ID, nullable=False),
    Column("key", ID, nullable=False),
    Column("position", BigInteger, nullable=False),
    Column("count", Integer, nullable=False),
    Column("digest", String(64), nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
    # A batch that stored something is also the change record at ``revision``: it
    # appended its last ``appended`` messages (``_editable.change_log`` recovers its
    # entries from those that followed). NULL: it only confirmed messages stored before.
    Column("revision", BigInteger, nullable=True),
    Column("appended", Integer, nullable=True),
    PrimaryKeyConstraint("conversation_id", "key"),
    # The change log is read by revision, from where a read starts (f1c3a5e7b9d2).
    Index(
        "ix_histstore_writes_revision",
        "conversation_id",
        "revision",
        sqlite_where=text("revision IS NOT NULL"),
        postgresql_where=text("revision IS NOT NULL"),
    ),
    sqlite_with_rowid=False,
)

# Every other change record (SPEC 11): edits, pops, saves, fork targets, imports.
# ``record`` is the change's JSON (``_editable.change_log.encode``): the entries it
# removed in full, those it added only counted (recovered from what followed).
changes = Table(
    "histstore_changes",
    metadata,
    Column("conversation_id", ID, nullable=False),
    Column("revision", BigInteger, nullable=False),
    Column("kind", Text, nullable=False),
    Column("author", Text, nullable=True),
    Column("at", UTCDateTime, nullable=False),
    Column("record", Text, nullable=False),
    # The lowest position the change touched, where its own state placed it (the
    # length it met when it touched none): the entries below it stood as they were.
    # 0, the default, claims nothing (a row an older histstore wrote). The oldest page
    # of the log asks whether any later record reached below what it returns (c8e1f4a2d7b6).
    Column("touched_from", BigInteger, nullable=False, server_default=text("0")),
    PrimaryKeyConstraint("conversation_id", "revision"),
    Index("ix_histstore_changes_touched", "conversation_id", "touched_from", "revision"),
)

# A conversation's asides now: JSON values drawn after an entry (``after``; NULL: before
# every entry); ``home`` is the entry it was put after, which it follows again when a
# restore brings that entry back.
asides = Table(
    "histstore_asides",
    metadata,
    Column("conversation_id", ID, nullable=False),
    Column("aside_id", BigInteger, nullable=False),
    Column("after", BigInteger, nullable=True),
    Column("home", BigInteger, nullable=True),
    Column("value", Text, nullable=False),
    PrimaryKeyConstraint("conversation_id", "aside_id"),
)

# Turn records: a turn of model work from ``start`` (an entry id), how it ended and the
# model's token usage (a JSON object with the four counts), NULL while open.
turns = Table(
    "histstore_turns",
    metadata,
    Column("conversation_id", ID, nullable=False),
    Column("number", BigInteger, nullable=False),
    Column("start", BigInteger, nullable=False),
    Column("opened_at", UTCDateTime, nullable=False),
    Column("end", Text, nullable=True),
    Column("ended_at", UTCDateTime, nullable=True),
    Column("usage", Text, nullable=True),
    PrimaryKeyConstraint("conversation_id", "number"),
)

summaries = Table(
    "histstore_summaries",
    metadata,
    Column("conversation_id", ID, nullable=False),
    Column("seq", Integer, nullable=False),
    Column("start", BigInteger, nullable=False),
    Column("end", BigInteger, nullable=False),
    Column("content", Text, nullable=False),
    Column("token_count", Integer, nullable=True),
    Column("created_at", UTCDateTime, nullable=False),
    PrimaryKeyConstraint("conversation_id", "seq"),
)

# Metadata keys have no length limit, so the table is keyed by a digest of the key
# rather than the key (which an index could not hold past a few kilobytes); ``key``
# keeps the whole stored key (``_core.codec.key_to_stored``), sorting by code point.
metadata_entries = Table(
    "histstore_metadata",
    metadata,
    Column("conversation_id", ID, nullable=False),
    Column("key", Text().with_variant(Text(collation="C"), "postgresql"), nullable=False),
    # SHA-256 of the stored key (``_core.codec.key_digest``): what every lookup by key uses.
    Column("key_digest", String(64), nullable=False),
    Column("value", Text, nullable=False),
    # SHA-256 of the value's canonical JSON: what metadata filters compare, by index.
    Column("digest", String(64), nullable=False),
    PrimaryKeyConstraint("conversation_id", "key_digest"),
    Index(None, "key_digest", "digest", "conversation_id"),
)

lists = Table(
    "histstore_lists",
    metadata,
    Column("conversation_id", ID, nullable=False),
    Column("name", ID, nullable=False),
    Column("length", BigInteger, nullable=False),
    PrimaryKeyConstraint("conversation_id", "name"),
)

list_items = Table(
    "histstore_list_items",
    metadata,
    Column("conversation_id", ID, nullable=False),
    Column("name", ID, nullable=False),
    Column("idx", BigInteger, nullable=False),
    # JSON text, or NULL when the item is ``bytes`` (kept in ``blob``).
    Column("value", Text, nullable=True),
    Column("blob", LargeBinary, nullable=True),
    PrimaryKeyConstraint("conversation_id", "name", "idx"),
)

# Embeddings of messages for ``SemanticIndex``: one unit-length float32 vector (little
# endian) per message and embedding model. Deleting a message deletes its vectors in the
# same statement (a trigger on each database; no foreign key, whose check of every moved
# row was half of a long splice: f7c2a9d3e8b4): a vector belongs to the message there now.
vectors = Table(
    "histstore_vectors",
    metadata,
    Column("conversation_id", ID, nullable=False),
    Column("position", BigInteger, nullable=False),
    Column("model", ID, nullable=False),
    Column("vector", LargeBinary, nullable=False),
    PrimaryKeyConstraint("conversation_id", "position", "model"),
    Index(None, "model", "conversation_id", "position"),
)

# How far ``SemanticIndex.update`` got in a conversation for a model: each message at
# ``position`` or before had a vector of the model (or no text) when the update looked.
# Deleting messages lowers it (a trigger on each database, revision d2b7e4a9c1f3), and so
# does a splice that moves them (``statements.editing``); each lowering changes
# ``lowered`` (which starts at a random number), and an update raises ``position`` only
# while ``lowered`` is what it read before it looked.
vector_marks = Table(
    "histstore_vector_marks",
    metadata,
    Column("conversation_id", ID, nullable=False),
    Column("model", ID, nullable=False),
    Column("position", BigInteger, nullable=False),
    Column("lowered", BigInteger, nullable=False),
    PrimaryKeyConstraint("conversation_id", "model"),
)

# Tables holding rows of a conversation, children first (clear deletes in this order).
CONVERSATION_TABLES = (
    vector_marks,
    vectors,
    messages,
    writes,
    changes,
    asides,
    turns,
    summaries,
    metadata_entries,
    list_items,
    lists,
)

# Turn leases: who holds a conversation id for a turn, and until when. ``expires_at``
# is seconds since the epoch by the database's clock (every holder, in any process,
# compares against the same clock). A lease is about the id, not its contents: clear
# and purge leave it, and it ends by release or expiry.
leases = Table(
    "histstore_leases",
    metadata,
    Column("id", ID, nullable=False),
    Column("holder", String(64), nullable=False),
    Column("expires_at", Float(precision=53), nullable=False),
    PrimaryKeyConstraint("id"),
)

# LangGraph's checkpoint tables are in ``checkpoint_tables``, in this metadata.
from .checkpoint_tables import (  # noqa: E402 - they are made in the metadata above
    checkpoint_blobs,
    checkpoint_channels,
    checkpoint_text,
    checkpoint_threads,
    checkpoint_writes,
    checkpoints,
)
from .item_tables import item_vectors, items  # noqa: E402 - the same, for ``histstore.items``
