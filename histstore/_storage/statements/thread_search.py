"""The search statement over LangGraph threads' message text (``checkpoint_text``): the
same query and ranking as the messages' search (``search``), over the thread text's own
full-text index (SQLite's FTS5 table ``THREAD_FTS``, Postgres's GIN index on the text's
``to_tsvector``, revision 6b2d9e4f1a37)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    BigInteger,
    ColumnElement,
    Select,
    bindparam,
    column,
    exists,
    func,
    literal_column,
    select,
    table,
)
from sqlalchemy.engine import Dialect

from .. import schema as s
from .search import OWNER, PG_CONFIG, pg_query

__all__ = ["thread_search"]


def thread_search(dialect: Dialect, scoped: bool) -> Select[Any]:
    """Thread items matching a text query, best first: ``(thread_id, checkpoint_ns,
    channel, idx, role, text, score)``, a higher score better; ties by thread,
    namespace, channel and index. Parameters: ``q`` (``search_terms``' value),
    ``limit``, and ``owner`` when ``scoped`` (only that owner's threads). Served by the
    full-text index: ranked by bm25 on SQLite, ``ts_rank_cd`` on Postgres, as the
    messages' search is."""
    t = s.checkpoint_text
    cols = (t.c.thread_id, t.c.checkpoint_ns, t.c.channel, t.c.idx, t.c.role, t.c.text)
    best: ColumnElement[Any]
    if dialect.name == "postgresql":
        query = pg_query()
        vector = func.to_tsvector(PG_CONFIG, t.c.text)
        score = func.ts_rank_cd(vector, query.c.q)
        stmt = select(*cols, score).where(vector.op("@@")(query.c.q))
        best = score.desc()
    else:
        fts = s.THREAD_FTS
        index = table(fts, column("rowid"))
        name: ColumnElement[Any] = literal_column(fts)
        rank = func.bm25(name)
        stmt = (
            select(*cols, -rank)
            .select_from(index.join(t, literal_column(f"{t.name}.rowid") == index.c.rowid))
            .where(name.op("MATCH")(bindparam("q")))
        )
        best = rank.asc()
    if scoped:
        threads = s.checkpoint_threads
        stmt = stmt.where(
            exists().where(threads.c.thread_id == t.c.thread_id, threads.c.owner == OWNER)
        )
    limit = bindparam("limit", type_=BigInteger)
    return stmt.order_by(best, *cols[:4]).limit(limit)
