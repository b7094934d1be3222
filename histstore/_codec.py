"""JSON encoding of stored values: strict, lossless, and checked before anything is written."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from typing import Any

from ._errors import InvalidMessage

__all__ = ["canonical", "canonical_digest", "decode", "digest", "encode", "looks_large"]

_encoder = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))
_canonical = json.JSONEncoder(
    ensure_ascii=False, allow_nan=False, separators=(",", ":"), sort_keys=True
)
decode = json.loads


def encode(value: object, *, what: str = "value") -> tuple[str, Any, int]:
    """Encode ``value`` as JSON text; return the text, a private decoded copy, its UTF-8 size.

    Raises ``InvalidMessage`` unless the value survives the round trip equal: NaN and
    infinities, lone surrogates, non-string object keys, tuples and anything ``json``
    cannot serialize are refused. The error never quotes the value.
    """
    try:
        text = _encoder.encode(value)
        size = len(text) if text.isascii() else len(text.encode("utf-8"))
        copy = json.loads(text)
    except (TypeError, ValueError, RecursionError) as exc:
        raise InvalidMessage(f"{what} is not storable JSON ({type(exc).__name__})") from None
    if copy != value:
        raise InvalidMessage(f"{what} does not survive a JSON round trip unchanged")
    return text, copy, size


def digest(texts: Iterable[str]) -> str:
    """A SHA-256 hex digest over a sequence of JSON texts (order matters)."""
    h = hashlib.sha256()
    for t in texts:
        b = t.encode("utf-8")
        h.update(len(b).to_bytes(8, "big"))
        h.update(b)
    return h.hexdigest()


def canonical(value: object) -> str:
    """JSON text of a storable value with object keys sorted: equal values, equal text."""
    return _canonical.encode(value)


def canonical_digest(value: object) -> str:
    """Digest of a JSON value that ignores object key order (for equality lookups)."""
    return hashlib.sha256(canonical(value).encode("utf-8")).hexdigest()


def looks_large(values: Iterable[object], *, budget: int = 1 << 16, nodes: int = 2000) -> bool:
    """Cheaply tell whether encoding ``values`` is worth moving off the event loop.

    Walks at most ``nodes`` containers and strings; true when that walk runs out or the
    strings seen add up to more than ``budget`` characters.
    """
    stack: list[object] = list(values)
    size = 0
    while stack:
        nodes -= 1
        if nodes < 0:
            return True
        v = stack.pop()
        if isinstance(v, str):
            size += len(v)
        elif isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, (list, tuple)):
            stack.extend(v)
        elif isinstance(v, (bytes, bytearray)):
            size += len(v)
        if size > budget:
            return True
    return False
