"""The editable-history calls of ``Store`` (SPEC 11), kept apart from the others."""

from __future__ import annotations

from ._core.models import Message
from ._editable.changes import Change
from ._editable.conversation import Conversation
from ._ops.editing import Editing

__all__ = ["EditableCalls"]


class EditableCalls:
    """``Store``'s calls for editable history: a conversation as a ``Conversation``
    value, its commit, its change log, and reverting it."""

    _editing: Editing

    async def edit(self, conversation: str) -> Conversation:
        """The conversation as a value to edit, at its stored revision.

        An unknown conversation (or, through a view, another user's) gives an empty
        value at revision 0 and creates nothing. Costs O(entries + asides + turn
        records), read from one snapshot.
        """
        return await self._editing.edit(conversation)

    async def commit(self, conversation: Conversation) -> int:
        """Store the value's unsaved changes in one transaction; return the new revision
        (``conversation.revision + len(unsaved)``).

        Optimistic: when the stored revision is no longer the one the value continues
        (another writer committed, wrote or popped), nothing is written and the value
        is left as it was. Afterwards the value has an empty outbox and the new
        revision, and can go on being edited. Costs O(changed entries + entries after
        the first changed position).

        Raises:
            ConflictError: the conversation changed since the value was loaded or saved.
            NotFound: through a view, the conversation is another user's.
            InvalidMessage: an entry is over ``max_message_bytes``, or the value names
                no conversation.
        """
        return await self._editing.commit(conversation)

    async def refresh(self, conversation: Conversation) -> None:
        """Reload the value in place from the store.

        Raises:
            ConflictError: the value has unsaved changes.
        """
        await self._editing.refresh(conversation)

    async def changes(
        self, conversation: str, *, since: int = 0, limit: int | None = None
    ) -> list[Change]:
        """The first ``limit`` change records after revision ``since``, oldest first
        (``[]`` for an unknown conversation). Each has its ``revision``, ``kind``,
        ``author``, ``at`` and every part it changed, with the entries it removed and
        added, so that ``Conversation.fold(await store.changes(c))`` equals
        ``await store.edit(c)``. Reads the records after ``since`` and the entries they
        touched (the halt then from the newest write or halt record up to it), in one
        snapshot; with ``limit`` and no ``since`` (the oldest page) the first ``limit``
        records and the entries they left, unless a later record touched one of those
        (then the whole log); without ``since`` and ``limit`` the whole log, checked to
        build the stored entries.

        Raises:
            InvalidMessage: ``since`` or ``limit`` is negative.
        """
        return await self._editing.changes(conversation, since, limit)

    async def revert(self, conversation: str, revision: int, *, by: str) -> int:
        """Make the entries, asides and halt what they were at ``revision``, as one new
        change by ``by``; return the new revision. Turn records stay. Reverting to the
        current revision (or to one whose state equals it) changes nothing; revision 0
        is the empty conversation. A revert can itself be reverted. Reads what
        ``changes(conversation, since=revision)`` reads, and the asides: undoing the
        last change costs what it touched, not the history.

        Raises:
            NotFound: the conversation is unknown, or never had ``revision`` (negative or
                above the current one).
            InvalidMessage: ``by`` is not a non-empty str.
        """
        return await self._editing.revert(conversation, revision, by)

    async def newest_by(self, conversation: str, author: str) -> Message | None:
        """The newest message of an entry ``author`` made (e.g. a compaction's summary),
        or ``None``; served by an index of authored entries, whatever the history's
        length."""
        return await self._editing.newest_by(conversation, author)
