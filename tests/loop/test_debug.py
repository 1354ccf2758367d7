"""The read-only debug API over HTTP."""

from __future__ import annotations

import time
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from arbiter.cache.store import KINDS, ClusterStore
from arbiter.loop import mirror as mirror_module
from arbiter.loop.runtime import Leadership
from arbiter.server import debug
from tests.loop.harness import Cluster


async def test_debug_routes_answer_json_from_the_cache() -> None:
    c = Cluster()
    await c.nodes(2)
    await c.queue("q")
    await c.pods("ns", "q", 5)
    await c.settle()
    app = web.Application()
    app.add_subapp(debug.PREFIX, debug.debug_app(store=c.store, overcommit=1.0,
                                                 leadership=Leadership()))
    async with TestClient(TestServer(app)) as client:
        response = await client.get("/debug/queues")
        assert response.status == 200
        document = await response.json()
        assert document["leader"] is False  # no loop runs in this server
        assert document["queues"]["q"]["admitted"] == 2
        assert document["queues"]["q"]["pending"] == 3
        response = await client.get("/debug/queues/q/pending?limit=1")
        pending = await response.json()
        assert [e["name"] for e in pending["pending"]] == ["pod-p-002"]
        assert pending["total"] == 3
        assert (await client.get("/debug/queues/missing/pending")).status == 404
        assert (await client.get("/debug/queues/q/pending?limit=x")).status == 400


def _big_store(units: int) -> ClusterStore:
    store = ClusterStore()
    store.synced_kinds.update(KINDS)
    store.apply("Node", "ADDED", {"metadata": {"name": "n"}, "status": {
        "allocatable": {"cpu": "100", "memory": "1Ti", "pods": "110"},
        "conditions": [{"type": "Ready", "status": "True"}]}})
    for queue in ("a", "b"):
        store.apply("Queue", "ADDED", {"metadata": {"name": queue}, "spec": {}})
    for index in range(units):
        store.apply("QueueUnit", "ADDED", {
            "metadata": {"name": f"u-{index}", "namespace": "ns", "uid": f"uid-{index}",
                         "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"queue": "ab"[index % 2],
                     "podSets": [{"name": "main", "count": 1, "requests": {"cpu": "1"}}]}})
    return store


async def test_a_non_leader_serves_from_a_kept_view_without_rebuilding(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """20,000 units: once the view has caught up, a request costs what
    changed since the last one, never an engine rebuild."""
    store = _big_store(20_000)
    builds = 0
    real = mirror_module.mirror_from_store

    def counting(*args: Any, **kwargs: Any) -> Any:
        nonlocal builds
        builds += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(mirror_module, "mirror_from_store", counting)
    monkeypatch.setattr(debug, "mirror_from_store", counting, raising=False)
    app = web.Application()
    app.add_subapp(debug.PREFIX, debug.debug_app(store=store, overcommit=1.0,
                                                 leadership=Leadership()))
    async with TestClient(TestServer(app)) as client:
        first = await (await client.get("/debug/queues")).json()
        assert first["queues"]["a"]["pending"] + first["queues"]["a"]["admitted"] == 10_000
        for _ in range(3):
            assert (await client.get("/debug/queues")).status == 200
        # A change is seen by the next request.
        store.apply("QueueUnit", "DELETED", {"metadata": {"name": "u-0", "namespace": "ns"}})
        after = await (await client.get("/debug/queues")).json()
    total = after["queues"]["a"]["pending"] + after["queues"]["a"]["admitted"]
    assert total == 9_999
    assert builds == 0


async def test_bringing_the_kept_view_up_to_date_costs_what_changed() -> None:
    """What a request pays before rendering: nothing when nothing changed,
    one unit's worth for one change (20,000 units; a rebuild took 1.5 s)."""
    store = _big_store(20_000)
    view = debug.KeptView(store, 1.0)
    await view.refreshed()
    started = time.perf_counter()
    await view.refreshed()
    unchanged = time.perf_counter() - started
    store.apply("QueueUnit", "DELETED", {"metadata": {"name": "u-1", "namespace": "ns"}})
    started = time.perf_counter()
    mirror = await view.refreshed()
    one_change = time.perf_counter() - started
    view.close()
    assert mirror.waiting["b"] + mirror.admitted["b"] == 9_999
    assert unchanged < 0.05 and one_change < 0.05, (unchanged, one_change)
