"""The conversation ids adapters give the records they keep (an ADK session, a Strands
agent): ``kind/part/...`` with each part percent-encoded, readable while it fits
histstore's id length, else ``kind#`` and a hash of the parts."""

from __future__ import annotations

import hashlib
import json
from urllib.parse import quote

__all__ = ["ID_LIMIT", "conversation_id"]

ID_LIMIT = 255
"""The longest conversation id (and metadata key) histstore takes."""


def conversation_id(kind: str, *parts: str) -> str:
    """``kind/part/...`` (each part percent-encoded) when it fits, else a hash."""
    try:
        readable = "/".join([kind, *(quote(p, safe="") for p in parts)])
    except UnicodeEncodeError:  # a lone surrogate: only the hash can hold it
        readable = ""
    if readable and len(readable) <= ID_LIMIT:
        return readable
    digest = hashlib.sha256(json.dumps([kind, *parts]).encode("ascii")).hexdigest()
    return f"{kind}#{digest}"
