"""How ``HiststoreSaver`` turns LangGraph's values into checkpoint records and back: thread
ids and configs, a checkpoint (its plain values inline, the rest as channel values) and
pending writes serialized by the saver's ``serde``, listing arguments, and loading."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, cast
from uuid import UUID

from langchain_core.messages import BaseMessage
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    PendingWrite,
    get_checkpoint_id,
    get_serializable_checkpoint_metadata,
)
from langgraph.checkpoint.serde.base import SerializerProtocol

from histstore import InvalidId, InvalidMessage, indexed_text, validate_id
from histstore.checkpoints import Blob, CheckpointStore, ItemText, StoredCheckpoint, Write

from ._langgraph_values import (
    ChannelKey,
    Recent,
    RecentValues,
    SharedItems,
    rebuild,
    store_whole,
)
from .langchain import to_stored

__all__ = [
    "Put",
    "PutWrites",
    "as_thread_id",
    "config_of",
    "dump_put",
    "dump_writes",
    "list_args",
    "load",
    "locate",
    "needs_thread",
    "put_is_heavy",
]

_SCALARS = (str, int, float, bool)


def thread_id_of(config: Mapping[str, Any]) -> str:
    configurable = config.get("configurable") or {}
    value = configurable.get("thread_id")
    if value is None:
        raise InvalidId("the config has no configurable thread_id")
    return as_thread_id(value)


def as_thread_id(value: object) -> str:
    if isinstance(value, (int, UUID)) and not isinstance(value, bool):
        value = str(value)
    return validate_id(value, what="thread id")


def config_of(thread_id: str, ns: str, checkpoint_id: str) -> RunnableConfig:
    return {
        "configurable": {
            "thread_id": thread_id,
            "checkpoint_ns": ns,
            "checkpoint_id": checkpoint_id,
        }
    }


def to_json(value: object, what: str) -> str:
    try:
        return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError, RecursionError) as exc:
        raise InvalidMessage(f"{what} is not storable JSON ({type(exc).__name__})") from None


def locate(config: RunnableConfig) -> tuple[str, str, str | None]:
    configurable = config.get("configurable") or {}
    return (
        thread_id_of(config),
        str(configurable.get("checkpoint_ns", "")),
        get_checkpoint_id(config),
    )


_THREAD_ITEMS = 64
"""Items of a collection past which serializing it is left to a worker thread (a trip
there costs about what serializing a few dozen chat messages does)."""


def _heavy(value: Any, skip: int = 0) -> bool:
    if isinstance(value, (list, tuple, dict, set, frozenset)):
        return len(value) - skip > _THREAD_ITEMS
    return isinstance(value, (bytes, str)) and len(value) > 1 << 16


def needs_thread(values: Any) -> bool:
    """Whether serializing ``values`` is worth a worker thread (a large collection)."""
    return any(_heavy(v) for v in values)


def put_is_heavy(
    config: RunnableConfig,
    checkpoint: Checkpoint,
    new_versions: ChannelVersions,
    recent: RecentValues,
) -> bool:
    """Whether ``dump_put`` is worth a worker thread: a value it serializes is large
    (counting only the items a list adds to the channel's previous value)."""
    configurable = config.get("configurable") or {}
    thread_id = configurable.get("thread_id")
    ns = str(configurable.get("checkpoint_ns", ""))
    values = checkpoint["channel_values"]
    for k in new_versions:
        value = values.get(k)
        known = recent.get((str(thread_id), ns, k))
        skip = len(known.items) if known is not None and type(value) is list else 0
        if _heavy(value, skip):
            return True
    return False


def dump_put(
    serde: SerializerProtocol,
    config: RunnableConfig,
    checkpoint: Checkpoint,
    metadata: CheckpointMetadata,
    new_versions: ChannelVersions,
    recent: RecentValues | None = None,
) -> Put:
    """The rows of a ``put``; with ``recent``, a list value that extends the channel's
    value ``recent`` holds is stored as the items it adds (see ``RecentValues``)."""
    configurable = config.get("configurable") or {}
    thread_id = thread_id_of(config)
    ns = str(configurable.get("checkpoint_ns", ""))
    values = checkpoint["channel_values"]
    inline = {k: v for k, v in values.items() if v is None or isinstance(v, _SCALARS)}
    versions = checkpoint["channel_versions"]
    blobs = {k: str(versions[k]) for k in values if k not in inline and k in versions}
    new_blobs = []
    remember = []
    texts: list[ItemText] = []
    ends: dict[str, int] = {}
    for k in new_versions:
        if k not in blobs:
            continue
        value, version = values[k], blobs[k]
        known = None if recent is None else recent.get((thread_id, ns, k))
        part = None
        if known is not None and type(value) is list:
            part = known.store(value, version, serde.dumps_typed)
        if part is not None:
            part_payload, base, now = part
            new_blobs.append(Blob(k, version, *part_payload, base=base))
        else:
            whole_payload, whole = store_whole(value, version, serde.dumps_typed)
            new_blobs.append(Blob(k, version, *whole_payload))
            if whole is None:
                continue
            now = whole
        remember.append(((thread_id, ns, k), now))
        # Only the items this value adds to the one stored before get their text; a
        # value that does not extend it is indexed whole and ends the channel's text.
        start = len(known.items) if known is not None and known.extended_by(value) else 0
        texts.extend(item_texts(k, value, start))
        if not start:
            ends[k] = len(value)
    copy = cast(dict[str, Any], checkpoint.copy())
    copy["channel_values"] = inline
    type_, payload = serde.dumps_typed(copy)
    md = get_serializable_checkpoint_metadata(config, metadata)
    run_id = md.get("run_id")
    return Put(
        thread_id,
        ns,
        {
            "checkpoint_id": checkpoint["id"],
            "parent_checkpoint_id": configurable.get("checkpoint_id"),
            "type": type_,
            "checkpoint": payload,
            "metadata": to_json(md, "checkpoint metadata"),
            "run_id": None if run_id is None else str(run_id),
            "blobs": blobs,
            "new_blobs": new_blobs,
            "texts": texts,
            "text_ends": ends,
        },
        remember,
    )


def item_texts(channel: str, items: list[Any], start: int) -> list[ItemText]:
    """The searchable text of the LangChain messages among ``items[start:]`` (by their
    index in the list): their role and ``histstore.indexed_text`` of the message as a
    LangChain history stores it (its content's text and its tool calls' arguments)."""
    found = []
    for idx in range(start, len(items)):
        item = items[idx]
        if isinstance(item, BaseMessage):
            stored = to_stored(item)
            text = indexed_text(stored) or ""
            found.append(ItemText(channel, idx, str(stored.get("role", item.type)), text))
    return found


def dump_writes(
    serde: SerializerProtocol,
    config: RunnableConfig,
    writes: Sequence[tuple[str, Any]],
    task_id: str,
    task_path: str,
) -> PutWrites:
    thread_id, ns, checkpoint_id = locate(config)
    if checkpoint_id is None:
        raise InvalidId("pending writes need the config of a checkpoint (checkpoint_id)")
    rows = [
        Write(
            str(task_id),
            WRITES_IDX_MAP.get(channel, idx),
            channel,
            *serde.dumps_typed(value),
            task_path=task_path,
        )
        for idx, (channel, value) in enumerate(writes)
    ]
    replace = all(channel in WRITES_IDX_MAP for channel, _ in writes)
    return PutWrites(thread_id, ns, checkpoint_id, rows, replace)


def load(
    serde: SerializerProtocol,
    stored: StoredCheckpoint,
    recent: RecentValues | None = None,
    shared: SharedItems | None = None,
) -> CheckpointTuple:
    """The checkpoint tuple of ``stored``; with ``recent``, the list values it holds are
    remembered there (so the next ``put`` of the thread can extend them); with
    ``shared``, the parts of list values are decoded once for every checkpoint loaded
    with it (see ``SharedItems``)."""
    loads = serde.loads_typed
    checkpoint = cast(Checkpoint, loads((stored.type, stored.checkpoint)))
    values = dict(checkpoint.get("channel_values") or {})
    versions = checkpoint.get("channel_versions") or {}
    found = {(b.channel, b.version): b for b in stored.values}
    for channel, version in stored.channels or sorted(found):
        blob = found.get((channel, version))
        if blob is None or str(versions.get(channel)) != version:
            continue
        if blob.base is None and (blob.type == "empty" or blob.blob is None):
            continue
        key = (stored.thread_id, stored.checkpoint_ns, channel)
        # What was known of the channel is taken out before the decode, keeping only its
        # account of the chain: its items are let go (a large value otherwise stays
        # alive beside the one decoded, and the garbage collector walks both).
        known = None if recent is None else recent.take(key)
        account = None if known is None else (replace(known, items=()), len(known.items))
        del known
        value, chain = rebuild(loads, found, blob, stored, shared)
        values[channel] = value
        if recent is not None and type(value) is list:
            recent.remember([(key, Recent.read(version, tuple(value), chain, account))])
    checkpoint["channel_values"] = values
    writes: list[PendingWrite] = [
        (w.task_id, w.channel, loads((w.type, w.blob))) for w in stored.writes
    ]
    parent = stored.parent_checkpoint_id
    return CheckpointTuple(
        config=config_of(stored.thread_id, stored.checkpoint_ns, stored.checkpoint_id),
        checkpoint=checkpoint,
        metadata=cast(CheckpointMetadata, json.loads(stored.metadata)),
        parent_config=None
        if parent is None
        else config_of(stored.thread_id, stored.checkpoint_ns, parent),
        pending_writes=writes,
    )


def list_args(
    config: RunnableConfig | None,
    filter: dict[str, Any] | None,
    before: RunnableConfig | None,
    limit: int | None,
) -> tuple[tuple[str | None, str | None], dict[str, Any]]:
    thread_id: str | None = None
    ns: str | None = None
    checkpoint_id: str | None = None
    if config is not None:
        configurable = config.get("configurable") or {}
        if configurable.get("thread_id") is not None:
            thread_id = thread_id_of(config)
        if configurable.get("checkpoint_ns") is not None:
            ns = str(configurable["checkpoint_ns"])
        checkpoint_id = get_checkpoint_id(config)
    where = None
    if filter:
        wanted = json.loads(to_json(filter, "the metadata filter"))

        def where(text: str) -> bool:
            metadata = json.loads(text)
            return all(metadata.get(k) == v for k, v in wanted.items())

    return (thread_id, ns), {
        "checkpoint_id": checkpoint_id,
        "before": None if before is None else get_checkpoint_id(before),
        "limit": limit,
        "where": where,
    }


@dataclass(frozen=True, slots=True)
class Put:
    """A serialized ``put``: what the storage stores, ready to run on any loop.
    ``remember``: the list values it stores, for ``RecentValues`` once it is stored."""

    thread_id: str
    ns: str
    args: dict[str, Any]
    remember: list[tuple[ChannelKey, Recent]]

    def __call__(self, storage: CheckpointStore) -> Awaitable[bool]:
        return storage.put(self.thread_id, self.ns, **self.args)


@dataclass(frozen=True, slots=True)
class PutWrites:
    """A serialized ``put_writes``, ready to run on any loop."""

    thread_id: str
    ns: str
    checkpoint_id: str
    rows: list[Write]
    replace: bool

    def __call__(self, storage: CheckpointStore) -> Awaitable[None]:
        return storage.put_writes(
            self.thread_id, self.ns, self.checkpoint_id, self.rows, replace=self.replace
        )
