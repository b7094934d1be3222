"""How ``HiststoreSaver`` stores a growing list as the items it adds: which list value a
channel last held (``RecentValues``), what to store for the next one (``Recent.store``),
and rebuilding a value from the versions it extends (``rebuild``, with ``SharedItems``
decoding each part once per listing).

A list value that holds the channel's previous value's items, then more, is stored as
one of three parts, so that a thread's storage stays linear in what its values hold and
a read rebuilds a value from about twice the square root of its items in parts:

* an *extension*: the items it adds, extending the previous version;
* a *block*: every item added since the chain's last block (or its whole copy), extending
  that version, once ``parts(m)`` extensions follow it (``m``: the whole copy's items);
* the *whole* value, when a block would take the blocks since the last whole copy past
  that copy's bytes or past ``parts(m)`` blocks.

Each item is thus stored once in an extension and once in a block, and again in each
whole copy made after it. A whole copy is made once the blocks since the last one hold
as many bytes as it, or at least ``parts(m)**2 >= m`` more items: the copies' sizes
grow geometrically, so together they hold a small multiple of the value, however many
versions there are.
"""

from __future__ import annotations

import copy
import math
import operator
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from histstore import HistStoreError
from histstore.checkpoints import Blob, StoredCheckpoint

__all__ = [
    "ChannelKey",
    "Recent",
    "RecentValues",
    "SharedItems",
    "parts",
    "rebuild",
    "store_whole",
]


def rebuild(
    loads: Callable[[tuple[str, bytes]], Any],
    found: Mapping[tuple[str, str], Blob],
    blob: Blob,
    stored: StoredCheckpoint,
    shared: SharedItems | None,
) -> tuple[Any, list[tuple[Blob, int]]]:
    """A channel's value from its blob and the versions it extends; and those parts,
    the whole copy first, each with the number of items it added (one part, with 0,
    for a value stored whole)."""
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
    chain.reverse()
    if len(chain) == 1:
        return loads((blob.type, blob.blob or b"")), [(blob, 0)]
    value: list[Any] = []
    parts = []
    for part in chain:
        items = _items(loads, part, stored, shared)
        if type(items) is not list:
            raise HistStoreError(
                f"thread {stored.thread_id!r}: channel {part.channel!r} at version"
                f" {part.version!r} is extended by later versions but is not a list"
            )
        value.extend(items)
        parts.append((part, len(items)))
    return value, parts


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

MIN_PARTS = 8
"""The fewest extensions before a block, and blocks before a whole copy."""


def parts(items: int) -> int:
    """The extensions before a block, and the blocks before a whole copy, for a chain
    whose whole copy holds ``items`` items: about their square root, so that a read
    rebuilds a value from about twice that many parts."""
    return max(MIN_PARTS, math.isqrt(max(items - 1, 0)) + 1)


Dumps = Callable[[Any], tuple[str, bytes]]
"""The serializer's ``dumps_typed``."""


@dataclass(frozen=True, slots=True)
class Recent:
    """A list value of a channel as stored at ``version``, and what its chain holds
    (see the module): its whole copy's bytes and items; the bytes and number of the
    blocks since that copy; the extensions since the last block (or the copy); and
    ``mark``, the version the next block extends (the last block, or the copy), where
    the value had ``mark_items`` items."""

    version: str
    items: tuple[Any, ...]
    whole: int
    whole_items: int
    blocks: int
    block_parts: int
    tail_parts: int
    mark: str
    mark_items: int

    @classmethod
    def stored_whole(cls, version: str, items: tuple[Any, ...], size: int) -> Recent:
        return cls(version, items, size, len(items), 0, 0, 0, version, len(items))

    @classmethod
    def read(
        cls,
        version: str,
        items: tuple[Any, ...],
        chain: list[tuple[Blob, int]],
        known: tuple[Recent, int] | None,
    ) -> Recent:
        """The value read at ``version``, rebuilt from ``chain`` (``rebuild``'s parts).
        Where ``known`` (a ``Recent`` and how many items it held) is this very version
        (as when a graph reads back the checkpoint it just stored), its account of the
        chain is kept, with the items read (the
        objects the next value will hold). Otherwise, the parts after the whole copy
        count as blocks and the next block extends this version: the chain's shape is
        not stored, and so, after a process starts, a thread's first whole copy may
        come early."""
        if known is not None and known[0].version == version and known[1] == len(items):
            return replace(known[0], items=items)
        (whole, whole_items), rest = chain[0], chain[1:]
        blocks = sum(len(b.blob or b"") for b, _ in rest)
        size = len(whole.blob or b"")
        return cls(
            version, items, size, whole_items or len(items), blocks, len(rest), 0, version,
            len(items),
        )  # fmt: skip

    def extended_by(self, value: list[Any]) -> bool:
        """Whether ``value`` holds these very items (the same objects), then more."""
        n = len(self.items)
        return 0 < n < len(value) and all(map(operator.is_, value, self.items))

    def store(
        self, value: list[Any], version: str, dumps: Dumps
    ) -> tuple[tuple[str, bytes], str | None, Recent] | None:
        """What to store for ``value`` at ``version`` when it extends this value: the
        serialized part, the version it extends, and the value's ``Recent``; ``None``
        when it is to be stored whole (``store_whole``)."""
        if version == self.version or not self.extended_by(value):
            return None
        items, limit = tuple(value), parts(self.whole_items)
        if self.tail_parts < limit:
            return (
                dumps(value[len(self.items) :]),
                self.version,
                Recent(
                    version, items, self.whole, self.whole_items, self.blocks,
                    self.block_parts, self.tail_parts + 1, self.mark, self.mark_items,
                ),
            )  # fmt: skip
        block = dumps(value[self.mark_items :])
        grown = self.blocks + len(block[1])
        if grown > self.whole or self.block_parts >= limit:
            return None
        return (
            block,
            self.mark,
            Recent(
                version, items, self.whole, self.whole_items, grown, self.block_parts + 1,
                0, version, len(items),
            ),
        )  # fmt: skip


def store_whole(value: Any, version: str, dumps: Dumps) -> tuple[tuple[str, bytes], Recent | None]:
    """``value`` serialized whole, and its ``Recent`` when it is a list."""
    payload = dumps(value)
    if type(value) is not list:
        return payload, None
    return payload, Recent.stored_whole(version, tuple(value), len(payload[1]))


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

    def take(self, key: ChannelKey) -> Recent | None:
        """What is known of ``key``, forgotten."""
        with self._lock:
            return self._items.pop(key, None)

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
