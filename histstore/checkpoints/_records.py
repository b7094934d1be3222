"""Checkpoint records: the values the checkpoint storage takes and returns."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

__all__ = ["Blob", "ItemText", "StoredCheckpoint", "Write", "as_bytes", "with_parts"]


@dataclass(frozen=True, slots=True)
class Blob:
    """A channel's serialized value at one version (``blob`` is ``None`` for an empty one).

    With ``base`` set, the value extends the channel's value at version ``base`` (of the
    same thread and namespace): ``blob`` is the serialized list of the items that follow
    that value's items.
    """

    channel: str
    version: str
    type: str
    blob: bytes | None
    base: str | None = None


@dataclass(frozen=True, slots=True)
class ItemText:
    """What the text search finds an item of a list channel by: the item's index in the
    channel's value, its role and its text (``store.search`` names the thread)."""

    channel: str
    idx: int
    role: str
    text: str


@dataclass(frozen=True, slots=True)
class Write:
    """One pending write of a task: its index, channel and serialized value."""

    task_id: str
    idx: int
    channel: str
    type: str
    blob: bytes
    task_path: str = ""


@dataclass(frozen=True, slots=True)
class StoredCheckpoint:
    """A checkpoint as stored, with the channel values it reads and its pending writes.

    ``metadata`` is the JSON text given to ``put``; ``values`` holds one ``Blob`` per
    channel version the checkpoint listed in ``put(blobs=...)`` that is stored (after a
    checkpoint was stored again with fewer channels, possibly more: match versions),
    and every version those extend (``Blob.base``, down to a full value; ``channels``
    says which version each channel reads); ``writes`` are in LangGraph's order (task
    path, task id, index).
    """

    thread_id: str
    checkpoint_ns: str
    checkpoint_id: str
    parent_checkpoint_id: str | None
    type: str
    checkpoint: bytes
    metadata: str
    values: tuple[Blob, ...]
    writes: tuple[Write, ...]
    channels: tuple[tuple[str, str], ...] = ()
    """(channel, version) of each value the checkpoint reads, by channel."""


def as_bytes(value: Any) -> bytes | None:
    """A stored value as ``bytes`` (drivers give ``memoryview`` too); ``None`` stays."""
    return None if value is None else bytes(value)


def with_parts(
    row: StoredCheckpoint, values: Iterable[Blob], writes: Iterable[Write]
) -> StoredCheckpoint:
    """``row`` with its values by channel and its writes in LangGraph's order."""
    return replace(
        row,
        values=tuple(sorted(values, key=lambda b: b.channel)),
        writes=tuple(sorted(writes, key=lambda w: (w.task_path, w.task_id, w.idx))),
    )
