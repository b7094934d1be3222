"""A scripted Strands model for tests that drive a real ``Agent`` without a network: it
streams the events a provider streams (Bedrock's Converse shape, which Strands speaks)
for each turn of its script, and records the messages of every request."""

from __future__ import annotations

import copy
import json
from collections.abc import AsyncGenerator, AsyncIterable
from typing import Any

from strands.models.model import Model
from strands.types.content import Messages
from strands.types.streaming import StreamEvent

__all__ = ["ScriptedModel", "redact_input", "say", "use_tool"]

Turn = list[StreamEvent]


def say(text: str) -> Turn:
    """A turn answering with ``text``."""
    return [
        {"messageStart": {"role": "assistant"}},
        {"contentBlockDelta": {"contentBlockIndex": 0, "delta": {"text": text}}},
        {"contentBlockStop": {"contentBlockIndex": 0}},
        {"messageStop": {"stopReason": "end_turn"}},
    ]


def use_tool(name: str, tool_use_id: str, **arguments: Any) -> Turn:
    """A turn calling the tool ``name`` with ``arguments``."""
    start: Any = {"toolUse": {"name": name, "toolUseId": tool_use_id}}
    return [
        {"messageStart": {"role": "assistant"}},
        {"contentBlockStart": {"contentBlockIndex": 0, "start": start}},
        {
            "contentBlockDelta": {
                "contentBlockIndex": 0,
                "delta": {"toolUse": {"input": json.dumps(arguments)}},
            }
        },
        {"contentBlockStop": {"contentBlockIndex": 0}},
        {"messageStop": {"stopReason": "tool_use"}},
    ]


def redact_input(replacement: str, answer: str) -> Turn:
    """A turn in which a guardrail blocks the user's input: Strands redacts it to
    ``replacement`` (and the session with it), the model answering ``answer``."""
    return [
        {"messageStart": {"role": "assistant"}},
        {"redactContent": {"redactUserContentMessage": replacement}},
        {"contentBlockDelta": {"contentBlockIndex": 0, "delta": {"text": answer}}},
        {"contentBlockStop": {"contentBlockIndex": 0}},
        {"messageStop": {"stopReason": "guardrail_intervened"}},
    ]


class ScriptedModel(Model):
    """A model answering from ``script`` (one turn per request), recording the messages
    of every request in ``seen``."""

    def __init__(self, *turns: Turn) -> None:
        self.script: list[Turn] = list(turns)
        self.seen: list[Messages] = []

    def update_config(self, **model_config: Any) -> None:
        return None

    def get_config(self) -> Any:
        return {}

    def structured_output(self, *args: Any, **kwargs: Any) -> AsyncGenerator[Any, None]:
        raise NotImplementedError

    async def _stream(self, messages: Messages) -> AsyncGenerator[StreamEvent, None]:
        self.seen.append(copy.deepcopy(messages))
        for event in self.script.pop(0):
            yield event

    def stream(self, messages: Messages, *args: Any, **kwargs: Any) -> AsyncIterable[StreamEvent]:
        return self._stream(messages)
