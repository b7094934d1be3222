"""``python -m histstore``: the same as the ``histstore`` command."""

from .cli import main

main()
