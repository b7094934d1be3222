"""Every fenced block of README.md, docs/*.md and bench/HISTORY.md is run
(docs/deploying-postgres.md has its own test, ``test_docs_deploying``).

Each page is split into fenced blocks; by the block's language:

* ``python``: executed as written, in an empty temporary directory (so ``"chat.db"`` is a
  fresh SQLite file) with ``HISTSTORE_URL`` pointing at another fresh file. Top-level
  ``await`` is allowed (as in ``python -m asyncio``); a block that awaits runs in its own
  event loop, one that does not runs outside any loop. The framework extras are part of
  the ``test`` extra, so the adapter blocks run too: nothing is skipped.
* ``sh``: the README's two newcomer commands (venv, ``pip install``, then a command) are
  checked for an install target that ``pyproject.toml`` defines, and their command is
  run with this virtualenv's programs (``histstore`` as ``histstore.cli.main`` in this
  process; the test command collects this file only: the suite is not run from inside
  itself). Any other ``sh`` block may run only
  ``histstore``; its commands run in this process (``histstore.cli.main``), in order, in
  the temporary directory; each must exit 0.
* ``text``: output or a synopsis, not run; every ``histstore SUBCOMMAND --option`` it
  names must exist in the command's ``--help``.

A block of any other language (or none), an indented fence or an unclosed one fails
``test_every_block_is_handled``.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import inspect
import io
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
OWN_TEST = {"deploying-postgres.md"}
"""Pages with a test of their own."""
PAGES = [
    REPO / "README.md",
    *sorted(p for p in (REPO / "docs").glob("*.md") if p.name not in OWN_TEST),
    REPO / "bench" / "HISTORY.md",
]
LANGUAGES = ("python", "sh", "text")
BIN = Path(sys.executable).parent
FENCE = re.compile(r"^(\s*)```(.*)$")
INSTALL = re.compile(r"^python3 -m venv \.venv && \.venv/bin/pip install (?:-q )?(.+?) && (.+)$")
COMMAND_LINE = re.compile(r"^(?:\w+=\$\()?histstore\b")


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    language: str
    code: str

    @property
    def name(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    """The page's fenced blocks; raises ``ValueError`` for an indented or unclosed fence."""
    found: list[Block] = []
    open_at: tuple[int, str] | None = None
    body: list[str] = []
    for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
        match = FENCE.match(line)
        if not match:
            if open_at is not None:
                body.append(line)
            continue
        if match.group(1):
            raise ValueError(f"{page.name}:{number}: an indented fence")
        if open_at is None:
            open_at, body = (number, match.group(2).strip()), []
        elif match.group(2).strip():
            raise ValueError(f"{page.name}:{number}: a fence opens inside a block")
        else:
            found.append(Block(page, open_at[0], open_at[1], "\n".join(body) + "\n"))
            open_at = None
    if open_at is not None:
        raise ValueError(f"{page.name}:{open_at[0]}: an unclosed fence")
    return found


def all_blocks(language: str) -> list[Block]:
    return [b for page in PAGES for b in blocks(page) if b.language == language]


def by_name(found: list[Block]) -> pytest.MarkDecorator:
    return pytest.mark.parametrize("block", found, ids=[b.name for b in found])


def test_every_block_is_handled() -> None:
    assert REPO / "README.md" in PAGES
    assert len(PAGES) > 1
    for page in PAGES:
        for block in blocks(page):
            assert block.language in LANGUAGES, f"{block.name}: no test runs {block.language!r}"


def test_the_parser_refuses_what_it_cannot_run(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    for text in ("```python\nx = 1\n", "text\n  ```python\n  x = 1\n  ```\n"):
        page.write_text(text, encoding="utf-8")
        with pytest.raises(ValueError, match="fence"):
            blocks(page)
    page.write_text("```js\nx\n```\n", encoding="utf-8")
    assert [b.language for b in blocks(page)] == ["js"]


def anchor(heading: str) -> str:
    """GitHub's anchor for a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(REPO)) for p in PAGES])
def test_links_resolve(page: Path) -> None:
    """Every relative link names a file that exists, and a heading in it when it has ``#``."""
    text = page.read_text(encoding="utf-8")
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"\w+://", target):
            continue
        path, _, fragment = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        assert linked.exists(), f"{page.name}: {target}"
        if fragment:
            headings = re.findall(r"^#+ (.+)$", linked.read_text(encoding="utf-8"), re.M)
            assert fragment in {anchor(h) for h in headings}, f"{page.name}: {target}"


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HISTSTORE_URL", str(tmp_path / "default.db"))
    return tmp_path


def run_python(block: Block) -> None:
    code = compile(block.code, block.name, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    result = eval(code, {"__name__": "__main__"})
    if inspect.iscoroutine(result):
        asyncio.run(result)


@by_name(all_blocks("python"))
def test_python_block(block: Block, workdir: Path) -> None:
    run_python(block)


def test_a_failing_python_block_fails(workdir: Path) -> None:
    bad = Block(REPO / "README.md", 0, "python", "import histstore\nawait histstore.nope()\n")
    with pytest.raises(AttributeError):
        run_python(bad)


def shell(script: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    return subprocess.run(
        ["bash", "-e", "-o", "pipefail", "-c", script],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def histstore_command(argv: list[str]) -> str:
    """Run ``histstore ARGV`` in this process; its stdout. A non-zero exit fails."""
    from histstore.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code in (0, None), f"histstore {shlex.join(argv)}: exit {exit_.value.code}"
    return out.getvalue()


def run_commands(block: Block) -> None:
    """Run a block of ``histstore`` commands, in-process (a subprocess costs a second of
    imports per command). The shell it understands: ``&&``, ``NAME=$(histstore ...)``,
    ``"$NAME"``, and ``> /dev/null``; anything else fails, so a new block needs this
    grammar or a new rule here."""
    names: dict[str, str] = {}
    for line in block.code.splitlines():
        for part in filter(None, (p.strip() for p in line.split("&&"))):
            expanded = re.sub(r"\$(\w+)", lambda m: names[m.group(1)], part)
            capture = re.fullmatch(r"(\w+)=\$\((.*)\)", expanded)
            words = shlex.split(capture.group(2) if capture else expanded)
            if words[-2:] == [">", "/dev/null"]:
                words = words[:-2]
            assert words[0] == "histstore", f"{block.name}: runs only histstore: {part!r}"
            assert not {">", "<", "|", ";", "&"} & set(words), f"{block.name}: {part!r}"
            out = histstore_command(words[1:])
            if capture:
                names[capture.group(1)] = out.strip()


@by_name(all_blocks("sh"))
def test_sh_block(block: Block, workdir: Path) -> None:
    lines = [line for line in block.code.splitlines() if line.strip()]
    install = [INSTALL.match(line) for line in lines]
    if not any(install):
        run_commands(block)
        return
    assert len(lines) == 1, f"{block.name}: an install command stands alone"
    assert install[0] is not None
    target, command = install[0].groups()
    check_install_target(shlex.split(target)[-1])
    words = shlex.split(command)
    assert words[0].startswith(".venv/bin/"), command
    program = BIN / words[0].removeprefix(".venv/bin/")
    assert program.exists(), f"{block.name}: {program} is not installed"
    if program.name == "histstore":  # the installed script is main(); run it in-process
        histstore_command(words[1:])
        return
    if program.name == "pytest":
        # Running the suite from inside itself would recurse: check that pytest starts
        # with the project's configuration and conftest, collecting this one file.
        words += ["--collect-only", "-q", "-p", "no:cacheprovider", __file__]
    done = shell(shlex.join([str(program), *words[1:]]), REPO)
    assert done.returncode == 0, f"{block.name}:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"


def check_install_target(target: str) -> None:
    """``.`` or ``.[extra,...]`` with extras the project defines (``-e`` allowed)."""
    match = re.fullmatch(r"\.(?:\[([\w,-]+)\])?", target)
    assert match, target
    pyproject = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    for extra in filter(None, (match.group(1) or "").split(",")):
        assert re.search(rf"^{re.escape(extra)} = \[", pyproject, re.M), extra


def test_a_failing_sh_block_fails(workdir: Path) -> None:
    for code in ("histstore show no-such-conversation\n", "echo hi\n", "histstore ls | wc\n"):
        with pytest.raises(AssertionError):
            run_commands(Block(REPO / "README.md", 0, "sh", code))
    assert shell("false && histstore ls -q", workdir).returncode != 0


def help_of(argv: list[str]) -> str:
    return histstore_command([*argv, "--help"])


@by_name(all_blocks("text"))
def test_text_block_names_real_commands(block: Block) -> None:
    commands = help_of([])
    for line in block.code.splitlines():
        words = line.split("#")[0].split()
        if words[:1] != ["histstore"] or len(words) < 2:
            continue
        assert words[1] in commands, f"{block.name}: no subcommand {words[1]!r}"
        command, rest = words[1:2], words[2:]
        options = help_of(command)
        if rest and "ACTION" in options.splitlines()[0]:  # a command with actions
            assert rest[0] in options, f"{block.name}: histstore {words[1]} has no {rest[0]!r}"
            command, rest = [*command, rest[0]], rest[1:]
            options = help_of(command)
        for option in re.findall(r"(?<![\w-])(--?[a-z][\w-]*)", " ".join(rest)):
            assert option in options, f"{block.name}: histstore {' '.join(command)} has no {option}"
