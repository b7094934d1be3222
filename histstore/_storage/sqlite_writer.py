"""The SQLite writer: the one way a store's writes reach an SQLite file.

SQLite has one write lock per file. A store's writers take it in the writer's turn
(``turn``), first come first served, not in SQLite's busy handler (whose growing sleeps
can leave a free lock idle ~100 ms); other processes meet it at the lock, polled for up
to the busy timeout (``sqlite_driver``). Everything that writes holds the turn: a group
of programs, a ``transaction()``, Core writes, a single statement, the second step of a
checkpoint. Waiting longer than the busy timeout fails as SQLite's own wait would.

Programs (``submit``) are the common write, and the writer runs them with three
policies:

- Group commit. The programs of concurrent callers run together in one write
  transaction (one trip to the connection's thread, one COMMIT), each in its own
  savepoint, so what one program raises, or a ``Rollback`` it returns, undoes only its
  own statements; every caller gets exactly what its program alone would have given.
  A failure of the transaction itself (the write lock not taken, a failed COMMIT) is
  every member's failure, with the same ``phase`` as a transaction of its own. A
  program runs after the programs queued before it and sees what they wrote.
- The lone writer. A writer that finds nobody writing or waiting runs its program at
  once, in its own task; the writers that arrive meanwhile go together in the next
  group, run by a task of the writer (the leader). Unless the last group had several:
  writers that came together are likely to come back together (each woken by the same
  commit), so such a writer queues instead, and the leader, starting on the event
  loop's next turn, takes everyone who arrived in this one (16 tasks: two cohorts of
  about 8, one committing while the other prepares, not groups of 1 and 16 in turn).
  A lone writer's short program (an append of a few messages, on a store whose commits
  do not fsync) runs on the event loop's own thread when the same task wrote last
  (``SqliteDriver``'s ``inline``): an agent loop pays no trip to the connection's
  thread. Not while the WAL is estimated at half the size at which a commit checkpoints
  by itself (``engine.WAL_NET_PAGES``), so that such a checkpoint never runs on the loop.
- Background work. After each committed group the WAL checkpoints
  (``_storage.wal_checkpoints``) and the full-text index's scheduler
  (``search_index.IndexScheduler``) are told; an indexing run is a program of this
  queue like a writer's (``indexing=True``: it lists nothing), a chunk at a time, so
  writers' programs go between runs. Runs start from a writer's commit, never from a
  timer: work started from a timer may begin while ``asyncio.run`` shuts the loop down
  and be left unfinished.

States. The runner: ``idle`` (no program runs) and ``running`` (a lone writer's program
or the leader's groups; the queue may hold more). The lifecycle: ``open``, ``closing``
(background work stops starting; queued programs and the indexer's last runs still
run), ``closed`` (``submit`` raises). A move outside these tables raises
``states.InvalidTransition``.
"""

from __future__ import annotations

import asyncio
import weakref
from collections import deque
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from types import TracebackType
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar

from .completion import end_all, finish_then_cancel
from .dberrors import DATABASE_ERRORS, DatabaseFailure, failure, not_committed
from .drivers import Phase, Program, Rollback
from .engine import WAL_NET_PAGES
from .search_index import IndexScheduler
from .statement_groups import MAX_GROUP
from .states import transition
from .wal_checkpoints import WalCheckpoints
from .write_gate import WriteGate

__all__ = ["SqliteWriter"]

T = TypeVar("T")

if TYPE_CHECKING:  # runs programs in one transaction (``SqliteDriver.run_group``)
    RunGroup = Callable[[Any, list[Program[Any]], Phase, bool], Awaitable[list[tuple[bool, Any]]]]

# The moves each state machine allows (docs/architecture.md has them as tables).
_RUNNER: dict[str, tuple[str, ...]] = {"idle": ("running",), "running": ("idle",)}
_LIFECYCLE: dict[str, tuple[str, ...]] = {
    "open": ("closing",),
    "closing": ("closed",),
    "closed": (),
}


class _Member(Generic[T]):
    __slots__ = ("action", "conversation", "done", "indexing", "program", "started")

    def __init__(
        self,
        program: Program[T],
        action: str,
        conversation: str | None,
        done: asyncio.Future[T],
        indexing: bool,
    ) -> None:
        self.program = program
        self.action = action
        self.conversation = conversation
        self.done = done
        self.started = False
        self.indexing = indexing
        """A run of the indexer (which lists nothing)."""


class SqliteWriter:
    """A store's SQLite write turn, its queue of programs and their policies (module).

    ``connection()`` lends a driver connection; ``run_group(conn, programs, phase,
    inline)`` runs programs in one transaction and returns, per program, ``(True,
    value)`` or ``(False, exception)``; ``checkpoint(conn, truncate)`` checkpoints the
    WAL. ``busy_timeout_s``: the longest wait for the turn. ``inline``: a short program
    may run on the event loop's thread (the store's commits do not fsync).
    """

    def __init__(
        self,
        connection: Callable[[], AbstractAsyncContextManager[Any]],
        run_group: RunGroup,
        checkpoint: Callable[[Any, bool], Awaitable[tuple[int, int]]],
        *,
        busy_timeout_s: float,
        inline: bool = False,
    ) -> None:
        self._connection = connection
        self._run_group = run_group
        self._busy_timeout_s = busy_timeout_s
        self._inline = inline
        self._gate = WriteGate()
        self.checkpoints = WalCheckpoints(connection, self.turn, checkpoint)
        self.indexer: IndexScheduler | None = None
        """Told of each committed group's listing (set by the executor, when it indexes)."""
        self.runner: Literal["idle", "running"] = "idle"
        self.lifecycle: Literal["open", "closing", "closed"] = "open"
        self._queue: deque[_Member[Any]] = deque()
        # The leader's task; or, while a lone writer runs its own, a future that ends
        # with it (see ``_run_alone``).
        self._leader: asyncio.Future[None] | None = None
        self._last_writer: weakref.ref[asyncio.Task[Any]] | None = None
        self._last_size = 1  # programs of the last group
        self.sizes: deque[int] = deque(maxlen=256)
        """The sizes of the latest committed groups, oldest first (diagnostics)."""

    # ------------------------------------------------------------------ the turn

    def turn(self, action: str, conversation: str | None) -> _Turn:
        """Hold the write turn for an ``async with``; ``DatabaseFailure`` after waiting
        for the busy timeout."""
        return _Turn(self._gate, self._busy_timeout_s, action, conversation)

    @property
    def queued(self) -> int:
        """Programs waiting for a group."""
        return len(self._queue)

    @property
    def waiting_for_turn(self) -> int:
        """Writers queued for the turn (a group's leader, a transaction, a checkpoint)."""
        return self._gate.queued

    # ------------------------------------------------------------------ programs

    async def submit(
        self,
        program: Program[T],
        action: str,
        conversation: str | None,
        *,
        indexing: bool = False,
        short: bool = False,
    ) -> T:
        """Run ``program`` in the next transaction; return its value (or raise what it
        raised). A caller cancelled before its program started leaves nothing done; once
        started, the transaction ends first, then the caller sees ``CancelledError``.
        ``indexing``: the program indexes the pending list (and lists nothing);
        ``short``: it may run on the event loop's thread (see the module)."""
        if self.lifecycle == "closed":
            transition(self.lifecycle, "open", _LIFECYCLE, "writer")  # raises
        loop = asyncio.get_running_loop()
        member: _Member[T] = _Member(program, action, conversation, loop.create_future(), indexing)
        task = asyncio.current_task()
        again = task is not None and self._last_writer is not None and self._last_writer() is task
        self._last_writer = None if task is None else weakref.ref(task)
        if self._free() and not self._queue and self._last_size == 1:
            small = self.checkpoints.pages() < WAL_NET_PAGES // 2  # see the module
            return await self._run_alone(member, inline=short and again and self._inline and small)
        self._queue.append(member)
        if self._free():
            self._begin(asyncio.ensure_future(self._lead()))
        try:
            return await asyncio.shield(member.done)
        except asyncio.CancelledError:
            if not member.started:
                self._queue.remove(member)
                program.close()
            else:
                await finish_then_cancel(member.done)
            raise

    def _free(self) -> bool:
        """Whether no program runs (a leader cancelled before it began, at the loop's
        shutdown, has ended too)."""
        if self.runner == "running" and self._leader is not None and self._leader.done():
            self._end()
        return self.runner == "idle"

    def _begin(self, leader: asyncio.Future[None]) -> None:
        self.runner = transition(self.runner, "running", _RUNNER, "writer")
        self._leader = leader

    def _end(self) -> None:
        self.runner = transition(self.runner, "idle", _RUNNER, "writer")
        self._leader = None

    async def _run_alone(self, member: _Member[T], *, inline: bool) -> T:
        """Run the program of a writer that found nobody writing or waiting, in the
        writer's own task: a group of one, without a task to start and a result to
        hand over. Writers arriving meanwhile queue for the next group, whose leader
        starts when this one ends. A cancelled writer sees its ``CancelledError`` once
        the transaction has ended: the connection settles first (``lending``)."""
        running = asyncio.get_running_loop().create_future()
        self._begin(running)
        try:
            await self._run([member], inline)
        finally:
            running.set_result(None)
            self._end()
            if self._queue:
                self._begin(asyncio.ensure_future(self._lead()))
        return member.done.result()

    async def _lead(self) -> None:
        """Run the queued programs, up to ``MAX_GROUP`` a transaction, until none is left."""
        try:
            while self._queue:
                group = [self._queue.popleft() for _ in range(min(MAX_GROUP, len(self._queue)))]
                self._last_size = len(group)
                for member in group:
                    member.started = True
                try:
                    await self._run(group)
                except BaseException as exc:
                    end_all((member.done for member in group), exc)
                    if not isinstance(exc, Exception):
                        raise
        finally:
            self._end()

    async def _run(self, group: list[_Member[Any]], inline: bool = False) -> None:
        first = group[0]
        phase = Phase()
        async with self.turn(first.action, first.conversation):
            try:
                async with self._connection() as conn:
                    programs = [m.program for m in group]
                    outcomes = await self._run_group(conn, programs, phase, inline)
                phase.name = "done"
            except DATABASE_ERRORS as exc:
                name = "body" if phase.name == "commit" and not_committed(exc) else phase.name
                for member in group:
                    member.done.set_exception(_failure(member, exc, name))
                return
        self._committed(group, outcomes)
        for member, (ok, value) in zip(group, outcomes, strict=True):
            if not ok:
                member.done.set_exception(_as_failure(member, value))
            elif isinstance(value, Rollback):
                member.done.set_result(value.value)
            else:
                member.done.set_result(value)

    # ------------------------------------------------------------------ policies

    def _committed(self, group: list[_Member[Any]], outcomes: list[tuple[bool, Any]]) -> None:
        """Tell the background work of a committed group (see the module)."""
        self.sizes.append(len(group))
        if self.indexer is not None:
            listing, indexed = _listing(group, outcomes)
            if indexed:
                self.indexer.caught_up()
            if listing:
                self.indexer.listed()
        self.checkpoints.committed()

    def note_listed(self) -> None:
        """A write committed outside the groups (a transaction of the executor's own)
        listed messages for the index: counted as a group, indexed with the next run."""
        if self.indexer is not None:
            self.indexer.listed()
        self.checkpoints.committed(group=False)

    async def stop(self) -> None:
        """The store closes: start no background work; wait for the running programs
        and checkpoint (the indexer's last runs, ``IndexScheduler.close``, may follow).
        Again after a close that was cancelled: it goes on."""
        if self.lifecycle == "open":
            self.lifecycle = transition(self.lifecycle, "closing", _LIFECYCLE, "writer")
        self.checkpoints.stop()
        await self._settled()

    async def close(self) -> None:
        """After ``stop`` and the indexer's close: wait for what still runs."""
        await self._settled()
        self.lifecycle = transition(self.lifecycle, "closed", _LIFECYCLE, "writer")

    async def _settled(self) -> None:
        while running := [
            t for t in (self._leader, self.checkpoints.task) if t is not None and not t.done()
        ]:
            await asyncio.wait(running)


class _Turn:
    """``SqliteWriter.turn``: a context-manager class, not an async generator (see
    ``_storage.lending``: a store may close while its loop shuts down)."""

    __slots__ = ("_action", "_conversation", "_gate", "_held", "_timeout")

    def __init__(
        self, gate: WriteGate, timeout: float, action: str, conversation: str | None
    ) -> None:
        self._gate = gate
        self._timeout = timeout
        self._action = action
        self._conversation = conversation
        self._held = False

    async def __aenter__(self) -> None:
        if not await self._gate.take(self._timeout):
            c = self._conversation
            where = f" conversation {c!r}" if c is not None else ""
            raise DatabaseFailure(
                f"{self._action}{where} failed: database is locked (busy timeout: other"
                " writers of this store held it)"
            )
        self._held = True

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._held:
            self._held = False
            self._gate.release()


def _listing(group: list[_Member[Any]], outcomes: list[tuple[bool, Any]]) -> tuple[bool, bool]:
    """Whether a committed group may have listed messages for the index after its last
    run of the indexer that indexed the whole list, and whether it had such a run."""
    listing = indexed = False
    for member, (ok, value) in zip(group, outcomes, strict=True):
        if not member.indexing:
            listing = True
        elif ok and value is False:
            listing, indexed = False, True
    return listing, indexed


def _as_failure(member: _Member[Any], exc: BaseException) -> BaseException:
    """What a program's own failure becomes for its caller: a database error is the
    ``DatabaseFailure`` of a transaction that was rolled back; anything else (what the
    program raised) as it is."""
    return _failure(member, exc, "body") if isinstance(exc, DATABASE_ERRORS) else exc


def _failure(member: _Member[Any], exc: BaseException, phase: str) -> BaseException:
    error = failure(member.action, member.conversation, exc, phase)
    error.__cause__ = exc
    return error
