"""Namespaces as stored (labels joined by ``.``), the ranges a prefix covers, and the
walk over the distinct namespaces that lists them.

A label holds no ``.`` (LangGraph refuses one), so the namespaces under a prefix ``P``
are ``P`` itself and those in ``[P + ".", P + "/")`` (``/`` follows ``.``): one range of
the items' primary key, whatever else the table holds. Namespaces are listed in the
order of their text, which is the order of their labels except where a label holds a
character below ``.`` (such as a space or ``-``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Integer,
    Select,
    Text,
    and_,
    bindparam,
    func,
    literal,
    or_,
    select,
    true,
)

from .._storage import schema as s

__all__ = [
    "MatchRule",
    "as_text",
    "from_text",
    "matches",
    "namespace_walk",
    "range_params",
    "under_bound",
]

MatchRule = tuple[str, tuple[str, ...]]
"""A condition on a namespace: ``("prefix" | "suffix", labels)``, ``"*"`` any label."""

SEPARATOR = "."
_AFTER = "/"  # the character after the separator


def as_text(namespace: Sequence[str]) -> str:
    """The stored form of a namespace."""
    return SEPARATOR.join(namespace)


def from_text(stored: str) -> tuple[str, ...]:
    """The namespace a stored form names."""
    return tuple(stored.split(SEPARATOR))


def under_bound(column: ColumnElement[str]) -> ColumnElement[bool]:
    """The condition that ``column`` names the prefix of ``range_params`` (parameters
    ``lo``, ``hi``, ``below``) or a namespace below it: one range of the primary key
    ([P, P + "/")), then what in it is not P or below it (P followed by a character
    before ".", such as "P-x")."""
    lo, hi, below = (bindparam(name, type_=Text) for name in ("lo", "hi", "below"))
    return and_(column >= lo, column < hi, or_(column == lo, column >= below))


def range_params(prefix: Sequence[str]) -> dict[str, str]:
    """The parameters of ``under_bound`` for a non-empty ``prefix``."""
    text = as_text(prefix)
    return {"lo": text, "hi": text + _AFTER, "below": text + SEPARATOR}


def fixed_prefix(rules: Sequence[MatchRule]) -> tuple[str, ...]:
    """The labels every listed namespace starts with: the longest run of labels before
    a wildcard among the prefix rules."""
    best: tuple[str, ...] = ()
    for kind, labels in rules:
        if kind != "prefix":
            continue
        run = labels[: labels.index("*")] if "*" in labels else labels
        if len(run) > len(best):
            best = run
    return best


def matches(namespace: tuple[str, ...], rules: Sequence[MatchRule]) -> bool:
    """Whether ``namespace`` meets every rule."""
    for kind, labels in rules:
        if len(namespace) < len(labels):
            return False
        pairs = (
            zip(namespace, labels, strict=False)
            if kind == "prefix"
            else zip(reversed(namespace), reversed(labels), strict=False)
        )
        if any(p != "*" and n != p for n, p in pairs):
            return False
    return True


def namespace_walk(bounded: bool) -> Select[Any]:
    """The distinct namespaces from ``start`` on (inclusive; ``bounded``: below the end
    ``hi`` of the range of ``range_params``, which also holds ``P-x`` beside ``P`` and
    ``P.x``), in order, at most ``page`` of them: a recursive walk where each step is one
    probe of the primary key for the next namespace (however many items each holds).

    Parameters: ``start`` (text, at or past the prefix), ``page`` (int), ``hi`` when
    bounded.
    """
    i = s.items
    # Below P + "/" only: each step's lower bound is where it starts (at or past P), so
    # a probe is one seek of the index (SQLite uses one lower bound of a range, so a
    # second, P itself, would make it read from P on). What the range holds that is not
    # under P (P followed by a character before ".") is left to the caller.
    scope = i.c.namespace < bindparam("hi", type_=Text) if bounded else true()
    first = select(func.min(i.c.namespace).label("ns"), literal(1).label("n")).where(
        scope, i.c.namespace >= bindparam("start", type_=Text)
    )
    walk = first.cte("histstore_namespace_walk", recursive=True)
    following = (
        select(func.min(i.c.namespace)).where(scope, i.c.namespace > walk.c.ns).scalar_subquery()
    )
    step = select(following, walk.c.n + 1).where(
        walk.c.ns.is_not(None), walk.c.n < bindparam("page", type_=Integer)
    )
    walk = walk.union_all(step)
    return select(walk.c.ns).where(walk.c.ns.is_not(None)).order_by(walk.c.ns)
