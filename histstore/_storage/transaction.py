"""A write transaction that runs several programs one after another (import, copy)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from .._errors import HistStoreError
from .drivers import Driver, Phase, Program, Rollback

__all__ = ["Transaction"]

T = TypeVar("T")


class Transaction:
    """Programs run on one connection in one write transaction, committed by ``commit``
    (``Executor.transaction``); ``committed`` is called after each commit."""

    def __init__(self, driver: Driver, conn: Any, committed: Callable[[], None]) -> None:
        self._driver = driver
        self._conn = conn
        self._committed = committed
        self.begun = False
        """Whether a program ran since the last commit (so there is work to undo)."""
        self.phase = Phase()

    async def run(self, program: Program[T], *, conversation: str | None = None) -> T:
        """Run ``program`` inside the transaction (a ``Rollback`` value is an error here)."""
        begin, self.begun = not self.begun, True
        value = await self._driver.run(self._conn, program, self.phase, begin=begin, end=False)
        if isinstance(value, Rollback):
            raise HistStoreError("a program asked to roll back a shared transaction")
        return value

    async def commit(self) -> None:
        """Commit what the programs did (nothing to do when none ran)."""
        if self.begun:
            await self._driver.finish(self._conn, False, self.phase)
            self.begun = False
            self._committed()
