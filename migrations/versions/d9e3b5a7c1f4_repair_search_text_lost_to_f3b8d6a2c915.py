"""Repair: messages revision f3b8d6a2c915 left without search text are found again, and
text stored before the 256 KiB cut is cut as a write cuts it.

Until this revision, f3b8d6a2c915 rewrote its candidate rows (a ``LIKE`` on the JSON,
e.g. ``%tool_calls"%``, whose ``_`` matches any character) with the runtime's rules,
which were those of c8d2f4a6e1b9: NULL where the text is the string content. At
f3b8d6a2c915 NULL is no text, and c8d2f4a6e1b9 turned it into ``''``, still no text. So
a message whose string content is its text and whose JSON matched, such as a plain
``{"role": "user", "content": "... tool calls"}`` (``tool_calls``, ``tool-calls``),
was found by search before the upgrade and not after it. f3b8d6a2c915 now carries its
own copy of the rules; this revision mends the databases already upgraded.

Upgrade: ``search_text = ''`` beside a non-empty string ``content`` becomes NULL (its
text is its content, as a write stores it now), except for an adapter's envelope
(``type`` ``adk_event`` with an ``event`` object, ``pydantic_ai`` with a ``message``
object), the one message a write stores ``''`` for beside a string content (the text
is its framework message's, which may be empty). No other message has ``''`` there: a
non-empty string content is always part of its text. The update triggers list the
changed rows for the full-text index, which indexes them as it does a write's. All of
it is SQL, so ``--sql`` carries it; the same rows are what ``histstore reindex`` would
change.

And a ``search_text`` longer than 256 KiB of UTF-8 (stored by b7d4e2a91c30's fill or a
write before the cut came with f3b8d6a2c915's release) is cut to its first 256 KiB on a
character boundary, as a write cuts it since (``_storage.rows.searchable``): a search
finds the message by the same words as the same message written now.

Downgrade: nothing to undo. NULL beside a string content is what c8d2f4a6e1b9's
schema reads as "the text is the content", and its downgrade fills ``search_text`` from
the content there, which is the text the repaired rows had before f3b8d6a2c915. The cut
text is what the revisions before this one write too.

Revision ID: d9e3b5a7c1f4
Revises: c8d2f4a6e1b9
Create Date: 2026-12-07 01:00:00.000000

"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from alembic import op

from histstore._storage.revisions import schema_prefix

revision: str = "d9e3b5a7c1f4"
down_revision: str | None = "c8d2f4a6e1b9"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# SQLite: '' beside a non-empty string content, not in an envelope. ``json_type`` is
# NULL for a missing member, hence the coalesce.
_SQLITE_LOST = (
    "search_text = '' AND json_type(data, '$.content') = 'text'"
    " AND json_extract(data, '$.content') <> ''"
    " AND NOT coalesce(json_type(data, '$.type') = 'text' AND ("
    "(json_extract(data, '$.type') = 'adk_event' AND json_type(data, '$.event') = 'object')"
    " OR (json_extract(data, '$.type') = 'pydantic_ai'"
    " AND json_type(data, '$.message') = 'object')), 0)"
)

# PostgreSQL: the same. ``->`` keeps a member's JSON text (no unescaping, which a NUL
# would refuse); histstore's JSON is compact and escapes only what JSON must, so a type
# string's JSON text is the quoted name.
_PG_LOST = (
    "search_text = '' AND json_typeof(data::json -> 'content') = 'string'"
    " AND (data::json -> 'content')::text <> '\"\"'"
    " AND NOT coalesce("
    "((data::json -> 'type')::text = '\"adk_event\"'"
    " AND json_typeof(data::json -> 'event') = 'object')"
    " OR ((data::json -> 'type')::text = '\"pydantic_ai\"'"
    " AND json_typeof(data::json -> 'message') = 'object'), false)"
)


# The cut: the first ``_BYTES`` bytes of the text's UTF-8, less those of a character cut
# in two (1 to 3 bytes: the bytes after its first are 10xxxxxx).
_BYTES = 262_144


def _kept(continues: Callable[[int], str]) -> str:
    """How many bytes the cut keeps; ``continues(i)``: whether byte ``i`` (from 0) of
    the text's UTF-8 continues a character."""
    keep = " ".join(f"WHEN NOT ({continues(n)}) THEN {n}" for n in range(_BYTES, _BYTES - 3, -1))
    return f"CASE {keep} ELSE {_BYTES - 3} END"


# SQLite: a text cast to a BLOB is its UTF-8, and substr() of a BLOB counts bytes (from 1).
_SQLITE_UTF8 = "CAST(search_text AS BLOB)"
_SQLITE_CUT = "CAST(substr({b}, 1, {n}) AS TEXT)".format(
    b=_SQLITE_UTF8,
    n=_kept(lambda i: f"hex(substr({_SQLITE_UTF8}, {i + 1}, 1)) BETWEEN '80' AND 'BF'"),
)
# PostgreSQL: convert_to() gives the UTF-8, and get_byte() counts from 0.
_PG_UTF8 = "convert_to(search_text, 'UTF8')"
_PG_CUT = "convert_from(substring({b} FROM 1 FOR {n}), 'UTF8')".format(
    b=_PG_UTF8, n=_kept(lambda i: f"(get_byte({_PG_UTF8}, {i}) & 192) = 128")
)


def upgrade() -> None:
    dialect = op.get_context().dialect.name
    if dialect == "sqlite":
        op.execute(f"UPDATE histstore_messages SET search_text = NULL WHERE {_SQLITE_LOST}")  # noqa: S608 - names, no input
        op.execute(
            f"UPDATE histstore_messages SET search_text = {_SQLITE_CUT}"  # noqa: S608 - names, no input
            f" WHERE length({_SQLITE_UTF8}) > {_BYTES}"
        )
    elif dialect == "postgresql":
        q = schema_prefix()
        op.execute(f"UPDATE {q}histstore_messages SET search_text = NULL WHERE {_PG_LOST}")  # noqa: S608 - names, no input
        op.execute(
            f"UPDATE {q}histstore_messages SET search_text = {_PG_CUT}"  # noqa: S608 - names, no input
            f" WHERE octet_length(search_text) > {_BYTES}"
        )


def downgrade() -> None:
    """Nothing to undo (see the module's docstring)."""
