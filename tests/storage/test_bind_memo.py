"""Bind values are converted once per transaction and value (``CompiledStatement.args``'s
memo): equal times share a conversion, times that only look alike do not."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy import BigInteger, DateTime, String, bindparam, select
from sqlalchemy.dialects import sqlite
from sqlalchemy.dialects.postgresql import asyncpg

from histstore._storage.drivers import CompiledStatement, Memo, ValueRows
from histstore._storage.schema import UTCDateTime

NEW_YORK = ZoneInfo("America/New_York")


@pytest.mark.parametrize("dialect", [sqlite.dialect(), asyncpg.dialect()], ids=["sqlite", "pg"])
def test_times_that_only_look_alike_convert_apart(dialect: object) -> None:
    stmt = CompiledStatement(select(bindparam("t", type_=UTCDateTime())), dialect)  # type: ignore[arg-type]
    # 01:30 happens twice on that day in New York; fold says which one.
    first = datetime(2026, 11, 1, 1, 30, tzinfo=NEW_YORK)
    second = first.replace(fold=1)
    same_instant = first.astimezone(timezone(timedelta(hours=-4)))
    memo: Memo = {}
    converted = [stmt.args({"t": t}, memo)[0] for t in (first, second, same_instant)]
    alone = [stmt.args({"t": t})[0] for t in (first, second, same_instant)]
    assert converted == alone
    assert converted[0] != converted[1]
    # An equal time made apart shares the first one's conversion.
    again = datetime(2026, 11, 1, 1, 30, tzinfo=NEW_YORK)
    assert stmt.args({"t": again}, memo)[0] is converted[0]


@pytest.mark.parametrize("dialect", [sqlite.dialect(), asyncpg.dialect()], ids=["sqlite", "pg"])
@given(
    rows=st.lists(
        st.fixed_dictionaries(
            {},
            optional={
                "c": st.text(max_size=5),
                "n": st.none() | st.integers(),
                "t": st.none()
                | st.datetimes(min_value=datetime(1970, 1, 2), timezones=st.just(timezone.utc)),  # noqa: DTZ001,
            },
        ),
        max_size=8,
    )
)
def test_args_many_gives_each_row_its_args(dialect: object, rows: list[dict[str, object]]) -> None:
    """``args_many`` (a row read with one ``itemgetter`` when it holds every bind name)
    gives what ``args`` gives each row, a missing name included."""
    n = bindparam("n", type_=BigInteger)
    t = bindparam("t", type_=UTCDateTime())
    c = bindparam("c", type_=String)
    # The second also binds a value of its own (the 1), which no row holds.
    for made in (select(c, n, t, t), select(c, n, t, n + 1)):
        stmt = CompiledStatement(made, dialect)  # type: ignore[arg-type]
        assert stmt.args_many(rows, {}) == [stmt.args(row) for row in rows]


TIMES = st.none() | st.datetimes(min_value=datetime(1970, 1, 2), timezones=st.just(timezone.utc))  # noqa: DTZ001


@pytest.mark.parametrize("dialect", [sqlite.dialect(), asyncpg.dialect()], ids=["sqlite", "pg"])
@given(
    values=st.lists(st.tuples(st.text(max_size=5), st.none() | st.integers(), TIMES), max_size=8),
    shared=st.booleans(),
)
def test_value_rows_give_each_row_its_args(
    dialect: object, values: list[tuple[object, ...]], shared: bool
) -> None:
    """``ValueRows`` (lists of values in the statement's order; one time object shared by
    the rows, as a batch's are, or not) give what ``args`` gives each row as a dict, and
    are left as they were; in another order they are read by name."""
    if shared and values:
        one = values[0][2]
        values = [(c, n, one) for c, n, _ in values]
    names = ("c", "n", "t")
    stmt = CompiledStatement(
        select(
            bindparam("c", type_=String),
            bindparam("n", type_=BigInteger),
            bindparam("t", type_=UTCDateTime()),
        ),
        dialect,  # type: ignore[arg-type]
    )
    want = [stmt.args(dict(zip(names, v, strict=True))) for v in values]
    rows = [list(v) for v in values]
    assert stmt.args_many(ValueRows(names, rows), {}) == want
    assert rows == [list(v) for v in values]
    reordered = [list(reversed(v)) for v in values]
    assert stmt.args_many(ValueRows(names[::-1], reordered), {}) == want


@pytest.mark.parametrize("dialect", [sqlite.dialect(), asyncpg.dialect()], ids=["sqlite", "pg"])
def test_binds_of_one_type_share_a_conversion_and_other_types_do_not(dialect: object) -> None:
    now = datetime(2026, 12, 4, 23, 30, tzinfo=NEW_YORK)
    created = CompiledStatement(select(bindparam("a", type_=UTCDateTime())), dialect)  # type: ignore[arg-type]
    updated = CompiledStatement(
        select(bindparam("b", type_=UTCDateTime()), bindparam("c", type_=UTCDateTime())),
        dialect,  # type: ignore[arg-type]
    )
    local = CompiledStatement(select(bindparam("d", type_=DateTime(timezone=True))), dialect)  # type: ignore[arg-type]
    memo: Memo = {}
    first = created.args({"a": now}, memo)[0]
    b, c = updated.args({"b": now, "c": now}, memo)
    assert b is first  # one conversion for every bind of the type
    assert c is first
    assert b == updated.args({"b": now, "c": now})[0]
    # The same time bound as another type converts as that type does.
    assert local.args({"d": now}, memo)[0] == local.args({"d": now})[0]
