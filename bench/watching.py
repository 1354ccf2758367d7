"""Timestamps from watch events, for the sandbox benchmarks.

`watch` streams one collection's watch events as raw JSON (no client models:
a model per event costs more CPU than the benchmark can spare) and calls
`handle(type, object, monotonic time of arrival)` for each, resuming from the
last resourceVersion seen until `stop` is set.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any

import orjson

from arbiter.base.kubeapi import ApiError, open_stream, request_json

Handler = Callable[[str, dict[str, Any], float], None]


async def watch(client: Any, path: str, handle: Handler, stop: asyncio.Event, *,
                label_selector: str = "", ready: asyncio.Event | None = None) -> None:
    version = ""
    while not stop.is_set():
        query = [("watch", "1"), ("allowWatchBookmarks", "true"), ("timeoutSeconds", "600")]
        if label_selector:
            query.append(("labelSelector", label_selector))
        if version:
            query.append(("resourceVersion", version))
        try:
            response = await open_stream(client, "GET", path, query=query, request_timeout=None)
        except ApiError:
            await asyncio.sleep(0.5)
            continue
        if ready is not None:
            ready.set()
        try:
            async for line in response.content:
                if stop.is_set():
                    return
                if not line.strip():
                    continue
                event = orjson.loads(line)
                obj = event.get("object") or {}
                version = obj.get("metadata", {}).get("resourceVersion", version)
                if event.get("type") == "ERROR":
                    # Expired (410): list what exists now, so no object is
                    # missed (its times are then when the list arrived).
                    version = await relist(client, path, handle, label_selector)
                    break
                if event.get("type") != "BOOKMARK":
                    handle(event["type"], obj, time.monotonic())
        except (TimeoutError, OSError):
            await asyncio.sleep(0.2)
        finally:
            response.release()


async def relist(client: Any, path: str, handle: Handler, label_selector: str) -> str:
    """Every object of `path` to `handle` as ADDED; the list's resourceVersion."""
    query = [("labelSelector", label_selector)] if label_selector else []
    try:
        listed = await request_json(client, "GET", path, query=query)
    except ApiError:
        return ""
    now = time.monotonic()
    for item in listed.get("items") or []:
        handle("ADDED", item, now)
    return str((listed.get("metadata") or {}).get("resourceVersion", ""))


class Watches:
    """Several `watch` tasks started together and stopped together."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.stop = asyncio.Event()
        self.tasks: list[asyncio.Task[None]] = []

    async def add(self, path: str, handle: Handler, label_selector: str = "") -> None:
        """Start watching `path`; returns once the watch's stream is open."""
        ready = asyncio.Event()
        self.tasks.append(asyncio.ensure_future(
            watch(self.client, path, handle, self.stop, label_selector=label_selector,
                  ready=ready)))
        await asyncio.wait_for(ready.wait(), 30)

    async def close(self) -> None:
        self.stop.set()
        for task in self.tasks:
            task.cancel()
        for task in self.tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


def pct(values: list[float], q: float) -> float:
    """The q-quantile (nearest rank) of `values`; NaN when there are none."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]
