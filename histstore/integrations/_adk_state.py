"""ADK app and user state: one metadata key per state key, in the metadata of the app's
and the user's own conversations, so concurrent updates of different keys never lose one."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

from histstore import NotFound, Store

from ._adk_records import (
    APP,
    KIND,
    USER,
    app_conversation,
    state_from_metadata,
    state_metadata,
    user_conversation,
)

__all__ = ["merge_scoped", "scoped_state", "state_of"]


async def merge_scoped(
    store: Store,
    app_name: str,
    user_id: str,
    app_delta: Mapping[str, Any],
    user_delta: Mapping[str, Any],
) -> None:
    """Merge app and user state deltas (keys without their prefix), concurrently."""
    writes = []
    if app_delta:
        writes.append(
            store.merge_metadata(
                app_conversation(app_name),
                {KIND: "app-state", APP: app_name, **state_metadata(app_delta)},
            )
        )
    if user_delta:
        writes.append(
            store.merge_metadata(
                user_conversation(app_name, user_id),
                {
                    KIND: "user-state",
                    APP: app_name,
                    USER: user_id,
                    **state_metadata(user_delta),
                },
            )
        )
    await asyncio.gather(*writes)


async def scoped_state(store: Store, app_name: str, user_id: str) -> Sequence[dict[str, Any]]:
    """``(app state, user state)``, each ``{}`` when there is none."""
    return await asyncio.gather(
        state_of(store, app_conversation(app_name)),
        state_of(store, user_conversation(app_name, user_id)),
    )


async def state_of(store: Store, conversation: str) -> dict[str, Any]:
    """The state kept in a conversation's metadata; ``{}`` when it is unknown."""
    try:
        return state_from_metadata(await store.metadata(conversation))
    except NotFound:
        return {}
