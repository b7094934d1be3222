"""Which database a dialect speaks to: the one question the code outside this folder
asks of a dialect (everything else that differs lives in ``dialects``)."""

from __future__ import annotations

from sqlalchemy.engine import Dialect

__all__ = ["is_sqlite", "pairing"]


def is_sqlite(dialect: Dialect) -> bool:
    """Whether ``dialect`` is SQLite's (PostgreSQL's otherwise, for histstore)."""
    return dialect.name == "sqlite"


def pairing(dialect: Dialect) -> str:
    """The database and driver, as ``"sqlite+aiosqlite"`` or ``"postgresql+asyncpg"``."""
    return f"{dialect.name}+{getattr(dialect, 'driver', '')}"
