"""What the item storage takes and gives: plain values, no SQL."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

__all__ = ["ItemWrite", "StoredItem"]


@dataclass(frozen=True)
class StoredItem:
    """An item as stored; ``score`` is its similarity to a search's query (else ``None``);
    ``ttl`` its time to live in minutes (``None``: it never expires)."""

    namespace: tuple[str, ...]
    """The item's namespace, its labels in order."""
    key: str
    """The item's key within its namespace."""
    value: dict[str, Any]
    """The JSON object stored."""
    created_at: datetime
    """When the item was first put (UTC)."""
    updated_at: datetime
    """When it was last put (UTC)."""
    ttl: float | None = None
    score: float | None = None


@dataclass(frozen=True)
class ItemWrite:
    """Store ``value`` at (``namespace``, ``key``) with these ``vectors`` (field, vector),
    replacing any item and vectors there; ``value=None`` deletes the item. ``ttl`` in
    minutes (``None``: never expires)."""

    namespace: tuple[str, ...]
    key: str
    value: Mapping[str, Any] | None
    ttl: float | None = None
    vectors: Sequence[tuple[str, Sequence[float]]] = ()
