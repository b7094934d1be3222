"""``ItemStore``: every statement on ``histstore_items`` and ``histstore_item_vectors``."""

from __future__ import annotations

import asyncio
import heapq
import json
import operator
import sys
from array import array
from collections.abc import Hashable, Iterable, Mapping, Sequence
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

from sqlalchemy import ColumnElement, Integer, and_, bindparam, delete, or_, select, tuple_
from sqlalchemy.ext.asyncio import AsyncConnection

from .._core import codec as _codec
from .._errors import InvalidMessage
from .._ops.semantic import unit_vector, vector_bytes
from .._storage import schema as s
from .._storage.calls import OneCall, span_methods
from .._storage.drivers import EXECUTE_MANY, FETCH, CompiledStatement, Program
from ._filters import filter_condition
from ._namespaces import (
    MatchRule,
    as_text,
    fixed_prefix,
    from_text,
    matches,
    range_params,
    under_bound,
)
from ._records import ItemWrite, StoredItem
from ._statements import ItemStatements, item_columns

if TYPE_CHECKING:
    from .._store import Store

__all__ = ["ItemStore", "ItemWrite", "StoredItem"]

_CHUNK = 400  # keys per IN list
_FILTER_SHAPES = 128  # filtered searches kept compiled (by shape), per store
_WALK_PAGE = 100  # namespaces per step of a listing
_OFF_LOOP = 2000  # rank this many vectors or more in a worker thread
_LITTLE = sys.byteorder == "little"


class ItemStore(OneCall):
    """Long-term memory items (JSON objects by namespace and key) in a store's database.

    Every statement runs through the store's executor: a read is one statement (a get, one
    per key; a listing, one per page of namespaces), a write one transaction. An item
    whose time to live has run out is gone for every read, and deleted by ``sweep``.
    Costs: a get is a primary-key lookup; a search or a listing reads the range of the
    primary key its prefix covers (then filters and orders what is there); ``sweep``
    reads the expired items by index.

    Each method is one call of the store for ``close()`` (``Store.close``: a ``close()``
    that begins while it runs waits for it; one begun after refuses it before it touches
    anything); ``one_call`` makes several methods one.

    Raises (every method): ``HistStoreError`` for database failures (the driver's
    exception as ``__cause__``).
    """

    def __init__(self, store: Store) -> None:
        if store.user is not None:
            raise ValueError(
                "items are not confined to a user: give the whole store (put the user"
                " in the namespace)"
            )
        self._executor = store.internals.executor
        self._dialect = store.engine.dialect
        self._sql = ItemStatements(self._executor, self._dialect)
        self._filtered: dict[tuple[bool, Hashable], CompiledStatement] = {}

    # ------------------------------------------------------------------ reads

    async def get(self, keys: Sequence[tuple[tuple[str, ...], str]]) -> dict[Any, StoredItem]:
        """The unexpired items at these (namespace, key) pairs, by pair: a primary-key
        lookup each (one statement per pair)."""
        found: dict[Any, StoredItem] = {}
        now = _now()
        for ns, key in dict.fromkeys((tuple(ns), k) for ns, k in keys):
            params = {"n": as_text(ns), "k": key, "now": now}
            rows = await self._executor.fetch(
                self._sql.get, params, action="reading an item", inline=True
            )
            for row in rows:
                found[ns, key] = self._sql.item(row)
        return found

    async def search(
        self,
        prefix: Sequence[str],
        *,
        where: Mapping[str, Any] | None = None,
        limit: int = 10,
        offset: int = 0,
    ) -> list[StoredItem]:
        """The unexpired items under ``prefix`` matching ``where`` (see ``_filters``),
        most recently updated first (then by namespace and key), ``offset`` skipped.

        Raises:
            ValueError: a malformed filter.
        """
        sql = self._sql
        params: dict[str, Any] = {"limit": max(0, limit), "offset": max(0, offset)}
        if not where:
            stmt = sql.recent if prefix else sql.recent_all
            params |= {"now": _now(), **(range_params(prefix) if prefix else {})}
        else:
            conditions, bound, shape = self._conditions(prefix, where)
            params |= bound
            cached = self._filtered.get((bool(prefix), shape))
            if cached is not None:
                stmt = cached
            else:
                i = s.items
                newest = (
                    item_columns()
                    .where(*conditions)
                    .order_by(i.c.updated_at.desc(), i.c.namespace, i.c.key)
                    .limit(bindparam("limit", type_=Integer))
                    .offset(bindparam("offset", type_=Integer))
                )
                if len(self._filtered) >= _FILTER_SHAPES:
                    self._filtered.clear()
                stmt = self._filtered[bool(prefix), shape] = self._executor.compile(newest)
        rows = await self._executor.fetch(stmt, params, action="searching items")
        return [sql.item(row) for row in rows]

    async def search_vectors(
        self,
        prefix: Sequence[str],
        query: Sequence[float],
        *,
        where: Mapping[str, Any] | None = None,
        limit: int = 10,
        offset: int = 0,
    ) -> list[StoredItem]:
        """The unexpired items under ``prefix`` matching ``where`` that have vectors,
        ranked by the best cosine similarity of their vectors to ``query`` (``score``,
        exact: every vector under the prefix is compared), ties by namespace and key.

        Raises:
            ValueError: a malformed filter.
            InvalidMessage: ``query`` is not a valid vector, or stored vectors have
                another dimension.
        """
        probe = array("d", unit_vector(query))
        i, v = s.items, s.item_vectors
        joined = v.join(i, and_(i.c.namespace == v.c.namespace, i.c.key == v.c.key))
        conditions, params, _ = self._conditions(prefix, where)
        candidates = (
            select(v.c.namespace, v.c.key, v.c.vector).select_from(joined).where(*conditions)
        )
        top = max(0, offset) + max(0, limit)

        async def work(conn: AsyncConnection) -> list[StoredItem]:
            rows = (await conn.execute(candidates, params)).all()
            if top == 0 or not rows:
                return []
            if len(rows) >= _OFF_LOOP:
                best = await asyncio.to_thread(_rank, probe, rows, top)
            else:
                best = _rank(probe, rows, top)
            best = best[max(0, offset) :]
            keys = [(ns, k) for _, ns, k in best]
            found: dict[Any, StoredItem] = {}
            for start in range(0, len(keys), _CHUNK):
                stmt = item_columns().where(
                    tuple_(i.c.namespace, i.c.key).in_(keys[start : start + _CHUNK])
                )
                for row in await conn.execute(stmt):
                    found[row[0], row[1]] = _item(row)
            out = []
            for score, ns, k in best:
                item = found.get((ns, k))
                if item is not None:
                    bounded = min(1.0, max(-1.0, score))
                    out.append(_scored(item, bounded))
            return out

        return await self._executor.run(work, mode="snapshot", action="searching items")

    async def list_namespaces(
        self,
        rules: Sequence[MatchRule] = (),
        *,
        max_depth: int | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> list[tuple[str, ...]]:
        """The namespaces holding items that meet every rule, cut to ``max_depth``
        labels (each once), in the order of their (uncut) text, ``offset`` skipped.

        The labels before a wildcard of the prefix rules pick the range read; the walk
        probes the primary key once per namespace in it (``_namespaces.namespace_walk``),
        and past a namespace cut to ``max_depth`` it jumps over those sharing that cut.
        """
        fixed = fixed_prefix(rules)
        sql = self._sql
        walk = sql.walk if fixed else sql.walk_all
        wanted = max(0, offset) + max(0, limit)
        out: list[tuple[str, ...]] = []
        seen: set[tuple[str, ...]] = set()
        params: dict[str, Any] = {"start": as_text(fixed), "page": _WALK_PAGE}
        if fixed:
            params["hi"] = range_params(fixed)["hi"]
        while len(out) < wanted:
            rows = await self._executor.fetch(walk, params, action="listing namespaces")
            page = [str(r[0]) for r in rows]
            if not page:
                break
            cursor = None
            for stored in page:
                if cursor is not None and stored < cursor:
                    continue
                namespace = from_text(stored)
                cursor = stored + "\x01"
                if namespace[: len(fixed)] != fixed or not matches(namespace, rules):
                    continue
                if max_depth is not None and len(namespace) > max_depth:
                    namespace = namespace[:max_depth]
                    cursor = as_text(namespace) + "/"
                if namespace not in seen:  # cut, it may follow a label sorting before "."
                    seen.add(namespace)
                    out.append(namespace)
                if len(out) >= wanted:
                    break
            assert cursor is not None
            if len(page) < _WALK_PAGE:  # the walk reached the end of the range
                break
            params["start"] = cursor
        return out[max(0, offset) : wanted]

    # ------------------------------------------------------------------ writes

    async def write(
        self,
        writes: Sequence[ItemWrite],
        refresh: Sequence[tuple[tuple[str, ...], str, float]] = (),
    ) -> None:
        """Apply ``writes`` (the last for each (namespace, key) wins) and move the expiry
        of each ``refresh`` (namespace, key, ttl) item to ``ttl`` minutes from now, in one
        transaction. A vector is stored as a unit float32 vector; all of an item's
        vectors are replaced by the write.

        Raises:
            InvalidMessage: a value that is not a JSON object (or not storable JSON), a
                bad ttl or vector, or vectors of another dimension than those stored.
        """
        last: dict[tuple[str, str], ItemWrite] = {}
        for w in writes:
            last[as_text(w.namespace), w.key] = w
        now = _now()
        rows, vectors = [], []
        for (ns, key), w in last.items():
            if w.value is None:
                continue
            if not isinstance(w.value, Mapping):
                raise InvalidMessage("an item's value is a JSON object")
            text, _, _ = _codec.encode(dict(w.value), what="an item's value")
            ttl = _ttl(w.ttl)
            expires = None if ttl is None else now + timedelta(minutes=ttl)
            rows.append(
                {
                    "namespace": ns,
                    "key": key,
                    "value": text,
                    "created_at": now,
                    "updated_at": now,
                    "ttl": ttl,
                    "expires_at": expires,
                }
            )
            for field, vector in w.vectors:
                vectors.append(
                    {
                        "namespace": ns,
                        "key": key,
                        "field": field,
                        "vector": vector_bytes(unit_vector(vector)),
                    }
                )
        widths = {len(v["vector"]) for v in vectors}
        if len(widths) > 1:
            raise InvalidMessage("an item's embeddings have several dimensions")
        touched = list(last)
        renew = [
            {"n": as_text(ns), "k": key, "e": now + timedelta(minutes=ttl)}
            for ns, key, ttl in refresh
            if (as_text(ns), key) not in last
        ]
        sql = self._sql

        def program() -> Program[None]:
            if widths:
                stored = yield FETCH, sql.any_vector, {}
                if stored and len(stored[0][0]) not in widths:
                    raise InvalidMessage(
                        f"stored embeddings have {len(stored[0][0]) // 4} dimensions,"
                        f" not {next(iter(widths)) // 4}"
                    )
            # Each item's row first, in key order: on Postgres that locks it (a write
            # of the same item waits), so its vectors are then replaced by one writer.
            gone = [{"n": n, "k": k} for n, k in sorted(touched) if last[n, k].value is None]
            if gone:
                yield EXECUTE_MANY, sql.delete, gone
            if rows:
                yield (
                    EXECUTE_MANY,
                    sql.upsert,
                    sorted(rows, key=lambda r: (r["namespace"], r["key"])),
                )
            yield EXECUTE_MANY, sql.delete_vectors, [{"n": n, "k": k} for n, k in touched]
            if vectors:
                yield EXECUTE_MANY, sql.insert_vector, vectors
            if renew:
                yield EXECUTE_MANY, sql.renew, renew
            return None

        if touched:
            await self._executor.write(program(), action="writing items", lists=0)
        elif renew:
            await self._executor.write(program(), action="refreshing items", lists=0, short=True)

    async def sweep(self) -> int:
        """Delete the items whose time to live has run out (with their vectors); returns
        how many. Reads the expired items by index."""
        i, v = s.items, s.item_vectors
        now = _now()

        async def work(conn: AsyncConnection) -> int:
            expired = select(i.c.namespace, i.c.key).where(
                i.c.expires_at.is_not(None), i.c.expires_at <= now
            )
            keys = [(r[0], r[1]) for r in await conn.execute(expired)]
            for start in range(0, len(keys), _CHUNK):
                chunk = keys[start : start + _CHUNK]
                await conn.execute(delete(v).where(tuple_(v.c.namespace, v.c.key).in_(chunk)))
                await conn.execute(delete(i).where(tuple_(i.c.namespace, i.c.key).in_(chunk)))
            return len(keys)

        return await self._executor.run(work, mode="write", action="sweeping items")

    def _conditions(
        self, prefix: Sequence[str], where: Mapping[str, Any] | None
    ) -> tuple[list[ColumnElement[bool]], dict[str, Any], Hashable]:
        """What an item under ``prefix`` that is alive and matches ``where`` meets, the
        parameters of those conditions, and the shape of the filter (see ``_filters``)."""
        i = s.items
        params: dict[str, Any] = {"now": _now()}
        now = bindparam("now", type_=i.c.expires_at.type)
        found = [or_(i.c.expires_at.is_(None), i.c.expires_at > now)]
        if prefix:
            found.append(under_bound(i.c.namespace))
            params |= range_params(prefix)
        shape: Hashable = ()
        if where:
            condition, bound, shape = filter_condition(self._dialect, i.c.value, where)
            found.append(condition)
            params |= bound
        return found, params, shape


span_methods(ItemStore, lambda items: items._executor.calls, but=())  # noqa: SLF001


def _now() -> datetime:
    return datetime.now(timezone.utc)


def _ttl(ttl: float | None) -> float | None:
    if ttl is None:
        return None
    if isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or not ttl > 0:
        raise InvalidMessage("a ttl is a positive number of minutes")
    return float(ttl)


def _item(row: Any) -> StoredItem:
    """The item in a row of ``item_columns`` SQLAlchemy read (its types applied)."""
    return StoredItem(
        namespace=from_text(row[0]),
        key=row[1],
        value=json.loads(row[2]),
        created_at=row[3],
        updated_at=row[4],
        ttl=row[5],
    )


def _scored(item: StoredItem, score: float) -> StoredItem:
    return StoredItem(
        item.namespace, item.key, item.value, item.created_at, item.updated_at, item.ttl, score
    )


def _rank(probe: array[float], rows: Iterable[Any], k: int) -> list[tuple[float, str, str]]:
    """The ``k`` best (score, namespace, key) of ``rows``: each item's best vector."""
    width = 4 * len(probe)
    best: dict[tuple[str, str], float] = {}
    mul = operator.mul
    for ns, key, blob in rows:
        if len(blob) != width:
            raise InvalidMessage(
                f"stored embeddings have {len(blob) // 4} dimensions, not {len(probe)}"
            )
        vector = array("f")
        vector.frombytes(blob)
        if not _LITTLE:
            vector.byteswap()
        score = sum(map(mul, probe, vector))
        if score > best.get((ns, key), -2.0):
            best[ns, key] = score
    ranked = heapq.nsmallest(k, best.items(), key=lambda e: (-e[1], e[0]))
    return [(score, ns, key) for (ns, key), score in ranked]
