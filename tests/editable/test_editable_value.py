"""The editable conversation value (SPEC 11, "The value"): edits, ids, asides, halt, turn
records, change records and folds. No database."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from histstore import ConflictError, InvalidMessage, Message
from histstore._editable.changes import Change
from histstore._editable.conversation import Conversation
from histstore._editable.entries import Aside, Entry, Spliced, TurnRecord

SECRET = "s3cr3t-content"
T0 = datetime(2025, 3, 1, 12, 0, tzinfo=timezone.utc)


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def bot(text: str) -> dict[str, Any]:
    return {"role": "assistant", "content": text}


def conv_of(*texts: str) -> Conversation:
    conv = Conversation("c")
    conv.extend(user(t) if i % 2 == 0 else bot(t) for i, t in enumerate(texts))
    return conv


def saved(conv: Conversation, log: list[Change], at: datetime = T0) -> None:
    """What a store's commit does to the value: stamp the outbox, keep it, adopt it."""
    stamped = [c.stamped(conv.revision + i + 1, at) for i, c in enumerate(conv.unsaved)]
    log.extend(stamped)
    conv.mark_saved(stamped)


def texts(conv: Conversation) -> list[Any]:
    return [m.content for m in conv.messages]


def ids(conv: Conversation) -> list[int]:
    return [conv.entry_id(i) for i in range(len(conv.entries))]


# --------------------------------------------------------------------------- entries


def test_entry_validates_and_converts() -> None:
    e = Entry(user("hi"), entry_id=3, author="plugin:x", created_at=T0)
    assert e.message == Message.user("hi")
    assert e.entry_id == 3
    assert e.author == "plugin:x"
    assert e == Entry(Message.user("hi"), entry_id=3, author="plugin:x")  # time not compared
    local = datetime(2025, 3, 1, 13, 0, tzinfo=timezone(timedelta(hours=1)))
    assert Entry(user("x"), created_at=local).created_at == T0
    assert Entry(user("x"), created_at=local).created_at.tzinfo == timezone.utc  # type: ignore[union-attr]
    for bad in (
        {"message": "not a message"},
        {"message": user("x"), "author": ""},
        {"message": user("x"), "author": 5},
        {"message": user("x"), "entry_id": 0},
        {"message": user("x"), "entry_id": True},
        {"message": user("x"), "created_at": datetime(2025, 1, 1)},  # noqa: DTZ001
    ):
        with pytest.raises(InvalidMessage):
            Entry(**bad)
    assert SECRET not in repr(Entry(user(SECRET)))


# --------------------------------------------------------------------------- push, extend


def test_push_and_extend_give_ids_in_creation_order() -> None:
    conv = Conversation("c")
    assert conv.revision == 0
    assert conv.entries == []
    assert conv.unsaved == ()
    assert conv.push(user("a")) == 1
    assert conv.extend([bot("b"), Entry(user("c"), author="plugin:p", entry_id=99)]) == [2, 3]
    assert conv.extend([]) == []
    assert ids(conv) == [1, 2, 3]
    assert [e.author for e in conv.entries] == [None, None, "plugin:p"]
    assert [c.kind for c in conv.unsaved] == ["write", "write"]
    assert conv.index_of(2) == 1
    assert conv.index_of(7) is None
    assert conv.index_of(True) is None
    assert conv.revision == 0  # unsaved edits do not move it
    assert all(e.created_at is None for e in conv.entries)  # no clock in the value


def test_bad_input_raises_and_changes_nothing() -> None:
    conv = conv_of("a", "b")
    conv.add_aside(1, after=1)
    before, outbox = conv.entries, conv.unsaved
    attempts = [
        lambda: conv.push("text"),  # type: ignore[arg-type]
        lambda: conv.extend([user("ok"), 5]),  # type: ignore[list-item]
        lambda: conv.extend(user("single")),  # type: ignore[arg-type]
        lambda: conv.splice(0, 1, [user("x")], by=""),
        lambda: conv.splice(0, 1, [user("x")], by=3),  # type: ignore[arg-type]
        lambda: conv.splice(-1, 1, [user("x")], by="p"),
        lambda: conv.splice(0, -1, [], by="p"),
        lambda: conv.restore(0, 1, [{"content": "no role"}], by="p"),
        lambda: conv.edit_each(lambda e: "not a message", by="p"),  # type: ignore[arg-type,return-value]
        lambda: conv.edit_each(lambda e: None, by=""),
        lambda: conv.set_entries([user("x")], by=None),  # type: ignore[arg-type]
        lambda: conv.normalize(by=""),
        lambda: conv.add_aside(float("nan")),
        lambda: conv.add_aside({1: "int key"}),
        lambda: conv.add_aside((1, 2)),
        lambda: conv.add_aside(object()),
        lambda: conv.add_aside("x", after=42),
        lambda: conv.replace_aside(1, {"bad": float("inf")}),
        lambda: conv.replace_aside(-1, 1),
        lambda: conv.halt(""),
        lambda: conv.end_turn("done"),
        lambda: conv.revert_to("c", by="p"),  # type: ignore[arg-type]
    ]
    for attempt in attempts:
        with pytest.raises(InvalidMessage):
            attempt()
    assert conv.entries == before
    assert conv.unsaved == outbox
    assert conv.asides() == [Aside(1, 1, 1)]


# --------------------------------------------------------------------------- splice


def test_splice_clamps_like_a_slice() -> None:
    conv = conv_of("a", "b", "c")
    assert conv.splice(10, 20, [user("end")], by="p") == Spliced([], [], [4], [])
    assert texts(conv) == ["a", "b", "c", "end"]
    assert conv.splice(2, 1, [user("mid")], by="p").added == [5]  # stop < start: insert
    assert texts(conv) == ["a", "b", "mid", "c", "end"]
    assert conv.splice(3, None, [], by="p").removed == [3, 4]  # None: to the end
    assert texts(conv) == ["a", "b", "mid"]


def test_splice_ids_authors_and_times() -> None:
    conv, log = conv_of("a", "b", "c"), []  # type: list[Change]
    conv.push(Entry(user("d"), author="plugin:note"))
    saved(conv, log)
    e = conv.entries
    got = conv.splice(
        1,
        4,
        [
            Entry(Message.assistant("B"), entry_id=2),  # in the range: keeps 2
            Entry(user("again"), entry_id=2),  # 2 taken already: new id
            Entry(user("x"), entry_id=1),  # 1 outside the range: new id
            e[3],  # keeps 4 and its author
            user("plain"),  # new, by "p"
            Entry(user("named"), author="plugin:q"),
        ],
        by="p",
    )
    assert got == Spliced(removed=[3], kept=[2, 4], added=[5, 6, 7, 8], restored=[])
    assert ids(conv) == [1, 2, 5, 6, 4, 7, 8]
    assert [x.author for x in conv.entries] == [
        None,
        None,
        "p",
        "p",
        "plugin:note",
        "p",
        "plugin:q",
    ]
    times = {x.entry_id: x.created_at for x in conv.entries}
    assert times[2] == T0
    assert times[4] == T0
    assert times[5] is None
    assert len(conv.unsaved) == 1
    assert conv.unsaved[0].kind == "splice"
    assert conv.unsaved[0].author == "p"


def test_an_edit_that_changes_nothing_records_nothing() -> None:
    log: list[Change] = []
    conv = conv_of("a", "b")
    aside = conv.add_aside({"k": [1]})
    saved(conv, log)
    e = conv.entries
    assert conv.splice(0, 2, e, by="p") == Spliced([], [1, 2], [], [])
    assert conv.splice(1, 1, [], by="p") == Spliced([], [], [], [])
    assert conv.restore(0, None, e, by="p").kept == [1, 2]
    assert conv.set_entries(e, by="p") == Spliced([], [], [], [])
    assert conv.edit_each(lambda x: x.message, by="p") == []
    assert conv.edit_each(lambda x: x.message.to_dict(), by="p") == []
    assert conv.normalize(by="p") == []
    assert conv.resume() is False
    assert conv.end_turn("completed") is False
    assert conv.replace_aside(5, 1) is False
    assert conv.remove_aside(5) is None
    assert conv.replace_aside(aside, {"k": [1]}) is True
    assert conv.halt("why") is False  # the model owes nothing after "b"
    assert conv.revert_to(Conversation.fold(log), by="p") is False
    assert conv.unsaved == ()


def test_ids_are_never_reused() -> None:
    conv = conv_of("a", "b")
    conv.splice(0, None, [], by="p")
    assert conv.push(user("c")) == 3
    conv.splice(0, None, [Entry(user("x"), entry_id=1)], by="p")  # not in the range: new
    assert ids(conv) == [4]


# --------------------------------------------------------------------------- restore


def test_restore_after_splice_gives_back_ids_authors_and_times() -> None:
    log: list[Change] = []
    conv = conv_of("sys", "a", "b", "c")
    conv.push(Entry(user("d"), author="plugin:n"))
    saved(conv, log, T0)
    originals = conv.entries
    summary = conv.splice(1, 4, [user("summary")], by="plugin:compact")
    assert summary == Spliced([2, 3, 4], [], [6], [])
    saved(conv, log, T0 + timedelta(minutes=1))
    undone = conv.restore(1, 2, originals[1:4], by="plugin:undo")
    assert undone == Spliced(removed=[6], kept=[], added=[], restored=[2, 3, 4])
    assert conv.entries == originals
    assert [e.created_at for e in conv.entries] == [T0] * 5
    assert [e.author for e in conv.entries] == [e.author for e in originals]
    # A splice never restores: the same entries get new ids.
    other = conv_of("a", "b")
    taken = other.entries
    other.splice(0, None, [], by="p")
    assert other.splice(0, 0, taken, by="p").added == [3, 4]


def test_restore_takes_no_id_held_outside_the_range_or_never_made() -> None:
    conv = conv_of("a", "b", "c")
    e = conv.entries
    got = conv.restore(2, 3, [e[0], Entry(user("z"), entry_id=50), e[2]], by="p")
    assert got == Spliced(removed=[], kept=[3], added=[4, 5], restored=[])
    assert ids(conv) == [1, 2, 4, 5, 3]


def test_set_entries_is_one_restore_of_the_differing_range() -> None:
    conv = conv_of("a", "b", "c", "d")
    e = conv.entries
    got = conv.set_entries([e[0], user("new"), e[3]], by="p")
    assert got == Spliced(removed=[2, 3], kept=[], added=[5], restored=[])
    assert conv.unsaved[-1].kind == "set_entries"
    assert conv.unsaved[-1].start == 1
    back = conv.set_entries(e, by="p")
    assert back == Spliced(removed=[5], kept=[], added=[], restored=[2, 3])
    assert conv.entries == e


# --------------------------------------------------------------------------- edit_each


def test_edit_each_rewrites_in_place_as_one_change() -> None:
    conv = conv_of("a", "b", "c", "d")
    conv.push(Entry(user("e"), author="plugin:n"))
    seen: list[int | None] = []

    def shout(entry: Entry) -> Any:
        seen.append(entry.entry_id)
        if entry.entry_id in (2, 5):
            return {**entry.message.to_dict(), "content": str(entry.message.content).upper()}
        return entry.message if entry.entry_id == 3 else None

    assert conv.edit_each(shout, by="plugin:shout") == [2, 5]
    assert seen == [1, 2, 3, 4, 5]
    assert texts(conv) == ["a", "B", "c", "d", "E"]
    assert ids(conv) == [1, 2, 3, 4, 5]
    assert [e.author for e in conv.entries][-1] == "plugin:n"
    change = conv.unsaved[-1]
    assert (change.kind, change.start, len(change.removed)) == ("edit_each", 1, 4)


# --------------------------------------------------------------------------- normalize


def fn_call(call_id: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": "f", "arguments": "{}"}}


def test_normalize_chat_completions() -> None:
    conv = Conversation("c")
    conv.extend(
        [
            user("go"),
            {"role": "tool", "tool_call_id": "early", "content": "r0"},  # before its call
            {"role": "assistant", "content": None, "tool_calls": [fn_call("a"), fn_call("b")]},
            {"role": "tool", "tool_call_id": "a", "content": "r1"},
            {"role": "tool", "tool_call_id": "a", "content": "r1 again"},
            {"role": "tool", "tool_call_id": "zzz", "content": "orphan"},
            {"role": "tool", "tool_call_id": "early", "content": "r0 late"},
        ]
    )
    assert conv.normalize(by="plugin:fix") == [2, 5, 6, 7]
    assert ids(conv) == [1, 3, 4]  # "b" has no result and stays
    assert conv.unsaved[-1].kind == "normalize"
    assert conv.unsaved[-1].author == "plugin:fix"
    assert conv.normalize(by="plugin:fix") == []


def test_normalize_responses() -> None:
    conv = Conversation("c")
    conv.extend(
        [
            user("add"),
            {"type": "function_call", "call_id": "c1", "name": "add", "arguments": "[]"},
            {"type": "function_call_output", "call_id": "c1", "output": "5"},
            {"type": "function_call_output", "call_id": "c1", "output": "5 again"},
            {"type": "custom_tool_call_output", "call_id": "nope", "output": "?"},
            {"type": "function_call_output", "output": "no call id"},
        ]
    )
    assert conv.normalize(by="p") == [4, 5, 6]
    assert ids(conv) == [1, 2, 3]


def test_normalize_anthropic_drops_blocks_or_messages() -> None:
    use = {"type": "tool_use", "id": "t1", "name": "f", "input": {}}
    ok = {"type": "tool_result", "tool_use_id": "t1", "content": "ok"}
    stray = {"type": "tool_result", "tool_use_id": "t9", "content": "stray"}
    text = {"type": "text", "text": "and more"}
    conv = Conversation("c")
    conv.extend(
        [
            user("go"),
            {"role": "assistant", "content": [use]},
            {"role": "user", "content": [ok, stray, text]},
            {"role": "user", "content": [ok]},  # second result for t1
        ]
    )
    conv.push(Entry({"role": "user", "content": [stray]}, author="plugin:x"))
    assert conv.normalize(by="p") == [3, 4, 5]
    assert ids(conv) == [1, 2, 3]
    assert conv.entries[2].message.content == [ok, text]
    assert conv.entries[2].author is None


# --------------------------------------------------------------------------- asides


def test_asides_are_kept_in_order_and_never_sent() -> None:
    conv = conv_of("a", "b")
    first = conv.add_aside({"note": SECRET}, after=2)
    second = conv.add_aside("before everything")
    assert (first, second) == (1, 2)
    assert conv.asides() == [Aside(1, 2, {"note": SECRET}), Aside(2, None, "before everything")]
    conv.asides()[0].value["note"] = "changed"
    assert conv.asides()[0].value == {"note": SECRET}  # fresh copies
    assert conv.request_view() == conv.messages == [Message.user("a"), Message.assistant("b")]
    assert conv.replace_aside(1, [1, 2]) is True
    assert conv.asides()[0] == Aside(1, 2, [1, 2])
    assert conv.remove_aside(2) == Aside(2, None, "before everything")
    assert conv.add_aside(True, after=1) == 3  # aside ids are not reused either
    assert [c.kind for c in conv.unsaved[-4:]] == [
        "aside_add",
        "aside_replace",
        "aside_remove",
        "aside_add",
    ]
    assert SECRET not in repr(conv.asides()) + repr(conv) + repr(conv.unsaved)


def test_an_aside_follows_the_nearest_earlier_entry_that_remains() -> None:
    conv = conv_of("a", "b", "c", "d", "e")
    on_c = conv.add_aside("c", after=3)
    on_d = conv.add_aside("d", after=4)
    on_a = conv.add_aside("a", after=1)
    e = conv.entries
    conv.splice(1, 4, [e[1]], by="p")  # keeps b, drops c and d
    assert {a.aside_id: a.after for a in conv.asides()} == {on_c: 2, on_d: 2, on_a: 1}
    assert conv.unsaved[-1].moved == ((on_c, 3, 2), (on_d, 4, 2))
    conv.splice(0, 2, [], by="p")
    assert {a.aside_id: a.after for a in conv.asides()} == {on_c: None, on_d: None, on_a: None}
    # Restoring the entries brings each aside back to the entry it was put after.
    conv.restore(0, 0, e[:4], by="p")
    assert {a.aside_id: a.after for a in conv.asides()} == {on_c: 3, on_d: 4, on_a: 1}
    folded = Conversation.fold(conv.unsaved)
    assert folded == conv
    assert folded.asides() == conv.asides()


# --------------------------------------------------------------------------- halt


def test_halt_resume_and_awaits_model() -> None:
    conv = conv_of("a", "b")
    assert conv.awaits_model is False
    assert conv.halt("budget") is False
    assert conv.halted is None
    conv.push(user("c"))
    assert conv.awaits_model is True
    assert conv.halt("budget") is True
    assert conv.halted == "budget"
    assert conv.awaits_model is False
    assert conv.request_view() == conv.messages  # still the messages
    n = len(conv.unsaved)
    assert conv.halt("budget") is True
    assert len(conv.unsaved) == n
    assert conv.resume() is True
    assert conv.halted is None
    assert conv.awaits_model
    assert conv.resume() is True
    assert len(conv.unsaved) == n + 1
    assert [c.kind for c in conv.unsaved[-2:]] == ["halt", "resume"]


@pytest.mark.parametrize(
    "edit",
    [
        lambda c: c.push(bot("x")),
        lambda c: c.extend([bot("x")]),
        lambda c: c.splice(2, None, [user("c2")], by="p"),
        lambda c: c.splice(10, 10, [bot("x")], by="p"),
        lambda c: c.restore(2, 3, [user("c2")], by="p"),
        lambda c: c.edit_each(lambda e: user("C") if e.entry_id == 3 else None, by="p"),
    ],
)
def test_an_edit_reaching_the_end_clears_the_halt(edit: Any) -> None:
    conv = conv_of("a", "b", "c")
    assert conv.halt("why")
    edit(conv)
    assert conv.halted is None
    assert conv.unsaved[-1].halt == ("why", None)
    assert Conversation.fold(conv.unsaved) == conv


def test_an_edit_before_the_end_keeps_the_halt() -> None:
    conv = conv_of("a", "b", "c")
    conv.halt("why")
    conv.splice(0, 1, [user("A")], by="p")
    conv.add_aside(1)
    assert conv.halted == "why"
    assert conv.unsaved[-2].halt is None


def test_a_tool_result_is_owed_an_answer_and_a_pending_call_is_not() -> None:
    conv = Conversation("c")
    conv.extend([user("go"), {"role": "assistant", "content": None, "tool_calls": [fn_call("a")]}])
    assert conv.awaits_model is False
    assert conv.halt("x") is False
    conv.push({"role": "tool", "tool_call_id": "a", "content": "r"})
    assert conv.awaits_model is True


# --------------------------------------------------------------------------- turns


def test_turn_records() -> None:
    conv = conv_of("a", "b")
    assert conv.turns() == []
    assert conv.context_used() is None
    assert conv.end_turn("completed") is False
    first = conv.open_turn()
    assert first == TurnRecord(1, 3)  # no user message at the end: the next entry made
    assert first.end is None
    assert first.usage is None
    assert first.ended_at is None
    with pytest.raises(InvalidMessage):
        conv.open_turn()
    conv.extend([user("c"), user("d")])
    assert conv.end_turn("completed", usage={"input": 10, "output": 5}) is True
    assert conv.turns()[0].usage == {"input": 10, "output": 5, "cache_read": 0, "cache_write": 0}
    assert conv.context_used() == 10
    assert conv.open_turn().start == 3  # the first of the user messages at the end
    assert conv.context_used() == 10  # the newest *ended* record
    assert conv.end_turn("failed") is True
    assert conv.context_used() is None
    conv.open_turn()
    usage = {"input": 1, "output": 2, "cache_read": 30, "cache_write": 400}
    assert conv.end_turn("halted", usage=usage)
    assert conv.context_used() == 431
    assert [(t.number, t.end) for t in conv.turns()] == [
        (1, "completed"),
        (2, "failed"),
        (3, "halted"),
    ]
    assert Conversation.fold(conv.unsaved) == conv


@pytest.mark.parametrize(
    "usage",
    [
        {"inputs": 1},
        {"input": -1},
        {"input": 1.5},
        {"input": True},
        {"input": "3"},
        [("input", 1)],
        {"output": 2**63},
    ],
)
def test_bad_usage_raises_and_keeps_the_turn_open(usage: Any) -> None:
    conv = conv_of("a")
    conv.open_turn()
    n = len(conv.unsaved)
    with pytest.raises(InvalidMessage):
        conv.end_turn("completed", usage=usage)
    assert conv.turns()[-1].end is None
    assert len(conv.unsaved) == n


# --------------------------------------------------------------------------- records, fold


def test_change_records_round_trip_exactly() -> None:
    log: list[Change] = []
    conv = conv_of("a", "b")
    conv.add_aside({"k": ["v", 1, None]}, after=2)
    conv.open_turn()
    saved(conv, log, T0)
    conv.splice(0, 1, [Entry(user("x"), author="plugin:a")], by="plugin:b")
    conv.push(user("c"))
    conv.halt("stop")
    conv.end_turn("stopped", usage={"input": 3})
    conv.remove_aside(1)
    saved(conv, log, T0 + timedelta(seconds=1))
    conv.revert_to(Conversation.fold(log[:3]), by="plugin:undo")
    saved(conv, log, T0 + timedelta(seconds=2))
    for change in log:
        record = change.to_record()
        text = json.dumps(record)
        back = Change.from_record(json.loads(text))
        assert back == change
        assert back.to_record() == record
    assert log[0].to_record() == {
        "kind": "write",
        "at": T0.isoformat(),
        "revision": 1,
        "start": 0,
        "added": [
            {"id": 1, "message": user("a"), "created_at": T0.isoformat()},
            {"id": 2, "message": bot("b"), "created_at": T0.isoformat()},
        ],
    }
    assert [c.revision for c in log] == list(range(1, len(log) + 1))
    folded = Conversation.fold(log, "c")
    assert folded == conv
    assert folded.revision == conv.revision == len(log)
    assert [e.created_at for e in folded.entries] == [e.created_at for e in conv.entries]
    assert folded.turns()[0].opened_at == T0
    assert conv.turns()[0].opened_at == T0


@pytest.mark.parametrize(
    "record",
    [
        {},
        {"kind": ""},
        {"kind": "write", "extra": 1},
        {"kind": "write", "added": [{"id": 1}]},
        {"kind": "write", "added": [{"id": 0, "message": user("x")}]},
        {"kind": "write", "added": [{"id": 1, "message": user("x"), "created_at": "soon"}]},
        {"kind": "write", "at": "2025-01-01T00:00:00"},
        {"kind": "halt", "halt": ["a"]},
        {"kind": "x", "asides": [{"id": 1, "before": None, "after": None}]},
        {"kind": "x", "turn": {"number": 1}},
        {"kind": "x", "moved": [[1, 2, 3]]},
        {"kind": "x", "revision": 0},
    ],
)
def test_bad_records_are_refused(record: dict[str, Any]) -> None:
    with pytest.raises(InvalidMessage):
        Change.from_record(record)


def test_apply_refuses_what_does_not_fit() -> None:
    conv = conv_of("a", "b")
    outbox = conv.unsaved
    with pytest.raises(ConflictError):
        conv.apply(outbox[0])  # unsaved changes
    folded = Conversation.fold(outbox)
    snapshot = folded.entries
    misfits = [
        Change("pop", removed=(Entry(user("a"), entry_id=1),)),  # not the last entry
        Change("write", added=(Entry(user("dup"), entry_id=2),)),  # id held
        Change("splice", start=5, removed=(Entry(user("a"), entry_id=1),)),
        Change("turn_end", turn=TurnRecord(1, 1, end="completed")),
        Change("resume", halt=("why", None)),
        Change("write", revision=9, added=(Entry(user("x"), entry_id=3),)),
    ]
    for change in misfits:
        with pytest.raises(ConflictError):
            folded.apply(change)
    assert folded.entries == snapshot
    assert folded.revision == 1


def test_plain_writes_and_pops_fold_as_a_store_records_them() -> None:
    log: list[Change] = []
    conv = conv_of("a", "b")
    conv.add_aside("on b", after=2)
    saved(conv, log)
    for change in (
        Change.write([Entry(user("c"), entry_id=3), Entry(bot("d"), entry_id=4)]),
        Change.pop(Entry(bot("d"), entry_id=4)),
        Change.pop(Entry(user("c"), entry_id=3)),
        Change.pop(Entry(bot("b"), entry_id=2), moved=[(1, 2, 1)]),
    ):
        stamped = change.stamped(conv.revision + 1, T0)
        conv.apply(stamped)
        log.append(stamped)
    assert texts(conv) == ["a"]
    assert conv.asides() == [Aside(1, 1, "on b")]
    assert conv.push(user("e")) == 5  # the popped ids stay used
    saved(conv, log)
    assert Conversation.fold(Change.from_record(c.to_record()) for c in log) == conv


def test_discard_returns_to_the_saved_state() -> None:
    log: list[Change] = []
    conv = conv_of("a", "b")
    conv.add_aside(1, after=1)
    saved(conv, log)
    before = Conversation.fold(log)
    conv.splice(0, None, [user("x")], by="p")
    conv.open_turn()
    conv.add_aside(2)
    conv.discard()
    assert conv == before
    assert conv.unsaved == ()
    assert conv.revision == 2
    assert conv.push(user("c")) == 3  # ids the discarded edits made are free again
    conv.discard()
    conv.discard()
    assert conv == before


def test_revert_to_an_earlier_revision_is_one_change() -> None:
    log: list[Change] = []
    conv = conv_of("a", "b")
    conv.add_aside("x", after=2)
    conv.open_turn()
    saved(conv, log)
    conv.push(user("c"))
    conv.halt("h")
    conv.splice(0, 1, [user("A")], by="p")
    conv.replace_aside(1, "y")
    conv.end_turn("completed")
    saved(conv, log)
    target = Conversation.fold(log[:2])
    assert conv.revert_to(target, by="plugin:revert") is True
    assert conv.unsaved[-1].kind == "revert"
    assert len(conv.unsaved) == 1
    assert conv.entries == target.entries
    assert conv.asides() == target.asides()
    assert conv.halted is None
    assert len(conv.turns()) == 1
    assert conv.turns()[0].end == "completed"
    assert conv.revert_to(target, by="p") is False  # already there
    saved(conv, log)
    assert conv.revert_to(Conversation.fold(log[:-1]), by="p")  # a revert reverted
    assert conv.halted == "h"
    assert texts(conv) == ["A", "b", "c"]
    assert conv.revert_to(Conversation(), by="p")  # revision 0: empty
    assert conv.entries == []
    assert conv.asides() == []
    assert conv.halted is None
    assert conv.push(user("z")) == 5
    with pytest.raises(InvalidMessage):
        conv.revert_to(conv_of("a", "b", "c", "d", "e", "f"), by="p")
    assert Conversation.fold(log + list(conv.unsaved)) == conv


def test_equality_and_repr() -> None:
    a, b = conv_of("a", "b"), conv_of("a", "b")
    assert a == b
    assert a != conv_of("a", "c")
    assert a != "a"
    b.splice(0, 1, [Entry(user("a"), author="p")], by="p")
    assert a != b  # authors and ids count
    c = conv_of("a", "b")
    c.add_aside(1)
    assert a != c
    a.add_aside(1)
    assert a == c
    a.open_turn()
    assert a != c
    text = repr(conv_of(SECRET, SECRET))
    assert SECRET not in text
    assert "entries=2" in text


# --------------------------------------------------------------------------- properties

CALL_IDS = st.sampled_from(["a", "b", "c"])
MESSAGES = st.one_of(
    st.builds(user, st.sampled_from(["u1", "u2"])),
    st.builds(bot, st.sampled_from(["r1", "r2"])),
    st.builds(lambda i: {"role": "assistant", "tool_calls": [fn_call(i)]}, CALL_IDS),
    st.builds(lambda i: {"role": "tool", "tool_call_id": i, "content": "r"}, CALL_IDS),
    st.builds(lambda i: {"type": "function_call", "call_id": i, "name": "f"}, CALL_IDS),
    st.builds(lambda i: {"type": "function_call_output", "call_id": i, "output": ""}, CALL_IDS),
    st.builds(
        lambda i, t: {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": i}] + ([t] if t else []),
        },
        CALL_IDS,
        st.sampled_from([None, {"type": "text", "text": "t"}]),
    ),
)
AUTHORS = st.sampled_from(["plugin:a", "plugin:b"])
SMALL = st.integers(0, 8)
OPS = st.one_of(
    st.tuples(st.just("push"), MESSAGES),
    st.tuples(st.just("extend"), st.lists(MESSAGES, max_size=3)),
    st.tuples(st.just("splice"), SMALL, SMALL, st.lists(SMALL, max_size=3), MESSAGES, AUTHORS),
    st.tuples(st.just("restore"), SMALL, SMALL, st.lists(SMALL, max_size=3), MESSAGES, AUTHORS),
    st.tuples(st.just("edit_each"), SMALL, MESSAGES, AUTHORS),
    st.tuples(st.just("set_entries"), SMALL, SMALL, AUTHORS),
    st.tuples(st.just("normalize"), AUTHORS),
    st.tuples(st.just("aside_add"), SMALL, st.integers()),
    st.tuples(st.just("aside_replace"), st.integers(1, 4), st.text(max_size=3)),
    st.tuples(st.just("aside_remove"), st.integers(1, 4)),
    st.tuples(st.just("halt"), st.sampled_from(["x", "y"])),
    st.tuples(st.just("resume")),
    st.tuples(st.just("open_turn")),
    st.tuples(st.just("end_turn"), st.sampled_from(["completed", "failed"]), SMALL),
    st.tuples(st.just("revert"), SMALL, AUTHORS),
    st.tuples(st.just("save")),
    st.tuples(st.just("discard")),
    st.tuples(st.just("store_write"), MESSAGES),
    st.tuples(st.just("store_pop")),
)


def run(conv: Conversation, log: list[Change], pool: list[Entry], op: tuple[Any, ...]) -> None:
    """One random edit; ``pool`` holds entries seen so far (to splice or restore back)."""
    kind, args = op[0], op[1:]
    entries = conv.entries
    n = len(entries)

    def items(picks: list[int], extra: dict[str, Any]) -> list[Any]:
        return [pool[p % len(pool)] if pool and p < 6 else extra for p in picks]

    if kind == "push":
        conv.push(args[0])
    elif kind == "extend":
        conv.extend(args[0])
    elif kind in ("splice", "restore"):
        start, stop, picks, extra, by = args
        getattr(conv, kind)(start, stop, items(picks, extra), by=by)
    elif kind == "edit_each" and n:
        target = conv.entry_id(args[0] % n)
        conv.edit_each(lambda e: args[1] if e.entry_id == target else None, by=args[2])
    elif kind == "set_entries":
        keep = entries[: args[0]] + entries[args[0] + args[1] :]
        conv.set_entries(keep + pool[-1:], by=args[2])
    elif kind == "normalize":
        conv.normalize(by=args[0])
    elif kind == "aside_add":
        conv.add_aside(args[1], after=conv.entry_id(args[0] % n) if n and args[0] else None)
    elif kind == "aside_replace":
        conv.replace_aside(args[0], args[1])
    elif kind == "aside_remove":
        conv.remove_aside(args[0])
    elif kind == "halt":
        conv.halt(args[0])
    elif kind == "resume":
        conv.resume()
    elif kind == "open_turn":
        if not conv.turns() or conv.turns()[-1].end is not None:
            conv.open_turn()
    elif kind == "end_turn":
        conv.end_turn(args[0], usage={"input": args[1]})
    elif kind == "revert" and log:
        conv.revert_to(Conversation.fold(log[: args[0] % (len(log) + 1)]), by=args[1])
    elif kind == "save":
        saved(conv, log, T0 + timedelta(seconds=len(log)))
    elif kind == "discard":
        conv.discard()
    elif kind == "store_write":
        saved(conv, log)
        write = Change.write([Entry(args[0], entry_id=conv._state.next_entry)])
        stamped = write.stamped(conv.revision + 1, T0)
        conv.apply(stamped)
        log.append(stamped)
    elif kind == "store_pop" and n:
        saved(conv, log)
        pop = Change.pop(entries[-1]).stamped(conv.revision + 1, T0)
        conv.apply(pop)
        log.append(pop)
    pool.extend(e for e in conv.entries if e not in pool)


def check_invariants(conv: Conversation) -> None:
    entry_ids = ids(conv)
    assert len(set(entry_ids)) == len(entry_ids)
    assert all(i < conv._state.next_entry for i in entry_ids)
    assert all(a.after is None or a.after in entry_ids for a in conv.asides())
    assert all(conv.index_of(i) == p for p, i in enumerate(entry_ids))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(OPS, max_size=25))
def test_any_edits_fold_from_their_changes_to_the_live_value(ops: list[Any]) -> None:
    conv, log, pool = Conversation("c"), [], []  # type: Conversation, list[Change], list[Entry]
    for op in ops:
        outbox_before, live_before = conv.unsaved, Conversation.fold(log + list(conv.unsaved))
        run(conv, log, pool, op)
        check_invariants(conv)
        grew = len(conv.unsaved) - len(outbox_before)
        assert grew in (0, 1) or op[0] in ("discard", "save", "store_write", "store_pop")
        if op[0] not in ("discard", "save", "store_write", "store_pop"):
            # An edit records one change exactly when it changes something.
            assert (conv == live_before) is (grew == 0)
        # The outbox folds onto the saved log to the live value, also through records.
        everything = log + list(conv.unsaved)
        assert Conversation.fold(everything) == conv
        records = [json.loads(json.dumps(c.to_record())) for c in everything]
        assert Conversation.fold(Change.from_record(r) for r in records) == conv
    saved_value = Conversation.fold(log)
    conv.discard()
    assert conv == saved_value
    # Once saved, the times a fold gives are the live value's too.
    assert [e.created_at for e in saved_value.entries] == [e.created_at for e in conv.entries]
    times = [(t.opened_at, t.ended_at) for t in conv.turns()]
    assert [(t.opened_at, t.ended_at) for t in saved_value.turns()] == times


@settings(max_examples=100, deadline=None)
@given(
    st.lists(MESSAGES, min_size=1, max_size=8),
    st.lists(AUTHORS | st.none(), min_size=8, max_size=8),
    SMALL,
    SMALL,
    st.lists(MESSAGES, max_size=3),
    st.lists(SMALL, max_size=3),
)
def test_restore_undoes_any_splice(
    messages: list[Any],
    authors: list[str | None],
    start: int,
    stop: int,
    replacement: list[Any],
    aside_on: list[int],
) -> None:
    log: list[Change] = []
    conv = Conversation("c")
    conv.extend(Entry(m, author=a) for m, a in zip(messages, authors, strict=False))
    for i in aside_on:
        conv.add_aside(i, after=conv.entry_id(i % len(messages)))
    saved(conv, log, T0)
    conv.push(user("later"))  # made at another time
    saved(conv, log, T0 + timedelta(hours=1))
    originals, asides = conv.entries, conv.asides()
    got = conv.splice(start, stop, replacement, by="plugin:s")
    s = min(start, len(originals))
    e = min(max(stop, s), len(originals))
    undone = conv.restore(s, s + len(replacement), originals[s:e], by="plugin:u")
    assert sorted(undone.restored) == sorted(got.removed)
    assert conv.entries == originals
    assert conv.asides() == asides
    assert [x.created_at for x in conv.entries] == [x.created_at for x in originals]
    assert Conversation.fold(log + list(conv.unsaved)) == conv
