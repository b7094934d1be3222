"""How long a call may outlive its caller: the bounds on giving a call up, and the
store's client-side time limit per call (``connect(command_timeout=...)``).

A call whose caller is cancelled, or whose ``command_timeout`` expires, returns within
``GIVE_UP_BOUND`` seconds, also when the server says nothing at all (a stopped host, a
black-holed network path) or stalls in COMMIT (a synchronous standby that never
answers):

* a write transaction under way is given ``WRITE_GRACE`` seconds to end by itself
  (almost every one does, and its connection is then kept); after that the statement
  it waits for is cancelled (``_storage.completion.run_to_completion``);
* a connection whose statement was cut off is given up (``Driver.abandon``): the
  server is sent a cancel request, which gets ``ABANDON_PATIENCE`` seconds to be
  delivered, and the connection is then aborted, never closed with a wait for the
  server's goodbye, and never given back to the pool.

PostgreSQL answers a cancel request during a synchronous-replication wait by committing
locally: a write given up while committing may be stored, so its outcome is uncertain
(``WriteError`` with ``outcome.uncertain`` and the batch's ``idempotency_key``).
"""

from __future__ import annotations

import math
from typing import Any

from sqlalchemy import URL

__all__ = [
    "ABANDON_PATIENCE",
    "GIVE_UP_BOUND",
    "OPTION",
    "WRITE_GRACE",
    "CallTimeout",
    "checked_limit",
    "limit_from_url",
]

WRITE_GRACE = 0.5
"""Seconds a write transaction under way may go on after its caller gave it up."""

ABANDON_PATIENCE = 0.3
"""Seconds a given-up connection's cancel request gets to reach the server."""

GIVE_UP_BOUND = 1.0
"""The documented bound: a call returns within this many seconds of its caller's
cancellation or of its ``command_timeout`` (``WRITE_GRACE + ABANDON_PATIENCE`` and a
margin for the event loop)."""

OPTION = "command_timeout"
"""The name of the limit in ``connect()`` and in a database URL's query."""


class CallTimeout(TimeoutError):
    """A call's ``command_timeout`` expired: the store gave it up (the ``__cause__`` of
    the ``DatabaseFailure`` it raises)."""

    def __init__(self, limit: float) -> None:
        super().__init__(f"no answer from the database within command_timeout={limit:g}s")
        self.limit = limit


def checked_limit(value: Any) -> float | None:
    """``command_timeout`` as seconds (``None``: no limit).

    Raises:
        ValueError: not ``None`` nor a finite number of seconds > 0.
    """
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            raise ValueError(f"{OPTION} must be a number of seconds > 0, not {value!r}") from None
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ValueError(f"{OPTION} must be a number of seconds > 0, not {value!r}")
    return float(value)


def limit_from_url(url: URL) -> tuple[URL, float | None]:
    """``url`` without its ``command_timeout`` query parameter, and that limit.

    Raises:
        ValueError: the parameter is given twice or is not a number of seconds > 0.
    """
    if OPTION not in url.query:
        return url, None
    value = url.query[OPTION]
    if not isinstance(value, str):
        raise ValueError(f"the URL parameter {OPTION!r} is given more than once")
    return url.difference_update_query([OPTION]), checked_limit(value)
