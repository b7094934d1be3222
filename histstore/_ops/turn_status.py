"""The status of a conversation's newest turn, read backwards a page at a time."""

from __future__ import annotations

from .. import turns
from .._core.models import Message
from .history import History

__all__ = ["newest_turn_status"]

_PAGE = 32


async def newest_turn_status(history: History, conversation: str) -> str:
    """``turns.status`` of the newest turn: reads only as far back as that turn starts."""
    collected: list[Message] = []
    stop: int | None = None
    while True:
        page = await history.read(conversation, _PAGE, 0, stop)
        collected[:0] = page
        groups = turns.split_turns(collected)
        if len(groups) >= 2 or len(page) < _PAGE or not page or page[0].position == 0:
            return turns.status(groups[-1] if groups else collected)
        stop = page[0].position
