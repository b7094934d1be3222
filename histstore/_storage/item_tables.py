"""The tables of long-term memory items (``histstore.items``, LangGraph's ``BaseStore``),
in ``schema.metadata``: ``schema`` imports this module, so the metadata always holds them."""

from __future__ import annotations

from sqlalchemy import Column, Float, Index, LargeBinary, PrimaryKeyConstraint, Table, Text, text

from .schema import UTCDateTime, metadata

__all__ = ["item_vectors", "items"]

# Keys and namespaces sort by code point (Postgres: the "C" collation), so a namespace
# prefix is one range of the primary key: a namespace is its labels joined by "." (a
# label holds no "."), and the namespaces under P are P itself and [P + ".", P + "/").
KEY = Text().with_variant(Text(collation="C"), "postgresql")

# One JSON object per (namespace, key). ``ttl`` is in minutes (NULL: never expires);
# ``expires_at`` is when it expires unless a write or a refreshing read moves it on.
items = Table(
    "histstore_items",
    metadata,
    Column("namespace", KEY, nullable=False),
    Column("key", KEY, nullable=False),
    Column("value", Text, nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
    Column("updated_at", UTCDateTime, nullable=False),
    Column("ttl", Float(precision=53), nullable=True),
    Column("expires_at", UTCDateTime, nullable=True),
    PrimaryKeyConstraint("namespace", "key"),
    # A sweep finds the expired items without reading the others.
    Index(
        "ix_histstore_items_expires_at",
        "expires_at",
        sqlite_where=text("expires_at IS NOT NULL"),
        postgresql_where=text("expires_at IS NOT NULL"),
    ),
)

# An item's embeddings: one unit-length float32 vector (little endian) per text it was
# indexed by (``field`` names the path, ``"$"`` for the whole value, ``path.N`` for the
# N-th of several texts). Written and deleted with the item, in the same transaction.
item_vectors = Table(
    "histstore_item_vectors",
    metadata,
    Column("namespace", KEY, nullable=False),
    Column("key", KEY, nullable=False),
    Column("field", Text, nullable=False),
    Column("vector", LargeBinary, nullable=False),
    PrimaryKeyConstraint("namespace", "key", "field"),
)
