"""SQLite: the database computes the text of the common message shapes from their JSON.

``search_text`` held a copy of the text of every message whose ``content`` is not a
JSON string (content blocks, Responses items, ADK events): about half of the bytes of
the OpenAI Agents and ADK adapters' messages. From here on SQLite's text of a message
(``_storage.statements.search.message_text``) is ``search_text``, else the text SQL
computes from the JSON (``_storage.computed_text.sqlite_text_sql``, of which this
revision keeps its own copy): a string ``content``; a list ``content``'s strings and
``text``/``input_text``/``output_text`` blocks; a Responses tool result's string
``output``; an ADK event's text parts. A write leaves ``search_text`` NULL where that
is its ``indexed_text`` (``_storage.rows.text_rule``). PostgreSQL: nothing changes (its
index expression is 5b7e2d4a9c13's; its writes store the text as before).

Upgrade: a row whose ``search_text`` is NULL and whose text was none but SQL now finds
one (none is stored so by today's rule) gets ``''``, so every row keeps the text FTS5
holds for it; then the view ``histstore_messages_fts_content`` and the delete and update
triggers read the new expression (FTS5's content is unchanged: nothing is reindexed).
The pending list is renamed (``histstore_messages_fts_queued``): an older process
would index a new row by its older expression (no text) and take it off the list, so
its indexing, searches and writes fail instead.

Downgrade: where ``search_text`` is NULL and SQL computes a text other than a string
content, the text is stored in ``search_text`` (FTS5 holds that text already); the
view, the triggers and the list's name come back. All of it is SQL, so ``--sql``
carries it.

Revision ID: e5c3a9d7f2b4
Revises: 5b7e2d4a9c13
Create Date: 2026-12-07 18:00:00.000000

"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from histstore._storage.revisions import placed_schema

revision: str = "e5c3a9d7f2b4"
down_revision: str | None = "5b7e2d4a9c13"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_FTS = "histstore_messages_fts"
_VIEW = "histstore_messages_fts_content"
_OLD_LIST = "histstore_messages_fts_listed"
_LIST = "histstore_messages_fts_queued"


def _old_text(m: str) -> str:
    """The text of the message row ``m`` before this revision (c8d2f4a6e1b9's)."""
    return (
        f"CASE WHEN json_type({m}.data, '$.content') = 'text'"
        f" THEN json_extract({m}.data, '$.content') END"
    )


def _new_text(m: str) -> str:
    """The text SQL computes from the JSON of the row ``m`` from this revision on (a copy
    of ``computed_text.sqlite_text_sql`` as it stood)."""
    return _NEW_TEXT.replace("{m}", m)


_NEW_TEXT = (
    "CASE json_type({m}.data, '$.content') WHEN 'text' THEN json_extract({m}.data,"
    " '$.content') WHEN 'array' THEN CASE WHEN json_array_length({m}.data,"
    " '$.content') = 1 THEN CASE json_type({m}.data, '$.content[0]') WHEN 'text'"
    " THEN json_extract({m}.data, '$.content[0]') WHEN 'object' THEN CASE WHEN"
    " json_extract({m}.data, '$.content[0].type') IN ('input_text', 'output_text',"
    " 'text') AND json_type({m}.data, '$.content[0].text') = 'text' THEN"
    " json_extract({m}.data, '$.content[0].text') END END END ELSE CASE WHEN"
    " json_extract({m}.data, '$.type') IN ('custom_tool_call_output',"
    " 'function_call_output', 'local_shell_call_output') AND json_type({m}.data,"
    " '$.output') = 'text' THEN json_extract({m}.data, '$.output') WHEN"
    " json_extract({m}.data, '$.type') = 'adk_event' AND json_type({m}.data,"
    " '$.event.content.parts') = 'array' AND json_array_length({m}.data,"
    " '$.event.content.parts') = 1 AND json_type({m}.data,"
    " '$.event.content.parts[0].text') = 'text' AND coalesce(json_type({m}.data,"
    " '$.event.content.parts[0].thought'), 'null') IN ('null', 'false') THEN"
    " json_extract({m}.data, '$.event.content.parts[0].text') END END"
)


def _text(m: str, computed: str) -> str:
    return f"nullif(coalesce({m}.search_text, {computed}), '')"


def _triggers(text_of_old: str, listed: str) -> dict[str, str]:
    """c8d2f4a6e1b9's delete and update triggers, over ``text_of_old`` and ``listed``."""
    unindex = (
        f" INSERT INTO {_FTS}({_FTS}, rowid, search_text) SELECT 'delete', old.rowid, t"  # noqa: S608 - names, no input
        f" FROM (SELECT {text_of_old} AS t WHERE NOT EXISTS"
        f" (SELECT 1 FROM {listed} WHERE message_rowid = old.rowid)) WHERE t IS NOT NULL;"
        f" DELETE FROM {listed} WHERE message_rowid = old.rowid;"
    )
    return {
        "histstore_messages_fts_delete": f"AFTER DELETE ON histstore_messages BEGIN{unindex} END",
        "histstore_messages_fts_update": (
            f"AFTER UPDATE OF search_text, data ON histstore_messages BEGIN{unindex}"  # noqa: S608 - names, no input
            f" INSERT OR IGNORE INTO {listed}(message_rowid) VALUES (new.rowid); END"
        ),
    }


# Rows whose text SQL computes now but did not before (NULL search_text, no string content).
_GAINS = (
    "search_text IS NULL AND json_type(histstore_messages.data, '$.content') IS NOT 'text'"
    f" AND nullif({_new_text('histstore_messages')}, '') IS NOT NULL"
)


def _view_and_triggers(computed: str, listed: str) -> None:
    for name in _triggers("", listed):
        op.execute(f"DROP TRIGGER IF EXISTS {name}")
    op.execute(f"DROP VIEW IF EXISTS {_VIEW}")
    op.execute(
        f"CREATE VIEW {_VIEW} AS SELECT m.rowid AS message_rowid,"  # noqa: S608 - names, no input
        f" {_text('m', computed.format(m='m'))} AS search_text FROM histstore_messages AS m"
    )
    for name, body in _triggers(_text("old", computed.format(m="old")), listed).items():
        op.execute(f"CREATE TRIGGER {name} {body}")


def upgrade() -> None:
    if op.get_context().dialect.name != "sqlite":
        return
    # DML first: what follows is then in its transaction.
    op.execute(f"UPDATE histstore_messages SET search_text = '' WHERE {_GAINS}")  # noqa: S608 - names, no input
    op.execute(f"ALTER TABLE {_OLD_LIST} RENAME TO {_LIST}")
    _view_and_triggers(_new_text("{m}"), _LIST)


def downgrade() -> None:
    if op.get_context().dialect.name != "sqlite":
        return
    # The triggers first, so that the text stored (the one FTS5 holds) unindexes nothing;
    # each step may run again (see c8d2f4a6e1b9's downgrade).
    for name in _triggers("", _LIST):
        op.execute(f"DROP TRIGGER IF EXISTS {name}")
    op.execute(
        "UPDATE histstore_messages"  # noqa: S608 - names, no input
        f" SET search_text = {_new_text('histstore_messages')} WHERE {_GAINS}"
    )
    if _has_table(_LIST):
        op.execute(f"ALTER TABLE {_LIST} RENAME TO {_OLD_LIST}")
    _view_and_triggers(_old_text("{m}"), _OLD_LIST)


def _has_table(name: str) -> bool:
    """Whether the database has the table ``name`` (offline: it has)."""
    if op.get_context().as_sql:
        return True
    return name in sa.inspect(op.get_bind()).get_table_names(schema=placed_schema())
