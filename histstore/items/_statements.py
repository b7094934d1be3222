"""The statements of the frequent item calls, compiled once per store for its driver
(``_storage.drivers``: one driver call each, without SQLAlchemy's execution layer), and
how a row of items is read back."""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import Integer, Select, bindparam, delete, or_, select, update
from sqlalchemy.engine import Dialect

from .._storage import schema as s
from .._storage.executor import Executor
from .._storage.statements import dialects as _dialects
from ._namespaces import from_text, namespace_walk, under_bound
from ._records import StoredItem

__all__ = ["ItemStatements", "item_columns"]


def item_columns() -> Select[Any]:
    """What an item is read with (``ItemStatements.item`` reads it back)."""
    i = s.items
    return select(i.c.namespace, i.c.key, i.c.value, i.c.created_at, i.c.updated_at, i.c.ttl)


class ItemStatements:
    """Reads: an item by key (``get``); the newest items under a prefix (``recent``) or
    of the whole store (``recent_all``); the namespaces (``walk``, ``walk_all``).
    Writes: deleting an item and its vectors, the upsert that keeps ``created_at``,
    inserting a vector, moving an expiry (``renew``), and one stored vector
    (``any_vector``, for its dimension). Parameters: ``n``/``k``
    (namespace text, key), ``now``, the prefix range (``range_params``), ``limit``,
    ``offset``; ``e`` (the new expiry)."""

    def __init__(self, executor: Executor, dialect: Dialect) -> None:
        i, v = s.items, s.item_vectors
        compile_ = executor.compile
        now = bindparam("now", type_=i.c.expires_at.type)
        alive = or_(i.c.expires_at.is_(None), i.c.expires_at > now)
        this = (i.c.namespace == bindparam("n"), i.c.key == bindparam("k"))
        self.get = compile_(item_columns().where(*this, alive))
        order = (i.c.updated_at.desc(), i.c.namespace, i.c.key)
        limit, offset = bindparam("limit", type_=Integer), bindparam("offset", type_=Integer)
        newest = item_columns().order_by(*order).limit(limit).offset(offset)
        self.recent = compile_(newest.where(under_bound(i.c.namespace), alive))
        self.recent_all = compile_(newest.where(alive))

        upsert = _dialects.insert(dialect, i)
        kept = {c: upsert.excluded[c] for c in ("value", "updated_at", "ttl", "expires_at")}
        self.upsert = compile_(
            upsert.on_conflict_do_update(index_elements=["namespace", "key"], set_=kept)
        )
        self.delete = compile_(delete(i).where(*this))
        vector_of = (v.c.namespace == bindparam("n"), v.c.key == bindparam("k"))
        self.delete_vectors = compile_(delete(v).where(*vector_of))
        self.insert_vector = compile_(v.insert())
        self.any_vector = compile_(select(v.c.vector).limit(1))
        renewed = update(i).where(*this, i.c.ttl.is_not(None)).values(expires_at=bindparam("e"))
        self.renew = compile_(renewed)
        self.walk = compile_(namespace_walk(True))
        self.walk_all = compile_(namespace_walk(False))
        self._time = executor.driver.result_processor(i.c.created_at.type)

    def item(self, row: Any) -> StoredItem:
        """The item in a row of ``item_columns`` the driver returned."""
        convert = self._time
        created, updated = (
            (row[3], row[4]) if convert is None else (convert(row[3]), convert(row[4]))
        )
        return StoredItem(
            namespace=from_text(row[0]),
            key=row[1],
            value=json.loads(row[2]),
            created_at=created,
            updated_at=updated,
            ttl=None if row[5] is None else float(row[5]),
        )
