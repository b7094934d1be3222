"""Settling a write whose commit was sent but whose fate was lost.

Every batch is recorded under an idempotency key in its own transaction, so whether
the batch is stored is one question to the database: is that key recorded?
"""

from __future__ import annotations

from .._core.models import WriteOutcome
from .._errors import HistStoreError, WriteError
from .._storage.dberrors import DatabaseFailure
from .._storage.deadlines import CallTimeout
from .context import Context

__all__ = ["was_stored"]


async def was_stored(ctx: Context, conversation: str, key: str, failure: DatabaseFailure) -> int:
    """After a commit of unknown fate: the conversation's length when the batch is stored.

    Raises:
        WriteError: ``accepted=0, uncertain=False`` when the database answers that the
            batch is not stored; ``uncertain=True`` when it cannot be asked, or the
            write was given up at ``command_timeout`` (``_storage.deadlines``).
    """
    if isinstance(failure.__cause__, CallTimeout):
        # Given up at command_timeout: the server was sent a cancel request, which it
        # may answer by committing, so asking now could answer before that happens.
        raise _uncertain(failure, key, "it was given up before the answer came") from (
            failure.__cause__
        )
    try:
        rows = await ctx.executor.fetch(
            ctx.sql.settled, {"c": conversation, "key": key}, action="settle"
        )
    except HistStoreError:
        why = "the database could not be asked whether the batch was stored"
        raise _uncertain(failure, key, why) from failure.__cause__
    if not rows:
        raise WriteError(
            f"{failure} while committing, and the batch was not stored",
            outcome=WriteOutcome(0, False, None),
            idempotency_key=key,
        ) from failure.__cause__
    return int(rows[0][0])


def _uncertain(failure: DatabaseFailure, key: str, why: str) -> WriteError:
    """The error of a write that may or may not be stored: ``why`` nobody knows."""
    return WriteError(
        f"{failure} while committing, and {why}; write the same batch again with its"
        " idempotency_key",
        outcome=WriteOutcome(0, True, None),
        idempotency_key=key,
    )
