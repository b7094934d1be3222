"""Search: each message's indexed text, a full-text index over it, message vectors.

Adds ``histstore_messages.search_text`` and fills it for the messages already stored,
in batches (``_indexed_text`` below decides what it holds: the rule as it stood at this
revision, a copy, so that later changes to the rule never change what this revision
does; revision f3b8d6a2c915 recomputes what changed next); then the
full-text index (SQLite: an external-content FTS5 table kept by triggers; Postgres: a
generated ``search_vector = to_tsvector('simple', search_text)`` with a GIN index) and ``histstore_vectors``, whose
rows go with their message (Postgres: a cascading foreign key; SQLite: a trigger).

Revision ID: b7d4e2a91c30
Revises: 5c1e0a7d2b41
Create Date: 2026-12-01 16:00:00.000000

"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import TSVECTOR

from histstore._storage.revisions import placed_schema

# Ids compare by code point: Postgres needs the "C" collation for that.
ID = sa.String(length=255).with_variant(sa.String(length=255, collation="C"), "postgresql")

revision: str = "b7d4e2a91c30"
down_revision: str | None = "5c1e0a7d2b41"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BATCH = 2000

# Offline (--sql) the backfill cannot run (``_indexed_text`` is Python): the script from
# ``histstore migrate --sql`` ends by naming this command (histstore._storage.migrations).
offline_follow_up = "histstore reindex"

# A Table (not a lightweight ``table()``), so a schema placement translates it.
_messages = sa.Table(
    "histstore_messages",
    sa.MetaData(),
    sa.Column("conversation_id", ID, primary_key=True),
    sa.Column("position", sa.BigInteger, primary_key=True),
    sa.Column("data", sa.Text),
    sa.Column("search_text", sa.Text),
)

# SQLite: the FTS5 table reads its text from histstore_messages (by rowid, which SQLite
# keeps across VACUUM for this table) and is kept equal to it by these triggers, in the
# transaction of every statement that changes messages. ``columnsize=0``: no row of
# token counts per message (a write costs less; bm25 counts a match's tokens itself).
_SQLITE_UP = [
    "CREATE VIRTUAL TABLE histstore_messages_fts USING fts5(search_text,"
    " content='histstore_messages', content_rowid='rowid',"
    " tokenize='unicode61 remove_diacritics 0', columnsize=0)",
    "INSERT INTO histstore_messages_fts(histstore_messages_fts) VALUES ('rebuild')",
    "CREATE TRIGGER histstore_messages_fts_insert AFTER INSERT ON histstore_messages"
    " WHEN new.search_text IS NOT NULL BEGIN"
    " INSERT INTO histstore_messages_fts(rowid, search_text)"
    " VALUES (new.rowid, new.search_text); END",
    "CREATE TRIGGER histstore_messages_fts_delete AFTER DELETE ON histstore_messages"
    " WHEN old.search_text IS NOT NULL BEGIN"
    " INSERT INTO histstore_messages_fts(histstore_messages_fts, rowid, search_text)"
    " VALUES ('delete', old.rowid, old.search_text); END",
    "CREATE TRIGGER histstore_messages_fts_update AFTER UPDATE ON histstore_messages BEGIN"
    " INSERT INTO histstore_messages_fts(histstore_messages_fts, rowid, search_text)"
    " SELECT 'delete', old.rowid, old.search_text WHERE old.search_text IS NOT NULL;"
    " INSERT INTO histstore_messages_fts(rowid, search_text)"
    " SELECT new.rowid, new.search_text WHERE new.search_text IS NOT NULL; END",
    "CREATE TRIGGER histstore_vectors_gone AFTER DELETE ON histstore_messages BEGIN"
    " DELETE FROM histstore_vectors WHERE conversation_id = old.conversation_id"
    " AND position = old.position; END",
]
_SQLITE_DOWN = [
    "DROP TRIGGER IF EXISTS histstore_vectors_gone",
    "DROP TRIGGER IF EXISTS histstore_messages_fts_update",
    "DROP TRIGGER IF EXISTS histstore_messages_fts_delete",
    "DROP TRIGGER IF EXISTS histstore_messages_fts_insert",
    "DROP TABLE IF EXISTS histstore_messages_fts",
]


def _qualified(table: str) -> str:
    schema = placed_schema()
    return table if schema is None else f'"{schema}".{table}'


def upgrade() -> None:
    op.add_column(
        "histstore_messages",
        sa.Column("search_text", sa.Text(), nullable=True),
        schema=placed_schema(),
    )
    if not op.get_context().as_sql:
        _backfill()
    op.create_table(
        "histstore_vectors",
        sa.Column("conversation_id", ID, nullable=False),
        sa.Column("position", sa.BigInteger(), nullable=False),
        sa.Column("model", ID, nullable=False),
        sa.Column("vector", sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint(
            ["conversation_id", "position"],
            ["histstore_messages.conversation_id", "histstore_messages.position"],
            name=op.f("fk_histstore_vectors_conversation_id_histstore_messages"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint(
            "conversation_id", "position", "model", name=op.f("pk_histstore_vectors")
        ),
    )
    op.create_index(
        op.f("ix_histstore_vectors_model_conversation_id_position"),
        "histstore_vectors",
        ["model", "conversation_id", "position"],
    )
    if op.get_context().dialect.name == "postgresql":
        # Stored, so ranking reads each match's vector instead of parsing its text again
        # (a word most messages hold: 1M matches ranked in seconds, not tens of them).
        op.add_column(
            "histstore_messages",
            sa.Column(
                "search_vector",
                TSVECTOR(),
                sa.Computed("to_tsvector('simple'::regconfig, search_text)", persisted=True),
            ),
            schema=placed_schema(),
        )
        # A pending list of 256 kB: writes still batch their index entries, and a search
        # never has much of them to scan outside the index proper.
        op.create_index(
            "ix_histstore_messages_search",
            "histstore_messages",
            ["search_vector"],
            postgresql_using="gin",
            postgresql_with={"gin_pending_list_limit": 256},
        )
        # The planner cannot see a search's tsquery when it plans (it is computed from
        # the bound terms), guesses thousands of matches, and then starts parallel
        # workers, which costs some 5 ms where the index finds a handful of rows in
        # 0.5 ms. histstore's reads of this table are all small.
        op.execute(f"ALTER TABLE {_qualified('histstore_messages')} SET (parallel_workers = 0)")
    else:
        for statement in _SQLITE_UP:
            op.execute(statement)


def _backfill() -> None:
    """Fill ``search_text`` for the stored messages, ``BATCH`` at a time in key order."""
    bind = op.get_bind()
    m = _messages
    page = sa.select(m.c.conversation_id, m.c.position, m.c.data).order_by(
        m.c.conversation_id, m.c.position
    )
    fill = (
        sa.update(m)
        .where(
            m.c.conversation_id == sa.bindparam("c"),
            m.c.position == sa.bindparam("p"),
        )
        .values(search_text=sa.bindparam("t"))
    )
    after: tuple[str, int] | None = None
    while True:
        stmt = page
        if after is not None:
            stmt = stmt.where(
                sa.or_(
                    m.c.conversation_id > after[0],
                    sa.and_(m.c.conversation_id == after[0], m.c.position > after[1]),
                )
            )
        rows = bind.execute(stmt.limit(BATCH)).all()
        if not rows:
            return
        filled = []
        for cid, position, data in rows:
            text = _searchable(_indexed_text(json.loads(data)))
            if text is not None:
                filled.append({"c": cid, "p": position, "t": text})
        if filled:
            bind.execute(fill, filled)
        after = (rows[-1][0], rows[-1][1])


# ------------------------------------------------------------ the rule at this revision
# What a write stored in ``search_text`` from this revision until f3b8d6a2c915: a string
# ``content``; ``text``/``input_text``/``output_text`` blocks of a list content (and of an
# Anthropic ``tool_result``'s); Chat Completions tool-call and ``function_call``
# arguments; Responses ``function_call`` ``arguments``, ``custom_tool_call`` ``input``,
# ``function_call_output`` and ``custom_tool_call_output`` ``output``; Anthropic
# ``tool_use`` ``input``. JSON arguments give their string and number values. One piece
# a line; NUL becomes a space; no text is ``None``. A ``type`` that is not a string names
# no kind (a write refused such a message then; one stored before this revision is
# indexed by its content).

_TEXT_BLOCKS = frozenset({"text", "input_text", "output_text"})
_SEARCH_TEXT_BYTES = 262_144
_CALLS = frozenset({"function_call", "custom_tool_call"})
_RESULTS = frozenset({"function_call_output", "custom_tool_call_output"})


def _indexed_text(d: dict[str, Any]) -> str | None:
    content = d.get("content")
    if type(content) is str and len(d) == 2 and "role" in d:
        text = content
    else:
        text = "\n".join(p for p in _pieces(d) if p)
    return text.replace("\x00", " ") or None


def _searchable(text: str | None) -> str | None:
    """``text`` cut to its first 256 KiB of UTF-8, on a character boundary. Not the rule
    of this revision's writes, which stored it whole, but the fill's: PostgreSQL refuses
    a ``tsvector`` over 1 MiB, which the generated column made below would be for a long
    message stored before search existed, failing the upgrade. Writes cut so from
    f3b8d6a2c915's release on, and d9e3b5a7c1f4 cuts what they stored whole before."""
    if text is None or len(text) * 4 <= _SEARCH_TEXT_BYTES:
        return text
    raw = text.encode("utf-8", "surrogatepass")
    if len(raw) <= _SEARCH_TEXT_BYTES:
        return text
    cut = _SEARCH_TEXT_BYTES
    while raw[cut] & 0xC0 == 0x80:  # inside a character: back to where it starts
        cut -= 1
    return raw[:cut].decode("utf-8", "surrogatepass")


def _pieces(d: dict[str, Any]) -> Iterator[str]:
    kind = d.get("type")
    kind = kind if isinstance(kind, str) else None
    yield from _content(d.get("content"))
    calls = d.get("tool_calls")
    if isinstance(calls, list):
        for call in calls:
            fn = call.get("function") if isinstance(call, dict) else None
            if isinstance(fn, dict):
                yield from _arguments(fn.get("arguments"))
    legacy = d.get("function_call")
    if isinstance(legacy, dict):
        yield from _arguments(legacy.get("arguments"))
    if kind in _CALLS:
        yield from _arguments(d.get("arguments"))
        yield from _arguments(d.get("input"))
    elif kind in _RESULTS:
        yield from _content(d.get("output"))


def _content(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, list):
        for block in value:
            if isinstance(block, str):
                yield block
            elif isinstance(block, dict):
                yield from _block(block)


def _block(block: dict[str, Any]) -> Iterator[str]:
    kind = block.get("type")
    if not isinstance(kind, str):
        return
    if kind in _TEXT_BLOCKS:
        text = block.get("text")
        if isinstance(text, str):
            yield text
    elif kind == "tool_use":
        yield from _values(block.get("input"))
    elif kind == "tool_result":
        yield from _content(block.get("content"))


def _arguments(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        try:
            decoded = json.loads(value)
        except ValueError:
            yield value
            return
        if isinstance(decoded, (dict, list)):
            yield from _values(decoded)
        else:
            yield value
    elif value is not None:
        yield from _values(value)


def _values(value: Any) -> Iterator[str]:
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            yield v
        elif isinstance(v, bool) or v is None:
            continue
        elif isinstance(v, (int, float)):
            yield str(v)
        elif isinstance(v, dict):
            stack.extend(reversed(list(v.values())))
        elif isinstance(v, list):
            stack.extend(reversed(v))


def downgrade() -> None:
    if op.get_context().dialect.name == "postgresql":
        op.execute(f"ALTER TABLE {_qualified('histstore_messages')} RESET (parallel_workers)")
        op.drop_index(
            "ix_histstore_messages_search", table_name="histstore_messages", schema=placed_schema()
        )
        op.drop_column("histstore_messages", "search_vector", schema=placed_schema())
    else:
        for statement in _SQLITE_DOWN:
            op.execute(statement)
    op.drop_index(
        op.f("ix_histstore_vectors_model_conversation_id_position"),
        table_name="histstore_vectors",
        schema=placed_schema(),
    )
    op.drop_table("histstore_vectors", schema=placed_schema())
    op.drop_column("histstore_messages", "search_text", schema=placed_schema())
