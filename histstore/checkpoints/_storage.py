"""Checkpoint storage: every statement on the ``histstore_checkpoint*`` tables.

LangGraph's checkpoints as rows, with no knowledge of LangGraph itself: the caller (the
adapter in ``histstore.integrations.langgraph``) serializes and deserializes; this module
keeps bytes, JSON text and ids. ``CheckpointStore`` combines its parts: writes
(``checkpoints._writes``), reads and listing (``checkpoints._reads``), thread operations
(``checkpoints._threads``) and the catalog of threads for tools (``checkpoints._catalog``),
over the values of ``checkpoints._records``. The layout:

* ``histstore_checkpoint_threads``: one row per thread, with its owner. Every write
  upserts it first, which locks the thread (on SQLite the ``BEGIN IMMEDIATE`` write lock
  already serializes writers: the row is read, and rewritten at most once a second), so
  the writes of one thread never interleave.
* ``histstore_checkpoints``: one row per checkpoint, keyed ``(thread_id, checkpoint_ns,
  checkpoint_id)``. LangGraph's checkpoint ids grow with time, so the newest checkpoint
  of a namespace is the last entry of the primary key's range: reading it is one index
  probe however many checkpoints the thread holds.
* ``histstore_checkpoint_blobs``: channel values by ``(channel, version)``, written when
  a channel changes and shared by every later checkpoint that holds that version. A
  value with a ``base`` holds only what it adds to the value at that version (the
  caller decides what it stores so); it is stored only while its base is, and deletes
  keep every version a kept value extends.
* ``histstore_checkpoint_channels``: which version of each channel a checkpoint reads,
  keyed by checkpoint, so its values are found by primary key.
* ``histstore_checkpoint_writes``: pending writes, keyed by checkpoint, task and index.

Reading one checkpoint (``get``) is a single statement, atomic by itself, that finds the
checkpoint's id once by index and fetches its row, values (with the versions they
extend) and writes together; listing reads a page per such statement. ``put`` and
``put_writes`` are each one write transaction of compiled statements (on SQLite one
trip to the connection's thread; on Postgres each is one statement, its own transaction,
one round trip). Every transaction runs to its end when the caller is cancelled.
"""

from __future__ import annotations

from .._storage.calls import OneCall, span_methods
from ._catalog import CheckpointInfo, ThreadInfo
from ._reads import CheckpointReads
from ._records import Blob, ItemText, StoredCheckpoint, Write
from ._threads import ThreadOperations
from ._writes import CheckpointWrites

__all__ = [
    "Blob",
    "CheckpointInfo",
    "CheckpointStore",
    "ItemText",
    "StoredCheckpoint",
    "ThreadInfo",
    "Write",
]


class CheckpointStore(CheckpointWrites, CheckpointReads, ThreadOperations, OneCall):
    """LangGraph checkpoints, pending writes and channel values in a store's database.

    Runs through the store's executor (its transactions, settings and schema); a scoped store
    (``store.user`` set) confines every call to the threads that user owns: threads it
    creates are owned by the user, and another owner's thread (or one owned by no one)
    behaves as if it did not exist (reads find nothing, deletes do nothing, writes and
    copies from it raise ``NotFound``). Thread ids follow histstore's id rules; callers
    validate them.

    Each coroutine method is one call of the store for ``close()`` (``Store.close``: a
    ``close()`` that begins while it runs waits for it; one begun after refuses it
    before it touches anything); ``list`` is not, each page it reads is (as
    ``Store.stream``'s); ``one_call`` makes several methods one.

    Raises (every method): ``HistStoreError`` for database failures, with the driver's
    exception as ``__cause__``.
    """


span_methods(CheckpointStore, lambda storage: storage._executor.calls, but=())  # noqa: SLF001
