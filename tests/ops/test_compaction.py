"""Compaction (SPEC 11, "Compaction"): the run planned on plain message lists, ``compact``
on every backend (one change, undone by ``revert``), and ``WindowStore(summaries=...)``."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import histstore
from histstore import (
    ConflictError,
    InvalidId,
    InvalidMessage,
    Message,
    Spliced,
    WindowTooSmall,
    compact,
)
from histstore._core.models import stored_message
from histstore.compaction import DEFAULT_AUTHOR, CompactionPlan, plan_compaction, summary_message
from histstore.turns import _calls, _results, pending_tool_calls, split_turns, validate_pairing
from histstore.window import WindowStore

SECRET = "s3cr3t-content"


def new_id() -> str:
    return f"compact-{uuid.uuid4().hex}"


def as_messages(items: Sequence[Any]) -> list[Message]:
    return [m if isinstance(m, Message) else Message.from_dict(m) for m in items]


def chat_call(call_id: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": "f", "arguments": "{}"}}


def turn(tag: Any) -> list[Message]:
    return [Message.user(f"q{tag}"), Message.assistant(f"a{tag}")]


def turns_of(*tags: Any) -> list[Message]:
    return [m for tag in tags for m in turn(tag)]


def chat_tool_turn(tag: str) -> list[Message]:
    """A Chat Completions turn: two calls in one message, their results, an answer."""
    return [
        Message.user(f"{tag}?"),
        Message.assistant(None, tool_calls=[chat_call(f"{tag}-a"), chat_call(f"{tag}-b")]),
        Message.tool("sun", tool_call_id=f"{tag}-a"),
        Message.tool("rain", tool_call_id=f"{tag}-b"),
        Message.assistant(f"{tag}!"),
    ]


def function_call(call_id: str) -> Message:
    return Message.from_dict(
        {"type": "function_call", "call_id": call_id, "name": "f", "arguments": "{}"}
    )


def function_output(call_id: str) -> Message:
    return Message.from_dict({"type": "function_call_output", "call_id": call_id, "output": "ok"})


def responses_tool_turn(tag: str) -> list[Message]:
    """A Responses API turn: reasoning, a function call, its output, an answer item."""
    return as_messages(
        [
            {"role": "user", "content": f"{tag}?"},
            {"type": "reasoning", "id": f"rs_{tag}", "summary": []},
            function_call(f"{tag}-c"),
            function_output(f"{tag}-c"),
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": f"{tag}!"}],
            },
        ]
    )


def tool_use(call_id: str) -> dict[str, Any]:
    return {"type": "tool_use", "id": call_id, "name": "s", "input": {}}


def tool_result(call_id: str) -> dict[str, Any]:
    return {"type": "tool_result", "tool_use_id": call_id, "content": "x"}


def anthropic_tool_turn(tag: str) -> list[Message]:
    """An Anthropic turn: the tool result comes back in a user message (no new turn)."""
    return [
        Message.user(f"{tag}?"),
        Message.assistant([tool_use(f"{tag}-t")]),
        Message.user([tool_result(f"{tag}-t")]),
        Message.assistant(f"{tag}!"),
    ]


def orphan_results(messages: Sequence[Message]) -> list[Any]:
    """The tool results that answer no earlier call."""
    made: set[Any] = set()
    orphans: list[Any] = []
    for m in messages:
        d = m.to_dict()
        orphans.extend(r for r in _results(d) if r not in made)
        made.update(call_id for call_id, _call in _calls(d))
    return orphans


def applied(messages: Sequence[Message], plan: CompactionPlan, summary: Message) -> list[Message]:
    """What ``compact`` makes of ``messages`` with ``plan``."""
    moved = [messages[i] for i in plan.systems]
    return [*messages[: plan.start], *moved, summary, *messages[plan.stop :]]


class Summarizer:
    """An async summarize function that records what it was given."""

    def __init__(self, reply: Any = "the summary") -> None:
        self.reply = reply
        self.calls: list[list[Message]] = []

    async def __call__(self, messages: list[Message]) -> Any:
        self.calls.append(list(messages))
        return self.reply


async def revision(store: histstore.Store, conversation: str) -> int:
    conv = await store.edit(conversation)
    return int(conv.revision)


# --------------------------------------------------------------------------- planning


def test_plan_nothing_to_compact() -> None:
    assert plan_compaction([]) is None
    assert plan_compaction([Message.system("s")], keep_turns=0) is None
    assert plan_compaction(turns_of(0, 1)) is None  # two turns, two kept
    assert plan_compaction(turns_of(0, 1, 2), keep_turns=3) is None
    assert plan_compaction([Message.system("s"), *turns_of(0)], keep_turns=1) is None


def test_plan_keeps_leading_systems_and_moves_the_others() -> None:
    history = [
        Message.system("rules"),
        *turn(0),
        Message.system("mid"),  # 3: inside the run
        *turn(1),
        Message.system("late"),  # 6: after the run's last turn, stays in place
        *turns_of(2, 3),
    ]
    plan = plan_compaction(history, keep_turns=2)
    assert plan == CompactionPlan(start=1, stop=6, systems=(3,), replaced=(1, 2, 4, 5), turns=2)
    assert plan_compaction(history, keep_turns=3) == CompactionPlan(1, 3, (), (1, 2), 1)
    assert plan_compaction(history, keep_turns=0) == CompactionPlan(
        1, len(history), (3, 6), (1, 2, 4, 5, 7, 8, 9, 10), 4
    )


def test_plan_counts_what_precedes_the_first_user_message_as_a_turn() -> None:
    history = [Message.system("s"), Message.assistant("hello"), *turns_of(0, 1)]
    assert plan_compaction(history, keep_turns=2) == CompactionPlan(1, 2, (), (1,), 1)
    assert plan_compaction(history, keep_turns=1) == CompactionPlan(1, 4, (), (1, 2, 3), 2)


def test_plan_takes_whole_tool_turns_of_every_shape() -> None:
    history = [
        *chat_tool_turn("c"),
        *responses_tool_turn("r"),
        *anthropic_tool_turn("a"),
        *turn(9),
    ]
    for keep, stop in [(3, 5), (2, 10), (1, 14), (0, 16)]:
        plan = plan_compaction(history, keep_turns=keep)
        assert plan is not None
        assert (plan.start, plan.stop) == (0, stop)
        assert plan.replaced == tuple(range(stop))
        validate_pairing(history[stop:])  # what stays keeps every call with its result


def test_plan_keeps_a_newest_turn_that_waits_for_a_tool_result() -> None:
    waiting = [
        *turns_of(0, 1),
        Message.user("q2"),
        Message.assistant(None, tool_calls=[chat_call("c")]),
    ]
    assert plan_compaction(waiting, keep_turns=0) == CompactionPlan(0, 4, (), (0, 1, 2, 3), 2)
    responses = [*turns_of(0), Message.user("q1"), function_call("f")]
    assert plan_compaction(responses, keep_turns=0) == CompactionPlan(0, 2, (), (0, 1), 1)
    answered = [*waiting, Message.tool("r", tool_call_id="c")]
    plan = plan_compaction(answered, keep_turns=0)
    assert plan is not None
    assert plan.stop == len(answered)
    # An older turn whose call never got its result is compacted like any other.
    interrupted = [Message.user("q0"), Message.assistant(None, tool_calls=[chat_call("x")])]
    assert plan_compaction([*interrupted, *turn(1)], keep_turns=1) == CompactionPlan(
        0, 2, (), (0, 1), 1
    )


def test_plan_never_separates_a_call_from_a_result_in_a_later_turn() -> None:
    # A stored history may answer a call after the next user message; the run then ends
    # before the call's turn or takes the result's turn too.
    history = [
        Message.user("q0"),
        Message.assistant(None, tool_calls=[chat_call("late")]),
        Message.user("q1"),
        Message.tool("r", tool_call_id="late"),
        Message.assistant("a1"),
        *turns_of(2, 3),
    ]
    assert plan_compaction(history, keep_turns=3) is None
    assert plan_compaction(history, keep_turns=2) == CompactionPlan(0, 5, (), (0, 1, 2, 3, 4), 2)
    anthropic = [
        Message.user("q0"),
        Message.assistant([tool_use("t")]),
        *turn(1),
        Message.user([tool_result("t")]),
        *turns_of(2, 3),
    ]
    assert plan_compaction(anthropic, keep_turns=2) == CompactionPlan(0, 5, (), (0, 1, 2, 3, 4), 2)
    assert plan_compaction(anthropic, keep_turns=3) is None


def adk(role: str, **part: Any) -> dict[str, Any]:
    """An ADK event as the ADK adapter stores it (one part)."""
    content = {"role": "model" if role == "assistant" else "user", "parts": [part]}
    return {"role": role, "type": "adk_event", "event": {"author": "a", "content": content}}


def pydantic(role: str, kind: str, **part: Any) -> dict[str, Any]:
    """A Pydantic AI message as its adapter stores it (one part)."""
    message = {"kind": kind, "parts": [part]}
    return {"role": role, "type": "pydantic_ai", "message": message}


def test_plan_pairs_framework_envelopes_by_their_ids() -> None:
    # The adapters' envelopes are turns by their role; a call answered after the next
    # user message keeps both turns together, as for every other shape.
    adk_history = [
        adk("user", text="q0"),
        adk("assistant", function_call={"id": "late", "name": "f", "args": {}}),
        adk("user", text="q1"),
        adk("tool", function_response={"id": "late", "name": "f", "response": {}}),
        adk("assistant", text="a1"),
        *turns_of(2, 3),
    ]
    pyd_history = [
        pydantic("user", "request", part_kind="user-prompt", content="q0"),
        pydantic(
            "assistant", "response", part_kind="tool-call", tool_name="f", tool_call_id="late"
        ),
        pydantic("user", "request", part_kind="user-prompt", content="q1"),
        pydantic("tool", "request", part_kind="tool-return", tool_name="f", tool_call_id="late"),
        pydantic("assistant", "response", part_kind="text", content="a1"),
        *turns_of(2, 3),
    ]
    for history in (adk_history, pyd_history):
        assert plan_compaction(history, keep_turns=3) is None
        assert plan_compaction(history, keep_turns=2) == CompactionPlan(
            0, 5, (), (0, 1, 2, 3, 4), 2
        )
        # With keep_turns=0 a newest turn whose call waits for its result stays.
        waiting = [*history[5:], history[0], history[1]]
        assert plan_compaction(waiting, keep_turns=0) == CompactionPlan(0, 4, (), (0, 1, 2, 3), 2)
    with pytest.raises(InvalidMessage):
        summary_message(adk_history[1])


@pytest.mark.parametrize(
    ("keep_turns", "error"),
    [
        pytest.param(-1, ValueError, id="negative"),
        pytest.param(1.0, TypeError, id="float"),
        pytest.param("2", TypeError, id="str"),
        pytest.param(True, TypeError, id="bool"),
        pytest.param(None, TypeError, id="none"),
    ],
)
def test_plan_validates_keep_turns(keep_turns: Any, error: type[Exception]) -> None:
    with pytest.raises(error):
        plan_compaction(turns_of(0, 1, 2), keep_turns=keep_turns)


def test_plan_takes_message_dicts_only() -> None:
    assert plan_compaction([m.to_dict() for m in turns_of(0, 1, 2)]) == CompactionPlan(
        0, 2, (), (0, 1), 1
    )
    with pytest.raises(InvalidMessage):
        plan_compaction(["not a message"])  # type: ignore[list-item]


def test_summary_message() -> None:
    assert summary_message("so far") == Message.user("so far")
    given_message = Message.assistant("recap", name="notes")
    assert summary_message(given_message) is given_message
    assert summary_message({"role": "developer", "content": "x"}) == Message("developer", "x")
    bad: list[Any] = [
        42,
        None,
        "",
        "  \n",
        b"bytes",
        {"content": "no role"},
        Message.assistant(None, tool_calls=[chat_call("c")]),
        Message.tool(SECRET, tool_call_id="c"),
        Message.user([tool_result("t")]),
        function_call("f"),
    ]
    for value in bad:
        with pytest.raises(InvalidMessage) as info:
            summary_message(value)
        assert SECRET not in str(info.value)


# --------------------------------------------------------------------------- property: plan


@st.composite
def histories(draw: st.DrawFn, *, late_results: bool = False) -> list[Message]:
    """Histories of every tool shape, systems anywhere, maybe a call still waiting at the
    end; with ``late_results``, some results come back in a later turn."""
    out: list[Message] = []
    made = 0
    late: list[str] = []
    if draw(st.booleans()):
        out.append(Message.assistant("hello"))
    for t in range(draw(st.integers(0, 7))):
        out.append(Message.user(f"q{t}"))
        for call_id in late:
            out.append(Message.tool("late", tool_call_id=call_id))
        late = []
        for _ in range(draw(st.integers(0, 2))):
            names = [f"c{made + k}" for k in range(draw(st.integers(1, 2)))]
            made += len(names)
            shape = draw(st.sampled_from(["chat", "responses", "anthropic"]))
            if shape == "chat":
                out.append(Message.assistant(None, tool_calls=[chat_call(c) for c in names]))
                if late_results and draw(st.booleans()):
                    late = names
                else:
                    out.extend(Message.tool("r", tool_call_id=c) for c in names)
            elif shape == "responses":
                out.extend(function_call(c) for c in names)
                out.extend(function_output(c) for c in names)
            else:
                out.append(Message.assistant([tool_use(c) for c in names]))
                out.append(Message.user([tool_result(c) for c in names]))
        if draw(st.booleans()):
            out.append(Message.assistant(f"a{t}"))
    if out and not late and draw(st.booleans()):
        out.append(Message.assistant(None, tool_calls=[chat_call("waiting")]))
    for _ in range(draw(st.integers(0, 3))):
        out.insert(draw(st.integers(0, len(out))), Message.system(f"s{len(out)}"))
    return out


SUMMARY = Message.user("the summary")


@settings(max_examples=300, deadline=None)
@given(histories(), st.integers(0, 4))
def test_plan_on_any_history(history: list[Message], keep: int) -> None:
    plan = plan_compaction(history, keep_turns=keep)
    turns = split_turns(history)
    waiting = keep == 0 and bool(pending_tool_calls(history))
    compactable = len(turns) - keep - (1 if waiting else 0)
    if compactable <= 0:
        assert plan is None
        return
    assert plan is not None
    assert plan.turns == compactable  # the longest run
    assert [history[i] for i in plan.replaced] == [m for t in turns[:compactable] for m in t]
    result = applied(history, plan, SUMMARY)
    systems = [m for m in history if m.role == "system"]
    assert [m for m in result if m.role == "system"] == systems
    assert split_turns(result) == [[SUMMARY], *turns[compactable:]]
    assert orphan_results(result) == []
    assert pending_tool_calls(result) == pending_tool_calls(history)


@settings(max_examples=300, deadline=None)
@given(histories(late_results=True), st.integers(0, 4))
def test_plan_never_orphans_a_late_result(history: list[Message], keep: int) -> None:
    plan = plan_compaction(history, keep_turns=keep)
    if plan is None:
        return
    result = applied(history, plan, SUMMARY)
    assert orphan_results(result) == []
    assert [m for m in result if m.role == "system"] == [m for m in history if m.role == "system"]
    kept = split_turns(history)[plan.turns :]
    assert split_turns(result) == [[SUMMARY], *kept]
    assert len(kept) >= keep


# --------------------------------------------------------------------------- compact


async def test_compact_replaces_the_older_turns(store: histstore.Store) -> None:
    c = new_id()
    history = [
        Message.system("rules"),
        *turn(0),
        *chat_tool_turn("t1"),
        Message.system("mid"),
        *responses_tool_turn("t2"),
        *anthropic_tool_turn("t3"),
        *chat_tool_turn("t4"),
        *responses_tool_turn("t5"),
    ]
    await store.write(c, history)
    before = await store.read(c)
    ids = {m.position: m.entry_id for m in before}
    summarize = Summarizer()

    spliced = await compact(store, c, summarize)

    replaced = [
        *turn(0),
        *chat_tool_turn("t1"),
        *responses_tool_turn("t2"),
        *anthropic_tool_turn("t3"),
    ]
    assert summarize.calls == [replaced]
    after = await store.read(c)
    summary = Message.user("the summary")
    assert after == [
        Message.system("rules"),
        Message.system("mid"),
        summary,
        *chat_tool_turn("t4"),
        *responses_tool_turn("t5"),
    ]
    validate_pairing(after)
    assert [m.position for m in after] == list(range(len(after)))
    mid = history.index(Message.system("mid"))
    assert (after[0].entry_id, after[1].entry_id) == (ids[0], ids[mid])
    assert [m.author for m in after] == [None, None, DEFAULT_AUTHOR] + [None] * 10
    assert isinstance(spliced, Spliced)
    assert spliced.kept == [ids[mid]]
    assert spliced.added == [after[2].entry_id]
    first_kept = len(history) - 10  # turns t4 and t5
    assert sorted(spliced.removed) == [ids[p] for p in range(1, first_kept) if p != mid]
    assert spliced.restored == []
    assert [m.entry_id for m in after[3:]] == [ids[p] for p in range(first_kept, len(history))]


async def test_compact_is_one_change_that_revert_undoes(store: histstore.Store) -> None:
    c = new_id()
    await store.write(c, [Message.system("s"), *turns_of(0, 1), Message.system("t")])
    await store.write(c, [*chat_tool_turn("x"), *turns_of(2, 3)])
    original = await store.read(c)
    before = await revision(store, c)
    changes_before = await store.changes(c)

    assert await compact(store, c, Summarizer(), by="plugin:compact") is not None

    assert await revision(store, c) == before + 1
    changes = await store.changes(c)
    assert len(changes) == len(changes_before) + 1
    last = changes[-1]
    assert (last.revision, last.kind, last.author) == (before + 1, "splice", "plugin:compact")
    reverted = await store.revert(c, before, by="x")
    assert reverted == before + 2
    restored = await store.read(c)
    assert restored == original
    assert [m.entry_id for m in restored] == [m.entry_id for m in original]
    assert [m.author for m in restored] == [m.author for m in original]


@pytest.mark.parametrize("keep", [0, 1, 2])
async def test_keep_turns(store: histstore.Store, keep: int) -> None:
    c = new_id()
    await store.write(c, [Message.system("s"), *turns_of(0, 1, 2, 3)])
    summarize = Summarizer()
    assert await compact(store, c, summarize, keep_turns=keep) is not None
    kept = [] if keep == 0 else turns_of(0, 1, 2, 3)[-2 * keep :]
    assert summarize.calls == [turns_of(0, 1, 2, 3)[: 8 - 2 * keep]]
    assert await store.read(c) == [Message.system("s"), Message.user("the summary"), *kept]


async def test_keep_zero_leaves_a_turn_waiting_for_a_tool_result(store: histstore.Store) -> None:
    c = new_id()
    waiting = [Message.user("q2"), Message.assistant(None, tool_calls=[chat_call("c")])]
    await store.write(c, [*turns_of(0, 1), *waiting])
    first = Summarizer("first")
    assert await compact(store, c, first, keep_turns=0) is not None
    assert first.calls == [turns_of(0, 1)]
    assert await store.read(c) == [Message.user("first"), *waiting]

    answer = [Message.tool("r", tool_call_id="c"), Message.assistant("done")]
    await store.write(c, answer)
    second = Summarizer("second")
    assert await compact(store, c, second, keep_turns=0) is not None
    assert second.calls == [[Message.user("first"), *waiting, *answer]]
    assert await store.read(c) == [Message.user("second")]


async def test_summary_message_is_stored_as_given(store: histstore.Store) -> None:
    c = new_id()
    await store.write(c, turns_of(0, 1, 2))
    recap = Message.assistant("recap", name="notes")
    await compact(store, c, Summarizer(recap), by="plugin:recap", keep_turns=1)
    stored = await store.read(c)
    assert stored == [recap, *turns_of(2)]
    assert stored[0].to_dict() == recap.to_dict()
    assert stored[0].author == "plugin:recap"

    d = new_id()
    await store.write(d, turns_of(0, 1, 2))
    await compact(store, d, Summarizer({"role": "user", "content": "as a dict"}))
    assert await store.read(d) == [Message.user("as a dict"), *turns_of(1, 2)]


async def test_a_plain_function_summarizes_too(store: histstore.Store) -> None:
    c = new_id()
    await store.write(c, turns_of(0, 1, 2))
    assert await compact(store, c, lambda messages: f"{len(messages)} messages") is not None
    assert await store.read(c) == [Message.user("2 messages"), *turns_of(1, 2)]


async def test_nothing_to_compact(store: histstore.Store) -> None:
    summarize = Summarizer()
    unknown = new_id()
    assert await compact(store, unknown, summarize) is None
    assert not await store.exists(unknown)

    c = new_id()
    await store.write(c, [Message.system("s"), *turns_of(0, 1)])
    before, changes = await revision(store, c), await store.changes(c)
    assert await compact(store, c, summarize) is None
    assert await compact(store, c, summarize, keep_turns=5) is None
    systems = new_id()
    await store.write(systems, [Message.system("only")])
    assert await compact(store, systems, summarize, keep_turns=0) is None
    assert summarize.calls == []
    assert await revision(store, c) == before
    assert await store.changes(c) == changes
    assert await store.read(c) == [Message.system("s"), *turns_of(0, 1)]


async def test_compacting_with_nothing_new_changes_nothing(store: histstore.Store) -> None:
    """Compacting again when the only run old enough is its own previous summary asks
    for no summary and records no change; anything new makes it compact again."""
    c = new_id()
    await store.write(c, [Message.system("s"), *turns_of(0, 1, 2)])
    assert await compact(store, c, Summarizer("first"), keep_turns=2) is not None
    before, changes = await revision(store, c), await store.changes(c)
    again = Summarizer("second")
    assert await compact(store, c, again, keep_turns=2) is None
    assert again.calls == []
    assert await revision(store, c) == before
    assert await store.changes(c) == changes
    # Another author's summary is not this one's: it is compacted as any message.
    assert await compact(store, c, again, keep_turns=2, by="other") is not None
    assert again.calls == [[Message.user("first")]]
    # One new turn makes the run the summary and the turn it pushed out of the window.
    await store.write(c, turns_of(3))
    third = Summarizer("third")
    assert await compact(store, c, third, keep_turns=2) is not None
    assert third.calls == [[Message.user("second"), *turns_of(1)]]


async def test_bad_arguments_write_nothing(store: histstore.Store) -> None:
    c = new_id()
    await store.write(c, turns_of(0, 1, 2, 3))
    original, before = await store.read(c), await revision(store, c)
    summarize = Summarizer()

    with pytest.raises(ValueError, match="keep_turns"):
        await compact(store, c, summarize, keep_turns=-1)
    for keep in ("2", 2.5, True, None):
        with pytest.raises(TypeError, match="keep_turns"):
            await compact(store, c, summarize, keep_turns=keep)  # type: ignore[arg-type]
    for by in ("", 3, None):
        with pytest.raises(InvalidMessage):
            await compact(store, c, summarize, by=by)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="summarize"):
        await compact(store, c, "not a function")  # type: ignore[arg-type]
    with pytest.raises(InvalidId):
        await compact(store, " bad ", summarize)
    assert summarize.calls == []

    replies: list[Any] = [
        42,
        None,
        "",
        {"content": "no role"},
        Message.assistant(SECRET, tool_calls=[chat_call("c")]),
        Message.tool(SECRET, tool_call_id="c"),
    ]
    for reply in replies:
        with pytest.raises(InvalidMessage) as info:
            await compact(store, c, Summarizer(reply))
        assert SECRET not in str(info.value)

    async def fails(messages: list[Message]) -> str:
        raise RuntimeError("model down")

    with pytest.raises(RuntimeError, match="model down"):
        await compact(store, c, fails)
    assert await store.read(c) == original
    assert await revision(store, c) == before


async def test_a_writer_in_between_is_a_conflict(store: histstore.Store) -> None:
    c = new_id()
    await store.write(c, turns_of(0, 1, 2))
    before = await revision(store, c)

    async def summarize_while_others_write(messages: list[Message]) -> str:
        await store.write(c, [Message.user("meanwhile")])
        return "late summary"

    with pytest.raises(ConflictError):
        await compact(store, c, summarize_while_others_write)
    assert await store.read(c) == [*turns_of(0, 1, 2), Message.user("meanwhile")]
    assert await revision(store, c) == before + 1
    # Retrying works on the new history.
    assert await compact(store, c, Summarizer()) is not None
    assert await store.read(c) == [
        Message.user("the summary"),
        *turns_of(2),
        Message.user("meanwhile"),
    ]


async def test_compacting_again_folds_the_first_summary(store: histstore.Store) -> None:
    c = new_id()
    await store.write(c, [Message.system("s"), *turns_of(0, 1, 2, 3)])
    await compact(store, c, Summarizer("first"))
    await store.write(c, turns_of(4, 5))
    second = Summarizer("second")
    await compact(store, c, second)
    assert second.calls == [[Message.user("first"), *turns_of(2, 3)]]
    after = await store.read(c)
    assert after == [Message.system("s"), Message.user("second"), *turns_of(4, 5)]
    assert [m.author for m in after].count(DEFAULT_AUTHOR) == 1
    newest = await store.newest_by(c, DEFAULT_AUTHOR)
    assert newest == Message.user("second")
    assert newest is not None
    assert newest.entry_id == after[1].entry_id


@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(history=histories(), keep=st.integers(0, 3))
async def test_compact_any_history(
    store: histstore.Store, history: list[Message], keep: int
) -> None:
    c = new_id()
    if history:
        await store.write(c, history)
    original = await store.read(c)
    before = await revision(store, c)
    summarize = Summarizer()
    spliced = await compact(store, c, summarize, keep_turns=keep)
    after = await store.read(c)
    plan = plan_compaction(original, keep_turns=keep)
    if plan is None:
        assert spliced is None
        assert after == original
        assert summarize.calls == []
        assert await revision(store, c) == before
        return
    assert summarize.calls == [[original[i] for i in plan.replaced]]
    assert after == applied(original, plan, Message.user("the summary"))
    assert [m for m in after if m.role == "system"] == [m for m in history if m.role == "system"]
    assert orphan_results(after) == []
    assert pending_tool_calls(after) == pending_tool_calls(history)
    turns = split_turns(history)
    assert split_turns(after) == [[Message.user("the summary")], *turns[plan.turns :]]
    assert len(turns) - plan.turns >= keep
    assert await revision(store, c) == before + 1
    await store.revert(c, before, by="test")
    restored = await store.read(c)
    assert restored == original
    assert [m.entry_id for m in restored] == [m.entry_id for m in original]


# --------------------------------------------------------------------------- windows


def by_content_length(m: Message) -> int:
    return len(str(m.content))


async def compacted(store: histstore.Store, **kwargs: Any) -> str:
    """A conversation: a system message, a summary, then turns 4 to 8."""
    c = new_id()
    await store.write(c, [Message.system("sys"), *turns_of(0, 1, 2, 3, 4, 5)])
    await compact(store, c, Summarizer("S"), **kwargs)
    await store.write(c, turns_of(6, 7, 8))
    assert await store.read(c) == [
        Message.system("sys"),
        Message.user("S"),
        *turns_of(4, 5, 6, 7, 8),
    ]
    return c


async def test_window_keeps_the_newest_summary(store: histstore.Store) -> None:
    c = await compacted(store)
    summary = Message.user("S")

    def window(n: int) -> WindowStore:
        return WindowStore(store, max_messages=n, summaries=True)

    assert await window(6).read(c) == [Message.system("sys"), summary, *turns_of(7, 8)]
    assert await window(7).read(c) == [Message.system("sys"), summary, *turns_of(7, 8)]
    assert await window(11).read(c) == [Message.system("sys"), summary, *turns_of(5, 6, 7, 8)]
    # When the turns reach back to the summary, it stands once, in its place.
    whole = [Message.system("sys"), summary, *turns_of(4, 5, 6, 7, 8)]
    for n in (12, 13, 100):
        got = await window(n).read(c)
        assert got == whole
        assert got[1].position == 1
    # Without summaries the window is the plain one.
    assert await WindowStore(store, max_messages=6).read(c) == [
        Message.system("sys"),
        *turns_of(7, 8),
    ]


async def test_window_summary_counts_tokens(store: histstore.Store) -> None:
    c = await compacted(store)
    # Tokens (content length): system 3, summary 1, each turn 2 + 2.
    w = WindowStore(store, max_tokens=3 + 1 + 8, count_tokens=by_content_length, summaries=True)
    assert await w.read(c) == [Message.system("sys"), Message.user("S"), *turns_of(7, 8)]
    w = WindowStore(store, max_tokens=3 + 1 + 7, count_tokens=by_content_length, summaries=True)
    assert await w.read(c) == [Message.system("sys"), Message.user("S"), *turns_of(8)]


async def test_window_too_small_for_system_summary_and_newest_turn(store: histstore.Store) -> None:
    c = await compacted(store)
    for n in (1, 2, 3):
        with pytest.raises(WindowTooSmall) as info:
            await WindowStore(store, max_messages=n, summaries=True).read(c)
        assert c in str(info.value)
    assert len(await WindowStore(store, max_messages=4, summaries=True).read(c)) == 4
    with pytest.raises(WindowTooSmall):
        await WindowStore(
            store, max_tokens=3 + 1 + 3, count_tokens=by_content_length, summaries=True
        ).read(c)
    with pytest.raises(WindowTooSmall):
        await WindowStore(store, max_tokens=3, count_tokens=by_content_length, summaries=True).read(
            c
        )

    d = new_id()  # no system message: the summary and the newest turn must fit
    await store.write(d, turns_of(0, 1, 2))
    await compact(store, d, Summarizer(SECRET))
    with pytest.raises(WindowTooSmall) as info:
        await WindowStore(store, max_messages=2, summaries=True).read(d)
    assert SECRET not in str(info.value)
    assert await WindowStore(store, max_messages=3, summaries=True).read(d) == [
        Message.user(SECRET),
        *turns_of(2),
    ]


async def test_window_summaries_of_a_custom_author(store: histstore.Store) -> None:
    c = await compacted(store, by="plugin:recap")
    custom = WindowStore(store, max_messages=6, summaries="plugin:recap")
    assert custom.summaries == "plugin:recap"
    assert await custom.read(c) == [Message.system("sys"), Message.user("S"), *turns_of(7, 8)]
    default = WindowStore(store, max_messages=6, summaries=True)
    assert default.summaries == DEFAULT_AUTHOR
    # No entry of the default author: the plain window.
    assert await default.read(c) == [Message.system("sys"), *turns_of(7, 8)]
    plain = new_id()
    await store.write(plain, turns_of(0, 1))
    assert await default.read(plain) == turns_of(0, 1)
    assert await default.read(new_id()) == []


async def test_window_summaries_argument(store: histstore.Store) -> None:
    assert WindowStore(store, max_messages=3).summaries is None
    assert WindowStore(store, max_messages=3, summaries=False).summaries is None
    assert "summaries" in repr(WindowStore(store, max_messages=3, summaries=True))
    for bad in (1, 0, ["a"]):
        with pytest.raises(TypeError):
            WindowStore(store, max_messages=3, summaries=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="summaries"):
        WindowStore(store, max_messages=3, summaries="")


class SpyStore:
    """Forwards to a store and counts the messages its reads return."""

    def __init__(self, store: histstore.Store) -> None:
        self.store = store
        self.count_tokens = store.count_tokens
        self.fetched = 0

    async def read(self, conversation: str, **kwargs: Any) -> list[Message]:
        page: list[Message] = await self.store.read(conversation, **kwargs)
        self.fetched += len(page)
        return page

    async def system_messages(self, conversation: str) -> list[Message]:
        result: list[Message] = await self.store.system_messages(conversation)
        return result

    async def newest_by(self, conversation: str, author: str) -> Message | None:
        result: Message | None = await self.store.newest_by(conversation, author)
        return result


async def test_window_with_summaries_reads_only_the_window(store: histstore.Store) -> None:
    c = new_id()
    await store.write(c, [Message.system("sys"), *turns_of(*range(400))])
    await compact(store, c, Summarizer("S"), keep_turns=300)
    spy = SpyStore(store)
    w = WindowStore(spy, max_messages=22, summaries=True)  # type: ignore[arg-type]
    window = await w.read(c)
    assert window == [Message.system("sys"), Message.user("S"), *turns_of(*range(390, 400))]
    assert spy.fetched <= len(window) + 1


# --------------------------------------------------------------------------- property: windows


class ListStore:
    """An in-memory stand-in for the read side a window uses, with entry authors."""

    count_tokens = None

    def __init__(self, messages: list[Message], authors: list[str | None]) -> None:
        self.messages = [stored_message(m.to_json(), i, None) for i, m in enumerate(messages)]
        self.authors = authors

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
        return list(rows)

    async def system_messages(self, conversation: str) -> list[Message]:
        return [m for m in self.messages if m.role == "system"]

    async def newest_by(self, conversation: str, author: str) -> Message | None:
        found = [m for m, a in zip(self.messages, self.authors, strict=True) if a == author]
        return found[-1] if found else None


def expected_window(
    stored: list[Message], summary: Message | None, max_messages: int | None, max_tokens: int | None
) -> list[Message] | None:
    """The window by its definition (``None``: too small)."""

    def fits(n: int, t: int) -> bool:
        return (max_messages is None or n <= max_messages) and (
            max_tokens is None or t <= max_tokens
        )

    systems = [m.content for m in stored if m.role == "system"]
    head = [Message.system("\n\n".join(systems))] if systems else []
    if summary is not None and summary.role == "system":
        summary = None
    prefix = head + ([summary] if summary is not None else [])
    n, t = len(prefix), sum(by_content_length(m) for m in prefix)
    if not fits(n, t):
        return None
    chosen: list[list[Message]] = []
    for one in reversed(split_turns(stored)):
        rest = [m for m in one if summary is None or m.position != summary.position]
        n, t = n + len(rest), t + sum(by_content_length(m) for m in rest)
        if not fits(n, t):
            if not chosen:
                return None
            break
        chosen.insert(0, one)
    body = [m for one in chosen for m in one]
    inside = summary is not None and any(m.position == summary.position for m in body)
    return [*head, *([] if summary is None or inside else [summary]), *body]


@settings(max_examples=300, deadline=None)
@given(
    histories(),
    st.data(),
    st.one_of(st.none(), st.integers(1, 25)),
    st.one_of(st.none(), st.integers(1, 80)),
)
async def test_window_with_summaries_by_its_definition(
    history: list[Message],
    data: st.DataObject,
    max_messages: int | None,
    max_tokens: int | None,
) -> None:
    if max_messages is None and max_tokens is None:
        max_messages = 6
    authors: list[str | None] = [None] * len(history)
    for i in data.draw(st.lists(st.integers(0, max(0, len(history) - 1)), max_size=3)):
        if history:
            authors[i] = DEFAULT_AUTHOR
    backend = ListStore(history, authors)
    summary = await backend.newest_by("c", DEFAULT_AUTHOR)
    w = WindowStore(
        backend,  # type: ignore[arg-type]
        max_messages=max_messages,
        max_tokens=max_tokens,
        count_tokens=by_content_length,
        summaries=True,
    )
    expected = expected_window(backend.messages, summary, max_messages, max_tokens)
    if expected is None:
        with pytest.raises(WindowTooSmall):
            await w.read("c")
        return
    window = await w.read("c")
    assert window == expected
    assert [m.position for m in window] == [m.position for m in expected]
    if max_messages is not None:
        assert len(window) <= max_messages
    if max_tokens is not None:
        assert sum(by_content_length(m) for m in window) <= max_tokens


async def test_compact_through_a_scoped_view(store: histstore.Store) -> None:
    alice = store.scoped("alice")
    mine, foreign = new_id(), new_id()
    await alice.write(mine, turns_of(0, 1, 2))
    await store.write(foreign, turns_of(0, 1, 2))  # owned by no one: unknown to the view
    summarize = Summarizer()
    assert await compact(alice, foreign, summarize) is None
    assert summarize.calls == []
    assert await store.read(foreign) == turns_of(0, 1, 2)
    assert await compact(alice, mine, summarize) is not None
    assert await store.read(mine) == [Message.user("the summary"), *turns_of(1, 2)]
    w = WindowStore(alice, max_messages=3, summaries=True)
    assert await w.read(mine) == [Message.user("the summary"), *turns_of(2)]
