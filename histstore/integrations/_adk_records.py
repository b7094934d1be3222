"""How ADK records map onto histstore: the conversation ids of sessions and of app and user
state, state keys and values as conversation metadata, events as messages, and the marker
that says which stored length a session value reflects."""

from __future__ import annotations

import hashlib
import json
import string
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

from google.adk.events import Event
from google.adk.sessions import Session, State
from pydantic_core import PydanticSerializationError, to_jsonable_python

from histstore import InvalidMessage, Message, indexed_text
from histstore.envelopes import adk_role

from . import _unwrap
from ._record_ids import ID_LIMIT, conversation_id

__all__ = [
    "APP",
    "CREATED_LIST",
    "EVENT_TYPE",
    "KIND",
    "SESSION",
    "UPDATED",
    "USER",
    "app_conversation",
    "event_data",
    "event_key",
    "event_record",
    "json_safe",
    "marker_position",
    "merged_state",
    "session_conversation",
    "set_marker",
    "split_state",
    "state_from_metadata",
    "state_metadata",
    "state_metadata_key",
    "to_event",
    "to_events",
    "user_conversation",
]

EVENT_TYPE = "adk_event"
"""The ``type`` of the message that holds one ADK event."""
_MARKER = "histstore:"
# ADK's session services keep their stale-session marker in this private attribute of
# ``Session`` (a pydantic private attribute; ADK offers no public accessor). Named once
# here and read and set only by ``marker_position`` and ``set_marker``.
_ADK_MARKER_ATTRIBUTE = "_storage_update_marker"

# The keys of a conversation's metadata that say which ADK record it is.
KIND, APP, USER, SESSION, UPDATED = (
    "adk:kind",
    "adk:app",
    "adk:user",
    "adk:session",
    "adk:updated",
)
CREATED_LIST = "adk:created"
"""The metadata list whose first append claims a session id."""
# State keys are kept readable where they can be: everything printable but "%" and
# the space stays as it is; the rest is percent-encoded (UTF-8), so the metadata key
# never has the control characters or edge whitespace that histstore's key rules forbid.
_KEY_SAFE = "".join(c for c in string.punctuation if c != "%")


def session_conversation(app_name: str, user_id: str, session_id: str) -> str:
    return conversation_id("adk-session", app_name, user_id, session_id)


def app_conversation(app_name: str) -> str:
    return conversation_id("adk-app", app_name)


def user_conversation(app_name: str, user_id: str) -> str:
    return conversation_id("adk-user", app_name, user_id)


def state_metadata_key(key: str) -> str:
    try:
        readable = "state:" + quote(key, safe=_KEY_SAFE)
    except UnicodeEncodeError:
        readable = ""
    if readable and len(readable) <= ID_LIMIT:
        return readable
    return "state#" + hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


def json_safe(values: Mapping[str, Any]) -> dict[str, Any]:
    """State values as JSON data (as ADK's database service stores them), else InvalidMessage."""
    try:
        safe: dict[str, Any] = to_jsonable_python(dict(values))
        json.dumps(safe, allow_nan=False, ensure_ascii=False).encode("utf-8")
    except (PydanticSerializationError, TypeError, ValueError) as exc:
        raise InvalidMessage("an ADK state value cannot be stored as JSON") from exc
    return safe


def split_state(state: Mapping[str, Any] | None) -> tuple[dict[str, Any], ...]:
    """``(app, user, session)`` state from ADK's prefixed keys; ``temp:`` keys are dropped."""
    app: dict[str, Any] = {}
    user: dict[str, Any] = {}
    session: dict[str, Any] = {}
    for key, value in (state or {}).items():
        if key.startswith(State.APP_PREFIX):
            app[key.removeprefix(State.APP_PREFIX)] = value
        elif key.startswith(State.USER_PREFIX):
            user[key.removeprefix(State.USER_PREFIX)] = value
        elif not key.startswith(State.TEMP_PREFIX):
            session[key] = value
    return json_safe(app), json_safe(user), json_safe(session)


def state_metadata(state: Mapping[str, Any]) -> dict[str, Any]:
    # Each value is stored as [key, value]: the original key survives any encoding, and a
    # None value (which merge_metadata reads as "remove") stays a value.
    return {state_metadata_key(k): [k, v] for k, v in state.items()}


def state_from_metadata(metadata: Mapping[str, Any]) -> dict[str, Any]:
    return {
        pair[0]: pair[1] for key, pair in metadata.items() if key.startswith(("state:", "state#"))
    }


def merged_state(
    session: Mapping[str, Any], app: Mapping[str, Any], user: Mapping[str, Any]
) -> dict[str, Any]:
    merged = dict(session)
    merged.update({State.APP_PREFIX + k: v for k, v in app.items()})
    merged.update({State.USER_PREFIX + k: v for k, v in user.items()})
    return merged


def event_record(event: Event) -> dict[str, Any]:
    """The histstore message (as a dict) that stores one event: the event's JSON in an
    envelope, with the event's role (``histstore.envelopes.adk_role``) when it has content."""
    data = event.model_dump(mode="json", exclude_none=True)
    role = adk_role(data)
    envelope = {"type": EVENT_TYPE, "event": data}
    return envelope if role is None else {"role": role, **envelope}


def event_key(record: dict[str, Any]) -> str:
    """The idempotency key of an event record: a digest of the event (not of its role, so
    a record stored before roles were added has the key of the same event stored now)."""
    canonical = json.dumps(
        {"type": EVENT_TYPE, "event": record["event"]},
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=True,
    )
    return "adk-event:" + hashlib.sha256(canonical.encode("ascii")).hexdigest()


def event_data(message: Message, agent: str = "model") -> dict[str, Any]:
    """The event JSON of a stored message, else ``InvalidMessage``.

    An event record gives the event it holds (its role is ignored). A plain histstore
    message that an edit put in (``{"role": "user", "content": "summary"}``, e.g. the
    summary ``histstore.compact`` made) reads as a text event: an ``assistant`` message
    as the model's (authored by the message's ``name``, else ``agent``), any other as
    the user's, its text the message's indexed text, its id derived from the entry id
    and its timestamp the time it was stored.
    """
    data = message.to_dict()
    role = data.get("role")
    if data.get("type") == EVENT_TYPE or not isinstance(role, str):
        return _unwrap(message, EVENT_TYPE, "event", "an ADK session is not an ADK event record")
    model = role == "assistant"
    name = data.get("name")
    created = message.created_at
    return {
        "id": f"histstore-entry-{message.entry_id}",
        "invocation_id": "",
        "author": (name if isinstance(name, str) and name else agent) if model else "user",
        "timestamp": created.timestamp() if created is not None else 0.0,
        "content": {
            "role": "model" if model else "user",
            "parts": [{"text": indexed_text(message) or ""}],
        },
    }


def to_event(message: Message, agent: str = "model") -> Event:
    return Event.model_validate(event_data(message, agent))


def to_events(messages: list[Message]) -> list[Event]:
    """The events of stored messages; a plain assistant message among them is authored
    by the agent that authored the newest model event they hold."""
    agent = "model"
    for message in reversed(messages):
        data = message.to_dict()
        event = data.get("event") if data.get("type") == EVENT_TYPE else None
        if isinstance(event, dict) and event.get("author") not in (None, "user"):
            agent = str(event["author"])
            break
    return [to_event(m, agent) for m in messages]


def marker_position(session: Session) -> int | None:
    """The stored length a session value reflects, when this service loaded it."""
    marker: str | None = getattr(session, _ADK_MARKER_ATTRIBUTE, None)
    if marker is None or not marker.startswith(_MARKER):
        return None
    try:
        return int(marker.removeprefix(_MARKER))
    except ValueError:
        return None


def set_marker(session: Session, length: int) -> None:
    setattr(session, _ADK_MARKER_ATTRIBUTE, f"{_MARKER}{length}")
