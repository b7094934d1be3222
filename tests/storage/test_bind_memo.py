"""Bind values are converted once per transaction and value (``CompiledStatement.args``'s
memo): equal times share a conversion, times that only look alike do not."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest
from sqlalchemy import bindparam, select
from sqlalchemy.dialects import sqlite
from sqlalchemy.dialects.postgresql import asyncpg

from histstore._storage.drivers import CompiledStatement, Memo
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
