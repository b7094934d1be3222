"""histstore.turns: examples in the three tool-use shapes, and hypothesis properties."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from histstore import InvalidMessage, Message
from histstore.turns import pending_tool_calls, split_turns, status, validate_pairing

SECRET = "s3cr3t-content"


def fn_call(call_id: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": "f", "arguments": "{}"}}


# --------------------------------------------------------------------------- examples


def test_chat_completions_example() -> None:
    history: list[Any] = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "weather in Paris and Rome?"},
        {"role": "assistant", "content": None, "tool_calls": [fn_call("a"), fn_call("b")]},
        {"role": "tool", "tool_call_id": "b", "content": "sun"},
    ]
    assert status(history) == "interrupted"
    assert pending_tool_calls(history) == [fn_call("a")]
    with pytest.raises(InvalidMessage, match="'a'"):
        validate_pairing(history)

    history.append(Message.tool("rain", tool_call_id="a"))
    assert pending_tool_calls(history) == []
    assert status(history) == "open"
    validate_pairing(history)

    history.append(Message.assistant("sun in Rome, rain in Paris"))
    assert status(history) == "closed"
    history.append(Message.user("thanks"))
    assert status(history) == "open"

    turns = split_turns(history)
    assert [len(t) for t in turns] == [5, 1]
    assert turns[0][0] == Message.from_dict(history[1])
    assert all(m.role != "system" for t in turns for m in t)


def test_responses_example() -> None:
    history: list[dict[str, Any]] = [
        {"role": "user", "content": "add 2 and 3"},
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {"type": "function_call", "call_id": "c1", "name": "add", "arguments": "[2, 3]"},
    ]
    assert status(history) == "interrupted"
    assert pending_tool_calls(history) == [history[2]]

    history.append({"type": "function_call_output", "call_id": "c1", "output": "5"})
    assert status(history) == "open"
    validate_pairing(history)

    history.append({"type": "reasoning", "id": "rs_2", "summary": []})
    assert status(history) == "open"  # reasoning decides nothing
    history.append(
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "5"}],
        }
    )
    assert status(history) == "closed"
    history.append({"type": "reasoning", "id": "rs_3", "summary": []})
    assert status(history) == "closed"

    history.append(
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "more"}]}
    )
    assert [len(t) for t in split_turns(history)] == [7, 1]
    assert status(history) == "open"


def test_anthropic_example() -> None:
    use = {"type": "tool_use", "id": "toolu_1", "name": "search", "input": {"q": SECRET}}
    use2 = {"type": "tool_use", "id": "toolu_2", "name": "search", "input": {}}
    history: list[dict[str, Any]] = [
        {"role": "user", "content": "find it"},
        {"role": "assistant", "content": [{"type": "text", "text": "looking"}, use, use2]},
    ]
    assert pending_tool_calls(history) == [use, use2]
    assert status(history) == "interrupted"

    result = {"type": "tool_result", "tool_use_id": "toolu_1", "content": SECRET}
    history.append({"role": "user", "content": [result]})
    assert pending_tool_calls(history) == [use2]
    assert len(split_turns(history)) == 1  # tool results start no turn
    with pytest.raises(InvalidMessage) as info:
        validate_pairing(history)
    assert "toolu_2" in str(info.value)
    assert SECRET not in str(info.value)

    result2 = {"type": "tool_result", "tool_use_id": "toolu_2", "content": "none"}
    history.append({"role": "user", "content": [result2]})
    validate_pairing(history)
    assert status(history) == "open"
    history.append({"role": "assistant", "content": [{"type": "text", "text": "found"}]})
    assert status(history) == "closed"
    assert [len(t) for t in split_turns(history)] == [5]


def test_tool_results_with_text_continue_the_turn() -> None:
    use = {"type": "tool_use", "id": "t1", "name": "f", "input": {}}
    history: list[dict[str, Any]] = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": [use]},
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": "ok"},
                {"type": "text", "text": "and then stop"},
            ],
        },
    ]
    assert len(split_turns(history)) == 1
    assert pending_tool_calls(history) == []
    assert status(history) == "open"
    validate_pairing(history)


def test_leading_messages_form_a_turn_and_systems_are_left_out() -> None:
    history = [
        Message.system("sys"),
        Message.assistant("hello, how can I help?"),
        Message.system("more sys"),
        Message.user("hi"),
        Message.system("late sys"),
        Message.assistant("hey"),
    ]
    assert split_turns(history) == [[history[1]], [history[3], history[5]]]
    assert split_turns([Message.system("only")]) == []
    assert split_turns([]) == []


def test_status_empty_and_other_items() -> None:
    assert status([]) == "empty"
    assert status([Message.system("x"), {"role": "system", "content": "y"}]) == "empty"
    assert status([Message.user("q")]) == "open"
    assert status([{"type": "reasoning", "id": "r", "summary": []}]) == "open"
    assert status([Message.user("q"), {"role": "developer", "content": "d"}]) == "open"
    assert status([Message.user("q"), Message.assistant("a"), Message.system("s")]) == "closed"


def test_pending_calls_are_only_those_of_the_current_turn() -> None:
    history = [
        Message.user("one"),
        Message.assistant(None, tool_calls=[fn_call("old")]),
        Message.user("never mind"),
        Message.assistant(None, tool_calls=[fn_call("new")]),
    ]
    assert pending_tool_calls(history) == [fn_call("new")]
    assert pending_tool_calls(history[:3]) == []
    assert status(history[:3]) == "open"


def test_pending_calls_are_fresh_copies() -> None:
    history = [Message.user("q"), Message.assistant(None, tool_calls=[fn_call("a")])]
    calls = pending_tool_calls(history)
    calls[0]["function"]["name"] = "changed"
    assert pending_tool_calls(history) == [fn_call("a")]


def test_a_result_before_its_call_does_not_answer_it() -> None:
    history = [
        Message.user("q"),
        Message.tool("early", tool_call_id="a"),
        Message.assistant(None, tool_calls=[fn_call("a")]),
    ]
    assert pending_tool_calls(history) == [fn_call("a")]
    with pytest.raises(InvalidMessage, match="'a'"):
        validate_pairing(history)


@pytest.mark.parametrize(
    ("history", "fragment"),
    [
        pytest.param(
            [Message.user("q"), Message.tool(SECRET, tool_call_id="ghost")],
            "'ghost'",
            id="orphan-result",
        ),
        pytest.param(
            [
                Message.user("q"),
                Message.assistant(None, tool_calls=[fn_call("a")]),
                Message.tool(SECRET, tool_call_id="a"),
                Message.tool(SECRET, tool_call_id="a"),
            ],
            "more than one result",
            id="duplicate-result",
        ),
        pytest.param(
            [
                Message.user("q"),
                Message.assistant(None, tool_calls=[fn_call("a"), fn_call("a")]),
                Message.tool(SECRET, tool_call_id="a"),
            ],
            "more than once",
            id="duplicate-call-id",
        ),
        pytest.param(
            [
                Message.user("q"),
                Message.assistant(None, tool_calls=[fn_call("a")]),
                Message.user(SECRET),
                Message.tool(SECRET, tool_call_id="a"),
            ],
            "before the user message",
            id="result-after-next-user-message",
        ),
        pytest.param(
            [Message.user("q"), {"type": "function_call", "name": "f", "arguments": SECRET}],
            "no id",
            id="call-without-id",
        ),
        pytest.param(
            [Message.user("q"), {"type": "function_call_output", "output": SECRET}],
            "names no call",
            id="result-without-id",
        ),
    ],
)
def test_validate_pairing_rejects(history: list[Any], fragment: str) -> None:
    with pytest.raises(InvalidMessage, match=fragment) as info:
        validate_pairing(history)
    assert SECRET not in str(info.value)


@pytest.mark.parametrize("fn", [split_turns, pending_tool_calls, validate_pairing, status])
def test_rejects_what_is_not_a_message(fn: Any) -> None:
    with pytest.raises(InvalidMessage):
        fn(["hello"])
    with pytest.raises(InvalidMessage):
        fn([{"content": "no role"}])
    with pytest.raises(InvalidMessage):
        fn({"role": "user", "content": "one message, not a list"})


# --------------------------------------------------------------------------- properties


@dataclass
class Item:
    """A generated message with what the generator knows about it."""

    data: dict[str, Any]
    kind: str  # "system", "user", "lead", "assistant", "call", "result", "reasoning"
    calls: list[str] = field(default_factory=list)
    answers: list[str] = field(default_factory=list)


SHAPES = ("chat", "responses", "anthropic")


@st.composite
def tool_step(draw: st.DrawFn, shape: str, ids: list[int]) -> list[Item]:
    """A batch of tool calls followed by their results, in one shape."""
    n = draw(st.integers(1, 3))
    names = []
    for _ in range(n):
        ids[0] += 1
        names.append(f"call_{ids[0]}")
    order = draw(st.permutations(names))
    if shape == "chat":
        calls = [
            Item(
                {"role": "assistant", "content": None, "tool_calls": [fn_call(c) for c in names]},
                "call",
                calls=names,
            )
        ]
        results = [
            Item({"role": "tool", "tool_call_id": c, "content": "r"}, "result", answers=[c])
            for c in order
        ]
    elif shape == "responses":
        calls = [
            Item(
                {"type": "function_call", "call_id": c, "name": "f", "arguments": "{}"},
                "call",
                calls=[c],
            )
            for c in names
        ]
        results = [
            Item(
                {"type": "function_call_output", "call_id": c, "output": "r"}, "result", answers=[c]
            )
            for c in order
        ]
    else:
        blocks = [{"type": "tool_use", "id": c, "name": "f", "input": {}} for c in names]
        if draw(st.booleans()):
            blocks.insert(0, {"type": "text", "text": "let me check"})
        calls = [Item({"role": "assistant", "content": blocks}, "call", calls=names)]
        content = [{"type": "tool_result", "tool_use_id": c, "content": "r"} for c in order]
        results = [Item({"role": "user", "content": content}, "result", answers=list(order))]
    return calls + results


def user_item(shape: str, text: str) -> Item:
    if shape == "responses":
        content = [{"type": "input_text", "text": text}]
        return Item({"type": "message", "role": "user", "content": content}, "user")
    return Item({"role": "user", "content": text}, "user")


def answer_item(shape: str, text: str) -> Item:
    if shape == "responses":
        content = [{"type": "output_text", "text": text}]
        return Item({"type": "message", "role": "assistant", "content": content}, "assistant")
    if shape == "anthropic":
        return Item({"role": "assistant", "content": [{"type": "text", "text": text}]}, "assistant")
    return Item({"role": "assistant", "content": text}, "assistant")


@st.composite
def histories(draw: st.DrawFn) -> list[Item]:
    """A well-paired history: every call is answered within its turn."""
    shape = draw(st.sampled_from(SHAPES))
    ids = [0]
    items: list[Item] = []
    if draw(st.booleans()):
        lead = answer_item(shape, "hello")
        items.append(Item(lead.data, "lead"))
    for t in range(draw(st.integers(0, 5))):
        items.append(user_item(shape, f"question {t}"))
        for _ in range(draw(st.integers(0, 3))):
            if shape == "responses" and draw(st.booleans()):
                items.append(
                    Item({"type": "reasoning", "id": f"rs_{t}", "summary": []}, "reasoning")
                )
            else:
                items.extend(draw(tool_step(shape, ids)))
        if draw(st.booleans()):
            items.append(answer_item(shape, f"answer {t}"))
    for _ in range(draw(st.integers(0, 3))):
        at = draw(st.integers(0, len(items)))
        items.insert(at, Item({"role": "system", "content": "sys"}, "system"))
    return items


def as_input(items: list[Item], as_messages: list[bool]) -> list[Any]:
    """The items' dicts, some of them as Message values (the functions take both)."""
    out: list[Any] = []
    for i, item in enumerate(items):
        wrap = as_messages[i % len(as_messages)] if as_messages else False
        out.append(Message.from_dict(item.data) if wrap else copy.deepcopy(item.data))
    return out


def call_id(call: dict[str, Any]) -> str:
    return str(call["call_id"] if "call_id" in call else call["id"])


@given(histories(), st.lists(st.booleans(), max_size=4))
def test_turns_partition_the_non_system_messages(items: list[Item], wrap: list[bool]) -> None:
    turns = split_turns(as_input(items, wrap))
    flat = [m for turn in turns for m in turn]
    non_system = [it for it in items if it.kind != "system"]
    assert flat == [Message.from_dict(it.data) for it in non_system]
    starts = [i for i, it in enumerate(non_system) if it.kind == "user"]
    if non_system and non_system[0].kind != "user":
        starts.insert(0, 0)  # the leading turn
    ends = [*starts[1:], len(non_system)] if starts else []
    lengths = [b - a for a, b in zip(starts, ends, strict=True)]
    assert [len(t) for t in turns] == lengths
    for turn in turns[1:]:
        assert turn[0].role == "user"


@given(histories(), st.lists(st.booleans(), max_size=4))
def test_well_paired_histories_pass(items: list[Item], wrap: list[bool]) -> None:
    history = as_input(items, wrap)
    validate_pairing(history)
    assert pending_tool_calls(history) == []


@given(histories(), st.data())
def test_a_dropped_result_is_rejected(items: list[Item], data: st.DataObject) -> None:
    results = [i for i, it in enumerate(items) if it.kind == "result"]
    if not results:
        return
    drop = data.draw(st.sampled_from(results))
    with pytest.raises(InvalidMessage) as info:
        validate_pairing([it.data for i, it in enumerate(items) if i != drop])
    assert any(repr(c) in str(info.value) for c in items[drop].answers)


@given(histories(), st.data())
def test_a_duplicated_result_is_rejected(items: list[Item], data: st.DataObject) -> None:
    results = [i for i, it in enumerate(items) if it.kind == "result"]
    if not results:
        return
    dup = data.draw(st.sampled_from(results))
    # Right after the original, or anywhere later (possibly in a later turn).
    at = data.draw(st.integers(dup + 1, len(items)))
    history = [it.data for it in items]
    history.insert(at, copy.deepcopy(items[dup].data))
    with pytest.raises(InvalidMessage):
        validate_pairing(history)


@given(histories(), st.data())
def test_a_result_for_an_unknown_call_is_rejected(items: list[Item], data: st.DataObject) -> None:
    users = [i for i, it in enumerate(items) if it.kind == "user"]
    if not users:
        return
    at = data.draw(st.sampled_from(users)) + 1
    history = [it.data for it in items]
    history.insert(at, {"role": "tool", "tool_call_id": "nobody", "content": "r"})
    with pytest.raises(InvalidMessage, match="'nobody'"):
        validate_pairing(history)


@given(histories(), st.data(), st.lists(st.booleans(), max_size=4))
def test_prefixes_status_and_pending_agree(
    items: list[Item], data: st.DataObject, wrap: list[bool]
) -> None:
    cut = data.draw(st.integers(0, len(items)))
    prefix = items[:cut]
    history = as_input(prefix, wrap)

    answered = {c for it in prefix for c in it.answers}
    expected = [c for it in prefix for c in it.calls if c not in answered]
    pending = pending_tool_calls(history)
    assert [call_id(c) for c in pending] == expected

    result = status(history)
    relevant = [it for it in prefix if it.kind != "system"]
    if not relevant:
        assert result == "empty"
    elif expected:
        assert result == "interrupted"
        with pytest.raises(InvalidMessage):
            validate_pairing(history)
    else:
        validate_pairing(history)
        deciding = [it for it in relevant if it.kind != "reasoning"]
        last = deciding[-1].kind if deciding else "user"
        assert result == ("closed" if last in ("assistant", "lead") else "open")
    assert (result == "interrupted") == bool(pending)
