"""The SQLite writer's one write connection (``_storage.sqlite_writer``): opened by the
first job that needs it, kept for the store's life, lent to one job at a time.

Its states: ``none`` → ``lent`` (a job opens it) → ``held`` (the job ended well: kept)
→ ``lent`` (the next job) …; ``lent`` → ``none`` (the job raised, or the pool has no
connection to spare: given back through its lending, which settles or drops a connection
left mid-transaction, ``_storage.lending``); ``held`` → ``none`` (the store closes). Any
other move raises ``states.InvalidTransition``: two jobs on it at once, a close while a
job has it.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from types import TracebackType
from typing import Any, Literal

from .states import InvalidTransition, transition

__all__ = ["CONNECTION_MOVES", "WriteConnection"]

CONNECTION_MOVES: dict[str, tuple[str, ...]] = {
    "none": ("lent",),
    "lent": ("held", "none"),
    "held": ("lent", "none"),
}


class WriteConnection:
    """The write connection (see the module). ``connection()`` lends a driver
    connection from the pool; ``keep``: kept between jobs (else given back after each)."""

    __slots__ = ("_connection", "_held", "_keep", "state")

    def __init__(
        self, connection: Callable[[], AbstractAsyncContextManager[Any]], *, keep: bool
    ) -> None:
        self._connection = connection
        self._keep = keep
        self.state: Literal["none", "lent", "held"] = "none"
        # While open: its lending (to end) and the driver connection it lent.
        self._held: tuple[AbstractAsyncContextManager[Any], Any] | None = None

    @property
    def lending(self) -> AbstractAsyncContextManager[Any] | None:
        """The lending of the open connection (the executor's ``LentConnection``)."""
        return None if self._held is None else self._held[0]

    def lend(self) -> _Lent:
        """The driver connection for an ``async with``: kept after the block (``keep``),
        given back when the block raised."""
        return _Lent(self)

    async def _open(self) -> Any:
        self.state = transition(self.state, "lent", CONNECTION_MOVES, "write connection")
        if self._held is None:
            lending = self._connection()
            try:
                self._held = (lending, await lending.__aenter__())
            except BaseException:
                self.state = transition(self.state, "none", CONNECTION_MOVES, "write connection")
                raise
        return self._held[1]

    async def _release(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is None and self._keep:
            self.state = transition(self.state, "held", CONNECTION_MOVES, "write connection")
        else:
            await self._give_back(kind, exc, tb)

    async def _give_back(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.state = transition(self.state, "none", CONNECTION_MOVES, "write connection")
        held, self._held = self._held, None
        assert held is not None
        await held[0].__aexit__(kind, exc, tb)

    async def close(self) -> None:
        """Give the kept connection back (the writer closes: no job may have it)."""
        if self.state == "lent":
            raise InvalidTransition("write connection: closed while a job has it")
        if self.state == "held":
            await self._give_back(None, None, None)

    def abandon(self) -> AbstractAsyncContextManager[Any] | None:
        """Forget the connection without touching the event loop (it has closed): its
        lending, for the caller to end."""
        lending = self.lending
        self._held, self.state = None, "none"
        return lending


class _Lent:
    """``WriteConnection.lend`` (a class, not an async generator: see
    ``_storage.lending``)."""

    __slots__ = ("_owner",)

    def __init__(self, owner: WriteConnection) -> None:
        self._owner = owner

    async def __aenter__(self) -> Any:
        return await self._owner._open()  # noqa: SLF001 - the owner's own part

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._owner._release(kind, exc, tb)  # noqa: SLF001 - the owner's own part
