"""The shared body reader on every webhook and extender path: a body the
server cannot decode (a Content-Encoding it does not carry), and a body
that never finishes arriving, each end with one 400 line, never a 500."""

from __future__ import annotations

import asyncio
import gzip
import logging
import zlib
from collections.abc import AsyncIterator

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from arbiter.base import httpserve
from arbiter.server.config import ServeConfig
from arbiter.server.context import ServerContext
from tests.hostile import one_port_app
from tests.webhook.admission_samples import (
    kubectl_run_pod,
    make_store,
    namespace_obj,
    queue_obj,
    review,
)
from webhook.endpoints import ENDPOINTS

Client = TestClient[web.Request, web.Application]
EXTENDER_PATHS = [f"/scheduler/{verb}" for verb in ("filter", "prioritize", "preempt")]
ALL_PATHS = [endpoint.path for endpoint in ENDPOINTS] + EXTENDER_PATHS


@pytest.fixture
async def client() -> AsyncIterator[Client]:
    store = make_store(queues=[queue_obj("team-a", namespaces=["team-a"])],
                       namespaces=[namespace_obj("team-a")])
    ctx = ServerContext(config=ServeConfig(), store=store)
    app = one_port_app(ctx)
    async with TestClient(TestServer(app, host="127.0.0.1")) as test_client:
        yield test_client


@pytest.mark.parametrize("encoding", ["gzip", "deflate", "x-made-up"])
@pytest.mark.parametrize("path", ALL_PATHS)
async def test_a_body_not_in_its_declared_encoding_gets_one_400_line(
        client: Client, path: str, encoding: str, caplog: pytest.LogCaptureFixture) -> None:
    body = orjson.dumps(review("Pod", "CREATE", kubectl_run_pod("web", "team-a")))
    with caplog.at_level(logging.DEBUG):
        answer = await client.post(path, data=body, headers={
            "Content-Type": "application/json", "Content-Encoding": encoding})
    text = await answer.text()
    assert answer.status == 400, text
    assert text.count("\n") == 1 and "body" in text
    assert not [r for r in caplog.records if r.exc_info], "a traceback was logged"


async def _slow_post(port: int, path: str) -> bytes:
    """Declare 1,000 bytes, send 14, then wait for the server to give up."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     "Content-Length: 1000\r\n\r\n{\"apiVersion\":".encode())
        await writer.drain()
        return await asyncio.wait_for(reader.read(), timeout=10)
    finally:
        writer.close()


@pytest.mark.parametrize("path", [ENDPOINTS[0].path, EXTENDER_PATHS[0]])
async def test_a_body_that_stops_arriving_times_out_with_400(
        client: Client, path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(httpserve, "BODY_READ_TIMEOUT", 0.3)
    port = client.server.port
    assert port is not None
    answer = await _slow_post(port, path)
    head, _, text = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400"), answer[:200]
    assert b"timed out" in text


def _deflate(data: bytes) -> bytes:
    return zlib.compress(data)


@pytest.mark.parametrize("encoding, body", [
    ("deflate", b"x\x9c\x03\x00"),  # a malformed tiny deflate stream
    ("deflate", b"\x78"),
    ("gzip", b"\x1f\x8b\x08\x00"),  # a gzip header and nothing more
    ("br", b"\x0b\x02\x80{}\x03"),
    ("zstd", b"(\xb5/\xfd\x00X\x11\x00\x00{}"),
])
@pytest.mark.parametrize("path", [ENDPOINTS[0].path, EXTENDER_PATHS[0]])
async def test_compressed_bodies_are_refused_or_decoded_by_us_in_one_line(
        client: Client, path: str, encoding: str, body: bytes,
        caplog: pytest.LogCaptureFixture) -> None:
    """aiohttp's own decoding (deflate, br, zstd) fails before any handler
    runs, with a multi-line 400 and a logged traceback: the server reads the
    raw bytes and decodes (gzip, deflate) or refuses (anything else) itself."""
    with caplog.at_level(logging.DEBUG):
        answer = await client.post(path, data=body, headers={
            "Content-Type": "application/json", "Content-Encoding": encoding})
    text = await answer.text()
    assert answer.status == 400, text
    assert text.count("\n") == 1 and "body" in text, text
    assert not [r for r in caplog.records if r.exc_info], "a traceback was logged"


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
async def test_a_well_compressed_body_is_decoded_within_the_limit(
        client: Client, encoding: str) -> None:
    review_body = orjson.dumps(review("Pod", "CREATE", kubectl_run_pod("web", "team-a")))
    packed = gzip.compress(review_body) if encoding == "gzip" else _deflate(review_body)
    path = ENDPOINTS[0].path
    answer = await client.post(path, data=packed, headers={
        "Content-Type": "application/json", "Content-Encoding": encoding})
    assert answer.status == 200, await answer.text()
    # A bomb: 64 KiB that inflates past the body limit is cut off there.
    bomb = gzip.compress(b" " * (ServeConfig().max_body_bytes + 1))
    assert len(bomb) < 64 * 1024
    answer = await client.post(path, data=bomb, headers={
        "Content-Type": "application/json", "Content-Encoding": "gzip"})
    text = await answer.text()
    assert answer.status == 400 and "limit" in text and text.count("\n") == 1, text
