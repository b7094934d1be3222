"""The one place where database and driver errors become histstore errors.

Messages say the reason the database gave (``database is locked``, ``database "x" does
not exist``, ``permission denied for table ...``) and, on PostgreSQL, its SQLSTATE, but
never parameters: drivers can quote an argument's value in their text, so such texts are
cut before the value.

Two kinds of failure matter to the caller beyond their text (see ``DatabaseFailure``):

* **the way to the server is gone** (``connection_lost``): the connection was refused,
  reset or closed, the server is shutting down, starting up, in recovery or out of
  connections (SQLSTATE classes 08 and 57P0x, 53300, a FATAL message, the driver's own
  "connection closed" and protocol-state errors, ``OSError``). Such a connection is
  never reused; a statement on it may or may not have reached the server.
* **the server cancelled the statement** (``cancelled``): a lock timeout (55P03), a
  statement timeout or cancel request (57014), a deadlock (40P01) or a serialization
  failure (40001). The server answered, so its transaction ended uncommitted.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import exc as sa_exc

from .._errors import HistStoreError

__all__ = [
    "DATABASE_ERRORS",
    "READ_ONLY_SQLSTATE",
    "DatabaseFailure",
    "cancelled",
    "connection_lost",
    "failure",
    "mark_hot_standby",
    "not_committed",
    "reason",
    "translate_errors",
]

_driver_errors: list[type[BaseException]] = [sqlite3.Error]
_lost_errors: list[type[BaseException]] = [OSError, sa_exc.DisconnectionError]
_lost_exact: tuple[type[BaseException], ...] = ()
"""Exact classes that mean a lost connection (not their subclasses)."""
_unsent: tuple[type[BaseException], ...] = ()
"""Errors the driver raises before it sends anything (see ``not_committed``), besides
the exact classes of ``_lost_exact``."""
try:  # asyncpg is an optional extra
    import asyncpg

    # InternalClientError: the driver's protocol met a state it did not expect (e.g.
    # "cannot switch to state 12" after the server ended the session).
    _internal = asyncpg.exceptions.InternalClientError
    _driver_errors += [asyncpg.PostgresError, asyncpg.InterfaceError, _internal]
    _lost_errors.append(_internal)
    # A plain InterfaceError is "connection is closed" or "another operation is in
    # progress"; its subclasses are about the arguments, not the connection.
    _lost_exact = (asyncpg.InterfaceError,)
    # asyncpg raises both before it writes a statement: an operation starts only on an
    # open connection whose protocol is idle.
    _unsent = (_internal,)
except ImportError:  # pragma: no cover - depends on the installation
    pass
try:
    # What SQLAlchemy's asyncpg dialect raises when it opens a connection (e.g. "the
    # database system is shutting down"): an emulated DB-API error, not a SQLAlchemyError.
    from sqlalchemy.dialects.postgresql.asyncpg import AsyncAdapt_asyncpg_dbapi

    _driver_errors.append(AsyncAdapt_asyncpg_dbapi.Error)
except ImportError:  # pragma: no cover - depends on the SQLAlchemy version
    pass

DATABASE_ERRORS: tuple[type[BaseException], ...] = (
    sa_exc.SQLAlchemyError,
    OSError,
    ConnectionError,
    TimeoutError,
    *_driver_errors,
)
"""Every failure of the database or the way to it."""

_MAX_REASON = 300

_CANCELLED = {
    "55P03": "lock timeout",
    "57014": "statement timeout or cancel request",
    "40P01": "deadlock",
    "40001": "serialization failure",
}
"""SQLSTATEs of a statement the server cancelled, and what cancelled it."""

_LOST_STATES = ("57P01", "57P02", "57P03", "57P04", "57P05", "53300")
"""Server states that end or refuse a session: shutdown (administrator command, crash,
immediate), cannot connect now (starting up, shutting down, in recovery), database
dropped, idle session timeout, too many connections. Class 08 (connection exception)
is lost too."""


READ_ONLY_SQLSTATE = "25006"
"""A write refused by a read-only transaction: on a hot standby (a server in recovery),
or where ``default_transaction_read_only`` is on."""
_HOT_STANDBY = "histstore_hot_standby"
"""The attribute ``mark_hot_standby`` sets on a driver's exception."""


def mark_hot_standby(exc: BaseException) -> None:
    """Record that ``exc``, a read-only refusal, came from a hot standby (the driver
    knows it from the session; ``failure`` then says so)."""
    setattr(exc, _HOT_STANDBY, True)


def _read_only(exc: BaseException) -> str | None:
    """What to tell of a write the server refused as read-only, or ``None``."""
    if sqlstate(exc) != READ_ONLY_SQLSTATE:
        return None
    inner = _inner(exc)
    if getattr(inner, _HOT_STANDBY, False) or getattr(exc, _HOT_STANDBY, False):
        return (
            "the server is a hot standby (a read-only server in recovery); write to the"
            " primary (a multi-host URL with target_session_attrs=read-write finds it)"
        )
    return (
        "the server accepts no writes in this session (a hot standby, or"
        " default_transaction_read_only is on); write to the primary"
    )


class DatabaseFailure(HistStoreError):
    """The database could not do an operation; nothing the message names was changed
    unless ``phase`` says otherwise.

    Raised by every call (a ``write`` raises ``WriteError`` instead, with ``.outcome``
    and the ``DatabaseFailure`` as ``__context__``). The message names the operation, the
    conversation, the server's reason and, on PostgreSQL, its SQLSTATE; the driver's
    exception is ``__cause__``.

    Attributes:
        phase: how far a write got: ``"body"`` (not committed), ``"commit"`` (the
            commit was sent and its answer lost) or ``"done"`` (committed; only what
            came after failed).
        sqlstate: the server's SQLSTATE (PostgreSQL), else ``None``.
        transient: the failure is about the server's state or the way to it, not the
            call: the connection was lost or refused, the server was shutting down,
            starting up, in recovery or out of connections, or it cancelled the
            statement (lock or statement timeout, cancel request, deadlock,
            serialization failure). The same call can succeed later; retry it after a
            pause (a write with its ``idempotency_key``).
    """

    def __init__(
        self,
        message: str,
        *,
        phase: str = "body",
        sqlstate: str | None = None,
        transient: bool = False,
    ) -> None:
        super().__init__(message)
        self.phase = phase
        self.sqlstate = sqlstate
        self.transient = transient


def _inner(exc: BaseException) -> BaseException:
    """The driver's own exception inside SQLAlchemy's wrappers, when there is one."""
    inner: BaseException = exc
    orig = getattr(exc, "orig", None)
    if isinstance(orig, BaseException):
        inner = orig
    cause = inner.__cause__
    if cause is not None and isinstance(cause, tuple(_driver_errors)):
        inner = cause  # SQLAlchemy's adapted asyncpg errors wrap the driver's own
    return inner


def sqlstate(exc: BaseException) -> str | None:
    """The SQLSTATE PostgreSQL (or asyncpg, for its own errors) gave ``exc``."""
    for candidate in (_inner(exc), exc):
        code = getattr(candidate, "sqlstate", None)
        if isinstance(code, str) and code:
            return code
    return None


def connection_lost(exc: BaseException) -> bool:
    """Whether ``exc`` means the connection is unusable or could not be opened."""
    inner = _inner(exc)
    if isinstance(exc, sa_exc.DBAPIError) and exc.connection_invalidated:
        return True
    if isinstance(inner, tuple(_lost_errors)) or isinstance(exc, tuple(_lost_errors)):
        return True
    if type(inner) in _lost_exact:
        return True
    if isinstance(inner, (TimeoutError, asyncio.TimeoutError)):
        return True  # connecting took longer than connect_timeout
    if getattr(inner, "severity_en", None) in ("FATAL", "PANIC") or getattr(
        inner, "severity", None
    ) in ("FATAL", "PANIC"):
        return True  # the server ended the session
    code = sqlstate(exc)
    return code is not None and (code.startswith("08") or code in _LOST_STATES)


def cancelled(exc: BaseException) -> str | None:
    """What made the server cancel the statement (``"lock timeout"``, ...), or ``None``."""
    code = sqlstate(exc)
    return None if code is None or connection_lost(exc) else _CANCELLED.get(code)


def not_committed(exc: BaseException) -> bool:
    """Whether ``exc``, met by a statement that commits (a COMMIT, or a statement that is
    its own transaction), proves that nothing was committed.

    True when the PostgreSQL server answered the statement with an error and the session
    lives on (a cancelled statement, a refused COMMIT: the transaction ended
    uncommitted), and when the driver refused to send it (asyncpg's "connection is
    closed", "another operation is in progress" and protocol-state errors). A lost
    answer (the connection reset or closed, a FATAL message such as a shutdown, which
    can follow a local commit) proves nothing.
    """
    inner = _inner(exc)
    if type(inner) in _lost_exact or isinstance(inner, _unsent):
        return True
    return sqlstate(exc) is not None and not connection_lost(exc)


def reason(exc: BaseException) -> str:
    """The database's own words for a failure, without any parameter values."""
    inner = _inner(exc)
    text = str(inner).strip().splitlines()[0] if str(inner).strip() else ""
    if text.startswith("(") and ")" in text and isinstance(inner, sa_exc.SQLAlchemyError):
        text = text.split(")", 1)[1].strip()  # "(sqlite3.OperationalError) ..." prefix
    for marker in ("query argument", "[SQL:", "[parameters:"):
        if marker in text:
            text = text.split(marker, 1)[0].rstrip(" :($")
    if len(text) > _MAX_REASON:
        text = text[:_MAX_REASON] + "..."
    name = type(inner).__name__
    said = f"{name}: {text}" if text and text != name else name
    code = sqlstate(exc)
    return f"{said} (SQLSTATE {code})" if code else said


def failure(
    action: str, conversation: str | None, exc: BaseException, phase: str
) -> DatabaseFailure:
    """The ``DatabaseFailure`` for ``exc`` met while doing ``action``."""
    where = f" conversation {conversation!r}" if conversation is not None else ""
    why = cancelled(exc)
    lost = connection_lost(exc)
    what = reason(exc)
    read_only = _read_only(exc)
    if why is not None:
        what = f"cancelled by the server ({why}): {what}"
    elif read_only is not None:
        what = f"{read_only}: {what}"
    elif lost:
        what = f"the database is unavailable or the connection was lost: {what}"
    return DatabaseFailure(
        f"{action}{where} failed: {what}",
        phase=phase,
        sqlstate=sqlstate(exc),
        transient=lost or why is not None,
    )


@contextmanager
def translate_errors(action: str, conversation: str | None = None) -> Iterator[None]:
    """Re-raise database errors met inside the block as ``DatabaseFailure``.

    ``action`` says what was being done ("read", "clear", ...); the message names the
    conversation when there is one.
    """
    try:
        yield
    except HistStoreError:
        raise
    except DATABASE_ERRORS as exc:
        raise failure(action, conversation, exc, "body") from exc
