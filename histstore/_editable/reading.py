"""The reading side of an editable conversation, and the edits of its asides, halt and
turn records (``Conversation`` in ``_editable.conversation`` adds the entry edits and the changes).
"""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

from .._core import codec as _codec
from .._core.ids import validate_id
from .._core.models import Message
from .._errors import InvalidMessage
from .changes import Change
from .entries import (
    TURN_ENDS,
    Aside,
    AsideOp,
    Entry,
    TurnRecord,
    check_by,
    check_count,
    check_usage,
    make_aside_state,
)
from .fold import EditableState, eid

__all__ = ["EditableBase"]


class EditableBase:
    """The state of a ``Conversation``, what reads it, and the edits besides entries."""

    __slots__ = ("_id", "_outbox", "_revision", "_saved", "_state")

    def __init__(self, conversation_id: str | None = None) -> None:
        self._id = None if conversation_id is None else validate_id(conversation_id)
        self._state = EditableState()
        self._revision = 0
        self._outbox: list[Change] = []
        self._saved: EditableState | None = None

    # ------------------------------------------------------------------ reading

    @property
    def conversation_id(self) -> str | None:
        """The conversation this value is of (``None`` for a value of no store)."""
        return self._id

    @property
    def entries(self) -> list[Entry]:
        """The entries, oldest first."""
        return list(self._state.entries)

    @property
    def messages(self) -> list[Message]:
        """The entries' messages, oldest first."""
        return [e.message for e in self._state.entries]

    def request_view(self) -> list[Message]:
        """What a model is sent: the messages, never the asides (also while halted)."""
        return self.messages

    def entry_id(self, index: int) -> int:
        """The id of the entry at ``index`` (as a list indexes; ``IndexError`` outside)."""
        return eid(self._state.entries[index])

    def index_of(self, entry_id: int) -> int | None:
        """Where the entry ``entry_id`` stands now; ``None`` once removed (or never made)."""
        if not isinstance(entry_id, int) or isinstance(entry_id, bool):
            return None
        return self._state.position(entry_id)

    @property
    def revision(self) -> int:
        """The stored revision this value continues (unsaved edits do not move it)."""
        return self._revision

    @property
    def unsaved(self) -> tuple[Change, ...]:
        """The changes made since the value was loaded or saved, oldest first."""
        return tuple(self._outbox)

    @property
    def halted(self) -> str | None:
        """Why the model's owed answer is left unasked for, or ``None``."""
        return self._state.halted

    @property
    def awaits_model(self) -> bool:
        """Whether the model owes an answer (``turns.status`` is ``"open"``) and the
        conversation is not halted."""
        return self._state.halted is None and self._state.status() == "open"

    def asides(self) -> list[Aside]:
        """The asides in the order put (their values are fresh copies)."""
        return [
            Aside(aside_id, state.after, copy.deepcopy(state.value))
            for aside_id, state in sorted(self._state.asides.items())
        ]

    def turns(self) -> list[TurnRecord]:
        """The turn records, oldest first."""
        return list(self._state.turns)

    def context_used(self) -> int | None:
        """``input + cache_read + cache_write`` of the newest ended turn record: what the
        context costs now. ``None`` when that record has no usage, or none ended."""
        for turn in reversed(self._state.turns):
            if turn.end is not None:
                u = turn.usage
                return None if u is None else u["input"] + u["cache_read"] + u["cache_write"]
        return None

    # ------------------------------------------------------------------ asides

    def add_aside(self, value: Any, *, after: int | None = None) -> int:
        """Put a JSON ``value`` after the entry ``after`` (``None``: before every entry);
        return its id. An aside whose entry is removed follows the nearest earlier entry
        that remains.

        Raises:
            InvalidMessage: ``value`` does not round-trip as JSON, or ``after`` names no
                entry of the conversation.
        """
        if after is not None and self._state.position(check_count(after, what="after")) is None:
            raise InvalidMessage("after names no entry of the conversation")
        state = make_aside_state(after, after, value)
        aside_id = self._state.next_aside
        self._record(Change("aside_add", asides=(AsideOp(aside_id, None, state),)))
        return aside_id

    def replace_aside(self, aside_id: int, value: Any) -> bool:
        """Replace the value of aside ``aside_id``, in its place; whether there is one."""
        check_count(aside_id, what="aside_id")
        _codec.encode(value, what="aside value")
        current = self._state.asides.get(aside_id)
        if current is None:
            return False
        new = make_aside_state(current.after, current.home, value)
        if _codec.canonical(new.value) != _codec.canonical(current.value):
            self._record(Change("aside_replace", asides=(AsideOp(aside_id, current, new),)))
        return True

    def remove_aside(self, aside_id: int) -> Aside | None:
        """Remove aside ``aside_id`` and return it, or ``None`` when there is none."""
        check_count(aside_id, what="aside_id")
        current = self._state.asides.get(aside_id)
        if current is None:
            return None
        self._record(Change("aside_remove", asides=(AsideOp(aside_id, current, None),)))
        return Aside(aside_id, current.after, copy.deepcopy(current.value))

    # ------------------------------------------------------------------ halt and turns

    def halt(self, reason: str) -> bool:
        """Leave the model's owed answer unasked for, because of ``reason`` (a non-empty
        str). Only when ``turns.status`` is ``"open"``; returns whether it is halted."""
        reason = check_by(reason, what="reason")
        if self._state.status() != "open":
            return False
        if self._state.halted != reason:
            self._record(Change("halt", halt=(self._state.halted, reason)))
        return True

    def resume(self) -> bool:
        """Clear the halt; return whether the model owes an answer."""
        if self._state.halted is not None:
            self._record(Change("resume", halt=(self._state.halted, None)))
        return self._state.status() == "open"

    def open_turn(self) -> TurnRecord:
        """Record a turn beginning now: numbered after the last record, starting at the
        first of the user messages that end the conversation, else at the next entry made.

        Raises:
            InvalidMessage: the newest turn record is still open (end it first).
        """
        turns = self._state.turns
        if turns and turns[-1].end is None:
            raise InvalidMessage(f"turn {turns[-1].number} is still open; end it first")
        record = TurnRecord(len(turns) + 1, self._state.turn_start())
        self._record(Change("turn_open", turn=record))
        return self._state.turns[-1]

    def end_turn(self, end: str, *, usage: Any = None) -> bool:
        """End the newest turn record with ``end`` (one of ``"completed"``, ``"stopped"``,
        ``"failed"``, ``"halted"``) and its token ``usage``; whether one was open.

        Raises:
            InvalidMessage: ``end`` or ``usage`` is not as described (usage keys are
                ``input``, ``output``, ``cache_read``, ``cache_write``; counts are ints from
                0; a missing key counts 0).
        """
        if end not in TURN_ENDS:
            raise InvalidMessage(f"end must be one of {', '.join(TURN_ENDS)}")
        counts = check_usage(usage)
        turns = self._state.turns
        if not turns or turns[-1].end is not None:
            return False
        self._record(Change("turn_end", turn=replace(turns[-1], end=end, usage=counts)))
        return True

    # ------------------------------------------------------------------ recording

    def _record(self, change: Change) -> None:
        saved = self._state.copy() if not self._outbox else None
        done = self._state.apply(change)
        if saved is not None:
            self._saved = saved
        self._outbox.append(done)
