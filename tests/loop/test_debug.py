"""The read-only debug API over HTTP."""

from __future__ import annotations

import time
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from arbiter.base.kubeapi import unit_path
from arbiter.cache.store import KINDS, ClusterStore
from arbiter.loop import follow as follow_module
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
    builds = resyncs = 0
    real = follow_module.mirror_from_store
    real_resync = follow_module.StoreFollower.resync

    def counting(*args: Any, **kwargs: Any) -> Any:
        nonlocal builds
        builds += 1
        return real(*args, **kwargs)

    async def counting_resync(*args: Any, **kwargs: Any) -> None:
        nonlocal resyncs
        resyncs += 1
        await real_resync(*args, **kwargs)

    monkeypatch.setattr(follow_module, "mirror_from_store", counting)
    monkeypatch.setattr(follow_module.StoreFollower, "resync", counting_resync)
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
    assert resyncs == 1  # the first request's catch-up, in slices


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


POOLS = "/apis/arbiter.dev/v1alpha1/pools"


async def _node(c: Cluster, name: str, cpu: str, **labels: str) -> None:
    await c.api.create("/api/v1/nodes", {
        "metadata": {"name": name, "labels": labels},
        "status": {"allocatable": {"cpu": cpu, "memory": "8Gi", "pods": "110"},
                   "conditions": [{"type": "Ready", "status": "True"}]}})


async def _reserve(c: Cluster, namespace: str, name: str, queue: str, cpu: str) -> None:
    await c.api.create(unit_path(namespace), {
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"queue": queue, "podSets": [{"name": "main", "count": 1,
                                              "requests": {"cpu": cpu}}]}})


async def _documents(client: TestClient[Any, Any], queues: list[str]) -> dict[str, Any]:
    answer = {"queues": await (await client.get("/debug/queues")).json()}
    for name in queues:
        answer[name] = await (await client.get(f"/debug/queues/{name}/pending")).json()
    answer["queues"].pop("leader")
    return answer


async def test_a_non_leaders_explain_equals_the_leaders() -> None:
    """The same cluster seen by the leader's loop and by a replica's debug
    view: nodes and pools (node fit), namespace access (a barred unit is out
    of the engine), charges (a bound pod no unit holds) and quota alike."""
    c = Cluster()
    for index in range(3):
        await _node(c, f"n{index}", "2")
    for index in range(2):
        await _node(c, f"g{index}", "1", accel="a100")
    await c.api.create(POOLS, {"metadata": {"name": "gpu"},
                               "spec": {"nodeSelector": {"accel": "a100"}}})
    await c.queue("capped", capability={"cpu": "1"}, namespaces=["qa"], pools=["default"])
    await c.queue("ml", pools=["gpu"], namespaces=["ml"])
    await c.queue("team-b", namespaces=["b"], pools=["default"])
    await c.queue("open", namespaces=["o"], pools=["default"])
    await c.pods("qa", "capped", 3)  # one admitted, two wait for quota
    await c.pod("ml", "small", "ml")  # admitted on a gpu node
    await c.pod("ml", "wide", "ml", cpu="2")  # 2 cpu free in gpu, on no one node
    await _reserve(c, "a", "sneaky", "team-b", "1")  # barred: team-b does not admit a
    await _reserve(c, "b", "own", "team-b", "1")
    await c.pod("o", "rogue", "open", gated=False, node="n1")  # no unit holds it
    await _reserve(c, "o", "big", "open", "2")
    await _reserve(c, "o", "bigger", "open", "2")  # 1 cpu free in default, 1 in gpu
    await c.settle()
    names = ["capped", "ml", "team-b", "open"]
    leadership = Leadership()
    leadership.controller = c.controller
    leader_app, replica_app = web.Application(), web.Application()
    leader_app.add_subapp(debug.PREFIX, debug.debug_app(
        store=c.store, overcommit=1.0, leadership=leadership))
    replica_app.add_subapp(debug.PREFIX, debug.debug_app(
        store=c.store, overcommit=1.0, leadership=Leadership(), clock=c.clock))
    async with TestClient(TestServer(leader_app)) as leader, \
            TestClient(TestServer(replica_app)) as replica:
        seen = await _documents(leader, names)
        reasons = {e["name"]: e["reason"] for name in names for e in seen[name]["pending"]}
        assert reasons.pop("pod-wide") == \
            "no node has room: largest free: 1 cpu on g1; needs 2 cpu per pod"
        assert reasons.pop("bigger").startswith("no node has room: largest free: 1 cpu on n")
        assert reasons == {"pod-p-001": "queue at capability (cpu)",
                           "pod-p-002": "queue at capability (cpu)"}
        assert seen["queues"]["queues"]["team-b"]["admitted"] == 1  # own; sneaky is out
        assert seen["queues"]["queues"]["open"]["admitted"] == 1
        assert await _documents(replica, names) == seen
        # Changes reach both alike: sneaky is let in, a wide gpu node joins.
        await c.set_queue("team-b", namespaces=["a", "b"])
        await _node(c, "g2", "2", accel="a100")
        await c.settle()
        seen = await _documents(leader, names)
        assert seen["ml"]["total"] == 0
        assert seen["queues"]["queues"]["team-b"]["admitted"] == 2
        assert await _documents(replica, names) == seen
