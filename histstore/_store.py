"""The Store: a thin facade over the parts that keep a conversation (see ``_ops.history``,
``_ops.state``, ``_ops.lists``, ``_ops.listing``), all running through one executor."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from contextlib import AbstractAsyncContextManager
from datetime import timedelta
from typing import Any, TypeVar

from sqlalchemy.ext.asyncio import AsyncEngine

from ._core.ids import validate_id
from ._core.models import ConversationState, Message, MessageLike, WriteOutcome
from ._core.search_text import Hit
from ._ops.context import Context, Shared, StoreSettings
from ._ops.editing import Editing
from ._ops.history import History
from ._ops.leases import Lease, Leases
from ._ops.listing import Listing, Order
from ._ops.lists import Lists
from ._ops.state import State
from ._ops.state_calls import StateCalls
from ._ops.text_search import TextSearch
from ._storage.calls import Calls, span_calls, span_methods
from ._storage.diagnostics import Diagnostics
from ._store_edits import EditableCalls

__all__ = ["Store", "StoreSettings", "store_call", "store_calls"]

T = TypeVar("T")


class Store(EditableCalls, StateCalls):
    """Conversation history and state in one SQL database.

    Made by ``histstore.connect()``. Every method is a coroutine, validates its arguments
    before touching the database, and raises only ``HistStoreError`` subclasses (plus
    ``TypeError``/``ValueError`` for arguments of the wrong kind). A store made from a URL
    or path owns its engine and disposes it on ``close()``; one made from an ``AsyncEngine``
    borrows it. A store belongs to the event loop it was opened on: a call from another loop
    raises ``HistStoreError`` (one store per loop). After ``close()`` every call, on the
    store or on any of its views, raises ``HistStoreError``.

    ``internals`` is not API: the store's internal context (``_ops.context.Context``),
    the one way histstore's modules outside the facade reach its executor and
    statements; ``diagnostics()`` is what tests and monitoring read instead.
    """

    def __init__(
        self,
        engine: AsyncEngine,
        *,
        owns_engine: bool,
        settings: StoreSettings,
        owner: str | None = None,
        shared: Shared | None = None,
    ) -> None:
        self._engine = engine
        self._owns_engine = owns_engine
        self._settings = settings
        self._owner = owner
        self._is_view = shared is not None
        if shared is None:
            shared = Shared(settings.executor(engine), reuse_compiled=owns_engine)
        self._shared = shared
        self._executor = shared.executor
        ctx = self.internals = Context(shared, settings, owner)
        self._history = History(ctx)
        self._state = State(ctx)
        self._lists = Lists(ctx)
        self._listing = Listing(ctx)
        self._leases = Leases(ctx, self._history)
        self._search = TextSearch(ctx)
        self._editing = Editing(ctx)

    # ------------------------------------------------------------------ basics

    @property
    def engine(self) -> AsyncEngine:
        """The SQLAlchemy engine the store runs on; with ``connect(schema=...)``, set to
        put histstore's tables in that schema (it shares the connection pool)."""
        return self._executor.engine

    @property
    def schema(self) -> str | None:
        """The PostgreSQL schema holding the store's tables (``None``: the default)."""
        return self._settings.schema

    @property
    def user(self) -> str | None:
        """The owner a scoped view is confined to; ``None`` for the whole store."""
        return self._owner

    @property
    def count_tokens(self) -> Callable[[Message], int] | None:
        """The token counter given to ``connect()``, or ``None``."""
        return self._settings.count_tokens

    @property
    def max_message_bytes(self) -> int:
        """The largest message the store takes, in bytes of UTF-8 JSON."""
        return self._settings.max_message_bytes

    def diagnostics(self) -> Diagnostics:
        """What the store's connections, SQLite writer and background work do now."""
        return self._executor.diagnostics()

    @property
    def closed(self) -> bool:
        """Whether the store (or, for a view, the store it belongs to) is closed:
        ``close()`` has ended (while it waits for calls, new ones are already refused)."""
        return self._executor.closed

    def scoped(self, user: str) -> Store:
        """A view of the store confined to the conversations ``user`` owns.

        Conversations the view creates are owned by ``user``; a conversation owned by
        someone else, or by no one, behaves through the view as if it did not exist.
        The view shares the store's engine and connections; closing the view does
        nothing, closing the store closes its views too.

        Raises:
            InvalidId: ``user`` breaks the id rules.
            ValueError: this store is already a view of another user.
            HistStoreError: the store is closed.
        """
        validate_id(user, what="user")
        if self._owner is not None and self._owner != user:
            raise ValueError("a scoped view cannot be re-scoped to another user")
        self._executor.check()
        return Store(
            self._engine,
            owns_engine=False,
            settings=self._settings,
            owner=user,
            shared=self._shared,
        )

    async def close(self) -> None:
        """Release the store; disposes the engine when the store owns it. Idempotent.

        Closing a store (not a view) first waits for the calls it took before
        ``close()`` began, on the store and its views: each ends as it would have
        without the close (a write is stored, or fails for its own reason). A call begun
        once ``close()`` has begun raises ``HistStoreError`` ("the store is closed"), as
        every call after it does. Then every connection the store kept goes back to the
        pool. Cancelling ``close()`` stops the wait; a later ``close()`` goes on.

        Raises:
            HistStoreError: called from inside one of the store's own calls or
                transactions (code the store awaits meanwhile), which it would wait for
                forever: nothing is closed, the call goes on and ends as it would
                (committed, or rolled back when it raises); close after it.
        """
        if not self._is_view:
            await self._executor.close(dispose=self._owns_engine)

    async def __aenter__(self) -> Store:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __repr__(self) -> str:
        url = self._engine.url.render_as_string(hide_password=True)
        scope = "" if self._owner is None else f", user={self._owner!r}"
        return f"<histstore.Store {url}{scope}>"

    def lease(
        self, conversation: str, *, ttl: float = 60, wait: bool = True
    ) -> AbstractAsyncContextManager[Lease]:
        """Hold ``conversation`` for one holder, across tasks and processes (a turn lease).

        ``async with store.lease(c) as lease:`` waits until no one else holds ``c`` (with
        ``wait=False`` it raises ``ConflictError`` instead), then holds it until the block
        ends, also by an exception. A lease expires ``ttl`` seconds after it was taken or
        last renewed (``await lease.renew()``), whether or not its holder still runs, so
        a dead holder blocks others for at most ``ttl``; a holder whose lease expired
        never releases its successor's. Expiry is by the database's clock. Leasing
        needs no conversation to exist and writes nothing to it; through a scoped view,
        an id owned by someone else is ``NotFound``.

        Raises:
            InvalidId: bad conversation id.
            ValueError: ``ttl`` is not a positive number of seconds.
            ConflictError: ``wait=False`` and another holder has it; from
                ``lease.renew()``, the lease was lost.
        """
        return self._leases.lease(conversation, ttl, wait)

    async def status(self, conversation: str) -> str:
        """``"stepping"`` while someone holds a lease on the conversation, else
        ``turns.status`` of its newest turn (``"empty"``, ``"open"``, ``"closed"`` or
        ``"interrupted"``). Reads only the newest turn."""
        return await self._leases.status(conversation)

    async def system_messages(self, conversation: str) -> list[Message]:
        """Every system message of the conversation, in order, found by index (without
        reading the rest of the history); ``[]`` when it is unknown."""
        return await self._history.read_system(conversation)

    async def read(
        self,
        conversation: str,
        *,
        limit: int | None = None,
        start: int = 0,
        stop: int | None = None,
    ) -> list[Message]:
        """The messages at positions ``start <= position < stop``, newest ``limit`` of them.

        In stored order, as fresh values. ``read(c, limit=50)`` is the latest page and
        ``read(c, stop=page[0].position, limit=50)`` the one before. Costs O(returned),
        whatever the conversation's length. An unknown conversation gives ``[]``.

        Raises:
            InvalidId: bad conversation id.
            ValueError: a negative ``limit``, ``start`` or ``stop``.
        """
        return await self._history.read(conversation, limit, start, stop)

    def stream(
        self,
        conversation: str,
        *,
        start: int = 0,
        stop: int | None = None,
        page: int = 1000,
    ) -> AsyncIterator[Message]:
        """The messages at positions ``start <= position < stop``, oldest first, as an
        async iterator that reads ``page`` of them at a time: ``async for m in
        store.stream(c): ...`` holds one page in memory however long the conversation.

        Each page is one read of its own (by position, after the previous page), so a
        long iteration holds no transaction or snapshot open between pages. Without a
        ``stop``, the iteration ends at the length the conversation had when it began:
        messages appended after that are not included (stream again from the last
        position + 1 for them). A page reflects the conversation as it is when read:
        a ``pop``, ``clear`` or edit during the iteration ends it early when the
        conversation got shorter, and an edit that moves messages may make one be
        skipped or seen twice; ``read()`` is one consistent read. An unknown
        conversation (or, through a scoped view, another user's) yields nothing.

        The arguments are checked when ``stream`` is called; the database is read (and a
        closed store raises ``HistStoreError``) when the iteration starts.

        Raises:
            InvalidId: bad conversation id.
            TypeError, ValueError: ``start`` or ``stop`` is not a non-negative int, or
                ``page`` not a positive one.
        """
        return self._history.stream(conversation, start, stop, page)

    async def count(self, conversation: str) -> int:
        """How many messages the conversation holds; 0 when it is unknown."""
        return await self._history.count(conversation)

    async def exists(self, conversation: str) -> bool:
        """Whether the conversation exists (and, for a view, is the user's)."""
        return await self._history.exists(conversation)

    async def write(
        self,
        conversation: str,
        messages: Iterable[MessageLike],
        *,
        at: int | None = None,
        idempotency_key: str | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> WriteOutcome:
        """Append a batch of messages, in one transaction: all of them or none.

        Creates the conversation when it does not exist.

        Args:
            conversation: the conversation id.
            messages: ``Message`` values or message dicts, stored in this order.
            at: where the batch's first message belongs. ``None`` appends after whatever
                is stored. With ``at=k``, fewer than ``k`` stored messages is a gap
                (``ConflictError``); stored messages from ``k`` on must equal the start
                of the batch (they are confirmed, not written again), else
                ``ConflictError``; the rest is appended. So ``at=count`` read earlier is
                an optimistic check, and a retry with the same ``at`` never duplicates.
            idempotency_key: when a batch was already stored in this conversation
                under this key, nothing is written and the whole batch is confirmed;
                a different batch under a used key is a ``ConflictError``.
            metadata: keys merged into the conversation's metadata as ``merge_metadata``
                does (a ``None`` value removes its key), in the write's transaction: the
                messages and the metadata are stored together or not at all. A write
                that only confirms a batch stored before (under its key, or all of it
                at ``at``) commits nothing, so it merges nothing either.

        Returns:
            ``WriteOutcome(accepted=len(batch), uncertain=False, length=...)``.

        Raises:
            InvalidId: bad conversation id or idempotency key.
            InvalidMessage: a message is not storable, over ``max_message_bytes``, or
                the batch is over ``max_batch``; a ``metadata`` key breaks the id rules
                or a value has no JSON form. Nothing is written.
            TypeError: ``metadata`` is not a mapping.
            ConflictError: see ``at`` and ``idempotency_key``. Nothing is written.
            NotFound: through a scoped view, the id belongs to another user.
            WriteError: the database failed. ``.outcome`` says what is known;
                ``.idempotency_key`` makes writing the same batch again safe. When the
                commit's fate was unknown and the database could be reached again,
                the store found out itself: stored means this returns normally; not
                stored (``accepted=0, uncertain=False``) stays true, as the store
                claimed the key so that the lost write can never commit later.
        """
        return await self._history.write(conversation, messages, at, idempotency_key, metadata)

    async def search(
        self, query: str, *, conversation: str | None = None, limit: int = 10
    ) -> list[Hit]:
        """Messages whose text holds every word and ``"quoted phrase"`` of ``query``,
        best match first (a higher ``Hit.score``; ties by conversation and position).

        What counts as a message's text is ``histstore.indexed_text``. Words match whole,
        case-insensitively, without stemming; a phrase matches its words in order. The
        query is only ever matched as text, never as the database's query language.
        Served by the full-text index (FTS5, ``tsvector`` with GIN) and its pending list,
        changed in the same transaction as the messages: a search finds every write that
        returned before it. A view searches only its user's conversations and threads.

        Args:
            query: words and quoted phrases.
            conversation: search only this conversation (without it, LangGraph threads'
                messages are found too, ranked with the rest: ``Hit.thread``).
            limit: at most this many hits.

        Raises:
            InvalidMessage: the query is empty, only whitespace, or has an unclosed quote.
            InvalidId: bad conversation id.
            TypeError, ValueError: ``limit`` is not an int or is negative.
        """
        return await self._search.search(query, conversation, limit)

    async def pop(self, conversation: str) -> Message | None:
        """Remove and return the newest message; ``None`` when there is none."""
        return await self._history.pop(conversation)

    async def clear(self, conversation: str) -> None:
        """Remove the conversation and everything it holds. Idempotent."""
        await self._history.clear(conversation)

    async def load(self, conversation: str) -> ConversationState:
        """Everything the conversation holds but its lists, read in one transaction.

        Raises:
            NotFound: the conversation does not exist (or is not this view's).
        """
        return await self._state.load(conversation)

    async def save(self, state: ConversationState) -> None:
        """Replace the whole conversation with ``state``, in one transaction.

        Messages (renumbered from 0, keeping their ``created_at`` when they have one),
        summaries, metadata (``None``: none), owner and system prompt are replaced;
        named lists are left as they are, and so are the conversation's creation time
        when it exists. ``state.token_count`` is not stored: counts are recorded per
        message by ``connect(count_tokens=...)``. Through a scoped view the conversation
        is owned by the view's user, whatever ``state.user`` says. Meant for seeding and
        administration, not hot paths: it costs O(size of the conversation).

        Raises:
            NotFound: through a view, the id belongs to a conversation it may not see.
        """
        await self._state.save(state)

    async def fork(self, source: str, target: str, *, upto: int | None = None) -> None:
        """Make ``target`` a copy of ``source`` (or of its first ``upto`` messages).

        Copies the messages (positions and times kept), the summaries that end before
        ``upto``, metadata, named lists, owner and system prompt, in one transaction.
        An ``upto`` past the end copies everything. Forking a prefix and going on with
        the new id is how a conversation is reverted.

        Raises:
            NotFound: ``source`` does not exist (or is not this view's), or, through a
                view, ``target`` belongs to a conversation it may not see.
            ConflictError: ``target`` exists.
        """
        await self._state.fork(source, target, upto)

    async def purge(self, *, idle_for: timedelta) -> int:
        """Delete the conversations not changed for longer than ``idle_for``.

        Every change counts: messages, summaries, metadata, lists. Works in batches of
        conversations, each in its own transaction; returns how many were deleted. A
        batch costs what it deletes, plus on SQLite the full-text index's merging of
        its segments, a log factor in the index's size (docs/search.md).
        """
        return await self._listing.purge(idle_for)

    async def conversations(
        self,
        *,
        user: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        limit: int | None = None,
        offset: int = 0,
        order: Order = "id",
        descending: bool = False,
    ) -> list[str]:
        """Conversation ids, filtered, ordered and paged.

        Args:
            user: keep only conversations this user owns.
            metadata: keep those whose metadata holds every given key with an equal
                value (compared as JSON with object keys in any order; ``1`` and ``1.0``
                differ). A ``None`` value keeps those that do not have the key.
            limit, offset: a page of the result.
            order: ``"id"`` (code-point order, as ``sorted``), ``"created"`` or
                ``"updated"``; ties are broken by id. ``descending`` reverses the whole
                order.

        Every filter and order is served by an index: a page costs O(limit + offset)
        when the filters match most conversations.
        """
        return await self._listing.conversations(
            user=user,
            metadata=metadata,
            limit=limit,
            offset=offset,
            order=order,
            descending=descending,
        )


def store_calls(store: Store) -> Calls:
    """The calls in progress of ``store`` (``_storage.calls``): what a span counts in."""
    return store.internals.executor.calls


store_call = span_calls(store_calls)
"""Make a coroutine function whose first argument is a store one call of that store."""


# Each public coroutine method is one call for ``close()`` from its first line to its
# end: the steps of a call that close() found running (a settling read after a lost
# commit, an edit's reads and its commit) are not refused half way.
span_methods(Store, store_calls, but=("close",))
