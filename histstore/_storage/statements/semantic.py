"""The compiled statements of the semantic index (``_ops.semantic``): the messages
still to embed, the marks of how far an update got, storing a vector, a model's vector
width, and dropping vectors.

Parameters as in ``_storage.statements.store``: ``c`` names the conversation, ``owner``
a scoped view's user; ``model`` the embedding model. With ``scoped`` every statement
keeps to the owner's conversations.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    ColumnElement,
    Integer,
    LargeBinary,
    Text,
    and_,
    bindparam,
    cast,
    delete,
    exists,
    func,
    literal_column,
    select,
    tuple_,
    update,
)

from .. import schema as s
from ..drivers import Driver
from . import dialects as _dialects
from .search import message_text

__all__ = ["SemanticStatements"]


class SemanticStatements:
    """The semantic index's statements for a whole store (``scoped=False``) or a view."""

    def __init__(self, driver: Driver, scoped: bool) -> None:
        m, v, cv = s.messages, s.vectors, s.conversations
        compile_ = driver.compile
        c = bindparam("c", type_=m.c.conversation_id.type)
        model = bindparam("model", type_=v.c.model.type)
        owner = bindparam("owner", type_=cv.c.owner.type)
        after = bindparam("after", type_=BigInteger)

        def owned(column: ColumnElement[str], *more: ColumnElement[bool]) -> ColumnElement[bool]:
            return exists().where(cv.c.id == column, cv.c.owner == owner, *more)

        # Messages with text and no vector yet, after a (conversation, position) cursor,
        # in key order. A view bounds its owner's conversations by the cursor too, so
        # that a walk starting from them (Postgres may) starts at the cursor. "No vector"
        # is a subquery with a LIMIT, which no planner turns into a join: each candidate
        # is one primary-key probe, however stale the planner's statistics (a freshly
        # loaded table's hash anti-join read every vector of the store).
        text_ = message_text(driver.dialect, m)
        vector = (
            select(literal_column("1"))
            .where(
                v.c.conversation_id == m.c.conversation_id,
                v.c.position == m.c.position,
                v.c.model == model,
            )
            .limit(1)
            .scalar_subquery()
        )
        todo = [text_.is_not(None), vector.is_(None)]
        after_c = bindparam("after_c", type_=m.c.conversation_id.type)
        walk = [*todo, tuple_(m.c.conversation_id, m.c.position) > tuple_(after_c, after)]
        one = [*todo, m.c.conversation_id == c, m.c.position > after]
        if scoped:
            walk.append(owned(m.c.conversation_id, cv.c.id >= after_c))
            one.append(owned(m.c.conversation_id))
        cols = (m.c.conversation_id, m.c.position, text_)
        limit = bindparam("limit", type_=Integer)
        self.pending_all = compile_(
            select(*cols).where(*walk).order_by(m.c.conversation_id, m.c.position).limit(limit)
        )
        self.pending_one = compile_(select(*cols).where(*one).order_by(m.c.position).limit(limit))
        # A conversation's length with the model's mark there (NULLs: no mark yet);
        # nothing for a conversation unknown or not visible.
        k = s.vector_marks
        at_mark = and_(k.c.conversation_id == cv.c.id, k.c.model == model)
        visible = [cv.c.id == c]
        if scoped:
            visible.append(cv.c.owner == owner)
        self.mark = compile_(
            select(cv.c.length, k.c.position, k.c.lowered)
            .select_from(cv.outerjoin(k, at_mark))
            .where(*visible)
        )
        # A mark at -1 (nothing looked at), ``lowered`` starting at ``token``.
        self.start_mark = compile_(
            _dialects.insert(driver.dialect, k)
            .from_select(
                ["conversation_id", "model", "position", "lowered"],
                select(
                    cv.c.id,
                    cast(model, k.c.model.type),
                    literal_column("-1", BigInteger),
                    bindparam("token", type_=BigInteger),
                ).where(*visible),
            )
            .on_conflict_do_nothing(index_elements=[k.c.conversation_id, k.c.model])
        )
        # Raises the mark to ``to`` only while nothing lowered it since it was read as
        # ``seen``; returns it then.
        to = bindparam("to", type_=BigInteger)
        self.advance = compile_(
            update(k)
            .where(
                k.c.conversation_id == c,
                k.c.model == model,
                k.c.lowered == bindparam("seen", type_=BigInteger),
                k.c.position < to,
            )
            .values(position=to)
            .returning(k.c.position)
        )
        # Stores a vector only while its message holds the text it was made from. On
        # Postgres the message row is locked (FOR KEY SHARE) so that a concurrent delete
        # either comes first (nothing stored) or waits for this commit (and cascades).
        source = select(
            m.c.conversation_id,
            m.c.position,
            cast(model, v.c.model.type),
            cast(bindparam("vector", type_=LargeBinary), LargeBinary),
        ).where(
            m.c.conversation_id == c,
            m.c.position == bindparam("p", type_=BigInteger),
            text_ == bindparam("text", type_=Text),
        )
        if scoped:
            source = source.where(owned(m.c.conversation_id))
        source = source.with_for_update(read=True, key_share=True)
        self.insert = compile_(
            _dialects.insert(driver.dialect, v)
            .from_select(["conversation_id", "position", "model", "vector"], source)
            .on_conflict_do_nothing(index_elements=[v.c.conversation_id, v.c.position, v.c.model])
            .returning(v.c.position)
        )
        # The bytes of a vector of the model (4 times its dimension).
        self.width = compile_(select(func.length(v.c.vector)).where(v.c.model == model).limit(1))
        drop = delete(v).where(v.c.conversation_id == c, v.c.model == model)
        unmark = delete(k).where(k.c.conversation_id == c, k.c.model == model)
        if scoped:
            drop = drop.where(owned(c))
            unmark = unmark.where(owned(c))
        self.delete = compile_(drop)
        self.unmark = compile_(unmark)
