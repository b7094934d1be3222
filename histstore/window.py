"""WindowStore: read a conversation as its system prompt plus its newest whole turns."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ._core.models import Message, MessageLike, WriteOutcome
from ._core.search_text import indexed_text
from ._errors import WindowTooSmall
from .turns import _is_system, _starts_turn

if TYPE_CHECKING:
    from ._store import Store

__all__ = ["WindowStore"]

# Pages read backwards from the newest message. With a message limit the first page is
# sized to the limit (one read is then usually enough); with only a token limit the
# window's length is unknown, so pages start small and double, which bounds what is read
# beyond the window by the last page.
_FIRST_TOKEN_PAGE = 64
_MAX_PAGE = 1024

# The author of the summaries ``histstore.compact`` makes by default (``summaries=True``).
_COMPACT_AUTHOR = "histstore:compact"


def _limit(name: str, value: object) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int or None, not {type(value).__name__}")
    if value < 1:
        raise ValueError(f"{name} must be at least 1, not {value}")
    return value


def _merge_system(messages: Sequence[Message]) -> Message:
    """One system message standing for all of ``messages`` (see ``WindowStore``); a
    message without ``content`` (a framework envelope) stands by its indexed text."""
    parts = [c for c in (_system_content(m) for m in messages) if c is not None]
    content: Any
    if len(parts) == 1:
        content = parts[0]
    elif all(isinstance(c, str) for c in parts):
        content = "\n\n".join(parts)
    else:
        content = []
        for c in parts:
            if isinstance(c, list):
                content.extend(c)
            elif isinstance(c, str):
                content.append({"type": "text", "text": c})
            else:
                content.append(c)
    return Message.system(content)


def _system_content(message: Message) -> Any:
    content = message.content
    return indexed_text(message) if content is None else content


def _summaries(value: object) -> str | None:
    if value is False or value is None:
        return None
    if value is True:
        return _COMPACT_AUTHOR
    if not isinstance(value, str):
        raise TypeError(f"summaries must be a bool or an author str, not {type(value).__name__}")
    if not value:
        raise ValueError("summaries must be a non-empty author str")
    return value


class WindowStore:
    """A view of a store whose ``read`` returns only what fits a context window.

    ``read(conversation)`` returns one system message merging every system message of
    the history (left out when there is none), then the longest suffix of whole turns
    (``histstore.turns``) that fits. The merged message counts toward both limits. It is
    ``{"role": "system", "content": ...}``: a single content is kept as it is; string
    contents are joined with a blank line, in order; when any content is a list of
    blocks, the lists are concatenated, a string becoming a ``{"type": "text", "text":
    ...}`` block and any other value one item. ``None`` contents are skipped and other
    fields of the system messages are not kept. Whole turns never separate a tool call
    from its result. Messages keep their ``position`` and ``created_at``; the merged
    system message is new (``position`` is ``None``). ``write``, ``count``, ``pop``,
    ``clear`` and ``exists`` pass through to the store unchanged.

    With ``summaries``, the newest entry of that author (``Store.newest_by``: the
    summary ``histstore.compact`` made last) comes right after the merged system
    message and counts toward the limits; the turns after it are the newest whole turns
    that fit. When those turns reach back to the summary's own turn, the summary stands
    there, in its place, and is not repeated. A summary that is a system message is
    already part of the merged one.

    ``read`` costs what the window holds, not what the history holds: it fetches the
    system messages by index, then pages backwards from the newest message and stops at
    the first turn that does not fit. The pages are separate reads, not one snapshot.
    With ``summaries``, one more read (``Store.newest_by``, whose cost does not grow with
    the history either) finds the summary.

    Args:
        store: the store to read and write.
        max_messages: the most messages a window holds (the system message included).
        max_tokens: the most tokens a window holds, as ``count_tokens`` counts them.
        count_tokens: ``Message -> int``; defaults to the store's (``connect(count_tokens=)``).
            Used only with ``max_tokens``.
        summaries: ``True`` keeps the newest summary ``histstore.compact`` made (author
            ``"histstore:compact"``); a str, the newest entry of that author (the ``by``
            given to ``compact``); ``False`` (the default) none.

    Raises:
        TypeError: a limit is not an int, ``count_tokens`` is not callable, or
            ``summaries`` is neither a bool nor a str.
        ValueError: a limit is below 1, neither limit is given, ``max_tokens`` is
            given with no token counter here nor on the store, or ``summaries`` is "".
    """

    __slots__ = ("_count_tokens", "_max_messages", "_max_tokens", "_store", "_summaries")

    def __init__(
        self,
        store: Store,
        *,
        max_messages: int | None = None,
        max_tokens: int | None = None,
        count_tokens: Callable[[Message], int] | None = None,
        summaries: bool | str = False,
    ) -> None:
        self._max_messages = _limit("max_messages", max_messages)
        self._max_tokens = _limit("max_tokens", max_tokens)
        if self._max_messages is None and self._max_tokens is None:
            raise ValueError("WindowStore needs max_messages or max_tokens (or both)")
        if count_tokens is not None and not callable(count_tokens):
            raise TypeError("count_tokens must be a function Message -> int")
        counter = count_tokens if count_tokens is not None else store.count_tokens
        if self._max_tokens is not None and counter is None:
            raise ValueError(
                "max_tokens needs a token counter: pass count_tokens= to WindowStore"
                " or to histstore.connect()"
            )
        self._store = store
        self._count_tokens = counter
        self._summaries = _summaries(summaries)

    @property
    def store(self) -> Store:
        """The store underneath."""
        return self._store

    @property
    def max_messages(self) -> int | None:
        """The most messages a window holds, or ``None``."""
        return self._max_messages

    @property
    def max_tokens(self) -> int | None:
        """The most tokens a window holds, or ``None``."""
        return self._max_tokens

    @property
    def summaries(self) -> str | None:
        """The author whose newest entry the window keeps as a summary, or ``None``."""
        return self._summaries

    def __repr__(self) -> str:
        summaries = "" if self._summaries is None else f", summaries={self._summaries!r}"
        return (
            f"WindowStore({self._store!r}, max_messages={self._max_messages},"
            f" max_tokens={self._max_tokens}{summaries})"
        )

    def _tokens(self, message: Message) -> int:
        if self._max_tokens is None or self._count_tokens is None:
            return 0
        n = self._count_tokens(message)
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise ValueError("count_tokens must return an int >= 0")
        return n

    def _fits(self, messages: int, tokens: int) -> bool:
        return (self._max_messages is None or messages <= self._max_messages) and (
            self._max_tokens is None or tokens <= self._max_tokens
        )

    def _too_small(self, conversation: str, what: str) -> WindowTooSmall:
        return WindowTooSmall(
            f"{what} of conversation {conversation!r} does not fit the window"
            f" (max_messages={self._max_messages}, max_tokens={self._max_tokens})"
        )

    async def read(self, conversation: str) -> list[Message]:
        """The window: the merged system message, (the newest summary,) then the newest
        turns that fit.

        An unknown or empty conversation gives ``[]``.

        Raises:
            WindowTooSmall: the merged system message, the summary (with ``summaries``)
                and the newest turn do not fit the limits together.
            InvalidId: bad conversation id.
        """
        store = self._store
        head: list[Message] = []
        used_messages = used_tokens = 0
        systems = await store.system_messages(conversation)
        if systems:
            merged = _merge_system(systems)
            head.append(merged)
            used_messages, used_tokens = 1, self._tokens(merged)
            if not self._fits(used_messages, used_tokens):
                raise self._too_small(conversation, "the merged system message")
        summary = await self._summary(conversation)
        if summary is not None:
            used_messages += 1
            used_tokens += self._tokens(summary)
            if not self._fits(used_messages, used_tokens):
                what = "the merged system message and the summary" if head else "the summary"
                raise self._too_small(conversation, what)
        summary_at = None if summary is None else summary.position

        kept: list[list[Message]] = []  # whole turns, newest first, each newest first
        turn: list[Message] = []  # the turn being gathered, newest first
        turn_messages = turn_tokens = 0  # what it adds (the summary is counted already)
        holds_summary = inside = False  # the turn being gathered / a kept one holds it
        stop: int | None = None
        size = _MAX_PAGE if self._max_tokens is None else _FIRST_TOKEN_PAGE
        while True:
            want = size
            if self._max_messages is not None:
                # One message past the room left is enough to learn that a turn overflows.
                want = min(want, self._max_messages - used_messages - turn_messages + 1)
            page = await store.read(conversation, stop=stop, limit=want)
            for m in reversed(page):
                if _is_system(m):
                    continue  # already in the merged message
                turn.append(m)
                if summary_at is not None and m.position == summary_at:
                    holds_summary = True
                else:
                    turn_messages += 1
                    turn_tokens += self._tokens(m)
                    if not self._fits(used_messages + turn_messages, used_tokens + turn_tokens):
                        if not kept:
                            raise self._too_small(conversation, _with(head, summary))
                        return _assemble(head, None if inside else summary, kept)
                if _starts_turn(m):
                    kept.append(turn)
                    used_messages += turn_messages
                    used_tokens += turn_tokens
                    inside = inside or holds_summary
                    turn, turn_messages, turn_tokens, holds_summary = [], 0, 0, False
            first = page[0].position if page else None
            if len(page) < want or not first:  # reached position 0 (or the store ran dry)
                break
            stop = first
            size = min(size * 2, _MAX_PAGE)
        if turn:
            kept.append(turn)  # the leading turn: what precedes the first user message
            inside = inside or holds_summary
        return _assemble(head, None if inside else summary, kept)

    async def _summary(self, conversation: str) -> Message | None:
        """The newest summary to keep, or ``None`` (also when it is a system message,
        which the merged one holds already)."""
        if self._summaries is None:
            return None
        found = await self._store.newest_by(conversation, self._summaries)
        if found is None or _is_system(found):
            return None
        return found

    async def write(
        self,
        conversation: str,
        messages: Iterable[MessageLike],
        *,
        at: int | None = None,
        idempotency_key: str | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> WriteOutcome:
        """``Store.write``, unchanged."""
        return await self._store.write(
            conversation, messages, at=at, idempotency_key=idempotency_key, metadata=metadata
        )

    async def count(self, conversation: str) -> int:
        """``Store.count``: the whole conversation's length, not the window's."""
        return await self._store.count(conversation)

    async def pop(self, conversation: str) -> Message | None:
        """``Store.pop``, unchanged."""
        return await self._store.pop(conversation)

    async def clear(self, conversation: str) -> None:
        """``Store.clear``, unchanged."""
        await self._store.clear(conversation)

    async def exists(self, conversation: str) -> bool:
        """``Store.exists``, unchanged."""
        return await self._store.exists(conversation)


def _with(head: list[Message], summary: Message | None) -> str:
    """What must fit beside the newest turn, named for ``WindowTooSmall``."""
    if summary is None:
        return "the newest turn"
    if head:
        return "the merged system message, the summary and the newest turn"
    return "the summary and the newest turn"


def _assemble(
    head: list[Message], summary: Message | None, kept: list[list[Message]]
) -> list[Message]:
    window = list(head)
    if summary is not None:
        window.append(summary)
    for turn in reversed(kept):
        window.extend(reversed(turn))
    return window
