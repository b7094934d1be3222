"""The layering written down in the README is what CI checks (import-linter), and the
check covers every private module."""

from __future__ import annotations

import re

from helpers import REPO

PACKAGE = REPO / "histstore"


EDGES = ("cli", "integrations")  # the contract's sources: their own modules are theirs


def _private_modules() -> set[str]:
    """Every private name the package has: a top-level module or folder whose name
    starts with ``_``, and a private module of a public folder (``admin._queries``)."""
    found = set()
    for path in PACKAGE.iterdir():
        name = path.stem if path.suffix == ".py" else path.name
        if name.startswith("__") or not (path.suffix == ".py" or (path / "__init__.py").is_file()):
            continue
        if name.startswith("_"):
            found.add(f"histstore.{name}")
        elif path.is_dir() and name not in EDGES:
            found |= {
                f"histstore.{name}.{p.stem}"
                for p in path.glob("_*.py")
                if not p.stem.startswith("__")
            }
    return found


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
        "Layers: edges, public helpers, transfer, facade, programs, storage, editable value, core",
        "layers",
    )
    named = {m.strip() for layer in layers for m in re.split(r"[:|]", layer)}
    modules = {p.stem for p in PACKAGE.glob("*.py") if not p.stem.startswith("__")}
    packages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    assert named == modules | packages


def test_few_modules_at_the_top() -> None:
    """The package's top level holds the public modules, the facade and ``connect()``;
    everything else lives in a subsystem folder."""
    assert len(list(PACKAGE.glob("*.py"))) <= 12


def test_modules_stay_small() -> None:
    """A module past ~400 lines holds several responsibilities (STYLE 7)."""
    sizes = {
        str(p.relative_to(REPO)): len(p.read_text().splitlines()) for p in PACKAGE.rglob("*.py")
    }
    assert {name: n for name, n in sizes.items() if n > 450} == {}
