"""The layering written down in the README is what CI checks (import-linter), and the
check covers every private module."""

from __future__ import annotations

import re

from helpers import REPO

PACKAGE = REPO / "histstore"


def _private_modules() -> set[str]:
    return {f"histstore.{p.stem}" for p in PACKAGE.glob("_*.py") if not p.stem.startswith("__")}


def _contract_list(name: str, key: str) -> set[str]:
    text = (REPO / "pyproject.toml").read_text()
    block = text[text.index(f'name = "{name}"') :]
    block = block[: block.index("[[", 1)] if "[[" in block[1:] else block
    found = re.search(rf"{key} = \[(.*?)\]", block, re.S)
    assert found is not None
    return set(re.findall(r'"([^"]+)"', found.group(1)))


def test_the_edges_contract_names_every_private_module() -> None:
    forbidden = _contract_list(
        "The command line and the adapters use public names only", "forbidden_modules"
    )
    assert forbidden == _private_modules()


def test_every_module_has_a_layer() -> None:
    layers = _contract_list(
        "Layers: edges, public helpers, facade, parts, statements, executor, core", "layers"
    )
    named = {m.strip() for layer in layers for m in re.split(r"[:|]", layer)}
    modules = {p.stem for p in PACKAGE.glob("*.py") if not p.stem.startswith("__")}
    packages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    assert named == modules | packages


def test_modules_stay_small() -> None:
    """A module past ~400 lines holds several responsibilities (STYLE 7)."""
    sizes = {
        str(p.relative_to(REPO)): len(p.read_text().splitlines()) for p in PACKAGE.rglob("*.py")
    }
    assert {name: n for name, n in sizes.items() if n > 450} == {}
