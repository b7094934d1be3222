"""The ``histstore`` command: a demo, migrations, and tools to look at and move stores.

Every subcommand takes ``--url`` (a file path or a database URL; default as
``histstore.connect()``: ``$HISTSTORE_URL``, else ``histstore.db`` in the current
directory). Errors are one line on stderr, ``histstore: error: ...``, with exit status 1
(2 for a bad command line). Long work shows a progress line on stderr when it is a
terminal.

Layout: ``_parse`` (the grammar), ``_commands`` (one coroutine per subcommand),
``_render`` (terminal output), ``_demo``. The command uses only histstore's public API
and ``histstore.admin``: no SQL here.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from histstore import HistStoreError

from ._commands import UsageError, pooler
from ._parse import build_parser, parse_duration

__all__ = ["build_parser", "main", "parse_duration"]


def _fail(message: str, code: int = 1) -> NoReturn:
    one_line = " ".join(str(message).split())
    print(f"histstore: error: {one_line}", file=sys.stderr)
    raise SystemExit(code)


def main(argv: Sequence[str] | None = None) -> None:
    """Run the ``histstore`` command (the console script's entry point); exits."""
    parser = build_parser()
    args = parser.parse_args(argv)
    pooler.set(getattr(args, "pooler", None))  # read by open_store, in asyncio.run's context
    try:
        code = asyncio.run(args.handler(args))
    except KeyboardInterrupt:
        print("histstore: interrupted", file=sys.stderr)
        raise SystemExit(130) from None
    except BrokenPipeError:
        # The reader went away (e.g. `histstore export | head`): stop quietly.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        raise SystemExit(1) from None
    except UsageError as exc:
        _fail(str(exc), 2)
    except (HistStoreError, ValueError, LookupError) as exc:
        _fail(str(exc))
    except OSError as exc:
        where = f"{exc.filename}: " if exc.filename else ""
        _fail(f"{where}{exc.strerror or exc}")
    raise SystemExit(code)
