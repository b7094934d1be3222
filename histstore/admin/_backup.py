"""``histstore.admin.backup``: a consistent copy of an SQLite store, taken while it is
in use (SQLite's online backup API, through ``_storage.sqlite_files``)."""

from __future__ import annotations

import asyncio
import os

from .._errors import HistStoreError
from .._storage import sqlite_files
from .._storage.sqlite_files import BackupResult
from ._database import Target, locate

__all__ = ["BackupResult", "backup"]

POSTGRES_BACKUPS = (
    "histstore backup copies SQLite files; back up a PostgreSQL database with pg_dump"
    " (pg_dump -Fc, restored with pg_restore) or the server's own backups"
)


async def backup(
    target: Target, dest: str | os.PathLike[str], *, busy_timeout: float = 30.0
) -> BackupResult:
    """Copy the SQLite store at ``target`` (a path or ``sqlite://`` URL) to the new file
    ``dest``, while other tasks and processes go on writing to it.

    The copy is the database as one commit left it (every acknowledged write before the
    copy began, none half), readable by its owner only (``0600``), checked with
    ``PRAGMA integrity_check`` and the full-text index's ``integrity-check`` before it
    is given its name, and a single file (rollback-journal mode; a store opening it
    turns WAL on again). ``busy_timeout``: seconds to wait for a lock.

    Raises:
        HistStoreError: ``target`` is a PostgreSQL database (use ``pg_dump``) or an
            in-memory one, it does not exist, ``dest`` exists, or the copy failed or
            failed its check (nothing is left at ``dest``).
        ValueError: ``target`` is not a path or URL histstore supports.
    """
    where = locate(target)
    if where.file is None:
        if where.display.startswith("postgresql"):
            raise HistStoreError(f"{where.display}: {POSTGRES_BACKUPS}")
        raise HistStoreError("an in-memory SQLite database has no file to back up")
    return await asyncio.to_thread(sqlite_files.backup, where.file, dest, busy_timeout)
