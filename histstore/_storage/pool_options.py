"""How many server connections a store may hold, and how long it waits for one.

Three options, given to ``connect()`` or as query parameters of a ``postgresql://`` URL
(``?pool_size=2&max_overflow=3&refused_wait=30``); a ``connect()`` argument wins over
the URL's parameter:

* ``pool_size``: connections the store keeps open while idle.
* ``max_overflow``: connections it may open beyond those under load; each is closed
  as soon as its call ends. A store never holds more than ``pool_size + max_overflow``.
* ``refused_wait``: seconds a connection the server refuses for now (too many
  connections, starting up) is waited for before the call fails
  (``_storage.refusals``).

The PostgreSQL defaults are sized for a server shared by several processes (a managed
server allows 25-100 connections for all of them): a busy store sends at most two
appends and two reads at a time, each carrying every concurrent caller's
(``_storage.statement_groups``), so two kept connections serve it, and three more take
the other calls (listings, searches, transactions) of a burst. Ten processes then keep
20 connections and hold at most 50 under load, and a process that finds the server
full goes on with the connections it has while its new ones wait (see
docs/deploying-postgres.md for sizing). SQLite connections cost no server, so an SQLite
file keeps the larger pool it always had.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from sqlalchemy import URL

__all__ = [
    "DEFAULT_REFUSED_WAIT",
    "URL_PARAMS",
    "PoolOptions",
    "capacity",
    "checked",
    "pool_arguments",
    "pool_options",
]

URL_PARAMS = ("pool_size", "max_overflow", "refused_wait")
"""The query parameters of a ``postgresql://`` URL that set these options."""

POSTGRES_POOL = (2, 3)
"""``pool_size`` and ``max_overflow`` on PostgreSQL unless set (module doc)."""

SQLITE_POOL = (20, 20)
"""``pool_size`` and ``max_overflow`` on an SQLite file unless set."""

DEFAULT_REFUSED_WAIT = 30.0
"""Seconds a refused connection is waited for unless set: longer than a server's
restart, short enough that a server that stays full is reported."""


@dataclass(frozen=True)
class PoolOptions:
    """The options as given (``None``: not given, see ``resolved``)."""

    pool_size: int | None = None
    max_overflow: int | None = None
    refused_wait: float | None = None

    def over(self, other: PoolOptions) -> PoolOptions:
        """These options, with ``other``'s where these are not given."""
        return PoolOptions(
            self.pool_size if self.pool_size is not None else other.pool_size,
            self.max_overflow if self.max_overflow is not None else other.max_overflow,
            self.refused_wait if self.refused_wait is not None else other.refused_wait,
        )

    @property
    def wait(self) -> float:
        """``refused_wait``, or its default."""
        return DEFAULT_REFUSED_WAIT if self.refused_wait is None else self.refused_wait


def checked(
    pool_size: object = None, max_overflow: object = None, refused_wait: object = None
) -> PoolOptions:
    """``PoolOptions`` from ``connect()``'s arguments.

    Raises:
        ValueError: ``pool_size`` is not an int >= 1, ``max_overflow`` not an int >= 0,
            or ``refused_wait`` not a finite number of seconds >= 0.
    """
    for name, value, least in (("pool_size", pool_size, 1), ("max_overflow", max_overflow, 0)):
        if value is not None and (
            not isinstance(value, int) or isinstance(value, bool) or value < least
        ):
            raise ValueError(f"{name} must be an int >= {least}")
    if refused_wait is not None and (
        not isinstance(refused_wait, (int, float))
        or isinstance(refused_wait, bool)
        or not math.isfinite(refused_wait)
        or refused_wait < 0
    ):
        raise ValueError("refused_wait must be a number of seconds >= 0")
    return PoolOptions(
        pool_size,  # type: ignore[arg-type]
        max_overflow,  # type: ignore[arg-type]
        None if refused_wait is None else float(refused_wait),
    )


def pool_options(url: URL) -> PoolOptions:
    """The options a ``postgresql://`` URL's query parameters set (none for others).

    Raises:
        ValueError: a parameter given twice or with a bad value (the message names it).
    """
    if url.get_backend_name() != "postgresql":
        return PoolOptions()
    found: dict[str, Any] = {}
    for name in URL_PARAMS:
        if name not in url.query:
            continue
        text = url.query[name]
        if not isinstance(text, str):
            raise ValueError(f"the URL parameter {name!r} is given more than once")
        try:
            found[name] = float(text) if name == "refused_wait" else int(text.strip())
        except ValueError:
            raise ValueError(f"the URL parameter {name} is not a number: {text!r}") from None
    return checked(**found)


def pool_arguments(options: PoolOptions, *, sqlite: bool) -> dict[str, int]:
    """``create_async_engine``'s pool arguments for ``options`` (defaults filled in)."""
    size, overflow = SQLITE_POOL if sqlite else POSTGRES_POOL
    return {
        "pool_size": size if options.pool_size is None else options.pool_size,
        "max_overflow": overflow if options.max_overflow is None else options.max_overflow,
    }


def capacity(options: PoolOptions, *, sqlite: bool) -> int:
    """The most connections a pool made with ``options`` holds at once."""
    return sum(pool_arguments(options, sqlite=sqlite).values())
