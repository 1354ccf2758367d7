"""What the webhook and the extender HTTP adapters share: a request body
read under a size limit and a time limit, one-line reasons, and request
counters.

Both answer a body they cannot read with 400 and a one-line reason, each in
its own error type: a body over the limit (whether or not the client sent a
Content-Length, and before or after decoding), one that is not in the
Content-Encoding it declares, and one that stops arriving (a client holding
a connection open with part of a declared body).

aiohttp's own decoding is off on every listener (`HANDLER_ARGS`): it decodes
deflate, br and zstd before any handler runs, and a malformed body then
fails there with a multi-line 400 and a logged traceback. `read_limited`
gets the raw bytes and decodes gzip and deflate itself, never inflating
past the body limit (a small "zip bomb" costs the limit, no more); any
other encoding is refused. Neither the apiserver nor kube-scheduler
compresses what it sends, so this is for other clients only.
"""

from __future__ import annotations

import asyncio
import asyncio.sslproto
import math
import ssl
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from aiohttp import web
from prometheus_client import Counter

from arbiter.base import metrics

# Seconds a whole body may take to arrive; the apiserver's webhook timeout
# is at most 30 s and kube-scheduler's extender timeout is shorter still.
BODY_READ_TIMEOUT = 10.0
# Encodings read_limited decodes (the rest is refused).
DECODED_ENCODINGS = frozenset({"", "identity", "gzip", "deflate"})
# The aiohttp request-handler arguments of every listener: bodies are read raw.
HANDLER_ARGS: dict[str, Any] = {"auto_decompress": False}


async def read_limited(request: web.Request, limit: int,
                       error: Callable[[str], Exception]) -> bytes:
    """The body of `request`; `error(reason)` is raised past `limit` bytes,
    past BODY_READ_TIMEOUT seconds, or when the body cannot be decoded."""
    encoding = request.headers.get("Content-Encoding", "").strip().lower()
    if encoding not in DECODED_ENCODINGS:
        raise error(f"Content-Encoding {encoding[:40]!r} is not supported; send the body "
                    "uncompressed")
    length = request.content_length
    if length is not None and length > limit:
        raise error(f"body of {length} bytes exceeds the {limit}-byte limit")
    chunks: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(BODY_READ_TIMEOUT):
            async for chunk in request.content.iter_any():
                size += len(chunk)
                if size > limit:
                    raise error(f"body exceeds the {limit}-byte limit")
                chunks.append(chunk)
    except TimeoutError:
        _close_after_reply(request)
        raise error(f"reading the body timed out after {BODY_READ_TIMEOUT:g} s "
                    f"({size} bytes received)") from None
    except ConnectionResetError:
        # The client went away mid-body; nobody will read the answer.
        raise error(f"connection closed after {size} bytes of the body") from None
    except web.RequestPayloadError as payload_error:
        # e.g. a chunked body whose framing breaks off.
        _close_after_reply(request)
        reason = " ".join(str(payload_error).split())
        raise error(f"body cannot be read: {reason[:200]}") from None
    body = b"".join(chunks)
    if encoding in ("gzip", "deflate"):
        return inflate(body, encoding, limit, error)
    return body


def inflate(data: bytes, encoding: str, limit: int,
            error: Callable[[str], Exception]) -> bytes:
    """`data` decoded from gzip or deflate (zlib-wrapped, or raw as some
    clients send it), never producing more than `limit` bytes."""
    if encoding == "gzip":
        wbits = 16 + zlib.MAX_WBITS
    else:
        zlib_header = len(data) >= 2 and data[0] & 0x0F == 8 and (data[0] << 8 | data[1]) % 31 == 0
        wbits = zlib.MAX_WBITS if zlib_header else -zlib.MAX_WBITS
    decoder = zlib.decompressobj(wbits)
    try:
        out = decoder.decompress(data, limit + 1)
    except zlib.error as failure:
        raise error(f"body is not valid {encoding}: {one_line(str(failure), 200)}") from None
    if len(out) > limit:
        raise error(f"body exceeds the {limit}-byte limit once decoded ({encoding})")
    if not decoder.eof:
        raise error(f"body is not valid {encoding}: the compressed stream is truncated")
    return out


def _close_after_reply(request: web.Request) -> None:
    """The rest of this body is unreadable: close the connection once the
    400 is sent, rather than let aiohttp drain it (which re-raises the
    payload error as an unhandled exception, or waits on a stalled client).
    Once closing, the protocol ignores further bytes, so ending the
    stream here is safe."""
    request.protocol.close()
    request.content.feed_eof()


def one_line(text: str, limit: int = 1000) -> str:
    """`text` on one line (whitespace runs become one space), at most `limit` characters."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


class CachedCounter:
    """A labelled Counter whose children are cached per label values:
    `labels()` costs more than the request it counts."""

    def __init__(self, counter: Counter) -> None:
        self._counter = counter
        self._children: dict[tuple[str, ...], Counter] = {}

    def inc(self, *labels: str) -> None:
        child = self._children.get(labels)
        if child is None:
            child = self._children[labels] = self._counter.labels(*labels)
        child.inc()


# -- listeners that hold (connection cap, handshake / header / idle timeouts) ---------------
@dataclass(frozen=True, slots=True)
class ListenerLimits:
    """What clients may hold of a listener.

    max_connections_per_source: open connections (handshaking ones
        included) from one client IP; past it, that source's new
        connections are refused at once (a refusal costs an accept, no
        handshake), so one slow source fights only itself.
    max_connections: open connections in all; at the cap a new connection
        closes one that has not started a request yet (handshaking, or its
        request head still arriving), else an idle one, taken from the
        source holding the most connections (its oldest); when every
        connection is mid-request the new one is refused. Slow clients from
        many sources therefore cannot keep the apiserver or kube-scheduler
        out: they are the first to go.
    handshake_timeout: seconds a TLS handshake may take.
    header_timeout: seconds from the handshake until the first request's
        head is complete.
    idle_timeout: seconds a connection may sit between requests (or with a
        later request's head still arriving: aiohttp's keep-alive timer).
    """

    max_connections: int = 512
    max_connections_per_source: int = 128
    handshake_timeout: float = 5.0
    header_timeout: float = 10.0
    idle_timeout: float = 60.0


class ConnectionGuard:
    """The protocol factory of one listener: applies `ListenerLimits` and
    performs the TLS handshake itself (see `_Connection`), so that it holds
    every connection's socket from the moment it is accepted and can close
    it at any stage; aiohttp's handler is only made once the handshake is
    done."""

    def __init__(self, server: web.Server, tls: ssl.SSLContext | None,
                 limits: ListenerLimits, name: str) -> None:
        self.server = server
        self.tls = tls
        self.limits = limits
        self.name = name
        # Insertion-ordered: the oldest first.
        self.open: dict[_Connection, None] = {}
        self.per_source: dict[str, int] = {}

    def __call__(self) -> asyncio.Protocol:
        return _Connection(self)

    def admit(self, connection: _Connection) -> bool:
        if self.per_source.get(connection.source, 0) >= self.limits.max_connections_per_source:
            _CLOSED.inc(self.name, "refused-source")
            return False
        if len(self.open) >= self.limits.max_connections:
            victim = self._victim()
            if victim is None:
                _CLOSED.inc(self.name, "refused")
                return False
            victim.abort("evicted")
        self.open[connection] = None
        self.per_source[connection.source] = self.per_source.get(connection.source, 0) + 1
        return True

    def forget(self, connection: _Connection) -> bool:
        """Drop `connection`; False when it was not open."""
        if connection not in self.open:
            return False
        del self.open[connection]
        left = self.per_source[connection.source] - 1
        if left:
            self.per_source[connection.source] = left
        else:
            del self.per_source[connection.source]
        return True

    def _victim(self) -> _Connection | None:
        """The connection to close for a new one: one that has not started a
        request, else an idle one; within each, from the source holding the
        most connections (the oldest of those), so that many slow clients
        from one source push out each other, not a quiet source's handshake."""
        unserved: _Connection | None = None
        idle: _Connection | None = None
        weight = self.per_source.__getitem__
        for connection in self.open:
            if not connection.served():
                if unserved is None or weight(connection.source) > weight(unserved.source):
                    unserved = connection
            elif not connection.busy() and (
                    idle is None or weight(connection.source) > weight(idle.source)):
                idle = connection
        return unserved or idle

    def close_unopened(self) -> None:
        """Close every connection aiohttp does not know of yet (its
        shutdown closes the others)."""
        for connection in [c for c in self.open if c.handler is None]:
            connection.abort("stopped")


class _TLS(asyncio.sslproto.SSLProtocol):
    """asyncio's TLS protocol with a smaller read buffer: its 256 KiB,
    allocated per connection, made 2,000 idle TLS clients cost 500 MiB. One
    TLS record is at most 16 KiB, so 32 KiB only means more reads for large
    bodies."""

    max_size = 32 * 1024


class _Connection(asyncio.Protocol):
    """One accepted connection. Before the handshake it is the raw socket's
    protocol; with TLS, it then hands the socket to a `_TLS` protocol and
    becomes that protocol's application protocol. Once open it hands
    everything to aiohttp's handler.

    The TLS protocol is made here rather than by `create_server(ssl=...)`
    so that the guard holds the socket of a connection still in its
    handshake (to close it at the cap) and so that its buffer is `_TLS`'s."""

    def __init__(self, guard: ConnectionGuard) -> None:
        self.guard = guard
        self.raw: asyncio.Transport | None = None
        self.source = ""
        self.handler: Any = None  # aiohttp's RequestHandler once open
        self.timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are no asyncio.Transport subclasses.
        if self.raw is not None:
            # From the TLS protocol: the handshake is done.
            self._open(cast(asyncio.Transport, transport))
            return
        raw = self.raw = cast(asyncio.Transport, transport)
        peer = raw.get_extra_info("peername")
        self.source = str(peer[0]) if isinstance(peer, tuple) and peer else ""
        guard = self.guard
        if not guard.admit(self):
            raw.abort()
            return
        if guard.tls is None:
            self._open(raw)
            return
        loop = asyncio.get_running_loop()
        handshake = loop.create_future()
        handshake.add_done_callback(self._handshake_done)
        tls = _TLS(loop, self, guard.tls, handshake, server_side=True,
                   # Whole seconds, rounded up (typed as an int).
                   ssl_handshake_timeout=math.ceil(guard.limits.handshake_timeout))
        raw.set_protocol(tls)
        tls.connection_made(raw)

    def _handshake_done(self, handshake: asyncio.Future[None]) -> None:
        if handshake.cancelled() or handshake.exception() is not None:
            self._forget("handshake-failed")

    def _open(self, transport: asyncio.Transport) -> None:
        self.handler = self.guard.server()
        self.handler.connection_made(transport)
        self.timer = asyncio.get_running_loop().call_later(
            self.guard.limits.header_timeout, self._header_deadline)

    def _header_deadline(self) -> None:
        self.timer = None
        if not self.served():
            self.abort("header-timeout")

    def served(self) -> bool:
        """Whether a request head has arrived on this connection."""
        # aiohttp counts the request heads it parsed per connection.
        return self.handler is not None and getattr(self.handler, "_request_count", 1) > 0

    def busy(self) -> bool:
        return self.handler is not None and bool(getattr(self.handler, "_request_in_progress",
                                                         True))

    def abort(self, reason: str) -> None:
        self._forget(reason)
        if self.raw is not None:
            self.raw.abort()

    def _forget(self, reason: str | None) -> None:
        if self.guard.forget(self) and reason is not None:
            _CLOSED.inc(self.guard.name, reason)
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    # Application-protocol callbacks (from the TLS protocol, or the socket).
    def data_received(self, data: bytes) -> None:
        if self.handler is not None:
            self.handler.data_received(data)

    def eof_received(self) -> bool | None:
        return None if self.handler is None else self.handler.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self._forget(None)
        if self.handler is not None:
            self.handler.connection_lost(exc)

    def pause_writing(self) -> None:
        if self.handler is not None:
            self.handler.pause_writing()

    def resume_writing(self) -> None:
        if self.handler is not None:
            self.handler.resume_writing()


class GuardedSite(web.TCPSite):
    """A TCP site whose connections a `ConnectionGuard` accepts.

    `start` is BaseSite's (it registers the site with its runner) followed by
    TCPSite's listen with the guard as the protocol factory; the one field of
    aiohttp's it sets is `_server`, which BaseSite.stop closes (the contract
    aiohttp's own sites follow)."""

    __slots__ = ("_bind", "_limits", "_listener", "_runner_server", "_tls", "guard")

    def __init__(self, runner: web.BaseRunner, host: str, port: int, *,
                 tls: ssl.SSLContext | None, limits: ListenerLimits, name: str,
                 backlog: int = 1024) -> None:
        super().__init__(runner, host, port, backlog=backlog)
        self._bind = (host, port, backlog)
        self._runner_server = runner
        self._tls = tls
        self._limits = limits
        self._listener = name
        self.guard: ConnectionGuard | None = None

    async def start(self) -> None:
        await web.BaseSite.start(self)
        server = self._runner_server.server
        assert isinstance(server, web.Server)
        self.guard = ConnectionGuard(server, self._tls, self._limits, self._listener)
        host, port, backlog = self._bind
        self._server = await asyncio.get_running_loop().create_server(
            self.guard, host, port, backlog=backlog, reuse_address=True)

    async def stop(self) -> None:
        await super().stop()
        if self.guard is not None:
            self.guard.close_unopened()


_CLOSED = CachedCounter(metrics.listener_connections_closed_total)  # listener, reason
