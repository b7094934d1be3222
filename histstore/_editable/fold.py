"""The state of an editable conversation and the one function that applies a change to it.

Live edits and folds both go through ``EditableState.apply``, so a value folded from its change
records equals the live one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from .. import turns
from .._errors import ConflictError
from ..turns import _starts_turn
from .changes import Change, Move
from .entries import AsideState, Entry, TurnRecord

__all__ = ["EditableState", "eid"]


def eid(entry: Entry) -> int:
    """The id of an entry that has one (every entry a conversation holds)."""
    assert entry.entry_id is not None
    return entry.entry_id


class EditableState:
    """What an editable conversation holds: entries, asides, halt, turn records and the
    next ids. Changes fold into it (``apply``).

    Entry and aside ids are handed out from ``next_entry`` and ``next_aside``, which
    only grow, so an id is never given twice.
    """

    __slots__ = ("_index", "asides", "entries", "halted", "next_aside", "next_entry", "turns")

    def __init__(self) -> None:
        self.entries: list[Entry] = []
        self._index: dict[int, int] | None = {}
        self.asides: dict[int, AsideState] = {}
        self.halted: str | None = None
        self.turns: list[TurnRecord] = []
        self.next_entry = 1
        self.next_aside = 1

    @classmethod
    def of(
        cls,
        entries: Sequence[Entry],
        asides: Mapping[int, AsideState],
        halted: str | None,
        turn_records: Sequence[TurnRecord],
        next_entry: int,
        next_aside: int,
    ) -> EditableState:
        """A state holding copies of these parts (trusted: nothing is checked)."""
        state = cls()
        state.entries = list(entries)
        state._index = None
        state.asides = dict(asides)
        state.halted = halted
        state.turns = list(turn_records)
        state.next_entry = next_entry
        state.next_aside = next_aside
        return state

    def copy(self) -> EditableState:
        """A copy that later edits of either leave alone (the parts are immutable)."""
        return self.of(
            self.entries, self.asides, self.halted, self.turns, self.next_entry, self.next_aside
        )

    def position(self, entry_id: int) -> int | None:
        """Where entry ``entry_id`` stands now, or ``None``."""
        index = self._index
        if index is None:
            index = self._index = {eid(e): i for i, e in enumerate(self.entries)}
        return index.get(entry_id)

    def status(self) -> turns.Status:
        """``turns.status`` of the messages, read from where the newest turn starts."""
        entries = self.entries
        i = len(entries) - 1
        while i > 0 and not _starts_turn(entries[i].message):
            i -= 1
        return turns.status([e.message for e in entries[max(i, 0) :]])

    def turn_start(self) -> int:
        """The entry id a turn opened now begins at: the first of the user messages that
        end the conversation (what it answers), else the next entry made."""
        found: int | None = None
        for e in reversed(self.entries):
            if not _starts_turn(e.message):
                break
            found = e.entry_id
        return self.next_entry if found is None else found

    def plan_moves(
        self, start: int, removed: Sequence[Entry], added: Sequence[Entry]
    ) -> list[Move]:
        """The asides replacing ``removed`` at ``start`` by ``added`` moves, by aside id.

        An aside after an entry that goes follows the nearest earlier entry that stays (or
        stands before everything); one whose home entry comes back follows it again.
        """
        added_ids = {e.entry_id for e in added}
        removed_ids = {e.entry_id for e in removed}
        gone: dict[int, int | None] = {}
        last = self.entries[start - 1].entry_id if start > 0 else None
        for e in removed:
            if e.entry_id in added_ids:
                last = e.entry_id
            else:
                gone[eid(e)] = last
        back = {i for i in added_ids - removed_ids if i is not None and i < self.next_entry}
        if not gone and not back:
            return []
        moves: list[Move] = []
        for aside_id in sorted(self.asides):
            state = self.asides[aside_id]
            to = state.after
            if to is not None and to in gone:
                to = gone[to]
            if state.home is not None and state.home in back:
                to = state.home
            if to != state.after:
                moves.append((aside_id, state.after, to))
        return moves

    def apply(self, change: Change) -> Change:
        """Apply ``change``; return it with ``moved`` and ``halt`` as applying it made them.

        New entries and turn records without a time get ``change.at``.

        Raises:
            ConflictError: the change does not fit this state (nothing is changed).
        """
        n = len(self.entries)
        s = k = 0
        moved: list[Move] = []
        reaches_end = False
        gone: set[int | None] = set()
        if change.touches_entries:
            k = len(change.removed)
            s = n - k if change.start is None else change.start
            if s < 0 or s + k > n:
                raise _misfit("its entries part is out of range")
            for off, e in enumerate(change.removed):
                if self.entries[s + off].entry_id != e.entry_id:
                    raise _misfit("the entries it removes are not there")
            for e in change.added:
                if eid(e) < self.next_entry:
                    pos = self.position(eid(e))
                    if pos is not None and not s <= pos < s + k:
                        raise _misfit("an entry it adds has the id of an entry that stays")
            moved = self.plan_moves(s, change.removed, change.added)
            if change.moved and change.moved != tuple(moved):
                raise _misfit("the asides it moves are not the ones its entries move")
            reaches_end = s + k == n
            gone = {e.entry_id for e in change.removed} - {e.entry_id for e in change.added}
        post = {a: replace(self.asides[a], after=to) for a, _from, to in moved}
        added_ids = {e.entry_id for e in change.added}
        for op in change.asides:
            current = post.get(op.aside_id, self.asides.get(op.aside_id))
            if current != op.before:
                raise _misfit("an aside it changes is not as it says")
            after = None if op.after is None else op.after.after
            if after is not None and (
                after in gone or (after not in added_ids and self.position(after) is None)
            ):
                raise _misfit("an aside it puts follows no entry")
        halt = change.halt
        if halt is not None and halt[0] != self.halted:
            raise _misfit("the halt it changes is not as it says")
        if halt is None and reaches_end and self.halted is not None:
            halt = (self.halted, None)
        turn = self._turn(change)
        # Everything fits: change the state.
        if change.touches_entries:
            self._splice(s, k, change)
        for aside_id in post:
            self.asides[aside_id] = post[aside_id]
        for op in change.asides:
            if op.after is None:
                del self.asides[op.aside_id]
            else:
                self.asides[op.aside_id] = op.after
            self.next_aside = max(self.next_aside, op.aside_id + 1)
        if halt is not None:
            self.halted = halt[1]
        if turn is not None:
            if turn.end is None:
                self.turns.append(turn)
            else:
                self.turns[-1] = turn
        if tuple(moved) == change.moved and halt == change.halt:
            return change
        return replace(change, moved=tuple(moved), halt=halt)

    def _turn(self, change: Change) -> TurnRecord | None:
        turn = change.turn
        if turn is None:
            return None
        last = self.turns[-1] if self.turns else None
        if turn.end is None:
            if turn.number != len(self.turns) + 1 or (last is not None and last.end is None):
                raise _misfit("the turn it opens does not follow the last one")
            if turn.opened_at is None and change.at is not None:
                turn = replace(turn, opened_at=change.at)
            return turn
        if (
            last is None
            or last.end is not None
            or (last.number, last.start)
            != (
                turn.number,
                turn.start,
            )
        ):
            raise _misfit("the turn it ends is not the open one")
        return replace(turn, opened_at=last.opened_at, ended_at=turn.ended_at or change.at)

    def _splice(self, s: int, k: int, change: Change) -> None:
        at = change.at
        added = [
            e if e.created_at is not None or at is None else replace(e, created_at=at)
            for e in change.added
        ]
        n = len(self.entries)
        index = self._index
        if index is not None and k == 0 and s == n:
            for off, e in enumerate(added):
                index[eid(e)] = n + off
        else:
            self._index = None
        self.entries[s : s + k] = added
        top = max((eid(e) for e in added), default=0)
        self.next_entry = max(self.next_entry, top + 1)


def _misfit(why: str) -> ConflictError:
    return ConflictError(f"the change does not fit the conversation: {why}")
