"""Long-term memory items: JSON objects by namespace (a tuple of labels) and key, with a
time to live and embeddings, in histstore's tables (``histstore_items``,
``histstore_item_vectors``, created by its migrations).

What LangGraph's ``BaseStore`` adapter (``histstore.integrations.langgraph_store``)
keeps its items in, with no knowledge of LangGraph: the caller embeds texts and passes
vectors; this package keeps rows, JSON text and vectors.
"""

from __future__ import annotations

from . import _namespaces
from ._records import ItemWrite, StoredItem
from ._store import ItemStore

MatchRule = _namespaces.MatchRule
"""A condition on a namespace: ``("prefix" | "suffix", labels)``, ``"*"`` any label."""

__all__ = ["ItemStore", "ItemWrite", "MatchRule", "StoredItem"]
