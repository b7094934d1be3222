"""ADK sessions are owned by their user: the ADK session service now creates the
conversation of a session (``adk-session/...``, metadata ``adk:kind`` = ``"session"``)
owned by the session's ``user_id``, so ``store.scoped(user_id)`` and ``histstore ls
--user`` find it.

Upgrade: every session stored before, with no owner, gets its ``adk:user`` (the JSON
string in ``histstore_metadata``) as owner when that is a valid id (1 to 255
characters, no control character, no surrounding whitespace), as a create does now.
One ``UPDATE`` does the user ids whose JSON has no escape (online and offline); online,
Python decodes the rest (a quote or backslash in the id). A session owned already is
left. No schema change: an older histstore reads and writes these rows as they are.

Downgrade: nothing to undo (owners are data the previous revision already had); the
sessions stay owned.

Revision ID: a41c5e0d7b93
Revises: c8e1f4a2d7b6
Create Date: 2026-12-07 03:50:00.000000

"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from histstore._storage.revisions import schema_prefix

revision: str = "a41c5e0d7b93"
down_revision: str | None = "c8e1f4a2d7b6"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BATCH = 500
# The id rule as it stood at this revision (``_core.ids``): its own copy.
_MAX_ID = 255
_FORBIDDEN = re.compile(r"[\x00-\x1f\x7f-\x9f\ud800-\udfff]")


def _sessions(prefix: str) -> str:
    """The SQL condition: a conversation (``c``) that is an ADK session with no owner."""
    return (
        f"c.owner IS NULL AND c.id LIKE 'adk-session/%' AND EXISTS (SELECT 1 FROM"  # noqa: S608 - a schema name, no input
        f" {prefix}histstore_metadata k WHERE k.conversation_id = c.id"
        " AND k.key = 'adk:kind' AND k.value = '\"session\"')"
    )


def upgrade() -> None:
    prefix = schema_prefix()
    user = (
        f"SELECT {{}} FROM {prefix}histstore_metadata u WHERE u.conversation_id = c.id"  # noqa: S608 - a schema name, no input
        " AND u.key = 'adk:user'"
    )
    plain = (
        " AND u.value LIKE '\"%\"' AND u.value NOT LIKE '%\\%' ESCAPE '!'"
        " AND u.value NOT LIKE '\" %' AND u.value NOT LIKE '% \"'"
        f" AND length(u.value) BETWEEN 3 AND {_MAX_ID + 2}"
    )
    op.execute(
        f"UPDATE {prefix}histstore_conversations AS c SET owner = ("  # noqa: S608 - a schema name, no input
        + user.format("substr(u.value, 2, length(u.value) - 2)")
        + f") WHERE {_sessions(prefix)} AND EXISTS ("
        + user.format("1")
        + plain
        + ")"
    )
    if not op.get_context().as_sql:
        _escaped(prefix)


def _escaped(prefix: str) -> None:
    """Online: the sessions whose user id's JSON has an escape, decoded here."""
    bind = op.get_bind()
    after = ""
    while True:
        found = bind.execute(
            sa.text(
                f"SELECT c.id, u.value FROM {prefix}histstore_conversations c"  # noqa: S608 - a schema name, no input
                f" JOIN {prefix}histstore_metadata u ON u.conversation_id = c.id"
                f" AND u.key = 'adk:user' WHERE {_sessions(prefix)} AND c.id > :after"
                " ORDER BY c.id LIMIT :batch"
            ),
            {"after": after, "batch": BATCH},
        ).all()
        for conversation, value in found:
            owner = _valid(value)
            if owner is not None:
                bind.execute(
                    sa.text(
                        f"UPDATE {prefix}histstore_conversations SET owner = :owner"  # noqa: S608 - a schema name, no input
                        " WHERE id = :id AND owner IS NULL"
                    ),
                    {"owner": owner, "id": conversation},
                )
        if len(found) < BATCH:
            return
        after = found[-1][0]


def _valid(value: str) -> str | None:
    """The user id ``value`` (JSON) holds when it is a valid owner, else ``None``."""
    try:
        user = json.loads(value)
    except ValueError:
        return None
    if not isinstance(user, str) or not 0 < len(user) <= _MAX_ID:
        return None
    if _FORBIDDEN.search(user) is not None or user.strip() != user:
        return None
    return user


def downgrade() -> None:
    pass
