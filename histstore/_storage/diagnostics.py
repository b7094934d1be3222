"""What a store's connections, writer and background work are doing now
(``Store.diagnostics()``): for tests and monitoring, read without touching the database."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .executor import Executor
    from .sqlite_writer import SqliteWriter

__all__ = ["Diagnostics", "diagnose"]


@dataclass(frozen=True, slots=True)
class Diagnostics:
    """A snapshot of a store's concurrency objects (docs/architecture.md has their
    state tables). Fields about the SQLite writer are ``None`` where there is none (on
    PostgreSQL and in memory)."""

    backend: str
    """``"sqlite"`` or ``"postgresql"``."""
    idle_connections: int
    """Connections kept for the next calls (checked out of the pool, unused)."""
    writer_connection: bool
    """SQLite file: the writer's write connection is open (checked out of the pool for
    the store's life; it is not among ``idle_connections``)."""
    one_trip: bool
    """SQLite: a program runs in one trip to the connection's thread (aiosqlite's
    private queue is there; else every statement goes through its public calls)."""
    writer: str | None
    """The SQLite writer's runner: ``"idle"`` or ``"running"``."""
    writer_lifecycle: str | None
    """``"open"``, ``"closing"`` or ``"closed"``."""
    queued: int
    """Programs waiting for the SQLite writer's next group."""
    waiting_for_turn: int
    """Writers (a group's leader, a transaction, a checkpoint) queued for the turn."""
    group_sizes: tuple[int, ...]
    """Programs in each of the writer's latest committed groups, oldest first."""
    wal_pages: float | None
    """The WAL's pages since the last background checkpoint, as the writer estimates."""
    checkpoints: str | None
    """The background checkpoints: ``"idle"`` (``"armed"`` when a timer will look for
    one: a pause, or a look again after a reader held pages), ``"running"`` or
    ``"stopped"``."""
    indexer: str | None
    """The full-text index's scheduler: ``"idle"``, ``"running"`` or ``"closing"``;
    ``None`` where nothing indexes in the background (a read-only store)."""


def _checkpoints(writer: SqliteWriter) -> str:
    checkpoints = writer.checkpoints
    return "armed" if checkpoints.state == "idle" and checkpoints.armed else checkpoints.state


def diagnose(executor: Executor) -> Diagnostics:
    """The diagnostics of the store running on ``executor``."""
    writer, indexer = executor.writer, executor.indexer
    return Diagnostics(
        backend=executor.dialect.name,
        idle_connections=executor.idle_connections,
        writer_connection=writer is not None and writer.holds_connection,
        one_trip=bool(getattr(executor.driver, "one_trip", False)),
        writer=None if writer is None else writer.runner,
        writer_lifecycle=None if writer is None else writer.lifecycle,
        queued=0 if writer is None else writer.queued,
        waiting_for_turn=0 if writer is None else writer.waiting_for_turn,
        group_sizes=() if writer is None else tuple(writer.sizes),
        wal_pages=None if writer is None else writer.checkpoints.pages(),
        checkpoints=None if writer is None else _checkpoints(writer),
        indexer=None if indexer is None else indexer.state,
    )
