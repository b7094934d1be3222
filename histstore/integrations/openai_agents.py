"""An OpenAI Agents SDK ``Session`` that keeps its items in a histstore store.

::

    from agents import Agent, Runner
    from histstore.integrations.openai_agents import HiststoreSession

    async with HiststoreSession("user-42", "chat.db") as session:
        result = await Runner.run(agent, "Hello", session=session)

Each Responses input item (a dict with ``role`` or ``type``: messages, function calls
and their outputs, reasoning items) is stored as one histstore message, unchanged:
``get_items()`` returns dicts equal to those ``add_items()`` was given. The session id
is the conversation id, so the history is also readable through ``Store.read`` and the
rest of histstore (``histstore.turns`` understands these items).

Wrapped in the SDK's ``OpenAIResponsesCompactionSession``, a compaction replaces the
items in one transaction, recorded as one change by ``COMPACTION_AUTHOR`` that
``Store.revert`` undoes; a failure or a crash part way leaves the history as it was.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, cast

from histstore import Message, Store, validate_id

from . import StoreTarget, _missing_framework, _StoreAdapter, _StoreHandle

try:
    from agents.memory.session_settings import (
        SessionSettings,
        coerce_session_settings,
        resolve_session_limit,
    )
except ImportError as _exc:  # pragma: no cover - exercised in a subprocess by the tests
    raise _missing_framework("openai_agents", "openai-agents", _exc) from _exc

from . import _openai_compaction
from ._openai_compaction import COMPACTION_AUTHOR as _COMPACTION_AUTHOR

if TYPE_CHECKING:
    from agents.items import TResponseInputItem
    from agents.memory.session import _CompactionSnapshot

__all__ = ["COMPACTION_AUTHOR", "HiststoreSession"]

COMPACTION_AUTHOR = _COMPACTION_AUTHOR
"""The author of a compaction's change record and of the entries it stores."""


class WindowReader(Protocol):
    """Anything with a ``WindowStore``-like ``read``: the items a model should see."""

    async def read(self, conversation: str, /) -> list[Message]: ...


Window = WindowReader | Callable[[Store], WindowReader]
"""A ``WindowStore`` (or alike), or a function making one from the session's store."""


class HiststoreSession(_StoreAdapter):
    """A ``Session`` (the Agents SDK protocol) on a histstore conversation.

    Args:
        session_id: the conversation id (histstore's id rules apply).
        store: a ``Store`` (borrowed, never closed here) or anything
            ``histstore.connect()`` takes (owned: one store per event loop, opened on
            that loop's first use, released when the loop ends or by ``close()`` or
            ``async with``).
        window: when given, ``get_items()`` without a limit returns the window instead
            of the whole history: a ``histstore.WindowStore`` (or any object whose
            ``async read(conversation)`` returns messages), or a function that makes one
            from the session's store, e.g.
            ``lambda store: WindowStore(store, max_messages=50)`` (needed when the
            session owns its store).
        session_settings: the SDK's ``SessionSettings`` (or a dict of them); its
            ``limit`` is the default for ``get_items()``.

    ``get_items(limit=n)`` always returns the newest ``n`` stored items, reading only
    those, whatever the window: the SDK reads the tail this way to check its own writes.
    Without ``limit`` the default is ``session_settings.limit``, then the window, then
    the whole history. ``add_items`` stores a batch in one transaction, after whatever
    the conversation holds at that moment, so batches added concurrently never
    interleave.

    Wrapped in the SDK's ``OpenAIResponsesCompactionSession``, a compaction (automatic
    after a run, or ``run_compaction()``) is one ``store.commit`` of one splice by
    ``COMPACTION_AUTHOR``: never a clear and an add. It is one change record, so
    ``store.revert(session_id, revision_before, by=...)`` undoes it, and it is all or
    nothing. An automatic compaction whose history changed after the SDK read it (a
    write from another session or process) is skipped, the newer items kept.

    Raises:
        InvalidId: ``session_id`` breaks the id rules.
        TypeError, ValueError: ``store`` is not a store or a valid target.
    """

    session_id: str
    session_settings: SessionSettings | None

    def __init__(
        self,
        session_id: str,
        store: StoreTarget,
        *,
        window: Window | None = None,
        session_settings: SessionSettings | Mapping[str, Any] | None = None,
    ) -> None:
        self.session_id = validate_id(session_id)
        self._handle = _StoreHandle(store)
        if window is not None and not (hasattr(window, "read") or callable(window)):
            raise TypeError("window must be a WindowStore or a function Store -> WindowStore")
        self._window_arg = window
        self._window: WindowReader | None = None
        self.session_settings = (
            coerce_session_settings(dict(session_settings))
            if isinstance(session_settings, Mapping)
            else session_settings
        )

    def _reader(self, store: Store) -> WindowReader:
        if self._window is None:
            arg = self._window_arg
            if hasattr(arg, "read"):
                self._window = cast(WindowReader, arg)
            else:
                self._window = cast("Callable[[Store], WindowReader]", arg)(store)
        return self._window

    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        """The stored items, oldest first.

        Args:
            limit: return only the newest ``limit`` items (in chronological order);
                ``None``: ``session_settings.limit``, else the window, else everything.

        Raises:
            ValueError: a negative ``limit``.
            WindowTooSmall: the window's limits cannot hold the newest turn.
        """
        store = await self._store()
        limit = resolve_session_limit(limit, self.session_settings)
        if limit is None and self._window_arg is not None:
            messages = await self._reader(store).read(self.session_id)
        else:
            messages = await store.read(self.session_id, limit=limit)
        return cast("list[TResponseInputItem]", [m.to_dict() for m in messages])

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        """Append items, all of them or none, after whatever the session holds.

        Raises:
            InvalidMessage: an item is not a JSON object with a ``role`` or ``type``
                (nothing is written).
            WriteError: the database failed; see its ``outcome``.
        """
        if not items:
            return
        store = await self._store()
        await store.write(self.session_id, cast("Sequence[Mapping[str, Any]]", items))

    async def pop_item(self) -> TResponseInputItem | None:
        """Remove and return the newest item; ``None`` when the session is empty."""
        store = await self._store()
        message = await store.pop(self.session_id)
        return None if message is None else cast("TResponseInputItem", message.to_dict())

    async def clear_session(self) -> None:
        """Remove every item of the session (its whole histstore conversation)."""
        store = await self._store()
        await store.clear(self.session_id)

    # The SDK's compaction hooks, probed by OpenAIResponsesCompactionSession.

    def _stores_items_as_given(self) -> bool:
        """Whether the hooks may bypass ``get_items``/``add_items``: not when a subclass
        transforms items there (the SDK then clears and adds through them)."""
        cls = type(self)
        return (
            cls.get_items is HiststoreSession.get_items
            and cls.add_items is HiststoreSession.add_items
        )

    async def _get_compaction_snapshot(
        self,
        limit: int,
        *,
        prune_prefix: Callable[[TResponseInputItem], bool] | None = None,
    ) -> _CompactionSnapshot | None:
        """The newest ``limit`` items and a ``replace_suffix`` that commits one splice,
        refused (``False``) when the conversation changed since this read."""
        if not self._stores_items_as_given():
            return None
        store = await self._store()
        return await _openai_compaction.snapshot(store, self.session_id, limit, prune_prefix)

    async def _atomic_replace_items(self, items: list[TResponseInputItem]) -> bool:
        """Make ``items`` the whole history in one commit of one change.

        Raises:
            ConflictError: another writer changed the session meanwhile; nothing is
                written (call ``run_compaction()`` again).
        """
        if not self._stores_items_as_given():
            return False
        store = await self._store()
        await _openai_compaction.replace_all(store, self.session_id, items)
        return True

    def __repr__(self) -> str:
        return f"HiststoreSession({self.session_id!r})"
