"""What search sees of a message, how a query is read, and what a search returns.

``indexed_text`` is the one definition of a message's searchable text: both full-text
indexes (SQLite FTS5, PostgreSQL ``tsvector``) and the semantic index are fed from it,
through the ``search_text`` column every insert fills.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from .._errors import InvalidMessage
from .framework_text import envelope, envelope_pieces
from .models import Message, message_data

__all__ = ["TEXT_BLOCKS", "Hit", "indexed_text", "parse_query"]

TEXT_BLOCKS = frozenset({"text", "input_text", "output_text"})
"""Content block types whose ``text`` is indexed."""

# Responses items whose ``arguments`` (or ``input``) are a tool call's arguments, and
# items whose ``output`` is a tool's result (a string or text blocks).
_CALLS = frozenset(
    {"function_call", "custom_tool_call", "mcp_call", "mcp_approval_request", "tool_search_call"}
)
_RESULTS = frozenset(
    {"function_call_output", "custom_tool_call_output", "local_shell_call_output", "mcp_call"}
)


@dataclass(frozen=True)
class Hit:
    """A message found by a search: where it is, the message, and how well it matched
    (a higher ``score`` is a better match; scores compare within one search only).

    A message of a LangGraph thread (``HiststoreSaver``) names the thread in
    ``thread``; then ``conversation`` is the thread id too, ``position`` the message's
    index in its channel's list, and ``message`` holds its ``role`` and its text as
    ``content`` (the text the search indexed). ``thread`` is ``None`` for a message of a
    conversation."""

    conversation: str
    """The id of the conversation the message is in (of its thread, for a thread's)."""
    position: int
    """The message's position in that conversation (its index, for a thread's)."""
    message: Message
    """The message found."""
    score: float
    """How well it matched: higher is better, within one search only."""
    thread: str | None = None
    """The LangGraph thread the message is in (``None``: a conversation's message)."""


def indexed_text(message: Message | Mapping[str, Any]) -> str | None:
    """The text a search finds a message by, or ``None`` when it has none.

    Indexed, in the message's own order, one piece per line:

    - a string ``content`` (any role: user, assistant, system, tool results);
    - content blocks of type ``text``, ``input_text`` and ``output_text`` (their
      ``text``), in a list ``content`` (Chat Completions parts, Responses items,
      Anthropic blocks) or an Anthropic ``tool_result`` block's ``content``;
    - tool-call arguments: Chat Completions ``tool_calls[].function.arguments`` and
      ``function_call.arguments``, LangChain ``tool_calls[].args`` (and
      ``invalid_tool_calls``), Responses ``function_call``, ``mcp_call``,
      ``mcp_approval_request`` and ``tool_search_call`` ``arguments`` and
      ``custom_tool_call`` ``input``, Anthropic ``tool_use`` ``input``; JSON arguments
      contribute their string and number values, not their keys;
    - tool results: Responses ``function_call_output``, ``custom_tool_call_output``,
      ``local_shell_call_output`` and ``mcp_call`` ``output`` (a string or text
      blocks), ``shell_call_output`` stdout and stderr, and Anthropic ``tool_result``
      content;
    - framework envelopes (``adk_event``, ``pydantic_ai``: what the ADK and Pydantic AI
      adapters store): the text of the framework message they hold, as
      ``_core.framework_text`` reads it (text parts, tool-call arguments, tool results).

    Never indexed: keys, roles, block types, ids, tool names, images, audio, files and
    other binary data, reasoning items. A NUL in the text becomes a space (no database
    text column holds one; it separates words either way).
    """
    d = message_data(message) if isinstance(message, Message) else message
    if type(d) is not dict:  # JSON objects are dicts from here on
        d = dict(d)
    content = d.get("content")
    if type(content) is str and len(d) == 2 and "role" in d:  # the commonest shape
        text = content
    else:
        text = "\n".join(p for p in _pieces(d) if p)
    if "\x00" in text:
        text = text.replace("\x00", " ")
    return text or None


def _pieces(d: dict[str, Any]) -> Iterator[str]:
    kind = d.get("type")
    if not isinstance(kind, str):  # beside a role, "type" may hold any JSON value
        kind = None
    framework = envelope(d)
    if framework is not None:
        yield from _framework(*framework)
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
                else:  # LangChain: {"name", "args", "id", "type": "tool_call"}
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
    for how, value in envelope_pieces(kind, inner):
        if how == "text":
            if isinstance(value, str):
                yield value
        elif how == "values":
            yield from _values(value)
        else:
            yield from _arguments(value)


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
    if kind in TEXT_BLOCKS:
        text = block.get("text")
        if isinstance(text, str):
            yield text
    elif kind == "tool_use":
        yield from _values(block.get("input"))
    elif kind == "tool_result":
        yield from _content(block.get("content"))


def _arguments(value: Any) -> Iterator[str]:
    """Tool-call arguments: a JSON text contributes its values; other text as it is."""
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


def parse_query(query: object) -> list[str]:
    """The terms of a search query: each word, and each ``"quoted phrase"`` as one term.

    All terms must match. The terms are matched as text only; callers hand them to an
    engine as quoted strings or bind parameters, never as its query language.

    Raises:
        InvalidMessage: the query is not a string, is empty or only whitespace, holds a
            NUL or lone surrogate, or has an unclosed quote.
    """
    if not isinstance(query, str):
        raise InvalidMessage(f"a search query is a string, not {type(query).__name__}")
    if "\x00" in query:
        raise InvalidMessage("a search query cannot hold NUL")
    try:
        query.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidMessage("a search query cannot hold a lone surrogate") from None
    if not query.strip():
        raise InvalidMessage("a search query needs at least one word")
    if query.count('"') % 2:
        raise InvalidMessage("a search query has an unclosed quote")
    terms: list[str] = []
    for i, chunk in enumerate(query.split('"')):
        if i % 2:  # inside quotes: one phrase
            phrase = " ".join(chunk.split())
            if phrase:
                terms.append(phrase)
        else:
            terms.extend(chunk.split())
    if not terms:
        raise InvalidMessage("a search query needs at least one word")
    return terms
