"""The search statement (SPEC 12) on each database, and the tables of Postgres's full-text index.

SQLite's index is FTS5 (revision b7d4e2a91c30) with a pending list
(``_storage.search_index``); Postgres's is ``PG_TEXT_INDEX``, a GIN index on
``to_tsvector('simple', message_text)`` of the messages table itself (revision
5b7e2d4a9c13), which the database keeps in the statement that writes a message: nothing
is deferred, and no vector is stored but the index's.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterable
from typing import Any

from sqlalchemy import (
    BigInteger,
    ColumnElement,
    Integer,
    Select,
    Text,
    and_,
    bindparam,
    case,
    cast,
    column,
    exists,
    func,
    literal_column,
    not_,
    null,
    or_,
    select,
    table,
    text,
    true,
    tuple_,
    union_all,
    update,
)
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import Dialect

from .. import schema as s
from ..computed_text import sqlite_text_sql
from ..drivers import EXECUTE, FETCH, Step
from ..rows import TextRule, text_rule

__all__ = [
    "PG_CONFIG",
    "PG_SCOPE_MESSAGES",
    "PG_TEXT_INDEX",
    "ListedInserts",
    "SearchStatements",
    "message_text",
    "pg_query",
    "pg_vector",
    "search",
    "search_terms",
]


def message_text(dialect: Dialect, m: Any) -> ColumnElement[Any]:
    """The text search finds the message row ``m`` (the messages table or an alias) by,
    ``NULL`` when it has none: its ``search_text``, or where that is ``NULL`` the text
    the database computes from its JSON (a stored ``''`` is no text). SQLite computes
    the text of the common shapes (``computed_text.sqlite_text_sql``, revision
    e5c3a9d7f2b4); Postgres the ``content`` when that is a JSON string (revision
    c8d2f4a6e1b9). A write stores ``search_text`` by the database's ``rows.text_rule``
    so that this is the message's ``indexed_text``. Every index and search reads the
    text through this expression (SQLite's FTS5 table through a view of it; Postgres's
    index is made on it, so it names its key as a constant, never a parameter)."""
    if dialect.name == "postgresql":
        # PostgreSQL's JSON functions refuse a document holding ``\u0000`` anywhere;
        # such a row keeps its text in ``search_text`` (``rows.NUL_ESCAPE``), and the
        # first branch keeps the index from ever parsing it.
        doc = cast(m.c.data, postgresql.JSON).op("->")(literal_column("'content'"))
        content: ColumnElement[Any] = case(
            (func.strpos(m.c.data, literal_column("'\\u0000'")) > 0, null()),
            (func.json_typeof(doc) == literal_column("'string'"), doc.astext),
        )
    else:
        content = literal_column(f"({sqlite_text_sql(m.name)})")
    return func.nullif(func.coalesce(m.c.search_text, content), literal_column("''"))


PG_CONFIG: ColumnElement[Any] = literal_column("'simple'::regconfig")
"""Postgres's text search configuration of every full-text index."""

PG_TEXT_INDEX = s.PG_TEXT_INDEX
"""Postgres's full-text index of messages: GIN on ``pg_vector`` (revision 5b7e2d4a9c13)."""


def pg_vector(dialect: Dialect, m: Any) -> ColumnElement[Any]:
    """Postgres: the ``tsvector`` of the message row ``m``'s ``message_text`` (``NULL``
    with no text), the expression ``PG_TEXT_INDEX`` is made on."""
    return func.to_tsvector(PG_CONFIG, message_text(dialect, m))


def pg_query() -> Any:
    """Postgres: the CTE ``query`` whose ``q`` is the tsquery of the ``q`` parameter
    (``search_terms``' value): every term a phrase, all of them required."""
    term = (
        func.unnest(bindparam("q", type_=postgresql.ARRAY(Text))).table_valued("t").render_derived()
    )
    phrase = func.phraseto_tsquery(PG_CONFIG, term.c.t)
    # Each term is parsed as a phrase by Postgres itself; the parts are joined with
    # & as tsquery text, which Postgres quotes and escapes in its own output.
    joined = (
        select(func.string_agg("(" + cast(phrase, Text) + ")", literal_column("' & '")))
        .where(func.numnode(phrase) > 0)
        .scalar_subquery()
    )
    return select(cast(joined, postgresql.TSQUERY).label("q")).cte("query")


OWNER = bindparam("owner", type_=s.conversations.c.owner.type)
"""The ``owner`` parameter of a scoped search."""


def search(
    dialect: Dialect, scoped: bool, by_conversation: bool, fts: str = s.FTS_TABLE
) -> Select[Any]:
    """Messages matching a text query, best first: ``(conversation_id, position, data,
    created_at, score)``, a higher score better.

    Parameters: ``q`` (``search_terms``' value), ``limit``, ``c`` when
    ``by_conversation``, ``owner`` when ``scoped``. Served by the full-text index: on
    SQLite the FTS5 table ranked by bm25, on Postgres the GIN index ``PG_TEXT_INDEX``
    ranked by ``ts_rank_cd``; ties go by conversation and position. A scoped search
    (``c``, ``owner``) starts from its scope when that is small (``SCOPE_SET_MESSAGES``,
    ``PG_SCOPE_MESSAGES``). ``fts``: the FTS5 table to search (SQLite).
    """
    msg, conv = s.messages, s.conversations
    conv_id = bindparam("c", type_=msg.c.conversation_id.type)
    if dialect.name == "postgresql":
        return _pg_search(dialect, scoped, by_conversation)
    else:
        index = table(fts, column("rowid"))
        name: ColumnElement[Any] = literal_column(fts)
        rank = func.bm25(name)
        stmt = (
            select(msg.c.conversation_id, msg.c.position, msg.c.data, msg.c.created_at, -rank)
            .select_from(
                index.join(msg, literal_column("histstore_messages.rowid") == index.c.rowid)
            )
            .where(name.op("MATCH")(bindparam("q", type_=Text)))
        )
        if by_conversation or scoped:
            scope = conv_id if by_conversation else None
            # Unary plus: a condition of the scan, not a rowid to look up (the index's
            # statistics would be gathered again for each).
            match: ColumnElement[Any] = literal_column(f"+{fts}.rowid")
            stmt = stmt.where(_in_small_scope(match, scope))
            # The scope's rowid range, which FTS5 takes as bounds of its scan: it reads
            # the matches between them only (bm25 still counts the store's).
            lo, hi = _scope_bounds(scope)
            stmt = stmt.where(index.c.rowid >= lo, index.c.rowid <= hi)
        best = rank.asc()
    if by_conversation:
        stmt = stmt.where(msg.c.conversation_id == conv_id)
    if scoped:
        stmt = stmt.where(exists().where(conv.c.id == msg.c.conversation_id, conv.c.owner == OWNER))
    limit = bindparam("limit", type_=BigInteger)
    return stmt.order_by(best, msg.c.conversation_id, msg.c.position).limit(limit)


def _pg_search(dialect: Dialect, scoped: bool, by_conversation: bool) -> Select[Any]:
    """Postgres's ``search``: the messages whose vector (``pg_vector``) matches, found by
    the GIN index ``PG_TEXT_INDEX`` on that expression, ranked by ``ts_rank_cd``."""
    msg, conv = s.messages, s.conversations
    conv_id = bindparam("c", type_=msg.c.conversation_id.type)
    query = pg_query()

    def hits(vector: ColumnElement[Any], joined: Any) -> Select[Any]:
        """The scope's messages ranked by ``vector`` (from ``joined``)."""
        score = func.ts_rank_cd(vector, query.c.q).label("score")
        stmt = select(
            msg.c.conversation_id, msg.c.position, msg.c.data, msg.c.created_at, score
        ).select_from(joined)
        if by_conversation:
            stmt = stmt.where(msg.c.conversation_id == conv_id)
        elif scoped:
            owned = select(conv.c.id).where(conv.c.owner == OWNER).scalar_subquery()
            stmt = stmt.where(msg.c.conversation_id.in_(owned))
        if scoped:
            owner = exists().where(conv.c.id == msg.c.conversation_id, conv.c.owner == OWNER)
            stmt = stmt.where(owner)
        return stmt

    limit = bindparam("limit", type_=BigInteger)
    made = pg_vector(dialect, msg)
    indexed = hits(made, msg.join(query, true())).where(made.op("@@")(query.c.q))
    if not (by_conversation or scoped):
        best = (indexed.selected_columns.score.desc(), msg.c.conversation_id, msg.c.position)
        return indexed.order_by(*best).limit(limit)
    # A small scope's messages are read by key, and each one's vector is made once (a
    # subquery that OFFSET keeps from being merged) and matched by the function form of
    # @@, which no index serves: the GIN index would list every match of the store
    # first. A large scope goes by the GIN index. Both parts are planned; a one-time
    # condition runs one of them.
    small = _small_scope(conv_id if by_conversation else None, PG_SCOPE_MESSAGES)
    own = select(made.label("v")).correlate(msg).offset(literal_column("0")).lateral("made")
    by_key = hits(own.c.v, msg.join(query, true()).join(own, true()))
    by_key = by_key.where(func.ts_match_vq(own.c.v, query.c.q), small)
    found = union_all(by_key, indexed.where(not_(small))).subquery()
    ranked = (found.c.score.desc(), found.c.conversation_id, found.c.position)
    return select(*found.c).order_by(*ranked).limit(limit)


SCOPE_SET_MESSAGES = 20_000
"""A scoped search (``conversation=``, a view's owner) whose scope holds at most this
many messages (in at most ``SCOPE_SET_CONVERSATIONS`` conversations) starts from the
scope: on SQLite it checks each match against the set of the scope's rowids, built
once, before reading its message row."""
SCOPE_SET_CONVERSATIONS = 1_000
PG_SCOPE_MESSAGES = 200
"""Postgres: a scoped search whose scope holds at most this many messages (in at most
``SCOPE_SET_CONVERSATIONS`` conversations) reads the scope's messages by key and makes
each one's vector (some 10-40 us a message) instead of going by the GIN index: a
larger scope would make more vectors than a rare word has matches in the index."""


def _in_small_scope(rowid: ColumnElement[Any], conversation: ColumnElement[Any] | None) -> Any:
    """SQLite: the condition on a full-text match's ``rowid`` that keeps a small scope's
    messages (``conversation``'s, else the owner's); true for a large scope.

    FTS5's bm25 needs every match of the store for its statistics, so ranking walks the
    store's matches whatever the scope; this condition makes that walk cheap for a small
    scope: a match outside it costs a probe of the set, not a read of its message row
    and conversation. A large scope skips the set (its building would cost more than
    the matches) and is kept by the message-level conditions alone, as are all matches.
    """
    msg, conv = s.messages, s.conversations
    inner = msg.alias("scope_m")
    rowids: Select[Any] = select(literal_column("scope_m.rowid")).select_from(inner)
    if conversation is not None:
        rowids = rowids.where(inner.c.conversation_id == conversation)
    else:
        rowids = rowids.join(conv, conv.c.id == inner.c.conversation_id).where(
            conv.c.owner == OWNER
        )
    return or_(not_(_small_scope(conversation)), rowid.in_(rowids))


_ROWIDS = (-(2**63), 2**63 - 1)
"""SQLite's lowest and highest rowid."""


def _scope_bounds(conversation: ColumnElement[Any] | None) -> tuple[Any, Any]:
    """SQLite: the lowest and highest rowid of a small scope's messages (``conversation``'s,
    else the owner's), read once per search; every rowid for a large scope; ``NULL`` (no
    match) for a scope without messages."""
    msg, conv = s.messages, s.conversations
    inner = msg.alias("bound_m")
    rowid: ColumnElement[Any] = literal_column("bound_m.rowid")
    large = _small_scope(conversation) == literal_column("0")
    bounds = []
    for agg, every in ((func.min, _ROWIDS[0]), (func.max, _ROWIDS[1])):
        found: Select[Any] = select(agg(rowid)).select_from(inner)
        if conversation is not None:
            found = found.where(inner.c.conversation_id == conversation)
        else:
            found = found.join(conv, conv.c.id == inner.c.conversation_id).where(
                conv.c.owner == OWNER
            )
        bounds.append(case((large, literal_column(str(every))), else_=found.scalar_subquery()))
    return bounds[0], bounds[1]


def _small_scope(
    conversation: ColumnElement[Any] | None, messages: int | None = None
) -> ColumnElement[bool]:
    """Whether a search's scope holds at most ``messages`` messages (by default
    ``SCOPE_SET_MESSAGES``): ``conversation``'s length, else the owner's first
    ``SCOPE_SET_CONVERSATIONS`` + 1 conversations' lengths (more conversations than
    that: large). ``NULL`` for a missing conversation. Read by key, once per search."""
    conv = s.conversations
    most: ColumnElement[Any] = literal_column(
        str(SCOPE_SET_MESSAGES if messages is None else messages)
    )
    if conversation is not None:
        return select(conv.c.length <= most).where(conv.c.id == conversation).scalar_subquery()
    first = (
        select(conv.c.length)
        .where(conv.c.owner == OWNER)
        .limit(literal_column(str(SCOPE_SET_CONVERSATIONS + 1)))
        .subquery("scope_c")
    )
    return select(
        and_(
            func.count() <= literal_column(str(SCOPE_SET_CONVERSATIONS)),
            func.coalesce(func.sum(first.c.length), literal_column("0")) <= most,
        )
    ).scalar_subquery()


def search_terms(dialect: Dialect, terms: list[str]) -> Any:
    """The ``q`` parameter of ``search`` for a query's terms (see
    ``_core.search_text.parse_query``).

    Every term is matched as text, never read as the engine's query language: Postgres
    takes them as an array of plain strings; for FTS5 each becomes a double-quoted
    string (a phrase of its tokens, quotes doubled), joined by spaces, which FTS5 reads
    as AND.
    """
    if dialect.name == "postgresql":
        return terms
    return " ".join('"' + t.replace('"', '""') + '"' for t in terms)


class ListedInserts:
    """SQLite: a program's inserts of messages, then the listing of the rows they added
    for the full-text index (``_storage.search_index``), in the same transaction.

    ``listed(steps, count)`` runs ``steps`` (INSERTs into ``histstore_messages``) and
    lists the rows they added (the indexing leaves those without text). SQLite gives a
    new row the highest rowid plus one (until rowid 2**63 - 1 was used), and the write
    lock is held throughout, so the rows added are the ones above the highest rowid before them:
    with ``count`` (the number of rows ``steps`` insert, all of them into the messages
    table, nothing deleted among them) the last ``count`` rowids up to
    ``last_insert_rowid()``, listed by one statement after the steps; without it
    (``INSERT ... SELECT``), the highest rowid is read first. Until revision
    a2f6c8e4d0b3 an INSERT trigger listed each row, which made SQLite stage every
    multi-row INSERT of messages in a temporary table first. Elsewhere (Postgres) the
    steps alone: its statements and its trigger list what they insert.
    """

    def __init__(self, compile_: Callable[[Any], Any], dialect: Dialect) -> None:
        self._last: Any = None
        self._list: Any = None
        self._list_last: Any = None
        if dialect.name == "sqlite":
            self._last = compile_(select(func.max(literal_column("rowid"))).select_from(s.messages))
            listing = (
                f"INSERT OR IGNORE INTO {s.FTS_LISTED} (message_rowid)"  # noqa: S608 - names, no input
                " SELECT rowid FROM histstore_messages WHERE rowid > {}"
            )
            self._list = compile_(text(listing.format(":after")))
            # A subquery: evaluated once, before the listing's own inserts move the value.
            self._list_last = compile_(
                text(listing.format("(SELECT last_insert_rowid() - :count)"))
            )

    def __call__(
        self, steps: Iterable[Step], count: int | None = None
    ) -> Generator[Step, Any, None]:
        if self._last is None:
            yield from steps
            return
        if count is not None:
            yield from steps
            if count:
                yield EXECUTE, self._list_last, {"count": count}
            return
        rows = yield FETCH, self._last, {}
        after = rows[0][0]
        yield from steps
        yield EXECUTE, self._list, {"after": 0 if after is None else int(after)}


class SearchStatements:
    """The compiled statements of search and ``reindex`` (``Statements`` takes them)."""

    def __init__(
        self, compile_: Callable[[Any], Any], dialect: Dialect, scoped: bool, owner: Any
    ) -> None:
        _msg, _conv = s.messages, s.conversations
        self.text: TextRule = text_rule(dialect.name)
        """What a write stores in ``search_text`` on this database."""
        # Keyed by whether the search names a conversation.
        self.search = {by: compile_(search(dialect, scoped, by)) for by in (False, True)}
        # The same over a read-only store's index of the pending list (SQLite).
        self.unlisted = {
            by: compile_(search(dialect, scoped, by, s.UNLISTED_FTS)) for by in (False, True)
        }
        # Reindexing walks messages in key order, a page after (after_c, after_p).
        page = (
            select(
                _msg.c.conversation_id,
                _msg.c.position,
                _msg.c.role,
                _msg.c.data,
                _msg.c.search_text,
            )
            .where(
                tuple_(_msg.c.conversation_id, _msg.c.position)
                > tuple_(
                    bindparam("after_c", type_=_msg.c.conversation_id.type),
                    bindparam("after_p", type_=BigInteger),
                )
            )
            .order_by(_msg.c.conversation_id, _msg.c.position)
            .limit(bindparam("limit", type_=Integer))
        )
        if scoped:
            page = page.where(
                exists().where(_conv.c.id == _msg.c.conversation_id, _conv.c.owner == owner)
            )
        self.reindex_page = compile_(page)
        # A row as a write stores it now (``reindex``): only while it still holds the
        # JSON it was read with (``old_``), so a message moved or replaced meanwhile is
        # left as it is.
        self.set_indexed = compile_(
            update(_msg)
            .where(
                _msg.c.conversation_id == bindparam("c_", type_=_msg.c.conversation_id.type),
                _msg.c.position == bindparam("p_", type_=BigInteger),
                _msg.c.data == bindparam("old_", type_=_msg.c.data.type),
            )
            .values(
                search_text=bindparam("t_", type_=_msg.c.search_text.type),
                role=bindparam("r_", type_=_msg.c.role.type),
                data=bindparam("d_", type_=_msg.c.data.type),
            )
        )
