"""Running the ``histstore`` command in tests: in this process (``run``: ``main(argv)`` on
a thread of its own, with its standard streams captured), or as a child process exactly
as a user runs it (``run_subprocess``)."""

from __future__ import annotations

import asyncio
import io
import os
import sys
import traceback
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from helpers import PYTHON, subprocess_env

from histstore.cli import main


@dataclass
class Result:
    code: int
    out: str
    err: str


_STREAMS: ContextVar[dict[str, Any] | None] = ContextVar("_STREAMS", default=None)
"""The standard streams of the command running in this context (``run``)."""


class _Routed:
    """Stands in for ``sys.stdin``/``stdout``/``stderr`` while commands run in process:
    the running command's stream where ``_STREAMS`` is set (the context, copied into
    the command's thread, its event loop and its ``to_thread`` calls), else the stream
    it replaced (pytest's capture)."""

    def __init__(self, name: str, replaced: Any) -> None:
        self._name = name
        self.replaced = replaced

    def _stream(self) -> Any:
        streams = _STREAMS.get()
        return self.replaced if streams is None else streams[self._name]

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._stream(), attr)

    def __iter__(self) -> Any:
        return iter(self._stream())


_NAMES = ("stdin", "stdout", "stderr")
_running = 0


def _route_streams() -> None:
    global _running
    if _running == 0:
        for name in _NAMES:
            setattr(sys, name, _Routed(name, getattr(sys, name)))
    _running += 1


def _unroute_streams() -> None:
    global _running
    _running -= 1
    if _running == 0:
        for name in _NAMES:
            routed = getattr(sys, name)
            if isinstance(routed, _Routed):
                setattr(sys, name, routed.replaced)


def _main(args: list[str]) -> int:
    """``main(args)`` as the console script runs it: its exit status; an exception that
    escapes is a traceback on stderr and status 1, as in a child process."""
    try:
        main(args)
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        print(exc.code, file=sys.stderr)
        return 1
    except BaseException:
        traceback.print_exc()
        return 1
    return 0


def _text(data: bytes = b"") -> io.TextIOWrapper:
    return io.TextIOWrapper(io.BytesIO(data), encoding="utf-8", write_through=True)


async def run(*args: str, cwd: Path | None = None, stdin: bytes | None = None) -> Result:
    """Run ``histstore ARGS`` in this process (``main`` on a thread, which runs its own
    event loop) and wait for it; stdin is ``stdin`` or empty, never a terminal. With a
    working directory (or ``$HISTSTORE_URL`` set, which the child would not see), it
    runs as a child process (``run_subprocess``)."""
    if cwd is not None or "HISTSTORE_URL" in os.environ:
        return await run_subprocess(*args, cwd=cwd, stdin=stdin)
    streams = {"stdin": _text(stdin or b""), "stdout": _text(), "stderr": _text()}
    token = _STREAMS.set(streams)
    _route_streams()
    try:
        code = await asyncio.wait_for(asyncio.to_thread(_main, list(args)), timeout=600)
    finally:
        _unroute_streams()
        _STREAMS.reset(token)
    out, err = (streams[name].buffer.getvalue().decode() for name in ("stdout", "stderr"))
    return Result(code, out, err)


async def run_subprocess(*args: str, cwd: Path | None = None, stdin: bytes | None = None) -> Result:
    """Run ``python -m histstore ARGS`` and wait for it."""
    env = subprocess_env()
    env.pop("HISTSTORE_URL", None)
    env["NO_COLOR"] = "1"
    proc = await asyncio.create_subprocess_exec(
        PYTHON,
        "-m",
        "histstore",
        *args,
        cwd=cwd,
        env=env,
        stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(stdin), timeout=600)
    assert proc.returncode is not None
    return Result(proc.returncode, out.decode(), err.decode())


async def ok(*args: str, **kw: Any) -> Result:
    result = await run(*args, **kw)
    assert result.code == 0, result.err
    assert "Traceback" not in result.err
    return result


def assert_one_line_error(result: Result, *fragments: str) -> None:
    """A user mistake: non-zero exit, one line on stderr, no traceback."""
    assert result.code != 0
    lines = result.err.splitlines()
    assert len(lines) == 1, result.err
    assert lines[0].startswith("histstore: error: "), result.err
    for fragment in fragments:
        assert fragment in lines[0], result.err
