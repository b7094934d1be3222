"""Adapter messages: framework envelopes get their role and their search text.

The ADK and Pydantic AI adapters store a framework message in an envelope,
``{"type": "adk_event", "event": {...}}`` and ``{"type": "pydantic_ai", "message":
{...}}``. They now write the message's ``role`` (user, assistant, system, tool) into the
envelope (``histstore.envelopes``) and its text is indexed
(``histstore._core.framework_text``); LangChain tool-call ``args`` and a few more
Responses items (``mcp_call``, ``shell_call_output``, ...) are indexed too.

Upgrade: every stored row that may hold one of those (a ``LIKE`` on its JSON finds the
candidates, Python decides) gets what a write of it stores now, as ``histstore
reindex`` gives it (``_ops.text_search.as_written``): an envelope its ``role`` key (as
the first key) and ``role`` column, and every candidate its ``search_text`` as
``indexed_text`` computes it now, which also updates the full-text
index (SQLite: the FTS5 triggers; PostgreSQL: the generated ``search_vector``). Rows are
read ``BATCH`` at a time in key order, so a large table is never held in memory.

Downgrade: the envelopes lose the ``role`` key, their ``role`` column is their type
again and their ``search_text`` NULL, as that revision stored them. Other rows keep the
richer search text (harmless: it is only what search finds them by; the older
histstore's ``histstore reindex`` recomputes it).

Offline (``--sql``) nothing of this can run (it is Python): the script names
``histstore reindex``, which does the same for every row (``_ops.text_search.as_written``:
the envelope's role, its role column, the search text).

Revision ID: f3b8d6a2c915
Revises: e2a7c9d41f06
Create Date: 2026-12-03 15:00:00.000000

"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

from histstore._core import codec
from histstore._core.framework_text import envelope
from histstore._core.rules import role_key
from histstore._ops.text_search import as_written

revision: str = "f3b8d6a2c915"
down_revision: str | None = "e2a7c9d41f06"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BATCH = 2000

offline_follow_up = "histstore reindex"

# Ids compare by code point: Postgres needs the "C" collation for that.
ID = sa.String(length=255).with_variant(sa.String(length=255, collation="C"), "postgresql")

# A Table (not a lightweight ``table()``), so a schema placement translates it.
_messages = sa.Table(
    "histstore_messages",
    sa.MetaData(),
    sa.Column("conversation_id", ID, primary_key=True),
    sa.Column("position", sa.BigInteger, primary_key=True),
    sa.Column("role", sa.Text),
    sa.Column("data", sa.Text),
    sa.Column("search_text", sa.Text),
)

# What a row's JSON holds when its indexed text may differ from the previous revision's
# (the stored JSON is compact: no space around ":"). ``_`` matches any character here,
# which only widens the net; Python decides.
_ENVELOPES = ('%"type":"adk_event"%', '%"type":"pydantic_ai"%')
_CANDIDATES = (
    *_ENVELOPES,
    '%tool_calls"%',  # LangChain tool_calls / invalid_tool_calls args
    '%"type":"mcp_call"%',
    '%"type":"mcp_approval_request"%',
    '%"type":"tool_search_call"%',
    '%"type":"local_shell_call_output"%',
    '%"type":"shell_call_output"%',
)
Row = dict[str, Any]


def _downgraded(data: dict[str, Any]) -> tuple[dict[str, Any], str]:
    old = {k: v for k, v in data.items() if k != "role"}
    return old, _role_column(old)


def _role_column(data: dict[str, Any]) -> str:
    role = data.get("role")
    return role_key(role if isinstance(role, str) else str(data["type"]))


def _rewrite(patterns: Sequence[str], convert: Callable[[Row], Row | None]) -> None:
    """Walk the rows whose JSON matches a pattern, ``BATCH`` at a time in key order, and
    update those ``convert`` changes (it returns the new columns, or ``None``)."""
    bind = op.get_bind()
    m = _messages
    page = (
        sa.select(m.c.conversation_id, m.c.position, m.c.role, m.c.data, m.c.search_text)
        .where(sa.or_(*(m.c.data.like(p) for p in patterns)))
        .order_by(m.c.conversation_id, m.c.position)
        .limit(BATCH)
    )
    fill = (
        sa.update(m)
        .where(m.c.conversation_id == sa.bindparam("c"), m.c.position == sa.bindparam("p"))
        .values(
            role=sa.bindparam("r", type_=sa.Text),
            data=sa.bindparam("d", type_=sa.Text),
            search_text=sa.bindparam("t", type_=sa.Text),
        )
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
        rows = bind.execute(stmt).all()
        if not rows:
            return
        changed = []
        for cid, position, role, data, search_text in rows:
            row = {"r": role, "d": data, "t": search_text}
            new = convert(row)
            if new is not None and new != row:
                changed.append({"c": cid, "p": position, **new})
        if changed:
            bind.execute(fill, changed)
        after = (rows[-1][0], rows[-1][1])


def _to_head(row: Row) -> Row:
    data, role, text = as_written(row["d"])
    return {"r": role, "d": data, "t": text}


def _to_previous(row: Row) -> Row | None:
    data = json.loads(row["d"])
    if envelope(data) is None:
        return None
    old, role = _downgraded(data)
    return {"r": role, "d": codec.encode(old, what="message")[0], "t": None}


def _hold_off_writers() -> None:
    """On PostgreSQL, make writers wait until the rewrite commits (SHARE ROW EXCLUSIVE
    conflicts with the ROW EXCLUSIVE lock every INSERT/UPDATE/DELETE takes; readers go
    on): the walk then sees every row stored before it, and, as for the steps that
    ALTER a table, a writer's open transaction makes ``migrate --lock-timeout`` wait and
    give up having changed nothing. SQLite's write transaction already excludes them."""
    if op.get_context().dialect.name == "postgresql":
        op.execute(f"LOCK TABLE {_qualified('histstore_messages')} IN SHARE ROW EXCLUSIVE MODE")


def _qualified(table: str) -> str:
    """The table's name in the schema histstore is placed in (``connect(schema=)``)."""
    placed = op.get_bind().get_execution_options().get("schema_translate_map") or {}
    schema = placed.get(None)
    return table if not schema else f'"{schema}".{table}'


def upgrade() -> None:
    if not op.get_context().as_sql:
        _hold_off_writers()
        _rewrite(_CANDIDATES, _to_head)


def downgrade() -> None:
    if not op.get_context().as_sql:
        _hold_off_writers()
        _rewrite(_ENVELOPES, _to_previous)
