"""How the edits of an editable conversation decide what to change: ids for splices and
restores, the range two entry lists differ in, and tool-result repairs. Pure functions.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from .._core.models import Message, message_data
from .._errors import InvalidMessage
from ..turns import _calls, _results, _role, _valid_id
from .entries import AsideOp, AsideState, Entry, Spliced, check_count
from .fold import EditableState

__all__ = ["aside_ops", "clamp", "differing_range", "plan_normalize", "plan_splice", "to_entries"]


def to_entries(items: object, *, what: str = "entries") -> list[Entry]:
    """``items`` as entries: each an ``Entry``, a ``Message`` or a message dict.

    Raises:
        InvalidMessage: ``items`` is not an iterable of those (a single message is not).
    """
    if isinstance(items, (str, bytes, Mapping, Message, Entry)) or not isinstance(items, Iterable):
        raise InvalidMessage(f"{what} must be an iterable of messages or Entry values")
    return [i if isinstance(i, Entry) else Entry(i) for i in items]


def clamp(start: object, stop: object, length: int) -> tuple[int, int]:
    """The range ``[start, stop)`` clamped to ``length`` entries as a slice clamps it.

    ``stop`` may be ``None`` (the end); a negative bound raises ``InvalidMessage``.
    """
    s = min(check_count(start, what="start"), length)
    e = length if stop is None else check_count(stop, what="stop")
    return s, min(max(e, s), length)


def plan_splice(
    state: EditableState,
    start: int,
    stop: int,
    items: Sequence[Entry],
    by: str | None,
    *,
    restore: bool,
) -> tuple[list[Entry], Spliced]:
    """The entries replacing ``[start, stop)`` and what happens to the ids.

    An item keeps its id when that id is in the range and no earlier item kept it. With
    ``restore``, an item whose id this conversation made and nothing holds now keeps it,
    its author and its time. Every other item gets a new id, and ``by`` as author when it
    names none.
    """
    in_range = {e.entry_id: e for e in state.entries[start:stop]}
    taken: set[int] = set()
    next_id = state.next_entry
    added: list[Entry] = []
    kept: list[int] = []
    made: list[int] = []
    back: list[int] = []
    for item in items:
        i = item.entry_id
        if i is not None and i not in taken and i in in_range:
            out = replace(item, created_at=in_range[i].created_at)
            kept.append(i)
            taken.add(i)
        elif (
            restore
            and i is not None
            and i not in taken
            and i < state.next_entry
            and state.position(i) is None
        ):
            out = item
            back.append(i)
            taken.add(i)
        else:
            author = item.author if item.author is not None else by
            out = Entry(item.message, entry_id=next_id, author=author)
            made.append(next_id)
            next_id += 1
        added.append(out)
    removed = [i for i in in_range if i is not None and i not in taken]
    return added, Spliced(removed, kept, made, back)


def differing_range(old: Sequence[Entry], new: Sequence[Entry]) -> tuple[int, int, int]:
    """``(start, old_stop, new_stop)``: ``old[start:old_stop]`` and ``new[start:new_stop]``
    are what lies between the longest common start and end of the two lists."""
    limit = min(len(old), len(new))
    p = 0
    while p < limit and old[p] == new[p]:
        p += 1
    q = 0
    while q < limit - p and old[-1 - q] == new[-1 - q]:
        q += 1
    return p, len(old) - q, len(new) - q


def aside_ops(asides: Mapping[int, AsideState], target: Mapping[int, AsideState]) -> list[AsideOp]:
    """The aside changes that make ``asides`` into ``target``, by aside id."""
    ops: list[AsideOp] = []
    for aside_id in sorted(set(asides) | set(target)):
        before, after = asides.get(aside_id), target.get(aside_id)
        if before != after:
            ops.append(AsideOp(aside_id, before, after))
    return ops


def plan_normalize(entries: Sequence[Entry]) -> tuple[list[Entry], list[int]]:
    """``entries`` without the tool results that answer no earlier call, nor a call
    answered already; and the ids of the entries that lost a result.

    A Chat Completions ``tool`` message or a Responses output item is such a result and is
    dropped whole. An Anthropic user message loses the ``tool_result`` blocks at fault
    and is dropped only when no block is left; otherwise it keeps its id and author.
    """
    pending: set[str] = set()
    out: list[Entry] = []
    touched: list[int] = []
    for entry in entries:
        d = message_data(entry.message)
        keep: list[bool] = []
        for answered in _results(d):
            ok = _valid_id(answered) and answered in pending
            if ok:
                pending.discard(answered)
            keep.append(ok)
        if all(keep):
            out.append(entry)
        else:
            assert entry.entry_id is not None
            touched.append(entry.entry_id)
            if _role(d) == "user":
                message = _without_results(d, keep)
                if message is not None:
                    out.append(replace(entry, message=message))
        for call_id, _call in _calls(d):
            if _valid_id(call_id):
                pending.add(call_id)
    return out, touched


def _without_results(d: Mapping[str, Any], keep: list[bool]) -> Message | None:
    """The user message ``d`` without the ``tool_result`` blocks ``keep`` marks false, or
    ``None`` when no block is left."""
    flags = iter(keep)
    content = [
        block
        for block in d["content"]
        if not (isinstance(block, Mapping) and block.get("type") == "tool_result") or next(flags)
    ]
    if not content:
        return None
    return Message.from_dict({**d, "content": content})
