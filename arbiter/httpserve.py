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
import zlib
from collections.abc import Callable
from typing import Any

from aiohttp import web
from prometheus_client import Counter

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
