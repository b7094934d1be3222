"""Long-term memory items (``histstore.items``) in export, import and copy (format
version 4, ``_transfer.format``).

After the threads, each unexpired item is one ``memory`` record::

    {"type": "memory", "namespace": [LABEL, ...], "key": KEY, "value": OBJECT,
     "created_at": TIME, "updated_at": TIME, "ttl": MINUTES|null,
     "expires_at": TIME|null, "vectors": {FIELD: BASE64}}

``value`` is the stored JSON object as it is; ``ttl`` its time to live in minutes and
``expires_at`` when it runs out as stored (a refreshing read or a write moves it on);
``vectors`` the item's embeddings by field as stored (unit float32 vectors, little
endian, standard base64), so the destination searches them with no embedding call.

Items are read and written ``batch`` at a time at most (``ITEM_BATCH``), by primary key:
each page with its vectors in one snapshot, each incoming batch in one write
transaction. An incoming item replaces the destination's of the same namespace and key
(value, times, expiry and vectors) unless that holds the very same (then it counts as
skipped); items only at the destination are left alone. Items belong to no user: a
scoped view exports none, and one importing or copying items raises ``NotFound``.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import AsyncIterator, Mapping, Sequence
from datetime import datetime, timezone
from typing import IO, Any

from sqlalchemy import delete, or_, select, tuple_
from sqlalchemy.ext.asyncio import AsyncConnection

from .._core import codec as _codec
from .._core import rules as _rules
from .._errors import HistStoreError, InvalidMessage, NotFound
from .._ops.context import Context
from .._storage import schema as s
from .._storage.statements import dialects as _dialects
from .format import Progress, Reader, TransferStats, time_text

__all__ = ["ITEM_BATCH", "ItemSource", "ItemTarget", "copy_items", "export_items", "import_items"]

ITEM_BATCH = 200
"""Items read or written at a time, at most (fewer when a transfer's ``batch`` is)."""

_ITEMS, _VECTORS = s.items, s.item_vectors
_SEPARATOR = "."  # how a namespace's labels are stored (``histstore.items._namespaces``)

Key = tuple[str, str]  # (stored namespace, key)


class ItemSource:
    """A store's unexpired items, by primary key, a page at a time (a whole store's only:
    a scoped view sees none)."""

    def __init__(self, ctx: Context, *, batch: int) -> None:
        self._ctx = ctx
        self._batch = min(batch, ITEM_BATCH)
        self._now = datetime.now(timezone.utc)

    def _alive(self) -> Any:
        i = _ITEMS
        return or_(i.c.expires_at.is_(None), i.c.expires_at > self._now)

    async def any(self) -> bool:
        """Whether the source holds an unexpired item."""
        if self._ctx.owner is not None:
            return False
        async with self._ctx.executor.session("read", action="export") as conn:
            stmt = select(_ITEMS.c.key).where(self._alive()).limit(1)
            return (await conn.execute(stmt)).first() is not None

    async def pages(self) -> AsyncIterator[list[dict[str, Any]]]:
        """The items (rows of the items table, with ``vectors``: field to bytes)."""
        if self._ctx.owner is not None:
            return
        i = _ITEMS
        last: Key | None = None
        while True:
            stmt = select(i).where(self._alive())
            if last is not None:
                stmt = stmt.where(tuple_(i.c.namespace, i.c.key) > tuple_(*last))
            stmt = stmt.order_by(i.c.namespace, i.c.key).limit(self._batch)
            async with self._ctx.executor.session("snapshot", action="export") as conn:
                rows = [dict(r) for r in (await conn.execute(stmt)).mappings()]
                if rows:
                    vectors = await _vectors(conn, [(r["namespace"], r["key"]) for r in rows])
            if not rows:
                return
            for row in rows:
                row["vectors"] = vectors.get((row["namespace"], row["key"]), {})
            yield rows
            if len(rows) < self._batch:
                return
            last = (rows[-1]["namespace"], rows[-1]["key"])


async def _vectors(conn: AsyncConnection, keys: Sequence[Key]) -> dict[Key, dict[str, bytes]]:
    """The vectors of the items ``keys`` by item, each by field."""
    v = _VECTORS
    out: dict[Key, dict[str, bytes]] = {}
    stmt = select(v.c.namespace, v.c.key, v.c.field, v.c.vector).where(
        tuple_(v.c.namespace, v.c.key).in_(list(keys))
    )
    for ns, key, field, vector in await conn.execute(stmt):
        out.setdefault((ns, key), {})[field] = bytes(vector)
    return out


def item_line(row: Mapping[str, Any]) -> str:
    """A ``memory`` record for an item row (with its ``vectors``)."""
    expires = row["expires_at"]
    vectors = {f: base64.b64encode(b).decode("ascii") for f, b in sorted(row["vectors"].items())}
    head = {
        "type": "memory",
        "namespace": row["namespace"].split(_SEPARATOR),
        "key": row["key"],
    }
    tail = {
        "created_at": time_text(row["created_at"]),
        "updated_at": time_text(row["updated_at"]),
        "ttl": row["ttl"],
        "expires_at": None if expires is None else time_text(expires),
        "vectors": vectors,
    }
    dump = json.dumps
    return (
        f"{dump(head, ensure_ascii=False, separators=(',', ':'))[:-1]},"
        f'"value":{row["value"]},{dump(tail, separators=(",", ":"))[1:]}\n'
    )


def _label(value: object) -> str:
    label = _codec.check_text(value, what="a namespace label")
    if not label or _SEPARATOR in label:
        raise InvalidMessage("a namespace label is a non-empty text without '.'")
    return label


def check_item(row: dict[str, Any]) -> dict[str, Any]:
    """An item row (with ``vectors``) the destination stores as it is.

    Raises:
        InvalidMessage: an empty namespace or label, a label holding ``.``, a key or field
            a text column cannot hold, a value that is not a JSON object, a bad time or
            ttl, vectors that are empty, not whole float32s or of several dimensions.
    """
    namespace = row["namespace"]
    if not namespace:
        raise InvalidMessage("an item's namespace is empty")
    for label in namespace.split(_SEPARATOR):
        _label(label)
    _codec.check_text(row["key"], what="an item's key")
    if not str(row["value"]).startswith("{"):
        raise InvalidMessage("an item's value is a JSON object")
    for name in ("created_at", "updated_at"):
        row[name] = _rules.time(row[name], f"an item's {name!r}")
    if row["expires_at"] is not None:
        row["expires_at"] = _rules.time(row["expires_at"], "an item's 'expires_at'")
    ttl = row["ttl"]
    if ttl is not None:
        if isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or not ttl > 0:
            raise InvalidMessage("an item's ttl is a positive number of minutes")
        row["ttl"] = float(ttl)
    widths = set()
    for field, vector in row["vectors"].items():
        _codec.check_text(field, what="a vector's field")
        if not vector or len(vector) % 4:
            raise InvalidMessage(f"vector {field!r} is not whole float32 numbers")
        widths.add(len(vector))
    if len(widths) > 1:
        raise InvalidMessage("an item's embeddings have several dimensions")
    return row


def decode_item(reader: Reader, record: Mapping[str, Any]) -> dict[str, Any]:
    """The item row (with ``vectors``) a ``memory`` record stands for, checked.

    Raises:
        FormatError: a field missing or of the wrong kind, or a value the store refuses.
    """
    namespace = reader.field(record, "namespace", list)
    labels = [reader.rule(_label, label) for label in namespace]
    value = record.get("value")
    if not isinstance(value, dict):
        raise reader.error("an item's 'value' must be a JSON object")
    vectors = record.get("vectors", {})
    if not isinstance(vectors, dict):
        raise reader.error("an item's 'vectors' must be an object")
    blobs: dict[str, bytes] = {}
    for field, text in vectors.items():
        if not isinstance(text, str):
            raise reader.error(f"vector {field!r} must be base64 text")
        try:
            blobs[field] = base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError):
            raise reader.error(f"vector {field!r} is not base64") from None
    expires = None if record.get("expires_at") is None else reader.time(record, "expires_at")
    row = {
        "namespace": _SEPARATOR.join(labels),
        "key": reader.field(record, "key", str),
        "value": reader.rule(_codec.encode_decoded, value, what="an item's value")[0],
        "created_at": reader.time(record, "created_at"),
        "updated_at": reader.time(record, "updated_at"),
        "ttl": record.get("ttl"),
        "expires_at": expires,
        "vectors": blobs,
    }
    return reader.rule(check_item, row)


class ItemTarget:
    """Stores incoming items in ``ctx``'s store (see the module doc)."""

    def __init__(self, ctx: Context, *, action: str) -> None:
        self._ctx = ctx
        self._action = action
        self._dialect = ctx.executor.engine.dialect

    async def apply(self, rows: Sequence[dict[str, Any]]) -> int:
        """Make the destination's items at the keys of ``rows`` (checked, with
        ``vectors``) hold them, in one transaction; how many changed.

        Raises:
            NotFound: the destination is a scoped view (it sees no items).
            InvalidMessage: vectors of another dimension than those the destination holds.
        """
        if self._ctx.owner is not None:
            raise NotFound("memory items are not seen through a scoped view (import them whole)")
        last = {(r["namespace"], r["key"]): r for r in rows}
        if not last:
            return 0
        i, v = _ITEMS, _VECTORS
        upsert = _dialects.insert(self._dialect, i)
        columns = [c.name for c in i.columns if c.name not in ("namespace", "key")]
        upsert = upsert.on_conflict_do_update(
            index_elements=["namespace", "key"], set_={c: upsert.excluded[c] for c in columns}
        )

        async def work(conn: AsyncConnection) -> int:
            keys = sorted(last)
            stored: dict[Key, dict[str, Any]] = {}
            stmt = select(i).where(tuple_(i.c.namespace, i.c.key).in_(keys))
            for found in (await conn.execute(stmt)).mappings():
                stored[found["namespace"], found["key"]] = dict(found)
            vectors = await _vectors(conn, keys)
            changed = [k for k in keys if not _same(stored.get(k), vectors.get(k, {}), last[k])]
            if not changed:
                return 0
            incoming = [b for k in changed for b in last[k]["vectors"].values()]
            if incoming:
                held = (await conn.execute(select(v.c.vector).limit(1))).first()
                if held is not None and len(held[0]) != len(incoming[0]):
                    raise InvalidMessage(
                        f"stored embeddings have {len(held[0]) // 4} dimensions,"
                        f" not {len(incoming[0]) // 4}"
                    )
            # The items' rows first, in key order: on Postgres that locks them (a write of
            # the same item waits), so their vectors are then replaced by one writer.
            items = [{k: last[key][k] for k in ("namespace", "key", *columns)} for key in changed]
            await conn.execute(upsert, items)
            await conn.execute(delete(v).where(tuple_(v.c.namespace, v.c.key).in_(changed)))
            blobs = [
                {"namespace": ns, "key": key, "field": field, "vector": blob}
                for ns, key in changed
                for field, blob in last[ns, key]["vectors"].items()
            ]
            if blobs:
                await conn.execute(v.insert(), blobs)
            return len(changed)

        return await self._ctx.executor.run(work, mode="write", action=self._action)


def _same(stored: dict[str, Any] | None, vectors: dict[str, bytes], row: dict[str, Any]) -> bool:
    if stored is None:
        return False
    names = ("value", "created_at", "updated_at", "ttl", "expires_at")
    return all(stored[n] == row[n] for n in names) and vectors == row["vectors"]


def _count(stats: TransferStats, total: int, changed: int) -> None:
    stats.items += changed
    stats.skipped_items += total - changed


async def export_items(
    source: ItemSource, out: IO[str], stats: TransferStats, progress: Progress | None
) -> int:
    """Write every item of ``source``; returns how many."""
    written = 0
    async for rows in source.pages():
        out.write("".join(item_line(r) for r in rows))
        written += len(rows)
        stats.items += len(rows)
        if progress is not None:
            progress(stats)
    return written


async def copy_items(
    source: ItemSource, target: ItemTarget, stats: TransferStats, progress: Progress | None
) -> None:
    """Store every item of ``source`` at ``target``, checked by the destination's rules.

    Raises:
        InvalidMessage: a source item the target refuses (named); the batches before
            it are kept.
    """
    async for rows in source.pages():
        checked = []
        for row in rows:
            try:
                checked.append(check_item(dict(row)))
            except HistStoreError as exc:
                raise type(exc)(f"item {row['key']!r} in {row['namespace']!r}: {exc}") from None
        _count(stats, len(checked), await target.apply(checked))
        if progress is not None:
            progress(stats)


async def import_items(
    reader: Reader,
    record: dict[str, Any],
    target: ItemTarget,
    batch: int,
    stats: TransferStats,
    progress: Progress | None,
) -> tuple[dict[str, Any], int]:
    """Store the file's items, from ``record`` (the first ``memory`` record) to the
    footer, ``batch`` at a time; returns the footer and how many items were read.

    Raises:
        FormatError: a record that is not what the format says, or vectors of another
            dimension than the destination's (names the line); the batches before it
            are stored, the one it belongs to is not.
    """
    size = min(batch, ITEM_BATCH)
    read = first = 0
    rows: list[dict[str, Any]] = []
    while True:
        kind = record.get("type")
        if kind == "footer":
            break
        if kind != "memory":
            raise reader.error(f"expected a memory record or the footer, found {kind!r}")
        if not rows:
            first = reader.number
        rows.append(decode_item(reader, record))
        read += 1
        if len(rows) >= size:
            await _store(reader, first, target, rows, stats, progress)
            rows = []
        following = reader.next()
        if following is None:
            raise reader.error("the file ends before its footer (truncated?)")
        record = following
    if rows:
        await _store(reader, first, target, rows, stats, progress)
    return record, read


async def _store(
    reader: Reader,
    first: int,
    target: ItemTarget,
    rows: list[dict[str, Any]],
    stats: TransferStats,
    progress: Progress | None,
) -> None:
    """Store a batch of the file's items (from line ``first``); the destination's refusal
    names that line."""
    try:
        _count(stats, len(rows), await target.apply(rows))
    except InvalidMessage as exc:
        raise reader.error(f"the memory items from here on: {exc}", first) from None
    if progress is not None:
        progress(stats)
