"""SQLite: the text the database computes from a message's JSON, and its Python twin.

From revision e5c3a9d7f2b4 on, SQLite's ``statements.search.message_text`` reads a
message's text from its JSON where ``search_text`` is NULL, for the common shapes
(``SQLITE_SHAPES``); ``sqlite_text`` computes in Python exactly what that SQL computes,
so that a write stores a copy in ``search_text`` only where the SQL would not give the
text of ``_core.search_text.indexed_text`` (``rows.text_rule``). PostgreSQL's
index reads a string ``content`` only (``rows.stored_search_text``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from .._core.search_text import TEXT_BLOCKS

__all__ = ["RESULT_ITEMS", "SQLITE_SHAPES", "UNKNOWN", "sqlite_text", "sqlite_text_sql"]

RESULT_ITEMS = ("custom_tool_call_output", "function_call_output", "local_shell_call_output")
"""Responses items whose string ``output`` SQLite reads as their text."""

SQLITE_SHAPES = """In order, the first that applies: a string ``content``; a list
``content`` of one element (a string, or a block of type ``text``, ``input_text`` or
``output_text``: its ``text``); a ``RESULT_ITEMS`` item's string ``output``; an
``adk_event`` envelope with one part (``event.content.parts[0].text``, not a thought).
One element only: FTS5 refuses a content view that reads ``json_each``, a virtual
table ("SQL logic error" on ``rebuild`` and ``integrity-check``)."""


class _Unknown:
    """A text the Python twin does not claim to reproduce (a piece holding NUL)."""


UNKNOWN: Final = _Unknown()


def sqlite_text_sql(m: str) -> str:
    """The SQL of the text SQLite computes from the JSON of the message row ``m`` (an
    alias or ``old``/``new``), before ``search_text`` and ``''`` are considered: NULL
    or a string. Revision e5c3a9d7f2b4 carries a copy of it."""
    blocks = ", ".join(f"'{b}'" for b in sorted(TEXT_BLOCKS))
    results = ", ".join(f"'{r}'" for r in RESULT_ITEMS)
    d = f"{m}.data"
    one = "'$.event.content.parts[0]"
    return (
        f"CASE json_type({d}, '$.content') WHEN 'text' THEN json_extract({d}, '$.content')"
        f" WHEN 'array' THEN CASE WHEN json_array_length({d}, '$.content') = 1"
        f" THEN CASE json_type({d}, '$.content[0]')"
        f" WHEN 'text' THEN json_extract({d}, '$.content[0]')"
        f" WHEN 'object' THEN CASE WHEN json_extract({d}, '$.content[0].type') IN ({blocks})"
        f" AND json_type({d}, '$.content[0].text') = 'text'"
        f" THEN json_extract({d}, '$.content[0].text') END END END"
        f" ELSE CASE WHEN json_extract({d}, '$.type') IN ({results})"
        f" AND json_type({d}, '$.output') = 'text' THEN json_extract({d}, '$.output')"
        f" WHEN json_extract({d}, '$.type') = 'adk_event'"
        f" AND json_type({d}, '$.event.content.parts') = 'array'"
        f" AND json_array_length({d}, '$.event.content.parts') = 1"
        f" AND json_type({d}, {one}.text') = 'text'"
        f" AND coalesce(json_type({d}, {one}.thought'), 'null') IN ('null', 'false')"
        f" THEN json_extract({d}, {one}.text') END END"
    )


def sqlite_text(d: Mapping[str, Any]) -> str | _Unknown | None:
    """What ``sqlite_text_sql`` computes for the message JSON object ``d``, ``''`` as
    ``None``; ``UNKNOWN`` where the text holds NUL (SQLite's text then differs)."""
    content = d.get("content")
    if type(content) is str:
        text: Any = content
    elif type(content) is list:
        text = _block_text(content[0]) if len(content) == 1 else None
    else:
        kind = d.get("type")
        output = d.get("output")
        if type(kind) is str and kind in RESULT_ITEMS and type(output) is str:
            text = output
        elif kind == "adk_event":
            text = _adk_text(d)
        else:
            return None
    if type(text) is not str or not text:
        return None
    return UNKNOWN if "\x00" in text else text


def _block_text(block: Any) -> str | None:
    if type(block) is str:
        return block
    if type(block) is dict:
        kind, text = block.get("type"), block.get("text")
        if type(kind) is str and kind in TEXT_BLOCKS and type(text) is str:
            return text
    return None


def _adk_text(d: Mapping[str, Any]) -> Any:
    event = d.get("event")
    content = event.get("content") if type(event) is dict else None
    parts = content.get("parts") if type(content) is dict else None
    if type(parts) is not list or len(parts) != 1 or type(parts[0]) is not dict:
        return None
    thought = parts[0].get("thought")
    return parts[0].get("text") if thought is None or thought is False else None
