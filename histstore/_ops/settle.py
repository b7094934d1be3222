"""Settling a write whose commit was sent but whose fate was lost.

Every batch is recorded under an idempotency key in its own transaction, so whether
the batch is stored is one question to the database: is that key recorded?
"""

from __future__ import annotations

from .._core.models import WriteOutcome
from .._errors import HistStoreError, WriteError
from .._storage.dberrors import DatabaseFailure
from .context import Context

__all__ = ["was_stored"]


async def was_stored(ctx: Context, conversation: str, key: str, failure: DatabaseFailure) -> int:
    """After a commit of unknown fate: the conversation's length when the batch is stored.

    Raises:
        WriteError: ``accepted=0, uncertain=False`` when the database answers that the
            batch is not stored; ``uncertain=True`` when it cannot be asked. Either way
            its ``__context__`` is ``failure``, the failure its message names.
    """
    try:
        rows = await ctx.executor.fetch(
            ctx.sql.settled, {"c": conversation, "key": key}, action="settle"
        )
    except HistStoreError:
        rows = None
    if rows is None:
        # Raised outside the handler, so that the error's ``__context__`` is the commit's
        # failure its message names, not the settling read's (whose SQLSTATE differs).
        error = WriteError(
            f"{failure} while committing, and the database could not be asked whether the"
            " batch was stored; write the same batch again with its idempotency_key",
            outcome=WriteOutcome(0, True, None),
            idempotency_key=key,
        )
        error.__context__ = failure
        raise error from failure.__cause__
    if not rows:
        raise WriteError(
            f"{failure} while committing, and the batch was not stored",
            outcome=WriteOutcome(0, False, None),
            idempotency_key=key,
        ) from failure.__cause__
    return int(rows[0][0])
