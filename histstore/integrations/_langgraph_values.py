"""How ``HiststoreSaver`` stores a growing list as the items it adds: which list value a
channel last held (``RecentValues``), and rebuilding a value from the versions it extends
(``rebuild``, with ``SharedItems`` decoding each part once per listing)."""

from __future__ import annotations

import copy
import operator
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from histstore import HistStoreError
from histstore.checkpoints import Blob, StoredCheckpoint

__all__ = ["SNAPSHOT_EVERY", "ChannelKey", "Recent", "RecentValues", "SharedItems", "rebuild"]


def rebuild(
    loads: Callable[[tuple[str, bytes]], Any],
    found: Mapping[tuple[str, str], Blob],
    blob: Blob,
    stored: StoredCheckpoint,
    shared: SharedItems | None,
) -> tuple[Any, int]:
    """A channel's value from its blob and the versions it extends; and how many
    extensions there were (0 for a value stored whole)."""
    chain = [blob]
    while blob.base is not None:
        base = found.get((blob.channel, blob.base))
        if base is None or len(chain) > len(found):
            raise HistStoreError(
                f"thread {stored.thread_id!r}: channel {blob.channel!r} at version"
                f" {blob.version!r} extends version {blob.base!r}, which is not stored"
            )
        chain.append(base)
        blob = base
    if len(chain) == 1:
        return loads((blob.type, blob.blob or b"")), 0
    value: list[Any] = []
    for part in reversed(chain):
        items = _items(loads, part, stored, shared)
        if type(items) is not list:
            raise HistStoreError(
                f"thread {stored.thread_id!r}: channel {part.channel!r} at version"
                f" {part.version!r} is extended by later versions but is not a list"
            )
        value.extend(items)
    return value, len(chain) - 1


def _items(
    loads: Callable[[tuple[str, bytes]], Any],
    blob: Blob,
    stored: StoredCheckpoint,
    shared: SharedItems | None,
) -> Any:
    def decode() -> Any:
        return loads((blob.type, blob.blob or b""))

    if shared is None:
        return decode()
    key = (stored.thread_id, stored.checkpoint_ns, blob.channel, blob.version)
    return shared.items(key, decode)


class SharedItems:
    """The list values one listing decoded, by thread, namespace, channel and version.

    Checkpoints of one thread listed together mostly extend the same values: each is
    decoded once, and a later checkpoint that holds it gets shallow copies of its items
    (``copy.copy``: a message of its own, whose nested values, such as a message's
    ``additional_kwargs``, it shares with the other checkpoints of the listing).
    """

    def __init__(self) -> None:
        self._seen: dict[tuple[str, str, str, str], tuple[Any, ...]] = {}

    def items(self, key: tuple[str, str, str, str], decode: Callable[[], Any]) -> Any:
        seen = self._seen.get(key)
        if seen is None:
            value = decode()
            if type(value) is list:
                self._seen[key] = tuple(value)
            return value
        try:
            return [copy.copy(item) for item in seen]
        except (TypeError, copy.Error):  # an item that cannot be copied: decode again
            return decode()


ChannelKey = tuple[str, str, str]
"""(thread id, checkpoint namespace, channel)."""

SNAPSHOT_EVERY = 16
"""A list value is stored whole at least once every this many versions of its channel
(a read rebuilds a value from at most this many rows)."""


@dataclass(frozen=True, slots=True)
class Recent:
    """A list value of a channel as stored at ``version`` (its items, and how many
    extensions since the channel's value was last stored whole)."""

    version: str
    items: tuple[Any, ...]
    depth: int

    def extended_by(self, value: list[Any]) -> bool:
        """Whether ``value`` holds these very items (the same objects), then more, and
        may be stored as an extension (the chain stays under ``SNAPSHOT_EVERY``)."""
        n = len(self.items)
        return (
            0 < n < len(value)
            and self.depth + 1 < SNAPSHOT_EVERY
            and all(map(operator.is_, value, self.items))
        )


class RecentValues:
    """The list values a saver last stored or read, per channel of a thread (the newest
    ``size`` channels), so that a value extending one is stored as the items it adds.

    Items are compared by identity: LangGraph's reducers (``add_messages``, ``operator.
    add``) build the next list from the same item objects, so an extension is found
    without comparing or serializing the items already stored. Thread-safe.
    """

    def __init__(self, size: int = 256) -> None:
        self._size = size
        self._items: OrderedDict[ChannelKey, Recent] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: ChannelKey) -> Recent | None:
        with self._lock:
            return self._items.get(key)

    def remember(self, pairs: Iterable[tuple[ChannelKey, Recent]]) -> None:
        with self._lock:
            for key, recent in pairs:
                self._items[key] = recent
                self._items.move_to_end(key)
            while len(self._items) > self._size:
                self._items.popitem(last=False)

    def forget(self, thread_ids: Iterable[str] | None = None) -> None:
        """Drop what is known of these threads (of every thread for ``None``)."""
        with self._lock:
            if thread_ids is None:
                self._items.clear()
                return
            gone = set(thread_ids)
            for key in [k for k in self._items if k[0] in gone]:
                del self._items[key]
