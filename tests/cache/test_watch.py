"""The watchers against a fake apiserver over HTTP, through a real
kubernetes_asyncio ApiClient: paginated relist, events, bookmarks, resume
from the last resourceVersion, relist on 410, retry while a CRD is missing."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from kubernetes_asyncio import client

from arbiter.base import metrics
from arbiter.cache.store import ClusterStore
from arbiter.cache.watch import Resource, Watcher, _lines, run_watchers
from tests.loop.harness import eventually

PODS = "/api/v1/pods"
QUEUES = "/apis/arbiter.dev/v1alpha1/queues"


def pod(name: str, rv: int, **extra: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}",
                         "resourceVersion": str(rv), **extra},
            "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]},
            "status": {"phase": "Pending"}}


@dataclass
class FakeApiServer:
    objects: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    events: dict[str, asyncio.Queue[dict[str, Any] | None]] = field(default_factory=dict)
    missing: set[str] = field(default_factory=set)
    requests: list[tuple[str, dict[str, str]]] = field(default_factory=list)
    list_version: str = "100"
    expired_lists: bool = False  # a list at a resourceVersion answers 410

    def queue(self, path: str) -> asyncio.Queue[dict[str, Any] | None]:
        return self.events.setdefault(path, asyncio.Queue())

    async def handle(self, request: web.Request) -> web.StreamResponse:
        query = dict(request.query)
        self.requests.append((request.path, query))
        if request.path in self.missing:
            return web.json_response({"kind": "Status", "code": 404, "reason": "NotFound",
                                      "message": "the server could not find the resource"},
                                     status=404)
        if query.get("watch") != "1":
            if self.expired_lists and query.get("resourceVersionMatch") == "NotOlderThan":
                return web.json_response({"kind": "Status", "code": 410, "reason": "Expired",
                                          "message": "too old resource version"}, status=410)
            items = self.objects.get(request.path, [])
            start = int(query.get("continue") or 0)
            limit = int(query.get("limit", "500"))
            page = items[start:start + limit]
            more = start + limit < len(items)
            meta = {"resourceVersion": self.list_version}
            if more:
                meta["continue"] = str(start + limit)
            return web.json_response({"kind": "List", "metadata": meta, "items": page})
        response = web.StreamResponse()
        response.content_type = "application/json"
        await response.prepare(request)
        queue = self.queue(request.path)
        while True:
            event = await queue.get()
            if event is None:
                break
            await response.write(orjson.dumps(event) + b"\n")
        await response.write_eof()
        return response


@pytest.fixture
async def fake() -> AsyncIterator[tuple[FakeApiServer, Any]]:
    server = FakeApiServer()
    app = web.Application()
    app.router.add_get("/{tail:.*}", server.handle)
    test_server = TestServer(app, host="127.0.0.1")
    await test_server.start_server()
    configuration = client.Configuration(host=str(test_server.make_url("")).rstrip("/"))
    api = client.ApiClient(configuration)
    try:
        yield server, api
    finally:
        await api.close()
        await test_server.close()


async def test_paginated_relist_replaces_the_table(fake: tuple[FakeApiServer, Any]) -> None:
    server, api = fake
    server.objects[PODS] = [pod(f"p{i}", i) for i in range(5)]
    store = ClusterStore()
    store.apply("Pod", "ADDED", pod("stale", 1))
    watcher = Watcher(api, store, Resource("Pod", PODS), page_size=2)
    version = await watcher.relist()
    assert version == "100"
    assert sorted(p.name for p in store.pods.values()) == ["p0", "p1", "p2", "p3", "p4"]
    assert "Pod" in store.synced_kinds
    pages = [q for path, q in server.requests if path == PODS]
    assert [q.get("continue") for q in pages] == [None, "2", "4"]
    assert metrics.cache_objects.labels("Pod")._value.get() == 5


async def test_events_bookmarks_and_resume(fake: tuple[FakeApiServer, Any]) -> None:
    server, api = fake
    server.objects[PODS] = [pod("a", 1)]
    store = ClusterStore()
    watcher = Watcher(api, store, Resource("Pod", PODS), backoff_initial=0.01)
    task = asyncio.create_task(watcher.run())
    try:
        events = server.queue(PODS)
        await eventually(lambda: "Pod" in store.synced_kinds)
        await events.put({"type": "ADDED", "object": pod("b", 101)})
        await events.put({"type": "MODIFIED", "object": pod("a", 102, labels={
            "arbiter.dev/queue": "q"})})
        await events.put({"type": "DELETED", "object": pod("b", 103)})
        # A frame larger than aiohttp's readline limit.
        big = pod("c", 104, annotations={"blob": "x" * 300_000})
        await events.put({"type": "ADDED", "object": big})
        await events.put({"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "150"}}})
        await events.put(None)  # the server ends the watch (timeout)
        await eventually(lambda: sum(1 for p, q in server.requests
                                 if p == PODS and q.get("watch")) >= 2)
        assert store.pods["uid-a"].queue == "q"
        assert "uid-b" not in store.pods and "uid-c" in store.pods
        watches = [q for p, q in server.requests if p == PODS and q.get("watch")]
        assert watches[0]["resourceVersion"] == "100"
        assert watches[0]["allowWatchBookmarks"] == "true"
        assert watches[1]["resourceVersion"] == "150"  # resumed, no relist
        assert watcher.relists == 1
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_410_gone_relists(fake: tuple[FakeApiServer, Any]) -> None:
    server, api = fake
    server.objects[PODS] = [pod("a", 1)]
    store = ClusterStore()
    watcher = Watcher(api, store, Resource("Pod", PODS), backoff_initial=0.01)
    task = asyncio.create_task(watcher.run())
    try:
        await eventually(lambda: watcher.relists == 1)
        server.objects[PODS] = [pod("z", 300)]
        server.list_version = "300"
        await server.queue(PODS).put({"type": "ERROR", "object": {
            "kind": "Status", "code": 410, "reason": "Expired",
            "message": "too old resource version: 100 (250)"}})
        await eventually(lambda: watcher.relists == 2)
        assert [p.name for p in store.pods.values()] == ["z"]
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


@pytest.mark.parametrize("cache_has_it", [True, False])
async def test_lists_come_from_the_watch_cache_and_never_go_back(
        fake: tuple[FakeApiServer, Any], cache_has_it: bool) -> None:
    """The first list asks resourceVersion=0 (the apiserver's cache, one
    piece); after a 410 on the watch, a list not older than what was applied;
    only if that too is gone, a consistent list page by page."""
    server, api = fake
    server.objects[PODS] = [pod("a", 1)]
    server.expired_lists = not cache_has_it
    watcher = Watcher(api, ClusterStore(), Resource("Pod", PODS), backoff_initial=0.01)
    task = asyncio.create_task(watcher.run())
    try:
        await eventually(lambda: watcher.relists == 1)
        await server.queue(PODS).put({"type": "BOOKMARK", "object": {
            "metadata": {"resourceVersion": "180"}}})
        await server.queue(PODS).put({"type": "ERROR", "object": {
            "kind": "Status", "code": 410, "reason": "Expired", "message": "too old"}})
        await eventually(lambda: watcher.relists == 2)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    lists = [q for path, q in server.requests if path == PODS and q.get("watch") != "1"]
    assert lists[0] == {"resourceVersion": "0"}
    assert lists[1] == {"resourceVersion": "180", "resourceVersionMatch": "NotOlderThan"}
    if cache_has_it:
        assert len(lists) == 2
    else:
        assert lists[2:] == [{"limit": "500"}]


async def test_missing_crd_is_retried_until_installed(fake: tuple[FakeApiServer, Any]) -> None:
    server, api = fake
    server.missing.add(QUEUES)
    server.objects[QUEUES] = [{"metadata": {"name": "team-a", "resourceVersion": "5"},
                               "spec": {"weight": 2}}]
    store = ClusterStore()
    watcher = Watcher(api, store, Resource("Queue", QUEUES), backoff_initial=0.01,
                      backoff_max=0.05)
    task = asyncio.create_task(watcher.run())
    try:
        await eventually(lambda: sum(1 for p, _ in server.requests if p == QUEUES) >= 3)
        assert not store.synced_kinds
        server.missing.discard(QUEUES)
        await eventually(lambda: "Queue" in store.synced_kinds)
        assert store.queues["team-a"].weight == 2
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_store_is_synced_once_every_kind_listed(fake: tuple[FakeApiServer, Any]) -> None:
    _, api = fake
    store = ClusterStore()
    task = asyncio.create_task(run_watchers(api, store))
    try:
        await eventually(lambda: store.synced)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


# -- one bad object never stalls a watch (issue 13, item 6) -----------------
BAD_OBJECTS: dict[str, tuple[str, dict[str, Any]]] = {
    # past Python's int-conversion limit: a ValueError, not a QuantityError, before
    "queue 5000-digit quantity": ("Queue", {
        "metadata": {"name": "bad", "resourceVersion": "101"},
        "spec": {"guarantee": {"cpu": "1" * 5000}}}),
    # a shape the converters do not expect (AttributeError deep inside)
    "pod containers a string": ("Pod", {**pod("bad", 101), "spec": {"containers": "abc"}}),
    "pod with a list for metadata.labels": ("Pod", {**pod("bad", 101), "metadata": {
        "name": "bad", "namespace": "ns", "uid": "uid-bad", "resourceVersion": "101",
        "labels": ["x"]}}),
}


@pytest.mark.parametrize("case", sorted(BAD_OBJECTS))
def test_store_apply_skips_an_object_it_cannot_convert(
        case: str, caplog: pytest.LogCaptureFixture) -> None:
    kind, obj = BAD_OBJECTS[case]
    store = ClusterStore()
    store.apply(kind, "ADDED", obj)  # type: ignore[arg-type]
    assert not store.table(kind)  # type: ignore[arg-type]
    assert any("skipping" in record.getMessage() for record in caplog.records)


@pytest.mark.parametrize("case", sorted(BAD_OBJECTS))
async def test_a_bad_object_does_not_stall_the_watch(
        fake: tuple[FakeApiServer, Any], case: str) -> None:
    server, api = fake
    kind, bad = BAD_OBJECTS[case]
    path = PODS if kind == "Pod" else QUEUES
    good = pod("good", 102) if kind == "Pod" else {
        "metadata": {"name": "good", "resourceVersion": "102"}, "spec": {"weight": 3}}
    store = ClusterStore()
    watcher = Watcher(api, store, Resource(kind, path), backoff_initial=0.01)  # type: ignore[arg-type]
    task = asyncio.create_task(watcher.run())
    try:
        await eventually(lambda: kind in store.synced_kinds)
        events = server.queue(path)
        await events.put({"type": "ADDED", "object": bad})
        await events.put({"type": "ADDED", "object": good})
        await eventually(lambda: watcher.resource_version == "102")
        assert len(store.table(kind)) == 1  # type: ignore[arg-type]
        # The same watch went on: no retry from the bad event's resourceVersion.
        assert sum(1 for p, q in server.requests if p == path and q.get("watch")) == 1
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


class _Chunks:
    """What `_lines` reads of a response: its content's chunks as they came."""

    def __init__(self, chunks: list[bytes]) -> None:
        self.content = self
        self._chunks = chunks

    async def iter_any(self) -> AsyncIterator[bytes]:
        for chunk in self._chunks:
            yield chunk


@pytest.mark.parametrize("cut", [1, 2, 3, 7, 64, 10_000])
async def test_frames_survive_any_chunking(cut: int) -> None:
    frames = [orjson.dumps({"type": "ADDED", "n": n, "pad": "x" * (n * 13 % 50)})
              for n in range(40)]
    stream = b"\n".join(frames[:20]) + b"\n\n" + b"\n".join(frames[20:])  # no final newline
    chunks = [stream[i:i + cut] for i in range(0, len(stream), cut)]
    got = [line async for line in _lines(_Chunks(chunks))]  # type: ignore[arg-type]
    assert got == frames
