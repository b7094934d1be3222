"""A LangGraph agent for tests: a scripted chat model and a weather tool, looping
model → tools → model until the model stops asking for tools."""

from __future__ import annotations

from typing import Any

from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.tools import tool
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

__all__ = ["call_weather", "get_weather", "tool_loop"]


@tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    return f"It is sunny in {city}."


def tool_loop(model: GenericFakeChatModel, seen: list[int] | None = None) -> StateGraph[Any]:
    """An agent: the model, then tools while it asks for them, then the end; ``seen``
    collects how many messages the model was given at each call."""

    async def agent(state: MessagesState) -> dict[str, list[BaseMessage]]:
        if seen is not None:
            seen.append(len(state["messages"]))
        return {"messages": [await model.ainvoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("agent", agent)
    builder.add_node("tools", ToolNode([get_weather]))
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition)
    builder.add_edge("tools", "agent")
    return builder


def call_weather(city: str, call_id: str) -> AIMessage:
    """The model's message asking for the weather in ``city``."""
    return AIMessage(
        "", tool_calls=[{"name": "get_weather", "args": {"city": city}, "id": call_id}]
    )
