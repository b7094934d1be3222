"""Search by meaning (SPEC 12): the caller's embeddings of messages, kept in
``histstore_vectors`` and ranked by exact cosine similarity.

A message is embedded from its text (``_core.search_text.indexed_text``, as
``statements.search.message_text`` reads it back); one without text gets no vector. A
vector is stored unit-normalized as float32 little-endian bytes (4 a dimension), keyed
by (conversation, position, model). The database deletes a message's vectors with the
message, so a vector always belongs to the message now at its place, with the text it
was made from.
"""

from __future__ import annotations

import asyncio
import heapq
import math
import operator
import secrets
import sys
from array import array
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy import select, tuple_
from sqlalchemy.ext.asyncio import AsyncConnection

from .._core import rules as _rules
from .._core.ids import validate_id
from .._core.models import Message, stored_message
from .._core.search_text import Hit
from .._errors import InvalidMessage
from .._storage import schema as s
from .._storage.calls import span_methods
from .._storage.drivers import EXECUTE, FETCH, Program
from .._storage.statements import dialects as _dialects
from .context import Context

if TYPE_CHECKING:
    from .._store import Store

__all__ = ["Embed", "SemanticIndex"]

Embed = Callable[[list[str]], Awaitable[Sequence[Sequence[float]]]]

_LITTLE = sys.byteorder == "little"
_OFF_LOOP = 2000  # rank this many vectors or more in a worker thread
_READ_CHUNK = 500  # (conversation, position) pairs per message read


class SemanticIndex:
    """A store's message vectors for one embedding ``model``, and search by them.

    ``embed`` is ``async (list[str]) -> list[list[float]]``; ``model`` names it (each
    model has vectors of its own). Over a scoped view the index embeds, searches and
    deletes only that user's conversations. What ``embed`` returns must be one vector per
    text, each a non-empty list of finite numbers, not all zero, all of the dimension of
    the vectors stored for ``model``: else ``InvalidMessage``, and nothing is stored.

    ``approximate=True`` looks for a vector index of the database (``vector_index``) at
    the first update or search. Ranking is exact in every case so far, so results are
    those of ``approximate=False``.

    Raises:
        TypeError: ``store`` is not a ``Store``, ``embed`` not callable, or
            ``approximate`` not a bool.
        InvalidId: ``model`` breaks the id rules (a str of 1 to 255 characters...).
    """

    def __init__(
        self, store: Store, embed: Embed, *, model: str, approximate: bool = False
    ) -> None:
        ctx = getattr(store, "internals", None)  # what a Store hands its own modules
        if not isinstance(ctx, Context):
            raise TypeError("SemanticIndex takes a histstore Store")
        if not callable(embed):
            raise TypeError("embed must be an async callable")
        if not isinstance(approximate, bool):
            raise TypeError("approximate must be a bool")
        self._ctx = ctx
        self._home = store
        self._embed = embed
        self._model = validate_id(model, what="model")
        self._approximate = approximate
        self._checked = not approximate
        self._vector_index: str | None = None
        self._sql = ctx.shared.semantic_statements(ctx.owner is not None)

    @property
    def model(self) -> str:
        """The name of the embedding model the vectors come from."""
        return self._model

    def scoped(self, user: str) -> SemanticIndex:
        """This index (embedder, model, ``approximate``) over ``store.scoped(user)``: it
        embeds, searches and deletes only ``user``'s conversations.

        Raises:
            InvalidId: ``user`` breaks the id rules.
            ValueError: the index's store is a view of another user.
        """
        return SemanticIndex(
            self._home.scoped(user), self._embed, model=self._model, approximate=self._approximate
        )

    @property
    def vector_index(self) -> str | None:
        """The vector index the database offers: ``"pgvector"``, ``"sqlite-vec"`` or
        ``None``. Looked up at the first update or search of an index made with
        ``approximate=True``; ``None`` before that, and always without ``approximate``."""
        return self._vector_index

    async def update(self, conversation: str | None = None, *, batch: int = 64) -> int:
        """Embed the messages with text and no vector for ``model``, in ``conversation``
        or every visible one; returns how many vectors it stored.

        Messages go in (conversation, position) order, ``batch`` texts a call of
        ``embed``, which runs outside any transaction; each batch's vectors are then
        committed in a transaction of their own, so an interrupted update keeps the
        finished batches and a rerun embeds only the rest. A vector is stored only while
        its message holds the text it was made from, and not when another update stored
        it first. What ``embed`` raises propagates.

        With ``conversation``, the index remembers how far it got (a mark per
        conversation and model, committed with each batch; deleting or moving messages
        lowers it), so an update reads only the messages after it: its cost follows the
        messages written (or edited) since the last update, not the history. Without,
        every visible message is looked at.

        Raises:
            InvalidId: a malformed ``conversation``.
            TypeError, ValueError: ``batch`` is not a positive int.
            InvalidMessage: what ``embed`` returned is not valid (see the class).
        """
        if conversation is not None:
            validate_id(conversation)
        size = _rules.positive(batch, "batch")
        await self._check_index()
        if conversation is not None:
            return await self._update_one(conversation, size)
        ctx, sql = self._ctx, self._sql
        params = {"after_c": "", "after": -1, "model": self._model, "owner": ctx.owner}
        params["limit"] = size
        stored = 0
        while True:
            rows = await ctx.executor.fetch(sql.pending_all, params, action="semantic update")
            if not rows:
                return stored
            texts = [str(r[2]) for r in rows]
            blobs = [_bytes(v) for v in await self._vectors(texts)]
            stored += await ctx.executor.write(self._store(rows, blobs), action="semantic update")
            params |= {"after_c": rows[-1][0], "after": rows[-1][1]}
            if len(rows) < size:
                return stored

    async def _update_one(self, conversation: str, size: int) -> int:
        """``update(conversation)``: from the conversation's mark for the model on.

        Each batch's vectors and the raised mark are committed together; the mark is
        raised only while no delete or move lowered it since it was read (then the next
        batch starts from the lowered mark), so a crash or a concurrent edit leaves it at
        or below the first message without its vector.
        """
        ctx, sql, model = self._ctx, self._sql, self._model
        ask = {"c": conversation, "model": model, "owner": ctx.owner}
        action = "semantic update"
        stored = 0
        while True:
            head = await ctx.executor.fetch(sql.mark, ask, action=action, conversation=conversation)
            if not head:
                return stored  # unknown, or not visible
            length, mark, seen = head[0]
            if mark is None:
                start = {**ask, "token": secrets.randbits(62)}
                await ctx.executor.write(
                    _run(sql.start_mark, start), action=action, conversation=conversation
                )
                continue
            page = {**ask, "after": mark, "limit": size}
            rows = await ctx.executor.fetch(
                sql.pending_one, page, action=action, conversation=conversation
            )
            # Past a full batch more may wait; else everything up to the length read
            # before looking was looked at (and what was written since, up to the last).
            last = int(rows[-1][1]) if rows else -1
            reached = last if len(rows) == size else max(int(length) - 1, last)
            if not rows and reached <= mark:
                return stored
            blobs = [_bytes(v) for v in await self._vectors([str(r[2]) for r in rows])]
            raise_to = {"c": conversation, "model": model, "seen": seen, "to": reached}
            stored += await ctx.executor.write(
                self._store(rows, blobs, raise_to), action=action, conversation=conversation
            )
            if len(rows) < size:
                return stored

    def _store(
        self, rows: Sequence[Any], blobs: list[bytes], raise_to: dict[str, Any] | None = None
    ) -> Program[int]:
        sql = self._sql
        stored = 0
        if rows:
            found = yield FETCH, sql.width, {"model": self._model}
            if found and int(found[0][0]) != len(blobs[0]):
                raise _dimensions(self._model, int(found[0][0]) // 4, len(blobs[0]) // 4)
        for (c, p, text_), blob in zip(rows, blobs, strict=True):
            params = {"c": c, "p": p, "text": text_, "model": self._model, "vector": blob}
            stored += len((yield FETCH, sql.insert, {**params, "owner": self._ctx.owner}))
        if raise_to is not None:
            yield FETCH, sql.advance, raise_to
        return stored

    async def search(self, query: str, *, conversation: str | None = None, k: int = 5) -> list[Hit]:
        """The ``k`` messages most similar to ``query`` by cosine similarity (``score``),
        best first, ties by (conversation, position); with ``conversation`` only its
        vectors are read. One call ``embed([query])``; every candidate is compared
        (exact); vectors and messages are read in one snapshot.

        Raises:
            InvalidId: a malformed ``conversation``.
            TypeError, ValueError: ``k`` is not a positive int.
            InvalidMessage: ``query`` is blank or not a str, what ``embed`` returned is
                not valid, or stored vectors have another dimension than the query's.
        """
        if conversation is not None:
            validate_id(conversation)
        top = _rules.positive(k, "k")
        if not isinstance(query, str) or not query.strip():
            raise InvalidMessage("a semantic query is a str with some text")
        self._ctx.executor.check()
        await self._check_index()
        (unit,) = await self._vectors([query])
        probe = array("d", unit)
        v, cv = s.vectors, s.conversations
        stmt = select(v.c.conversation_id, v.c.position, v.c.vector).where(v.c.model == self._model)
        if conversation is not None:
            stmt = stmt.where(v.c.conversation_id == conversation)
        if self._ctx.owner is not None:
            stmt = stmt.join(cv, cv.c.id == v.c.conversation_id).where(
                cv.c.owner == self._ctx.owner
            )

        async def work(conn: AsyncConnection) -> list[Hit]:
            rows = (await conn.execute(stmt)).all()
            if len(rows) >= _OFF_LOOP:
                best = await asyncio.to_thread(_rank, self._model, probe, rows, top)
            else:
                best = _rank(self._model, probe, rows, top)
            found = await _messages(conn, [(c, p) for _, c, p in best])
            return [
                Hit(c, p, found[c, p], min(1.0, max(-1.0, score)))
                for score, c, p in best
                if (c, p) in found
            ]

        return await self._ctx.executor.run(
            work, mode="snapshot", action="semantic search", conversation=conversation
        )

    async def delete(self, conversation: str) -> None:
        """Drop ``conversation``'s vectors for ``model`` (a later ``update`` embeds it
        again); nothing happens for an unknown one. Raises ``InvalidId`` for a bad id."""
        validate_id(conversation)
        params = self._ctx.params(conversation, model=self._model)

        def program() -> Program[None]:
            yield EXECUTE, self._sql.delete, params
            yield EXECUTE, self._sql.unmark, params
            return None

        await self._ctx.executor.write(
            program(), action="semantic delete", conversation=conversation
        )

    async def _vectors(self, texts: list[str]) -> list[array[float]]:
        """The embedder's vectors for ``texts``, checked and unit-normalized."""
        out = await self._embed(list(texts))
        if isinstance(out, (str, bytes, Mapping)) or not isinstance(out, Iterable):
            raise InvalidMessage("the embedder must return a list of vectors")
        given = list(out)
        if len(given) != len(texts):
            raise InvalidMessage(f"the embedder returned {len(given)} vectors for {len(texts)}")
        vectors = [_unit(v) for v in given]
        if len({len(v) for v in vectors}) > 1:
            raise InvalidMessage("the embedder returned vectors of several dimensions")
        return vectors

    async def _check_index(self) -> None:
        if self._checked:
            return

        async def work(conn: AsyncConnection) -> str | None:
            return await conn.run_sync(_dialects.find_vector_index)

        self._vector_index = await self._ctx.executor.run(
            work, mode="read", action="semantic index"
        )
        self._checked = True


def _run(statement: Any, params: dict[str, Any]) -> Program[None]:
    yield EXECUTE, statement, params
    return None


def _unit(values: object) -> array[float]:
    """``values`` as a unit vector of float32 (``InvalidMessage`` when it cannot be)."""
    if isinstance(values, (str, bytes, bytearray, Mapping)):
        raise InvalidMessage("an embedding must be a list of numbers")
    try:
        raw = array("d", values)  # type: ignore[call-overload]
    except (TypeError, ValueError, OverflowError):
        raise InvalidMessage("an embedding must be a list of numbers") from None
    if not raw:
        raise InvalidMessage("an embedding must not be empty")
    if not all(map(math.isfinite, raw)):
        raise InvalidMessage("an embedding must hold finite numbers only")
    scale = max(map(abs, raw))
    if scale == 0:
        raise InvalidMessage("an embedding must not be all zeros")
    scaled = [x / scale for x in raw]
    norm = math.hypot(*scaled)
    return array("f", [x / norm for x in scaled])


def _bytes(unit: array[float]) -> bytes:
    if not _LITTLE:
        unit = array("f", unit)
        unit.byteswap()
    return unit.tobytes()


def _dimensions(model: str, stored: int, given: int) -> InvalidMessage:
    return InvalidMessage(f"vectors of model {model!r} have {stored} dimensions, not {given}")


def _rank(
    model: str, probe: array[float], rows: Iterable[Any], k: int
) -> list[tuple[float, str, int]]:
    """The ``k`` best (score, conversation, position) of ``rows`` against ``probe``."""
    width = 4 * len(probe)
    mul = operator.mul

    def scores() -> Iterable[tuple[float, str, int]]:
        for c, p, blob in rows:
            if len(blob) != width:
                raise _dimensions(model, len(blob) // 4, len(probe))
            vector = array("f")
            vector.frombytes(blob)
            if not _LITTLE:
                vector.byteswap()
            yield sum(map(mul, probe, vector)), c, int(p)

    return heapq.nsmallest(k, scores(), key=lambda t: (-t[0], t[1], t[2]))


async def _messages(conn: AsyncConnection, keys: list[tuple[str, int]]) -> dict[Any, Message]:
    """The stored messages at ``keys``, by key."""
    m = s.messages
    found: dict[Any, Message] = {}
    for i in range(0, len(keys), _READ_CHUNK):
        where = tuple_(m.c.conversation_id, m.c.position).in_(keys[i : i + _READ_CHUNK])
        stmt = select(m.c.conversation_id, m.c.position, m.c.data, m.c.created_at).where(where)
        for c, p, data, created_at in await conn.execute(stmt):
            found[c, int(p)] = stored_message(data, int(p), created_at)
    return found


# Each public coroutine is one call for ``close()`` (``_storage.calls``): an update's
# batches, with the embedder's calls between them, are waited for, not refused half way.
span_methods(SemanticIndex, lambda index: index._ctx.executor.calls, but=())  # noqa: SLF001

unit_vector = _unit
"""``values`` as a unit float32 vector, checked (``InvalidMessage`` otherwise); also what
``histstore.items`` stores an item's embeddings as."""
vector_bytes = _bytes
"""A unit vector as stored: float32 little-endian bytes."""
