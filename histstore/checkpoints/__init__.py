"""Checkpoint storage for agent frameworks that keep their state as checkpoints.

``CheckpointStore(store)`` keeps LangGraph-style checkpoints (serialized checkpoints,
channel values by version, pending writes) in the store's database, in histstore's own
tables and migrations. ``histstore.integrations.langgraph.HiststoreSaver`` is built on
it; it is public so other adapters can be too. ``threads()``, ``thread()``,
``checkpoints()``, ``prune()`` and ``purge()`` serve tools (``histstore threads``).
"""

from ._storage import Blob as Blob
from ._storage import CheckpointInfo as CheckpointInfo
from ._storage import CheckpointStore as CheckpointStore
from ._storage import ItemText as ItemText
from ._storage import StoredCheckpoint as StoredCheckpoint
from ._storage import ThreadInfo as ThreadInfo
from ._storage import Write as Write

__all__ = [
    "Blob",
    "CheckpointInfo",
    "CheckpointStore",
    "ItemText",
    "StoredCheckpoint",
    "ThreadInfo",
    "Write",
]
