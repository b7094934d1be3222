"""Settling a write whose commit was sent but whose fate was lost.

Every batch is recorded under an idempotency key in its own transaction, so whether
the batch is stored is one question to the database: is that key recorded? But the
answer must also stay true. On PostgreSQL the lost statement may still be running in
a server session of its own (waiting for a row lock, or in its COMMIT) and commit after
a plain look-up found nothing. So settling first makes the batch's fate final: in one
transaction it takes the conversation's row lock (waiting for whoever holds it, the
lost write included) and *claims* the key, inserting a row that stores nothing
(``rows.CLAIMED``). A claim that finds the key held waits for the transaction that
holds it. Once the claim is in, the lost statement can never commit: its own row for
the key would break the key's uniqueness. A write again under the key takes the
claim's place (``Statements.insert_write_once``).

Each lock wait of the settling transaction lasts at most ``PATIENCE``; a longer one
(a stalled COMMIT, a lock held for long) makes the answer uncertain, which is true.
"""

from __future__ import annotations

from typing import Any

from .._core.models import WriteOutcome
from .._errors import HistStoreError, WriteError
from .._storage import rows as _rows
from .._storage.dberrors import DatabaseFailure
from .._storage.deadlines import CallTimeout
from .._storage.drivers import FETCH, Program
from .context import Context

__all__ = ["PATIENCE", "was_stored"]

PATIENCE = "10s"
"""How long settling waits for one lock (PostgreSQL's ``lock_timeout`` syntax); SQLite
waits for its write lock as long as the store's busy timeout."""


async def was_stored(
    ctx: Context, conversation: str, key: str, failure: DatabaseFailure
) -> int | None:
    """After a commit of unknown fate: the batch is stored, and this is the
    conversation's length now (``None`` when it is gone since).

    Raises:
        WriteError: ``accepted=0, uncertain=False`` when the batch is not stored and
            never will be (its key is claimed); ``uncertain=True`` when the database
            cannot be asked, the lost write's transaction outlasts ``PATIENCE``, or the
            write was given up at ``command_timeout`` (``_storage.deadlines``). Either
            way its ``__context__`` is ``failure``, the failure its message names.
    """
    if isinstance(failure.__cause__, CallTimeout):
        # Given up at command_timeout: the server was sent a cancel request, which it
        # may answer by committing, so asking now could answer before that happens.
        raise _uncertain(failure, key, "it was given up before the answer came")
    settled: tuple[bool, int | None] | None
    try:
        settled = await ctx.executor.write(
            _settle(ctx, conversation, key),
            action="settle a write to",
            conversation=conversation,
            lists=0,
            short=True,
        )
    except HistStoreError:
        settled = None
    if settled is None:
        # Raised outside the handler, so that the error's ``__context__`` is the commit's
        # failure its message names, not the settling read's (whose SQLSTATE differs).
        raise _uncertain(
            failure, key, "the database could not be asked whether the batch was stored"
        )
    stored, length = settled
    if not stored:
        raise WriteError(
            f"{failure} while committing, and the batch was not stored",
            outcome=WriteOutcome(0, False, None),
            idempotency_key=key,
        ) from failure.__cause__
    return length


def _settle(ctx: Context, conversation: str, key: str) -> Program[tuple[bool, int | None]]:
    """Whether the batch under ``key`` is stored, and the conversation's length; a key
    nobody holds is claimed (module doc)."""
    sql = ctx.sql
    if sql.lock_patience is not None:
        yield FETCH, sql.lock_patience, {"patience": PATIENCE}
    yield FETCH, sql.lock, ctx.params(conversation)
    claim: dict[str, Any] = {"c": conversation, "key": key, "now": _rows.now()}
    if (yield FETCH, sql.claim_key, claim):
        return False, None
    rows = yield FETCH, sql.settled, {"c": conversation, "key": key}
    digest, length = rows[0]
    if digest == _rows.CLAIMED:  # claimed when an earlier write under the key was settled
        return False, None
    return True, None if length is None else int(length)


def _uncertain(failure: DatabaseFailure, key: str, why: str) -> WriteError:
    """The error of a write that may or may not be stored (``why`` nobody knows), with
    ``failure`` as its ``__context__`` and the driver's error as its ``__cause__``."""
    error = WriteError(
        f"{failure} while committing, and {why}; write the same batch again with its"
        " idempotency_key",
        outcome=WriteOutcome(0, True, None),
        idempotency_key=key,
    )
    error.__context__ = failure
    error.__cause__ = failure.__cause__  # as ``raise error from failure.__cause__``
    error.__suppress_context__ = True
    return error
