"""Adapter messages: framework envelopes get their role and their search text.

The ADK and Pydantic AI adapters store a framework message in an envelope,
``{"type": "adk_event", "event": {...}}`` and ``{"type": "pydantic_ai", "message":
{...}}``. They now write the message's ``role`` (user, assistant, system, tool) into the
envelope (``histstore.envelopes``) and its text is indexed
(``histstore._core.framework_text``); LangChain tool-call ``args`` and a few more
Responses items (``mcp_call``, ``shell_call_output``, ...) are indexed too.

Upgrade: every stored row that may hold one of those (a ``LIKE`` on its JSON finds the
candidates, Python decides) gets what a write of it stored at this revision: an envelope
its ``role`` key (as the first key) and ``role`` column, and every candidate its
``search_text``, the indexed text cut to its first 256 KiB (NULL: no text), which also
updates the full-text index (SQLite: the FTS5 triggers; PostgreSQL: the generated
``search_vector``). The rules are this revision's own copy (below), as they stood when
it was written: a revision never follows the runtime's rules, which are the newest
revision's. (Until the repair revision d9e3b5a7c1f4, it did: with the rules of
c8d2f4a6e1b9 it stored NULL, no text, for a candidate whose text is its string content,
e.g. a plain message ending in "tool calls"; d9e3b5a7c1f4 repairs those rows.) Rows are
read ``BATCH`` at a time in key order, so a large table is never held in memory.

Downgrade: the envelopes lose the ``role`` key, their ``role`` column is their type
again and their ``search_text`` NULL, as that revision stored them. Other rows keep the
richer search text (harmless: it is only what search finds them by; the older
histstore's ``histstore reindex`` recomputes it).

Offline (``--sql``) nothing of this can run (it is Python): the script names
``histstore reindex``, which makes every row what a write stores at the head revision
(the envelope's role, its role column, the search text).

Revision ID: f3b8d6a2c915
Revises: e2a7c9d41f06
Create Date: 2026-12-03 15:00:00.000000

"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

from histstore._storage.revisions import placed_schema

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


def _upgraded(data: dict[str, Any]) -> dict[str, Any]:
    """A row's JSON as a write stored it at this revision: an envelope without a role
    gets its framework message's role, as the first key."""
    found = _envelope(data)
    if found is None or "role" in data:
        return data
    kind, inner = found
    role = _ROLES[kind](inner)
    return data if role is None else {"role": role, **data}


def _downgraded(data: dict[str, Any]) -> tuple[dict[str, Any], str]:
    old = {k: v for k, v in data.items() if k != "role"}
    return old, _role_column(old)


def _role_column(data: dict[str, Any]) -> str:
    """The ``role`` column: the role, else the type; NUL shown as U+FFFD."""
    role = data.get("role")
    return (role if isinstance(role, str) else str(data["type"])).replace("\x00", "\ufffd")


def _encoded(data: dict[str, Any]) -> str:
    """A message's JSON as histstore stores it (compact, not ASCII-escaped)."""
    return json.dumps(data, ensure_ascii=False, allow_nan=False, separators=(",", ":"))


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
    stored = json.loads(row["d"])
    data = _upgraded(stored)
    text = row["d"] if data is stored else _encoded(data)
    return {"r": _role_column(data), "d": text, "t": _searchable(_indexed_text(data))}


def _to_previous(row: Row) -> Row | None:
    data = json.loads(row["d"])
    if _envelope(data) is None:
        return None
    old, role = _downgraded(data)
    return {"r": role, "d": _encoded(old), "t": None}


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
    schema = placed_schema()
    return table if not schema else f'"{schema}".{table}'


def upgrade() -> None:
    if not op.get_context().as_sql:
        _hold_off_writers()
        _rewrite(_CANDIDATES, _to_head)


def downgrade() -> None:
    if not op.get_context().as_sql:
        _hold_off_writers()
        _rewrite(_ENVELOPES, _to_previous)


# ------------------------------------------------------------ the rules at this revision
# A copy, as they stood from this revision until c8d2f4a6e1b9 (which stores no text where
# it is the string content): what a write stored then. Never replaced by the runtime's
# rules, which are the newest revision's.

_ENVELOPE_KEYS = {"adk_event": "event", "pydantic_ai": "message"}
_TEXT_BLOCKS = frozenset({"text", "input_text", "output_text"})
_CALLS = frozenset(
    {"function_call", "custom_tool_call", "mcp_call", "mcp_approval_request", "tool_search_call"}
)
_RESULTS = frozenset(
    {"function_call_output", "custom_tool_call_output", "local_shell_call_output", "mcp_call"}
)
# Pydantic AI request parts that answer the previous response: such a request is a tool
# result, not a turn.
_ANSWERS = frozenset({"tool-return", "retry-prompt", "retry-feedback"})
_SEARCH_TEXT_BYTES = 262_144  # the indexed text's first 256 KiB of UTF-8


def _envelope(d: Mapping[str, Any]) -> tuple[str, dict[str, Any]] | None:
    """``(type, framework JSON)`` when ``d`` is an adapter's envelope, else ``None``."""
    kind = d.get("type")
    key = _ENVELOPE_KEYS.get(kind) if isinstance(kind, str) else None
    inner = d.get(key) if key is not None else None
    return (str(kind), inner) if isinstance(inner, dict) else None


def _adk_role(event: Mapping[str, Any]) -> str | None:
    """An ADK event's role: ``tool`` with a function response, else by ``content.role``
    (``model``: assistant), else by author; ``None`` without content parts."""
    content = event.get("content")
    parts = content.get("parts") if isinstance(content, dict) else None
    if not isinstance(parts, list) or not parts:
        return None
    if any(isinstance(p, dict) and isinstance(p.get("function_response"), dict) for p in parts):
        return "tool"
    role = content.get("role") if isinstance(content, dict) else None
    if role == "model":
        return "assistant"
    if role == "user":
        return "user"
    return "user" if event.get("author") == "user" else "assistant"


def _pydantic_ai_role(message: Mapping[str, Any]) -> str:
    """A Pydantic AI message's role: a response is ``assistant``; a request ``tool`` when
    it answers, ``user`` with a user prompt, ``system`` with system prompts only."""
    if message.get("kind") == "response":
        return "assistant"
    parts = message.get("parts")
    kinds = {
        kind
        for kind in (
            p.get("part_kind")
            for p in (parts if isinstance(parts, list) else [])
            if isinstance(p, dict)
        )
        if isinstance(kind, str)
    }
    if kinds & _ANSWERS:
        return "tool"
    if "user-prompt" in kinds:
        return "user"
    if kinds == {"system-prompt"}:
        return "system"
    return "user"


_ROLES: dict[str, Callable[[Mapping[str, Any]], str | None]] = {
    "adk_event": _adk_role,
    "pydantic_ai": _pydantic_ai_role,
}


def _searchable(text: str | None) -> str | None:
    """``text`` cut to its first 256 KiB of UTF-8, on a character boundary."""
    if text is None or len(text) * 4 <= _SEARCH_TEXT_BYTES:
        return text
    raw = text.encode("utf-8", "surrogatepass")
    if len(raw) <= _SEARCH_TEXT_BYTES:
        return text
    cut = _SEARCH_TEXT_BYTES
    while raw[cut] & 0xC0 == 0x80:  # inside a character: back to where it starts
        cut -= 1
    return raw[:cut].decode("utf-8", "surrogatepass")


def _indexed_text(d: dict[str, Any]) -> str | None:
    """The text search finds a message by (one piece a line, NUL as a space), or
    ``None``: a string ``content``, text blocks, tool-call arguments (Chat Completions,
    LangChain ``args``, Responses items, Anthropic ``tool_use``), tool results, and the
    text of an adapter's framework message."""
    content = d.get("content")
    if type(content) is str and len(d) == 2 and "role" in d:
        text = content
    else:
        text = "\n".join(p for p in _pieces(d) if p)
    return text.replace("\x00", " ") or None


def _pieces(d: dict[str, Any]) -> Iterator[str]:
    kind = d.get("type")
    kind = kind if isinstance(kind, str) else None
    found = _envelope(d)
    if found is not None:
        yield from _framework(*found)
        return
    yield from _content(d.get("content"))
    for key in ("tool_calls", "invalid_tool_calls"):
        calls = d.get(key)
        if isinstance(calls, list):
            for call in calls:
                if not isinstance(call, dict):
                    continue
                fn = call.get("function")
                if isinstance(fn, dict):  # Chat Completions
                    yield from _arguments(fn.get("arguments"))
                else:  # LangChain
                    yield from _arguments(call.get("args"))
    legacy = d.get("function_call")
    if isinstance(legacy, dict):
        yield from _arguments(legacy.get("arguments"))
    if kind in _CALLS:
        yield from _arguments(d.get("arguments"))
        yield from _arguments(d.get("input"))
    if kind in _RESULTS:
        yield from _content(d.get("output"))
    elif kind == "shell_call_output" and isinstance(d.get("output"), list):
        for out in d["output"]:
            if isinstance(out, dict):
                yield from (v for v in (out.get("stdout"), out.get("stderr")) if isinstance(v, str))


def _framework(kind: str, inner: dict[str, Any]) -> Iterator[str]:
    """An envelope's text: ADK content parts (text but thoughts, function call args and
    responses, code and its output); Pydantic AI prompts, text, tool-call args, tool
    returns and retry prompts."""
    if kind == "adk_event":
        content = inner.get("content")
        parts = content.get("parts") if isinstance(content, dict) else None
        for part in parts if isinstance(parts, list) else []:
            if not isinstance(part, dict):
                continue
            text = part.get("text")
            if isinstance(text, str) and not part.get("thought"):
                yield text
            call = part.get("function_call")
            if isinstance(call, dict):
                yield from _arguments(call.get("args"))
            response = part.get("function_response")
            if isinstance(response, dict):
                yield from _values(response.get("response"))
            for key, field in (("executable_code", "code"), ("code_execution_result", "output")):
                value = part.get(key)
                if isinstance(value, dict) and isinstance(value.get(field), str):
                    yield value[field]
        return
    parts = inner.get("parts")
    for part in parts if isinstance(parts, list) else []:
        if not isinstance(part, dict):
            continue
        what = part.get("part_kind")
        content = part.get("content")
        if what in ("system-prompt", "user-prompt"):
            for item in content if isinstance(content, list) else [content]:
                if isinstance(item, str):
                    yield item
        elif what == "text":
            if isinstance(content, str):
                yield content
        elif what in ("tool-call", "builtin-tool-call"):
            yield from _arguments(part.get("args"))
        elif what in ("tool-return", "builtin-tool-return"):
            yield from _values(content)
        elif what in ("retry-prompt", "retry-feedback"):
            if isinstance(content, list):
                for error in content:
                    if isinstance(error, dict) and isinstance(error.get("msg"), str):
                        yield error["msg"]
            elif isinstance(content, str):
                yield content


def _content(value: Any) -> Iterator[str]:
    """A string, or the text of a list of blocks."""
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
    """Tool-call arguments: a JSON text gives its values; other text as it is."""
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
    """The string and number leaves of a JSON value (never its keys)."""
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
