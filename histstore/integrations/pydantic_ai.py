"""A Pydantic AI message history kept in a histstore conversation.

::

    from pydantic_ai import Agent
    from histstore.integrations.pydantic_ai import HiststoreMessageHistory

    async with HiststoreMessageHistory("chat-42", "chat.db") as history:
        result = await agent.run("Hi", message_history=await history.messages())
        await history.add(result.new_messages())

Each ``ModelMessage`` (a ``ModelRequest`` or ``ModelResponse``) is stored as one
histstore message ``{"role": ..., "type": "pydantic_ai", "message": <its JSON form>}``:
the message is exactly the JSON Pydantic AI's ``ModelMessagesTypeAdapter.dump_json``
writes (bytes as base64), read back with its ``validate_json``, so a history reads back
as Pydantic AI's own JSON round trip gives it (equal to what was added, for messages as
agents produce them). ``role`` is the message's in histstore's terms: ``assistant`` for a
response; for a request ``tool`` when it returns a tool result or a retry, else ``user``
when it holds a user prompt, ``system`` when it holds only system prompt parts. The
parts' text (prompts, text, tool-call arguments, tool returns) is the message's indexed
text, so search, ``histstore show``, ``WindowStore`` and ``compact`` understand the
history. A plain histstore message an edit put in (such as the summary ``compact``
makes) reads as a ``ModelRequest`` with a ``UserPromptPart`` (a ``system`` message: a
``SystemPromptPart``) or, for an ``assistant`` message, a ``ModelResponse`` with a
``TextPart``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Final

from histstore import InvalidMessage, Message, Store, WindowTooSmall, indexed_text, validate_id
from histstore.envelopes import pydantic_ai_role

from . import StoreTarget, _missing_framework, _StoreAdapter, _StoreHandle, _unwrap

try:
    from pydantic_ai.messages import (
        ModelMessage,
        ModelMessagesTypeAdapter,
        ModelRequest,
        ModelResponse,
    )
    from pydantic_core import PydanticSerializationError
except ImportError as _exc:  # pragma: no cover - exercised in a subprocess by the tests
    raise _missing_framework("pydantic_ai", "pydantic-ai", _exc) from _exc

__all__ = ["HiststoreMessageHistory"]

MESSAGE_TYPE: Final = "pydantic_ai"
"""The ``type`` of the histstore message that holds one ``ModelMessage``."""

# Request parts that answer an earlier response (a tool result, a retried call, feedback
# on unusable output; "retry-prompt" is the deprecated form of the last two): a window
# must not start at a request holding one, or the model would see an answer to nothing.
_ANSWERS = frozenset({"tool-return", "retry-prompt", "retry-feedback"})


class _Default:
    """The ``limit`` meaning "the history's own default"."""

    def __repr__(self) -> str:
        return "DEFAULT"


_DEFAULT: Final = _Default()


def _payload(message: Message) -> dict[str, Any]:
    """The ``ModelMessage`` JSON of a stored message: what an envelope holds, or the
    request or response a plain message stands for (see the module's docstring)."""
    data = message.to_dict()
    role = data.get("role")
    if data.get("type") == MESSAGE_TYPE or not isinstance(role, str):
        return _unwrap(
            message, MESSAGE_TYPE, "message", "the conversation is not a Pydantic AI message"
        )
    text = indexed_text(message) or ""
    created = message.created_at
    stamp = {} if created is None else {"timestamp": created.isoformat()}
    if role == "assistant":
        return {"kind": "response", "parts": [{"part_kind": "text", "content": text}], **stamp}
    kind = "system-prompt" if role == "system" else "user-prompt"
    return {"kind": "request", "parts": [{"part_kind": kind, "content": text, **stamp}]}


def _starts_clean(payload: dict[str, Any]) -> bool:
    """Whether a window may start here: a request that answers nothing earlier."""
    parts = payload.get("parts") or []
    return payload.get("kind") == "request" and not any(
        isinstance(p, dict) and p.get("part_kind") in _ANSWERS for p in parts
    )


def _system_parts(payload: dict[str, Any]) -> list[Any]:
    if payload.get("kind") != "request":
        return []
    parts = payload.get("parts") or []
    return [p for p in parts if isinstance(p, dict) and p.get("part_kind") == "system-prompt"]


class HiststoreMessageHistory(_StoreAdapter):
    """A Pydantic AI message history (a list of ``ModelMessage``) in one conversation.

    Args:
        conversation_id: the conversation id (histstore's id rules apply).
        store: a ``Store`` (borrowed, never closed here) or anything
            ``histstore.connect()`` takes (owned: one store per event loop, opened on
            that loop's first use, released when the loop ends or by ``close()`` or
            ``async with``).
        limit: the default for ``messages(limit=...)``; ``None`` (the default) returns
            the whole history. A window keeps the system prompt (see ``messages``).

    Raises:
        InvalidId: ``conversation_id`` breaks the id rules.
        TypeError, ValueError: ``store`` is not a store or a valid target; a negative
            ``limit``.
    """

    conversation_id: str

    def __init__(
        self, conversation_id: str, store: StoreTarget, *, limit: int | None = None
    ) -> None:
        self.conversation_id = validate_id(conversation_id)
        self._handle = _StoreHandle(store)
        self.limit = _check_limit(limit)

    async def messages(self, *, limit: int | _Default | None = _DEFAULT) -> list[ModelMessage]:
        """The stored messages, oldest first, ready for ``agent.run(message_history=...)``.

        Args:
            limit: keep at most this many of the newest messages, starting at a request
                that answers nothing earlier (no tool result, no retry), so a tool call is
                never separated from its result and the history starts with a request.
                When the window does not start at the first message, the first
                message's system prompt parts are put in front of the window's first
                request (as ``WindowStore`` keeps system messages; they add no
                message). Only those and the first message are read.
                ``None``: every message. Default: the history's ``limit``.

        Raises:
            WindowTooSmall: the newest ``limit`` messages hold no such start (the newest
                run alone is longer than ``limit``).
            ValueError: a negative ``limit``.
        """
        limit = self.limit if isinstance(limit, _Default) else _check_limit(limit)
        store = await self._store()
        if limit == 0:
            return []
        stored = await store.read(self.conversation_id, limit=limit)
        payloads = [_payload(m) for m in stored]
        if limit is not None and stored and stored[0].position != 0:
            start = next((i for i, p in enumerate(payloads) if _starts_clean(p)), None)
            if start is None:
                raise WindowTooSmall(
                    f"the newest run of conversation {self.conversation_id!r} has more than"
                    f" {limit} messages"
                )
            payloads = payloads[start:]
            if stored[start].position != 0:
                payloads[0] = await self._with_system_prompt(store, payloads[0])
        # validate_json, not validate_python: the JSON form's bytes are base64 text, which
        # only the JSON validator decodes.
        return ModelMessagesTypeAdapter.validate_json(json.dumps(payloads))

    async def _with_system_prompt(self, store: Store, first: dict[str, Any]) -> dict[str, Any]:
        """The window's first request with the history's system prompt in front."""
        if _system_parts(first):
            return first
        head = await store.read(self.conversation_id, start=0, stop=1)
        system = _system_parts(_payload(head[0])) if head else []
        if not system:
            return first
        return {**first, "parts": [*system, *(first.get("parts") or [])]}

    async def add(self, messages: Sequence[ModelMessage]) -> None:
        """Append messages (e.g. ``result.new_messages()``), all of them or none.

        Raises:
            InvalidMessage: an item is not a ``ModelRequest``/``ModelResponse`` or has no
                JSON form (nothing is written).
            WriteError: the database failed; see its ``outcome``.
        """
        items = list(messages)
        for item in items:
            if not isinstance(item, (ModelRequest, ModelResponse)):
                raise InvalidMessage(
                    f"expected a ModelRequest or ModelResponse, not {type(item).__name__}"
                )
        if not items:
            return
        try:
            payloads = json.loads(ModelMessagesTypeAdapter.dump_json(items))
        except (PydanticSerializationError, TypeError, ValueError) as exc:
            raise InvalidMessage("a Pydantic AI message cannot be stored as JSON") from exc
        store = await self._store()
        await store.write(
            self.conversation_id,
            [{"role": pydantic_ai_role(p), "type": MESSAGE_TYPE, "message": p} for p in payloads],
        )

    async def clear(self) -> None:
        """Remove the whole history (the histstore conversation). Idempotent."""
        store = await self._store()
        await store.clear(self.conversation_id)

    def __repr__(self) -> str:
        return f"HiststoreMessageHistory({self.conversation_id!r})"


def _check_limit(limit: int | None) -> int | None:
    if limit is not None and limit < 0:
        raise ValueError("limit must be None or >= 0")
    return limit
