"""The rules for conversation ids, list names and users."""

from __future__ import annotations

import itertools
import os
import re
import secrets

from .._errors import InvalidId

__all__ = ["MAX_ID_LENGTH", "new_key", "validate_id"]

MAX_ID_LENGTH = 255

# Unicode category Cc is exactly U+0000-U+001F and U+007F-U+009F; U+D800-U+DFFF are
# surrogates, which a well-formed str only holds when they are lone.
_FORBIDDEN = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")


def validate_id(s: object, *, what: str = "conversation id") -> str:
    """Return ``s`` when it is a valid id, else raise ``InvalidId``.

    A valid id is a ``str`` of 1 to 255 characters with no control characters (Unicode
    category Cc, NUL included), no lone surrogates, and no leading or trailing whitespace.
    """
    if not isinstance(s, str):
        raise InvalidId(f"{what} must be a str, not {type(s).__name__}")
    if not 0 < len(s) <= MAX_ID_LENGTH:
        raise InvalidId(f"{what} must have 1 to {MAX_ID_LENGTH} characters, not {len(s)}")
    if _FORBIDDEN.search(s) is not None:
        raise InvalidId(f"{what} holds a control character or a lone surrogate")
    if s.strip() != s:
        raise InvalidId(f"{what} has leading or trailing whitespace")
    return s


def _draw_prefix() -> None:
    global _prefix, _counter
    _prefix = secrets.token_urlsafe(16)  # 22 characters: 10 fewer than hex, per write row
    _counter = itertools.count()


_prefix = ""
_counter = itertools.count()
_draw_prefix()
if hasattr(os, "register_at_fork"):  # not on Windows, where nothing forks
    os.register_at_fork(after_in_child=_draw_prefix)


def new_key() -> str:
    """An idempotency key no other batch has, in any process: 128 random bits drawn once
    per process (and again in a forked child, as 22 characters of URL-safe base64)
    followed by a counter (hexadecimal).

    A random UUID per write costs 2 us and a system call that gives the GIL up, to the
    connections' threads, in the middle of the event loop's work on a write.
    """
    return f"{_prefix}{next(_counter):x}"
