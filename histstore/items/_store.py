"""``ItemStore``: every statement on ``histstore_items`` and ``histstore_item_vectors``."""

from __future__ import annotations

import asyncio
import heapq
import json
import operator
import sys
from array import array
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

from sqlalchemy import ColumnElement, and_, bindparam, delete, or_, select, tuple_, update
from sqlalchemy.ext.asyncio import AsyncConnection

from .._core import codec as _codec
from .._errors import InvalidMessage
from .._ops.semantic import unit_vector, vector_bytes
from .._storage import schema as s
from .._storage.statements import dialects as _dialects
from ._filters import filter_condition
from ._namespaces import MatchRule, as_text, fixed_prefix, from_text, matches, namespace_walk, under

if TYPE_CHECKING:
    from .._store import Store

__all__ = ["ItemStore", "ItemWrite", "StoredItem"]

_CHUNK = 400  # keys per IN list
_WALK_PAGE = 100  # namespaces per step of a listing
_OFF_LOOP = 2000  # rank this many vectors or more in a worker thread
_LITTLE = sys.byteorder == "little"


@dataclass(frozen=True)
class StoredItem:
    """An item as stored; ``score`` is its similarity to a search's query (else ``None``);
    ``ttl`` its time to live in minutes (``None``: it never expires)."""

    namespace: tuple[str, ...]
    key: str
    value: dict[str, Any]
    created_at: datetime
    updated_at: datetime
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


class ItemStore:
    """Long-term memory items (JSON objects by namespace and key) in a store's database.

    Every call is one statement or one transaction through the store's executor. An item
    whose time to live has run out is gone for every read, and deleted by ``sweep``.
    Costs: a get is a primary-key lookup; a search or a listing reads the range of the
    primary key its prefix covers (then filters and orders what is there); ``sweep``
    reads the expired items by index.

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

    # ------------------------------------------------------------------ reads

    async def get(self, keys: Sequence[tuple[tuple[str, ...], str]]) -> dict[Any, StoredItem]:
        """The unexpired items at these (namespace, key) pairs, by pair (one snapshot)."""
        pairs = list(dict.fromkeys((as_text(ns), k) for ns, k in keys))
        i = s.items
        now = _now()

        async def work(conn: AsyncConnection) -> dict[Any, StoredItem]:
            found: dict[Any, StoredItem] = {}
            for start in range(0, len(pairs), _CHUNK):
                chunk = pairs[start : start + _CHUNK]
                stmt = _item_columns().where(tuple_(i.c.namespace, i.c.key).in_(chunk), _alive(now))
                for row in await conn.execute(stmt):
                    item = _item(row)
                    found[item.namespace, item.key] = item
            return found

        if not pairs:
            return {}
        mode: Any = "read" if len(pairs) <= _CHUNK else "snapshot"  # one statement: atomic
        return await self._executor.run(work, mode=mode, action="reading items")

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
        i = s.items
        stmt = (
            _item_columns()
            .where(*self._conditions(prefix, where, _now()))
            .order_by(i.c.updated_at.desc(), i.c.namespace, i.c.key)
            .limit(max(0, limit))
            .offset(max(0, offset))
        )

        async def work(conn: AsyncConnection) -> list[StoredItem]:
            return [_item(row) for row in await conn.execute(stmt)]

        return await self._executor.run(work, mode="read", action="searching items")

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
        now = _now()
        candidates = (
            select(v.c.namespace, v.c.key, v.c.vector)
            .select_from(joined)
            .where(*self._conditions(prefix, where, now))
        )
        top = max(0, offset) + max(0, limit)

        async def work(conn: AsyncConnection) -> list[StoredItem]:
            rows = (await conn.execute(candidates)).all()
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
                stmt = _item_columns().where(
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
        walk = namespace_walk(fixed)
        wanted = max(0, offset) + max(0, limit)
        out: list[tuple[str, ...]] = []
        seen: set[tuple[str, ...]] = set()
        start = as_text(fixed)
        while len(out) < wanted:
            params = {"start": start, "page": _WALK_PAGE}
            page = await self._executor.run(
                lambda conn, p=params: _scalars(conn, walk, p),  # type: ignore[misc]
                mode="read",
                action="listing namespaces",
            )
            if not page:
                break
            cursor = None
            for stored in page:
                if cursor is not None and stored < cursor:
                    continue
                namespace = from_text(stored)
                cursor = stored + "\x01"
                if not matches(namespace, rules):
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
            start = cursor
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
        i, v = s.items, s.item_vectors
        dialect = self._dialect

        async def work(conn: AsyncConnection) -> None:
            if widths:
                stored = await conn.execute(select(v.c.vector).limit(1))
                first = stored.first()
                if first is not None and len(first[0]) not in widths:
                    raise InvalidMessage(
                        f"stored embeddings have {len(first[0]) // 4} dimensions,"
                        f" not {next(iter(widths)) // 4}"
                    )
            # Each item's row first, in key order: on Postgres that locks it (a write
            # of the same item waits), so its vectors are then replaced by one writer.
            gone = sorted(k for k in touched if last[k].value is None)
            for start in range(0, len(gone), _CHUNK):
                chunk = gone[start : start + _CHUNK]
                await conn.execute(delete(i).where(tuple_(i.c.namespace, i.c.key).in_(chunk)))
            if rows:
                upsert = _dialects.insert(dialect, i)
                kept = {c: upsert.excluded[c] for c in ("value", "updated_at", "ttl", "expires_at")}
                await conn.execute(
                    upsert.on_conflict_do_update(index_elements=["namespace", "key"], set_=kept),
                    sorted(rows, key=lambda r: (r["namespace"], r["key"])),
                )
            for start in range(0, len(touched), _CHUNK):
                chunk = touched[start : start + _CHUNK]
                await conn.execute(delete(v).where(tuple_(v.c.namespace, v.c.key).in_(chunk)))
            if vectors:
                await conn.execute(v.insert(), vectors)
            if renew:
                stmt = (
                    update(i)
                    .where(
                        i.c.namespace == bindparam("n"),
                        i.c.key == bindparam("k"),
                        i.c.ttl.is_not(None),
                    )
                    .values(expires_at=bindparam("e"))
                )
                await conn.execute(stmt, renew)

        if rows or touched or renew:
            await self._executor.run(work, mode="write", action="writing items")

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
        self, prefix: Sequence[str], where: Mapping[str, Any] | None, now: datetime
    ) -> list[ColumnElement[bool]]:
        i = s.items
        found = [under(i.c.namespace, prefix), _alive(now)]
        if where:
            found.append(filter_condition(self._dialect, i.c.value, where))
        return found


def _now() -> datetime:
    return datetime.now(timezone.utc)


def _alive(now: datetime) -> ColumnElement[bool]:
    i = s.items
    return or_(i.c.expires_at.is_(None), i.c.expires_at > now)


def _ttl(ttl: float | None) -> float | None:
    if ttl is None:
        return None
    if isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or not ttl > 0:
        raise InvalidMessage("a ttl is a positive number of minutes")
    return float(ttl)


def _item_columns() -> Any:
    i = s.items
    return select(i.c.namespace, i.c.key, i.c.value, i.c.created_at, i.c.updated_at, i.c.ttl)


def _item(row: Any) -> StoredItem:
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


async def _scalars(conn: AsyncConnection, stmt: Any, params: dict[str, Any]) -> list[str]:
    return [str(r[0]) for r in await conn.execute(stmt, params)]


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
