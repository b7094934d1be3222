"""The Store: conversation history and state over one SQLAlchemy ``AsyncEngine``."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable, Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, Literal, TypeVar

from sqlalchemy import (
    BigInteger,
    ColumnElement,
    Integer,
    Select,
    and_,
    bindparam,
    delete,
    exists,
    func,
    literal,
    literal_column,
    select,
    update,
)
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from . import _codec, _dialects, _fastpath
from . import _schema as s
from ._dialects import Mode
from ._engine import SETTINGS_OPTION, SqliteSettings, is_memory_url
from ._errors import (
    DATABASE_ERRORS,
    ConflictError,
    HistStoreError,
    InvalidMessage,
    NotFound,
    WriteError,
    describe,
    translate_errors,
)
from ._ids import validate_id
from ._models import ConversationState, Message, MessageLike, Summary, WriteOutcome, as_message
from ._tx import run_to_completion

__all__ = ["Store", "StoreSettings"]

T = TypeVar("T")
Order = Literal["id", "created", "updated"]

_conv = s.conversations
_msg = s.messages
_writes = s.writes
_ZERO = WriteOutcome(0, False, None)
_SYSTEM: ColumnElement[str] = literal_column(
    "'system'"
)  # a literal, so SQLite can use the partial index


def _now() -> datetime:
    return datetime.now(timezone.utc)


def _count(value: object, name: str, *, allow_none: bool = True) -> int | None:
    if value is None and allow_none:
        return None
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int")
    if value < 0:
        raise ValueError(f"{name} must not be negative")
    return value


@dataclass(frozen=True)
class StoreSettings:
    """Options given to ``connect()`` that shape every call of a store."""

    count_tokens: Callable[[Message], int] | None = None
    max_message_bytes: int = 16 * 1024 * 1024
    max_batch: int = 10_000
    sqlite: SqliteSettings | None = None


class _Statements:
    """The hot-path statements: Core statements with bound parameters, compiled once per
    engine and kind of store (whole or scoped) for the fast path (see ``_fastpath``).

    Parameters: ``c`` (conversation id), ``owner`` (a view's user), and per statement
    the rest.
    """

    def __init__(self, driver: _fastpath.Driver, scoped: bool) -> None:
        dialect = driver.dialect
        conv_id = bindparam("c", type_=_conv.c.id.type)
        owned: ColumnElement[bool] = _conv.c.id == conv_id
        if scoped:
            owned = and_(owned, _conv.c.owner == bindparam("owner", type_=_conv.c.owner.type))
        compile_ = driver.compile
        self.count = compile_(select(_conv.c.length).where(owned))
        self.exists = compile_(select(_conv.c.id).where(owned))

        cols = (_msg.c.data, _msg.c.position, _msg.c.created_at)
        base = [_msg.c.conversation_id == conv_id, _msg.c.position >= bindparam("start")]
        if scoped:
            base.append(exists().where(owned))
        upto = _msg.c.position < bindparam("stop")
        limit = bindparam("limit", type_=Integer)
        newest = _msg.c.position.desc()
        self.read = {
            (False, False): compile_(select(*cols).where(*base).order_by(_msg.c.position)),
            (False, True): compile_(select(*cols).where(*base, upto).order_by(_msg.c.position)),
            (True, False): compile_(select(*cols).where(*base).order_by(newest).limit(limit)),
            (True, True): compile_(select(*cols).where(*base, upto).order_by(newest).limit(limit)),
        }
        system = [_msg.c.conversation_id == conv_id, _msg.c.role == _SYSTEM, *base[2:]]
        self.read_system = compile_(select(*cols).where(*system).order_by(_msg.c.position))
        self.created_at = driver.result_processor(_msg.c.created_at.type)

        n = bindparam("n", type_=BigInteger)
        now = bindparam("now", type_=_conv.c.updated_at.type)
        ins = _dialects.insert(dialect, _conv).values(
            id=conv_id,
            owner=bindparam("owner", type_=_conv.c.owner.type),
            length=n,
            created_at=now,
            updated_at=now,
        )
        # Creates the conversation or adds n to its length, locking its row, and
        # returns the new length: the batch goes at positions length-n .. length-1.
        self.append = compile_(
            ins.on_conflict_do_update(
                index_elements=[_conv.c.id],
                set_={"length": _conv.c.length + n, "updated_at": now},
                where=(_conv.c.owner == bindparam("owner")) if scoped else None,
            ).returning(_conv.c.length)
        )
        # Appends only when the conversation holds exactly ``at`` messages.
        self.append_at = compile_(
            update(_conv)
            .where(owned, _conv.c.length == bindparam("at", type_=BigInteger))
            .values(length=bindparam("new_length", type_=BigInteger), updated_at=now)
            .returning(_conv.c.length)
        )
        self.insert_messages = compile_(_msg.insert())
        self.insert_write = compile_(_writes.insert())
        # For a caller's key: returns nothing when the key is already recorded.
        self.insert_write_once = compile_(
            _dialects.insert(dialect, _writes)
            .on_conflict_do_nothing(index_elements=[_writes.c.conversation_id, _writes.c.key])
            .returning(_writes.c.key)
        )

        # Creates the conversation or marks it changed, locking its row; returns its
        # length, or nothing when a view may not see it.
        self.touch = compile_(
            ins.values(length=0)
            .on_conflict_do_update(
                index_elements=[_conv.c.id],
                set_={"updated_at": now},
                where=(_conv.c.owner == bindparam("owner")) if scoped else None,
            )
            .returning(_conv.c.length)
        )
        md, lists = s.metadata_entries, s.lists
        md_ins = _dialects.insert(dialect, md)
        self.set_metadata = compile_(
            md_ins.on_conflict_do_update(
                index_elements=[md.c.conversation_id, md.c.key],
                set_={"value": md_ins.excluded.value, "digest": md_ins.excluded.digest},
            )
        )
        self.delete_metadata = compile_(
            delete(md).where(md.c.conversation_id == conv_id, md.c.key == bindparam("key"))
        )
        k = bindparam("k", type_=BigInteger)
        # Creates the list or adds k to its length; returns the new length.
        self.grow_list = compile_(
            _dialects.insert(dialect, lists)
            .values(
                conversation_id=conv_id,
                name=bindparam("name", type_=lists.c.name.type),
                length=k,
            )
            .on_conflict_do_update(
                index_elements=[lists.c.conversation_id, lists.c.name],
                set_={"length": lists.c.length + k},
            )
            .returning(lists.c.length)
        )
        self.insert_list_items = compile_(s.list_items.insert())

        # pop: shortens the conversation by one, returning the new length (the position
        # of the message to remove), or nothing when it is empty or not visible.
        self.shorten = compile_(
            update(_conv)
            .where(owned, _conv.c.length > 0)
            .values(length=_conv.c.length - 1, updated_at=now)
            .returning(_conv.c.length)
        )
        self.delete_message = compile_(
            delete(_msg)
            .where(
                _msg.c.conversation_id == conv_id,
                _msg.c.position == bindparam("position", type_=BigInteger),
            )
            .returning(*cols)
        )
        sm = s.summaries
        self.next_summary = compile_(
            select(func.coalesce(func.max(sm.c.seq) + 1, 0)).where(sm.c.conversation_id == conv_id)
        )
        self.insert_summary = compile_(sm.insert())


class _Shared:
    """What a store and its scoped views share: the fast-path driver, its connection
    cache, and the hot-path statements (compiled once per engine, not per view)."""

    def __init__(self, engine: AsyncEngine, sqlite: SqliteSettings | None) -> None:
        driver = _fastpath.for_dialect(engine.dialect, sqlite)
        if driver is None:
            raise ValueError("histstore runs on sqlite+aiosqlite and postgresql+asyncpg only")
        self.driver = driver
        self.connections = _fastpath.ConnectionCache.for_engine(engine)
        self._statements: dict[bool, _Statements] = {}

    def statements(self, scoped: bool) -> _Statements:
        """The hot-path statements for a whole store or (``scoped``) a user's view."""
        sql = self._statements.get(scoped)
        if sql is None:
            sql = self._statements[scoped] = _Statements(self.driver, scoped)
        return sql


@dataclass
class _Prepared:
    """A validated batch, ready to write."""

    messages: list[Message]
    tokens: list[int | None]
    digest: str


class Store:
    """Conversation history and state in one SQL database.

    Made by ``histstore.connect()``. Every method is a coroutine, validates its
    arguments before touching the database, and raises only ``HistStoreError``
    subclasses (plus ``TypeError``/``ValueError`` for arguments of the wrong kind).
    A store made from a URL or path owns its engine and disposes it on ``close()``; one
    made from an ``AsyncEngine`` borrows it.
    """

    def __init__(
        self,
        engine: AsyncEngine,
        *,
        owns_engine: bool,
        settings: StoreSettings,
        owner: str | None = None,
        shared: _Shared | None = None,
    ) -> None:
        self._engine = engine
        self._owns_engine = owns_engine
        self._settings = settings
        self._owner = owner
        self._closed = False
        options: dict[str, Any] = {}
        if settings.sqlite is not None:
            options[SETTINGS_OPTION] = settings.sqlite
        self._dialect = engine.dialect
        self._is_view = shared is not None
        self._shared = _Shared(engine, settings.sqlite) if shared is None else shared
        self._driver = self._shared.driver
        self._connections = self._shared.connections
        self._in_memory = is_memory_url(engine.url)
        self._sql = self._shared.statements(owner is not None)
        self._engines = {
            mode: engine.execution_options(**options, **_dialects.mode_options(self._dialect, mode))
            for mode in ("read", "snapshot", "write")
        }

    # ------------------------------------------------------------------ basics

    @property
    def engine(self) -> AsyncEngine:
        """The SQLAlchemy engine the store runs on."""
        return self._engine

    @property
    def user(self) -> str | None:
        """The owner a scoped view is confined to; ``None`` for the whole store."""
        return self._owner

    @property
    def count_tokens(self) -> Callable[[Message], int] | None:
        """The token counter given to ``connect()``, or ``None``."""
        return self._settings.count_tokens

    def scoped(self, user: str) -> Store:
        """A view of the store confined to the conversations ``user`` owns.

        Conversations the view creates are owned by ``user``; a conversation owned by
        someone else, or by no one, behaves through the view as if it did not exist.
        The view shares the store's engine; closing it does nothing.

        Raises:
            InvalidId: ``user`` breaks the id rules.
            ValueError: this store is already a view of another user.
        """
        validate_id(user, what="user")
        if self._owner is not None and self._owner != user:
            raise ValueError("a scoped view cannot be re-scoped to another user")
        return Store(
            self._engine,
            owns_engine=False,
            settings=self._settings,
            owner=user,
            shared=self._shared,
        )

    async def close(self) -> None:
        """Release the store; disposes the engine when the store owns it. Idempotent.

        Closing a store (not a view) gives the connections it kept back to the pool.
        """
        if self._closed:
            return
        self._closed = True
        if not self._is_view:
            await self._connections.close()
        if self._owns_engine:
            await self._engine.dispose()

    async def __aenter__(self) -> Store:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __repr__(self) -> str:
        url = self._engine.url.render_as_string(hide_password=True)
        scope = "" if self._owner is None else f", user={self._owner!r}"
        return f"<histstore.Store {url}{scope}>"

    # ------------------------------------------------------------------ plumbing

    def _check_open(self) -> None:
        if self._closed:
            raise HistStoreError("the store is closed")

    async def _run(
        self,
        work: Callable[[AsyncConnection], Awaitable[T]],
        *,
        mode: Mode,
        action: str,
        conversation: str | None = None,
    ) -> T:
        """Run ``work`` in one transaction of the given mode (see ``mode_options``)."""
        self._check_open()
        engine = self._engines[mode]

        async def transaction() -> T:
            with translate_errors(action, conversation):
                async with engine.begin() as conn:
                    return await work(conn)

        return await run_to_completion(transaction())

    async def _run_fast(
        self,
        work: Callable[[Any], Awaitable[T]],
        *,
        action: str,
        conversation: str | None = None,
    ) -> T:
        """Run the read ``work`` on a driver connection from the pool (the fast path).

        A cancelled read just loses its connection (the pool opens another), except in
        memory, where that connection is the database: there it runs to completion.
        """
        self._check_open()

        async def run() -> T:
            with translate_errors(action, conversation):
                async with self._driver.connection(self._connections) as driver:
                    return await work(driver)

        return await (run_to_completion(run()) if self._in_memory else run())

    async def _run_program(
        self, program: _fastpath.Program[T], *, action: str, conversation: str
    ) -> T | None:
        """Run a write program (see ``_fastpath``) in one transaction on the fast path,
        to its end even when the caller is cancelled."""
        self._check_open()

        async def run() -> T | None:
            with translate_errors(action, conversation):
                async with self._driver.connection(self._connections) as driver:
                    return await self._driver.transaction(driver, program, ["body"])

        return await run_to_completion(run())

    def _touched(
        self, conversation: str, now: datetime | None = None
    ) -> Generator[_fastpath.Step, Any, int]:
        """Program steps: create the conversation when needed and mark it changed,
        under its lock; returns its length. ``NotFound`` when a view may not see it."""
        params = {"c": conversation, "owner": self._owner, "now": now or _now()}
        rows = yield _fastpath.FETCH, self._sql.touch, params
        if not rows:
            raise NotFound(f"conversation {conversation!r} not found")
        return int(rows[0][0])

    def _owned(self, conversation: str) -> ColumnElement[bool]:
        """The condition that a conversation row is visible through this store."""
        cond = _conv.c.id == conversation
        if self._owner is not None:
            cond = and_(cond, _conv.c.owner == self._owner)
        return cond

    def _visible(self, conversation: str) -> ColumnElement[bool] | None:
        """For a view: the condition (on any table) that ``conversation`` is the user's."""
        if self._owner is None:
            return None
        return exists().where(self._owned(conversation))

    async def _lock(self, conn: AsyncConnection, conversation: str) -> Any:
        """Lock and read a conversation row; ``NotFound`` when a view may not see it.

        Returns the row, or ``None`` when no conversation has that id.
        """
        stmt = select(_conv.c.length, _conv.c.owner).where(_conv.c.id == conversation)
        row = (await conn.execute(_dialects.for_update(self._dialect, stmt))).first()
        if row is not None and self._owner is not None and row.owner != self._owner:
            raise NotFound(f"conversation {conversation!r} not found")
        return row

    async def _touch(self, conn: AsyncConnection, conversation: str, now: datetime) -> int:
        """Create the conversation when needed and mark it changed, under its lock.

        Returns its length. Raises ``NotFound`` when the id is taken by a conversation
        this view may not see.
        """
        params = {"c": conversation, "owner": self._owner, "now": now}
        length = (await conn.execute(self._sql.touch.statement, params)).scalar()
        if length is None:
            raise NotFound(f"conversation {conversation!r} not found")
        return int(length)

    # ------------------------------------------------------------------ reads

    async def read(
        self,
        conversation: str,
        *,
        limit: int | None = None,
        start: int = 0,
        stop: int | None = None,
    ) -> list[Message]:
        """The messages at positions ``start <= position < stop``, newest ``limit`` of them.

        In stored order, as fresh values. ``read(c, limit=50)`` is the latest page and
        ``read(c, stop=page[0].position, limit=50)`` the one before. Costs O(returned),
        whatever the conversation's length. An unknown conversation gives ``[]``.

        Raises:
            InvalidId: bad conversation id.
            ValueError: a negative ``limit``, ``start`` or ``stop``.
        """
        validate_id(conversation)
        limit = _count(limit, "limit")
        start = _count(start, "start", allow_none=False) or 0
        stop = _count(stop, "stop")
        if limit == 0 or (stop is not None and stop <= start):
            return []
        stmt = self._sql.read[limit is not None, stop is not None]
        params = {
            "c": conversation,
            "owner": self._owner,
            "start": start,
            "stop": stop,
            "limit": limit,
        }

        async def work(driver: Any) -> list[Message]:
            return self._messages(await self._driver.fetch(driver, stmt, params))

        result = await self._run_fast(work, action="read", conversation=conversation)
        if limit is not None:
            result.reverse()
        return result

    async def _read_system(self, conversation: str) -> list[Message]:
        """Every system message of the conversation, in order (found by index)."""
        validate_id(conversation)
        params = {"c": conversation, "owner": self._owner, "start": 0}

        async def work(driver: Any) -> list[Message]:
            return self._messages(await self._driver.fetch(driver, self._sql.read_system, params))

        return await self._run_fast(work, action="read", conversation=conversation)

    def _messages(self, rows: Iterable[Sequence[Any]]) -> list[Message]:
        """Messages from ``(data, position, created_at)`` rows fetched by the driver."""
        convert = self._sql.created_at
        return [Message._stored(r[0], r[1], r[2], convert) for r in rows]

    async def count(self, conversation: str) -> int:
        """How many messages the conversation holds; 0 when it is unknown."""
        validate_id(conversation)
        params = {"c": conversation, "owner": self._owner}

        async def work(driver: Any) -> int:
            rows = await self._driver.fetch(driver, self._sql.count, params)
            return int(rows[0][0]) if rows else 0

        return await self._run_fast(work, action="count", conversation=conversation)

    async def exists(self, conversation: str) -> bool:
        """Whether the conversation exists (and, for a view, is the user's)."""
        validate_id(conversation)
        params = {"c": conversation, "owner": self._owner}

        async def work(driver: Any) -> bool:
            return bool(await self._driver.fetch(driver, self._sql.exists, params))

        return await self._run_fast(work, action="exists", conversation=conversation)

    # ------------------------------------------------------------------ write

    def _prepare_sync(self, conversation: str, batch: Sequence[object]) -> _Prepared:
        messages = [as_message(m) for m in batch]
        limit = self._settings.max_message_bytes
        for i, m in enumerate(messages):
            if m.size > limit:
                raise InvalidMessage(
                    f"message {i} of the batch for conversation {conversation!r} has"
                    f" {m.size} bytes of JSON, over the limit of {limit}"
                )
        counter = self._settings.count_tokens
        tokens: list[int | None] = (
            [_token_count(counter(m)) for m in messages] if counter else [None] * len(messages)
        )
        digest = _codec.digest(m._text for m in messages)
        return _Prepared(messages, tokens, digest)

    async def _prepare(self, conversation: str, batch: Iterable[MessageLike]) -> _Prepared:
        if isinstance(batch, (str, bytes, Mapping, Message)):
            raise InvalidMessage("write() takes a sequence of messages, not a single one")
        items = list(batch)
        if len(items) > self._settings.max_batch:
            raise InvalidMessage(
                f"a batch of {len(items)} messages for conversation {conversation!r} is over"
                f" the limit of {self._settings.max_batch}"
            )
        raw = [m for m in items if not isinstance(m, Message)]
        if raw and _codec.looks_large(raw):
            return await asyncio.to_thread(self._prepare_sync, conversation, items)
        return self._prepare_sync(conversation, items)

    async def write(
        self,
        conversation: str,
        messages: Iterable[MessageLike],
        *,
        at: int | None = None,
        idempotency_key: str | None = None,
    ) -> WriteOutcome:
        """Append a batch of messages, in one transaction: all of them or none.

        Creates the conversation when it does not exist.

        Args:
            conversation: the conversation id.
            messages: ``Message`` values or message dicts, stored in this order.
            at: where the batch's first message belongs. ``None`` appends after whatever
                is stored. With ``at=k``, fewer than ``k`` stored messages is a gap
                (``ConflictError``); stored messages from ``k`` on must equal the start
                of the batch (they are confirmed, not written again), else
                ``ConflictError``; the rest is appended. So ``at=count`` read earlier is
                an optimistic check, and a retry with the same ``at`` never duplicates.
            idempotency_key: when a batch was already stored in this conversation
                under this key, nothing is written and the whole batch is confirmed;
                a different batch under a used key is a ``ConflictError``.

        Returns:
            ``WriteOutcome(accepted=len(batch), uncertain=False, length=...)``.

        Raises:
            InvalidId: bad conversation id or idempotency key.
            InvalidMessage: a message is not storable, over ``max_message_bytes``, or
                the batch is over ``max_batch``. Nothing is written.
            ConflictError: see ``at`` and ``idempotency_key``. Nothing is written.
            NotFound: through a scoped view, the id belongs to another user.
            WriteError: the database failed. ``.outcome`` says what is known;
                ``.idempotency_key`` makes writing the same batch again safe. When the
                commit's fate was unknown and the database could be reached again,
                the store found out itself: stored means this returns normally.
        """
        validate_id(conversation)
        at = _count(at, "at")
        caller_key = idempotency_key is not None
        key = (
            validate_id(idempotency_key, what="idempotency key")
            if idempotency_key is not None
            else uuid.uuid4().hex
        )
        prepared = await self._prepare(conversation, messages)
        self._check_open()
        return await run_to_completion(
            self._write_settled(conversation, prepared, at, key, caller_key)
        )

    async def _write_settled(
        self, conversation: str, batch: _Prepared, at: int | None, key: str, caller_key: bool
    ) -> WriteOutcome:
        phase: _fastpath.Phase = ["body"]
        try:
            async with self._driver.connection(self._connections) as driver:
                outcome = await self._driver.transaction(
                    driver, self._append(conversation, batch, at, key, caller_key), phase
                )
            if outcome is None:
                phase[0] = "body"
                async with self._engines["write"].connect() as conn:
                    async with conn.begin():
                        outcome = await self._write_tx(conn, conversation, batch, at, key)
                        phase[0] = "commit"
                    phase[0] = "done"
        except HistStoreError:
            raise
        except DATABASE_ERRORS as exc:
            if phase[0] == "done":
                # Committed; only giving the connection back failed.
                return WriteOutcome(len(batch.messages), False, None)
            if phase[0] == "body":
                raise WriteError(
                    f"write to conversation {conversation!r} failed before commit: {describe(exc)}",
                    outcome=_ZERO,
                    idempotency_key=key,
                ) from exc
            length = await self._was_stored(conversation, key, exc)
            if length is None:
                raise WriteError(
                    f"write to conversation {conversation!r} failed while committing"
                    f" ({describe(exc)}) and the database could not be asked whether it"
                    " was stored; write the same batch again with its idempotency_key",
                    outcome=WriteOutcome(0, True, None),
                    idempotency_key=key,
                ) from exc
            return WriteOutcome(len(batch.messages), False, length)
        return outcome

    def _append(
        self,
        conversation: str,
        batch: _Prepared,
        at: int | None,
        key: str,
        caller_key: bool,
    ) -> _fastpath.Program[WriteOutcome]:
        """The common write as a fast-path program (see ``_fastpath``): one statement
        locks the conversation row, checks ``at`` and hands out the positions; then the
        batch's record and its messages are inserted.

        Returns ``None`` (roll back) when the general path must decide: ``at`` differs
        from the length, or the caller's key is recorded already.
        """
        sql = self._sql
        n = len(batch.messages)
        now = _now()
        params: dict[str, Any] = {"c": conversation, "owner": self._owner, "n": n, "now": now}
        if at is not None:
            params.update(at=at, new_length=at + n)
        rows = yield _fastpath.FETCH, sql.append if at is None else sql.append_at, params
        if not rows:
            if at is None:  # only a view's foreign conversation refuses an append
                raise NotFound(f"conversation {conversation!r} not found")
            return None
        length = int(rows[0][0])
        first = length - n
        record = {
            "conversation_id": conversation,
            "key": key,
            "position": first,
            "count": n,
            "digest": batch.digest,
            "created_at": now,
        }
        if caller_key:
            if not (yield _fastpath.FETCH, sql.insert_write_once, record):
                return None
        else:
            yield _fastpath.EXECUTE, sql.insert_write, record
        messages = _message_rows(conversation, first, batch, 0, now)
        if len(messages) == 1:
            yield _fastpath.EXECUTE, sql.insert_messages, messages[0]
        elif messages:
            yield _fastpath.EXECUTE_MANY, sql.insert_messages, messages
        return WriteOutcome(n, False, length)

    async def _was_stored(self, conversation: str, key: str, cause: BaseException) -> int | None:
        """After a commit of unknown fate: the length if the batch is stored, else None.

        Raises ``WriteError`` (certain, nothing stored) when the database answers that
        the batch is not there; returns ``None`` when it cannot be reached.
        """
        stmt = (
            select(_conv.c.length)
            .select_from(_writes.join(_conv, _conv.c.id == _writes.c.conversation_id))
            .where(_writes.c.conversation_id == conversation, _writes.c.key == key)
        )
        try:
            async with self._engines["read"].connect() as conn:
                row = (await conn.execute(stmt)).first()
        except DATABASE_ERRORS:
            return None
        if row is None:
            raise WriteError(
                f"write to conversation {conversation!r} failed while committing"
                f" ({describe(cause)}) and was not stored",
                outcome=_ZERO,
                idempotency_key=key,
            ) from cause
        return int(row[0])

    async def _write_tx(
        self,
        conn: AsyncConnection,
        conversation: str,
        batch: _Prepared,
        at: int | None,
        key: str,
    ) -> WriteOutcome:
        """The general write, under the conversation's lock: confirms what is stored
        already (``at`` overlapping, or a recorded key) and appends the rest."""
        n = len(batch.messages)
        now = _now()
        # General path: lock the conversation row, then decide.
        row = await self._lock(conn, conversation)
        if row is None:
            # Another writer may create it first: the upsert then waits for it and
            # returns the length it left. (A conflict below rolls the creation back.)
            length = await self._touch(conn, conversation, now)
        else:
            length = int(row.length)
        rec = (
            await conn.execute(
                select(_writes.c.digest, _writes.c.count, _writes.c.position).where(
                    _writes.c.conversation_id == conversation, _writes.c.key == key
                )
            )
        ).first()
        if rec is not None:
            if not await self._same_batch(conn, conversation, batch, rec[0], rec[1], rec[2]):
                raise ConflictError(
                    f"idempotency key already used for another batch in conversation"
                    f" {conversation!r}",
                    outcome=_ZERO,
                )
            return WriteOutcome(n, False, length)
        first = length if at is None else at
        if first > length:
            raise ConflictError(
                f"write to conversation {conversation!r} at {first} leaves a gap: it holds"
                f" {length} messages",
                outcome=_ZERO,
            )
        overlap = min(length - first, n)
        if overlap:
            stored = await self._stored_range(conn, conversation, first, first + overlap)
            for i, message in enumerate(stored):
                if message != batch.messages[i]:
                    raise ConflictError(
                        f"write to conversation {conversation!r} at {first}: message"
                        f" {first + i} differs from the one stored",
                        outcome=_ZERO,
                    )
        appended = n - overlap
        new_length = length + appended
        await conn.execute(
            update(_conv)
            .where(_conv.c.id == conversation)
            .values(length=new_length, updated_at=now)
        )
        await self._insert_batch(conn, conversation, batch, length, overlap, key, now, first)
        return WriteOutcome(n, False, new_length)

    async def _same_batch(
        self,
        conn: AsyncConnection,
        conversation: str,
        batch: _Prepared,
        digest: str,
        count: int,
        position: int,
    ) -> bool:
        """Whether a recorded batch is ``batch``: the same texts (the digest), else
        equal messages still stored where it went (key order in objects may differ)."""
        if count != len(batch.messages):
            return False
        if digest == batch.digest:
            return True
        return await self._stored_range(conn, conversation, position, position + count) == (
            batch.messages
        )

    async def _stored_range(
        self, conn: AsyncConnection, conversation: str, start: int, stop: int
    ) -> list[Message]:
        """The stored messages at positions ``start <= position < stop``, in order."""
        rows = await conn.execute(
            select(_msg.c.data, _msg.c.position)
            .where(
                _msg.c.conversation_id == conversation,
                _msg.c.position >= start,
                _msg.c.position < stop,
            )
            .order_by(_msg.c.position)
        )
        return [Message._stored(text, position, None) for text, position in rows]

    async def _insert_batch(
        self,
        conn: AsyncConnection,
        conversation: str,
        batch: _Prepared,
        position: int,
        skip: int,
        key: str,
        now: datetime,
        first: int,
    ) -> None:
        """Record the batch (it starts at ``first``), then insert ``batch.messages[skip:]``
        from ``position`` on."""
        await conn.execute(
            _writes.insert().values(
                conversation_id=conversation,
                key=key,
                position=first,
                count=len(batch.messages),
                digest=batch.digest,
                created_at=now,
            )
        )
        rows = _message_rows(conversation, position, batch, skip, now)
        if rows:
            await conn.execute(_msg.insert(), rows)

    # ------------------------------------------------------------------ pop, clear

    async def pop(self, conversation: str) -> Message | None:
        """Remove and return the newest message; ``None`` when there is none."""
        validate_id(conversation)

        def program() -> _fastpath.Program[Message]:
            sql = self._sql
            params = {"c": conversation, "owner": self._owner, "now": _now()}
            rows = yield _fastpath.FETCH, sql.shorten, params
            if not rows:
                return None  # empty, unknown or not visible: nothing to commit
            params = {"c": conversation, "position": rows[0][0]}
            rows = yield _fastpath.FETCH, sql.delete_message, params
            if not rows:
                raise HistStoreError(f"conversation {conversation!r} is missing a message")
            data, position, created_at = rows[0]
            return Message._stored(data, position, created_at, sql.created_at)

        return await self._run_program(program(), action="pop", conversation=conversation)

    async def clear(self, conversation: str) -> None:
        """Remove the conversation and everything it holds. Idempotent."""
        validate_id(conversation)

        async def work(conn: AsyncConnection) -> None:
            if self._owner is not None:
                row = (
                    await conn.execute(select(_conv.c.owner).where(_conv.c.id == conversation))
                ).first()
                if row is None or row.owner != self._owner:
                    return
            await self._delete_all(conn, [conversation])

        await self._run(work, mode="write", action="clear", conversation=conversation)

    async def _delete_all(self, conn: AsyncConnection, ids: Sequence[str] | Select[Any]) -> None:
        for table in s.CONVERSATION_TABLES:
            await conn.execute(delete(table).where(table.c.conversation_id.in_(ids)))
        await conn.execute(delete(_conv).where(_conv.c.id.in_(ids)))

    # ------------------------------------------------------------------ state

    async def load(self, conversation: str) -> ConversationState:
        """Everything the conversation holds but its lists, read in one transaction.

        Raises:
            NotFound: the conversation does not exist (or is not this view's).
        """
        validate_id(conversation)

        async def work(conn: AsyncConnection) -> ConversationState:
            row = (
                await conn.execute(
                    select(
                        _conv.c.owner,
                        _conv.c.system_prompt,
                        _conv.c.created_at,
                        _conv.c.updated_at,
                    ).where(self._owned(conversation))
                )
            ).first()
            if row is None:
                raise NotFound(f"conversation {conversation!r} not found")
            rows = (
                await conn.execute(
                    select(_msg.c.data, _msg.c.position, _msg.c.created_at, _msg.c.token_count)
                    .where(_msg.c.conversation_id == conversation)
                    .order_by(_msg.c.position)
                )
            ).all()
            summaries = await self._summaries(conn, conversation)
            metadata = await self._metadata(conn, conversation)
            return ConversationState(
                conversation,
                user=row.owner,
                messages=tuple(Message._stored(r[0], r[1], r[2]) for r in rows),
                system_prompt=row.system_prompt,
                summaries=tuple(summaries),
                metadata=metadata or None,
                token_count=sum(r[3] or 0 for r in rows),
                created_at=row.created_at,
                updated_at=row.updated_at,
            )

        return await self._run(work, mode="snapshot", action="load", conversation=conversation)

    async def save(self, state: ConversationState) -> None:
        """Replace the whole conversation with ``state``, in one transaction.

        Messages (renumbered from 0, keeping their ``created_at`` when they have one),
        summaries, metadata (``None``: none), owner and system prompt are replaced;
        named lists are left as they are, and so are the conversation's creation time
        when it exists. ``state.token_count`` is not stored: counts are recorded per
        message by ``connect(count_tokens=...)``. Through a scoped view the conversation
        is owned by the view's user, whatever ``state.user`` says. Meant for seeding and
        administration, not hot paths: it costs O(size of the conversation).

        Raises:
            NotFound: through a view, the id belongs to a conversation it may not see.
        """
        await self._save(state, keep_times=False)

    async def _save(self, state: ConversationState, *, keep_times: bool) -> None:
        """``save``; with ``keep_times`` the state's own times are kept (import)."""
        if not isinstance(state, ConversationState):
            raise TypeError("save() takes a ConversationState")
        conversation = state.id
        owner = self._owner if self._owner is not None else state.user
        prepared = await self._prepare(conversation, state.messages)
        summary_rows = [_summary_row(conversation, i, sm) for i, sm in enumerate(state.summaries)]
        meta_rows = _metadata_rows(conversation, state.metadata or {})

        async def work(conn: AsyncConnection) -> None:
            now = _now()
            # Create or lock the row in one statement (two savers of a new id must not
            # both insert it). A new row gets the state's creation time; an existing
            # one keeps its own, unless the times are being restored.
            ins = _dialects.insert(self._dialect, _conv).values(
                id=conversation,
                owner=owner,
                length=0,
                created_at=state.created_at or now,
                updated_at=now,
            )
            where = None if self._owner is None else (_conv.c.owner == self._owner)
            locked = (
                await conn.execute(
                    ins.on_conflict_do_update(
                        index_elements=[_conv.c.id], set_={"updated_at": now}, where=where
                    ).returning(_conv.c.id)
                )
            ).first()
            if locked is None:
                raise NotFound(f"conversation {conversation!r} not found")
            for table in (_msg, _writes, s.summaries, s.metadata_entries):
                await conn.execute(delete(table).where(table.c.conversation_id == conversation))
            values: dict[str, Any] = {
                "owner": owner,
                "system_prompt": state.system_prompt,
                "length": len(prepared.messages),
                "updated_at": (state.updated_at if keep_times else None) or now,
            }
            if keep_times and state.created_at is not None:
                values["created_at"] = state.created_at
            await conn.execute(update(_conv).where(_conv.c.id == conversation).values(values))
            rows = [
                {
                    "conversation_id": conversation,
                    "position": i,
                    "role": m.role,
                    "data": m._text,
                    "token_count": tokens,
                    "created_at": m.created_at or now,
                }
                for i, (m, tokens) in enumerate(
                    zip(prepared.messages, prepared.tokens, strict=True)
                )
            ]
            for sm in summary_rows:
                sm["created_at"] = sm["created_at"] or now
            for table, batch in (
                (_msg, rows),
                (s.summaries, summary_rows),
                (s.metadata_entries, meta_rows),
            ):
                if batch:
                    await conn.execute(table.insert(), batch)

        await self._run(work, mode="write", action="save", conversation=conversation)

    async def fork(self, source: str, target: str, *, upto: int | None = None) -> None:
        """Make ``target`` a copy of ``source`` (or of its first ``upto`` messages).

        Copies the messages (positions and times kept), the summaries that end before
        ``upto``, metadata, named lists, owner and system prompt, in one transaction.
        An ``upto`` past the end copies everything. Forking a prefix and going on with
        the new id is how a conversation is reverted.

        Raises:
            NotFound: ``source`` does not exist (or is not this view's), or, through a
                view, ``target`` belongs to a conversation it may not see.
            ConflictError: ``target`` exists.
        """
        validate_id(source)
        validate_id(target, what="target conversation id")
        upto = _count(upto, "upto")

        async def work(conn: AsyncConnection) -> None:
            src = (
                await conn.execute(
                    _dialects.for_update(
                        self._dialect,
                        select(_conv.c.owner, _conv.c.system_prompt, _conv.c.length).where(
                            self._owned(source)
                        ),
                    )
                )
            ).first()
            if src is None:
                raise NotFound(f"conversation {source!r} not found")
            length = src.length if upto is None else min(upto, src.length)
            now = _now()
            # Insert-if-absent: of two forks racing to one target, one creates it and
            # the other sees it taken.
            created = (
                await conn.execute(
                    _dialects.insert(self._dialect, _conv)
                    .values(
                        id=target,
                        owner=src.owner,
                        system_prompt=src.system_prompt,
                        length=length,
                        created_at=now,
                        updated_at=now,
                    )
                    .on_conflict_do_nothing(index_elements=[_conv.c.id])
                    .returning(_conv.c.id)
                )
            ).first()
            if created is None:
                taken = (
                    await conn.execute(select(_conv.c.owner).where(_conv.c.id == target))
                ).first()
                if self._owner is not None and (taken is None or taken.owner != self._owner):
                    raise NotFound(f"conversation {target!r} not found")
                raise ConflictError(f"conversation {target!r} already exists")
            copies: list[tuple[Any, ColumnElement[bool] | None]] = [
                (_msg, _msg.c.position < length),
                (s.summaries, None if upto is None else s.summaries.c.end < upto),
                (s.metadata_entries, None),
                (s.lists, None),
                (s.list_items, None),
            ]
            for table, cond in copies:
                cols = [c for c in table.c if c.name != "conversation_id"]
                where = table.c.conversation_id == source
                if cond is not None:
                    where = and_(where, cond)
                sel = select(literal(target, _conv.c.id.type), *cols).where(where)
                await conn.execute(
                    table.insert().from_select(["conversation_id", *[c.name for c in cols]], sel)
                )

        await self._run(work, mode="write", action="fork", conversation=source)

    async def add_summary(self, conversation: str, summary: Summary) -> None:
        """Add a summary to the conversation (created when needed).

        Raises:
            NotFound: through a view, the id belongs to a conversation it may not see.
        """
        validate_id(conversation)
        if not isinstance(summary, Summary):
            raise TypeError("add_summary() takes a Summary")
        row = _summary_row(conversation, 0, summary)

        def program() -> _fastpath.Program[bool]:
            now = _now()
            yield from self._touched(conversation, now)
            sql = self._sql
            rows = yield _fastpath.FETCH, sql.next_summary, {"c": conversation}
            values = {**row, "seq": rows[0][0], "created_at": row["created_at"] or now}
            yield _fastpath.EXECUTE, sql.insert_summary, values
            return True

        await self._run_program(program(), action="add summary", conversation=conversation)

    async def summaries(self, conversation: str) -> list[Summary]:
        """The conversation's summaries in the order added; ``[]`` when unknown."""
        validate_id(conversation)

        async def work(conn: AsyncConnection) -> list[Summary]:
            visible = self._visible(conversation)
            if visible is not None and (await conn.execute(select(visible))).scalar() is not True:
                return []
            return await self._summaries(conn, conversation)

        return await self._run(work, mode="snapshot", action="summaries", conversation=conversation)

    async def _summaries(self, conn: AsyncConnection, conversation: str) -> list[Summary]:
        sm = s.summaries
        rows = await conn.execute(
            select(sm.c.start, sm.c.end, sm.c.content, sm.c.token_count, sm.c.created_at)
            .where(sm.c.conversation_id == conversation)
            .order_by(sm.c.seq)
        )
        return [
            Summary(r.start, r.end, _codec.decode(r.content), r.token_count, r.created_at)
            for r in rows
        ]

    async def metadata(self, conversation: str) -> dict[str, Any]:
        """The conversation's metadata (``{}`` when it has none).

        Raises:
            NotFound: the conversation does not exist (or is not this view's).
        """
        validate_id(conversation)

        async def work(conn: AsyncConnection) -> dict[str, Any]:
            if (
                await conn.execute(select(_conv.c.id).where(self._owned(conversation)))
            ).first() is None:
                raise NotFound(f"conversation {conversation!r} not found")
            return await self._metadata(conn, conversation)

        return await self._run(work, mode="snapshot", action="metadata", conversation=conversation)

    async def _metadata(self, conn: AsyncConnection, conversation: str) -> dict[str, Any]:
        md = s.metadata_entries
        rows = await conn.execute(
            select(md.c.key, md.c.value)
            .where(md.c.conversation_id == conversation)
            .order_by(md.c.key)
        )
        return {r.key: _codec.decode(r.value) for r in rows}

    async def merge_metadata(self, conversation: str, updates: Mapping[str, Any]) -> None:
        """Set the given top-level keys; a ``None`` value removes its key.

        Other keys are left alone. Each key is written by its own upsert, never by
        reading and rewriting the whole mapping, so concurrent merges of different keys
        from any number of tasks or processes never lose one. Creates the conversation
        when needed.

        Raises:
            InvalidMessage: a key breaks the id rules or a value does not survive a
                JSON round trip. Nothing is written.
            NotFound: through a view, the id belongs to a conversation it may not see.
        """
        validate_id(conversation)
        if not isinstance(updates, Mapping):
            raise TypeError("merge_metadata() takes a mapping")
        sets = _metadata_rows(conversation, {k: v for k, v in updates.items() if v is not None})
        removals = [_check_key(k) for k, v in updates.items() if v is None]

        def program() -> _fastpath.Program[bool]:
            yield from self._touched(conversation)
            sql = self._sql
            if sets:
                yield _fastpath.EXECUTE_MANY, sql.set_metadata, sets
            if removals:
                gone = [{"c": conversation, "key": key} for key in removals]
                yield _fastpath.EXECUTE_MANY, sql.delete_metadata, gone
            return True

        await self._run_program(program(), action="merge metadata", conversation=conversation)

    # ------------------------------------------------------------------ named lists

    async def list_append(self, conversation: str, name: str, items: Iterable[Any]) -> int:
        """Append JSON values (or ``bytes``) to a named list; returns its new length.

        Costs O(len(items)) however long the list is. Creates the conversation when
        needed.

        Raises:
            InvalidId: bad conversation id or list name.
            InvalidMessage: an item does not survive a JSON round trip.
            NotFound: through a view, the id belongs to a conversation it may not see.
        """
        validate_id(conversation)
        validate_id(name, what="list name")
        if isinstance(items, (str, bytes, bytearray, Mapping)):
            raise InvalidMessage("list_append() takes a sequence of items")
        encoded = [_encode_item(item) for item in items]
        k = len(encoded)

        def program() -> _fastpath.Program[int]:
            yield from self._touched(conversation)
            sql = self._sql
            rows = yield _fastpath.FETCH, sql.grow_list, {"c": conversation, "name": name, "k": k}
            length = int(rows[0][0])
            if encoded:
                items = [
                    {
                        "conversation_id": conversation,
                        "name": name,
                        "idx": length - k + i,
                        "value": value,
                        "blob": blob,
                    }
                    for i, (value, blob) in enumerate(encoded)
                ]
                yield _fastpath.EXECUTE_MANY, sql.insert_list_items, items
            return length

        length = await self._run_program(program(), action="list append", conversation=conversation)
        assert length is not None
        return length

    async def list_load(
        self, conversation: str, name: str, *, start: int = 0, limit: int | None = None
    ) -> list[Any]:
        """The items of a named list from ``start`` on, at most ``limit`` of them.

        A list never written is empty.

        Raises:
            NotFound: the conversation does not exist (or is not this view's).
        """
        validate_id(conversation)
        validate_id(name, what="list name")
        start = _count(start, "start", allow_none=False) or 0
        limit = _count(limit, "limit")
        li = s.list_items
        stmt = (
            select(li.c.value, li.c.blob)
            .where(li.c.conversation_id == conversation, li.c.name == name, li.c.idx >= start)
            .order_by(li.c.idx)
        )
        if limit is not None:
            stmt = stmt.limit(limit)

        async def work(conn: AsyncConnection) -> list[Any]:
            await self._require(conn, conversation)
            if limit == 0:
                return []
            return [
                bytes(r.blob) if r.value is None else _codec.decode(r.value)
                for r in await conn.execute(stmt)
            ]

        return await self._run(work, mode="snapshot", action="list load", conversation=conversation)

    async def list_len(self, conversation: str, name: str) -> int:
        """The length of a named list (0 when never written).

        Raises:
            NotFound: the conversation does not exist (or is not this view's).
        """
        validate_id(conversation)
        validate_id(name, what="list name")
        lists = s.lists

        async def work(conn: AsyncConnection) -> int:
            await self._require(conn, conversation)
            length = (
                await conn.execute(
                    select(lists.c.length).where(
                        lists.c.conversation_id == conversation, lists.c.name == name
                    )
                )
            ).scalar()
            return int(length or 0)

        return await self._run(
            work, mode="snapshot", action="list length", conversation=conversation
        )

    async def _require(self, conn: AsyncConnection, conversation: str) -> None:
        found = (await conn.execute(select(_conv.c.id).where(self._owned(conversation)))).first()
        if found is None:
            raise NotFound(f"conversation {conversation!r} not found")

    # ------------------------------------------------------------------ purge

    async def purge(self, *, idle_for: timedelta) -> int:
        """Delete the conversations not changed for longer than ``idle_for``.

        Every change counts: messages, summaries, metadata, lists. Works in batches of
        conversations, each in its own transaction; returns how many were deleted.
        """
        if not isinstance(idle_for, timedelta):
            raise TypeError("idle_for must be a timedelta")
        if idle_for < timedelta(0):
            raise ValueError("idle_for must not be negative")
        cutoff = _now() - idle_for
        cond = _conv.c.updated_at < cutoff
        if self._owner is not None:
            cond = and_(cond, _conv.c.owner == self._owner)
        # Locking the rows first means a conversation changed meanwhile is skipped
        # whole (its lock makes the change wait, or the change makes it recent).
        pick = _dialects.for_update(
            self._dialect, select(_conv.c.id).where(cond).limit(_PURGE_BATCH)
        )
        total = 0
        while True:

            async def work(conn: AsyncConnection) -> int:
                ids = list((await conn.execute(pick)).scalars())
                if ids:
                    await self._delete_all(conn, ids)
                return len(ids)

            done = await self._run(work, mode="write", action="purge")
            total += done
            if done < _PURGE_BATCH:
                return total

    # ------------------------------------------------------------------ listing

    async def conversations(
        self,
        *,
        user: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        limit: int | None = None,
        offset: int = 0,
        order: Order = "id",
        descending: bool = False,
    ) -> list[str]:
        """Conversation ids, filtered, ordered and paged.

        Args:
            user: keep only conversations this user owns.
            metadata: keep those whose metadata holds every given key with an equal
                value (compared as JSON with object keys in any order; ``1`` and ``1.0``
                differ). A ``None`` value keeps those that do not have the key.
            limit, offset: a page of the result.
            order: ``"id"`` (code-point order, as ``sorted``), ``"created"`` or
                ``"updated"``; ties are broken by id. ``descending`` reverses the whole
                order.

        Every filter and order is served by an index: a page costs O(limit + offset)
        when the filters match most conversations.
        """
        if user is not None:
            validate_id(user, what="user")
        limit = _count(limit, "limit")
        offset = _count(offset, "offset", allow_none=False) or 0
        if order not in ("id", "created", "updated"):
            raise ValueError("order must be 'id', 'created' or 'updated'")
        if self._owner is not None:
            if user is not None and user != self._owner:
                return []
            user = self._owner
        stmt = select(_conv.c.id)
        if user is not None:
            stmt = stmt.where(_conv.c.owner == user)
        id_key: ColumnElement[str] = _conv.c.id
        if metadata:
            conds, driver = self._metadata_filter(metadata)
            if driver is not None:
                # The first equality filter is a join, so the planner can start from the
                # metadata index (key, digest, conversation_id) when it is selective;
                # ordered by that index's id, a page by id needs no sort at all. (SQLite
                # never turns a correlated EXISTS into a join.)
                md0, on = driver
                stmt = stmt.select_from(_conv.join(md0, on))
                id_key = md0.c.conversation_id
            stmt = stmt.where(*conds)
        keys = {
            "id": [id_key],
            "created": [_conv.c.created_at, id_key],
            "updated": [_conv.c.updated_at, id_key],
        }[order]
        stmt = stmt.order_by(*(k.desc() if descending else k.asc() for k in keys))
        if limit is not None:
            stmt = stmt.limit(limit)
        if offset:
            stmt = stmt.offset(offset)

        async def work(conn: AsyncConnection) -> list[str]:
            return list((await conn.execute(stmt)).scalars())

        return await self._run(work, mode="read", action="list conversations")

    @staticmethod
    def _metadata_filter(
        metadata: Mapping[str, Any],
    ) -> tuple[list[ColumnElement[bool]], tuple[Any, ColumnElement[bool]] | None]:
        """Conditions for a metadata filter, and the first equality as a join.

        Returns ``(conditions, (alias, on_clause) | None)``.
        """
        md = s.metadata_entries
        conds: list[ColumnElement[bool]] = []
        driver: tuple[Any, ColumnElement[bool]] | None = None
        for k, v in metadata.items():
            _check_key(k)
            if v is None:
                conds.append(~exists().where(md.c.conversation_id == _conv.c.id, md.c.key == k))
                continue
            _codec.encode(v, what="metadata value")
            digest = _codec.canonical_digest(v)
            if driver is None:
                md0 = md.alias("m0")
                on = and_(
                    md0.c.conversation_id == _conv.c.id, md0.c.key == k, md0.c.digest == digest
                )
                driver = (md0, on)
                continue
            conds.append(
                exists().where(
                    md.c.key == k,
                    md.c.digest == digest,
                    md.c.conversation_id == _conv.c.id,
                )
            )
        return conds, driver


def _token_count(value: object) -> int:
    """A count returned by ``count_tokens``, checked to fit the column."""
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2**31:
        raise InvalidMessage("count_tokens must return an int from 0 to 2**31-1")
    return value


def _check_key(key: object) -> str:
    """Metadata keys follow the id rules; a bad one is an ``InvalidMessage``."""
    try:
        return validate_id(key, what="metadata key")
    except HistStoreError as exc:
        raise InvalidMessage(str(exc)) from None


_PURGE_BATCH = 500


def _summary_row(conversation: str, seq: int, summary: Summary) -> dict[str, Any]:
    text, _copy, _size = _codec.encode(summary.content, what="summary content")
    return {
        "conversation_id": conversation,
        "seq": seq,
        "start": summary.start,
        "end": summary.end,
        "content": text,
        "token_count": summary.token_count,
        "created_at": summary.created_at,
    }


def _metadata_rows(conversation: str, values: Mapping[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for k, v in values.items():
        _check_key(k)
        text, copy, _size = _codec.encode(v, what="metadata value")
        rows.append(
            {
                "conversation_id": conversation,
                "key": k,
                "value": text,
                "digest": _codec.canonical_digest(copy),
            }
        )
    return rows


def _encode_item(item: Any) -> tuple[str | None, bytes | None]:
    if isinstance(item, (bytes, bytearray, memoryview)):
        return None, bytes(item)
    text, _copy, _size = _codec.encode(item, what="list item")
    return text, None


def _message_rows(
    conversation: str, position: int, batch: _Prepared, skip: int, now: datetime
) -> list[dict[str, Any]]:
    """Rows for ``batch.messages[skip:]``, placed from ``position`` on."""
    return [
        {
            "conversation_id": conversation,
            "position": position + i,
            "role": m.role,
            "data": m._text,
            "token_count": tokens,
            "created_at": now,
        }
        for i, (m, tokens) in enumerate(
            zip(batch.messages[skip:], batch.tokens[skip:], strict=True)
        )
    ]
