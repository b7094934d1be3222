"""Build the API reference (HTML, with pdoc) from the docstrings of histstore's public modules.

    python docs/api_reference.py [--output docs/api]

Writes one page per public module into the output folder (``docs/api/`` by default, not
committed) and exits 1, listing the problems, when pdoc warned or a public name has no
docstring. Public: ``histstore`` and every module under it whose dotted name has no
part starting with ``_``, found by walking the package (so a new module is covered
without editing this file), but the command line (``histstore.cli``, documented in
docs/command-line.md). The adapters import their frameworks: install the ``test`` extra.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import re
import sys
import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path

import pdoc
import pdoc.doc
import pdoc.extract
import pdoc.render

OUTPUT = Path(__file__).resolve().parent / "api"
NOT_API = ("histstore.cli",)
"""Public modules that are programs, not a Python API."""


def public_modules(package: str = "histstore") -> list[str]:
    """``package`` and its public submodules, by name, sorted."""
    root = importlib.import_module(package)
    found = [package]
    for info in pkgutil.walk_packages(root.__path__, prefix=f"{package}."):
        parts = info.name.split(".")
        if any(p.startswith("_") for p in parts) or info.name.startswith(NOT_API):
            continue
        found.append(info.name)
    return sorted(found)


def _undocumented(doc: pdoc.doc.Namespace[object]) -> Iterator[str]:
    """Public members of ``doc`` (a module or class) without a docstring. A member taken
    from a base class is checked where it is defined; a class's field counts as
    documented when the class's docstring names it."""
    for member in doc.members.values():
        if member.name.startswith("_") or isinstance(member, pdoc.doc.Module):
            continue
        if isinstance(doc, pdoc.doc.Class):
            owner = member.taken_from[1].rpartition(".")[0]
            if owner != doc.obj.__qualname__:
                continue  # inherited
            if isinstance(member, pdoc.doc.Variable) and re.search(
                rf"\b{re.escape(member.name)}\b", doc.docstring
            ):
                continue
        if not member.docstring.strip():
            yield member.fullname
        if isinstance(member, pdoc.doc.Class):
            yield from _undocumented(member)


def missing_docstrings(modules: Iterable[str]) -> list[str]:
    """Every public name of ``modules`` (the module itself included) with no docstring."""
    missing: list[str] = []
    for name in modules:
        module = pdoc.doc.Module.from_name(name)
        if not module.docstring.strip():
            missing.append(name)
        missing.extend(m for m in _undocumented(module) if m not in missing)
    return missing


def build(output: Path, package: str = "histstore") -> list[str]:
    """Write the reference of ``package`` and its public submodules into ``output``; the
    problems found: pdoc's warnings and public names without a docstring."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        modules = public_modules(package)
        specs: list[str] = []
        covered: set[str] = set()
        for name in modules:  # pdoc adds a package's submodules named in its __all__ itself
            if name not in covered:
                specs.append(name)
                covered.update(pdoc.extract.walk_specs([name]))
        pdoc.render.configure(docformat="google", show_source=False)
        pdoc.pdoc(*specs, output_directory=output)
        missing = missing_docstrings(modules)
    return [f"pdoc warned: {w.message}" for w in caught] + [f"no docstring: {m}" for m in missing]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--output", "-o", type=Path, default=OUTPUT, help="default: docs/api")
    args = parser.parse_args(argv)
    problems = build(args.output)
    for problem in problems:
        print(problem, file=sys.stderr)
    if problems:
        return 1
    print(f"API reference: {args.output / 'index.html'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
