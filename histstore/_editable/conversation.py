"""``Conversation``: a conversation as an editable value that records every edit.

The value does no I/O. Each edit that changes something builds one ``Change``, applies it
with ``EditableState.apply`` (the code a fold uses) and keeps it in the outbox (``unsaved``);
an edit that changes nothing records nothing. Bad input raises ``InvalidMessage`` and
leaves the value and its outbox as they were.

Times: the value has no clock. A change's ``at`` and the ``created_at`` of the entries it
makes are ``None`` until a store keeps it (``Change.stamped``); a fold gives entries
without a time their change's ``at``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from .._core.models import MessageLike, as_message
from .._errors import ConflictError, InvalidMessage
from .changes import Change, first_touched
from .entries import AsideState, Entry, Spliced, TurnRecord, check_by
from .fold import EditableState, eid
from .reading import EditableBase
from .splice_plan import aside_ops, clamp, differing_range, plan_normalize, plan_splice, to_entries

__all__ = ["Conversation"]


class Conversation(EditableBase):
    """A conversation's entries, asides, halt and turn records, as a value to edit.

    ``Conversation(conversation_id=None)`` is empty at revision 0. Entry ids (and aside
    ids) are ints from 1 in creation order and are never given again, also not after the
    entry is removed; only ``restore`` (and ``revert_to``) bring a removed id back. Every
    edit that changes something records one ``Change`` in ``unsaved``; ``fold`` of a
    value's changes gives a value equal to it.

    Two values are equal when their entries (messages, ids, authors), asides, halt and
    turn records are; the conversation id, outbox, revision and times are not compared.
    """

    __slots__ = ()

    # ------------------------------------------------------------------ entries

    def push(self, message: MessageLike | Entry) -> int:
        """Append ``message`` (its ``Entry``'s author, else none) as a new entry; return its
        id. Clears the halt."""
        item = message if isinstance(message, Entry) else Entry(message)
        return self._append([item])[0]

    def extend(self, messages: Iterable[MessageLike | Entry]) -> list[int]:
        """Append each of ``messages`` as a new entry, in one change; return their ids."""
        items = to_entries(messages, what="messages")
        return self._append(items) if items else []

    def splice(
        self,
        start: int,
        stop: int | None,
        entries: Iterable[MessageLike | Entry],
        *,
        by: str,
    ) -> Spliced:
        """Replace the entries in ``[start, stop)`` with ``entries``, as made by ``by``.

        The range is clamped to the entries as a slice is (``stop=None``: to the end); a
        negative bound raises ``InvalidMessage``. An item keeps its id when that id is in
        the range and no earlier item kept it; any other gets a new id, and ``by`` as its
        author unless its ``Entry`` names one. A splice reaching the end clears the halt.
        """
        return self._replace("splice", start, stop, entries, by, restore=False)

    def restore(
        self,
        start: int,
        stop: int | None,
        entries: Iterable[MessageLike | Entry],
        *,
        by: str,
    ) -> Spliced:
        """As ``splice``; besides, an ``Entry`` whose id this conversation made and no
        entry holds now keeps that id, its author and its ``created_at`` (an undone edit
        puts the originals back as they were), and the asides put after it follow it
        again."""
        return self._replace("restore", start, stop, entries, by, restore=True)

    def edit_each(self, fn: Callable[[Entry], MessageLike | None], *, by: str) -> list[int]:
        """Call ``fn`` on each entry, oldest first; where it returns a message other than
        the entry's, the entry is rewritten, keeping its id and author. One change (by
        ``by``), none when nothing was rewritten. Returns the rewritten entries' ids."""
        by = check_by(by)
        entries = list(self._state.entries)
        rewritten: dict[int, Entry] = {}
        for i, entry in enumerate(entries):
            result = fn(entry)
            if result is not None:
                message = as_message(result)
                if message != entry.message:
                    rewritten[i] = replace(entry, message=message)
        if not rewritten:
            return []
        first, last = min(rewritten), max(rewritten)
        added = tuple(rewritten.get(i, entries[i]) for i in range(first, last + 1))
        removed = tuple(entries[first : last + 1])
        self._record(Change("edit_each", by, start=first, removed=removed, added=added))
        return [eid(entries[i]) for i in sorted(rewritten)]

    def set_entries(self, entries: Iterable[MessageLike | Entry], *, by: str) -> Spliced:
        """Make the entries ``entries``: one ``restore`` of the range between the longest
        start and end they share with the current ones; nothing when they are equal."""
        by = check_by(by)
        items = to_entries(entries)
        start, stop, new_stop = differing_range(self._state.entries, items)
        return self._replace("set_entries", start, stop, items[start:new_stop], by, restore=True)

    def normalize(self, *, by: str) -> list[int]:
        """Drop the tool results that answer no earlier call, and the second and later
        results of one call; a call without a result stays. Returns the ids of the entries
        that lost a result: dropped, or (an Anthropic message holding other blocks too)
        rewritten in place with its id and author."""
        by = check_by(by)
        new, touched = plan_normalize(self._state.entries)
        if touched:
            old = self._state.entries
            start, stop, new_stop = differing_range(old, new)
            removed, added = tuple(old[start:stop]), tuple(new[start:new_stop])
            self._record(Change("normalize", by, start=start, removed=removed, added=added))
        return touched

    # ------------------------------------------------------------------ changes

    @classmethod
    def fold(cls, changes: Iterable[Change], conversation_id: str | None = None) -> Conversation:
        """The value ``changes`` build, applied in order to an empty conversation.

        Raises:
            ConflictError: a change does not fit what the ones before it built.
        """
        conv = cls(conversation_id)
        for change in changes:
            conv.apply(change)
        return conv

    def apply(self, change: Change) -> None:
        """Apply ``change`` verbatim (not put in the outbox); the revision becomes the
        change's, else one more.

        Raises:
            ConflictError: the value has unsaved changes, ``change.revision`` is not the
                next one, or the change does not fit (nothing is changed).
        """
        if not isinstance(change, Change):
            raise InvalidMessage("apply takes a Change")
        if self._outbox:
            raise ConflictError("the conversation value has unsaved changes")
        if change.revision is not None and change.revision != self._revision + 1:
            raise ConflictError("the change's revision does not follow the value's")
        self._state.apply(change)
        self._revision += 1

    def discard(self) -> None:
        """Drop the unsaved changes: the value is again as it was loaded or last saved."""
        if self._saved is not None:
            self._state = self._saved
        self._saved = None
        self._outbox.clear()

    def revert_to(self, target: Conversation, *, by: str) -> bool:
        """Make the entries, asides and halt those of ``target`` (this conversation at an
        earlier revision, e.g. a fold of its first changes), as one ``"revert"`` change by
        ``by``; turn records stay. Returns whether anything changed.

        Raises:
            InvalidMessage: ``target`` holds an entry id this conversation cannot take back.
        """
        by = check_by(by)
        if not isinstance(target, Conversation):
            raise InvalidMessage("revert_to takes a Conversation")
        state, goal = self._state, target._state
        start, stop, new_stop = differing_range(state.entries, goal.entries)
        removed, added = tuple(state.entries[start:stop]), tuple(goal.entries[start:new_stop])
        in_range = {eid(e) for e in removed}
        for e in added:
            i = eid(e)
            if i not in in_range and (i >= state.next_entry or state.position(i) is not None):
                raise InvalidMessage("the target holds an entry id this conversation cannot take")
        touches = bool(removed or added)
        asides = dict(state.asides)
        for aside_id, _from, to in state.plan_moves(start, removed, added) if touches else []:
            asides[aside_id] = replace(asides[aside_id], after=to)
        ops = aside_ops(asides, goal.asides)
        clears = touches and stop == len(state.entries) and state.halted is not None
        halt = (state.halted, goal.halted) if clears or state.halted != goal.halted else None
        if not touches and not ops and halt is None:
            return False
        self._record(
            Change(
                "revert",
                by,
                start=start if touches else None,
                removed=removed,
                added=added,
                asides=tuple(ops),
                halt=halt,
            )
        )
        return True

    # ------------------------------------------------------------------ for a store
    # What a store's programs (``_ops.editing``) need of a value. Public names so they
    # touch no private member; not part of the documented API (``Store.edit``,
    # ``Store.commit`` and ``Store.refresh`` are how a caller reaches them).

    @classmethod
    def from_store(
        cls,
        conversation_id: str,
        *,
        revision: int,
        entries: Sequence[Entry],
        asides: dict[int, AsideState],
        halted: str | None,
        turns: Sequence[TurnRecord],
        next_entry_id: int,
        next_aside_id: int,
    ) -> Conversation:
        """A value as a store holds it at ``revision``, with no unsaved changes (the
        parts are trusted: nothing is checked)."""
        conv = cls(conversation_id)
        conv._state = EditableState.of(entries, asides, halted, turns, next_entry_id, next_aside_id)
        conv._revision = revision
        return conv

    @property
    def edit_state(self) -> EditableState:
        """The state as edited now, unsaved changes applied. The live object: a reader
        must not change it."""
        return self._state

    @property
    def saved_state(self) -> EditableState:
        """The state at ``revision``, before the unsaved changes (the one a commit
        writes the difference from). The live object: a reader must not change it."""
        return self._state if self._saved is None else self._saved

    def take_stored(self, fresh: Conversation) -> None:
        """Become ``fresh``, this conversation as a store has just loaded it: its state
        and revision. Call only when ``unsaved`` is empty (the caller checks)."""
        self._state, self._revision, self._saved = fresh._state, fresh._revision, None

    def mark_saved(self, changes: Sequence[Change]) -> None:
        """Adopt ``changes``, the outbox as a store kept it (``Change.stamped``, in
        order): the revision becomes the last one's, the outbox empties, and the entries
        and turn records these changes made take their times."""
        times = {eid(e): e.created_at for c in changes for e in c.added}
        state = self._state
        low = first_touched(changes)
        if low is not None:  # entries before ``low`` are as they were: not looked at
            state.entries[low:] = [
                e
                if e.created_at is not None or times.get(eid(e)) is None
                else replace(e, created_at=times[eid(e)])
                for e in state.entries[low:]
            ]
        opened: dict[int, datetime | None] = {}
        ended: dict[int, datetime | None] = {}
        for c in changes:
            if c.turn is not None:
                (opened if c.turn.end is None else ended)[c.turn.number] = (
                    c.turn.opened_at if c.turn.end is None else c.turn.ended_at
                )
        state.turns = [
            replace(
                t,
                opened_at=t.opened_at or opened.get(t.number),
                ended_at=t.ended_at or ended.get(t.number),
            )
            for t in state.turns
        ]
        if changes and changes[-1].revision is not None:
            self._revision = changes[-1].revision
        self._outbox.clear()
        self._saved = None

    # ------------------------------------------------------------------ internals

    def _append(self, items: list[Entry]) -> list[int]:
        n = len(self._state.entries)
        added, spliced = plan_splice(self._state, n, n, items, None, restore=False)
        self._record(Change("write", start=n, added=tuple(added)))
        return spliced.added

    def _replace(
        self,
        kind: str,
        start: object,
        stop: object,
        entries: Iterable[MessageLike | Entry],
        by: object,
        *,
        restore: bool,
    ) -> Spliced:
        author = check_by(by)
        items = to_entries(entries)
        s, e = clamp(start, stop, len(self._state.entries))
        added, spliced = plan_splice(self._state, s, e, items, author, restore=restore)
        removed = self._state.entries[s:e]
        if removed != added:
            self._record(Change(kind, author, start=s, removed=tuple(removed), added=tuple(added)))
        return spliced

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Conversation):
            return NotImplemented
        a, b = self._state, other._state
        return (
            a.entries == b.entries
            and a.halted == b.halted
            and a.turns == b.turns
            and _public(a.asides) == _public(b.asides)
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        s = self._state
        halted = ", halted" if s.halted is not None else ""
        return (
            f"Conversation({self._id!r}, revision={self._revision}, entries={len(s.entries)},"
            f" asides={len(s.asides)}, turns={len(s.turns)}, unsaved={len(self._outbox)}"
            f"{halted})"
        )


def _public(asides: dict[int, AsideState]) -> dict[int, tuple[int | None, Any]]:
    return {aside_id: (s.after, s.value) for aside_id, s in asides.items()}
