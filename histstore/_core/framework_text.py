"""What a framework envelope holds: the text and the tool calls of the messages the
framework adapters keep in an envelope.

Some adapters store a framework message inside an envelope, because the framework's own
JSON has no histstore ``role`` (or wraps the message in a record): ``{"role": ...,
"type": "adk_event", "event": {...}}`` (an ADK ``Event``), ``{"role": ..., "type":
"pydantic_ai", "message": {...}}`` (a Pydantic AI ``ModelRequest`` or
``ModelResponse``) and ``{"role": ..., "type": "strands_message", "session_message":
{...}}`` (a Strands ``SessionMessage``). This module reads those JSON forms
only, with no framework import, so search, ``histstore reindex`` and compaction work
where the framework is not installed (the migrations keep copies of their own).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Literal

__all__ = [
    "ADK_EVENT",
    "AGENT_FRAMEWORK",
    "ENVELOPES",
    "LLAMA_INDEX",
    "PYDANTIC_AI",
    "STRANDS",
    "Piece",
    "envelope",
    "envelope_call_ids",
    "envelope_calls",
    "envelope_pieces",
    "envelope_result_ids",
    "llama_blocks",
    "llama_openai_calls",
    "maf_contents",
    "strands_blocks",
    "strands_message",
]

ADK_EVENT = "adk_event"
"""The ``type`` of the envelope holding one ADK event (under ``"event"``)."""
PYDANTIC_AI = "pydantic_ai"
"""The ``type`` of the envelope holding one Pydantic AI message (under ``"message"``)."""
STRANDS = "strands_message"
"""The ``type`` of the envelope holding one Strands ``SessionMessage`` (under
``"session_message"``)."""
LLAMA_INDEX = "llama_index"
"""The ``type`` of the envelope holding one LlamaIndex ``ChatMessage`` (under ``"message"``)."""
AGENT_FRAMEWORK = "agent_framework"
"""The ``type`` of the envelope holding one Agent Framework ``Message`` (under ``"message"``)."""
ENVELOPES: Mapping[str, str] = {
    ADK_EVENT: "event",
    AGENT_FRAMEWORK: "message",
    LLAMA_INDEX: "message",
    PYDANTIC_AI: "message",
    STRANDS: "session_message",
}
"""Envelope ``type`` -> the key of the framework's JSON in it."""

Piece = tuple[Literal["text", "values", "arguments"], Any]
"""One piece of an envelope's text: ``text`` (a string as it is), ``values`` (the string
and number leaves of a JSON value) or ``arguments`` (tool-call arguments: a JSON text or
a JSON value, as ``search_text`` reads them)."""

# Pydantic AI request parts that answer a tool call of an earlier response, by id.
_PYDANTIC_RESULTS = ("tool-return", "retry-prompt")  # compared, never hashed: any JSON may come


def envelope(d: Mapping[str, Any]) -> tuple[str, dict[str, Any]] | None:
    """``(type, framework JSON)`` when ``d`` is a framework envelope, else ``None``."""
    kind = d.get("type")
    key = ENVELOPES.get(kind) if isinstance(kind, str) else None
    if key is None:
        return None
    inner = d.get(key)
    return (kind, inner) if isinstance(inner, dict) else None  # type: ignore[return-value]


def envelope_pieces(kind: str, inner: Mapping[str, Any]) -> Iterator[Piece]:
    """The pieces of text of an envelope's framework JSON, in the message's own order.

    ADK events: the ``content`` parts' ``text`` (not thoughts), ``function_call``
    ``args``, ``function_response`` ``response``, ``executable_code`` ``code`` and
    ``code_execution_result`` ``output``. Pydantic AI messages: system and user prompt
    content (its strings), ``text`` parts, ``tool-call`` (and builtin tool call) ``args``,
    ``tool-return`` (and builtin tool return) ``content`` and retry prompts. Strands
    messages (the one the agent sees: the redacted one when it was redacted): ``text``,
    ``toolUse`` ``input``, ``toolResult`` text and JSON, guard and citation text.
    LlamaIndex messages: see ``_llama_pieces``; Agent Framework messages: ``_maf_pieces``.
    Never thinking, ids, tool names, timestamps, usage or binary content.
    """
    if kind == ADK_EVENT:
        yield from _adk_pieces(inner)
    elif kind == STRANDS:
        yield from _strands_pieces(inner)
    elif kind == LLAMA_INDEX:
        yield from _llama_pieces(inner)
    elif kind == AGENT_FRAMEWORK:
        yield from _maf_pieces(inner)
    else:
        yield from _pydantic_pieces(inner)


def envelope_calls(kind: str, inner: Mapping[str, Any]) -> list[tuple[Any, dict[str, Any]]]:
    """The tool calls an envelope's message makes, as ``(id, call)`` pairs in order: an
    ADK ``function_call`` object, a Pydantic AI ``tool-call`` part, a Strands ``toolUse``."""
    if kind == ADK_EVENT:
        return [(p.get("id"), p) for p in _adk_parts(inner, "function_call")]
    if kind == STRANDS:
        return [(b.get("toolUseId"), b) for b in _strands_blocks(inner, "toolUse")]
    if kind == LLAMA_INDEX:
        return _llama_calls(inner)
    if kind == AGENT_FRAMEWORK:
        return [(c.get("call_id"), c) for c in maf_contents(inner, "function_call")]
    if inner.get("kind") != "response":
        return []
    return [
        (p.get("tool_call_id"), p)
        for p in _pydantic_parts(inner)
        if p.get("part_kind") == "tool-call"
    ]


def envelope_call_ids(kind: str, inner: Mapping[str, Any]) -> list[Any]:
    """The ids of the tool calls an envelope's message makes, in order."""
    return [call_id for call_id, _call in envelope_calls(kind, inner)]


def envelope_result_ids(kind: str, inner: Mapping[str, Any]) -> list[Any]:
    """The ids of the tool calls an envelope's message answers, in order."""
    if kind == ADK_EVENT:
        return [p.get("id") for p in _adk_parts(inner, "function_response")]
    if kind == STRANDS:
        return [b.get("toolUseId") for b in _strands_blocks(inner, "toolResult")]
    if kind == LLAMA_INDEX:
        return _llama_results(inner)
    if kind == AGENT_FRAMEWORK:
        return [c.get("call_id") for c in maf_contents(inner, "function_result")]
    if inner.get("kind") != "request":
        return []
    return [
        p.get("tool_call_id")
        for p in _pydantic_parts(inner)
        if p.get("part_kind") in _PYDANTIC_RESULTS
        # a retry of the output (no tool) answers no call
        and (p.get("part_kind") != "retry-prompt" or p.get("tool_name") is not None)
    ]


# ---------------------------------------------------------------------------- ADK


def _adk_parts(event: Mapping[str, Any], key: str) -> Iterator[dict[str, Any]]:
    """The ``key`` objects (``function_call``, ``function_response``) of an event's parts."""
    content = event.get("content")
    parts = content.get("parts") if isinstance(content, dict) else None
    if isinstance(parts, list):
        for part in parts:
            value = part.get(key) if isinstance(part, dict) else None
            if isinstance(value, dict):
                yield value


def _adk_pieces(event: Mapping[str, Any]) -> Iterator[Piece]:
    content = event.get("content")
    parts = content.get("parts") if isinstance(content, dict) else None
    if not isinstance(parts, list):
        return
    for part in parts:
        if not isinstance(part, dict):
            continue
        text = part.get("text")
        if isinstance(text, str) and not part.get("thought"):
            yield "text", text
        call = part.get("function_call")
        if isinstance(call, dict):
            yield "arguments", call.get("args")
        response = part.get("function_response")
        if isinstance(response, dict):
            yield "values", response.get("response")
        code = part.get("executable_code")
        if isinstance(code, dict):
            yield "text", code.get("code")
        result = part.get("code_execution_result")
        if isinstance(result, dict):
            yield "text", result.get("output")


# ---------------------------------------------------------------------------- Pydantic AI


def _pydantic_parts(message: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    parts = message.get("parts")
    if isinstance(parts, list):
        for part in parts:
            if isinstance(part, dict):
                yield part


def _pydantic_pieces(message: Mapping[str, Any]) -> Iterator[Piece]:
    for part in _pydantic_parts(message):
        kind = part.get("part_kind")
        content = part.get("content")
        if kind in ("system-prompt", "user-prompt"):
            # A string, or a list of strings and media (whose data is not text).
            for item in content if isinstance(content, list) else [content]:
                yield "text", item
        elif kind == "text":
            yield "text", content
        elif kind in ("tool-call", "builtin-tool-call"):
            yield "arguments", part.get("args")
        elif kind in ("tool-return", "builtin-tool-return"):
            yield "values", content
        elif kind in ("retry-prompt", "retry-feedback"):
            # A string, or validation errors, whose ``msg`` says what was wrong.
            if isinstance(content, list):
                for error in content:
                    if isinstance(error, dict):
                        yield "text", error.get("msg")
            else:
                yield "text", content


# ---------------------------------------------------------------------------- Strands


def strands_message(session_message: Mapping[str, Any]) -> dict[str, Any]:
    """The message a Strands ``SessionMessage`` gives its agent: ``redact_message`` when
    set, else ``message`` (``{}`` when neither is an object)."""
    redacted = session_message.get("redact_message")
    message = redacted if isinstance(redacted, dict) else session_message.get("message")
    return message if isinstance(message, dict) else {}


def strands_blocks(session_message: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """The content blocks of the message a ``SessionMessage`` gives its agent."""
    content = strands_message(session_message).get("content")
    if isinstance(content, list):
        for block in content:
            if isinstance(block, dict):
                yield block


def _strands_blocks(session_message: Mapping[str, Any], key: str) -> Iterator[dict[str, Any]]:
    """The ``key`` objects (``toolUse``, ``toolResult``) of a ``SessionMessage``'s blocks."""
    for block in strands_blocks(session_message):
        value = block.get(key)
        if isinstance(value, dict):
            yield value


def _strands_pieces(session_message: Mapping[str, Any]) -> Iterator[Piece]:
    for block in strands_blocks(session_message):
        text = block.get("text")
        if isinstance(text, str):
            yield "text", text
        use = block.get("toolUse")
        if isinstance(use, dict):
            yield "arguments", use.get("input")
        result = block.get("toolResult")
        items = result.get("content") if isinstance(result, dict) else None
        for item in items if isinstance(items, list) else []:
            if isinstance(item, dict):
                yield "text", item.get("text")
                if "json" in item:
                    yield "values", item["json"]
        guard = block.get("guardContent")
        guarded = guard.get("text") if isinstance(guard, dict) else None
        if isinstance(guarded, dict):
            yield "text", guarded.get("text")
        cited = block.get("citationsContent")
        parts = cited.get("content") if isinstance(cited, dict) else None
        for part in parts if isinstance(parts, list) else []:
            if isinstance(part, dict):
                yield "text", part.get("text")


# ---------------------------------------------------------------------------- LlamaIndex


def llama_blocks(message: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """The content blocks of a LlamaIndex message in order, those inside ``citable``
    blocks (their ``content``) and ``citation`` blocks (their ``cited_content``) too."""
    stack: list[Iterator[Any]] = [iter(_listed(message.get("blocks")))]
    while stack:
        block = next(stack[-1], _END)
        if block is _END:
            stack.pop()
            continue
        if not isinstance(block, dict):
            continue
        yield block
        kind = block.get("block_type")
        if kind in _LLAMA_NESTED:
            stack.append(iter(_listed(block.get(_LLAMA_NESTED[kind]))))


_END = object()
_LLAMA_NESTED = {"citable": "content", "citation": "cited_content"}


def _listed(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value] if isinstance(value, dict) else []


def llama_openai_calls(message: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The OpenAI-style ``additional_kwargs.tool_calls`` of a LlamaIndex message."""
    extra = message.get("additional_kwargs")
    calls = extra.get("tool_calls") if isinstance(extra, dict) else None
    return [c for c in calls if isinstance(c, dict)] if isinstance(calls, list) else []


def _llama_pieces(message: Mapping[str, Any]) -> Iterator[Piece]:
    """``text`` blocks (also inside citable and citation blocks), ``tool_call`` blocks'
    ``tool_kwargs`` and OpenAI-style ``additional_kwargs.tool_calls`` arguments; never
    thinking, images, audio, video, documents or ids."""
    for block in llama_blocks(message):
        kind = block.get("block_type")
        if kind == "text":
            yield "text", block.get("text")
        elif kind == "tool_call":
            yield "arguments", block.get("tool_kwargs")
    for call in llama_openai_calls(message):
        fn = call.get("function")
        yield "arguments", fn.get("arguments") if isinstance(fn, dict) else call.get("args")


def _llama_calls(message: Mapping[str, Any]) -> list[tuple[Any, dict[str, Any]]]:
    found = [
        (b.get("tool_call_id"), b)
        for b in llama_blocks(message)
        if b.get("block_type") == "tool_call"
    ]
    found.extend((c.get("id"), c) for c in llama_openai_calls(message))
    return found


def _llama_results(message: Mapping[str, Any]) -> list[Any]:
    if message.get("role") not in ("tool", "function"):
        return []
    extra = message.get("additional_kwargs")
    return [extra.get("tool_call_id")] if isinstance(extra, dict) else [None]


# ---------------------------------------------------------------------------- Agent Framework


def maf_contents(message: Mapping[str, Any], kind: str | None = None) -> list[dict[str, Any]]:
    """The ``contents`` of an Agent Framework message (of ``type`` ``kind`` when given)."""
    contents = message.get("contents")
    if not isinstance(contents, list):
        return []
    return [c for c in contents if isinstance(c, dict) and (kind is None or c.get("type") == kind)]


def _maf_pieces(message: Mapping[str, Any]) -> Iterator[Piece]:
    """``text`` contents, ``function_call`` ``arguments`` and ``function_result``
    ``result``; never reasoning, data, URIs, usage or ids."""
    for content in maf_contents(message):
        kind = content.get("type")
        if kind == "text":
            yield "text", content.get("text")
        elif kind == "function_call":
            yield "arguments", content.get("arguments")
        elif kind == "function_result":
            yield "values", content.get("result")
