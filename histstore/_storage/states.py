"""The states of the storage layer's concurrency objects, and the one check of their
moves: a move its object's table does not allow raises (as asyncpg's pool does), so
that a broken invariant fails where it breaks, not later as a hang.

The tables are in docs/architecture.md ("The write path's objects and their states")."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

__all__ = ["InvalidTransition", "transition"]

S = TypeVar("S", bound=str)


class InvalidTransition(RuntimeError):
    """A concurrency object was asked to move between states its table does not join
    (a bug in the storage layer, never the caller's)."""


def transition(current: S, new: S, moves: Mapping[str, tuple[str, ...]], name: str) -> S:
    """``new``, when ``moves[current]`` allows it; else raise ``InvalidTransition``."""
    if new not in moves[current]:
        raise InvalidTransition(f"{name}: no move from {current!r} to {new!r}")
    return new
