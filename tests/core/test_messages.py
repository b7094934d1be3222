"""Messages (SPEC section 2) and conversation ids (section 3)."""

from __future__ import annotations

import json
import math
import unicodedata
from datetime import datetime, timezone
from typing import Any

import pytest
from helpers import deep, json_scalars, json_values, new_id
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import histstore
from histstore import HistStoreError, InvalidId, InvalidMessage, Message, validate_id
from histstore._core.codec import MAX_NESTING

MARKER = "SECRET-CONTENT-7f3a"

CHAT_MESSAGES: list[dict[str, Any]] = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "What is the weather in Paris?", "name": "ann"},
    {
        "role": "user",
        "content": [
            {"type": "text", "text": "What is in this picture?"},
            {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}},
        ],
    },
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "weather", "arguments": '{"city": "Paris"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 21.5}'},
    {"role": "assistant", "content": "21.5 degrees.", "refusal": None},
]

RESPONSES_ITEMS: list[dict[str, Any]] = [
    {"role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
    {
        "type": "reasoning",
        "id": "rs_1",
        "summary": [{"type": "summary_text", "text": "Need the tool."}],
        "encrypted_content": "gAAAA...",
    },
    {
        "type": "function_call",
        "id": "fc_1",
        "call_id": "call_9",
        "name": "weather",
        "arguments": '{"city":"Oslo"}',
        "status": "completed",
    },
    {"type": "function_call_output", "call_id": "call_9", "output": '{"temp": -3}'},
    {
        "type": "message",
        "id": "msg_1",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": "Cold.", "annotations": []}],
    },
]

ANTHROPIC_MESSAGES: list[dict[str, Any]] = [
    {"role": "user", "content": "Look this up."},
    {
        "role": "assistant",
        "content": [
            {"type": "thinking", "thinking": "I should search.", "signature": "sig=="},
            {"type": "text", "text": "Searching."},
            {"type": "tool_use", "id": "toolu_1", "name": "search", "input": {"q": "x", "n": 3}},
        ],
    },
    {
        "role": "user",
        "content": [
            {
                "type": "tool_result",
                "tool_use_id": "toolu_1",
                "content": [{"type": "text", "text": "found"}],
                "is_error": False,
            }
        ],
    },
]

ALL_SHAPES = CHAT_MESSAGES + RESPONSES_ITEMS + ANTHROPIC_MESSAGES


# ---------------------------------------------------------------- constructors


def test_role_constructors_build_the_chat_dicts() -> None:
    assert Message.user("hi").to_dict() == {"role": "user", "content": "hi"}
    assert Message.system("be brief").to_dict() == {"role": "system", "content": "be brief"}
    assert Message.assistant("ok").to_dict() == {"role": "assistant", "content": "ok"}
    assert Message.tool("42", tool_call_id="call_1").to_dict() == {
        "role": "tool",
        "content": "42",
        "tool_call_id": "call_1",
    }
    m = Message.user("hi", name="ann")
    assert m.to_dict() == {"role": "user", "content": "hi", "name": "ann"}
    assert (m.role, m.content) == ("user", "hi")


def test_assistant_with_tool_calls_and_no_content() -> None:
    calls = CHAT_MESSAGES[3]["tool_calls"]
    m = Message.assistant(tool_calls=calls)
    assert m.role == "assistant"
    assert m.content is None
    assert m == Message.from_dict(CHAT_MESSAGES[3])


@pytest.mark.parametrize("d", ALL_SHAPES, ids=lambda d: str(d.get("type") or d.get("role")))
def test_from_dict_to_dict_round_trip(d: dict[str, Any]) -> None:
    original = json.loads(json.dumps(d))
    m = Message.from_dict(d)
    assert m.to_dict() == original
    assert json.dumps(m.to_dict()) == json.dumps(original), "key order is kept"
    assert d == original, "from_dict left its argument alone"


@pytest.mark.parametrize(
    ("d", "role", "content"),
    [
        ({"role": "user", "content": "x"}, "user", "x"),
        (
            {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
            "function_call",
            None,
        ),
        ({"type": "message", "role": "assistant", "content": []}, "assistant", []),
        (
            {"type": "function_call_output", "call_id": "c", "output": "1"},
            "function_call_output",
            None,
        ),
    ],
)
def test_role_prefers_role_then_type_and_content_defaults_to_none(
    d: dict[str, Any], role: str, content: Any
) -> None:
    m = Message.from_dict(d)
    assert m.role == role
    assert m.content == content


# ---------------------------------------------------------------- equality, immutability


def test_equality_compares_the_dict_form_only() -> None:
    a = Message.from_dict({"role": "user", "content": "x", "name": "n"})
    b = Message.from_dict({"name": "n", "content": "x", "role": "user"})
    assert a == b
    assert a != Message.user("y")
    assert Message.user("1") != Message.user(1)
    assert Message.user(1) != Message.user(1.5)


async def test_equality_ignores_position_and_created_at(store: histstore.Store, cid: str) -> None:
    await store.write(cid, [Message.user("a"), Message.user("a")])
    first, second = await store.read(cid)
    assert (first.position, second.position) == (0, 1)
    assert first.created_at is not None
    assert first == second == Message.user("a")
    assert Message.user("a").position is None
    assert Message.user("a").created_at is None


def test_message_is_immutable() -> None:
    m = Message.user("x")
    with pytest.raises(AttributeError):
        m.position = 3
    with pytest.raises(AttributeError):
        m.role = "system"  # type: ignore[misc]
    with pytest.raises(AttributeError):
        del m.created_at


def test_message_is_not_changed_through_its_inputs_or_outputs() -> None:
    content = [{"type": "text", "text": "a"}]
    source: dict[str, Any] = {"role": "user", "content": content, "meta": {"k": [1, 2]}}
    m = Message.from_dict(source)
    content.append({"type": "text", "text": "b"})
    source["meta"]["k"].append(3)
    source["role"] = "system"
    out = m.to_dict()
    out["content"].clear()
    out["role"] = "assistant"
    m.content.append("junk")
    assert m.to_dict() == {
        "role": "user",
        "content": [{"type": "text", "text": "a"}],
        "meta": {"k": [1, 2]},
    }


# ---------------------------------------------------------------- invalid messages


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param("hello " + MARKER, id="string"),
        pytest.param(b"bytes", id="bytes"),
        pytest.param(["user", MARKER], id="list"),
        pytest.param(None, id="none"),
        pytest.param({"content": MARKER}, id="no-role-or-type"),
        pytest.param({}, id="empty-dict"),
        pytest.param({"role": 1, "content": MARKER}, id="int-role"),
        pytest.param({"type": None, "content": MARKER}, id="none-type"),
        pytest.param({"role": "user", "content": math.nan, "x": MARKER}, id="nan"),
        pytest.param({"role": "user", "content": math.inf, "x": MARKER}, id="inf"),
        pytest.param({"role": "user", "content": [-math.inf], "x": MARKER}, id="neg-inf-nested"),
        pytest.param({"role": "user", "content": MARKER + "\ud800"}, id="lone-surrogate"),
        pytest.param({"role": "user", "\udfff": MARKER}, id="lone-surrogate-key"),
        pytest.param({"role": "user", "content": {1: MARKER}}, id="int-key"),
        pytest.param({"role": "user", "content": {(1, 2): MARKER}}, id="tuple-key"),
        pytest.param({"role": "user", "content": (MARKER, 1)}, id="tuple-value"),
        pytest.param({"role": "user", "content": {MARKER}}, id="set-value"),
        pytest.param({"role": "user", "content": b"x", "x": MARKER}, id="bytes-value"),
        pytest.param({"role": "user", "content": object(), "x": MARKER}, id="object-value"),
        pytest.param(
            {"role": "user", "content": datetime.now(timezone.utc), "x": MARKER}, id="datetime"
        ),
        pytest.param({"role": "user", "content": Message.user(MARKER)}, id="message-value"),
    ],
)
def test_invalid_messages_raise_invalid_message_without_content(bad: Any) -> None:
    with pytest.raises(InvalidMessage) as info:
        Message.from_dict(bad)
    assert MARKER not in str(info.value)
    assert isinstance(info.value, ValueError)
    assert isinstance(info.value, HistStoreError)


def test_invalid_field_values_in_constructors() -> None:
    with pytest.raises(InvalidMessage):
        Message.user(math.nan)
    with pytest.raises(InvalidMessage):
        Message.assistant("x", tool_calls={1, 2})
    with pytest.raises(InvalidMessage):
        Message.tool("x", tool_call_id="c", extra="\ud83d")


# ---------------------------------------------------------------- JSON round trips


@given(
    content=json_values,
    extra=st.dictionaries(st.text(), json_values, max_size=4),
)
def test_any_json_round_trips_through_message(content: Any, extra: dict[str, Any]) -> None:
    d = {**extra, "role": "user", "content": content}
    assert json.loads(json.dumps(d)) == d
    m = Message.from_dict(d)
    assert m.to_dict() == d
    assert m.content == content
    assert Message.from_dict(m.to_dict()) == m


@given(extra=st.dictionaries(st.text(), json_scalars, max_size=6))
def test_a_flat_message_holds_what_its_json_decodes_to_and_its_own_copy(
    extra: dict[str, Any],
) -> None:
    # An object of scalars skips decoding its text again: what it holds must still be
    # exactly what the text decodes to (same values, same types), and the caller's
    # dict stays the caller's.
    d = {**extra, "role": "user"}
    m = Message.from_dict(d)
    decoded = json.loads(json.dumps(d, ensure_ascii=False))
    got = m.to_dict()
    assert got == decoded
    assert [(k, type(v)) for k, v in got.items()] == [(k, type(v)) for k, v in decoded.items()]
    d["role"] = "changed"
    d["added"] = 1
    assert m.role == "user"
    assert m.to_dict() == decoded


def _special_values() -> list[Any]:
    return [
        "nul \u0000 inside",
        {"\u0000key": "\u0000"},
        "astral \U0001f600 \U00010348 \U0010ffff",
        1.7976931348623157e308,
        -1.7976931348623157e308,
        5e-324,
        -0.0,
        2**80,
        -(2**70),
        "",
        [],
        {},
        deep(200),
        "\u2028\u2029\ufeff\x7f\x85 \t\r\n",
    ]


@pytest.mark.parametrize("value", _special_values(), ids=range(len(_special_values())))
def test_special_values_round_trip_through_message(value: Any) -> None:
    d = {"role": "user", "content": value}
    assert Message.from_dict(d).to_dict() == d


async def test_special_values_round_trip_through_the_store(
    store: histstore.Store, cid: str
) -> None:
    batch = [{"role": "user", "content": v, "i": i} for i, v in enumerate(_special_values())]
    await store.write(cid, batch)
    back = await store.read(cid)
    assert [m.to_dict() for m in back] == batch
    assert [json.dumps(m.to_dict()) for m in back] == [json.dumps(d) for d in batch]
    assert back == [Message.from_dict(d) for d in batch]


async def test_nesting_is_limited_by_the_store_alike_on_every_python(
    store: histstore.Store, cid: str
) -> None:
    # A message object is level 1: its content may nest MAX_NESTING - 1 deep. How deep
    # Python's json goes depends on the interpreter (5,000 levels pass on 3.13 and fail
    # on 3.11); the store's limit does not.
    deepest = {"role": "user", "content": deep(MAX_NESTING - 1)}
    await store.write(cid, [deepest])
    await store.merge_metadata(cid, {"k": deep(MAX_NESTING)})
    await store.list_append(cid, "steps", [deep(MAX_NESTING)])
    assert [m.to_dict() for m in await store.read(cid)] == [deepest]
    assert await store.metadata(cid) == {"k": deep(MAX_NESTING)}
    assert await store.list_load(cid, "steps") == [deep(MAX_NESTING)]
    too_deep = f"nested more than {MAX_NESTING} levels"
    for levels in (MAX_NESTING + 1, 5000):
        with pytest.raises(InvalidMessage, match=too_deep):
            await store.write(cid, [{"role": "user", "content": deep(levels - 1)}])
        with pytest.raises(InvalidMessage, match=too_deep):
            await store.merge_metadata(cid, {"k": deep(levels)})
        with pytest.raises(InvalidMessage, match=too_deep):
            await store.list_append(cid, "steps", [deep(levels)])
    assert await store.count(cid) == 1
    assert await store.list_len(cid, "steps") == 1


async def test_large_payload_round_trips_through_the_store(
    store: histstore.Store, cid: str
) -> None:
    # ~5 MB of UTF-8 with one- to four-byte characters, quotes and backslashes.
    big = 'plain "quoted" back\\slash \u00e9\u4e2d\U0001f600\n' * 140_000
    assert len(big.encode("utf-8")) > 5_000_000
    d = {"role": "tool", "tool_call_id": "c", "content": big, "tail": "\U0001f600\u0000"}
    await store.write(cid, [d, Message.user("after")])
    back = await store.read(cid)
    assert back[0].to_dict() == d
    assert back[1] == Message.user("after")


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    values=st.lists(json_values, min_size=1, max_size=4),
    extra=st.dictionaries(st.text(max_size=8), json_values, max_size=3),
)
async def test_any_json_round_trips_through_the_store(
    store: histstore.Store, values: list[Any], extra: dict[str, Any]
) -> None:
    conversation = new_id()
    batch = [{**extra, "role": "assistant", "content": v} for v in values]
    await store.write(conversation, batch)
    back = await store.read(conversation)
    assert [m.to_dict() for m in back] == batch
    assert [m.position for m in back] == list(range(len(batch)))


@pytest.mark.parametrize(
    "message",
    [
        {"role": "assistant", "content": "kept", "type": []},
        {
            "role": "user",
            "content": [{"type": {"a": 1}, "text": "x"}, {"type": "text", "text": "kept"}],
        },
        {
            "type": "pydantic_ai",
            "message": {"kind": "request", "parts": [{"part_kind": [], "content": "x"}]},
        },
    ],
    ids=["message-type", "block-type", "part-kind"],
)
def test_a_type_that_is_not_a_string_is_no_text_kind(message: dict[str, Any]) -> None:
    """Beside a role, ``type`` (of a message, a block, a framework part) may hold any JSON
    value: it then names no kind of text or turn, and the rest is read as usual."""
    m = histstore.Message.from_dict(message)
    assert histstore.indexed_text(m) in ("kept", None)
    assert histstore.turns.split_turns([m]) == [[m]]
    assert histstore.turns.pending_tool_calls([m]) == []


@given(extra=st.dictionaries(st.sampled_from(["type", "content", "tool_calls"]), json_values))
def test_indexed_text_takes_any_json_message(extra: dict[str, Any]) -> None:
    histstore.indexed_text(histstore.Message.from_dict({**extra, "role": "assistant"}))


# ---------------------------------------------------------------- ids


@pytest.mark.parametrize(
    "good",
    [
        "a",
        "x" * 255,
        "conv-1",
        "with inner  spaces",
        "日本語の会話",
        "\U0001f600",
        "a\u200bb",  # zero-width space: category Cf, not Cc, not stripped
        "user:42/thread#7",
    ],
)
def test_valid_ids_are_returned_unchanged(good: str) -> None:
    assert validate_id(good) is good


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param("", id="empty"),
        pytest.param("x" * 256, id="too-long"),
        pytest.param("\U0001f600" * 256, id="too-long-astral"),
        pytest.param("a\x00b", id="nul"),
        pytest.param("a\nb", id="newline"),
        pytest.param("a\tb", id="tab"),
        pytest.param("a\x1fb", id="us"),
        pytest.param("a\x7fb", id="del"),
        pytest.param("a\x85b", id="nel"),
        pytest.param("a\x9fb", id="c1-end"),
        pytest.param("a\ud800b", id="lone-high-surrogate"),
        pytest.param("a\udc00", id="lone-low-surrogate"),
        pytest.param(" a", id="leading-space"),
        pytest.param("a ", id="trailing-space"),
        pytest.param("a\u3000", id="trailing-ideographic-space"),
        pytest.param("\u2028a", id="leading-line-separator"),
        pytest.param("\u00a0a", id="leading-nbsp"),
        pytest.param(" ", id="only-space"),
    ],
)
def test_invalid_ids_raise_invalid_id(bad: str) -> None:
    with pytest.raises(InvalidId) as info:
        validate_id(bad)
    assert isinstance(info.value, ValueError)
    assert isinstance(info.value, HistStoreError)


@pytest.mark.parametrize("bad", [None, 1, 1.5, b"abc", ["a"], Message.user("a")])
def test_non_string_ids_raise_invalid_id(bad: object) -> None:
    with pytest.raises(InvalidId):
        validate_id(bad)


def _is_valid_id(s: str) -> bool:
    return (
        0 < len(s) <= 255
        and not any(unicodedata.category(c) in ("Cc", "Cs") for c in s)
        and s.strip() == s
    )


@given(st.text(alphabet=st.characters(codec=None, exclude_categories=()), max_size=300))
def test_validate_id_follows_the_rules(s: str) -> None:
    if _is_valid_id(s):
        assert validate_id(s) == s
    else:
        with pytest.raises(InvalidId):
            validate_id(s)
