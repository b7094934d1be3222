"""The exceptions histstore raises.

::

    HistStoreError
    ├── InvalidId            (also ValueError)
    ├── InvalidMessage       (also ValueError)
    ├── NotFound             (also LookupError)
    ├── ConflictError        .outcome
    ├── WriteError           .outcome, .idempotency_key
    ├── CommitError          .conversation, .messages, .position, .outcome, retry()
    ├── WindowTooSmall
    ├── SchemaError
    └── DatabaseFailure      .phase, .sqlstate, .transient   (defined in _dberrors)

``DatabaseFailure`` is an operation the database could not do: the server was down,
shutting down, starting up, in recovery or out of connections, the connection was lost,
or the server cancelled the statement (lock or statement timeout, cancel request,
deadlock). A ``write`` raises ``WriteError`` instead, whose ``outcome`` says what is
stored; ``uncertain=True`` only when the commit was sent and its answer lost.

Messages name the conversation (and the failing operation) but never include message
content; a database driver's exception is kept as ``__cause__``. This module is the
hierarchy only: database errors are translated in the storage layer (``_storage.dberrors``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._core.models import Message, WriteOutcome
    from ._store import Store

__all__ = [
    "CommitError",
    "ConflictError",
    "HistStoreError",
    "InvalidId",
    "InvalidMessage",
    "NotFound",
    "SchemaError",
    "WindowTooSmall",
    "WriteError",
]


class HistStoreError(Exception):
    """Base class of every error histstore raises.

    ``outcome`` is set on every error a ``write`` raises (the zero outcome when nothing
    was written), else ``None``.
    """

    outcome: WriteOutcome | None = None


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

    Carries the ``conversation``, the exact batch (``messages``), the position it belongs
    at (``position``), the write's ``outcome`` and the batch's ``idempotency_key``.
    ``await error.retry(store)`` writes the batch again at the same position, without
    calling the model, and is safe whatever the outcome was.
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
