"""The one place where database and driver errors become histstore errors.

Messages say the reason the database gave (``database is locked``, ``database "x" does
not exist``, ``permission denied for table ...``) but never parameters: drivers can quote
an argument's value in their text, so such texts are cut before the value.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import exc as sa_exc

from ._errors import HistStoreError

__all__ = ["DATABASE_ERRORS", "DatabaseFailure", "reason", "translate_errors"]

_driver_errors: list[type[BaseException]] = [sqlite3.Error]
try:  # asyncpg is an optional extra
    import asyncpg

    _driver_errors += [asyncpg.PostgresError, asyncpg.InterfaceError]
except ImportError:  # pragma: no cover - depends on the installation
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


class DatabaseFailure(HistStoreError):
    """The database failed an operation; ``phase`` says how far a write got.

    ``phase`` is ``"body"`` (nothing committed), ``"commit"`` (the commit was sent and
    its fate is unknown) or ``"done"`` (committed; only what came after failed).
    """

    def __init__(self, message: str, *, phase: str = "body") -> None:
        super().__init__(message)
        self.phase = phase


def reason(exc: BaseException) -> str:
    """The database's own words for a failure, without any parameter values."""
    inner: BaseException = exc
    orig = getattr(exc, "orig", None)
    if isinstance(orig, BaseException):
        inner = orig
    cause = inner.__cause__
    if cause is not None and isinstance(cause, tuple(_driver_errors)):
        inner = cause  # SQLAlchemy's adapted asyncpg errors wrap the driver's own
    text = str(inner).strip().splitlines()[0] if str(inner).strip() else ""
    if text.startswith("(") and ")" in text and isinstance(inner, sa_exc.SQLAlchemyError):
        text = text.split(")", 1)[1].strip()  # "(sqlite3.OperationalError) ..." prefix
    for marker in ("query argument", "[SQL:", "[parameters:"):
        if marker in text:
            text = text.split(marker, 1)[0].rstrip(" :($")
    if len(text) > _MAX_REASON:
        text = text[:_MAX_REASON] + "..."
    name = type(inner).__name__
    return f"{name}: {text}" if text and text != name else name


def failure(
    action: str, conversation: str | None, exc: BaseException, phase: str
) -> DatabaseFailure:
    """The ``DatabaseFailure`` for ``exc`` met while doing ``action``."""
    where = f" conversation {conversation!r}" if conversation is not None else ""
    return DatabaseFailure(f"{action}{where} failed: {reason(exc)}", phase=phase)


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
