"""WindowStore: merged system message, limits, whole turns, pass-through, bounded reads."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import histstore
from histstore import InvalidId, Message, WindowTooSmall
from histstore._core.models import stored_message
from histstore.turns import split_turns, validate_pairing
from histstore.window import WindowStore

SECRET = "s3cr3t-content"


def new_id() -> str:
    return uuid.uuid4().hex


def call(call_id: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": "f", "arguments": "{}"}}


def chat_turns(n: int, prefix: str = "") -> list[Message]:
    """``n`` turns of a user message and an assistant answer."""
    out: list[Message] = []
    for i in range(n):
        out += [Message.user(f"{prefix}q{i}"), Message.assistant(f"{prefix}a{i}")]
    return out


def by_content_length(m: Message) -> int:
    return len(str(m.content))


class SpyStore:
    """Forwards to a store and counts the messages its reads return."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.count_tokens = store.count_tokens
        self.fetched = 0
        self.reads: list[dict[str, Any]] = []

    async def read(self, conversation: str, **kwargs: Any) -> list[Message]:
        page: list[Message] = await self.store.read(conversation, **kwargs)
        self.fetched += len(page)
        self.reads.append(kwargs)
        return page

    async def system_messages(self, conversation: str) -> list[Message]:
        result: list[Message] = await self.store.system_messages(conversation)
        return result


# --------------------------------------------------------------------------- construction


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        pytest.param({}, ValueError, id="no-limit"),
        pytest.param({"max_messages": 0}, ValueError, id="zero-messages"),
        pytest.param({"max_messages": -3}, ValueError, id="negative-messages"),
        pytest.param({"max_messages": 2.0}, TypeError, id="float-messages"),
        pytest.param({"max_messages": "5"}, TypeError, id="str-messages"),
        pytest.param({"max_messages": True}, TypeError, id="bool-messages"),
        pytest.param({"max_tokens": 0, "count_tokens": len}, ValueError, id="zero-tokens"),
        pytest.param({"max_tokens": 100}, ValueError, id="tokens-without-counter"),
        pytest.param({"max_tokens": 100, "count_tokens": 3}, TypeError, id="counter-not-callable"),
    ],
)
async def test_constructor_validates(
    store: histstore.Store, kwargs: dict[str, Any], error: type[Exception]
) -> None:
    with pytest.raises(error):
        WindowStore(store, **kwargs)


async def test_constructor_keeps_limits(store: histstore.Store) -> None:
    w = WindowStore(store, max_messages=7, max_tokens=50, count_tokens=by_content_length)
    assert (w.store, w.max_messages, w.max_tokens) == (store, 7, 50)


# --------------------------------------------------------------------------- reading


async def test_unknown_and_empty_conversations(store: histstore.Store) -> None:
    w = WindowStore(store, max_messages=3)
    assert await w.read(new_id()) == []
    with pytest.raises(InvalidId):
        await w.read(" bad ")


async def test_merged_system_message(store: histstore.Store) -> None:
    conv = new_id()
    history = [
        Message.system("be brief"),
        Message.user("q0"),
        Message.assistant("a0"),
        Message.system("answer in French"),
        Message.user("q1"),
        Message.assistant("a1"),
    ]
    await store.write(conv, history)
    window = await WindowStore(store, max_messages=10).read(conv)
    assert window == [Message.system("be brief\n\nanswer in French"), *chat_turns(2)]
    assert window[0].position is None
    assert [m.position for m in window[1:]] == [1, 2, 4, 5]
    assert all(m.created_at is not None for m in window[1:])


async def test_merged_system_message_with_blocks(store: histstore.Store) -> None:
    conv = new_id()
    block = {"type": "text", "text": "rules", "cache_control": {"type": "ephemeral"}}
    await store.write(
        conv,
        [
            {"role": "system", "content": [block]},
            Message.user("q"),
            {"role": "system", "content": "more"},
            {"role": "system", "content": None},
        ],
    )
    window = await WindowStore(store, max_messages=5).read(conv)
    assert window[0] == Message.system([block, {"type": "text", "text": "more"}])
    assert window[1:] == [Message.user("q")]


async def test_single_system_message_and_no_turns(store: histstore.Store) -> None:
    conv = new_id()
    await store.write(conv, [{"role": "system", "content": "only", "name": "x"}])
    assert await WindowStore(store, max_messages=1).read(conv) == [Message.system("only")]


async def test_max_messages_keeps_whole_turns(store: histstore.Store) -> None:
    conv = new_id()
    await store.write(conv, chat_turns(5))
    assert await WindowStore(store, max_messages=5).read(conv) == chat_turns(5)[-4:]
    assert await WindowStore(store, max_messages=10).read(conv) == chat_turns(5)
    assert await WindowStore(store, max_messages=100).read(conv) == chat_turns(5)

    await store.write(conv, [Message.system("sys")])
    # The merged system message takes one of the five places.
    assert await WindowStore(store, max_messages=5).read(conv) == [
        Message.system("sys"),
        *chat_turns(5)[-4:],
    ]
    assert await WindowStore(store, max_messages=4).read(conv) == [
        Message.system("sys"),
        *chat_turns(5)[-2:],
    ]


async def test_max_tokens(store: histstore.Store) -> None:
    conv = new_id()
    # Token counts (content length): 2, 5 | 2, 5 | 2, 5; system: 6.
    history = [Message.system("system")]
    for i in range(3):
        history += [Message.user(f"q{i}"), Message.assistant(f"ans{i}!")]
    await store.write(conv, history)

    def window(max_tokens: int, **kw: Any) -> WindowStore:
        return WindowStore(store, max_tokens=max_tokens, count_tokens=by_content_length, **kw)

    assert await window(6 + 14).read(conv) == [history[0], *history[3:]]
    assert await window(6 + 21).read(conv) == history
    assert await window(6 + 20).read(conv) == [history[0], *history[3:]]
    assert await window(6 + 13).read(conv) == [history[0], *history[5:]]
    # Both limits: the tighter one rules.
    assert await window(100, max_messages=3).read(conv) == [history[0], *history[5:]]
    with pytest.raises(WindowTooSmall):
        await window(6 + 6).read(conv)
    with pytest.raises(WindowTooSmall):
        await window(5).read(conv)  # the system message alone is over


async def test_count_tokens_defaults_to_the_stores(backend: Any) -> None:
    async with backend.connect(count_tokens=by_content_length) as store:
        conv = new_id()
        await store.write(conv, chat_turns(3))
        w = WindowStore(store, max_tokens=8)  # each turn: 2 + 2 tokens
        assert await w.read(conv) == chat_turns(3)[-4:]
        # An explicit counter wins over the store's.
        w = WindowStore(store, max_tokens=8, count_tokens=lambda m: 1)
        assert await w.read(conv) == chat_turns(3)


async def test_window_too_small(store: histstore.Store) -> None:
    conv = new_id()
    await store.write(conv, [Message.user("q"), Message.assistant("a"), Message.assistant(SECRET)])
    with pytest.raises(WindowTooSmall) as info:
        await WindowStore(store, max_messages=2).read(conv)
    assert conv in str(info.value)
    assert SECRET not in str(info.value)
    assert len(await WindowStore(store, max_messages=3).read(conv)) == 3

    await store.write(conv, [Message.system(SECRET)])
    with pytest.raises(WindowTooSmall):
        await WindowStore(store, max_messages=3).read(conv)


async def test_leading_messages_are_a_turn(store: histstore.Store) -> None:
    conv = new_id()
    history = [Message.assistant("hello"), Message.assistant("how can I help?"), *chat_turns(2)]
    await store.write(conv, history)
    assert await WindowStore(store, max_messages=6).read(conv) == history
    assert await WindowStore(store, max_messages=5).read(conv) == history[2:]


async def test_tool_calls_stay_with_their_results(store: histstore.Store) -> None:
    conv = new_id()
    tool_turn = [
        Message.user("weather?"),
        Message.assistant(None, tool_calls=[call("a"), call("b")]),
        Message.tool("sun", tool_call_id="a"),
        Message.tool("rain", tool_call_id="b"),
        Message.assistant("mixed"),
    ]
    anthropic_turn = [
        Message.user("search"),
        Message.assistant([{"type": "tool_use", "id": "t1", "name": "s", "input": {}}]),
        Message.user([{"type": "tool_result", "tool_use_id": "t1", "content": "x"}]),
        Message.assistant("found"),
    ]
    await store.write(conv, [*chat_turns(1), *tool_turn, *anthropic_turn])
    for limit in range(4, 12):
        window = await WindowStore(store, max_messages=limit).read(conv)
        assert window[0].role == "user"
        assert window[0].content in ("q0", "weather?", "search")
        validate_pairing(window)
    assert await WindowStore(store, max_messages=8).read(conv) == anthropic_turn
    assert await WindowStore(store, max_messages=9).read(conv) == [*tool_turn, *anthropic_turn]


async def test_pass_through(store: histstore.Store) -> None:
    conv = new_id()
    w = WindowStore(store, max_messages=2)
    assert not await w.exists(conv)
    assert await w.count(conv) == 0
    outcome = await w.write(conv, chat_turns(3))
    assert (outcome.accepted, outcome.length) == (6, 6)
    outcome = await w.write(conv, [Message.user("q3")], at=6, idempotency_key="k")
    assert outcome.accepted == 1
    assert await store.read(conv) == [*chat_turns(3), Message.user("q3")]
    assert await w.exists(conv)
    assert await w.count(conv) == 7  # the whole conversation, not the window
    popped = await w.pop(conv)
    assert popped == Message.user("q3")
    assert await store.count(conv) == 6
    await w.clear(conv)
    assert not await store.exists(conv)
    assert await w.read(conv) == []
    assert await w.pop(conv) is None


async def test_window_reads_only_what_it_returns(store: histstore.Store) -> None:
    conv = new_id()
    history = [Message.system("sys"), *chat_turns(1500)]
    history.insert(1000, Message.system("mid"))
    await store.write(conv, history)
    assert await store.count(conv) == 3002

    spy = SpyStore(store)
    window = await WindowStore(spy, max_messages=21).read(conv)  # type: ignore[arg-type]
    assert window == [Message.system("sys\n\nmid"), *chat_turns(1500)[-20:]]
    assert spy.fetched <= len(window) + 1

    spy = SpyStore(store)
    w = WindowStore(spy, max_tokens=500, count_tokens=lambda m: 10)  # type: ignore[arg-type]
    window = await w.read(conv)
    assert len(window) == 49  # the system message and 24 turns
    page = 64  # at most one page beyond the window, and never the whole history
    assert spy.fetched <= len(window) + page
    assert all(r.get("limit") is not None for r in spy.reads)


# --------------------------------------------------------------------------- properties


class ListStore:
    """An in-memory stand-in for Store's read side, for fast property tests."""

    count_tokens = None

    def __init__(self, messages: list[Message]) -> None:
        self.messages = [stored_message(m.to_json(), i, None) for i, m in enumerate(messages)]
        self.fetched = 0

    async def read(
        self,
        conversation: str,
        *,
        limit: int | None = None,
        start: int = 0,
        stop: int | None = None,
    ) -> list[Message]:
        rows = self.messages[start:stop]
        if limit is not None:
            rows = rows[max(0, len(rows) - limit) :] if limit else []
        self.fetched += len(rows)
        return list(rows)

    async def system_messages(self, conversation: str) -> list[Message]:
        return [m for m in self.messages if m.role == "system"]


def expected_window(
    history: list[Message],
    max_messages: int | None,
    max_tokens: int | None,
    count: Callable[[Message], int],
) -> list[Message] | None:
    """The window by its definition (``None``: too small), from ``split_turns``."""

    def fits(n: int, t: int) -> bool:
        return (max_messages is None or n <= max_messages) and (
            max_tokens is None or t <= max_tokens
        )

    systems = [m.content for m in history if m.role == "system"]
    head = [Message.system("\n\n".join(systems))] if systems else []
    n, t = len(head), sum(count(m) for m in head)
    if not fits(n, t):
        return None
    chosen: list[list[Message]] = []
    for turn in reversed(split_turns(history)):
        n, t = n + len(turn), t + sum(count(m) for m in turn)
        if not fits(n, t):
            if not chosen:
                return None
            break
        chosen.insert(0, turn)
    return head + [m for turn in chosen for m in turn]


@st.composite
def tool_histories(draw: st.DrawFn) -> list[Message]:
    """Chat Completions histories with tool calls, reasoning-free, systems anywhere."""
    out: list[Message] = []
    ids = 0
    if draw(st.booleans()):
        out.append(Message.assistant("hello"))
    for t in range(draw(st.integers(0, 8))):
        out.append(Message.user(f"q{t}" * draw(st.integers(1, 4))))
        for _ in range(draw(st.integers(0, 2))):
            names = [f"c{ids + k}" for k in range(draw(st.integers(1, 3)))]
            ids += len(names)
            out.append(Message.assistant(None, tool_calls=[call(c) for c in names]))
            out.extend(Message.tool("r" * draw(st.integers(0, 5)), tool_call_id=c) for c in names)
        if draw(st.booleans()):
            out.append(Message.assistant("a" * draw(st.integers(0, 9))))
    for _ in range(draw(st.integers(0, 2))):
        out.insert(draw(st.integers(0, len(out))), Message.system(f"s{len(out)}"))
    return out


@given(
    tool_histories(),
    st.one_of(st.none(), st.integers(1, 30)),
    st.one_of(st.none(), st.integers(1, 120)),
)
async def test_window_is_the_longest_fitting_suffix_of_whole_turns(
    history: list[Message], max_messages: int | None, max_tokens: int | None
) -> None:
    if max_messages is None and max_tokens is None:
        max_messages = 6
    backend = ListStore(history)
    w = WindowStore(
        backend,  # type: ignore[arg-type]
        max_messages=max_messages,
        max_tokens=max_tokens,
        count_tokens=by_content_length,
    )
    expected = expected_window(history, max_messages, max_tokens, by_content_length)
    if expected is None:
        with pytest.raises(WindowTooSmall):
            await w.read("c")
        return
    window = await w.read("c")
    assert window == expected
    validate_pairing(window)
    body = [m for m in window if m.role != "system"]
    turns = split_turns(history)
    kept = split_turns(body)
    assert kept == turns[len(turns) - len(kept) :]
    if max_messages is not None:
        assert len(window) <= max_messages
        # Read: no more than the limit and one message, besides system messages met on
        # the way; and with only this limit, nothing older than the turn that did not fit.
        systems = sum(m.role == "system" for m in history)
        assert backend.fetched <= max_messages + 1 + systems
        if max_tokens is None:
            overflow = turns[-len(kept) - 1] if len(kept) < len(turns) else []
            assert backend.fetched <= len(body) + len(overflow) + systems
    if max_tokens is not None:
        assert sum(by_content_length(m) for m in window) <= max_tokens
