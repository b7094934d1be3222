"""SQLite files: made readable by their owner only, and copied whole while in use.

Chat history is personal data, so a database file histstore creates is ``0600``
(``create_private``) whatever the process's umask; SQLite gives the ``-wal`` and ``-shm``
files it creates next to a database the database file's permissions, so they are
``0600`` too. A file that already exists keeps the permissions its owner gave it.

``backup`` copies a database with SQLite's online backup API while other connections
and processes write to it: the copy is taken in one step, that is inside one read
transaction, so it is the database as one commit left it (in WAL mode writers are not
held up meanwhile), then checked (``PRAGMA integrity_check`` and, where histstore's
full-text index exists, FTS5's ``integrity-check``) under a temporary name and only then
given its name. These functions block: call them off the event loop.
"""

from __future__ import annotations

import os
import sqlite3
from contextlib import closing, suppress
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from .._errors import HistStoreError

__all__ = ["PRIVATE_MODE", "BackupResult", "backup", "check", "create_private"]

PRIVATE_MODE = 0o600
"""The permissions of a database file histstore creates: its owner reads and writes."""
FTS_TABLE = "histstore_messages_fts"
"""SQLite's full-text index (``statements.search``); checked when the copy has it."""


def create_private(path: str | os.PathLike[str]) -> bool:
    """Create ``path`` as an empty file with ``PRIVATE_MODE`` unless something is there
    (an empty file is an empty SQLite database). Whether it created the file.

    A missing directory or a refused creation is left for SQLite to report when it opens
    the path, as it always did.
    """
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE_MODE)
    except OSError:
        return False
    try:
        os.fchmod(fd, PRIVATE_MODE)  # the umask may have taken bits away, never added
    finally:
        os.close(fd)
    return True


@dataclass(frozen=True)
class BackupResult:
    """A finished backup: where it is, its size, and what it holds."""

    path: Path
    """The backup file."""
    bytes: int
    """Its size in bytes."""
    conversations: int
    """The conversations it holds."""
    messages: int
    """The messages it holds."""


def backup(
    source: str | os.PathLike[str], dest: str | os.PathLike[str], busy_timeout: float
) -> BackupResult:
    """Copy the SQLite database ``source`` to the new file ``dest`` (``0600``) and check
    the copy; ``busy_timeout``: seconds to wait for a lock (a writer checkpointing).

    The copy holds what the last commit before it began held, and is in rollback-journal
    mode: one self-contained file (a store opening it turns WAL on again).

    Raises:
        HistStoreError: ``source`` is not a file, ``dest`` exists, the copy fails its
            check, or SQLite fails (its reason is said). Nothing is left at ``dest``
            unless the backup succeeded.
    """
    source, dest = Path(source), Path(dest)
    if not source.is_file():
        raise HistStoreError(f"no SQLite database at {source} to back up")
    if dest.exists():
        raise HistStoreError(f"{dest} exists: a backup is written to a new file")
    partial = dest.with_name(f".{dest.name}.partial-{os.getpid()}")
    if not create_private(partial):
        raise HistStoreError(f"cannot create {partial} (does its directory exist?)")
    try:
        found = _copy_and_check(source, partial, busy_timeout)
        if dest.exists():  # made by someone else meanwhile: never replaced
            raise HistStoreError(f"{dest} exists: a backup is written to a new file")
        os.replace(partial, dest)
    except sqlite3.Error as exc:
        raise HistStoreError(f"backing up {source} failed: {exc}") from exc
    finally:
        for leftover in (
            partial,
            *(Path(f"{partial}{end}") for end in ("-wal", "-shm", "-journal")),
        ):
            with suppress(FileNotFoundError):
                leftover.unlink()
    return BackupResult(dest, dest.stat().st_size, *found)


def _copy_and_check(source: Path, partial: Path, busy_timeout: float) -> tuple[int, int]:
    """Back ``source`` up into ``partial`` and check it (``check``)."""
    uri = f"file:{quote(str(source.resolve()))}?mode=ro"  # reads only; never creates it
    with (
        closing(sqlite3.connect(uri, uri=True, timeout=busy_timeout)) as src,
        closing(sqlite3.connect(partial, timeout=busy_timeout)) as dst,
    ):
        src.backup(dst)  # pages=-1: one step, one read transaction, one commit's state
        dst.execute("PRAGMA journal_mode=DELETE").fetchall()
        return check(dst, f"the copy of {source}")


def check(conn: sqlite3.Connection, what: str) -> tuple[int, int]:
    """Run ``PRAGMA integrity_check`` and, when the database has histstore's full-text
    index, FTS5's ``integrity-check`` (the index's own consistency; messages still on
    its pending list are indexed by the next store that writes or searches). The
    database's conversations and messages.

    Raises:
        HistStoreError: a check failed (``what`` names the database, the message the
            first problems found).
    """
    try:
        problems = [str(row[0]) for row in conn.execute("PRAGMA integrity_check").fetchall()]
    except sqlite3.DatabaseError as exc:  # damaged where the check itself must read
        problems = [str(exc)]
    if problems != ["ok"]:
        raise HistStoreError(f"{what} failed its integrity check: {'; '.join(problems[:5])}")
    tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if FTS_TABLE in tables:
        try:
            conn.execute(f"INSERT INTO {FTS_TABLE}({FTS_TABLE}) VALUES ('integrity-check')")  # noqa: S608 - a constant
        except sqlite3.Error as exc:
            raise HistStoreError(
                f"{what} failed the full-text index's integrity check: {exc}"
            ) from exc
        finally:
            conn.rollback()
    if "histstore_conversations" not in tables:
        return 0, 0
    conversations, messages = conn.execute(
        "SELECT count(*), coalesce(sum(length), 0) FROM histstore_conversations"
    ).fetchone()
    return int(conversations), int(messages)
