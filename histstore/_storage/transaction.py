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
    (``Executor.transaction``); ``committed`` is called after each commit, with about how
    many messages the programs since the last one listed for the full-text index."""

    def __init__(self, driver: Driver, conn: Any, committed: Callable[[int], None]) -> None:
        self._driver = driver
        self._conn = conn
        self._committed = committed
        self._lists = 0
        self.begun = False
        """Whether a program ran since the last commit (so there is work to undo)."""
        self.phase = Phase()

    async def run(
        self, program: Program[T], *, conversation: str | None = None, lists: int = 0
    ) -> T:
        """Run ``program`` inside the transaction (a ``Rollback`` value is an error here);
        ``lists``: about how many messages it lists for the full-text index."""
        begin, self.begun = not self.begun, True
        self._lists += lists
        value = await self._driver.run(self._conn, program, self.phase, begin=begin, end=False)
        if isinstance(value, Rollback):
            raise HistStoreError("a program asked to roll back a shared transaction")
        return value

    async def commit(self) -> None:
        """Commit what the programs did (nothing to do when none ran)."""
        if self.begun:
            await self._driver.finish(self._conn, False, self.phase)
            self.begun = False
            lists, self._lists = self._lists, 0
            self._committed(lists)
