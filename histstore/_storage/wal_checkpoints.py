"""Background WAL checkpoints: a policy of the SQLite writer (``_storage.sqlite_writer``).

SQLite's own checkpoint (every 1,000 WAL pages, run by the commit that crosses the
mark) costs that one write a few milliseconds of copying and fsync. Here a task of the
store runs a ``PASSIVE`` checkpoint on a connection of its own, which neither waits for
nor blocks readers and writers; then, in the store's write turn, a second one copies
the few pages written meanwhile, so that the next write restarts the WAL from its
beginning. It runs when the writers pause (no commit for ``IDLE_S``) with at least
``IDLE_PAGES`` in the WAL, or, while writes go on without a pause, once the WAL reaches
``CHECKPOINT_PAGES``: on a 2-core machine a checkpoint beside the writers slows the
writes it overlaps, so it waits for the gaps agent traffic has (a model call between
two writes) when it can. The WAL's pages are estimated from the committed groups (and
the pages per group the last checkpoint measured). The connections' own automatic
checkpoint stays as a net, at a WAL of ``engine.WAL_NET_PAGES`` pages.

A reader holding a snapshot (a long export, an open iterator in a notebook) keeps a
checkpoint from copying what was written after the snapshot began, so the WAL grows
with every write meanwhile. A checkpoint that finds pages it could not copy looks again
later (after ``HELD_S``, doubling to ``HELD_MAX_S``) while the store is open, so that
when the reader has gone the WAL is copied whole even if no write comes. When that
WAL had outgrown ``engine.WAL_LIMIT_BYTES``, the write turn then truncates the file (a
``TRUNCATE`` checkpoint that waits for nobody); a write that restarts the WAL first
cuts it back to that size by itself (``journal_size_limit``).

States (``state``): ``idle`` (timers may be armed: a pause, a look again), ``running``
(one checkpoint pair), ``stopped`` (the store closes: nothing starts any more).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any, Literal

from .engine import WAL_LIMIT_BYTES
from .states import transition

__all__ = ["WalCheckpoints"]

CHECKPOINT_PAGES = 4000
"""WAL pages (about) at which a background checkpoint starts while writes go on."""

IDLE_PAGES = 256
"""WAL pages (about) worth a background checkpoint once the writers pause."""

IDLE_S = 0.01
"""Seconds without a commit that make a pause."""

FIRST_PAGES_PER_GROUP = 8.0
"""WAL pages a committed group is taken to add until a checkpoint measures it."""

HELD_S = 1.0
"""Seconds after a checkpoint that a reader held back before the next looks again."""

HELD_MAX_S = 30.0
"""The longest wait between two such checkpoints (the wait doubles while it is held)."""

TRUNCATE_PAGES = WAL_LIMIT_BYTES // 4096
"""WAL pages (of SQLite's default size) past which a WAL copied whole is truncated."""

MIN_PAGES_PER_GROUP = 1 / 16
"""The fewest WAL pages a group is taken to add, whatever a checkpoint measured (one
that met a WAL another process restarted meanwhile measures too few)."""

State = Literal["idle", "running", "stopped"]
_MOVES: dict[str, tuple[str, ...]] = {
    "idle": ("running", "stopped"),
    "running": ("idle", "stopped"),
    "stopped": (),
}


class WalCheckpoints:
    """When and how a store's WAL is checkpointed (see the module).

    ``connection()`` lends a driver connection; ``turn(action, conversation)`` holds the
    store's write turn; ``checkpoint(conn, truncate)`` returns the WAL's pages and how
    many are copied. The writer calls ``committed()`` after each committed group.
    """

    def __init__(
        self,
        connection: Callable[[], AbstractAsyncContextManager[Any]],
        turn: Callable[[str, str | None], AbstractAsyncContextManager[None]],
        checkpoint: Callable[[Any, bool], Awaitable[tuple[int, int]]],
    ) -> None:
        self._connection = connection
        self._turn = turn
        self._checkpoint = checkpoint
        self.state: State = "idle"
        self._groups = 0  # committed since the last checkpoint began
        self._per_group = FIRST_PAGES_PER_GROUP  # WAL pages a group adds, as measured
        self._last_commit = 0.0  # the loop's time of the latest commit
        self._pause: asyncio.TimerHandle | None = None  # looks for a pause, when armed
        self._held: asyncio.TimerHandle | None = None  # looks again after a held one
        self._held_s = HELD_S  # the wait before that look
        self.task: asyncio.Task[None] | None = None
        """The running checkpoint pair, if any."""

    @property
    def armed(self) -> bool:
        """Whether a timer will look for a checkpoint (a pause, or a look again)."""
        return self._pause is not None or self._held is not None

    def pages(self) -> float:
        """The WAL's pages since the last checkpoint, as estimated."""
        return self._groups * self._per_group

    def committed(self, *, group: bool = True) -> None:
        """A group committed (``group=False``: another write): start a checkpoint when
        the WAL is large, or look for the next pause when it holds enough to copy."""
        loop = asyncio.get_running_loop()
        if group:
            self._groups += 1
            self._last_commit = loop.time()
        if self.state != "idle":
            return
        pages = self.pages()
        if pages >= CHECKPOINT_PAGES:
            self._start()
        elif pages >= IDLE_PAGES and self._pause is None:
            self._pause = loop.call_later(IDLE_S, self._on_pause)

    def stop(self) -> None:
        """Start nothing any more (the running pair, ``task``, ends by itself)."""
        self._disarm()
        if self.state != "stopped":
            self.state = transition(self.state, "stopped", _MOVES, "checkpoints")

    def _disarm(self) -> None:
        for timer in (self._pause, self._held):
            if timer is not None:
                timer.cancel()
        self._pause = self._held = None

    def _on_pause(self) -> None:
        """A checkpoint when no commit came for ``IDLE_S``, else look again when that
        much time has passed since the last."""
        self._pause = None
        if self.state != "idle" or not self._groups:
            return
        loop = asyncio.get_running_loop()
        quiet = loop.time() - self._last_commit
        if quiet < IDLE_S:
            self._pause = loop.call_later(IDLE_S - quiet, self._on_pause)
        else:
            self._start()

    def _on_held(self) -> None:
        self._held = None
        if self.state == "idle":
            self._start()

    def _start(self) -> None:
        self._disarm()
        self.state = transition(self.state, "running", _MOVES, "checkpoints")
        groups, self._groups = self._groups, 0
        self.task = asyncio.ensure_future(self._run(groups))

    async def _run(self, groups: int) -> None:
        """A ``PASSIVE`` checkpoint after ``groups`` committed groups, and what a group
        adds to the WAL, measured; a failure is left to the connections' own net."""
        try:
            async with self._connection() as conn:
                # The WAL's pages: what was written since the last checkpoint, which
                # left it copied whole, so that the next write restarted it.
                grown, _ = await self._checkpoint(conn, False)
                # What the writers added meanwhile, in their turn: with the WAL then
                # copied whole, the next write starts it from its beginning again (a
                # WAL that only grows makes every commit's fsync write the file's size
                # too, and readers search a longer index).
                async with self._turn("checkpoint", None):
                    pages, copied = await self._checkpoint(conn, False)
                    if copied == pages > TRUNCATE_PAGES:
                        pages, copied = await self._checkpoint(conn, True)
        except Exception:  # noqa: BLE001 - best effort: SQLite checkpoints by itself too
            return
        finally:
            self.task = None
            if self.state == "running":
                self.state = transition(self.state, "idle", _MOVES, "checkpoints")
        if copied < pages:
            self._look_again()  # a reader holds part of the WAL (see the module)
        else:
            self._held_s = HELD_S
        if grown > 0 and groups > 0:
            self._per_group = max(grown / groups, MIN_PAGES_PER_GROUP)

    def _look_again(self) -> None:
        """Arm the next checkpoint after one a reader held back (see the module)."""
        if self.state != "idle" or self._held is not None:
            return
        loop = asyncio.get_running_loop()
        self._held = loop.call_later(self._held_s, self._on_held)
        self._held_s = min(self._held_s * 2, HELD_MAX_S)
