"""A conversation's newest entries with the facts of its editable state (``histstore show``)."""

from __future__ import annotations

from .._core.ids import validate_id
from .._errors import NotFound
from .._ops.edit_reads import ConversationTail
from .._ops.edit_reads import tail as _tail
from .._store import Store, store_call

__all__ = ["ConversationTail", "tail"]


@store_call
async def tail(store: Store, conversation: str, *, last: int | None = None) -> ConversationTail:
    """The newest ``last`` entries of ``conversation`` (every entry: ``None``) with its
    revision, halt, asides and turn records' count and newest, read in one snapshot.
    Costs O(``last`` + asides) whatever the history's length: what ``store.edit`` holds,
    without the older entries.

    Raises:
        InvalidId: a bad id.
        TypeError, ValueError: ``last`` is not a non-negative int.
        NotFound: the conversation does not exist or the view may not see it.
    """
    validate_id(conversation)
    if last is not None and (not isinstance(last, int) or isinstance(last, bool)):
        raise TypeError("last must be an int or None")
    if last is not None and last < 0:
        raise ValueError("last must not be negative")
    ctx = store.internals
    found = await ctx.executor.snapshot(
        _tail(ctx, conversation, last), action="read the tail of", conversation=conversation
    )
    if found is None:
        raise NotFound(f"conversation {conversation!r} not found")
    return found
