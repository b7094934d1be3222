"""What ``show`` prints of a framework envelope (an ADK event, a Pydantic AI message, a
Strands session message, as the adapters store them): the framework message's text,
tool calls and tool results, never the envelope's JSON."""

from __future__ import annotations

import json
from typing import Any

from histstore.envelopes import (
    agent_framework_contents,
    llama_index_blocks,
    llama_index_openai_calls,
)

__all__ = ["Part", "framework_parts"]

Part = tuple[str, ...] | tuple[str, Any, Any, Any]
"""``("text", line)``, ``("call", name, arguments, id)`` or ``("result", id, value, "")``."""


def framework_parts(d: dict[str, Any]) -> list[Part] | None:
    """The parts of an envelope in order; ``None`` when ``d`` is no envelope."""
    kind = d.get("type")
    if kind == "adk_event" and isinstance(d.get("event"), dict):
        return _adk(d["event"])
    if kind == "pydantic_ai" and isinstance(d.get("message"), dict):
        return _pydantic(d["message"])
    if kind == "strands_message" and isinstance(d.get("session_message"), dict):
        return _strands(d["session_message"])
    if kind == "llama_index" and isinstance(d.get("message"), dict):
        return _llama_index(d["message"])
    if kind == "agent_framework" and isinstance(d.get("message"), dict):
        return _agent_framework(d["message"])
    return None


def _adk(event: dict[str, Any]) -> list[Part]:
    content = event.get("content")
    parts = content.get("parts") if isinstance(content, dict) else None
    found: list[Part] = []
    for part in parts if isinstance(parts, list) else []:
        if not isinstance(part, dict):
            continue
        if isinstance(part.get("text"), str):
            text = part["text"]
            found.append(
                ("text", "(thinking) " + " ".join(text.split()) if part.get("thought") else text)
            )
        call, response = part.get("function_call"), part.get("function_response")
        if isinstance(call, dict):
            found.append(("call", call.get("name"), call.get("args"), call.get("id")))
        if isinstance(response, dict):
            found.append(("result", response.get("id"), response.get("response"), ""))
        for key, field in (("executable_code", "code"), ("code_execution_result", "output")):
            value = part.get(key)
            if isinstance(value, dict) and isinstance(value.get(field), str):
                found.append(("text", value[field]))
    if not found:
        found.append(("text", "[event without content]"))
    return found


def _pydantic(message: dict[str, Any]) -> list[Part]:
    found: list[Part] = []
    for part in message.get("parts") or []:
        if not isinstance(part, dict):
            continue
        kind, content = part.get("part_kind"), part.get("content")
        if kind in ("system-prompt", "user-prompt", "text", "retry-feedback"):
            for item in content if isinstance(content, list) else [content]:
                found.append(("text", item if isinstance(item, str) else "[media]"))
        elif kind == "thinking" and isinstance(content, str):
            found.append(("text", "(thinking) " + " ".join(content.split())))
        elif kind in ("tool-call", "builtin-tool-call"):
            found.append(
                ("call", part.get("tool_name"), part.get("args"), part.get("tool_call_id"))
            )
        elif kind in ("tool-return", "builtin-tool-return", "retry-prompt"):
            found.append(("result", part.get("tool_call_id"), content, ""))
        else:
            found.append(("text", f"[{kind or 'part'}]"))
    return found


def _strands(session_message: dict[str, Any]) -> list[Part]:
    """The message the agent sees (the redacted one, when it was redacted)."""
    redacted = session_message.get("redact_message")
    message = redacted if isinstance(redacted, dict) else session_message.get("message")
    content = message.get("content") if isinstance(message, dict) else None
    found: list[Part] = []
    for block in content if isinstance(content, list) else []:
        if not isinstance(block, dict):
            continue
        use, result = block.get("toolUse"), block.get("toolResult")
        reasoning = block.get("reasoningContent")
        if isinstance(block.get("text"), str):
            found.append(("text", block["text"]))
        elif isinstance(use, dict):
            found.append(("call", use.get("name"), use.get("input"), use.get("toolUseId")))
        elif isinstance(result, dict):
            found.append(("result", result.get("toolUseId"), _strands_result(result), ""))
        elif isinstance(block.get("guardContent"), dict):
            guarded = block["guardContent"].get("text")
            text = guarded.get("text") if isinstance(guarded, dict) else None
            found.append(("text", text if isinstance(text, str) else "[guardContent]"))
        elif isinstance(reasoning, dict):
            said = reasoning.get("reasoningText")
            text = said.get("text") if isinstance(said, dict) else None
            found.append(("text", "(thinking) " + " ".join(text.split()) if text else "[thinking]"))
        elif block:
            found.append(("text", f"[{next(iter(block))}]"))  # image, document, guardContent...
    if not found:
        found.append(("text", "[message without content]"))
    return found


def _strands_result(result: dict[str, Any]) -> list[str]:
    """A ``toolResult``'s content as lines: text as it is, JSON as one line, others by kind."""
    lines: list[str] = []
    items = result.get("content")
    for item in items if isinstance(items, list) else []:
        if not isinstance(item, dict):
            continue
        if isinstance(item.get("text"), str):
            lines.append(item["text"])
        elif "json" in item:
            lines.append(json.dumps(item["json"], ensure_ascii=False))
        elif item:
            lines.append(f"[{next(iter(item))}]")
    if result.get("status") == "error":
        lines.append("(error)")
    return lines


def _llama_index(message: dict[str, Any]) -> list[Part]:
    found: list[Part] = []
    extra = message.get("additional_kwargs")
    result_id = extra.get("tool_call_id") if isinstance(extra, dict) else None
    answers = message.get("role") in ("tool", "function")
    for block in llama_index_blocks(message):
        kind = block.get("block_type")
        text = block.get("text")
        if kind == "text" and answers:
            found.append(("result", result_id, text, ""))
        elif kind == "text":
            found.append(("text", text if isinstance(text, str) else ""))
        elif kind == "thinking" and isinstance(block.get("content"), str):
            found.append(("text", "(thinking) " + " ".join(block["content"].split())))
        elif kind == "tool_call":
            name, args = block.get("tool_name"), block.get("tool_kwargs")
            found.append(("call", name, args, block.get("tool_call_id")))
        elif kind not in ("citable", "citation"):
            found.append(("text", f"[{kind or 'block'}]"))
    for openai_call in llama_index_openai_calls(message):
        fn = openai_call.get("function")
        named: dict[str, Any] = fn if isinstance(fn, dict) else {}
        found.append(("call", named.get("name"), named.get("arguments"), openai_call.get("id")))
    if not found:
        found.append(("text", ""))
    return found


def _agent_framework(message: dict[str, Any]) -> list[Part]:
    found: list[Part] = []
    for content in agent_framework_contents(message):
        kind = content.get("type")
        text = content.get("text")
        if kind == "text":
            found.append(("text", text if isinstance(text, str) else ""))
        elif kind == "text_reasoning" and isinstance(text, str):
            found.append(("text", "(thinking) " + " ".join(text.split())))
        elif kind == "function_call":
            name, args = content.get("name"), content.get("arguments")
            found.append(("call", name, args, content.get("call_id")))
        elif kind == "function_result":
            found.append(("result", content.get("call_id"), content.get("result"), ""))
        else:
            found.append(("text", f"[{kind or 'content'}]"))
    if not found:
        found.append(("text", ""))
    return found
