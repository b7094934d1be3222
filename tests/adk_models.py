"""A scripted ADK model for tests that drive a real ``Runner`` without a network."""

from __future__ import annotations

import copy
from collections.abc import AsyncGenerator

from google.adk.models.base_llm import BaseLlm
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.genai import types
from pydantic import Field

__all__ = ["ScriptedModel", "model_text"]


class ScriptedModel(BaseLlm):
    """A model answering from a script, recording the contents of every request."""

    model: str = "scripted"
    script: list[LlmResponse] = Field(default_factory=list)
    seen: list[list[types.Content]] = Field(default_factory=list)

    async def generate_content_async(
        self, llm_request: LlmRequest, stream: bool = False
    ) -> AsyncGenerator[LlmResponse, None]:
        self.seen.append(copy.deepcopy(llm_request.contents))
        yield self.script.pop(0)


def model_text(text: str) -> LlmResponse:
    """A model turn answering with ``text``."""
    return LlmResponse(content=types.Content(role="model", parts=[types.Part(text=text)]))
