"""What every part of a store shares: its executor, statements, owner and settings."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import ColumnElement, and_
from sqlalchemy.ext.asyncio import AsyncEngine

from .._core.ids import validate_id
from .._core.models import Message
from .._errors import NotFound
from .._storage import schema as s
from .._storage.engine import SqliteSettings
from .._storage.executor import Executor
from .._storage.pool_options import DEFAULT_REFUSED_WAIT
from .._storage.statements.checkpoints import CheckpointStatements
from .._storage.statements.semantic import SemanticStatements
from .._storage.statements.store import Statements

__all__ = ["Context", "Shared", "StoreSettings"]


@dataclass(frozen=True)
class StoreSettings:
    """Options given to ``connect()`` that shape every call of a store."""

    count_tokens: Callable[[Message], int] | None = None
    max_message_bytes: int = 16 * 1024 * 1024
    max_batch: int = 10_000
    sqlite: SqliteSettings | None = None
    schema: str | None = None
    read_only: bool = False
    """``connect(read_only=True)``: every write is refused before reaching the database."""
    pooled: bool = False
    """``connect(pooler="transaction")``: the server is reached through a transaction-mode
    pooler (see ``_storage.drivers.for_dialect``)."""
    refused_wait: float = DEFAULT_REFUSED_WAIT
    """Seconds a connection the server refuses for now is waited for
    (``_storage.refusals``)."""
    capacity: int | None = None
    """The most connections the store's pool holds (``pool_size + max_overflow``) when
    ``connect()`` made its engine; ``None`` for a borrowed engine or in memory."""
    command_timeout: float | None = None
    """``connect(command_timeout=...)``: seconds after which a call is given up
    (``_storage.deadlines``)."""

    def executor(self, engine: AsyncEngine) -> Executor:
        """The executor of a store opened on ``engine`` with these settings."""
        return Executor(
            engine,
            self.sqlite,
            self.schema,
            read_only=self.read_only,
            pooled=self.pooled,
            refused_wait=self.refused_wait,
            capacity=self.capacity,
            command_timeout=self.command_timeout,
        )


_COMPILED: dict[tuple[Any, ...], Statements] = {}
"""The statements of the engines ``connect()`` made, by what their compilation depends
on (see ``Shared.reuse_compiled``). Compiled statements hold no connection or engine."""


@dataclass
class Shared:
    """What a store and its scoped views share: the executor and the statements
    (compiled once per engine, not per view; those of the semantic index and the
    checkpoint storage when first asked for)."""

    executor: Executor
    reuse_compiled: bool = False
    """The engine is one ``connect()`` made from a path or URL: its statements are those of
    every such engine of the same dialect, server version and schema, so they are
    compiled once per process (``_COMPILED``), not once per store."""
    _statements: dict[bool, Statements] = field(default_factory=dict)
    _semantic: dict[bool, SemanticStatements] = field(default_factory=dict)
    _checkpoints: dict[bool, CheckpointStatements] = field(default_factory=dict)
    lease_released: dict[str, asyncio.Event] = field(default_factory=dict)
    """Wakes this process's lease waiters when a lease on a conversation is released."""
    lease_queues: dict[str, Any] = field(default_factory=dict)
    """This process's lease waiters per conversation, queued in arrival order."""

    def statements(self, scoped: bool) -> Statements:
        """The statements of a whole store or (``scoped``) of a user's view."""
        sql = self._statements.get(scoped)
        if sql is None:
            driver = self.executor.driver
            dialect = driver.dialect
            key = (
                type(dialect),
                dialect.paramstyle,
                dialect.server_version_info,
                driver.schema,
                scoped,
            )
            sql = _COMPILED.get(key) if self.reuse_compiled else None
            if sql is None:
                sql = Statements(driver, scoped)
                if self.reuse_compiled:
                    _COMPILED[key] = sql
            self._statements[scoped] = sql
        return sql

    def semantic_statements(self, scoped: bool) -> SemanticStatements:
        """The semantic index's statements of a whole store or of a user's view."""
        sql = self._semantic.get(scoped)
        if sql is None:
            sql = self._semantic[scoped] = SemanticStatements(self.executor.driver, scoped)
        return sql

    def checkpoint_statements(self, scoped: bool) -> CheckpointStatements:
        """The checkpoint storage's statements of a whole store or of a user's view."""
        sql = self._checkpoints.get(scoped)
        if sql is None:
            sql = self._checkpoints[scoped] = CheckpointStatements(self.executor.driver, scoped)
        return sql


class Context:
    """A store's (or a view's) executor, statements, owner and settings."""

    def __init__(self, shared: Shared, settings: StoreSettings, owner: str | None) -> None:
        self.shared = shared
        self.executor = shared.executor
        self.sql = shared.statements(owner is not None)
        self.owner = owner
        self.settings = settings

    def params(self, conversation: str, **more: Any) -> dict[str, Any]:
        """Parameters for a statement naming ``conversation`` (and the view's owner)."""
        return {"c": conversation, "owner": self.owner, **more}

    def sees(self, user: str | None) -> bool:
        """Whether ``user``'s conversations are visible here at all (a view sees only
        its own user's)."""
        if user is not None:
            validate_id(user, what="user")
        return self.owner is None or user is None or user == self.owner

    def scope(
        self, user: str | None = None, owner: ColumnElement[Any] = s.conversations.c.owner
    ) -> ColumnElement[bool] | None:
        """The condition on ``owner`` (the conversations' owner column, or another table's
        owner column: LangGraph threads) that keeps what this store sees, narrowed to
        ``user``'s rows when given (check ``sees`` first); ``None`` when everything is
        visible."""
        who = self.owner if self.owner is not None else user
        return None if who is None else owner == who

    def owned(self, conversation: str) -> ColumnElement[bool]:
        """The condition that a conversation row is visible through this store (Core)."""
        cond = s.conversations.c.id == conversation
        if self.owner is not None:
            cond = and_(cond, s.conversations.c.owner == self.owner)
        return cond


def not_found(conversation: str) -> NotFound:
    """The error for a conversation that does not exist or that a view may not see."""
    return NotFound(f"conversation {conversation!r} not found")
