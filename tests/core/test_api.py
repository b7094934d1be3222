"""The public surface: what the package exports, and that it is typed."""

from __future__ import annotations

import inspect
from pathlib import Path

import histstore

SPEC_EXPORTS = {
    "connect",
    "Store",
    "Message",
    "Summary",
    "WriteOutcome",
    "ConversationState",
    "WindowStore",
    "with_history",
    "validate_id",
    "turns",
    "HistStoreError",
    "InvalidId",
    "InvalidMessage",
    "NotFound",
    "ConflictError",
    "WriteError",
    "CommitError",
    "DatabaseFailure",
    "WindowTooSmall",
    "SchemaError",
    "Hit",
    "SemanticIndex",
    "Conversation",
    "Entry",
    "Spliced",
    "Change",
    "Aside",
    "TurnRecord",
    "compact",
}
# Beyond the SPEC's names: the one definition of what search indexes (SPEC 12 leaves
# its name to us; the README documents it), and what ``Store.diagnostics()`` returns.
EXTRA_EXPORTS = {"indexed_text", "Diagnostics"}


def test_all_is_sorted_and_complete() -> None:
    assert histstore.__all__ == sorted(histstore.__all__)
    assert set(histstore.__all__) == SPEC_EXPORTS | EXTRA_EXPORTS
    for name in histstore.__all__:
        assert hasattr(histstore, name), name


def test_error_tree() -> None:
    for name in SPEC_EXPORTS:
        obj = getattr(histstore, name)
        if inspect.isclass(obj) and issubclass(obj, Exception):
            assert issubclass(obj, histstore.HistStoreError)
    assert issubclass(histstore.InvalidId, ValueError)
    assert issubclass(histstore.InvalidMessage, ValueError)
    assert issubclass(histstore.NotFound, LookupError)
    assert not issubclass(histstore.ConflictError, histstore.WriteError)
    assert not issubclass(histstore.DatabaseFailure, histstore.WriteError)
    for name in ("phase", "sqlstate", "transient"):
        assert name in (histstore.DatabaseFailure.__doc__ or ""), name


def test_turns_module_functions() -> None:
    for name in ("split_turns", "pending_tool_calls", "validate_pairing", "status"):
        assert callable(getattr(histstore.turns, name))


def test_package_is_typed() -> None:
    assert (Path(histstore.__file__).parent / "py.typed").is_file()


def test_store_methods_are_coroutines() -> None:
    names = [
        "read",
        "count",
        "write",
        "pop",
        "clear",
        "conversations",
        "exists",
        "load",
        "save",
        "fork",
        "add_summary",
        "summaries",
        "metadata",
        "merge_metadata",
        "list_append",
        "list_load",
        "list_len",
        "purge",
        "close",
    ]
    for name in names:
        assert inspect.iscoroutinefunction(getattr(histstore.Store, name)), name
