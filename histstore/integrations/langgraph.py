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
only; and the pending writes of each task. Thread ids follow histstore's id rules
(``InvalidId`` otherwise); an ``int`` or ``UUID`` thread id is used as its ``str``.

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
import builtins
import concurrent.futures
import json
import random
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from types import TracebackType
from typing import Any, TypeVar, cast
from uuid import UUID

from histstore import HistStoreError, InvalidId, InvalidMessage, Store, validate_id
from histstore.checkpoints import Blob, CheckpointStore, StoredCheckpoint, Write
from histstore.integrations import StoreTarget, _missing_framework, _StoreHandle

try:
    from langchain_core.runnables import RunnableConfig
    from langgraph.checkpoint.base import (
        WRITES_IDX_MAP,
        BaseCheckpointSaver,
        ChannelVersions,
        Checkpoint,
        CheckpointMetadata,
        CheckpointTuple,
        PendingWrite,
        get_checkpoint_id,
        get_serializable_checkpoint_metadata,
    )
    from langgraph.checkpoint.serde.base import SerializerProtocol
except ImportError as _exc:  # pragma: no cover - exercised in a subprocess by the tests
    raise _missing_framework("langgraph", "langgraph", _exc) from _exc

__all__ = ["HiststoreSaver"]

T = TypeVar("T")

_SCALARS = (str, int, float, bool)
_DELTA_KEY = "counters_since_delta_snapshot"


class _LoopThread:
    """A private event loop, running in a daemon thread, for the sync methods."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        started = threading.Event()
        self.loop.call_soon(started.set)
        self._thread = threading.Thread(target=self._run, name="histstore-langgraph", daemon=True)
        self._thread.start()
        started.wait()

    def _run(self) -> None:
        loop = self.loop
        asyncio.set_event_loop(loop)
        try:
            loop.run_forever()
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.run_until_complete(loop.shutdown_default_executor())
        finally:
            loop.close()

    def stop(self) -> None:
        """Stop the loop and wait for the thread to end."""
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()


def _thread_id(config: Mapping[str, Any]) -> str:
    configurable = config.get("configurable") or {}
    value = configurable.get("thread_id")
    if value is None:
        raise InvalidId("the config has no configurable thread_id")
    return _as_thread_id(value)


def _as_thread_id(value: object) -> str:
    if isinstance(value, (int, UUID)) and not isinstance(value, bool):
        value = str(value)
    return validate_id(value, what="thread id")


def _config(thread_id: str, ns: str, checkpoint_id: str) -> RunnableConfig:
    return {
        "configurable": {
            "thread_id": thread_id,
            "checkpoint_ns": ns,
            "checkpoint_id": checkpoint_id,
        }
    }


def _json(value: object, what: str) -> str:
    try:
        return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError, RecursionError) as exc:
        raise InvalidMessage(f"{what} is not storable JSON ({type(exc).__name__})") from None


class HiststoreSaver(BaseCheckpointSaver[str]):
    """A LangGraph checkpointer on a histstore store (SQLite or PostgreSQL).

    Every method of ``BaseCheckpointSaver`` is implemented, async and sync: ``get_tuple``,
    ``list``, ``put``, ``put_writes``, ``delete_thread``, ``delete_for_runs``,
    ``copy_thread`` and ``prune`` (see the module docstring for what they keep).

    The async methods are native. The sync ones serialize in the calling thread and run
    the same storage coroutines on the event loop the store belongs to, waiting for the
    result; called in a thread whose event loop is running they raise ``RuntimeError``
    naming the async method instead of blocking that loop. Which loop that is:

    - given a URL or path, the saver owns its store. It is opened on the loop of the first
      call: an async call's loop, or, for a sync call, a private loop thread the saver
      starts (later async calls from other loops are handed to it). ``close()`` /
      ``aclose()`` (or ``with`` / ``async with``) release the store and the thread.
    - given a ``Store``, sync calls run on the loop the store is used on: the loop running
      when the saver was made, or that of its latest async call. They work from any other
      thread while that loop runs (LangGraph's sync ``invoke`` inside
      ``asyncio.to_thread``, for instance); with no such loop they raise ``RuntimeError``.

    Args:
        store: a ``Store`` (borrowed: never closed here; a scoped store confines the
            saver to its user's threads) or anything ``histstore.connect()`` takes (owned).
        serde: LangGraph's serializer for checkpoints, channel values and writes.

    Raises:
        TypeError, ValueError: ``store`` is not a store or a valid target.
    """

    def __init__(self, store: StoreTarget, *, serde: SerializerProtocol | None = None) -> None:
        super().__init__(serde=serde)
        self._handle = _StoreHandle(store)
        self._lock = threading.Lock()
        self._thread: _LoopThread | None = None
        self._home: asyncio.AbstractEventLoop | None = None
        self._storage: CheckpointStore | None = None
        if not self._handle.owned:
            try:
                self._home = asyncio.get_running_loop()
            except RuntimeError:
                self._home = None

    # ------------------------------------------------------------------ async API

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """The checkpoint ``config`` names (its ``checkpoint_id``, else the newest of the
        thread's ``checkpoint_ns``), with its pending writes; ``None`` when there is none.
        Costs three primary-key lookups, however many checkpoints the thread holds."""
        thread_id, ns, checkpoint_id = self._target(config)
        stored = await self._acall(lambda cs: cs.get(thread_id, ns, checkpoint_id))
        return None if stored is None else await self._aload(stored)

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
        args = self._list_args(config, filter, before, limit)
        loop = asyncio.get_running_loop()
        if self._home_for(loop) is loop:
            storage = await self._storage_on(loop)
            async for stored in storage.list(*args[0], **args[1]):
                yield await self._aload(stored)
        else:  # an owned store living on another loop: fetch there, hand over the list
            for stored in await self._acall(lambda cs: _collect(cs.list(*args[0], **args[1]))):
                yield await self._aload(stored)

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Store a checkpoint after ``config``'s checkpoint (its parent); returns the
        config naming the stored one. Only the values of ``new_versions``' channels that
        are not plain scalars are stored apart (once per version)."""
        if self._needs_thread(checkpoint["channel_values"].values()):
            put = await asyncio.to_thread(
                self._dump_put, config, checkpoint, metadata, new_versions
            )
        else:
            put = self._dump_put(config, checkpoint, metadata, new_versions)
        await self._acall(put)
        return _config(put.thread_id, put.ns, checkpoint["id"])

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
        if self._needs_thread(v for _, v in writes):
            put = await asyncio.to_thread(self._dump_writes, config, writes, task_id, task_path)
        else:
            put = self._dump_writes(config, writes, task_id, task_path)
        await self._acall(put)

    async def adelete_thread(self, thread_id: str) -> None:
        """Delete every checkpoint, value and write of the thread. Idempotent."""
        tid = _as_thread_id(thread_id)
        await self._acall(lambda cs: cs.delete_thread(tid))

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Delete the checkpoints made by these runs (``metadata["run_id"]``), with their
        pending writes and the channel values no remaining checkpoint reads."""
        ids = [str(r) for r in run_ids]
        await self._acall(lambda cs: cs.delete_runs(ids))

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy every checkpoint, value and write of one thread to a new thread.

        Raises:
            NotFound: the source thread is unknown.
            ConflictError: the target thread exists.
        """
        source, target = _as_thread_id(source_thread_id), _as_thread_id(target_thread_id)
        await self._acall(lambda cs: cs.copy_thread(source, target))

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """Keep only the newest checkpoint of each namespace (``"keep_latest"``), or delete
        the threads (``"delete"``).

        Raises:
            ValueError: an unknown strategy.
            NotImplementedError: ``keep_latest`` on a thread that uses a ``DeltaChannel``.
        """
        if strategy not in ("keep_latest", "delete"):
            raise ValueError("strategy must be 'keep_latest' or 'delete'")
        ids = [_as_thread_id(t) for t in thread_ids]
        await self._acall(lambda cs: self._prune(cs, ids, strategy == "keep_latest"))

    async def aclose(self) -> None:
        """Release an owned store and the private loop thread; a borrowed store is left
        open. Idempotent."""
        with self._lock:
            home, thread = self._home, self._thread
            self._thread = None
        if self._handle.owned and not self._handle.closed:
            if home is None or home is asyncio.get_running_loop():
                await self._handle.close()
            else:
                await asyncio.wrap_future(self._submit_close(home))
        if thread is not None:
            await asyncio.to_thread(thread.stop)

    # ------------------------------------------------------------------ sync API

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """Sync ``aget_tuple``."""
        thread_id, ns, checkpoint_id = self._target(config)
        stored = self._call(lambda cs: cs.get(thread_id, ns, checkpoint_id), "get_tuple")
        return None if stored is None else self._load(stored)

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        """Sync ``alist`` (the matching rows are read when the iterator is made)."""
        args = self._list_args(config, filter, before, limit)
        found = self._call(lambda cs: _collect(cs.list(*args[0], **args[1])), "list", "alist")
        return iter([self._load(stored) for stored in found])

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Sync ``aput``."""
        self._no_loop_here("put")
        put = self._dump_put(config, checkpoint, metadata, new_versions)
        self._call(put, "put")
        return _config(put.thread_id, put.ns, checkpoint["id"])

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Sync ``aput_writes``."""
        self._no_loop_here("put_writes")
        self._call(self._dump_writes(config, writes, task_id, task_path), "put_writes")

    def delete_thread(self, thread_id: str) -> None:
        """Sync ``adelete_thread``."""
        tid = _as_thread_id(thread_id)
        self._call(lambda cs: cs.delete_thread(tid), "delete_thread")

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Sync ``adelete_for_runs``."""
        ids = [str(r) for r in run_ids]
        self._call(lambda cs: cs.delete_runs(ids), "delete_for_runs")

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Sync ``acopy_thread``."""
        source, target = _as_thread_id(source_thread_id), _as_thread_id(target_thread_id)
        self._call(lambda cs: cs.copy_thread(source, target), "copy_thread")

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """Sync ``aprune``."""
        if strategy not in ("keep_latest", "delete"):
            raise ValueError("strategy must be 'keep_latest' or 'delete'")
        ids = [_as_thread_id(t) for t in thread_ids]
        self._call(lambda cs: self._prune(cs, ids, strategy == "keep_latest"), "prune")

    def close(self) -> None:
        """Sync ``aclose``."""
        self._no_loop_here("close", "aclose")
        with self._lock:
            home, thread = self._home, self._thread
            self._thread = None
        if self._handle.owned and home is not None and not self._handle.closed:
            self._submit_close(home).result()
        if thread is not None:
            thread.stop()

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

    # ------------------------------------------------------------------ context managers

    async def __aenter__(self) -> HiststoreSaver:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def __enter__(self) -> HiststoreSaver:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return "HiststoreSaver(owned store)" if self._handle.owned else "HiststoreSaver(store)"

    # ------------------------------------------------------------------ (de)serialization

    def _target(self, config: RunnableConfig) -> tuple[str, str, str | None]:
        configurable = config.get("configurable") or {}
        return (
            _thread_id(config),
            str(configurable.get("checkpoint_ns", "")),
            get_checkpoint_id(config),
        )

    def _needs_thread(self, values: Any) -> bool:
        """Whether serializing ``values`` is worth a worker thread (anything not scalar)."""
        return any(v is not None and not isinstance(v, _SCALARS) for v in values)

    def _dump_put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> _Put:
        configurable = config.get("configurable") or {}
        thread_id = _thread_id(config)
        ns = str(configurable.get("checkpoint_ns", ""))
        values = checkpoint["channel_values"]
        inline = {k: v for k, v in values.items() if v is None or isinstance(v, _SCALARS)}
        versions = checkpoint["channel_versions"]
        blobs = {k: str(versions[k]) for k in values if k not in inline and k in versions}
        new_blobs = [
            Blob(k, blobs[k], *self.serde.dumps_typed(values[k]))
            for k in new_versions
            if k in blobs
        ]
        copy = cast(dict[str, Any], checkpoint.copy())
        copy["channel_values"] = inline
        type_, payload = self.serde.dumps_typed(copy)
        md = get_serializable_checkpoint_metadata(config, metadata)
        run_id = md.get("run_id")
        return _Put(
            thread_id,
            ns,
            {
                "checkpoint_id": checkpoint["id"],
                "parent_checkpoint_id": configurable.get("checkpoint_id"),
                "type": type_,
                "checkpoint": payload,
                "metadata": _json(md, "checkpoint metadata"),
                "run_id": None if run_id is None else str(run_id),
                "blobs": blobs,
                "new_blobs": new_blobs,
            },
        )

    def _dump_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str,
    ) -> _PutWrites:
        thread_id, ns, checkpoint_id = self._target(config)
        if checkpoint_id is None:
            raise InvalidId("pending writes need the config of a checkpoint (checkpoint_id)")
        rows = [
            Write(
                str(task_id),
                WRITES_IDX_MAP.get(channel, idx),
                channel,
                *self.serde.dumps_typed(value),
                task_path=task_path,
            )
            for idx, (channel, value) in enumerate(writes)
        ]
        replace = all(channel in WRITES_IDX_MAP for channel, _ in writes)
        return _PutWrites(thread_id, ns, checkpoint_id, rows, replace)

    async def _aload(self, stored: StoredCheckpoint) -> CheckpointTuple:
        size = len(stored.checkpoint) + sum(len(b.blob or b"") for b in stored.values)
        size += sum(len(w.blob) for w in stored.writes)
        if size > 1 << 16:
            return await asyncio.to_thread(self._load, stored)
        return self._load(stored)

    def _load(self, stored: StoredCheckpoint) -> CheckpointTuple:
        loads = self.serde.loads_typed
        checkpoint = cast(Checkpoint, loads((stored.type, stored.checkpoint)))
        values = dict(checkpoint.get("channel_values") or {})
        versions = checkpoint.get("channel_versions") or {}
        for blob in stored.values:
            version = versions.get(blob.channel)
            if blob.type != "empty" and blob.blob is not None and str(version) == blob.version:
                values[blob.channel] = loads((blob.type, blob.blob))
        checkpoint["channel_values"] = values
        writes: list[PendingWrite] = [
            (w.task_id, w.channel, loads((w.type, w.blob))) for w in stored.writes
        ]
        parent = stored.parent_checkpoint_id
        return CheckpointTuple(
            config=_config(stored.thread_id, stored.checkpoint_ns, stored.checkpoint_id),
            checkpoint=checkpoint,
            metadata=cast(CheckpointMetadata, json.loads(stored.metadata)),
            parent_config=None
            if parent is None
            else _config(stored.thread_id, stored.checkpoint_ns, parent),
            pending_writes=writes,
        )

    def _list_args(
        self,
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
                thread_id = _thread_id(config)
            if configurable.get("checkpoint_ns") is not None:
                ns = str(configurable["checkpoint_ns"])
            checkpoint_id = get_checkpoint_id(config)
        where = None
        if filter:
            wanted = json.loads(_json(filter, "the metadata filter"))

            def where(text: str) -> bool:
                metadata = json.loads(text)
                return all(metadata.get(k) == v for k, v in wanted.items())

        return (thread_id, ns), {
            "checkpoint_id": checkpoint_id,
            "before": None if before is None else get_checkpoint_id(before),
            "limit": limit,
            "where": where,
        }

    async def _prune(
        self, storage: CheckpointStore, thread_ids: builtins.list[str], keep: bool
    ) -> None:
        if keep:
            for thread_id in thread_ids:
                async for stored in storage.list(thread_id, None, where=_uses_delta):
                    raise NotImplementedError(
                        f"keep_latest cannot prune thread {stored.thread_id!r}: it uses a"
                        " DeltaChannel, whose state is rebuilt from older checkpoints"
                    )
        await storage.prune(thread_ids, keep_latest=keep)

    # ------------------------------------------------------------------ plumbing

    async def _storage_on(self, loop: asyncio.AbstractEventLoop) -> CheckpointStore:
        store: Store = await self._handle.get()
        storage = self._storage
        if storage is None:
            storage = self._storage = CheckpointStore(store)
        return storage

    def _home_for(self, loop: asyncio.AbstractEventLoop) -> asyncio.AbstractEventLoop:
        self._check_open()
        with self._lock:
            if not self._handle.owned or self._home is None:
                self._home = loop
            return self._home

    async def _acall(self, op: Callable[[CheckpointStore], Awaitable[T]]) -> T:
        """Run ``op`` on the storage, on the loop the store belongs to."""
        loop = asyncio.get_running_loop()
        home = self._home_for(loop)
        if home is loop:
            return await op(await self._storage_on(loop))
        return await asyncio.wrap_future(self._submit(home, op))

    def _check_open(self) -> None:
        if self._handle.closed:
            raise HistStoreError("the checkpointer is closed")

    def _no_loop_here(self, name: str, async_name: str | None = None) -> None:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return
        raise RuntimeError(
            f"HiststoreSaver.{name} is synchronous and cannot run in a thread whose event"
            f" loop is running; use `await saver.{async_name or 'a' + name}(...)` instead"
        )

    def _call(
        self,
        op: Callable[[CheckpointStore], Awaitable[T]],
        name: str,
        async_name: str | None = None,
    ) -> T:
        """Run ``op`` from sync code: on the store's loop, or on a private loop thread."""
        self._no_loop_here(name, async_name)
        self._check_open()
        with self._lock:
            if self._home is None:
                if not self._handle.owned:
                    raise RuntimeError(
                        f"HiststoreSaver.{name} needs the event loop its Store runs on: make"
                        " the saver inside that loop, or call one of its async methods there"
                        " once; or give the saver a URL or path so that it owns its store"
                    )
                self._thread = _LoopThread()
                self._home = self._thread.loop
            home = self._home
        return self._submit(home, op).result()

    def _submit(
        self, home: asyncio.AbstractEventLoop, op: Callable[[CheckpointStore], Awaitable[T]]
    ) -> concurrent.futures.Future[T]:
        if home.is_closed() or not home.is_running():
            raise RuntimeError("the event loop this saver's store runs on is no longer running")

        async def run() -> T:
            return await op(await self._storage_on(home))

        return asyncio.run_coroutine_threadsafe(run(), home)

    def _submit_close(self, home: asyncio.AbstractEventLoop) -> concurrent.futures.Future[None]:
        if home.is_closed() or not home.is_running():
            raise RuntimeError(
                "cannot close the saver's store: the event loop it was opened on is no"
                " longer running (close it before that loop ends)"
            )
        return asyncio.run_coroutine_threadsafe(self._handle.close(), home)


class _Put:
    """A serialized ``put``: what the storage stores, ready to run on any loop."""

    __slots__ = ("args", "ns", "thread_id")

    def __init__(self, thread_id: str, ns: str, args: dict[str, Any]) -> None:
        self.thread_id = thread_id
        self.ns = ns
        self.args = args

    def __call__(self, storage: CheckpointStore) -> Awaitable[None]:
        return storage.put(self.thread_id, self.ns, **self.args)


class _PutWrites:
    """A serialized ``put_writes``, ready to run on any loop."""

    __slots__ = ("checkpoint_id", "ns", "replace", "rows", "thread_id")

    def __init__(
        self, thread_id: str, ns: str, checkpoint_id: str, rows: list[Write], replace: bool
    ) -> None:
        self.thread_id = thread_id
        self.ns = ns
        self.checkpoint_id = checkpoint_id
        self.rows = rows
        self.replace = replace

    def __call__(self, storage: CheckpointStore) -> Awaitable[None]:
        return storage.put_writes(
            self.thread_id, self.ns, self.checkpoint_id, self.rows, replace=self.replace
        )


def _uses_delta(metadata: str) -> bool:
    return _DELTA_KEY in metadata and _DELTA_KEY in json.loads(metadata)


async def _collect(items: AsyncIterator[T]) -> list[T]:
    return [item async for item in items]
