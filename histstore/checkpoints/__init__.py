"""Checkpoint storage for agent frameworks that keep their state as checkpoints.

``CheckpointStore(store)`` keeps LangGraph-style checkpoints (serialized checkpoints,
channel values by version, pending writes) in the store's database, in histstore's own
tables and migrations. ``histstore.integrations.langgraph.HiststoreSaver`` is built on
it; it is public so other adapters can be too.
"""

from ._storage import Blob as Blob
from ._storage import CheckpointStore as CheckpointStore
from ._storage import StoredCheckpoint as StoredCheckpoint
from ._storage import Write as Write

__all__ = ["Blob", "CheckpointStore", "StoredCheckpoint", "Write"]
