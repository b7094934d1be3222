"""The ``role`` histstore's framework adapters store beside a framework message in its
envelope.

Some adapters keep a framework message in an envelope, because the framework's own JSON
has no histstore ``role`` (or a record around the message): ``{"role": ..., "type":
"adk_event", "event": {...}}`` (an ADK event), ``{"role": ..., "type": "pydantic_ai",
"message": {...}}`` (a Pydantic AI message) and ``{"role": ..., "type":
"strands_message", "session_message": {...}}`` (a Strands ``SessionMessage``), and the
``"llama_index"`` and ``"agent_framework"`` envelopes (under ``"message"``). The
role is histstore's (``user``, ``assistant``, ``system``, ``tool``), in the framework's
meaning; it is what the ``role`` column, ``histstore.turns``,
``WindowStore``, ``compact`` and ``histstore show`` go by. Reading an envelope back
ignores it.

Pure JSON, no framework import: the adapters call these on the JSON they store, and
``histstore reindex`` (after ``histstore migrate --sql``) on the stored JSON, so both
agree. The migration that gave the envelopes stored before it their role (revision
f3b8d6a2c915) has its own copy of these rules, as they stood then.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ._core.framework_text import llama_blocks as llama_index_blocks
from ._core.framework_text import llama_openai_calls as llama_index_openai_calls
from ._core.framework_text import maf_contents as agent_framework_contents
from ._core.framework_text import strands_blocks, strands_message

__all__ = [
    "ROLES",
    "adk_role",
    "agent_framework_contents",
    "agent_framework_role",
    "llama_index_blocks",
    "llama_index_openai_calls",
    "llama_index_role",
    "pydantic_ai_role",
    "strands_role",
]

# Pydantic AI request parts that answer the previous response (a tool result, a retried
# tool call, feedback on unusable output): such a request is a tool result, not a turn.
_ANSWERS = frozenset({"tool-return", "retry-prompt", "retry-feedback"})


def adk_role(event: Mapping[str, Any]) -> str | None:
    """The role of an ADK event's JSON, ``None`` for an event without content parts.

    A ``function_response`` part makes it ``tool``; else ``content.role`` ``"model"`` is
    ``assistant`` and ``"user"`` is ``user``; without one, the author decides (``"user"``
    or an agent, ``assistant``). An event with no parts (a state change, an end of
    invocation) is no message, and gets no role.
    """
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


def pydantic_ai_role(message: Mapping[str, Any]) -> str:
    """The role of a Pydantic AI message's JSON.

    A response is ``assistant``. A request holding a tool return or a retry is ``tool``;
    else one holding a user prompt is ``user``; one made only of system prompt parts is
    ``system``; any other request (no parts) is ``user``.
    """
    if message.get("kind") == "response":
        return "assistant"
    parts = message.get("parts")
    kinds = {p.get("part_kind") for p in parts if isinstance(p, dict)} if parts else set()
    if kinds & _ANSWERS:
        return "tool"
    if "user-prompt" in kinds:
        return "user"
    if kinds == {"system-prompt"}:
        return "system"
    return "user"


def strands_role(session_message: Mapping[str, Any]) -> str:
    """The role of a Strands ``SessionMessage``'s JSON, from the message the agent sees
    (``redact_message`` when set, else ``message``).

    ``"assistant"`` is ``assistant``; a user message holding a ``toolResult`` block is
    ``tool``; any other is ``user``.
    """
    if strands_message(session_message).get("role") == "assistant":
        return "assistant"
    if any(isinstance(b.get("toolResult"), dict) for b in strands_blocks(session_message)):
        return "tool"
    return "user"


# LlamaIndex ``MessageRole`` values that are another histstore role under another name.
_LLAMA_INDEX_ROLES = {
    "developer": "system",
    "function": "tool",
    "chatbot": "assistant",
    "model": "assistant",
}


def llama_index_role(message: Mapping[str, Any]) -> str:
    """The role of a LlamaIndex ``ChatMessage``'s JSON: its own ``role`` (``user``,
    ``assistant``, ``system``, ``tool``), with ``developer`` read as ``system``,
    ``function`` as ``tool`` and ``chatbot`` and ``model`` as ``assistant``; a missing or
    unknown one is ``user`` (LlamaIndex's default)."""
    role = message.get("role")
    if role in ("user", "assistant", "system", "tool"):
        return str(role)
    return _LLAMA_INDEX_ROLES.get(role, "user") if isinstance(role, str) else "user"


def agent_framework_role(message: Mapping[str, Any]) -> str:
    """The role of a Microsoft Agent Framework ``Message``'s JSON: its own ``role``
    (``user``, ``assistant``, ``system``, ``tool``); any other is read as LlamaIndex's
    (``developer``: ``system``, ...), a missing one as ``user``."""
    return llama_index_role(message)


ROLES: Mapping[str, Callable[[Mapping[str, Any]], str | None]] = {
    "adk_event": adk_role,
    "pydantic_ai": pydantic_ai_role,
    "strands_message": strands_role,
    "llama_index": llama_index_role,
    "agent_framework": agent_framework_role,
}
"""Envelope ``type`` -> the role of the framework JSON it holds (``None``: no message)."""
