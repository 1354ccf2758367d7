"""What the webhook and the extender HTTP adapters share: a request body
read under a size limit, one-line reasons, and request counters.

Both answer bad input with 400 and a one-line reason, each in its own error
type; the body limit holds whether or not the client sent a Content-Length.
"""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web
from prometheus_client import Counter


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
