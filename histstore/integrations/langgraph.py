"""A LangGraph checkpointer (``BaseCheckpointSaver``) that keeps its checkpoints in histstore.

::

    from langgraph.graph import StateGraph
    from histstore.integrations.langgraph import HiststoreSaver

    async with HiststoreSaver("chat.db") as saver:  # or a Store, or a postgresql:// URL
        graph = builder.compile(checkpointer=saver)
        await graph.ainvoke(inputs, {"configurable": {"thread_id": "t1"}})

What is stored, in histstore's own tables (``histstore_checkpoint_threads``,
``histstore_checkpoints``, ``histstore_checkpoint_blobs``,
``histstore_checkpoint_writes``, created by histstore's migrations): each checkpoint once,
serialized by the saver's ``serde`` (LangGraph's ``JsonPlusSerializer`` by default), with
its metadata as JSON; the channel values that are not plain scalars are stored apart, once
per channel version, so a checkpoint that changes one channel stores that channel's value
only, and a list that extends the channel's previous value (the same items, more appended,
as ``add_messages`` makes it) as the items it adds (with blocks and whole copies chosen
by size, so a thread's storage stays linear in its messages: ``_langgraph_values``); and
the pending writes of each task. Thread ids follow histstore's id rules (``InvalidId``
otherwise); an ``int`` or ``UUID`` thread id is used as its ``str``.

Semantics beyond ``BaseCheckpointSaver``'s docstrings:

- ``list(filter=...)`` keeps checkpoints whose metadata has every given key with an equal
  value (a missing key equals ``None``), as LangGraph's ``InMemorySaver`` does; the
  filter is applied to each row's metadata before its values are read.
- ``delete_for_runs(run_ids)`` removes the checkpoints whose ``metadata["run_id"]`` is
  one of them, with their pending writes and the channel values nothing else reads.
- ``copy_thread(source, target)`` copies every checkpoint, value and write (the whole
  parent chain); ``NotFound`` when the source is unknown, ``ConflictError`` when the
  target exists.
- ``prune(thread_ids, strategy="keep_latest")`` keeps each namespace's newest
  checkpoint (it loses its parent link) with its writes; ``"delete"`` deletes the
  threads. ``keep_latest`` refuses (``NotImplementedError``) a thread whose checkpoints
  use a ``DeltaChannel`` (their metadata counts delta updates): pruning could cut the
  history such a channel is rebuilt from.
- Given a scoped store (``store.scoped(user)``), the saver sees only that user's threads:
  threads it creates are owned by the user; another owner's thread behaves as unknown
  (reads find nothing, deletes do nothing, writes raise ``NotFound``).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

from histstore import NotFound
from histstore.checkpoints import CheckpointStore, StoredCheckpoint
from histstore.integrations import StoreTarget, _missing_framework, _StoreHandle

try:
    from langchain_core.messages import BaseMessage
    from langchain_core.runnables import RunnableConfig
    from langgraph.checkpoint.base import (
        BaseCheckpointSaver,
        ChannelVersions,
        Checkpoint,
        CheckpointMetadata,
        CheckpointTuple,
    )
    from langgraph.checkpoint.serde.base import SerializerProtocol
except ImportError as _exc:  # pragma: no cover - exercised in a subprocess by the tests
    raise _missing_framework("langgraph", "langgraph", _exc) from _exc

from ._langgraph_codec import (
    Put,
    as_thread_id,
    config_of,
    dump_put,
    dump_writes,
    item_texts,
    list_args,
    load,
    locate,
    needs_thread,
    put_is_heavy,
)
from ._langgraph_values import RecentValues, SharedItems
from ._sync import BridgedAdapter, LoopBridge
from .langchain import to_stored

__all__ = ["HiststoreSaver", "readable"]

T = TypeVar("T")


class HiststoreSaver(BridgedAdapter, BaseCheckpointSaver[str]):
    """A LangGraph checkpointer on a histstore store (SQLite or PostgreSQL).

    Every method of ``BaseCheckpointSaver`` is implemented, async and sync: ``get_tuple``,
    ``list``, ``put``, ``put_writes``, ``delete_thread``, ``delete_for_runs``,
    ``copy_thread`` and ``prune`` (see the module docstring for what they keep).

    The async methods are native. The sync ones serialize in the calling thread and run
    the same storage coroutines on the event loop the store belongs to, waiting for the
    result, also in a thread whose event loop runs (a notebook cell, an async handler
    calling sync code), as LangGraph's sync savers do; only a call that would wait on the
    loop it blocks (a borrowed store's, from that loop's thread) raises ``RuntimeError``
    naming the async method. Which loop that is:

    - given a URL or path, the saver owns its stores: one per event loop, opened on the
      loop's first call (see ``histstore.integrations``); sync calls run on a private
      loop thread the saver starts. ``close()`` / ``aclose()`` (or ``with`` / ``async
      with``), from any thread or loop, release the stores and the thread.
    - given a ``Store``, sync calls run on the loop the store is used on: the loop running
      when the saver was made, or that of its latest async call. They work from any other
      thread while that loop runs (LangGraph's sync ``invoke`` inside
      ``asyncio.to_thread``, for instance); with no such loop they raise ``RuntimeError``.

    Args:
        store: a ``Store`` (borrowed: never closed here; a scoped store confines the
            saver to its user's threads) or anything ``histstore.connect()`` takes (owned).
        serde: LangGraph's serializer for checkpoints, channel values and writes.
        connect_options: ``histstore.connect()``'s keyword arguments for an owned store
            (``{"pooler": "transaction"}`` behind PgBouncer, for instance).

    Raises:
        TypeError, ValueError: ``store`` is not a store or a valid target, or
            ``connect_options`` are given with a ``Store`` or are not ``connect()``'s.
    """

    def __init__(
        self,
        store: StoreTarget,
        *,
        serde: SerializerProtocol | None = None,
        connect_options: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(serde=serde)
        self._handle = _StoreHandle(store, connect_options)
        self._recent = RecentValues()
        self._bridge: LoopBridge[CheckpointStore] = LoopBridge(
            self._handle,
            self._storage_here,
            owner="HiststoreSaver",
            noun="saver",
            call_args="(...)",
            closed="the checkpointer is closed",
            thread_name="histstore-langgraph",
        )

    @classmethod
    def from_conn_string(
        cls, conn_string: str, *, serde: SerializerProtocol | None = None, **connect_options: Any
    ) -> HiststoreSaver:
        """A saver owning the store at ``conn_string`` (a path or URL), for ``with`` or
        ``async with`` as LangGraph's own savers' ``from_conn_string`` are used;
        ``connect_options`` go to ``histstore.connect()``."""
        return cls(conn_string, serde=serde, connect_options=connect_options)

    # ------------------------------------------------------------------ async API

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """The checkpoint ``config`` names (its ``checkpoint_id``, else the newest of the
        thread's ``checkpoint_ns``), with its pending writes; ``None`` when there is none.
        Costs three primary-key lookups, however many checkpoints the thread holds."""
        thread_id, ns, checkpoint_id = locate(config)
        stored = await self._bridge.acall(lambda cs: cs.get(thread_id, ns, checkpoint_id))
        return None if stored is None else await self._aload(stored, self._recent)

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        """Checkpoints, newest first: of ``config``'s thread (and ``checkpoint_ns`` when
        given; of every thread when ``config`` is ``None``), whose metadata matches
        ``filter``, older than ``before``'s checkpoint, at most ``limit`` of them."""
        args = list_args(config, filter, before, limit)
        shared = SharedItems()
        self._bridge.home_for(asyncio.get_running_loop())
        storage = await self._bridge.resource()
        async for stored in storage.list(*args[0], **args[1]):
            yield await self._aload(stored, shared=shared)

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Store a checkpoint after ``config``'s checkpoint (its parent); returns the
        config naming the stored one. Only the values of ``new_versions``' channels that
        are not plain scalars are stored apart (once per version); a list that extends
        the channel's previous value is stored as the items it adds."""
        args = (self.serde, config, checkpoint, metadata, new_versions)
        recent = self._recent
        if put_is_heavy(config, checkpoint, new_versions, recent):
            put = await asyncio.to_thread(dump_put, *args, recent)
        else:
            put = dump_put(*args, recent)
        put = await self._bridge.acall(self._storing(put, args))
        recent.remember(put.remember)
        return config_of(put.thread_id, put.ns, checkpoint["id"])

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Store a task's pending writes for ``config``'s checkpoint, in one transaction.
        Writing the same ``(task_id, index)`` again keeps the first, except for LangGraph's
        special channels (errors, interrupts, ...), whose latest write wins."""
        if needs_thread(v for _, v in writes):
            put = await asyncio.to_thread(
                dump_writes, self.serde, config, writes, task_id, task_path
            )
        else:
            put = dump_writes(self.serde, config, writes, task_id, task_path)
        await self._bridge.acall(put)

    async def adelete_thread(self, thread_id: str) -> None:
        """Delete every checkpoint, value and write of the thread. Idempotent."""
        tid = as_thread_id(thread_id)
        self._recent.forget([tid])
        await self._bridge.acall(lambda cs: cs.delete_thread(tid))

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Delete the checkpoints made by these runs (``metadata["run_id"]``), with their
        pending writes and the channel values no remaining checkpoint reads."""
        ids = [str(r) for r in run_ids]
        self._recent.forget()
        await self._bridge.acall(lambda cs: cs.delete_runs(ids))

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy every checkpoint, value and write of one thread to a new thread.

        Raises:
            NotFound: the source thread is unknown.
            ConflictError: the target thread exists.
        """
        source, target = as_thread_id(source_thread_id), as_thread_id(target_thread_id)
        await self._bridge.acall(lambda cs: cs.copy_thread(source, target))

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """Keep only the newest checkpoint of each namespace (``"keep_latest"``), or delete
        the threads (``"delete"``).

        Raises:
            ValueError: an unknown strategy.
            NotImplementedError: ``keep_latest`` on a thread that uses a ``DeltaChannel``
                (checked as each thread is pruned: the threads before it are pruned).
        """
        if strategy not in ("keep_latest", "delete"):
            raise ValueError("strategy must be 'keep_latest' or 'delete'")
        ids = [as_thread_id(t) for t in thread_ids]
        self._recent.forget(ids)
        await self._bridge.acall(lambda cs: cs.prune(ids, keep_latest=strategy == "keep_latest"))

    async def areindex_text(self, thread_ids: Sequence[str] | None = None) -> int:
        """Rebuild the searchable text (``store.search``) of threads (every thread this
        saver sees, for ``None``) from the newest checkpoint of each namespace: its list
        channels' LangChain messages, each thread and namespace in its own transaction.
        For threads stored before histstore kept that text (revision 6b2d9e4f1a37) or
        imported from a file without it. Returns how many messages it indexed; an
        unknown thread is skipped."""
        ids = None if thread_ids is None else [as_thread_id(t) for t in thread_ids]

        async def reindex(storage: CheckpointStore) -> int:
            every = ids if ids is not None else [i.thread_id for i in await storage.threads()]
            indexed = 0
            for thread_id in every:
                try:
                    info = await storage.thread(thread_id)
                except NotFound:
                    continue
                for ns in info.namespaces:
                    newest: RunnableConfig = {
                        "configurable": {"thread_id": thread_id, "checkpoint_ns": ns}
                    }
                    got = await self.aget_tuple(newest)
                    values = {} if got is None else got.checkpoint["channel_values"]
                    lists = {k: v for k, v in values.items() if type(v) is list}
                    texts = [t for k, v in sorted(lists.items()) for t in item_texts(k, v, 0)]
                    ends = {k: len(v) for k, v in lists.items()}
                    if await storage.index_text(thread_id, ns, texts, ends):
                        indexed += len(texts)
            return indexed

        return await self._bridge.acall(lambda cs: cs.one_call(reindex))

    # ------------------------------------------------------------------ sync API

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """Sync ``aget_tuple``."""
        thread_id, ns, checkpoint_id = locate(config)
        stored = self._bridge.call(lambda cs: cs.get(thread_id, ns, checkpoint_id), "get_tuple")
        return None if stored is None else load(self.serde, stored, self._recent)

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        """Sync ``alist`` (the matching rows are read when the iterator is made)."""
        pos, named = list_args(config, filter, before, limit)
        found = self._bridge.call(
            lambda cs: cs.one_call(lambda c: _collect(c.list(*pos, **named))), "list", "alist"
        )
        shared = SharedItems()
        return iter([load(self.serde, stored, shared=shared) for stored in found])

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Sync ``aput``."""
        self._bridge.refuse_own_loop("put")
        args = (self.serde, config, checkpoint, metadata, new_versions)
        put = self._bridge.call(self._storing(dump_put(*args, self._recent), args), "put")
        self._recent.remember(put.remember)
        return config_of(put.thread_id, put.ns, checkpoint["id"])

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Sync ``aput_writes``."""
        self._bridge.refuse_own_loop("put_writes")
        self._bridge.call(dump_writes(self.serde, config, writes, task_id, task_path), "put_writes")

    def delete_thread(self, thread_id: str) -> None:
        """Sync ``adelete_thread``."""
        tid = as_thread_id(thread_id)
        self._recent.forget([tid])
        self._bridge.call(lambda cs: cs.delete_thread(tid), "delete_thread")

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Sync ``adelete_for_runs``."""
        ids = [str(r) for r in run_ids]
        self._recent.forget()
        self._bridge.call(lambda cs: cs.delete_runs(ids), "delete_for_runs")

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Sync ``acopy_thread``."""
        source, target = as_thread_id(source_thread_id), as_thread_id(target_thread_id)
        self._bridge.call(lambda cs: cs.copy_thread(source, target), "copy_thread")

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """Sync ``aprune``."""
        if strategy not in ("keep_latest", "delete"):
            raise ValueError("strategy must be 'keep_latest' or 'delete'")
        ids = [as_thread_id(t) for t in thread_ids]
        self._recent.forget(ids)
        keep = strategy == "keep_latest"
        self._bridge.call(lambda cs: cs.prune(ids, keep_latest=keep), "prune")

    def get_next_version(self, current: str | None, channel: None) -> str:
        """The version after ``current``: a zero-padded counter and a random fraction.

        Versions name stored channel values, so two branches of a thread (a fork, or a
        resume from an older checkpoint) must not give different values one version; the
        random part keeps them apart while the counter keeps them ordered.
        """
        if current is None:
            number = 0
        elif isinstance(current, int):
            number = current
        else:
            number = int(str(current).split(".")[0])
        return f"{number + 1:032}.{random.random():016}"  # noqa: S311 - not security

    def __repr__(self) -> str:
        return "HiststoreSaver(owned store)" if self._handle.owned else "HiststoreSaver(store)"

    # ------------------------------------------------------------------ plumbing

    async def _aload(
        self,
        stored: StoredCheckpoint,
        recent: RecentValues | None = None,
        shared: SharedItems | None = None,
    ) -> CheckpointTuple:
        """``load``, in a worker thread when the checkpoint is very large (see
        ``_LOAD_IN_THREAD``)."""
        size = len(stored.checkpoint) + sum(len(b.blob or b"") for b in stored.values)
        size += sum(len(w.blob) for w in stored.writes)
        if size > _LOAD_IN_THREAD:
            return await asyncio.to_thread(load, self.serde, stored, recent, shared)
        return load(self.serde, stored, recent, shared)

    def _storing(
        self, put: Put, args: tuple[Any, ...]
    ) -> Callable[[CheckpointStore], Awaitable[Put]]:
        """Store ``put`` as one call of the store; whole (serialized again, off the loop)
        when a value it extends is gone (its thread was deleted or pruned meanwhile)."""

        async def store(storage: CheckpointStore) -> Put:
            if await put(storage):
                return put
            self._recent.forget([put.thread_id])
            whole = await asyncio.to_thread(dump_put, *args)
            await whole(storage)
            return whole

        return lambda storage: storage.one_call(store)

    async def _storage_here(self) -> CheckpointStore:
        """The checkpoint storage of the running loop's store (made once per store)."""
        return await self._handle.derived(CheckpointStore)


def readable(value: Any) -> Any:
    """A channel value as JSON data, for people and tools (``histstore threads show``,
    ``histstore export``): a LangChain message as a LangChain history stores it (its
    ``role`` and LangChain's own serialization), a list or tuple item by item, a dict
    value by value (keys as strings), JSON scalars as they are, anything else as
    ``{"type": <its class>, "repr": <its repr>}``."""
    if isinstance(value, BaseMessage):
        return to_stored(value)
    if isinstance(value, (list, tuple)):
        return [readable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): readable(v) for k, v in value.items()}
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return {"type": type(value).__name__, "repr": repr(value)}


_LOAD_IN_THREAD = 1 << 20
"""Serialized bytes of a checkpoint past which it is decoded in a worker thread.

Decoding is Python that holds the GIL, so a worker thread only lets the event loop run
between its switch intervals (every 5 ms), and the trip costs the caller about a tenth
of a 300 kB decode (about 10 ms: a 1,000-message chat; measured beside LangGraph's
saver, which decodes every checkpoint on the loop). Past 1 MB (some 30 ms of decoding)
the loop's other tasks gain more than the caller pays."""


async def _collect(items: AsyncIterator[T]) -> list[T]:
    return [item async for item in items]
