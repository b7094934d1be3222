"""The SQLite writer: the one way a store's writes reach an SQLite file.

SQLite has one write lock per file. A store's writers take it in the order they came,
through one FIFO queue of *jobs* here, not in SQLite's busy handler (whose growing
sleeps can leave a free lock idle ~100 ms); other processes meet it at the lock, polled
for up to the busy timeout (``sqlite_driver``). A job is either

- a program (``submit``), the common write, run by the writer in a group, or
- a turn (``turn``): the whole write side held for its caller's own work, a
  ``transaction()`` of several programs (import, copy), Core writes, a single
  statement, the second step of a background checkpoint.

A job that waits in the queue longer than the busy timeout fails as SQLite's own wait
would (``DatabaseFailure``, "database is locked"), leaving the queue; one cancelled
while it waits leaves the queue with nothing done.

Programs run with three policies:

- Group commit. The programs queued together (up to ``MAX_GROUP``, up to the next turn
  in the queue) run in one write transaction (one trip to the connection's thread, one
  COMMIT), each in its own savepoint, so what one program raises, or a ``Rollback`` it
  returns, undoes only its own statements; every caller gets exactly what its program
  alone would have given. A failure of the transaction itself (the write lock not
  taken, a failed COMMIT) is every member's failure, with the same ``phase`` as a
  transaction of its own. A job runs after the jobs queued before it and sees what
  they wrote.
- The lone writer. A job that finds nothing running or queued runs at once, in its
  caller's own task; the jobs arriving meanwhile queue for the leader, a task of the
  writer started when it ends. After a group of several a program queues instead:
  writers woken by one commit come back together, and the leader, starting on the
  loop's next turn, takes them all (16 tasks: two cohorts of about 8, not groups of 1
  and 16 in turn). A lone writer's short program (a few messages, commits without
  fsync) runs on the event loop's own thread when the same task wrote last
  (``SqliteDriver``'s ``inline``), unless the WAL is estimated at half the size at
  which a commit checkpoints by itself (``engine.WAL_NET_PAGES``).
- Background work. After each committed group the WAL checkpoints
  (``_storage.wal_checkpoints``) and the full-text index's scheduler
  (``search_index.IndexScheduler``) are told; an indexing run is a program of this
  queue (``indexing=True``: it lists nothing), a chunk at a time. Runs start from a
  commit, never from a timer (which may fire while ``asyncio.run`` shuts the loop down).

States. The runner: ``idle`` (no job runs) and ``running`` (a lone job, or the
leader's jobs; the queue may hold more). The lifecycle: ``open``, ``closing``
(background work stops starting; queued jobs and the indexer's last runs still run),
``closed`` (a new job is refused as the closed store refuses calls). A job:
``queued``, ``started``, ``gone`` (``write_jobs``). The write connection: ``none``,
``lent``, ``held`` (``write_connection``); only the running job may have it. A move
outside these tables raises ``states.InvalidTransition``.
"""

from __future__ import annotations

import asyncio
import weakref
from collections import deque
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from .._errors import HistStoreError
from .completion import end_all, finish_then_cancel
from .dberrors import DATABASE_ERRORS, not_committed
from .drivers import Phase, Program, Rollback
from .engine import WAL_NET_PAGES
from .search_index import IndexScheduler
from .statement_groups import take_group
from .states import InvalidTransition, transition
from .wal_checkpoints import WalCheckpoints
from .write_connection import WriteConnection
from .write_jobs import Job, as_failure, failure_of, lists_for_index, locked, programs_only

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


class SqliteWriter:
    """A store's SQLite write queue, its jobs and their policies (module).

    ``connection()`` lends a driver connection (the writer keeps one for its jobs,
    ``lend``; a checkpoint's first step takes another); ``run_group(conn, programs, phase,
    inline)`` runs programs in one transaction and returns, per program, ``(True,
    value)`` or ``(False, exception)``; ``checkpoint(conn, truncate)`` checkpoints the
    WAL. ``busy_timeout_s``: the longest wait of a job in the queue. ``inline``: a short
    program may run on the event loop's thread (the store's commits do not fsync).
    ``keep``: the write connection is kept between jobs (else given back after each:
    a pool with no connection to spare).
    """

    def __init__(
        self,
        connection: Callable[[], AbstractAsyncContextManager[Any]],
        run_group: RunGroup,
        checkpoint: Callable[[Any, bool], Awaitable[tuple[int, int]]],
        *,
        busy_timeout_s: float,
        inline: bool = False,
        keep: bool = True,
    ) -> None:
        self.connection = WriteConnection(connection, keep=keep)
        """The write connection (``_storage.write_connection``)."""
        self._run_group = run_group
        self._busy_timeout_s = busy_timeout_s
        self._inline = inline
        self.checkpoints = WalCheckpoints(connection, self.turn, checkpoint)
        self.indexer: IndexScheduler | None = None
        """Told of each committed group's listing (set by the executor, when it indexes)."""
        self.runner: Literal["idle", "running"] = "idle"
        self.lifecycle: Literal["open", "closing", "closed"] = "open"
        self._queue: deque[Job[Any]] = deque()
        # The leader's task; or, while a lone job runs in its caller's task, a future
        # that ends with it.
        self._leader: asyncio.Future[None] | None = None
        self._last_writer: weakref.ref[asyncio.Task[Any]] | None = None
        self._last_size = 1  # programs of the last group
        self.sizes: deque[int] = deque(maxlen=256)
        """The sizes of the latest committed groups, oldest first (diagnostics)."""

    # ------------------------------------------------------------------ the queue

    def turn(self, action: str, conversation: str | None) -> _Turn:
        """Hold the whole write side for an ``async with`` (a job of the queue);
        ``DatabaseFailure`` after waiting for the busy timeout."""
        return _Turn(self, action, conversation)

    def lend(self) -> AbstractAsyncContextManager[Any]:
        """The write connection, for an ``async with`` by the running job (a group, or
        the holder of a turn): kept after the block (``keep``), given back when the
        block raised (``lending``: settled after a cancellation, dropped when its state
        is unknown). ``InvalidTransition`` when no job runs."""
        if self.runner != "running" or self.lifecycle == "closed":
            raise InvalidTransition(
                f"writer: its connection lent while {self.runner} and {self.lifecycle}"
            )
        return self.connection.lend()

    @property
    def holds_connection(self) -> bool:
        """Whether the write connection is open (checked out of the pool)."""
        return self.connection.state != "none"

    @property
    def queued(self) -> int:
        """Programs waiting in the queue."""
        return sum(1 for job in self._queue if job.program is not None)

    @property
    def waiting_for_turn(self) -> int:
        """Turns waiting in the queue (a transaction, Core writes, a checkpoint step)."""
        return sum(1 for job in self._queue if job.program is None)

    def _alone(self) -> bool:
        """Whether a job may run at once in its caller's task: nothing runs or waits."""
        return not self._queue and self._free()

    def _enqueue(self, job: Job[Any]) -> None:
        """Queue ``job``, fail it after the busy timeout, and start the leader when
        nothing runs."""
        self._queue.append(job)
        loop = asyncio.get_running_loop()
        job.timer = loop.call_later(self._busy_timeout_s, self._expire, job)
        if self._free():
            self._begin(asyncio.ensure_future(self._lead()))

    def _leave(self, job: Job[Any]) -> None:
        """Take a job that has not started out of the queue (its caller gave up, or the
        busy timeout passed); nothing when it has left already."""
        if job.state == "gone":
            return
        job.move("gone")
        self._queue.remove(job)
        if job.program is not None:
            job.program.close()

    def _expire(self, job: Job[Any]) -> None:
        """The busy timeout passed with ``job`` still queued: it fails, nothing done."""
        job.timer = None
        self._leave(job)
        job.done.set_exception(locked(job))

    # ------------------------------------------------------------------ programs

    async def submit(
        self,
        program: Program[T],
        action: str,
        conversation: str | None,
        *,
        indexing: bool = False,
        short: bool = False,
        lists: int = 0,
    ) -> T:
        """Run ``program`` in the next transaction; return its value (or raise what it
        raised). A caller cancelled before its program started leaves nothing done; once
        started, the transaction ends first, then the caller sees ``CancelledError``.
        ``indexing``: the program indexes the pending list (and lists nothing);
        ``short``: it may run on the event loop's thread (see the module); ``lists``: about
        how many messages it lists for the full-text index."""
        self._refuse_when_closed()
        loop = asyncio.get_running_loop()
        job: Job[T] = Job(program, action, conversation, loop.create_future(), indexing, lists)
        task = asyncio.current_task()
        again = task is not None and self._last_writer is not None and self._last_writer() is task
        self._last_writer = None if task is None else weakref.ref(task)
        if self._last_size == 1 and self._alone():
            small = self.checkpoints.pages() < WAL_NET_PAGES // 2  # see the module
            return await self._run_alone(job, inline=short and again and self._inline and small)
        self._enqueue(job)
        try:
            return await asyncio.shield(job.done)
        except asyncio.CancelledError:
            if job.state == "started":
                await finish_then_cancel(job.done)
            else:
                self._leave(job)
            raise

    def _refuse_when_closed(self) -> None:
        """A job that comes after the close (a caller racing the store's close) is
        refused as the closed store refuses calls."""
        if self.lifecycle == "closed":
            raise HistStoreError("the store is closed")

    def _free(self) -> bool:
        """Whether no job runs (a leader cancelled before it began, at the loop's
        shutdown, has ended too)."""
        if self.runner == "running" and self._leader is not None and self._leader.done():
            self._end()
        return self.runner == "idle"

    def _begin(self, leader: asyncio.Future[None] | None) -> None:
        self.runner = transition(self.runner, "running", _RUNNER, "writer")
        self._leader = leader

    def _end(self) -> None:
        self.runner = transition(self.runner, "idle", _RUNNER, "writer")
        self._leader = None

    def _ended_alone(self) -> None:
        """A lone job ended: the jobs queued meanwhile get a leader."""
        self._end()
        if self._queue:
            self._begin(asyncio.ensure_future(self._lead()))

    async def _run_alone(self, job: Job[T], *, inline: bool) -> T:
        """Run the program of a writer that found nobody writing or waiting, in the
        writer's own task: a group of one, without a task to start and a result to
        hand over. A cancelled writer sees its ``CancelledError`` once the transaction
        has ended: the connection settles first (``lending``)."""
        running = asyncio.get_running_loop().create_future()
        self._begin(running)
        job.move("started")
        try:
            await self._run([job], inline)
        finally:
            running.set_result(None)
            self._ended_alone()
        return job.done.result()

    async def _lead(self) -> None:
        """Run the queued jobs in order, programs up to ``MAX_GROUP`` a transaction,
        until none is left."""
        try:
            while self._queue:
                head = self._queue[0]
                if head.program is None:  # a turn: its holder's until it releases it
                    self._queue.popleft()
                    head.move("started")
                    assert head.released is not None
                    head.done.set_result(None)
                    await head.released
                    continue
                group, self._queue = take_group(self._queue, programs_only)
                for job in group:
                    job.move("started")
                self._last_size = len(group)
                try:
                    await self._run(group)
                except BaseException as exc:
                    end_all((job.done for job in group), exc)
                    if not isinstance(exc, Exception):
                        raise
        finally:
            self._end()

    async def _run(self, group: list[Job[Any]], inline: bool = False) -> None:
        phase = Phase()
        programs: list[Program[Any]] = [job.program for job in group if job.program is not None]
        try:
            async with self.lend() as conn:
                outcomes = await self._run_group(conn, programs, phase, inline)
            phase.name = "done"
        except DATABASE_ERRORS as exc:
            name = "body" if phase.name == "commit" and not_committed(exc) else phase.name
            for job in group:
                job.done.set_exception(failure_of(job, exc, name))
            return
        self._committed(group, outcomes)
        for job, (ok, value) in zip(group, outcomes, strict=True):
            if not ok:
                job.done.set_exception(as_failure(job, value))
            elif isinstance(value, Rollback):
                job.done.set_result(value.value)
            else:
                job.done.set_result(value)

    # ------------------------------------------------------------------ policies

    def _committed(self, group: list[Job[Any]], outcomes: list[tuple[bool, Any]]) -> None:
        """Tell the background work of a committed group (see the module)."""
        self.sizes.append(len(group))
        if self.indexer is not None:
            listed, messages, indexed = lists_for_index(group, outcomes)
            if indexed:
                self.indexer.caught_up()
            if listed:
                self.indexer.listed(messages)
        self.checkpoints.committed()

    def note_listed(self, messages: int = 0) -> None:
        """A write committed outside the groups (a transaction of the executor's own)
        listed about ``messages`` messages for the index: counted as a group, indexed
        with the next run."""
        if self.indexer is not None:
            self.indexer.listed(messages)
        self.checkpoints.committed(group=False)

    async def stop(self) -> None:
        """The store closes: start no background work; wait for the running programs
        and checkpoint (the indexer's last runs, ``IndexScheduler.close``, may follow).
        Again after a close that was cancelled: it goes on."""
        if self.lifecycle == "open":  # else again after a cancelled close: it goes on
            self.lifecycle = transition(self.lifecycle, "closing", _LIFECYCLE, "writer")
        self.checkpoints.stop()
        await self._settled()

    async def close(self) -> None:
        """After ``stop`` and the indexer's close: wait for what still runs, and give
        the write connection back (``InvalidTransition`` if a job is left). Again after
        a close that was cancelled: it goes on."""
        await self._settled()
        if self.lifecycle != "closed":
            if self.runner != "idle" or self._queue:
                raise InvalidTransition(f"writer: closed with jobs left ({self.runner})")
            self.lifecycle = transition(self.lifecycle, "closed", _LIFECYCLE, "writer")
        await self.connection.close()

    async def _settled(self) -> None:
        while running := [
            t for t in (self._leader, self.checkpoints.task) if t is not None and not t.done()
        ]:
            await asyncio.wait(running)


class _Turn:
    """``SqliteWriter.turn``: a context-manager class, not an async generator (see
    ``_storage.lending``: a store may close while its loop shuts down)."""

    __slots__ = ("_alone", "_job", "_writer", "action", "conversation")
    # ``_alone``: while taken at once, the future the writer's close waits for.

    def __init__(self, writer: SqliteWriter, action: str, conversation: str | None) -> None:
        self._writer = writer
        self.action = action
        self.conversation = conversation
        self._alone: asyncio.Future[None] | None = None
        self._job: Job[None] | None = None

    async def __aenter__(self) -> None:
        writer = self._writer
        writer._refuse_when_closed()  # noqa: SLF001 - the writer's own part
        loop = asyncio.get_running_loop()
        if writer._alone():  # noqa: SLF001
            self._alone = loop.create_future()  # held at once: no task, no timer
            writer._begin(self._alone)  # noqa: SLF001
            return
        job: Job[None] = Job(None, self.action, self.conversation, loop.create_future())
        job.released = loop.create_future()
        writer._enqueue(job)  # noqa: SLF001
        try:
            await job.done
        except asyncio.CancelledError:
            if job.state == "started" and not job.released.done():
                job.released.set_result(None)  # given the turn as it was cancelled
            else:
                writer._leave(job)  # noqa: SLF001
            raise
        self._job = job

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._alone is not None:
            alone, self._alone = self._alone, None
            alone.set_result(None)
            self._writer._ended_alone()  # noqa: SLF001
        elif self._job is not None:
            released, self._job = self._job.released, None
            if released is not None and not released.done():
                released.set_result(None)
