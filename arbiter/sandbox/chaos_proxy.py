"""A local TCP proxy for fault injection: clients connect to it instead of
a server, and the harness can cut every connection it carries and refuse
new ones for a while (a network partition as the client sees it: reset
connections, then connection refused).

It also balances: with several upstreams, each new connection goes to the
first one that accepts it (a Service with several endpoints, as far as a
webhook caller can tell). Bytes pass through untouched, TLS included.

    proxy = ChaosProxy([("127.0.0.1", 6443)])
    port = await proxy.start()          # 127.0.0.1:port, a free port
    proxy.cut()                         # reset all, refuse new connections
    proxy.restore()
    await proxy.close()
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence


class ChaosProxy:
    def __init__(self, upstreams: Sequence[tuple[str, int]], *, host: str = "127.0.0.1",
                 port: int = 0) -> None:
        if not upstreams:
            raise ValueError("a proxy needs at least one upstream")
        self.upstreams = list(upstreams)
        self.host, self.port = host, port
        self.refusing = False
        self.accepted = 0
        self.refused = 0
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()  # the pumps
        self._serving: set[asyncio.Task[object]] = set()  # one per connection

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._serve, self.host, self.port)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self.port

    def cut(self) -> int:
        """Close every connection now and refuse new ones until `restore`;
        returns how many connections were cut."""
        self.refusing = True
        cut = len(self._writers)
        for writer in list(self._writers):
            _abort(writer)
        return cut

    def restore(self) -> None:
        self.refusing = False

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        self.cut()
        for task in list(self._tasks):
            task.cancel()
        # Not cancelled: with their pumps gone they end by themselves (a
        # cancelled connection handler makes asyncio log an error).
        await asyncio.gather(*self._tasks, *self._serving, return_exceptions=True)
        if self._server is not None:
            with contextlib.suppress(Exception):
                await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        me = asyncio.current_task()
        if me is not None:  # so that `close` waits for it
            self._serving.add(me)
            me.add_done_callback(self._serving.discard)
        if self.refusing:
            self.refused += 1
            _abort(writer)
            return
        upstream = await self._connect()
        if upstream is None:
            self.refused += 1
            _abort(writer)
            return
        self.accepted += 1
        up_reader, up_writer = upstream
        self._writers.update((writer, up_writer))
        pumps = [asyncio.ensure_future(_pump(reader, up_writer)),
                 asyncio.ensure_future(_pump(up_reader, writer))]
        for pump in pumps:
            self._tasks.add(pump)
            pump.add_done_callback(self._tasks.discard)
        try:
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for pump in pumps:
                pump.cancel()
            for end in (writer, up_writer):
                self._writers.discard(end)
                _abort(end)

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        for host, port in self.upstreams:
            try:
                return await asyncio.wait_for(asyncio.open_connection(host, port), 2.0)
            except (OSError, TimeoutError):
                continue
        return None


async def _pump(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    with contextlib.suppress(OSError, asyncio.IncompleteReadError):
        while chunk := await source.read(65536):
            sink.write(chunk)
            await sink.drain()


def _abort(writer: asyncio.StreamWriter) -> None:
    """Close at once (RST where the transport allows), without waiting."""
    transport = writer.transport
    with contextlib.suppress(Exception):
        transport.abort()
