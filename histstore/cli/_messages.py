"""What ``show`` (and ``search``, the demo) prints of one message, in every shape it
knows: Chat Completions, Responses items, Anthropic blocks, LangChain messages and the
framework envelopes the ADK and Pydantic AI adapters store (their text, tool calls and
tool results, never the envelope's JSON)."""

from __future__ import annotations

import json
from typing import Any

from ._frameworks import framework_parts

__all__ = ["compact", "message_lines"]


def compact(value: Any) -> str:
    """A string as it is, anything else as one line of JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False)


def _arguments(raw: Any) -> str:
    """A tool call's arguments (a JSON string or an object), shown compactly."""
    if isinstance(raw, str):
        text = raw
        try:
            raw = json.loads(text)
        except ValueError:
            return text
    if isinstance(raw, dict):
        return ", ".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in raw.items())
    if raw is None:
        return ""
    return compact(raw)


def _call(name: Any, arguments: Any, ident: Any, note: str = "") -> str:
    tag = f"  [{ident}]" if ident is not None else ""
    return f"-> {name if name is not None else '?'}({_arguments(arguments)}){tag}{note}"


def _result(ident: Any, lines: list[str]) -> list[str]:
    first = lines[0] if lines else ""
    return [f"<- [{ident}] {first}".rstrip(), *lines[1:]]


def _tool_call(call: Any, note: str = "") -> str:
    """One ``tool_calls`` entry: Chat Completions (``function``) or LangChain (``name``)."""
    if not isinstance(call, dict):
        return "-> " + compact(call)
    fn = call.get("function")
    if isinstance(fn, dict):
        return _call(fn.get("name"), fn.get("arguments"), call.get("id"), note)
    return _call(call.get("name"), call.get("args", call.get("arguments")), call.get("id"), note)


def _blocks(content: Any) -> list[str]:
    """Lines for a message's content: a string, or a list of content blocks."""
    if content is None:
        return []
    if isinstance(content, str):
        return content.splitlines() or [""]
    if not isinstance(content, list):
        return [compact(content)]
    lines: list[str] = []
    for block in content:
        if not isinstance(block, dict):
            lines.append(compact(block))
            continue
        kind = block.get("type")
        if isinstance(block.get("text"), str):
            lines.extend(block["text"].splitlines() or [""])
        elif kind in ("tool_use", "server_tool_use"):
            lines.append(_call(block.get("name"), block.get("input"), block.get("id")))
        elif kind == "tool_call":  # LangChain's standard content block
            lines.append(_tool_call(block))
        elif kind == "tool_result":
            lines.extend(_result(block.get("tool_use_id"), _blocks(block.get("content"))))
        elif kind == "thinking" and isinstance(block.get("thinking"), str):
            lines.append("(thinking) " + " ".join(block["thinking"].split()))
        else:
            lines.append(f"[{kind or 'block'}]")
    return lines


def message_lines(d: dict[str, Any]) -> list[str]:
    """What ``show`` prints for one message dict (any supported shape); never empty."""
    framework = framework_parts(d)
    if framework is not None:  # an adapter's envelope: the framework message it holds
        lines: list[str] = []
        for part in framework:
            if part[0] == "call":
                lines.append(_call(part[1], part[2], part[3]))
            elif part[0] == "result":
                lines.extend(_result(part[1], _blocks(part[2])))
            else:
                lines.extend(part[1].splitlines() or [""])
        return lines
    kind = d.get("type")
    if kind == "function_call":
        return [_call(d.get("name"), d.get("arguments"), d.get("call_id"))]
    if kind == "function_call_output":
        return _result(d.get("call_id"), _blocks(d.get("output")))
    if kind == "reasoning":
        texts = [b.get("text", "") for b in d.get("summary") or [] if isinstance(b, dict)]
        return ["(reasoning) " + " ".join(texts)]
    calls = d.get("tool_calls") or []
    invalid = d.get("invalid_tool_calls") or []
    legacy = d.get("function_call")
    lines = _blocks(d.get("content"))
    if lines == [""] and (calls or invalid or legacy):
        lines = []  # LangChain keeps "" beside tool calls
    if d.get("role") == "tool" or kind == "tool" or "tool_call_id" in d:
        lines = _result(d.get("tool_call_id"), lines)
    for call in calls if isinstance(calls, list) else [calls]:
        lines.append(_tool_call(call))
    for call in invalid if isinstance(invalid, list) else [invalid]:
        lines.append(_tool_call(call, "  (invalid)"))
    if isinstance(legacy, dict):
        lines.append(_call(legacy.get("name"), legacy.get("arguments"), None))
    return lines or [json.dumps(d, ensure_ascii=False)]
