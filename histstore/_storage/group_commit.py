"""Group commit: the write programs of a store's concurrent callers, on SQLite, run
together in one write transaction (one trip to the connection's thread, one COMMIT).

Each program runs inside its own savepoint, so what one program raises, or a
``Rollback`` it returns, undoes only its own statements; every caller gets exactly what
its program alone would have given: its value, or its exception. A failure of the
transaction itself (the write lock not taken, a failed COMMIT) is every member's
failure, with the same ``phase`` as a transaction of its own. A program runs after the
programs queued before it and sees what they wrote, as in turns.

Writers do not wait for a group to form: a writer that finds nobody writing or waiting
runs its program at once, in its own task, and the writers that arrive while a
transaction runs go together in the next one, run by a task of the store. Unless the
last group had several: writers that came together are likely to come back together
(each woken by the same commit), so such a writer queues instead, and the store's task,
starting on the event loop's next turn, takes everyone who arrived in this one. Running
the first alone made every other commit a group of one (16 tasks: groups of 1 and 16
in turn; now two cohorts of about 8, one committing while the other prepares).

A lone writer's short program (``submit``'s ``short``: an append of a few messages,
on a store whose commits do not fsync) runs on the event loop's own thread when the
same task wrote last (``SqliteDriver``'s ``inline``): one task writing after each of
its reads, an agent loop, pays no trip to the connection's thread. Writes of
different tasks in turn stay on the thread, where SQLite's work runs beside the
Python of the other tasks; so does every write while the WAL is estimated at half the
size at which a commit checkpoints by itself (``engine.WAL_NET_PAGES``: the background
checkpoints below fell behind), so that such a checkpoint never runs on the loop.

Checkpoints, too, are taken off the writers' path: SQLite's own (every 1,000 WAL pages,
run by the commit that crosses the mark) cost that one write a few milliseconds of
copying and fsync. Here a task of the store runs a ``PASSIVE`` checkpoint on a
connection of its own, which neither waits for nor blocks readers and writers; then, in
the store's write turn, a second one copies the few pages written meanwhile, so that the
next write restarts the WAL from its beginning. It runs when the writers pause (no
commit for ``IDLE_S``) with at least ``IDLE_PAGES`` in the WAL, or, while writes go on
without a pause, once the WAL reaches ``CHECKPOINT_PAGES``: on a 2-core machine a
checkpoint beside the writers slows the writes it overlaps, so it waits for the gaps
agent traffic has (a model call between two writes) when it can. The WAL's pages are
estimated from the committed groups (and the pages per group the last checkpoint
measured). The connections' own automatic checkpoint stays as a net, at a WAL of
``engine.WAL_NET_PAGES`` pages.

A reader holding a snapshot (a long export, an open iterator in a notebook) keeps a
checkpoint from copying what was written after the snapshot began, so the WAL grows
with every write meanwhile. A checkpoint that finds pages it could not copy looks again
later (after ``HELD_S``, doubling to ``HELD_MAX_S``) while the store is open, so that
when the reader has gone the WAL is copied whole even if no write comes. When that
WAL had outgrown ``engine.WAL_LIMIT_BYTES``, the store's write turn then truncates the
file (a ``TRUNCATE`` checkpoint that waits for nobody); a write that restarts the WAL
first cuts it back to that size by itself (``journal_size_limit``).

The full-text index's pending list (``_storage.search_index``) is indexed in the
background too: after ``INDEX_GROUPS`` groups that may have listed messages, and once
more before the store closes when its writers listed any since. Each run is a write
program of its own, queued like a writer's, indexing at most ``search_index.CHUNK``
messages; a run that leaves more queues the next one, so writers' programs go between
them. (Not in the writers' pauses, as checkpoints are: work started from a timer may
begin while ``asyncio.run`` shuts the loop down, after it cancelled the program's tasks,
and be left unfinished; the runs start from a writer's commit instead.)
"""

from __future__ import annotations

import asyncio
import weakref
from collections import deque
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any, Generic, TypeVar

from .completion import end_all, finish_then_cancel
from .dberrors import DATABASE_ERRORS, failure, not_committed
from .drivers import Phase, Program, Rollback
from .engine import WAL_LIMIT_BYTES, WAL_NET_PAGES

__all__ = ["GroupCommit"]

T = TypeVar("T")

MAX_GROUP = 64
"""Programs in one transaction at most (the rest wait for the next one)."""

CHECKPOINT_PAGES = 4000
"""WAL pages (about) at which a background checkpoint starts while writes go on."""

IDLE_PAGES = 256
"""WAL pages (about) worth a background checkpoint once the writers pause."""

IDLE_S = 0.01
"""Seconds without a commit that make a pause."""

INDEX_GROUPS = 256
"""Groups that may have listed messages after which the pending list is indexed."""

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


class _Member(Generic[T]):
    __slots__ = ("action", "conversation", "done", "indexing", "program", "started")

    def __init__(
        self,
        program: Program[T],
        action: str,
        conversation: str | None,
        done: asyncio.Future[T],
        indexing: bool = False,
    ) -> None:
        self.program = program
        self.action = action
        self.conversation = conversation
        self.done = done
        self.started = False
        self.indexing = indexing
        """A run of the indexer (which lists nothing)."""


class GroupCommit:
    """A store's queue of write programs and the task that runs them, a group at a time.

    ``writing(action, conversation)`` holds the store's write turn; ``connection()``
    lends a driver connection; ``run_group(conn, programs, phase, inline)`` runs programs
    in one transaction (``inline``: on the event loop's thread, see above) and returns,
    per program, ``(True, value)`` or ``(False, exception)``
    (the driver's ``run_group``); ``checkpoint(conn)`` checkpoints the WAL; ``index()``,
    when given, is a write program indexing the pending list (returns whether more may
    be listed). ``inline``: a short program may run on the event loop's thread (the
    store's commits do not fsync: ``durability="process"``).
    """

    def __init__(
        self,
        writing: Callable[[str, str | None], AbstractAsyncContextManager[None]],
        connection: Callable[[], AbstractAsyncContextManager[Any]],
        run_group: Callable[
            [Any, list[Program[Any]], Phase, bool], Awaitable[list[tuple[bool, Any]]]
        ],
        checkpoint: Callable[[Any, bool], Awaitable[tuple[int, int]]],
        index: Callable[[], Program[bool]] | None = None,
        inline: bool = False,
    ) -> None:
        self._writing = writing
        self._connection = connection
        self._run_group = run_group
        self._checkpoint = checkpoint
        self._queue: deque[_Member[Any]] = deque()
        # The task running groups; or, while a lone writer runs its own, a future that
        # ends with it (see ``_run_alone``).
        self._leader: asyncio.Future[None] | None = None
        self._groups = 0  # committed since the last background checkpoint
        self._per_group = FIRST_PAGES_PER_GROUP  # WAL pages a group adds, as measured
        self._last_commit = 0.0  # the loop's time of the latest commit
        self._pause: asyncio.TimerHandle | None = None  # looks for a pause, when armed
        self._held: asyncio.TimerHandle | None = None  # looks again after a held checkpoint
        self._held_s = HELD_S  # the wait before that look
        self._stopped = False
        self._checkpointing: asyncio.Task[None] | None = None
        self._index = index
        self._more = False  # the last run left more listed
        self._unindexed = 0  # groups that may have listed messages since the last run
        self._indexing: asyncio.Task[None] | None = None
        self._last_writer: weakref.ref[asyncio.Task[Any]] | None = None
        self._last_size = 1  # programs of the last group
        self._inline = inline

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
        member: _Member[T] = _Member(
            program, action, conversation, asyncio.get_running_loop().create_future(), indexing
        )
        task = asyncio.current_task()
        again = task is not None and self._last_writer is not None and self._last_writer() is task
        self._last_writer = None if task is None else weakref.ref(task)
        if _idle(self._leader) and not self._queue and self._last_size == 1:
            inline = short and again and self._inline and self._wal_pages() < WAL_NET_PAGES // 2
            return await self._run_alone(member, inline=inline)
        self._queue.append(member)
        if _idle(self._leader):
            self._leader = asyncio.ensure_future(self._lead())
        try:
            return await asyncio.shield(member.done)
        except asyncio.CancelledError:
            if not member.started:
                self._queue.remove(member)
                program.close()
            else:
                await finish_then_cancel(member.done)
            raise

    def _wal_pages(self) -> float:
        """The WAL's pages since the last background checkpoint, as estimated."""
        return self._groups * self._per_group

    async def _run_alone(self, member: _Member[T], *, inline: bool) -> T:
        """Run the program of a writer that found nobody writing or waiting, in the
        writer's own task: a group of one, without a task to start and a result to
        hand over (most writes of a store that is not busy). Writers arriving meanwhile
        queue for the next group, whose leader starts when this one ends. A cancelled
        writer sees its ``CancelledError`` once the transaction has ended: the
        connection settles first (``Executor._connection``)."""
        running = asyncio.get_running_loop().create_future()
        self._leader = running
        try:
            await self._run([member], inline)
        finally:
            running.set_result(None)
            self._leader = None
            if self._queue:
                self._leader = asyncio.ensure_future(self._lead())
        return member.done.result()

    async def _lead(self) -> None:
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
            self._leader = None

    async def _run(self, group: list[_Member[Any]], inline: bool = False) -> None:
        first = group[0]
        phase = Phase()
        async with self._writing(first.action, first.conversation):
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
        self._committed(*_listing(group, outcomes))
        for member, (ok, value) in zip(group, outcomes, strict=True):
            if not ok:
                member.done.set_exception(_as_failure(member, value))
            elif isinstance(value, Rollback):
                member.done.set_result(value.value)
            else:
                member.done.set_result(value)

    def note_listed(self) -> None:
        """Messages were listed for the index outside the groups (a transaction of the
        executor's own): counted as a group, indexed with the next run."""
        self._committed(True, group=False)

    def _committed(self, listing: bool, indexed: bool = False, *, group: bool = True) -> None:
        """Count a committed group; index the pending list after many groups, start a
        checkpoint when the WAL is large, or look for the next pause when it holds
        enough to copy."""
        loop = asyncio.get_running_loop()
        if group:
            self._groups += 1
            self._last_commit = loop.time()
        if indexed:
            self._unindexed = 0  # a run indexed the whole list after every listing
        if listing and self._index is not None:
            self._unindexed += 1
        if self._stopped:
            return
        if self._unindexed >= INDEX_GROUPS and _idle(self._indexing):
            self._start_indexing()
        if not _idle(self._checkpointing):
            return
        pages = self._wal_pages()
        if pages >= CHECKPOINT_PAGES:
            self._start_checkpoint()
        elif pages >= IDLE_PAGES and self._pause is None:
            self._pause = loop.call_later(IDLE_S, self._on_pause)

    def _on_pause(self) -> None:
        """The timer armed by ``_committed``: a checkpoint when no commit came for
        ``IDLE_S``, else look again when that much time has passed since the last."""
        self._pause = None
        if self._stopped or not _idle(self._checkpointing) or not self._groups:
            return
        loop = asyncio.get_running_loop()
        quiet = loop.time() - self._last_commit
        if quiet < IDLE_S:
            self._pause = loop.call_later(IDLE_S - quiet, self._on_pause)
        else:
            self._start_checkpoint()

    def _start_indexing(self) -> None:
        self._indexing = asyncio.ensure_future(self._index_list(to_end=False))

    async def _index_list(self, *, to_end: bool) -> None:
        """Index the pending list, a chunk per run, while runs find more; unless
        ``to_end``, only until the store stops (``wait_idle`` indexes the rest). A
        failure is left to a later run (at the latest at close) or search."""
        index = self._index
        assert index is not None
        self._unindexed = 0
        try:
            while True:
                self._more = await self.submit(index(), "indexing search text", None, indexing=True)
                if not self._more or (self._stopped and not to_end):
                    return
        except Exception:  # noqa: BLE001 - best effort, see above
            self._unindexed = max(self._unindexed, 1)
        finally:
            self._indexing = None

    def _start_checkpoint(self) -> None:
        for timer in (self._pause, self._held):
            if timer is not None:
                timer.cancel()
        self._pause = self._held = None
        groups, self._groups = self._groups, 0
        self._checkpointing = asyncio.ensure_future(self._checkpoint_now(groups))

    async def _checkpoint_now(self, groups: int) -> None:
        """A ``PASSIVE`` checkpoint after ``groups`` committed groups, and what a group
        adds to the WAL, measured; a failure is left to the connections' own net."""
        try:
            async with self._connection() as conn:
                # The WAL's pages: what was written since the last checkpoint, which
                # left it copied whole, so that the next write restarted it.
                grown, _ = await self._checkpoint(conn, False)
                # What this store's writers added meanwhile, in their turn: with the
                # WAL then copied whole, the next write starts it from its beginning
                # again (a WAL that only grows makes every commit's fsync write the
                # file's size too, and readers search a longer index).
                async with self._writing("checkpoint", None):
                    pages, copied = await self._checkpoint(conn, False)
                    if copied == pages > TRUNCATE_PAGES:
                        pages, copied = await self._checkpoint(conn, True)
        except Exception:  # noqa: BLE001 - best effort: SQLite checkpoints by itself too
            return
        finally:
            self._checkpointing = None
        if copied < pages:
            self._look_again()  # a reader holds part of the WAL (see the module)
        else:
            self._held_s = HELD_S
        if grown > 0 and groups > 0:
            self._per_group = max(grown / groups, MIN_PAGES_PER_GROUP)

    def _look_again(self) -> None:
        """Arm the next checkpoint after one a reader held back (see the module)."""
        if self._stopped or self._held is not None:
            return
        loop = asyncio.get_running_loop()
        self._held = loop.call_later(self._held_s, self._on_held)
        self._held_s = min(self._held_s * 2, HELD_MAX_S)

    def _on_held(self) -> None:
        self._held = None
        if not self._stopped and _idle(self._checkpointing):
            self._start_checkpoint()

    async def wait_idle(self) -> None:
        """Before the store closes: index what its writers listed since the last run,
        wait for the running group, indexing and checkpoint, if any, and start no
        further checkpoint or indexing."""
        self._stopped = True
        for timer in (self._pause, self._held):
            if timer is not None:
                timer.cancel()
        self._pause = self._held = None
        await self._settled()
        if self._index is not None and (self._unindexed or self._more):
            await self._index_list(to_end=True)
            await self._settled()

    async def _settled(self) -> None:
        """Wait until no group, indexing or checkpoint runs."""
        while running := [
            t for t in (self._leader, self._indexing, self._checkpointing) if t and not t.done()
        ]:
            await asyncio.wait(running)


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


def _idle(task: asyncio.Future[None] | None) -> bool:
    """No task, or one that has ended (even one cancelled before it ever ran)."""
    return task is None or task.done()


def _as_failure(member: _Member[Any], exc: BaseException) -> BaseException:
    """What a program's own failure becomes for its caller: a database error is the
    ``DatabaseFailure`` of a transaction that was rolled back; anything else (what the
    program raised) as it is."""
    return _failure(member, exc, "body") if isinstance(exc, DATABASE_ERRORS) else exc


def _failure(member: _Member[Any], exc: BaseException, phase: str) -> BaseException:
    error = failure(member.action, member.conversation, exc, phase)
    error.__cause__ = exc
    return error
