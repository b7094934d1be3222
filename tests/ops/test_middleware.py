"""with_history: replay, call, store as one batch at the length read; CommitError and retry."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

import histstore
from histstore import (
    CommitError,
    ConflictError,
    InvalidMessage,
    Message,
    WindowStore,
    WriteError,
    WriteOutcome,
    with_history,
)


class Recorder:
    """A fake model that records what it was sent and answers with a numbered reply."""

    def __init__(self) -> None:
        self.calls: list[list[Message]] = []

    async def __call__(self, messages: list[Message]) -> Message:
        self.calls.append(list(messages))
        return Message.assistant(f"answer {len(self.calls)}")


async def test_call_replays_history_and_stores_the_exchange(
    store: histstore.Store, cid: str
) -> None:
    model = Recorder()
    chat = with_history(store, model)
    first = await chat(cid, [Message.user("one")])
    assert first == [Message.assistant("answer 1")]
    second = await chat(cid, [{"role": "user", "content": "two"}])
    assert second == [Message.assistant("answer 2")]
    assert model.calls[0] == [Message.user("one")]
    assert model.calls[1] == [
        Message.user("one"),
        Message.assistant("answer 1"),
        Message.user("two"),
    ]
    stored = await store.read(cid)
    assert [m.position for m in stored] == [0, 1, 2, 3]
    assert stored == model.calls[1] + second


async def test_model_may_return_a_list_or_dicts(store: histstore.Store, cid: str) -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}

    async def model(messages: list[Message]) -> list[Any]:
        return [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            Message.tool("42", tool_call_id="c1"),
        ]

    reply = await with_history(store, model)(cid, [Message.user("go")])
    assert [m.role for m in reply] == ["assistant", "tool"]
    assert await store.count(cid) == 3


async def test_bad_input_calls_nothing_and_writes_nothing(store: histstore.Store, cid: str) -> None:
    model = Recorder()
    chat = with_history(store, model)
    with pytest.raises(InvalidMessage):
        await chat(cid, [{"content": "no role"}])
    with pytest.raises(InvalidMessage):
        await chat(cid, "a string is not a list of messages")  # type: ignore[arg-type]
    assert model.calls == []

    async def bad_model(messages: list[Message]) -> Any:
        return {"role": "assistant", "content": float("nan")}

    with pytest.raises(InvalidMessage):
        await with_history(store, bad_model)(cid, [Message.user("x")])
    assert not await store.exists(cid)


async def test_a_writer_in_between_gives_commit_error_with_conflict_cause(
    store: histstore.Store, cid: str
) -> None:
    await store.write(cid, [Message.user("start")])

    async def model(messages: list[Message]) -> Message:
        await store.write(cid, [Message.user("sneaked in")])
        return Message.assistant("late answer")

    with pytest.raises(CommitError) as info:
        await with_history(store, model)(cid, [Message.user("question")])
    err = info.value
    assert isinstance(err.__cause__, ConflictError)
    assert err.conversation == cid
    assert err.position == 1
    assert err.messages == [Message.user("question"), Message.assistant("late answer")]
    assert err.outcome == WriteOutcome(0, False, None)
    assert "late answer" not in str(err)
    assert "question" not in str(err)
    # The position is taken: retrying raises ConflictError and writes nothing.
    for _ in range(2):
        with pytest.raises(ConflictError):
            await err.retry(store)
    assert [m.content for m in await store.read(cid)] == ["start", "sneaked in"]


async def test_failed_write_is_retried_safely(
    store: histstore.Store, cid: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_write = store.write
    fail = {"stored": True}

    async def flaky_write(conversation: str, messages: Any, **kw: Any) -> WriteOutcome:
        if fail["stored"]:
            # The batch lands, but the caller only learns that the outcome is unknown.
            await real_write(conversation, messages, **kw)
            fail["stored"] = False
            raise WriteError("lost", outcome=WriteOutcome(0, True, None))
        return await real_write(conversation, messages, **kw)

    monkeypatch.setattr(store, "write", flaky_write)
    with pytest.raises(CommitError) as info:
        await with_history(store, Recorder())(cid, [Message.user("q")])
    err = info.value
    assert isinstance(err.__cause__, WriteError)
    assert err.outcome.uncertain
    monkeypatch.undo()
    for _ in range(3):
        outcome = await err.retry(store)
        assert outcome.accepted == 2
    assert await store.read(cid) == [Message.user("q"), Message.assistant("answer 1")]


async def test_retry_after_a_write_that_never_landed(
    store: histstore.Store, cid: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def failing_write(*args: Any, **kw: Any) -> WriteOutcome:
        raise WriteError("down", outcome=WriteOutcome(0, False, None))

    monkeypatch.setattr(store, "write", failing_write)
    with pytest.raises(CommitError) as info:
        await with_history(store, Recorder())(cid, [Message.user("q")])
    monkeypatch.undo()
    assert (await info.value.retry(store)).length == 2
    assert (await info.value.retry(store)).length == 2
    assert await store.count(cid) == 2


async def test_stream_passes_events_and_stores_messages(store: histstore.Store, cid: str) -> None:
    seen: list[list[Message]] = []

    async def streamer(messages: list[Message]) -> AsyncIterator[Any]:
        seen.append(messages)
        yield {"delta": "Hel"}
        yield {"delta": "lo"}
        yield Message.assistant("Hello")

    chat = with_history(store, streamer=streamer)
    events = [e async for e in chat.stream(cid, [Message.user("hi")])]
    assert events == [{"delta": "Hel"}, {"delta": "lo"}, Message.assistant("Hello")]
    assert await store.read(cid) == [Message.user("hi"), Message.assistant("Hello")]
    with pytest.raises(TypeError):
        await chat(cid, [Message.user("no model")])


async def test_stream_stopped_early_writes_nothing(store: histstore.Store, cid: str) -> None:
    async def streamer(messages: list[Message]) -> AsyncIterator[Any]:
        yield Message.assistant("part one")
        yield Message.assistant("part two")

    gen = with_history(store, streamer=streamer).stream(cid, [Message.user("hi")])
    async for _event in gen:
        break
    await gen.aclose()  # type: ignore[attr-defined]
    assert not await store.exists(cid)


async def test_stream_commit_error_comes_after_the_last_event(
    store: histstore.Store, cid: str
) -> None:
    async def streamer(messages: list[Message]) -> AsyncIterator[Any]:
        yield Message.assistant("first")
        await store.write(cid, [Message.user("interloper")])
        yield Message.assistant("second")

    events: list[Any] = []

    async def consume() -> None:
        async for event in with_history(store, streamer=streamer).stream(cid, [Message.user("q")]):
            events.append(event)

    with pytest.raises(CommitError) as info:
        await consume()
    assert events == [Message.assistant("first"), Message.assistant("second")]
    assert info.value.position == 0
    assert isinstance(info.value.__cause__, ConflictError)


async def test_window_limits_what_the_model_sees(store: histstore.Store, cid: str) -> None:
    await store.write(cid, [Message.system("be brief")])
    for i in range(5):
        await store.write(cid, [Message.user(f"u{i}"), Message.assistant(f"a{i}")])
    model = Recorder()
    window = WindowStore(store, max_messages=5)
    await with_history(store, model, window=window)(cid, [Message.user("now")])
    sent = model.calls[0]
    assert sent[0] == Message.system("be brief")
    assert [m.content for m in sent[1:]] == ["u3", "a3", "u4", "a4", "now"]
    stored = await store.read(cid)
    assert len(stored) == 13
    assert stored[-2:] == [Message.user("now"), Message.assistant("answer 1")]


def test_needs_a_model_or_streamer(store: histstore.Store) -> None:
    with pytest.raises(TypeError):
        with_history(store)
