"""An item filter as one SQL condition on the item's JSON text (``_storage.statements.
dialects.json_at`` reads a part of it on each database).

The rules are those of LangGraph's ``InMemoryStore``: each key of the filter names a
top-level field, and its value is

- an object of operators (keys starting with ``$``): ``$eq``, ``$ne``, ``$gt``, ``$gte``,
  ``$lt``, ``$lte``, all of which must hold;
- another object: the field is an object, and each of the filter's keys is a field of
  it, compared the same way (the object may hold other fields);
- a list: an array of that length whose elements compare equal, in order;
- ``None``: the field is ``null`` or missing; else a string, number or bool, equal (a
  number equals the same number as an int or a float, and ``True`` equals 1 as in Python).

``$ne`` holds where ``$eq`` does not (a missing field included). ``$gt``, ``$gte``,
``$lt`` and ``$lte`` compare numbers with a number (bools count as 0 and 1) and strings
with a string (by code point); a field of another type does not match.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Hashable, Mapping
from typing import Any

from sqlalchemy import (
    BindParameter,
    ColumnElement,
    Float,
    Integer,
    Text,
    and_,
    bindparam,
    false,
    func,
    not_,
    or_,
    true,
)
from sqlalchemy.engine import Dialect

from .._storage.statements.dialects import json_at

__all__ = ["filter_condition"]

Path = tuple[str | int, ...]
_ORDER: dict[str, Callable[[Any, Any], Any]] = {
    "$gt": operator.gt,
    "$gte": operator.ge,
    "$lt": operator.lt,
    "$lte": operator.le,
}


def filter_condition(
    dialect: Dialect, column: ColumnElement[Any], spec: Mapping[str, Any]
) -> tuple[ColumnElement[bool], dict[str, Any], Hashable]:
    """The condition that the JSON object in ``column`` matches the filter ``spec``,
    the values of its parameters (``f0``, ``f1``, ...), and its shape: filters of one
    shape make the same SQL (the same keys and operators, values of the same kinds), so
    a statement compiled for one serves the others with their parameters.

    Raises:
        ValueError: an unknown operator, an ordering compared with something that is
            neither a number nor a string, a non-finite number, or a key holding ``"``.
    """
    compiler = _Compiler(dialect, column)
    condition = compiler.matches((), spec)
    return condition, compiler.params, tuple(compiler.shape)


class _Compiler:
    def __init__(self, dialect: Dialect, column: ColumnElement[Any]) -> None:
        self._dialect = dialect
        self._column = column
        self.params: dict[str, Any] = {}
        self.shape: list[Hashable] = []

    def _bind(self, value: str | float | int) -> BindParameter[Any]:
        name = f"f{len(self.params)}"
        self.params[name] = value
        kind = (
            Text()
            if isinstance(value, str)
            else Float(53)
            if isinstance(value, float)
            else Integer()
        )
        return bindparam(name, type_=kind)

    def matches(self, path: Path, spec: Mapping[str, Any]) -> ColumnElement[bool]:
        self.shape.append(("fields", path, len(spec)))
        parts = [self.compare((*path, _key(k)), v) for k, v in spec.items()]
        return and_(true(), *parts)

    def compare(self, path: Path, wanted: Any) -> ColumnElement[bool]:
        if isinstance(wanted, Mapping):
            if any(isinstance(k, str) and k.startswith("$") for k in wanted):
                self.shape.append(("operators", path, len(wanted)))
                return and_(true(), *(self.operator(path, o, v) for o, v in wanted.items()))
            inside = self.matches(path, wanted)
            return (
                and_(func.coalesce(self._at(path, "object"), false()), inside) if path else inside
            )
        if isinstance(wanted, (list, tuple)):
            self.shape.append(("list", path))
            length = self._at(path, "length") == self._bind(len(wanted))
            items = [self.compare((*path, i), v) for i, v in enumerate(wanted)]
            return and_(func.coalesce(length, false()), *items)
        return self.equal(path, wanted)

    def equal(self, path: Path, wanted: Any) -> ColumnElement[bool]:
        """Never NULL: true where the value at ``path`` equals ``wanted`` (a scalar)."""
        if wanted is None:
            self.shape.append(("null", path))
            return self._at(path, "null")
        if isinstance(wanted, str):
            self.shape.append(("string", path))
            found: ColumnElement[bool] = self._at(path, "string") == self._bind(wanted)
        elif isinstance(wanted, (bool, int, float)):
            number = _finite(wanted)
            found = self._at(path, "number") == self._bind(number)
            self.shape.append(("number", path, number in (0.0, 1.0)))
            if number in (0.0, 1.0):
                found = or_(found, self._at(path, "boolean") == self._bind(int(number)))
        else:
            raise ValueError(f"a filter cannot compare a {type(wanted).__name__}")
        return func.coalesce(found, false())

    def operator(self, path: Path, name: object, value: Any) -> ColumnElement[bool]:
        self.shape.append((name, path))
        if name == "$eq":
            return self.compare(path, value)
        if name == "$ne":
            return not_(self.compare(path, value))
        order = _ORDER.get(name) if isinstance(name, str) else None
        if order is None:
            raise ValueError(f"Unsupported operator: {name}")
        if isinstance(value, str):
            self.shape.append("string")
            return func.coalesce(order(self._at(path, "string"), self._bind(value)), false())
        if not isinstance(value, (bool, int, float)):
            raise ValueError(f"{name} compares numbers or strings")
        bound = self._bind(_finite(value))
        number = func.coalesce(self._at(path, "number"), self._at(path, "boolean"))
        return func.coalesce(order(number, bound), false())

    def _at(self, path: Path, part: Any) -> ColumnElement[Any]:
        return json_at(self._dialect, self._column, path, part)


def _key(key: object) -> str:
    if not isinstance(key, str) or '"' in key:
        raise ValueError("a filter's keys are strings without '\"'")
    return key


def _finite(value: bool | int | float) -> float:
    number = float(value)
    if not math.isfinite(number):
        raise ValueError("a filter compares finite numbers only")
    return number
