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
    """The channel's name."""
    version: str
    """The channel's version this value is."""
    type: str
    """The serializer's type tag (LangGraph's ``serde`` pair)."""
    blob: bytes | None
    base: str | None = None


@dataclass(frozen=True, slots=True)
class ItemText:
    """What the text search finds an item of a list channel by: the item's index in the
    channel's value, its role and its text (``store.search`` names the thread)."""

    channel: str
    """The list channel (e.g. ``messages``)."""
    idx: int
    """The item's index in the channel's value."""
    role: str
    """The item's role, as a conversation's message has it."""
    text: str
    """The item's text, as ``indexed_text`` reads a message's."""


@dataclass(frozen=True, slots=True)
class Write:
    """One pending write of a task: its index, channel and serialized value."""

    task_id: str
    """The task that made the write."""
    idx: int
    """The write's index within the task (LangGraph's; negative for special writes)."""
    channel: str
    """The channel written."""
    type: str
    """The serializer's type tag of ``blob``."""
    blob: bytes
    """The serialized value."""
    task_path: str = ""
    """The task's path, which orders writes of different tasks."""


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
    """The thread's id."""
    checkpoint_ns: str
    """The namespace (``""``: the root graph)."""
    checkpoint_id: str
    """The checkpoint's id."""
    parent_checkpoint_id: str | None
    """The id of the checkpoint it follows; ``None``: the first."""
    type: str
    """The serializer's type tag of ``checkpoint``."""
    checkpoint: bytes
    """The serialized checkpoint."""
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
