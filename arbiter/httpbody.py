"""Reading an HTTP request body under a size limit.

The webhook and the extender adapters both answer an oversized body with
400 and a one-line reason, each in its own error type; the limit holds
whether or not the client sent a Content-Length.
"""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web


async def read_limited(request: web.Request, limit: int,
                       error: Callable[[str], Exception]) -> bytes:
    """The body of `request`; `error(reason)` is raised past `limit` bytes."""
    length = request.content_length
    if length is not None and length > limit:
        raise error(f"body of {length} bytes exceeds the {limit}-byte limit")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.content.iter_any():
        size += len(chunk)
        if size > limit:
            raise error(f"body exceeds the {limit}-byte limit")
        chunks.append(chunk)
    return b"".join(chunks)
