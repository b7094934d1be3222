"""How ADK memories map onto histstore messages, and how a search's hits are ranked and
given back as ``MemoryEntry`` values (see ``_adk_memory`` for the layout)."""

from __future__ import annotations

import hashlib
import json
import re
import unicodedata
from collections.abc import Iterable, Mapping
from datetime import datetime, timezone
from typing import Any

from google.adk.events import Event
from google.adk.memory.memory_entry import MemoryEntry
from google.genai import types
from pydantic_core import PydanticSerializationError, to_jsonable_python

from histstore import Hit, InvalidMessage

from ._record_ids import conversation_id

__all__ = [
    "RECORD",
    "RRF",
    "entry_memory",
    "event_memory",
    "fuse",
    "json_safe",
    "memory_meta",
    "memory_text",
    "owner",
    "query_words",
    "record_id",
    "session_memory",
    "to_entry",
    "unique",
]

RECORD = "adk_memory"
"""The key of a memory message that holds what ``MemoryEntry`` is made from."""
_MAX_WORDS = 16
RRF = 60  # reciprocal rank fusion constant (Cormack et al.)


def owner(app_name: str, user_id: str) -> str:
    """The store user owning an app and user's memory conversations."""
    return conversation_id("adk-memory", app_name, user_id)


def session_memory(app_name: str, user_id: str, session_id: str) -> str:
    """The conversation holding one session's memories."""
    return conversation_id("adk-memory", app_name, user_id, session_id)


def query_words(query: str) -> list[str]:
    """The query's distinct words (``\\w+``, lower case, first 16), in order."""
    words = re.findall(r"\w+", unicodedata.normalize("NFC", query).lower())
    kept = [w for w in dict.fromkeys(words) if any(ch.isalnum() for ch in w)]
    return kept[:_MAX_WORDS]


def fuse(rankings: Iterable[list[Hit]]) -> list[Hit]:
    """Reciprocal rank fusion of several rankings (ties: the earlier ranking's order)."""
    score: dict[tuple[str, int], float] = {}
    order: dict[tuple[str, int], tuple[int, int]] = {}
    found: dict[tuple[str, int], Hit] = {}
    for n, hits in enumerate(rankings):
        for rank, hit in enumerate(hits):
            key = (hit.conversation, hit.position)
            score[key] = score.get(key, 0.0) + 1.0 / (RRF + rank)
            order.setdefault(key, (n, rank))
            found.setdefault(key, hit)
    return [found[k] for k in sorted(found, key=lambda k: (-score[k], order[k]))]


def memory_text(content: types.Content | None) -> str:
    """The text a memory is found by: the text parts, thoughts left out, one per line."""
    if content is None or not content.parts:
        return ""
    return "\n".join(p.text for p in content.parts if p.text and not p.thought)


def _record(
    text: str,
    content: types.Content,
    memory_id: str,
    author: str | None,
    timestamp: str | None,
    custom_metadata: Mapping[str, Any],
) -> dict[str, Any]:
    kept = types.Content(
        role=content.role,
        parts=[types.Part(text=p.text) for p in content.parts or () if p.text and not p.thought],
    )
    speaker = content.role or ("user" if author == "user" else "model")
    role = "user" if speaker == "user" else "assistant"
    return {
        "role": role,
        "content": text,
        RECORD: {
            "id": memory_id,
            "author": author,
            "timestamp": timestamp,
            "content": kept.model_dump(mode="json", exclude_none=True),
            "custom_metadata": dict(custom_metadata),
        },
    }


def event_memory(
    event: Event, session_id: str | None, extra: Mapping[str, Any] | None
) -> dict[str, Any] | None:
    """The memory message of an event; ``None`` when it has no text."""
    text = memory_text(event.content)
    if not text or event.content is None:
        return None
    memory_id = event.id or _digest(event.author, event.timestamp, event.content)
    when = datetime.fromtimestamp(event.timestamp, timezone.utc).isoformat()
    meta: dict[str, Any] = {**(extra or {}), "event_id": memory_id}
    if session_id:
        meta["session_id"] = session_id
    return _record(text, event.content, memory_id, event.author, when, meta)


def entry_memory(entry: MemoryEntry, extra: Mapping[str, Any]) -> dict[str, Any] | None:
    """The memory message of an explicit ``MemoryEntry``; ``None`` when it has no text."""
    text = memory_text(entry.content)
    if not text:
        return None
    memory_id = entry.id or _digest(entry.author, entry.timestamp, entry.content)
    meta = {**extra, **json_safe(entry.custom_metadata)}
    return _record(text, entry.content, memory_id, entry.author, entry.timestamp, meta)


def to_entry(hit: Hit) -> MemoryEntry | None:
    """The ``MemoryEntry`` of a memory message; ``None`` for any other message."""
    data = hit.message.to_dict().get(RECORD)
    if not isinstance(data, dict) or not isinstance(data.get("content"), dict):
        return None
    return MemoryEntry(
        content=types.Content.model_validate(data["content"]),
        custom_metadata=dict(data.get("custom_metadata") or {}),
        id=data.get("id"),
        author=data.get("author"),
        timestamp=data.get("timestamp"),
    )


def record_id(data: Mapping[str, Any]) -> str | None:
    record = data.get(RECORD)
    return record.get("id") if isinstance(record, dict) else None


def unique(records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """``records`` without a second one of an id (the first stays)."""
    seen: set[str] = set()
    out = []
    for r in records:
        if r[RECORD]["id"] not in seen:
            seen.add(r[RECORD]["id"])
            out.append(r)
    return out


def memory_meta(
    kind: str, app_name: str, user_id: str, session_id: str | None = None
) -> dict[str, Any]:
    meta = {"adk:kind": f"memory-{kind}", "adk:app": app_name, "adk:user": user_id}
    if session_id is not None:
        meta["adk:session"] = session_id
    return meta


def _digest(author: str | None, timestamp: object, content: types.Content) -> str:
    payload = json.dumps(
        [author, timestamp, content.model_dump(mode="json", exclude_none=True)], sort_keys=True
    )
    return hashlib.sha256(payload.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def json_safe(values: Mapping[str, object]) -> dict[str, Any]:
    try:
        safe: dict[str, Any] = to_jsonable_python(dict(values))
    except (PydanticSerializationError, TypeError, ValueError) as exc:
        raise InvalidMessage("memory metadata cannot be stored as JSON") from exc
    return safe


def id_digest(memory_id: str) -> str:
    """A memory id as a fixed-length name part (ids may be long or hold any character)."""
    return hashlib.sha256(memory_id.encode("utf-8", "surrogatepass")).hexdigest()
