"""The API reference (docs/api_reference.py, pdoc) builds for every public module, without a
warning and without a public name lacking a docstring."""

from __future__ import annotations

import importlib.util
import sys
import textwrap
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("api_reference", REPO / "docs/api_reference.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_public_modules_are_found(script: ModuleType) -> None:
    modules = script.public_modules()
    for name in (
        "histstore",
        "histstore.admin",
        "histstore.checkpoints",
        "histstore.window",
        "histstore.integrations",
        "histstore.integrations.langgraph",
    ):
        assert name in modules
    assert not [m for m in modules if "._" in m or m.startswith("histstore.cli")]


def test_the_reference_builds_without_problems(script: ModuleType, tmp_path: Path) -> None:
    assert script.build(tmp_path) == []
    for name in script.public_modules():
        page = tmp_path.joinpath(*name.split(".")).with_suffix(".html")
        assert page.exists(), name
    assert "WriteOutcome" in (tmp_path / "histstore.html").read_text(encoding="utf-8")


def test_a_missing_docstring_is_a_problem(
    script: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = tmp_path / "docless"
    package.mkdir()
    (package / "__init__.py").write_text(
        textwrap.dedent(
            '''
            """A package."""
            from dataclasses import dataclass

            LIMIT = 3


            def documented() -> None:
                """Does nothing."""


            def bare() -> None:
                pass


            @dataclass
            class Point:
                """A point; ``x`` is named here."""

                x: int
                y: int

                def move(self) -> None:
                    pass
            '''
        ),
        encoding="utf-8",
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        missing = script.missing_docstrings(["docless"])
    finally:
        sys.modules.pop("docless", None)
    assert sorted(missing) == [
        "docless.LIMIT",
        "docless.Point.move",
        "docless.Point.y",
        "docless.bare",
    ]
