"""The summaries, metadata and named-list calls of ``Store`` (SPEC 5), kept apart from
the others."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from .._core.models import Summary
from .lists import Lists
from .state import State

__all__ = ["StateCalls"]


class StateCalls:
    """``Store``'s calls for a conversation's state beside its messages: summaries,
    metadata and named lists."""

    _state: State
    _lists: Lists

    async def add_summary(self, conversation: str, summary: Summary) -> None:
        """Add a summary to the conversation (created when needed).

        Raises:
            NotFound: through a view, the id belongs to a conversation it may not see.
        """
        await self._state.add_summary(conversation, summary)

    async def summaries(self, conversation: str) -> list[Summary]:
        """The conversation's summaries in the order added; ``[]`` when unknown."""
        return await self._state.summaries(conversation)

    async def metadata(self, conversation: str) -> dict[str, Any]:
        """The conversation's metadata (``{}`` when it has none).

        Raises:
            NotFound: the conversation does not exist (or is not this view's).
        """
        return await self._state.metadata(conversation)

    async def merge_metadata(self, conversation: str, updates: Mapping[str, Any]) -> None:
        """Set the given top-level keys; a ``None`` value removes its key.

        Other keys are left alone. Each key is written by its own upsert, never by
        reading and rewriting the whole mapping, so concurrent merges of different keys
        from any number of tasks or processes never lose one. Creates the conversation
        when needed.

        Raises:
            InvalidMessage: a key breaks the id rules or a value does not survive a
                JSON round trip. Nothing is written.
            NotFound: through a view, the id belongs to a conversation it may not see.
        """
        await self._state.merge_metadata(conversation, updates)

    async def list_append(self, conversation: str, name: str, items: Iterable[Any]) -> int:
        """Append JSON values (or ``bytes``) to a named list; returns its new length.

        Costs O(len(items)) however long the list is. Creates the conversation when
        needed.

        Raises:
            InvalidId: bad conversation id or list name.
            InvalidMessage: an item does not survive a JSON round trip.
            NotFound: through a view, the id belongs to a conversation it may not see.
        """
        return await self._lists.append(conversation, name, items)

    async def list_load(
        self, conversation: str, name: str, *, start: int = 0, limit: int | None = None
    ) -> list[Any]:
        """The items of a named list from ``start`` on, at most ``limit`` of them.

        A list never written is empty.

        Raises:
            NotFound: the conversation does not exist (or is not this view's).
        """
        return await self._lists.load(conversation, name, start, limit)

    async def list_len(self, conversation: str, name: str) -> int:
        """The length of a named list (0 when never written).

        Raises:
            NotFound: the conversation does not exist (or is not this view's).
        """
        return await self._lists.length(conversation, name)
