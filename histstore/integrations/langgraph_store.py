"""LangGraph's long-term memory store (``BaseStore``) on histstore's tables.

::

    from histstore.integrations.langgraph_store import HiststoreMemoryStore

    async with HiststoreMemoryStore("chat.db") as memories:  # or a Store, or a URL
        graph = builder.compile(store=memories)  # nodes reach it as runtime.store

Items live in ``histstore_items`` (one JSON object per namespace and key, with its
time to live) and their embeddings in ``histstore_item_vectors``, both created by
histstore's migrations (``histstore.items``). Semantics beyond ``BaseStore``'s docstrings:

- A batch reads first, then writes: its ``GetOp``, ``SearchOp`` and ``ListNamespacesOp``
  see the items as they were before it, as LangGraph's ``InMemoryStore`` does; its
  ``PutOp`` (the last one per item wins) and the refreshed expiries are then written in
  one transaction.
- ``search`` without a query returns the most recently updated items first; with a query
  (and an ``index`` configured) the items with embeddings, by the best cosine similarity
  of their texts to the query (``score``), ranked exactly. Filters follow
  ``InMemoryStore``'s rules (``$eq``, ``$ne``, ``$gt``, ``$gte``, ``$lt``, ``$lte``, nested
  objects, lists) and run in SQL.
- TTL (minutes): an expired item is gone for every read at once; ``sweep_ttl`` (or the
  sweeper ``start_ttl_sweeper`` runs) deletes expired items. A read refreshes the
  expiry of the items it returns (in the batch's write transaction) unless its
  ``refresh_ttl`` is false (``get``/``search`` default to the ``ttl`` config's
  ``refresh_on_read``, itself true by default).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterable, Sequence

from histstore.integrations import StoreTarget, _missing_framework, _StoreHandle
from histstore.items import ItemStore, ItemWrite, StoredItem

try:
    from langgraph.store.base import (
        BaseStore,
        GetOp,
        IndexConfig,
        InvalidNamespaceError,
        Item,
        ListNamespacesOp,
        Op,
        PutOp,
        Result,
        SearchItem,
        SearchOp,
        TTLConfig,
        ensure_embeddings,
        get_text_at_path,
        tokenize_path,
        validate_op_namespace,
    )
except ImportError as _exc:  # pragma: no cover - exercised in a subprocess by the tests
    raise _missing_framework("langgraph_store", "langgraph", _exc) from _exc

from ._sync import BridgedAdapter, LoopBridge

__all__ = ["HiststoreMemoryStore"]


class HiststoreMemoryStore(BridgedAdapter, BaseStore):
    """LangGraph's ``BaseStore`` on a histstore store (SQLite or PostgreSQL).

    ``batch``/``abatch`` run ``GetOp``, ``PutOp``, ``SearchOp`` and ``ListNamespacesOp``
    (so ``get``, ``put``, ``delete``, ``search``, ``list_namespaces`` and their async
    forms work); ``supports_ttl`` is true. Sync calls follow the rules of
    ``HiststoreSaver``: an owned store runs them on a private loop thread, a borrowed one
    on the loop it is used on; inside a running loop they raise ``RuntimeError``.

    Args:
        store: a ``Store`` (borrowed: never closed here; not a scoped view) or anything
            ``histstore.connect()`` takes (owned).
        index: LangGraph's ``IndexConfig`` (``dims``, ``embed``, ``fields``, default
            ``["$"]``): items are embedded as they are put, and ``search(query=...)``
            ranks by them. Without it, queries are ignored and nothing is embedded.
        ttl: LangGraph's ``TTLConfig`` (``default_ttl``, ``refresh_on_read``,
            ``sweep_interval_minutes``).

    Raises:
        TypeError, ValueError: ``store`` is not a store or a valid target, or a scoped one.
    """

    supports_ttl = True

    def __init__(
        self,
        store: StoreTarget,
        *,
        index: IndexConfig | None = None,
        ttl: TTLConfig | None = None,
    ) -> None:
        self._handle = _StoreHandle(store)
        if not self._handle.owned and store.user is not None:  # type: ignore[union-attr]
            raise ValueError("HiststoreMemoryStore takes the whole store, not a scoped view")
        self._bridge: LoopBridge[ItemStore] = LoopBridge(
            self._handle,
            self._items_here,
            owner="HiststoreMemoryStore",
            noun="store",
            call_args="(...)",
            closed="the memory store is closed",
            thread_name="histstore-langgraph-store",
        )
        self.index_config = index
        """The index configuration given (``None``: no vector search)."""
        self.ttl_config = ttl
        """The TTL configuration given (``None``: items never expire unless a put says so)."""
        self.embeddings = None if index is None else ensure_embeddings(index.get("embed"))
        """The embedder the index configuration names, as LangGraph wraps it."""
        fields = ["$"] if index is None else (index.get("fields") or ["$"])
        self._fields = _paths(fields)
        self._sweeper: asyncio.Task[None] | None = None

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        """Run ``ops`` (reads first, then the writes in one transaction; see module)."""
        ops = list(ops)
        _validate(ops)
        return await self._bridge.acall(self._batch(ops))

    def batch(self, ops: Iterable[Op]) -> list[Result]:
        """Sync ``abatch``."""
        ops = list(ops)
        _validate(ops)
        return self._bridge.call(self._batch(ops), "batch")

    async def asweep_ttl(self) -> int:
        """Delete the expired items; returns how many."""
        return await self._bridge.acall(lambda items: items.sweep())

    def sweep_ttl(self) -> int:
        """Sync ``asweep_ttl``."""
        return self._bridge.call(lambda items: items.sweep(), "sweep_ttl")

    async def start_ttl_sweeper(
        self, sweep_interval_minutes: float | None = None
    ) -> asyncio.Task[None]:
        """Sweep every ``sweep_interval_minutes`` (default: the ``ttl`` config's, else 5)
        on the running loop until ``stop_ttl_sweeper`` or ``aclose``; a running sweeper
        is returned as it is."""
        if self._sweeper is not None and not self._sweeper.done():
            return self._sweeper
        config = self.ttl_config or {}
        minutes = sweep_interval_minutes or config.get("sweep_interval_minutes") or 5

        async def sweep() -> None:
            while True:
                await asyncio.sleep(minutes * 60)
                with contextlib.suppress(Exception):  # a failed sweep is retried next time
                    await self.asweep_ttl()

        self._sweeper = asyncio.get_running_loop().create_task(sweep())
        return self._sweeper

    async def stop_ttl_sweeper(self, timeout: float | None = None) -> bool:  # noqa: ASYNC109 - LangGraph's signature
        """Stop the sweeper; whether it stopped within ``timeout`` seconds."""
        task, self._sweeper = self._sweeper, None
        if task is None or task.done():
            return True
        task.cancel()
        done, _ = await asyncio.wait([task], timeout=timeout)
        return bool(done)

    async def aclose(self) -> None:
        """Stop the sweeper and release an owned store (see ``BridgedAdapter``)."""
        await self.stop_ttl_sweeper()
        await super().aclose()

    def close(self) -> None:
        """Sync ``aclose``: the sweeper is cancelled on its loop, without waiting."""
        task, self._sweeper = self._sweeper, None
        if task is not None and not task.done() and not task.get_loop().is_closed():
            task.get_loop().call_soon_threadsafe(task.cancel)
        super().close()

    def __repr__(self) -> str:
        owned = "owned store" if self._handle.owned else "store"
        return f"HiststoreMemoryStore({owned})"

    # ------------------------------------------------------------------ plumbing

    async def _items_here(self) -> ItemStore:
        return await self._handle.derived(ItemStore)

    def _batch(self, ops: list[Op]) -> Callable[[ItemStore], Awaitable[list[Result]]]:
        """Run ``ops`` as one call of the store (``ItemStore.one_call``)."""
        return lambda items: items.one_call(lambda it: self._run(it, ops))

    async def _run(self, items: ItemStore, ops: list[Op]) -> list[Result]:
        results: list[Result] = [None] * len(ops)
        refresh: dict[tuple[tuple[str, ...], str], float] = {}
        gets = [(n, op) for n, op in enumerate(ops) if isinstance(op, GetOp)]
        if gets:
            found = await items.get([(op.namespace, op.key) for _, op in gets])
            for n, get in gets:
                got = found.get((tuple(get.namespace), get.key))
                results[n] = None if got is None else _item(got)
                if got is not None and got.ttl is not None and get.refresh_ttl:
                    refresh[got.namespace, got.key] = got.ttl
        for n, op in enumerate(ops):
            if isinstance(op, SearchOp):
                hits = await self._search(items, op)
                results[n] = [_search_item(h) for h in hits]
                if op.refresh_ttl:
                    refresh.update({(h.namespace, h.key): h.ttl for h in hits if h.ttl})
            elif isinstance(op, ListNamespacesOp):
                rules = [(c.match_type, tuple(c.path)) for c in op.match_conditions or ()]
                results[n] = await items.list_namespaces(
                    rules, max_depth=op.max_depth, limit=op.limit, offset=op.offset
                )
        puts = [op for op in ops if isinstance(op, PutOp)]
        if puts or refresh:
            writes = await self._writes(puts)
            await items.write(writes, [(ns, k, ttl) for (ns, k), ttl in refresh.items()])
        return results

    async def _search(self, items: ItemStore, op: SearchOp) -> list[StoredItem]:
        args = {"where": op.filter, "limit": op.limit, "offset": op.offset}
        if op.query and self.embeddings is not None:
            query = await self.embeddings.aembed_query(op.query)
            return await items.search_vectors(op.namespace_prefix, query, **args)  # type: ignore[arg-type]
        return await items.search(op.namespace_prefix, **args)  # type: ignore[arg-type]

    async def _writes(self, puts: Sequence[PutOp]) -> list[ItemWrite]:
        """The writes of ``puts``, with the embeddings of their texts (one embedder call)."""
        last = {(tuple(op.namespace), op.key): op for op in puts}
        texts: list[str] = []
        wanted: list[list[tuple[str, int]]] = []
        for op in last.values():
            fields: list[tuple[str, int]] = []
            if self.embeddings is not None and op.value is not None and op.index is not False:
                paths = self._fields if op.index is None else _paths(op.index)
                for path, tokens in paths:
                    found = get_text_at_path(op.value, tokens)
                    for i, text in enumerate(found):
                        fields.append((f"{path}.{i}" if len(found) > 1 else path, len(texts)))
                        texts.append(text)
            wanted.append(fields)
        vectors: list[list[float]] = []
        if texts:
            assert self.embeddings is not None
            vectors = await self.embeddings.aembed_documents(texts)
        return [
            ItemWrite(
                tuple(op.namespace),
                op.key,
                op.value,
                op.ttl,
                [(field, vectors[at]) for field, at in fields],
            )
            for op, fields in zip(last.values(), wanted, strict=True)
        ]


def _validate(ops: list[Op]) -> None:
    for op in ops:
        validate_op_namespace(op)
        if isinstance(op, PutOp) and not op.namespace:
            raise InvalidNamespaceError("Namespace cannot be empty.")
        if not isinstance(op, (GetOp, PutOp, SearchOp, ListNamespacesOp)):
            raise ValueError(f"Unknown operation type: {type(op).__name__}")


def _paths(fields: Sequence[str]) -> list[tuple[str, str | list[str]]]:
    """Each field with what ``get_text_at_path`` takes: ``"$"`` (the whole value) as it is."""
    return [(f, f if f == "$" else tokenize_path(f)) for f in fields]


def _item(stored: StoredItem) -> Item:
    return Item(
        value=stored.value,
        key=stored.key,
        namespace=stored.namespace,
        created_at=stored.created_at,
        updated_at=stored.updated_at,
    )


def _search_item(stored: StoredItem) -> SearchItem:
    return SearchItem(
        stored.namespace,
        stored.key,
        stored.value,
        stored.created_at,
        stored.updated_at,
        stored.score,
    )
