"""A migration revision never runs today's code: of ``histstore`` it imports only the
revision helpers (``ALLOWED``), which decide nothing about what a row holds. A revision
that needs a rule about stored data carries its own copy, as the rule stood when the
revision was written, or does it in SQL (docs/schema-and-migrations.md)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from histstore._storage import migrations as _migrations
from histstore._storage import revisions as _revisions

ALLOWED = frozenset({"histstore._storage.revisions"})
"""What a revision may import of ``histstore``: where the tables are placed, the
older-writer guards' message, the error type a revision refuses with."""

HELPERS_MAY_IMPORT = frozenset({"histstore._errors"})
"""What the helpers themselves may import of ``histstore``: the error types."""

VERSIONS = sorted((_migrations.scripts_dir() / "versions").glob("*.py"))


def imported(source: str, module: str | None = None) -> set[str]:
    """Every module (or module attribute: ``from m import n`` gives ``m.n``) that
    ``source`` imports, anywhere in it; ``module``: its dotted name, for relative imports;
    a dynamic import (``importlib``, ``__import__``) counts as ``histstore`` itself."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                assert module is not None, "a relative import in a revision"
                parts = module.split(".")[: -node.level]
                base = ".".join([*parts, base] if base else parts)
            found.update(f"{base}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Name) and node.id == "__import__":
            found.add("histstore")
    if "importlib" in {name.split(".")[0] for name in found}:
        found.add("histstore")
    return found


def not_allowed(source: str, allowed: frozenset[str], module: str | None = None) -> list[str]:
    """The imports of ``histstore`` in ``source`` that are not in ``allowed`` (nor a
    name a module of ``allowed`` holds)."""
    return sorted(
        name
        for name in imported(source, module)
        if name.split(".")[0] == "histstore"
        and name not in allowed
        and name.rpartition(".")[0] not in allowed
    )


@pytest.mark.parametrize("path", VERSIONS, ids=lambda p: p.name.split("_")[0])
def test_a_revision_imports_only_the_revision_helpers(path: Path) -> None:
    assert not_allowed(path.read_text(encoding="utf-8"), ALLOWED) == []


def test_the_revision_helpers_import_only_the_error_types() -> None:
    source = Path(_revisions.__file__).read_text(encoding="utf-8")
    assert not_allowed(source, HELPERS_MAY_IMPORT, module=_revisions.__name__) == []
    assert _revisions.__name__ in ALLOWED


def test_the_check_finds_runtime_code() -> None:
    """What revision f3b8d6a2c915 imported until it had its own rules, and the other
    ways of reaching runtime code, are found; the helpers are not."""
    runtime = (
        "import json\n"
        "from alembic import op\n"
        "from histstore._storage.revisions import placed_schema\n"
        "from histstore._ops.text_search import as_written\n"
        "from histstore._core import codec\n"
        "import histstore.envelopes\n"
        "def upgrade():\n"
        "    from histstore import _errors\n"
    )
    assert not_allowed(runtime, ALLOWED) == [
        "histstore._core.codec",
        "histstore._errors",
        "histstore._ops.text_search.as_written",
        "histstore.envelopes",
    ]
    assert not_allowed("import importlib\n", ALLOWED) == ["histstore"]
    assert not_allowed("m = __import__('histstore._core')\n", ALLOWED) == ["histstore"]
    assert not_allowed("from histstore._storage import revisions\n", ALLOWED) == []
    assert not_allowed("from . import rows\n", ALLOWED, module="histstore._storage.x") == [
        "histstore._storage.rows"
    ]
    assert not_allowed("from .._ops import x\n", ALLOWED, module="histstore._storage.y") == [
        "histstore._ops.x"
    ]
    assert VERSIONS  # the scripts are where the check looks
