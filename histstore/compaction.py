"""Compaction: replace the older turns of a conversation with one summary entry.

``compact(store, conversation, summarize)`` loads the conversation as a value, plans the
run of whole turns to replace (``plan_compaction``, a pure function), asks ``summarize``
for a summary of the messages in it, and commits one splice: the run's system messages,
moved before the summary, then the summary. ``revert`` to the revision before undoes it,
entry ids included. ``WindowStore(store, ..., summaries=True)`` reads such a conversation
as its system prompt, the newest summary and the newest turns.

What the run is (where SPEC 11 is silent, the choices are written here):

- Turns are those of ``histstore.turns``: a turn starts at a user message that is not
  made only of tool results. What stands before the first such message (after the
  leading system messages) is a leading turn of its own, as ``split_turns`` has it: it
  counts as a turn and is compacted first.
- The run starts right after the leading system messages and ends after the last
  message of the newest turn it holds, before the newest ``keep_turns`` turns; system
  messages between that turn and the kept ones stay where they are. A previous summary
  (a user message) is the first turn of the next run, so compacting again folds it in.
- The run never separates a tool call from its result: whole turns keep them together,
  and when a stored history has a result in a later turn than its call the run ends
  before the call's turn. With ``keep_turns=0`` a newest turn whose tool call still
  waits for its result (``turns.pending_tool_calls``) is kept, because that result
  would otherwise answer nothing; unanswered calls of older turns are compacted.
- ``summarize`` receives the run's messages other than system messages (those stay).
- Framework envelopes (what the ADK and Pydantic AI adapters store) are turns by their
  ``role`` as any message, and their tool calls pair by the framework's ids (ADK
  ``function_call`` / ``function_response`` ids, Pydantic AI ``tool_call_id``). The
  adapters read the summary back as a framework message.
- Compacting again when nothing new is old enough (the run would be the previous
  summary of the same author alone) does nothing: ``summarize`` is not called.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeAlias

from ._core.ids import validate_id
from ._core.models import Message, MessageLike, message_data
from ._editable.entries import Spliced, check_by
from ._errors import InvalidMessage
from .turns import (
    _calls,
    _is_system,
    _messages,
    _results,
    _starts_turn,
    _valid_id,
    pending_tool_calls,
)

if TYPE_CHECKING:
    from ._store import Store

__all__ = [
    "DEFAULT_AUTHOR",
    "CompactionPlan",
    "Summarize",
    "compact",
    "plan_compaction",
    "summary_message",
]

DEFAULT_AUTHOR = "histstore:compact"
"""The author of the summaries ``compact`` makes unless told otherwise."""

SummaryLike: TypeAlias = str | MessageLike
Summarize: TypeAlias = Callable[[list[Message]], Awaitable[SummaryLike] | SummaryLike]
"""``async (messages) -> str | Message``: the summary of the messages it is given."""


@dataclass(frozen=True, slots=True)
class CompactionPlan:
    """What ``compact`` replaces, as indexes into the message list it was planned on.

    ``[start, stop)`` is the run; ``systems`` are the system messages in it (they stay,
    moved before the summary, in order) and ``replaced`` the other messages, which the
    summary replaces and ``summarize`` receives. ``turns`` is how many turns the run holds.
    """

    start: int
    stop: int
    systems: tuple[int, ...]
    replaced: tuple[int, ...]
    turns: int


def _check_keep_turns(value: object) -> int:
    """``keep_turns`` as given: an int (not a bool) from 0."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"keep_turns must be an int, not {type(value).__name__}")
    if value < 0:
        raise ValueError(f"keep_turns must be at least 0, not {value}")
    return value


def plan_compaction(messages: Sequence[MessageLike], keep_turns: int = 2) -> CompactionPlan | None:
    """The run of whole turns ``compact`` replaces in ``messages``, or ``None``.

    The run is the longest one of whole turns that starts after the leading system
    messages and ends before the newest ``keep_turns`` turns, shortened so that no tool
    call is separated from its result (see the module's docstring). ``None`` when it
    would hold no turn. Pure: no I/O.

    Raises:
        TypeError: ``keep_turns`` is not an int.
        ValueError: ``keep_turns`` is below 0.
        InvalidMessage: an item is neither a ``Message`` nor a message dict.
    """
    keep = _check_keep_turns(keep_turns)
    msgs = _messages(messages)
    lead = 0
    while lead < len(msgs) and _is_system(msgs[lead]):
        lead += 1
    ends: list[int] = []  # per turn: one past its last (non-system) message
    call_turn: dict[str, int] = {}  # call id -> the turn that made the call
    crossing: list[tuple[int, int]] = []  # (call's turn, result's turn), the result later
    for i in range(lead, len(msgs)):
        m = msgs[i]
        if _is_system(m):
            continue
        if _starts_turn(m) or not ends:
            ends.append(i + 1)
        else:
            ends[-1] = i + 1
        turn = len(ends) - 1
        d = message_data(m)
        for answered in _results(d):
            made = call_turn.get(answered) if _valid_id(answered) else None
            if made is not None and made < turn:
                crossing.append((made, turn))
        for call_id, _call in _calls(d):
            if _valid_id(call_id):
                call_turn.setdefault(call_id, turn)
    count = len(ends) - keep
    if keep == 0 and count > 0 and pending_tool_calls(msgs):
        count -= 1  # the newest turn still waits for a tool result
    # A boundary after b turns is allowed unless a call before it is answered after it.
    blocked = [0] * (len(ends) + 2)
    for made, answered_in in crossing:
        blocked[made + 1] += 1
        blocked[answered_in + 1] -= 1
    open_pairs = 0
    best = 0
    for b in range(1, count + 1):
        open_pairs += blocked[b]
        if open_pairs == 0:
            best = b
    if best == 0:
        return None
    stop = ends[best - 1]
    systems = tuple(i for i in range(lead, stop) if _is_system(msgs[i]))
    replaced = tuple(i for i in range(lead, stop) if not _is_system(msgs[i]))
    return CompactionPlan(lead, stop, systems, replaced, best)


def summary_message(value: object) -> Message:
    """What ``summarize`` returned as the summary message.

    A ``str`` becomes a user message (an empty or blank one is refused: it would replace
    the run with nothing); a ``Message`` or message dict is kept as given, but must make
    no tool call and answer none (the summary stands alone).

    Raises:
        InvalidMessage: anything else.
    """
    if isinstance(value, str):
        if not value.strip():
            raise InvalidMessage("summarize returned an empty summary")
        return Message.user(value)
    if isinstance(value, Message):
        message = value
    elif isinstance(value, Mapping):
        message = Message.from_dict(value)
    else:
        raise InvalidMessage(
            f"summarize must return a str or a Message, not {type(value).__name__}"
        )
    d = message_data(message)
    if _calls(d) or _results(d):
        raise InvalidMessage("a summary must not make or answer tool calls")
    return message


async def compact(
    store: Store,
    conversation: str,
    summarize: Summarize,
    *,
    keep_turns: int = 2,
    by: str = DEFAULT_AUTHOR,
) -> Spliced | None:
    """Replace the older turns of ``conversation`` with one summary entry.

    Loads the conversation (``store.edit``), plans the run (``plan_compaction``), awaits
    ``summarize`` on the run's non-system messages, and commits one splice by ``by``:
    the run's system messages (their ids, authors and times kept) moved before the
    summary entry, whose author is ``by``. A ``str`` summary becomes a user message; a
    ``Message`` (or message dict) is stored as given. ``await store.revert(conversation,
    revision_before, by=...)`` puts the originals back, ids included.
    With ``keep_turns=0`` the splice may reach the end, and then clears a halt, as
    every splice that does.

    Args:
        store: the store holding the conversation.
        conversation: its id.
        summarize: ``async (list[Message]) -> str | Message`` (a plain function works
            too); it receives the messages the summary replaces, oldest first.
        keep_turns: how many of the newest turns stay as they are (0: compact all).
        by: the author of the change and of the summary entry.

    Returns:
        What the splice did (``Spliced``), or ``None`` when there is nothing to compact
        (no whole turn is old enough, or the only one is the previous summary by ``by``:
        nothing new happened since); then ``summarize`` is not called and nothing is
        written.

    Raises:
        InvalidId: bad conversation id.
        TypeError: ``keep_turns`` is not an int or ``summarize`` is not callable.
        ValueError: ``keep_turns`` is below 0.
        InvalidMessage: ``by`` is not a non-empty str, or ``summarize`` returned no
            valid summary (nothing is written).
        ConflictError: another writer changed the conversation while ``summarize`` ran;
            nothing is written, and the caller retries (``compact`` again).
    """
    validate_id(conversation)
    keep = _check_keep_turns(keep_turns)
    author = check_by(by)
    if not callable(summarize):
        raise TypeError("summarize must be a function (list[Message]) -> str | Message")
    conv = await store.edit(conversation)
    entries = conv.entries
    plan = plan_compaction([e.message for e in entries], keep)
    if plan is None:
        return None
    if len(plan.replaced) == 1 and entries[plan.replaced[0]].author == author:
        return None  # only its own previous summary: summarizing it again adds nothing
    outcome = summarize([entries[i].message for i in plan.replaced])
    value: object = await outcome if inspect.isawaitable(outcome) else outcome
    summary = summary_message(value)
    moved = [entries[i] for i in plan.systems]
    spliced = conv.splice(plan.start, plan.stop, [*moved, summary], by=author)
    await store.commit(conv)
    return spliced
