"""A store's change records read back for a revert (``change_log.logged`` with
``pending``): the removed entries are read one at a time and their messages kept as
text until they are needed; they must come back exactly as a whole decode gives them."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from histstore import HistStoreError
from histstore._editable.change_log import encode, logged
from histstore._editable.changes import Change
from histstore._editable.entries import PENDING, Entry, settle

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=timezone.utc)

# Messages whose text looks like the record around them: keys an entry has, brackets,
# commas and quotes, nested objects with an "id" first.
AWKWARD: list[dict[str, Any]] = [
    {"role": "user", "content": '},{"id":7,"message":{"role":"user"}}],"start":1'},
    {"role": "assistant", "content": [{"id": 1, "message": "x"}, {"id": 2, "text": "]}"}]},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "call_1", "function": {"name": "f", "arguments": '{"a": [1]}'}}],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": 'é 中文 \u2028 \\ " \n'},
    {"type": "function_call_output", "call_id": "c", "output": "[]"},
]


def removed_entries(messages: list[dict[str, Any]]) -> tuple[Entry, ...]:
    return tuple(
        Entry(
            m,
            entry_id=10 + i,
            author=None if i % 2 else f'plugin:"{i}"',
            created_at=None if i % 3 == 2 else T0 + timedelta(seconds=i),
        )
        for i, m in enumerate(messages)
    )


def read_back(text: str, pending: dict[int, Any] | None) -> Change:
    return logged(4, "commit", "me", T0, text, pending).change


def settled(change: Change, pending: dict[int, Any]) -> list[Entry]:
    entries = list(change.removed)
    settle(entries, pending)
    return entries


@pytest.mark.parametrize("start", [None, 0, 3])
def test_removed_entries_read_one_at_a_time_equal_a_whole_decode(start: int | None) -> None:
    change = Change("commit", start=start, removed=removed_entries(AWKWARD))
    text = encode(change, added=2)
    whole = read_back(text, None)
    pending: dict[int, Any] = {}
    lazy = read_back(text, pending)
    assert all(e.message is PENDING for e in lazy.removed)
    assert len(pending) == len(AWKWARD)  # every message kept, as text
    assert all(type(v) is str for v in pending.values())
    assert lazy.start == whole.start == start
    assert settled(lazy, pending) == list(whole.removed) == list(change.removed)
    assert [e.message.to_dict() for e in settled(lazy, pending)] == AWKWARD
    assert logged(4, "commit", "me", T0, text, {}).added == 2


def test_a_record_in_another_layout_is_decoded_whole() -> None:
    change = Change("commit", start=1, removed=removed_entries(AWKWARD[:2]))
    spaced = json.dumps(json.loads(encode(change)), indent=1)  # same record, not as encode writes
    pending: dict[int, Any] = {}
    lazy = read_back(spaced, pending)
    assert settled(lazy, pending) == list(change.removed)


def test_an_entry_whose_fields_come_in_another_order() -> None:
    change = Change("commit", start=0, removed=removed_entries(AWKWARD[:1]))
    text = encode(change)
    author, created = ',"author":"plugin:\\"0\\""', f',"created_at":"{T0.isoformat()}"'
    assert author + created in text
    swapped = text.replace(author + created, created + author)
    pending: dict[int, Any] = {}
    assert settled(read_back(swapped, pending), pending) == list(change.removed)


def test_entries_in_another_layout_inside_a_compact_record() -> None:
    change = Change("commit", start=0, removed=removed_entries(AWKWARD[:2]))
    text = encode(change)
    # The same entries with their keys in another order: each is decoded whole.
    reordered = text.replace('{"id":10,"message":', '{"message":', 1)
    author = ',"author":"plugin:\\"0\\""'
    reordered = reordered.replace(author, ',"id":10' + author, 1)
    assert reordered != text
    pending: dict[int, Any] = {}
    assert settled(read_back(reordered, pending), pending) == list(change.removed)


@pytest.mark.parametrize(
    "text",
    [
        '{"removed":[',
        '{"removed":[{"id":1,"message":{"role":"user","content":"a"}}',
        '{"removed":[{"id":1,"message":{"role":"user","content":"a"}};',
        '{"removed":[{"id":1,"message":{"role":"user","content":"a"},"author":}]}',
        '{"removed":[{"id":1,"message":{"role":"user","content":"a"},"extra":1}]}',
        '{"removed":[{"id":0,"message":{"role":"user","content":"a"}}]}',
        '{"removed":[{"id":1,"message":{"role":"user","content":"a"}}]',
        '{"removed":[{"id":1,"message":{"role":"user","content":"a"}}]]',
        '{"start":1,"removed":[{"id":1,"message":{"role":"user","content":"a"}}],"added":-1}',
    ],
)
def test_a_damaged_record_is_refused(text: str) -> None:
    with pytest.raises(HistStoreError, match="change record 4 is damaged"):
        read_back(text, {})


message_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=8,
)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.fixed_dictionaries(
            {"role": st.sampled_from(["user", "assistant", "tool"])},
            optional={
                "content": message_values,
                "id": st.integers(1, 5),
                "message": message_values,
            },
        ),
        max_size=6,
    ),
    st.none() | st.integers(0, 9),
)
def test_any_removed_list_round_trips(messages: list[dict[str, Any]], start: int | None) -> None:
    change = Change("revert", start=start, removed=removed_entries(messages))
    pending: dict[int, Any] = {}
    lazy = read_back(encode(change), pending)
    assert settled(lazy, pending) == list(change.removed)
    assert [e.message.to_dict() for e in settled(lazy, pending)] == messages
