"""JSON encoding of stored values: strict, lossless, and checked before anything is written."""

from __future__ import annotations

import base64
import hashlib
import json
import re
from collections.abc import Iterable
from itertools import accumulate
from typing import Any

from .._errors import InvalidMessage

__all__ = [
    "MAX_NESTING",
    "canonical",
    "canonical_digest",
    "check_text",
    "decode",
    "digest",
    "encode",
    "encode_decoded",
    "key_digest",
    "key_from_stored",
    "key_to_stored",
    "looks_large",
    "nesting_exceeds",
    "same_digest",
]

_encoder = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))
_canonical = json.JSONEncoder(
    ensure_ascii=False, allow_nan=False, separators=(",", ":"), sort_keys=True
)
decode = json.loads

MAX_NESTING = 512
"""How deeply a stored JSON value may nest (a message object is level 1, a list in it
level 2, ...). The store's own limit, the same on every Python: how deep ``json`` itself
can go depends on the interpreter and on the caller's stack, and stays well above this."""

_OPENERS = ("[", "{")
_BRACKETS_ONLY = re.compile(r'"(?:[^"\\]|\\.)*"|[^\[\]{}]+')
_STEP = {ord("["): 1, ord("{"): 1, ord("]"): -1, ord("}"): -1}


def nesting_exceeds(text: str, limit: int = MAX_NESTING) -> bool:
    """Whether the JSON ``text`` nests deeper than ``limit`` (arrays and objects).

    Cheap for the common text: one that opens at most ``limit`` brackets in all cannot
    nest deeper (brackets inside strings only make that count larger). Otherwise the
    strings are dropped and the brackets left are counted in order.
    """
    if sum(text.count(b) for b in _OPENERS) <= limit:
        return False
    brackets = _BRACKETS_ONLY.sub("", text)
    return max(accumulate(map(_STEP.__getitem__, map(ord, brackets))), default=0) > limit


def _too_deep(what: str) -> InvalidMessage:
    return InvalidMessage(f"{what} is nested more than {MAX_NESTING} levels deep")


def encode(value: object, *, what: str = "value") -> tuple[str, Any, int]:
    """Encode ``value`` as JSON text; return the text, a private decoded copy, its UTF-8 size.

    Raises ``InvalidMessage`` unless the value survives the round trip equal: NaN and
    infinities, lone surrogates, non-string object keys, tuples and anything ``json``
    cannot serialize are refused, and so is nesting deeper than ``MAX_NESTING``. The
    error never quotes the value.
    """
    try:
        text = _encoder.encode(value)
        size = len(text) if text.isascii() else len(text.encode("utf-8"))
        if type(value) is dict and _flat(value):
            return text, dict(value), size
        too_deep = nesting_exceeds(text)
        copy = None if too_deep else json.loads(text)
    except RecursionError:
        raise _too_deep(what) from None
    except (TypeError, ValueError) as exc:
        raise InvalidMessage(f"{what} is not storable JSON ({type(exc).__name__})") from None
    if too_deep:
        raise _too_deep(what)
    if copy != value:
        raise InvalidMessage(f"{what} does not survive a JSON round trip unchanged")
    return text, copy, size


_SCALARS = frozenset((str, int, float, bool, type(None)))
"""Types whose JSON text decodes to an equal value of the same type (the encoder has
already refused non-finite floats and, by the UTF-8 size, lone surrogates)."""


def _flat(value: dict[Any, Any]) -> bool:
    """Whether ``value`` is an object of plain scalars under string keys (most chat
    messages): its round trip is then the identity, and a shallow copy is a private
    decoded copy, without decoding the text again."""
    scalars = _SCALARS
    return all(type(k) is str and type(v) in scalars for k, v in value.items())


def encode_decoded(value: object, *, what: str = "value") -> tuple[str, int]:
    """``encode`` for a value ``json.loads`` made: the text and its UTF-8 size.

    Such a value is made of JSON types only, so its round trip cannot change it and is
    not checked; what can still be refused is what the encoder refuses (infinities from
    huge literals, lone surrogates from ``\\ud800`` escapes) and nesting deeper than
    ``MAX_NESTING``.
    """
    try:
        text = _encoder.encode(value)
        size = len(text) if text.isascii() else len(text.encode("utf-8"))
    except RecursionError:
        raise _too_deep(what) from None
    except (TypeError, ValueError) as exc:
        raise InvalidMessage(f"{what} is not storable JSON ({type(exc).__name__})") from None
    if nesting_exceeds(text):
        raise _too_deep(what)
    return text, size


def digest(texts: Iterable[str]) -> str:
    """The digest of a batch (a sequence of JSON texts, order mattering) its write record
    keeps: the first 128 bits of a SHA-256 over them, in 22 characters of unpadded
    base64url. Until revision c2e4a6f8b0d1 the record kept the whole SHA-256 in 64 hex
    digits; ``same_digest`` compares either."""
    h = hashlib.sha256()
    for t in texts:
        b = t.encode("utf-8")
        h.update(len(b).to_bytes(8, "big"))
        h.update(b)
    return _short(h.digest())


def _short(sha: bytes) -> str:
    return base64.urlsafe_b64encode(sha[:16]).rstrip(b"=").decode("ascii")


def same_digest(stored: str, digest_: str) -> bool:
    """Whether a write record's ``stored`` digest is ``digest_`` (a ``digest``): the
    short form, or the 64 hex digits an older histstore stored."""
    if len(stored) != 64:
        return stored == digest_
    try:
        return _short(bytes.fromhex(stored)) == digest_
    except ValueError:
        return False


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


def check_text(value: object, *, what: str) -> str:
    """A string the databases store in a text column unchanged, else ``InvalidMessage``.

    Such text has no NUL (Postgres text cannot hold one) and no lone surrogate (it must
    encode as UTF-8). The error never quotes the value.
    """
    if not isinstance(value, str):
        raise InvalidMessage(f"{what} must be a str, not {type(value).__name__}")
    if "\x00" in value:
        raise InvalidMessage(f"{what} holds a NUL character, which text columns cannot store")
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidMessage(f"{what} holds a lone surrogate") from None
    return value


# Metadata keys are any strings, NUL included, but sit in a text column: NUL and the
# escape character itself are written as two-character escapes. Keys without either
# (every key stored before keys could hold control characters) are stored unchanged.
# A stored key has no length limit; the table is keyed and indexed by its digest.
_ESCAPE, _ESCAPED_ESCAPE, _ESCAPED_NUL = "\x01", "\x01\x01", "\x01\x02"
_UNESCAPE = re.compile("\x01(.)", re.DOTALL)


def key_to_stored(key: str) -> str:
    """The text-column form of a metadata key (see ``key_from_stored``)."""
    if "\x00" not in key and _ESCAPE not in key:
        return key
    return key.replace(_ESCAPE, _ESCAPED_ESCAPE).replace("\x00", _ESCAPED_NUL)


def key_from_stored(stored: str) -> str:
    """The metadata key a stored key stands for."""
    if _ESCAPE not in stored:
        return stored
    return _UNESCAPE.sub(lambda m: _ESCAPE if m.group(1) == _ESCAPE else "\x00", stored)


def key_digest(stored: str) -> str:
    """The SHA-256 hex digest of a stored metadata key (its UTF-8 bytes): 64 characters
    whatever the key's length, what the metadata table's primary key and filter index
    hold in place of the key itself."""
    return hashlib.sha256(stored.encode("utf-8")).hexdigest()
