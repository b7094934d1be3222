"""The read of a conversation's newest messages for several readers at once (Postgres).

``_storage.read_groups`` sends concurrent readers' reads together: one statement, one
round trip and one server connection for them all. Each member gets exactly the rows
its own read (``Statements.read[True, False]``) would have given.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import BigInteger, ColumnElement, and_, cast, exists, select, true
from sqlalchemy.engine import Dialect
from sqlalchemy.sql import Select

from .. import schema as s
from .dialects import message_columns, text_arrays

__all__ = ["read_group_params", "read_group_statement"]


def read_group_statement(dialect: Dialect, scoped: bool) -> Select[Any] | None:
    """The newest messages of several reads as one statement (Postgres; ``None``
    elsewhere).

    Parameters (``read_group_params``): per read the text arrays ``cs`` (the
    conversation), ``owners`` (a view's user, for a scoped store), ``starts`` and
    ``limits``. Rows: the read's number (from 1, in the arrays' order) and then the
    columns of ``Statements.read``, each read's rows newest first, reads in order.
    """
    if dialect.name != "postgresql":
        return None
    msg, conv = s.messages, s.conversations
    q = (
        text_arrays("cs", "owners", "starts", "limits")
        .table_valued("c", "owner", "start", "lim", with_ordinality="i")
        .render_derived()
    )
    where: list[ColumnElement[bool]] = [
        msg.c.conversation_id == q.c.c,
        msg.c.position >= cast(q.c.start, BigInteger),
    ]
    if scoped:
        owned = and_(conv.c.id == q.c.c, conv.c.owner == q.c.owner)
        where.append(exists().where(owned).correlate_except(conv))
    newest = (
        select(*message_columns(dialect))
        .where(*where)
        .order_by(msg.c.position.desc())
        .limit(cast(q.c.lim, BigInteger))
        .lateral("newest")
    )
    return (
        select(q.c.i, *newest.c)
        .select_from(q.join(newest, true()))
        .order_by(q.c.i, newest.c.position.desc())
    )


def read_group_params(members: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The parameters of ``read_group_statement`` for ``members``, each the parameters
    of one read (``c``, ``owner``, ``start``, ``limit``), in the order given."""
    return {
        "cs": [m["c"] for m in members],
        "owners": [m["owner"] for m in members],
        "starts": [str(m["start"]) for m in members],
        "limits": [str(m["limit"]) for m in members],
    }
