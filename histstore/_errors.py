"""The exceptions histstore raises, and the one place driver errors are translated.

::

    HistStoreError
    ├── InvalidId            (also ValueError)
    ├── InvalidMessage       (also ValueError)
    ├── NotFound             (also LookupError)
    ├── ConflictError        .outcome
    ├── WriteError           .outcome, .idempotency_key
    ├── CommitError          .conversation, .messages, .position, .outcome, retry()
    ├── WindowTooSmall
    └── SchemaError

Messages name the conversation (and the failing operation) but never include message
content; a database driver's exception is kept as ``__cause__``.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

from sqlalchemy import exc as sa_exc

_driver_errors: list[type[BaseException]] = [sqlite3.Error]
try:  # asyncpg is an optional extra
    import asyncpg

    _driver_errors += [asyncpg.PostgresError, asyncpg.InterfaceError]
except ImportError:  # pragma: no cover - depends on the installation
    pass
DRIVER_ERRORS: tuple[type[BaseException], ...] = tuple(_driver_errors)
"""What the drivers raise when called directly (the fast path)."""
DATABASE_ERRORS: tuple[type[BaseException], ...] = (
    sa_exc.SQLAlchemyError,
    OSError,
    ConnectionError,
    TimeoutError,
    *DRIVER_ERRORS,
)
"""Every failure of the database or the way to it; translated to ``HistStoreError``."""

if TYPE_CHECKING:
    from ._models import Message, WriteOutcome
    from ._store import Store

__all__ = [
    "DATABASE_ERRORS",
    "DRIVER_ERRORS",
    "CommitError",
    "ConflictError",
    "HistStoreError",
    "InvalidId",
    "InvalidMessage",
    "NotFound",
    "SchemaError",
    "WindowTooSmall",
    "WriteError",
    "translate_errors",
]


class HistStoreError(Exception):
    """Base class of every error histstore raises."""


class InvalidId(HistStoreError, ValueError):
    """A conversation id (or list name, or user) breaks the id rules."""


class InvalidMessage(HistStoreError, ValueError):
    """A message or value cannot be stored as given; nothing was written."""


class NotFound(HistStoreError, LookupError):
    """The conversation does not exist (or is not visible through this view)."""


class ConflictError(HistStoreError):
    """The write does not fit what is stored; nothing was written.

    Raised for ``write(at=k)`` with a gap or with messages that differ from those stored,
    for an idempotency key already used by a different batch, and for a fork target that
    exists. ``outcome`` is the zero outcome when a write raised it, else ``None``.
    """

    def __init__(self, message: str, *, outcome: WriteOutcome | None = None) -> None:
        super().__init__(message)
        self.outcome = outcome


class WriteError(HistStoreError):
    """A write failed; ``outcome`` says what is known to be stored.

    ``outcome.accepted`` messages (a prefix of the batch) are stored; when
    ``outcome.uncertain`` is true the rest may be stored too. Writing the same batch again
    with ``idempotency_key`` is always safe.
    """

    def __init__(
        self, message: str, *, outcome: WriteOutcome, idempotency_key: str | None = None
    ) -> None:
        super().__init__(message)
        self.outcome = outcome
        self.idempotency_key = idempotency_key


class CommitError(HistStoreError):
    """The reply of a model call could not be stored (see ``with_history``).

    Carries the exact batch (``messages``), the position it belongs at (``position``) and
    the write's ``outcome``. ``await error.retry(store)`` writes the batch again at the same
    position, without calling the model, and is safe whatever the outcome was.
    """

    def __init__(
        self,
        message: str,
        *,
        conversation: str,
        messages: Sequence[Message],
        position: int,
        outcome: WriteOutcome,
        idempotency_key: str | None = None,
    ) -> None:
        super().__init__(message)
        self.conversation = conversation
        self.messages = list(messages)
        self.position = position
        self.outcome = outcome
        self.idempotency_key = idempotency_key

    async def retry(self, store: Store) -> WriteOutcome:
        """Write the batch again at ``position``; raises ``ConflictError`` if it is taken."""
        return await store.write(
            self.conversation,
            self.messages,
            at=self.position,
            idempotency_key=self.idempotency_key,
        )


class WindowTooSmall(HistStoreError):
    """The newest turn alone does not fit the window's limits."""


class SchemaError(HistStoreError):
    """The database schema is missing, outdated, or newer than this library."""


def describe(exc: BaseException) -> str:
    """Name a driver error without its text (which may quote parameters)."""
    orig = getattr(exc, "orig", None)
    return type(orig if orig is not None else exc).__name__


@contextmanager
def translate_errors(action: str, conversation: str | None = None) -> Iterator[None]:
    """Re-raise database errors met inside the block as ``HistStoreError``.

    ``action`` says what was being done ("read", "clear", ...); the message names the
    conversation when there is one.
    """
    try:
        yield
    except HistStoreError:
        raise
    except DATABASE_ERRORS as exc:
        where = f" conversation {conversation!r}" if conversation is not None else ""
        raise HistStoreError(f"{action}{where} failed: {describe(exc)}") from exc
