"""Turn leases: one holder per conversation id for a turn, across tasks and processes.

A lease is a row (``histstore_leases``) naming its holder and when it expires by the
database's clock. Taking one is one upsert that succeeds only when the row is free or
expired, so two holders never both hold it and a dead holder blocks for at most ``ttl``
seconds. Release and renewal name the holder: a holder whose lease expired can neither
renew it nor release its successor's. Waiters in this process are woken by a release;
others poll, no longer than until the current lease expires.
"""

from __future__ import annotations

import asyncio
import math
import uuid
from contextlib import AbstractAsyncContextManager, suppress
from types import TracebackType

from .._core.ids import validate_id
from .._errors import ConflictError, HistStoreError
from .._storage.drivers import EXECUTE, FETCH, Program
from . import turn_status as _turn_status
from .context import Context, not_found
from .history import History

__all__ = ["Lease", "Leases"]

_FIRST_POLL = 0.005
_MAX_POLL = 0.05


class _Queue:
    """This process's waiters for one conversation's lease, in arrival order."""

    def __init__(self) -> None:
        self.turn = asyncio.Lock()
        self.waiting = 0


class Lease:
    """A conversation held for one turn (see ``Store.lease``)."""

    def __init__(self, leases: Leases, conversation: str, holder: str, ttl: float) -> None:
        self._leases = leases
        self.conversation = conversation
        self.holder = holder
        """An opaque token naming this holder."""
        self.ttl = ttl
        self.released = False

    async def renew(self) -> None:
        """Extend the lease by ``ttl`` seconds from now.

        Raises:
            ConflictError: the lease expired (another holder may have it) or was released.
        """
        if self.released or not await self._leases.renew(self):
            raise ConflictError(f"the lease on conversation {self.conversation!r} was lost")

    async def release(self) -> None:
        """Give the lease up (nothing when it expired and another holder has it). Idempotent."""
        if not self.released:
            self.released = True
            await self._leases.release(self)

    def __repr__(self) -> str:
        return f"<Lease {self.conversation!r} holder={self.holder} ttl={self.ttl}>"


class _Taking(AbstractAsyncContextManager[Lease]):
    def __init__(self, leases: Leases, conversation: str, ttl: float, wait: bool) -> None:
        self._args = (leases, conversation, ttl, wait)
        self._lease: Lease | None = None

    async def __aenter__(self) -> Lease:
        leases, conversation, ttl, wait = self._args
        self._lease = await leases.take(conversation, ttl, wait)
        return self._lease

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        lease, self._lease = self._lease, None
        if lease is None:
            return
        if exc is None:
            await lease.release()
            return
        with suppress(HistStoreError):  # leaving by an exception: that is the news
            await lease.release()


class Leases:
    """The lease calls of a store (see ``Store.lease``)."""

    def __init__(self, ctx: Context, history: History) -> None:
        self._ctx = ctx
        self._history = history

    def lease(self, conversation: str, ttl: float, wait: bool) -> _Taking:
        validate_id(conversation)
        if (
            not isinstance(ttl, (int, float))
            or isinstance(ttl, bool)
            or not math.isfinite(ttl)
            or ttl <= 0
        ):
            raise ValueError("ttl must be a positive number of seconds")
        return _Taking(self, conversation, float(ttl), bool(wait))

    async def take(self, conversation: str, ttl: float, wait: bool) -> Lease:
        ctx = self._ctx
        holder = uuid.uuid4().hex
        poll = _FIRST_POLL

        def program() -> Program[float | None]:
            if ctx.owner is not None:
                taken = yield FETCH, ctx.sql.taken, {"c": conversation}
                if taken and taken[0][0] != ctx.owner:
                    raise not_found(conversation)
            params = {"c": conversation, "holder": holder, "ttl": ttl}
            if (yield FETCH, ctx.sql.take_lease, params):
                return None
            left = yield FETCH, ctx.sql.lease_left, {"c": conversation}
            return float(left[0][0]) if left else 0.0

        # This process's waiters for one conversation queue first come, first served:
        # only the first of them asks the database, so a release is not raced for by
        # every local waiter (and others' waiters, polling, are not always outrun).
        queue = ctx.shared.lease_queues.get(conversation)
        if queue is None:
            queue = ctx.shared.lease_queues[conversation] = _Queue()
        queue.waiting += 1
        try:
            async with queue.turn:
                while True:
                    left = await ctx.executor.write(
                        program(), action="lease", conversation=conversation
                    )
                    if left is None:
                        return Lease(self, conversation, holder, ttl)
                    if not wait:
                        raise ConflictError(
                            f"conversation {conversation!r} is leased by another holder"
                        )
                    event = ctx.shared.lease_released.setdefault(conversation, asyncio.Event())
                    try:
                        await asyncio.wait_for(event.wait(), min(poll, max(left, 0.001)))
                    except TimeoutError:
                        poll = min(poll * 2, _MAX_POLL)
        finally:
            queue.waiting -= 1
            if not queue.waiting:
                ctx.shared.lease_queues.pop(conversation, None)

    async def renew(self, lease: Lease) -> bool:
        ctx = self._ctx

        def program() -> Program[bool]:
            params = {"c": lease.conversation, "holder": lease.holder, "ttl": lease.ttl}
            return bool((yield FETCH, ctx.sql.renew_lease, params))

        return await ctx.executor.write(
            program(), action="renew lease", conversation=lease.conversation
        )

    async def release(self, lease: Lease) -> None:
        ctx = self._ctx

        def program() -> Program[bool]:
            params = {"c": lease.conversation, "holder": lease.holder}
            yield EXECUTE, ctx.sql.release_lease, params
            return True

        try:
            await ctx.executor.write(
                program(), action="release lease", conversation=lease.conversation
            )
        finally:
            event = ctx.shared.lease_released.pop(lease.conversation, None)
            if event is not None:
                event.set()

    async def status(self, conversation: str) -> str:
        validate_id(conversation)
        ctx = self._ctx
        if ctx.owner is not None and not await self._history.exists(conversation):
            return "empty"
        left = await ctx.executor.fetch(
            ctx.sql.lease_left, {"c": conversation}, action="status", conversation=conversation
        )
        if left:
            return "stepping"
        return await _turn_status.newest_turn_status(self._history, conversation)
