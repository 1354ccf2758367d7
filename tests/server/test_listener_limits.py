"""Listeners that hold (issue #25 row 8): a slow client is closed after the
handshake or header timeout, and the connection cap closes slow clients
first, or refuses a connection when every one is mid-request."""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp

from arbiter.cache.store import ClusterStore
from arbiter.server.app import start_listeners
from arbiter.server.config import ServeConfig
from arbiter.server.context import ServerContext
from certs.manager import CertManager

Streams = tuple[asyncio.StreamReader, asyncio.StreamWriter]


async def _webhook_port(tmp_path: Path, **limits: float) -> AsyncIterator[int]:
    config = ServeConfig(host="127.0.0.1", port=0, extender_port=0, metrics_port=0,
                         cert_dir=tmp_path / "serving", **limits)  # type: ignore[arg-type]
    certs = CertManager(config.cert_dir, ["localhost"], ["127.0.0.1"])
    ctx = ServerContext(config=config, store=ClusterStore(), certs=certs)
    runners = await start_listeners(ctx, await certs.prepare(), background=False)
    try:
        yield runners["webhook"].addresses[0][1]
    finally:
        for runner in runners.values():
            await runner.cleanup()


def _tls(tmp_path: Path) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(tmp_path / "serving" / "ca.crt"))


async def _closed_after(streams: Streams, limit: float) -> float | None:
    """Seconds until the server closed the connection (None: still open at `limit`)."""
    reader, writer = streams
    started = time.monotonic()
    try:
        async with asyncio.timeout(limit):
            while await reader.read(1024):
                pass
    except TimeoutError:
        return None
    except (ConnectionError, ssl.SSLError):
        pass
    finally:
        writer.close()
    return time.monotonic() - started


async def _healthz(port: int, tmp_path: Path) -> int:
    async with aiohttp.ClientSession() as session, session.get(
            f"https://127.0.0.1:{port}/healthz", ssl=_tls(tmp_path)) as answer:
        return answer.status


async def test_a_slow_client_is_closed_after_the_header_and_handshake_timeouts(
        tmp_path: Path) -> None:
    async for port in _webhook_port(tmp_path, listener_header_timeout=0.5,
                                    listener_handshake_timeout=0.5):
        # TLS done, then a request head that never completes.
        header = await asyncio.open_connection("127.0.0.1", port, ssl=_tls(tmp_path))
        header[1].write(b"POST /webhook/validate/pods HTTP/1.1\r\nHost: x\r\n")
        # A TCP connection that never finishes (or starts) its handshake.
        handshake = await asyncio.open_connection("127.0.0.1", port)
        handshake[1].write(b"\x16")
        closed = await asyncio.gather(_closed_after(header, 5), _closed_after(handshake, 5))
        assert all(seconds is not None and seconds < 2 for seconds in closed), closed
        # A client that completes its request in time is served.
        assert await _healthz(port, tmp_path) == 200


async def test_without_a_timeout_the_same_slow_client_stays(tmp_path: Path) -> None:
    # The check above fails for the right reason: with long timeouts it stays.
    async for port in _webhook_port(tmp_path):
        header = await asyncio.open_connection("127.0.0.1", port, ssl=_tls(tmp_path))
        header[1].write(b"POST /webhook/validate/pods HTTP/1.1\r\nHost: x\r\n")
        assert await _closed_after(header, 1.0) is None


async def test_at_the_cap_slow_clients_go_first(tmp_path: Path) -> None:
    async for port in _webhook_port(tmp_path, listener_max_connections=3):
        slow = [await asyncio.open_connection("127.0.0.1", port) for _ in range(3)]
        await asyncio.sleep(0.1)
        # A normal client gets in: the oldest slow one is closed for it.
        assert await _healthz(port, tmp_path) == 200
        assert await _closed_after(slow[0], 1.0) is not None
        for _, writer in slow[1:]:
            writer.close()


async def test_at_the_cap_with_every_connection_mid_request_new_ones_are_refused(
        tmp_path: Path) -> None:
    async for port in _webhook_port(tmp_path, listener_max_connections=2):
        busy: list[Streams] = []
        for _ in range(2):
            reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=_tls(tmp_path))
            # A complete head and part of the body: the request is in progress.
            writer.write(b"POST /webhook/validate/pods HTTP/1.1\r\nHost: x\r\n"
                         b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{")
            await writer.drain()
            busy.append((reader, writer))
        await asyncio.sleep(0.2)
        refused = await asyncio.open_connection("127.0.0.1", port)
        assert await _closed_after(refused, 2.0) is not None
        # The requests in progress were not cut off.
        for reader, writer in busy:
            writer.write(b" " * 99)
            head = await asyncio.wait_for(reader.readline(), 5)
            assert head.startswith(b"HTTP/1.1 "), head
            writer.close()


async def test_one_source_past_its_share_is_refused_and_others_still_served(
        tmp_path: Path) -> None:
    async for port in _webhook_port(tmp_path, listener_max_connections_per_source=2):
        slow = [await asyncio.open_connection("127.0.0.1", port, local_addr=("127.0.0.2", 0))
                for _ in range(2)]
        await asyncio.sleep(0.1)
        third = await asyncio.open_connection("127.0.0.1", port, local_addr=("127.0.0.2", 0))
        assert await _closed_after(third, 2.0) is not None
        # The two it holds stay (handshake timeout 5 s); another source is served.
        assert await _closed_after(slow[0], 0.5) is None
        assert await _healthz(port, tmp_path) == 200
        slow[1][1].close()


async def test_at_the_cap_the_source_holding_most_loses_a_connection_first(
        tmp_path: Path) -> None:
    async for port in _webhook_port(tmp_path, listener_max_connections=4):
        # A quiet source's handshake is the oldest connection ...
        quiet = await asyncio.open_connection("127.0.0.1", port, local_addr=("127.0.0.3", 0))
        await asyncio.sleep(0.05)
        # ... then one source fills the rest of the cap with slow handshakes.
        flood = [await asyncio.open_connection("127.0.0.1", port, local_addr=("127.0.0.2", 0))
                 for _ in range(3)]
        await asyncio.sleep(0.1)
        assert await _healthz(port, tmp_path) == 200
        # The flooding source paid for the new connection (its oldest went) ...
        assert await _closed_after(flood[0], 1.0) is not None
        # ... the quiet source's older handshake is still open.
        assert await _closed_after(quiet, 0.5) is None
        for _, writer in flood[1:]:
            writer.close()
