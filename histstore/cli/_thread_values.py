"""A LangGraph thread's channel values for ``threads show``: decoded by the LangGraph
adapter (its saver over the store, with LangGraph's serializer) and printed as messages.
Without LangGraph installed, ``channel_values`` says so on stderr and decodes nothing."""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import IO, Any

from histstore import HistStoreError, Message, Store

from ._messages import compact
from ._render import Printer, Style

__all__ = ["MISSING_SERDE", "channel_values", "newest_messages", "print_value"]

MISSING_SERDE = (
    "histstore: a thread's values are not shown: decoding them needs LangGraph's serializer"
    " (langgraph-checkpoint), which is not installed; install it with:"
    " pip install 'histstore[langgraph]' (--checkpoints shows the checkpoints only)"
)


async def channel_values(
    store: Store, thread_id: str, channel: str, checkpoint_ids: Sequence[str]
) -> dict[str, Any]:
    """``channel``'s value at each of the thread's (root namespace) checkpoints named, as
    JSON data (``histstore.integrations.langgraph.readable``), in the order given; a
    checkpoint without the channel is left out."""
    if not checkpoint_ids:
        return {}
    try:
        from histstore.integrations.langgraph import HiststoreSaver, readable
    except ImportError:
        print(MISSING_SERDE, file=sys.stderr)
        return {}
    saver = HiststoreSaver(store)
    found: dict[str, Any] = {}
    for checkpoint_id in checkpoint_ids:
        config = {
            "configurable": {
                "thread_id": thread_id,
                "checkpoint_ns": "",
                "checkpoint_id": checkpoint_id,
            }
        }
        got = await saver.aget_tuple(config)  # type: ignore[arg-type]
        values = {} if got is None else got.checkpoint.get("channel_values") or {}
        if channel in values:
            found[checkpoint_id] = readable(values[channel])
    return found


def newest_messages(store: Store) -> Callable[[str], Awaitable[Mapping[str, Any]]]:
    """For ``export``: a thread's ``messages`` (the channel of its newest checkpoint of
    the graph's namespace, as readable JSON) and ``messages_checkpoint`` (that
    checkpoint's id); nothing for a thread without one. Without LangGraph, or for a value
    the serializer cannot decode, nothing, said once on stderr."""
    said: set[str] = set()

    def once(line: str) -> None:
        if line not in said:
            said.add(line)
            print(line, file=sys.stderr)

    async def readable_thread(thread_id: str) -> Mapping[str, Any]:
        try:
            from histstore.integrations.langgraph import HiststoreSaver, readable
        except ImportError:
            once(MISSING_SERDE)
            return {}
        config = {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}
        try:
            got = await HiststoreSaver(store).aget_tuple(config)  # type: ignore[arg-type]
        except HistStoreError:
            raise
        except Exception as exc:  # noqa: BLE001 - a value of the graph's own types
            once(
                f"histstore: the messages of some threads are not written as JSON: their"
                f" values do not decode here ({type(exc).__name__}); their rows are"
            )
            return {}
        values = {} if got is None else got.checkpoint.get("channel_values") or {}
        if got is None or "messages" not in values:
            return {}
        return {
            "messages_checkpoint": got.checkpoint["id"],
            "messages": readable(values["messages"]),
        }

    return readable_thread


def print_value(out: IO[str], value: Any) -> None:
    """A channel's value: a list as messages (numbered from 0), anything else as JSON."""
    if not isinstance(value, list):
        out.write("  " + compact(value) + "\n")
        return
    if not value:
        out.write(Style(out).dim("  (empty)") + "\n")
    printer = Printer(out)
    for position, item in enumerate(value):
        try:
            message = Message.from_dict(item) if isinstance(item, dict) else None
        except HistStoreError:
            message = None
        if message is None:
            out.write(f"{position:>5}  {compact(item)}\n")
        else:
            printer.message(message, position=position)
