"""LangGraph's checkpoint tables (``histstore.checkpoints``), in ``schema.metadata``:
``schema`` imports this module, so the metadata always holds them."""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Column,
    Index,
    Integer,
    LargeBinary,
    PrimaryKeyConstraint,
    Table,
    Text,
)

from .schema import ID, UTCDateTime, metadata

__all__ = [
    "checkpoint_blobs",
    "checkpoint_channels",
    "checkpoint_text",
    "checkpoint_threads",
    "checkpoint_writes",
    "checkpoints",
]

# LangGraph checkpoints (``histstore.checkpoints``, used by
# ``histstore.integrations.langgraph``). Threads are their own namespace, apart from
# conversations; every key starts with the thread id. ``checkpoint_ns`` is "" for the
# root graph and a path such as "node:<task id>" for a subgraph.
checkpoint_threads = Table(
    "histstore_checkpoint_threads",
    metadata,
    Column("thread_id", ID, nullable=False),
    Column("owner", ID, nullable=True),
    Column("created_at", UTCDateTime, nullable=False),
    Column("updated_at", UTCDateTime, nullable=False),
    PrimaryKeyConstraint("thread_id"),
)

checkpoints = Table(
    "histstore_checkpoints",
    metadata,
    Column("thread_id", ID, nullable=False),
    Column("checkpoint_ns", Text, nullable=False),
    # LangGraph's ids sort in creation order; the newest is the last in the key.
    Column("checkpoint_id", ID, nullable=False),
    Column("parent_checkpoint_id", ID, nullable=True),
    Column("run_id", Text, nullable=True),
    # The serialized checkpoint (the serializer's type tag and bytes), without the
    # channel values kept in ``checkpoint_blobs``.
    Column("type", Text, nullable=False),
    Column("checkpoint", LargeBinary, nullable=False),
    Column("metadata", Text, nullable=False),  # JSON object
    Column("created_at", UTCDateTime, nullable=False),
    PrimaryKeyConstraint("thread_id", "checkpoint_ns", "checkpoint_id"),
    Index(None, "run_id"),
)

# A channel's value at one version, shared by every checkpoint of the thread that holds
# that version (a value is stored when it changes, not with every checkpoint). A value
# that extends the channel's value at another version of the thread (a list with items
# appended) names that version in ``base`` and holds only the items it adds (a list
# serialized the same way), so a thread's storage grows with its messages, not with
# messages x checkpoints.
checkpoint_blobs = Table(
    "histstore_checkpoint_blobs",
    metadata,
    Column("thread_id", ID, nullable=False),
    Column("checkpoint_ns", Text, nullable=False),
    Column("channel", Text, nullable=False),
    Column("version", Text, nullable=False),
    Column("type", Text, nullable=False),
    Column("blob", LargeBinary, nullable=True),
    Column("base", Text, nullable=True),
    PrimaryKeyConstraint("thread_id", "checkpoint_ns", "channel", "version"),
)

# Which version of each channel a checkpoint reads from ``checkpoint_blobs``, so that
# one statement finds a checkpoint's values by primary key.
checkpoint_channels = Table(
    "histstore_checkpoint_channels",
    metadata,
    Column("thread_id", ID, nullable=False),
    Column("checkpoint_ns", Text, nullable=False),
    Column("checkpoint_id", ID, nullable=False),
    Column("channel", Text, nullable=False),
    Column("version", Text, nullable=False),
    PrimaryKeyConstraint("thread_id", "checkpoint_ns", "checkpoint_id", "channel"),
)

# Pending writes: what each task of a step wrote, kept with the checkpoint it follows.
checkpoint_writes = Table(
    "histstore_checkpoint_writes",
    metadata,
    Column("thread_id", ID, nullable=False),
    Column("checkpoint_ns", Text, nullable=False),
    Column("checkpoint_id", ID, nullable=False),
    Column("task_id", Text, nullable=False),
    Column("idx", Integer, nullable=False),
    Column("task_path", Text, nullable=False),
    Column("channel", Text, nullable=False),
    Column("type", Text, nullable=False),
    Column("blob", LargeBinary, nullable=False),
    PrimaryKeyConstraint("thread_id", "checkpoint_ns", "checkpoint_id", "task_id", "idx"),
)

# The text search finds a thread's messages by (``store.search``): one row per item of a
# list channel holding LangChain messages, by its index in the list, with the message's
# role and text (``_core.search_text.indexed_text``). Written with the values that add
# the items, in the same transaction; an item's row is the text of the newest value
# stored with an item at that index (a value stored whole also drops the rows past its
# end). The full-text index on ``text`` is the migration's (revision 6b2d9e4f1a37):
# SQLite's FTS5 table ``histstore_checkpoint_text_fts``, Postgres's GIN index
# ``ix_histstore_checkpoint_text_vector``.
checkpoint_text = Table(
    "histstore_checkpoint_text",
    metadata,
    Column("thread_id", ID, nullable=False),
    Column("checkpoint_ns", Text, nullable=False),
    Column("channel", Text, nullable=False),
    Column("idx", BigInteger, nullable=False),
    Column("role", Text, nullable=False),
    Column("text", Text, nullable=False),
    PrimaryKeyConstraint("thread_id", "checkpoint_ns", "channel", "idx"),
)
