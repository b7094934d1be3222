"""A LangGraph thread's channel values for ``threads show``: decoded by the LangGraph
adapter (its saver over the store, with LangGraph's serializer) and printed as messages.
Without LangGraph installed, ``channel_values`` says so on stderr and decodes nothing."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import IO, Any

from histstore import HistStoreError, Message, Store

from ._messages import compact
from ._render import Printer, Style

__all__ = ["MISSING_SERDE", "channel_values", "print_value"]

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
