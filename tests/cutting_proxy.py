"""A TCP proxy that cuts a PostgreSQL connection right after a chosen statement.

It sits between a store and its server (or PgBouncer), in the test's event loop, and
reads the client's side of the protocol: the startup packets, then typed messages. It
knows which SQL each execution runs (a ``Query``; a ``Bind`` of a statement whose
``Parse`` it saw on that connection, named or unnamed). Once ``arm``-ed, the first
execution whose SQL the predicate accepts is forwarded whole (up to its ``Sync``),
and then both sockets are closed: the client sees its connection lost, the server has
the statement and runs it on, with nobody left to tell the outcome to.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import struct
from collections.abc import Callable

__all__ = ["CuttingProxy"]

_UNTYPED = {80877103, 80877104, 80877102}  # SSLRequest, GSSENCRequest, CancelRequest


def _cstring(body: bytes, start: int) -> tuple[str, int]:
    end = body.index(b"\0", start)
    return body[start:end].decode(), end + 1


class CuttingProxy:
    """Forwards ``127.0.0.1:port`` to ``host:port_to``; cuts as ``arm`` says."""

    def __init__(self, host: str, port: int) -> None:
        self._target = (host, port)
        self._server: asyncio.Server | None = None
        self._matches: Callable[[str], bool] | None = None
        self._chance = 1.0
        self._rng = random.Random(0)
        self._cuts_left = 0
        self._links: set[asyncio.Task[None]] = set()
        self.cuts = 0
        """Connections cut so far."""
        self.cut = asyncio.Event()
        """Set at each cut (clear it to wait for the next)."""

    @property
    def port(self) -> int:
        assert self._server is not None
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    async def start(self) -> CuttingProxy:
        self._server = await asyncio.start_server(self._link, "127.0.0.1", 0)
        return self

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._links):
            task.cancel()
        for task in list(self._links):
            with contextlib.suppress(BaseException):
                await task

    def arm(
        self,
        matches: Callable[[str], bool],
        *,
        times: int = 1,
        chance: float = 1.0,
        rng: random.Random | None = None,
    ) -> None:
        """Cut the next ``times`` executions whose SQL ``matches`` accepts, each with
        probability ``chance`` (drawn from ``rng``)."""
        self._matches, self._cuts_left, self._chance = matches, times, chance
        if rng is not None:
            self._rng = rng

    def disarm(self) -> None:
        self._cuts_left = 0

    def _should_cut(self, sql: str | None) -> bool:
        if sql is None or self._cuts_left <= 0 or self._matches is None:
            return False
        if not self._matches(sql) or self._rng.random() >= self._chance:
            return False
        self._cuts_left -= 1
        return True

    async def _link(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._links.add(task)
        server_w: asyncio.StreamWriter | None = None
        try:
            server_r, server_w = await asyncio.open_connection(*self._target)
            back = asyncio.ensure_future(self._pipe(server_r, client_w))
            try:
                await self._client_to_server(client_r, server_w)
            finally:
                back.cancel()
                with contextlib.suppress(BaseException):
                    await back
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            for writer in (client_w, server_w):
                if writer is not None:
                    writer.close()
            self._links.discard(task)

    @staticmethod
    async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        writer.close()

    async def _client_to_server(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        # Startup: untyped packets until the StartupMessage.
        while True:
            head = await reader.readexactly(8)
            length, code = struct.unpack("!ii", head)
            writer.write(head + await reader.readexactly(length - 8))
            await writer.drain()
            if code not in _UNTYPED:
                break
        names: dict[str, str] = {}
        cut_at_sync = False
        while True:
            head = await reader.readexactly(5)
            kind, length = head[:1], struct.unpack("!i", head[1:])[0]
            body = await reader.readexactly(length - 4)
            cut_now = False
            if kind == b"P":  # Parse: name, query
                name, at = _cstring(body, 0)
                names[name] = _cstring(body, at)[0]
            elif kind == b"B":  # Bind: portal, statement
                _portal, at = _cstring(body, 0)
                statement = _cstring(body, at)[0]
                cut_at_sync = cut_at_sync or self._should_cut(names.get(statement))
            elif kind == b"Q":  # a simple query
                cut_now = self._should_cut(_cstring(body, 0)[0])
            elif kind == b"C" and body[:1] == b"S":  # Close of a statement
                names.pop(_cstring(body, 1)[0], None)
            elif kind == b"S" and cut_at_sync:
                cut_now = True
            writer.write(head + body)
            await writer.drain()
            if cut_now:
                self.cuts += 1
                self.cut.set()
                return  # ``_link`` closes both sides
            if kind == b"X":  # Terminate
                return
