"""The jobs of the SQLite writer's queue (``_storage.sqlite_writer``), and what their
callers get when a job fails.

A job's states: ``queued`` (made, in the queue or about to run alone) → ``started``
(its program's group runs, or its turn is handed over; or it runs alone at once) or
``gone`` (its caller was cancelled, or the busy timeout passed: nothing done, out of
the queue). Any other move raises ``states.InvalidTransition``."""

from __future__ import annotations

import asyncio
from typing import Any, Generic, Literal, TypeVar

from .dberrors import DATABASE_ERRORS, DatabaseFailure, failure
from .drivers import Program
from .states import transition

__all__ = [
    "JOB_MOVES",
    "Job",
    "as_failure",
    "failure_of",
    "lists_for_index",
    "locked",
    "programs_only",
]

T = TypeVar("T")

JOB_MOVES: dict[str, tuple[str, ...]] = {
    "queued": ("started", "gone"),
    "started": (),
    "gone": (),
}


class Job(Generic[T]):
    """A queued job: a program (``program``; ``done`` gets its value) or a turn
    (``program`` is ``None``; ``done`` is set when the turn is its, and its holder sets
    ``released`` when done with it)."""

    __slots__ = (
        "action",
        "conversation",
        "done",
        "indexing",
        "lists",
        "program",
        "released",
        "state",
        "timer",
    )

    def __init__(
        self,
        program: Program[T] | None,
        action: str,
        conversation: str | None,
        done: asyncio.Future[T],
        indexing: bool = False,
        lists: int = 0,
    ) -> None:
        self.program = program
        self.action = action
        self.conversation = conversation
        self.done = done
        self.state: Literal["queued", "started", "gone"] = "queued"
        self.indexing = indexing
        """A run of the indexer (which lists nothing)."""
        self.lists = lists
        """About how many messages the program lists for the full-text index."""
        self.released: asyncio.Future[None] | None = None
        self.timer: asyncio.TimerHandle | None = None
        """Fails the job when it waited for the busy timeout."""

    def move(self, new: Literal["started", "gone"]) -> None:
        """Move to ``new`` (``queued`` → ``started`` or ``gone``, once), disarming the
        busy timeout's timer."""
        self.state = transition(self.state, new, JOB_MOVES, f"job {self.action!r}")
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None


def lists_for_index(
    group: list[Job[Any]], outcomes: list[tuple[bool, Any]]
) -> tuple[bool, int, bool]:
    """Whether a committed group may have listed messages for the index after its last
    run of the indexer that indexed the whole list, about how many it listed after that
    run, and whether it had such a run."""
    listing = indexed = False
    messages = 0
    for job, (ok, value) in zip(group, outcomes, strict=True):
        if not job.indexing:
            listing = True
            messages += job.lists if ok else 0
        elif ok and value is False:
            listing, indexed, messages = False, True, 0
    return listing, messages, indexed


def as_failure(job: Job[Any], exc: BaseException) -> BaseException:
    """What a program's own failure becomes for its caller: a database error is the
    ``DatabaseFailure`` of a transaction that was rolled back; anything else (what the
    program raised) as it is."""
    return failure_of(job, exc, "body") if isinstance(exc, DATABASE_ERRORS) else exc


def failure_of(job: Job[Any], exc: BaseException, phase: str) -> BaseException:
    error = failure(job.action, job.conversation, exc, phase)
    error.__cause__ = exc
    return error


def locked(job: Job[Any]) -> DatabaseFailure:
    """The failure of a job that waited in the queue for the busy timeout."""
    where = f" conversation {job.conversation!r}" if job.conversation is not None else ""
    return DatabaseFailure(
        f"{job.action}{where} failed: database is locked (busy timeout: other writers of"
        " this store held it)"
    )


def programs_only(job: Job[Any], taken: list[Job[Any]]) -> bool | None:
    """A group of the writer takes the programs up to the next turn (``take_group``)."""
    return True if job.program is not None else None
