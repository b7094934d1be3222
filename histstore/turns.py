"""Turns and tool-call pairing in message lists: pure functions, no I/O.

Every function takes a sequence of ``Message`` values or message dicts (anything else
raises ``InvalidMessage``) and understands three shapes of tool use:

- OpenAI Chat Completions: an assistant message's ``tool_calls`` entries (``id``),
  answered by ``{"role": "tool", "tool_call_id": ...}`` messages.
- OpenAI Responses: ``function_call``, ``custom_tool_call`` and ``computer_call`` items
  (``call_id``), answered by the matching ``..._output`` items with the same ``call_id``.
- Anthropic: ``tool_use`` blocks (``id``) in an assistant message's content, answered by
  ``tool_result`` blocks (``tool_use_id``) in a user message's content.

Turns:

- A turn begins at a user message and holds every following non-user message until the
  next user message. A user message that carries ``tool_result`` blocks answers calls of
  the current turn and starts none. This holds also when text blocks accompany the
  results, so that a call and its result always share a turn.
- System messages (role ``"system"``; other roles such as ``"developer"`` are ordinary
  messages) belong to no turn: ``split_turns`` leaves them out, wherever they stand.
- Messages before the first user message form a leading turn of their own, the only one
  that may start with something other than a user message.
- Reasoning items and every other non-user message belong to the current turn.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

from ._core.framework_text import envelope, envelope_calls, envelope_result_ids
from ._core.models import Message, MessageLike, as_message, message_data
from ._errors import InvalidMessage

__all__ = ["Status", "pending_tool_calls", "split_turns", "status", "validate_pairing"]

Status = Literal["open", "closed", "interrupted", "empty"]
"""What ``status`` returns."""

# Responses API items that call a tool, and the items that answer them (by ``call_id``).
_CALL_ITEMS = frozenset({"function_call", "custom_tool_call", "computer_call"})
_RESULT_ITEMS = frozenset(
    {"function_call_output", "custom_tool_call_output", "computer_call_output"}
)

# What a message is, as far as turns and pairing care.
_SYSTEM = "system"
_USER = "user"  # a user message that starts a turn
_RESULT = "result"  # a tool result: Chat "tool" message, Responses output, tool_result blocks
_ASSISTANT = "assistant"
_CALL = "call"  # a Responses tool-call item
_OTHER = "other"  # reasoning items, developer messages, anything else


def _role(d: Mapping[str, Any]) -> Any:
    role = d.get("role")
    return role if isinstance(role, str) else d.get("type")


def _blocks(d: Mapping[str, Any], kind: str) -> list[Mapping[str, Any]]:
    content = d.get("content")
    if not isinstance(content, list):
        return []
    return [b for b in content if isinstance(b, Mapping) and b.get("type") == kind]


def _kind(d: Mapping[str, Any]) -> str:
    role = _role(d)
    if role == "system":
        return _SYSTEM
    if role == "user":
        return _RESULT if _blocks(d, "tool_result") or _envelope_results(d) else _USER
    if role == "tool" or role in _RESULT_ITEMS:
        return _RESULT
    if role == "assistant":
        return _ASSISTANT
    if role in _CALL_ITEMS:
        return _CALL
    return _OTHER


def _calls(d: Mapping[str, Any]) -> list[tuple[Any, Mapping[str, Any]]]:
    """The tool calls a message makes, as ``(id, call)`` pairs in order."""
    framework = envelope(d)
    if framework is not None:
        return list(envelope_calls(*framework))
    found: list[tuple[Any, Mapping[str, Any]]] = []
    tool_calls = d.get("tool_calls")
    if isinstance(tool_calls, list):
        found.extend((c.get("id"), c) for c in tool_calls if isinstance(c, Mapping))
    role = _role(d)
    if role in _CALL_ITEMS:
        found.append((d.get("call_id"), d))
    elif role == "assistant":
        found.extend((b.get("id"), b) for b in _blocks(d, "tool_use"))
    return found


def _results(d: Mapping[str, Any]) -> list[Any]:
    """The ids of the calls a message answers, in order."""
    framework = envelope(d)
    if framework is not None:
        return envelope_result_ids(*framework)
    role = _role(d)
    if role == "tool":
        return [d.get("tool_call_id")]
    if role in _RESULT_ITEMS:
        return [d.get("call_id")]
    if role == "user":
        return [b.get("tool_use_id") for b in _blocks(d, "tool_result")]
    return []


def _envelope_results(d: Mapping[str, Any]) -> bool:
    """Whether ``d`` is a framework envelope that answers a tool call."""
    framework = envelope(d)
    return framework is not None and bool(envelope_result_ids(*framework))


def _valid_id(value: Any) -> bool:
    return isinstance(value, str) and value != ""


def _messages(messages: Iterable[MessageLike]) -> list[Message]:
    if isinstance(messages, (str, bytes, Mapping, Message)):
        raise InvalidMessage("expected a sequence of messages, not a single one")
    return [as_message(m) for m in messages]


def _is_system(message: Message) -> bool:
    """Whether the message is a system message (it belongs to no turn)."""
    return _kind(message_data(message)) == _SYSTEM


def _starts_turn(message: Message) -> bool:
    """Whether the message is a user message that starts a turn."""
    return _kind(message_data(message)) == _USER


def _last_turn_start(messages: Sequence[Message]) -> int:
    for i in range(len(messages) - 1, -1, -1):
        if _starts_turn(messages[i]):
            return i
    return 0


def split_turns(messages: Iterable[MessageLike]) -> list[list[Message]]:
    """Split a history into turns, oldest first.

    Concatenating the turns gives the input's non-system messages in order; system
    messages are left out. Every turn starts with a user message (one that is not made
    of tool results), except a leading turn holding what comes before the first one.

    Raises:
        InvalidMessage: an item is neither a ``Message`` nor a message dict.
    """
    turns: list[list[Message]] = []
    for m in _messages(messages):
        kind = _kind(message_data(m))
        if kind == _SYSTEM:
            continue
        if kind == _USER or not turns:
            turns.append([m])
        else:
            turns[-1].append(m)
    return turns


def pending_tool_calls(messages: Iterable[MessageLike]) -> list[dict[str, Any]]:
    """The tool calls of the current turn that nothing answers yet, oldest first.

    Only calls made since the last user message (not counting tool results) are
    considered, and a result answers a call only when it comes after it. Each call is
    returned as a fresh copy of its own dict: a Chat Completions ``tool_calls`` entry, a
    Responses ``function_call`` (or ``custom_tool_call``, ``computer_call``) item, or an
    Anthropic ``tool_use`` block. A call without an id can never be answered, so it stays
    pending.

    Raises:
        InvalidMessage: an item is neither a ``Message`` nor a message dict.
    """
    msgs = _messages(messages)
    pending: list[tuple[Any, Mapping[str, Any]]] = []
    for m in msgs[_last_turn_start(msgs) :]:
        d = message_data(m)
        for answered in _results(d):
            for i, (call_id, _call) in enumerate(pending):
                if _valid_id(call_id) and call_id == answered:
                    del pending[i]
                    break
        pending.extend(_calls(d))
    return [copy.deepcopy(dict(call)) for _id, call in pending]


def validate_pairing(messages: Iterable[MessageLike]) -> None:
    """Check that every tool call has exactly one result and every result a call.

    A result must come after its call and within the same turn (no user message in
    between, as the model APIs require), and call ids must be unique. A call still
    waiting for its result at the end fails too: use ``pending_tool_calls`` or
    ``status`` for a history in progress. Error messages name the call id (or the
    message's index) and never message content.

    Raises:
        InvalidMessage: the pairing is broken, or an item is not a message.
    """
    seen: set[str] = set()
    waiting: dict[str, int] = {}  # call id -> index of the message that made the call
    for index, m in enumerate(_messages(messages)):
        d = message_data(m)
        if _kind(d) == _USER and waiting:
            call_id = next(iter(waiting))
            raise InvalidMessage(
                f"tool call {call_id!r} has no result before the user message at index {index}"
            )
        for answered in _results(d):
            if not _valid_id(answered):
                raise InvalidMessage(f"a tool result in message {index} names no call id")
            if answered in waiting:
                del waiting[answered]
            elif answered in seen:
                raise InvalidMessage(
                    f"tool call {answered!r} has more than one result (again at index {index})"
                )
            else:
                raise InvalidMessage(
                    f"the tool result at index {index} answers {answered!r},"
                    " which no earlier tool call in its turn made"
                )
        for call_id, _call in _calls(d):
            if not _valid_id(call_id):
                raise InvalidMessage(f"a tool call in message {index} has no id")
            if call_id in seen:
                raise InvalidMessage(f"tool call id {call_id!r} is used more than once")
            seen.add(call_id)
            waiting[call_id] = index
    if waiting:
        call_id = next(iter(waiting))
        raise InvalidMessage(f"tool call {call_id!r} has no result")


def status(messages: Iterable[MessageLike]) -> Status:
    """Where the conversation stands.

    Returns:
        ``"empty"`` when there is no message besides system messages;
        ``"interrupted"`` when ``pending_tool_calls`` is not empty (a tool call has no
        result); ``"open"`` when the model owes an answer: the last message that
        decides is a user message or a tool result; ``"closed"`` when it is an
        assistant message (Chat Completions, Anthropic, or a Responses ``message`` item
        with role ``"assistant"``). Reasoning items and other messages decide nothing
        and are skipped; when nothing decides, the status is ``"open"``.

    Raises:
        InvalidMessage: an item is neither a ``Message`` nor a message dict.
    """
    msgs = [m for m in _messages(messages) if not _is_system(m)]
    if not msgs:
        return "empty"
    if pending_tool_calls(msgs):
        return "interrupted"
    for m in reversed(msgs):
        kind = _kind(message_data(m))
        if kind == _ASSISTANT:
            return "closed"
        if kind in (_USER, _RESULT, _CALL):
            return "open"
    return "open"
