"""Metadata keys of any length: the metadata table is keyed by a digest of the key.

``histstore_metadata.key`` becomes unbounded text, and a new column ``key_digest``
holds the SHA-256 hex digest of the stored key's UTF-8 bytes (``_key_digest``, as
``histstore._core.codec.key_digest`` computes it),
filled here for the rows already stored, in batches. The primary key becomes
``(conversation_id, key_digest)`` and the filter index ``(key_digest, digest,
conversation_id)``: neither holds the key itself, which an index could not hold past a
few kilobytes. SQLite cannot change a primary key in place, so there the table is
copied once (Alembic's batch mode, from the table described below, not reflected).

Offline (``--sql``) no Python runs: on PostgreSQL the digests are computed by SQL
(``sha256``, PostgreSQL 11 and later); on SQLite the script suits an empty table only
(the copy refuses a row without a digest).

Downgrading refuses (``SchemaError``) while a stored key is longer than 255 characters,
the old key column's size.

Revision ID: 0313065f7133
Revises: b7d4e2a91c30
Create Date: 2026-12-01 16:10:00.000000

"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from histstore._storage.revisions import SchemaError, placed_schema

# Ids compare by code point: Postgres needs the "C" collation for that (keys too).
ID = sa.String(length=255).with_variant(sa.String(length=255, collation="C"), "postgresql")
KEY = sa.Text().with_variant(sa.Text(collation="C"), "postgresql")
DIGEST = sa.String(length=64)

revision: str = "0313065f7133"
down_revision: str | None = "b7d4e2a91c30"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BATCH = 2000
OLD_KEY_LENGTH = 255

TABLE = "histstore_metadata"
PK = "pk_histstore_metadata"
OLD_INDEX = "ix_histstore_metadata_key_digest_conversation_id"  # on (key, digest, ...)
NEW_INDEX = "ix_histstore_metadata_key_digest_digest_conversation_id"


def _table(*, new: bool) -> sa.Table:
    """The table as it stands before the batch changes it: the old shape plus a
    nullable ``key_digest`` (upgrade), or the new shape (downgrade). SQLite's copy is
    made from this, so nothing depends on reflection."""
    pk = ("conversation_id", "key_digest") if new else ("conversation_id", "key")
    index = (
        sa.Index(NEW_INDEX, "key_digest", "digest", "conversation_id")
        if new
        else sa.Index(OLD_INDEX, "key", "digest", "conversation_id")
    )
    return sa.Table(
        TABLE,
        sa.MetaData(),
        sa.Column("conversation_id", ID, nullable=False),
        sa.Column("key", KEY if new else ID, nullable=False),
        sa.Column("value", sa.Text(), nullable=False),
        sa.Column("digest", DIGEST, nullable=False),
        sa.Column("key_digest", DIGEST, nullable=not new),
        sa.PrimaryKeyConstraint(*pk, name=PK),
        index,
    )


def upgrade() -> None:
    schema = placed_schema()
    op.add_column(TABLE, sa.Column("key_digest", DIGEST, nullable=True), schema=schema)
    if not op.get_context().as_sql:
        _backfill()
    elif op.get_context().dialect.name == "postgresql":
        op.execute(
            "UPDATE histstore_metadata"
            " SET key_digest = encode(sha256(convert_to(key, 'UTF8')), 'hex')"
        )
    with op.batch_alter_table(TABLE, schema=schema, copy_from=_table(new=False)) as batch:
        batch.drop_index(OLD_INDEX)
        batch.drop_constraint(PK, type_="primary")
        batch.alter_column("key", type_=KEY, existing_type=ID, existing_nullable=False)
        batch.alter_column("key_digest", nullable=False, existing_type=DIGEST)
        batch.create_primary_key(PK, ["conversation_id", "key_digest"])
        batch.create_index(NEW_INDEX, ["key_digest", "digest", "conversation_id"])


def _backfill() -> None:
    """Fill ``key_digest`` for the stored rows, ``BATCH`` at a time in key order."""
    bind = op.get_bind()
    m = _table(new=False)
    page = sa.select(m.c.conversation_id, m.c.key).order_by(m.c.conversation_id, m.c.key)
    fill = (
        sa.update(m)
        .where(m.c.conversation_id == sa.bindparam("c"), m.c.key == sa.bindparam("k"))
        .values(key_digest=sa.bindparam("d"))
    )
    after: tuple[str, str] | None = None
    while True:
        stmt = page
        if after is not None:
            stmt = stmt.where(
                sa.or_(
                    m.c.conversation_id > after[0],
                    sa.and_(m.c.conversation_id == after[0], m.c.key > after[1]),
                )
            )
        rows = bind.execute(stmt.limit(BATCH)).all()
        if not rows:
            return
        bind.execute(fill, [{"c": c, "k": k, "d": _key_digest(k)} for c, k in rows])
        after = (rows[-1][0], rows[-1][1])


def _key_digest(stored: str) -> str:
    """The SHA-256 hex digest of a stored key's UTF-8 bytes (what the SQL above computes
    offline on PostgreSQL)."""
    return hashlib.sha256(stored.encode("utf-8")).hexdigest()


def downgrade() -> None:
    schema = placed_schema()
    if not op.get_context().as_sql:
        _refuse_long_keys()
    with op.batch_alter_table(TABLE, schema=schema, copy_from=_table(new=True)) as batch:
        batch.drop_index(NEW_INDEX)
        batch.drop_constraint(PK, type_="primary")
        batch.alter_column("key", type_=ID, existing_type=KEY, existing_nullable=False)
        batch.create_primary_key(PK, ["conversation_id", "key"])
        batch.create_index(OLD_INDEX, ["key", "digest", "conversation_id"])
        batch.drop_column("key_digest")


def _refuse_long_keys() -> None:
    """``SchemaError`` when a stored key does not fit the old key column."""
    m = _table(new=True)
    long_ = sa.func.length(m.c.key) > OLD_KEY_LENGTH
    bind = op.get_bind()
    count = bind.execute(sa.select(sa.func.count()).where(long_)).scalar_one()
    if not count:
        return
    ids = list(
        bind.execute(
            sa.select(m.c.conversation_id)
            .where(long_)
            .group_by(m.c.conversation_id)
            .order_by(m.c.conversation_id)
            .limit(4)
        ).scalars()
    )
    named = ", ".join(map(repr, ids[:3])) + (", ..." if len(ids) > 3 else "")
    raise SchemaError(
        f"cannot downgrade below revision {revision}: {count} metadata key(s) are longer"
        f" than {OLD_KEY_LENGTH} characters, which the older schema cannot hold"
        f" (in conversations {named}); remove those keys first"
    )
