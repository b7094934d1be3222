"""SQLite computes the text of the common message shapes from their JSON (revision
e5c3a9d7f2b4): the Python twin (``computed_text.sqlite_text``) is what SQLite computes,
and a row's text (``search_text``, else SQLite's) is its ``indexed_text``, whatever the
shape."""

from __future__ import annotations

import json
import sqlite3
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from histstore._core.search_text import indexed_text
from histstore._storage import rows
from histstore._storage.computed_text import UNKNOWN, sqlite_text, sqlite_text_sql

_DB = sqlite3.connect(":memory:")
_DB.execute("CREATE TABLE m (data TEXT)")
_SQL = f"SELECT nullif(({sqlite_text_sql('m')}), '') FROM m"

words = st.sampled_from(["", "auk", "skua tern", "a\x00b", "é ü", "\n", "0"])
scalars = st.one_of(words, st.none(), st.booleans(), st.integers(-2, 2))
kinds = st.sampled_from(["text", "input_text", "output_text", "image", "tool_use", 3, None])
blocks = st.one_of(
    words,
    scalars,
    st.fixed_dictionaries({"type": kinds}, optional={"text": scalars, "input": scalars}),
)
contents = st.one_of(scalars, st.lists(blocks, max_size=3))
parts = st.fixed_dictionaries(
    {}, optional={"text": scalars, "thought": scalars, "function_call": st.just({"args": {}})}
)
adk = st.fixed_dictionaries(
    {
        "type": st.just("adk_event"),
        "event": st.fixed_dictionaries(
            {}, optional={"content": st.fixed_dictionaries({}, optional={"parts": st.one_of(
                scalars, st.lists(st.one_of(parts, words), max_size=2))})}
        ),
    },
    optional={"role": st.just("user"), "content": contents},
)  # fmt: skip
items = st.fixed_dictionaries(
    {
        "type": st.sampled_from(
            ["function_call_output", "custom_tool_call_output", "mcp_call", "message", 1]
        )
    },
    optional={"output": st.one_of(contents, words), "content": contents, "role": st.just("x")},
)
messages = st.one_of(
    st.fixed_dictionaries({"role": st.just("user"), "content": contents}),
    st.fixed_dictionaries(
        {"role": st.just("assistant"), "content": contents},
        optional={"tool_calls": st.just([{"function": {"arguments": '{"a": "zebra"}'}}])},
    ),
    adk,
    items,
)


def computed(d: dict[str, Any]) -> str | None:
    _DB.execute("DELETE FROM m")
    _DB.execute("INSERT INTO m VALUES (?)", (json.dumps(d, ensure_ascii=False),))
    return _DB.execute(_SQL).fetchone()[0]  # type: ignore[no-any-return]


@settings(max_examples=600, deadline=None)
@given(messages)
def test_the_python_twin_is_what_sqlite_computes(d: dict[str, Any]) -> None:
    twin = sqlite_text(d)
    if twin is not UNKNOWN:
        assert twin == computed(d)


@settings(max_examples=600, deadline=None)
@given(messages)
def test_a_row_is_found_by_its_indexed_text_on_sqlite(d: dict[str, Any]) -> None:
    stored = rows.sqlite_stored_text(d, json.dumps(d))
    found = stored if stored is not None else computed(d)
    assert (found or None) == rows.searchable(indexed_text(d))


def test_the_common_adapter_shapes_store_no_copy() -> None:
    shapes = [
        {"role": "user", "content": "auk"},
        {"role": "assistant", "type": "message", "id": "m", "status": "completed",
         "content": [{"type": "output_text", "text": "auk", "annotations": []}]},
        {"role": "tool", "type": "function_call_output", "call_id": "c", "output": "auk"},
        {"role": "user", "type": "adk_event",
         "event": {"content": {"role": "user", "parts": [{"text": "auk"}]}, "id": "e"}},
    ]  # fmt: skip
    for d in shapes:
        assert rows.sqlite_stored_text(d, json.dumps(d)) is None
        assert computed(d) == "auk" == indexed_text(d)
        pg = rows.pg_stored_text(d, json.dumps(d))  # PostgreSQL's index reads strings only
        assert pg == (None if d.get("content") == "auk" else "auk")
