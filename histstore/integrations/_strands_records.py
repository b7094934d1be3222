"""How Strands records map onto histstore: the conversation ids of sessions, agents and
multi-agents, a ``SessionMessage`` as a message envelope, and agent and multi-agent
records as conversation metadata."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any, Literal

from strands.types.exceptions import SessionException
from strands.types.session import Session, SessionAgent, SessionMessage, decode_bytes_values

from histstore import InvalidMessage, Message, indexed_text
from histstore.envelopes import strands_role

from ._record_ids import conversation_id

__all__ = [
    "AGENT",
    "KIND",
    "MESSAGE_TYPE",
    "MULTI_AGENT",
    "REDACTION_AUTHOR",
    "SESSION",
    "SESSION_LIST",
    "STATE",
    "agent_conversation",
    "agent_from_metadata",
    "agent_metadata",
    "json_data",
    "message_record",
    "multi_agent_conversation",
    "session_conversation",
    "session_from_list",
    "to_session_message",
]

MESSAGE_TYPE = "strands_message"
"""The ``type`` of the message that holds one ``SessionMessage`` (under ``session_message``)."""
REDACTION_AUTHOR = "strands:redaction"
"""The author of the change (and of the entry) an ``update_message`` makes."""
SESSION_LIST = "strands:session"
"""The list holding a session's ``Session`` record; its first append claims the id."""

# Metadata keys. Every record's conversation names its kind and session; an agent's
# holds its state, conversation manager state and Strands' internal state, a
# multi-agent's its serialized state.
KIND, SESSION, AGENT, MULTI_AGENT = (
    "strands:kind",
    "strands:session",
    "strands:agent",
    "strands:multi_agent",
)
STATE, MANAGER_STATE, INTERNAL_STATE, CREATED, UPDATED = (
    "strands:state",
    "strands:conversation_manager_state",
    "strands:internal_state",
    "strands:created_at",
    "strands:updated_at",
)
_MESSAGE_FIELDS = frozenset(f.name for f in dataclasses.fields(SessionMessage))
"""What ``SessionMessage.from_dict`` keeps of a dict (it looks them up per key, slowly)."""


def session_conversation(session_id: str) -> str:
    return conversation_id("strands-session", session_id)


def agent_conversation(session_id: str, agent_id: str) -> str:
    return conversation_id("strands-agent", session_id, agent_id)


def multi_agent_conversation(session_id: str, multi_agent_id: str) -> str:
    return conversation_id("strands-multi-agent", session_id, multi_agent_id)


def json_data(value: Any, what: str) -> Any:
    """``value`` as the JSON data Strands' file repository would write and read back
    (tuples become lists), else ``InvalidMessage`` naming ``what``."""
    try:
        return json.loads(json.dumps(value, allow_nan=False, ensure_ascii=False))
    except (TypeError, ValueError) as exc:
        raise InvalidMessage(f"a Strands {what} cannot be stored as JSON") from exc


# ---------------------------------------------------------------------------- messages


def message_record(message: SessionMessage) -> dict[str, Any]:
    """The histstore message (as a dict) that stores one ``SessionMessage``: its
    ``to_dict()`` (bytes base64-encoded, as Strands encodes them) in an envelope, with
    the role of the message the agent sees (``histstore.envelopes.strands_role``)."""
    data = json_data(message.to_dict(), "message")
    return {"role": strands_role(data), "type": MESSAGE_TYPE, "session_message": data}


def to_session_message(message: Message, position: int) -> SessionMessage:
    """The ``SessionMessage`` a stored message stands for; its ``message_id`` is
    ``position``, the message's place in the agent's conversation.

    A plain histstore message that an edit put in (``{"role": "user", "content":
    "summary"}``, e.g. the summary ``histstore.compact`` made) reads as a text message:
    ``assistant`` as the assistant's, any other role as the user's, its text the
    message's indexed text, its times the time it was stored.
    """
    data = message.to_dict()
    record = data.get("session_message")
    if data.get("type") == MESSAGE_TYPE and isinstance(record, dict):
        kept = {k: v for k, v in record.items() if k in _MESSAGE_FIELDS}
        return SessionMessage(**decode_bytes_values({**kept, "message_id": position}))
    role: Literal["user", "assistant"] = "assistant" if data.get("role") == "assistant" else "user"
    stored = message.created_at.isoformat() if message.created_at is not None else ""
    return SessionMessage(
        message={"role": role, "content": [{"text": indexed_text(message) or ""}]},
        message_id=position,
        created_at=stored,
        updated_at=stored,
    )


# ---------------------------------------------------------------------------- records


def session_from_list(items: list[Any]) -> Session | None:
    """The ``Session`` of a session conversation's record list (the first item)."""
    if not items or not isinstance(items[0], dict):
        return None
    return Session.from_dict(items[0])


def agent_metadata(session_id: str, agent: SessionAgent, *, created: bool) -> dict[str, Any]:
    """The metadata keys of an agent's conversation; ``created_at`` only when ``created``
    (an update keeps the stored one)."""
    data = json_data(agent.to_dict(), "agent")
    metadata = {
        KIND: "agent",
        SESSION: session_id,
        AGENT: data["agent_id"],
        STATE: data["state"],
        MANAGER_STATE: data["conversation_manager_state"],
        INTERNAL_STATE: data["_internal_state"],
        UPDATED: data["updated_at"],
    }
    if created:
        metadata[CREATED] = data["created_at"]
    return metadata


def agent_from_metadata(metadata: Mapping[str, Any]) -> SessionAgent | None:
    """The ``SessionAgent`` an agent conversation's metadata holds; ``None`` when the
    conversation holds no agent record."""
    if metadata.get(KIND) != "agent":
        return None
    try:
        return SessionAgent.from_dict(
            {
                "agent_id": metadata[AGENT],
                "state": metadata[STATE],
                "conversation_manager_state": metadata[MANAGER_STATE],
                "_internal_state": metadata.get(INTERNAL_STATE, {}),
                "created_at": metadata[CREATED],
                "updated_at": metadata[UPDATED],
            }
        )
    except KeyError as exc:
        raise SessionException(f"the agent record {metadata.get(AGENT)!r} is incomplete") from exc
