"""History around a model call: replay what is stored, call the model, store the exchange.

``with_history(store, model)`` wraps an async model function so that each call sees the
conversation's history and leaves the new messages and the reply stored as one batch,
written at the position the history ended at. If another writer got in between, or the
write fails, the reply is not lost: ``CommitError`` carries the exact batch and its
position, and ``await error.retry(store)`` stores it later without calling the model
again.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Iterable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias

from ._core.ids import new_key, validate_id
from ._core.models import Message, MessageLike, WriteOutcome, as_message
from ._errors import CommitError, ConflictError, HistStoreError, InvalidMessage

if TYPE_CHECKING:
    from ._ops.leases import Lease
    from ._store import Store

__all__ = ["HistoryChat", "Model", "Streamer", "with_history"]

Model: TypeAlias = Callable[[list[Message]], Awaitable[Any]]
"""An async function from the messages to send to the reply (a message or a list)."""
Streamer: TypeAlias = Callable[[list[Message]], AsyncIterable[Any]]
"""A function from the messages to send to an async iterator of events."""


class _Window(Protocol):
    async def read(self, conversation: str) -> list[Message]: ...


class HistoryChat:
    """A model (and/or streamer) bound to a store; made by ``with_history``.

    ``store``, ``model``, ``streamer``, ``window``, ``serialize`` and ``lease_ttl`` are
    ``with_history``'s arguments (see there).
    """

    def __init__(
        self,
        store: Store,
        model: Model | None = None,
        *,
        streamer: Streamer | None = None,
        window: _Window | None = None,
        serialize: bool = False,
        lease_ttl: float = 60,
    ) -> None:
        if model is None and streamer is None:
            raise TypeError("with_history() needs a model, a streamer, or both")
        self.store = store
        self.model = model
        self.streamer = streamer
        self.window = window
        self.serialize = serialize
        self.lease_ttl = lease_ttl

    @asynccontextmanager
    async def _turn(self, conversation: str) -> AsyncIterator[None]:
        """With ``serialize``, hold the conversation's lease for the whole turn, renewing
        it while the model runs; turns on one conversation then queue."""
        if not self.serialize:
            yield
            return
        async with self.store.lease(conversation, ttl=self.lease_ttl) as lease:
            renewing = asyncio.ensure_future(_keep(lease))
            try:
                yield
            finally:
                renewing.cancel()
                await asyncio.gather(renewing, return_exceptions=True)

    async def _history(self, conversation: str) -> tuple[list[Message], int]:
        """The messages to replay and the position the new batch belongs at."""
        if self.window is None:
            history = await self.store.read(conversation)
            return history, len(history)
        length = await self.store.count(conversation)
        history = await self.window.read(conversation)
        positions = [m.position for m in history if m.position is not None]
        # A write that landed between the two reads is in the window: the model saw it.
        return history, max([length, *(p + 1 for p in positions)])

    async def _commit(
        self, conversation: str, new: list[Message], reply: list[Message], at: int
    ) -> list[Message]:
        batch = [*new, *reply]
        key = new_key()
        try:
            await self.store.write(conversation, batch, at=at, idempotency_key=key)
        except Exception as exc:
            if isinstance(exc, HistStoreError):
                outcome = exc.outcome or WriteOutcome(0, False, None)
            else:  # not histstore's: nothing is known of what it stored
                outcome = WriteOutcome(0, True, None)
            why = (
                "another writer appended to it first"
                if isinstance(exc, ConflictError)
                else f"the write failed ({type(exc).__name__})"
            )
            raise CommitError(
                f"the reply for conversation {conversation!r} was not stored at {at}: {why};"
                " await error.retry(store) stores it without calling the model again",
                conversation=conversation,
                messages=batch,
                position=at,
                outcome=outcome,
                idempotency_key=key,
            ) from exc
        return reply

    async def __call__(self, conversation: str, messages: Iterable[MessageLike]) -> list[Message]:
        """Call the model with the history plus ``messages``; store both and the reply.

        Returns:
            The reply messages.

        Raises:
            InvalidMessage: a new message or a reply message cannot be stored; nothing
                is written (a bad reply is found before the write).
            CommitError: the batch could not be stored (see the class docs of
                ``CommitError``); its cause is whatever made the write fail.
        """
        if self.model is None:
            raise TypeError("this with_history() wrapper has no model; use stream()")
        validate_id(conversation)
        new = [as_message(m) for m in _messages(messages)]
        async with self._turn(conversation):
            history, at = await self._history(conversation)
            result = await self.model([*history, *new])
            reply = _reply(result)
            return await self._commit(conversation, new, reply, at)

    async def stream(
        self, conversation: str, messages: Iterable[MessageLike]
    ) -> AsyncIterator[Any]:
        """Stream the model's events; store the new messages and the reply afterwards.

        Every event is passed through; those that are ``Message`` values make up the
        reply, written once the stream ends. If the consumer stops early, or the
        streamer raises, nothing is written. A failed write raises ``CommitError`` after
        the last event.
        """
        if self.streamer is None:
            raise TypeError("this with_history() wrapper has no streamer; call it instead")
        validate_id(conversation)
        new = [as_message(m) for m in _messages(messages)]
        async with self._turn(conversation):
            history, at = await self._history(conversation)
            reply: list[Message] = []
            async for event in self.streamer([*history, *new]):
                if isinstance(event, Message):
                    reply.append(event)
                yield event
            await self._commit(conversation, new, reply, at)


async def _keep(lease: Lease) -> None:
    """Renew ``lease`` every third of its ttl until cancelled (or lost: the write's
    ``at`` check still guards the turn)."""
    while True:
        await asyncio.sleep(lease.ttl / 3)
        await lease.renew()


def _messages(messages: Iterable[MessageLike]) -> list[MessageLike]:
    if isinstance(messages, (str, bytes, dict, Message)):
        raise InvalidMessage("pass the new messages as a list, not a single one")
    return list(messages)


def _reply(result: Any) -> list[Message]:
    if isinstance(result, (Message, dict)):
        return [as_message(result)]
    if isinstance(result, (str, bytes)) or not isinstance(result, Iterable):
        return [as_message(result)]  # raises InvalidMessage naming the type
    return [as_message(m) for m in result]


def with_history(
    store: Store,
    model: Model | None = None,
    *,
    streamer: Streamer | None = None,
    window: _Window | None = None,
    serialize: bool = False,
    lease_ttl: float = 60,
) -> HistoryChat:
    """Wrap a model so each call replays the stored history and stores the exchange.

    ``await chat(conversation, new_messages)`` reads the history (through ``window``
    when given, e.g. a ``WindowStore``), calls ``model(history + new_messages)``, and
    writes ``new_messages + reply`` as one batch with ``at`` = the length the history
    was read at; it returns the reply as a list. ``chat.stream(...)`` does the same
    around ``streamer``, passing every event through. When the write fails,
    ``CommitError`` is raised with the exact batch; ``await error.retry(store)`` is
    safe to call any number of times.

    With ``serialize=True`` each call holds the conversation's turn lease
    (``store.lease``, ``lease_ttl`` seconds, renewed while the model runs) around the
    read, the model call and the write, so concurrent turns on one conversation queue
    instead of failing with ``CommitError``.
    """
    return HistoryChat(
        store, model, streamer=streamer, window=window, serialize=serialize, lease_ttl=lease_ttl
    )
