"""The compaction hooks of ``HiststoreSession``, on histstore's editable history.

The Agents SDK's ``OpenAIResponsesCompactionSession`` probes the session it wraps for
two private hooks (openai-agents 0.24, ``agents/memory/openai_responses_compaction_session.py``):

- ``_get_compaction_snapshot(limit, *, prune_prefix=None)``, used by automatic
  compaction after a run: the newest ``limit`` items, whether they are the whole
  history, and ``replace_suffix(start, output) -> bool`` that swaps ``items[start:]``
  for ``output`` atomically, or returns ``False`` when the stored suffix changed;
- ``_atomic_replace_items(items) -> bool``, looked up on the session's type, used by a
  manual ``run_compaction()``: the whole history becomes ``items``.

Without them the SDK clears the session and adds the output: two transactions, the
change log gone with the clear, and a process that dies between them leaves an empty
history. Here each is one ``store.commit`` of one splice by ``COMPACTION_AUTHOR``: a
single change record that ``store.revert`` undoes, all or nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from agents.memory.session import _CompactionSnapshot

from histstore import ConflictError, Conversation, Entry, Store

if TYPE_CHECKING:
    from agents.items import TResponseInputItem

__all__ = ["COMPACTION_AUTHOR", "replace_all", "snapshot"]

COMPACTION_AUTHOR = "openai-agents:compaction"
"""The author of a compaction's change record and of the entries it stores."""

PrunePrefix = Callable[["TResponseInputItem"], bool]


def _item(entry: Entry) -> TResponseInputItem:
    item: TResponseInputItem = entry.message.to_dict()  # type: ignore[assignment]
    return item


async def snapshot(
    store: Store, conversation: str, limit: int, prune_prefix: PrunePrefix | None
) -> _CompactionSnapshot:
    """The SDK's ``_CompactionSnapshot`` of the newest ``limit`` entries.

    ``replace_suffix`` commits one splice on the value loaded here, so it is refused
    (``False``, nothing written) when anything changed the conversation since: an
    append, a pop, another compaction. It works once; a later call returns ``False``.
    With ``prune_prefix`` (the SDK's ``EncryptedSession`` passes one for expired items),
    the leading entries it accepts go in the same splice. Costs a ``store.edit``
    (O(entries)); the replacement, a commit of one splice.
    """
    value = await store.edit(conversation)
    entries = value.entries
    tail = entries[len(entries) - min(max(limit, 0), len(entries)) :]
    offset = len(entries) - len(tail)
    spent = False

    async def replace_suffix(start: int, output: list[TResponseInputItem]) -> bool:
        nonlocal spent
        if spent or not 0 <= start < len(tail):
            return False
        spent = True
        at = offset + start
        drop = 0
        if prune_prefix is not None:
            while drop < at and prune_prefix(_item(entries[drop])):
                drop += 1
        if drop:  # one splice from the start: the pruned entries, the suffix
            value.splice(0, None, [*entries[drop:at], *output], by=COMPACTION_AUTHOR)
        else:
            value.splice(at, None, output, by=COMPACTION_AUTHOR)
        try:
            await store.commit(value)
        except ConflictError:
            value.discard()
            return False
        return True

    return _CompactionSnapshot([_item(e) for e in tail], offset == 0, replace_suffix)


async def replace_all(store: Store, conversation: str, items: Sequence[TResponseInputItem]) -> None:
    """Make ``items`` the whole history, in one commit of one change.

    Raises:
        ConflictError: another writer changed the conversation between loading it and
            the commit; nothing is written.
        InvalidMessage: an item is not a Responses item (nothing is written).
    """
    value: Conversation = await store.edit(conversation)
    value.splice(0, None, list(items), by=COMPACTION_AUTHOR)
    await store.commit(value)
