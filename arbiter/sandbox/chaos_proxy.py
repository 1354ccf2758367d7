"""A local TCP proxy for fault injection: clients connect to it instead of
a server, and the harness can cut every connection it carries and refuse
new ones for a while (a network partition as the client sees it: reset
connections, then connection refused).

It also balances, as a Service does for a webhook caller: with several
upstreams, new connections take turns among those that pass a readiness
probe (`ready`, run every `probe_period` seconds, like a kubelet's; the
endpoints of a Service are its ready pods), and a connection an upstream
refuses tries the next ready one. Without a probe every upstream counts
as ready. A killed upstream drops out at its first failed probe; one
restarted comes back only once it answers ready (its cache loaded), not
as soon as its port accepts. Connections already open stay where they
are (kube-proxy's conntrack keeps them too). Bytes pass through
untouched, TLS included.

    proxy = ChaosProxy([("127.0.0.1", 6443)])
    port = await proxy.start()          # 127.0.0.1:port, a free port
    proxy.cut()                         # reset all, refuse new connections
    proxy.restore()
    await proxy.close()

    balancer = ChaosProxy(replicas, ready=partial(https_ready, context=ca))
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import multiprocessing.process
import ssl
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from multiprocessing.connection import Connection
from pathlib import Path

from arbiter.sandbox.probe import verified_context

Upstream = tuple[str, int]
ReadyProbe = Callable[[str, int], Awaitable[bool]]


async def https_ready(host: str, port: int, *, context: ssl.SSLContext, path: str = "/readyz",
                      seconds: float = 1.0) -> bool:
    """A readiness probe: GET `path` over TLS answers 200 within `seconds`."""
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(host, port, ssl=context), seconds)
    except (OSError, TimeoutError, ssl.SSLError):
        return False
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
                     .encode())
        line = await asyncio.wait_for(reader.readline(), seconds)
        return line.split(b" ")[1:2] == [b"200"]
    except (OSError, TimeoutError, ssl.SSLError):
        return False
    finally:
        _abort(writer)


class ChaosProxy:
    def __init__(self, upstreams: Sequence[Upstream], *, host: str = "127.0.0.1",
                 port: int = 0, ready: ReadyProbe | None = None,
                 probe_period: float = 0.5) -> None:
        if not upstreams:
            raise ValueError("a proxy needs at least one upstream")
        self.upstreams = list(upstreams)
        self.host, self.port = host, port
        self.refusing = False
        self.accepted = 0
        self.refused = 0
        self._probe, self._period = ready, probe_period
        # The endpoints: upstreams that passed their last probe (all, unprobed).
        self.ready: list[Upstream] = [] if ready is not None else list(self.upstreams)
        self._turn = 0
        self._prober: asyncio.Task[None] | None = None
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()  # the pumps
        self._serving: set[asyncio.Task[object]] = set()  # one per connection

    async def start(self) -> int:
        if self._probe is not None:
            await self._probe_all()
            self._prober = asyncio.ensure_future(self._probing())
        self._server = await asyncio.start_server(self._serve, self.host, self.port)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self.port

    async def _probe_all(self) -> None:
        assert self._probe is not None
        results = await asyncio.gather(*(self._probe(*u) for u in self.upstreams))
        self.ready = [u for u, ok in zip(self.upstreams, results, strict=True) if ok]

    async def _probing(self) -> None:
        while True:
            await asyncio.sleep(self._period)
            with contextlib.suppress(Exception):  # a probe's own failure is "not ready"
                await self._probe_all()

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
        if self._prober is not None:
            self._prober.cancel()
            await asyncio.gather(self._prober, return_exceptions=True)
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
        candidates = list(self.ready)
        if candidates:  # each connection starts at the next endpoint in turn
            self._turn = (self._turn + 1) % len(candidates)
            candidates = candidates[self._turn:] + candidates[:self._turn]
        for host, port in candidates:
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


class ProxyProcess:
    """A `ChaosProxy` in a process of its own, with the same controls
    (`port`, `cut`, `restore`, `start`, `close`).

    The chaos harness's own event loop decodes every watch event of the
    run; a proxy sharing it made each webhook call wait for that loop
    (85 ms at the median through the balancer against 15-25 ms straight to
    a replica, measured in run 11), a delay kube-proxy does not add. In a
    process of its own the bytes pass at once. Readiness probes verify
    with `ready_ca` (an SSLContext does not cross processes).
    """

    def __init__(self, upstreams: Sequence[Upstream], *, port: int = 0,
                 ready_ca: str | None = None) -> None:
        self.upstreams = list(upstreams)
        self.port = port
        self._ready_ca = ready_ca
        self._process: multiprocessing.process.BaseProcess | None = None
        self._conn: Connection | None = None

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    async def start(self) -> int:
        context = multiprocessing.get_context("spawn")  # no copy of this loop or its threads
        ours, theirs = context.Pipe()
        self._process = context.Process(
            target=_serve_in_process, args=(self.upstreams, self.port, self._ready_ca, theirs),
            name="chaos-proxy", daemon=True)
        self._process.start()
        theirs.close()
        self._conn = ours
        loop = asyncio.get_running_loop()
        if not await loop.run_in_executor(None, ours.poll, 30.0):
            await self.close()
            raise RuntimeError("the proxy process did not start within 30 s")
        self.port = int(ours.recv())
        return self.port

    def _ask(self, command: str) -> int:
        """Send a command and wait (blocking: the answer is immediate) for
        the process's reply; a process that does not answer is an error."""
        assert self._conn is not None, "start() first"
        self._conn.send(command)
        if not self._conn.poll(5.0):
            raise RuntimeError(f"the proxy process did not answer {command!r} within 5 s")
        return int(self._conn.recv())

    def cut(self) -> int:
        return self._ask("cut")

    def restore(self) -> None:
        self._ask("restore")

    async def close(self) -> None:
        process, conn = self._process, self._conn
        self._process = self._conn = None
        if conn is not None:
            with contextlib.suppress(OSError):
                conn.send("stop")
            conn.close()
        if process is None:
            return
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, process.join, 5.0)
        if process.is_alive():  # stopped by its pid, as everything the harness starts
            process.kill()
            await loop.run_in_executor(None, process.join, 5.0)


def _serve_in_process(upstreams: list[Upstream], port: int, ready_ca: str | None,
                      conn: Connection) -> None:
    asyncio.run(_serve_commands(upstreams, port, ready_ca, conn))


async def _serve_commands(upstreams: list[Upstream], port: int, ready_ca: str | None,
                          conn: Connection) -> None:
    """Run one proxy until told to stop (or the parent's end of the pipe closes)."""
    ready: ReadyProbe | None = None
    if ready_ca is not None:
        ready = partial(https_ready, context=verified_context(Path(ready_ca)))
    proxy = ChaosProxy(upstreams, port=port, ready=ready)
    conn.send(await proxy.start())
    loop = asyncio.get_running_loop()
    stopped = asyncio.Event()

    def on_command() -> None:
        try:
            command = conn.recv()
        except (EOFError, OSError):
            stopped.set()
            return
        if command == "cut":
            conn.send(proxy.cut())
        elif command == "restore":
            proxy.restore()
            conn.send(0)
        else:
            stopped.set()

    loop.add_reader(conn.fileno(), on_command)
    try:
        await stopped.wait()
    finally:
        loop.remove_reader(conn.fileno())
        await proxy.close()
