"""What the loop's integration tests (test_integrations.py, test_ray.py,
test_integration_trainjob.py, test_declared.py) share: a cluster queueing
every default kind, queue `q` of namespace NS, a pool `gpu` of labelled
nodes, and the gated pods a workload's controller makes."""

from __future__ import annotations

from typing import Any

from arbiter.cache.store import ClusterStore
from arbiter.core.api import ADMISSION_GATE, QUEUE_LABEL
from arbiter.integrations import DEFAULT_NAMES, enabled
from tests.loop.harness import Cluster

NS = "team-a"


def cluster() -> Cluster:
    return Cluster(store=ClusterStore(integrations=enabled(DEFAULT_NAMES)))


async def queued(nodes: int = 0, *, cpu: str = "1", gpu: int = 0) -> Cluster:
    """A cluster() with queue `q` of NS, then `nodes` nodes of `cpu` CPUs
    (node-0...) and a pool `gpu` of `gpu` nodes (gpu_pool)."""
    c = cluster()
    await c.queue("q", namespaces=[NS])
    if nodes:
        await c.nodes(nodes, cpu=cpu)
    if gpu:
        await gpu_pool(c, gpu)
    return c


async def gpu_node(c: Cluster, index: int) -> None:
    """Node gpu-`index` (1 CPU), labelled pool=gpu."""
    await c.api.create("/api/v1/nodes", {
        "metadata": {"name": f"gpu-{index}", "labels": {"pool": "gpu"}},
        "status": {"allocatable": {"cpu": "1", "memory": "8Gi", "pods": "110"},
                   "conditions": [{"type": "Ready", "status": "True"}]}})


async def gpu_pool(c: Cluster, nodes: int) -> None:
    """Pool `gpu` (nodeSelector pool=gpu) of `nodes` nodes gpu-0...."""
    for index in range(nodes):
        await gpu_node(c, index)
    await c.api.create("/apis/arbiter.dev/v1alpha1/pools", {
        "metadata": {"name": "gpu"}, "spec": {"nodeSelector": {"pool": "gpu"}}})


def template(queue: str, cpu: str = "1") -> dict[str, Any]:
    return {"metadata": {"labels": {QUEUE_LABEL: queue}},
            "spec": {"containers": [{"name": "c", "image": "x",
                                     "resources": {"requests": {"cpu": cpu}}}]}}


async def owned_pod(c: Cluster, name: str, owner: dict[str, Any], queue: str = "q",
                    labels: dict[str, str] | None = None) -> dict[str, Any]:
    """A gated pod whose controller is `owner` (as its controller makes it)."""
    meta = owner["metadata"]
    return await c.api.create(f"/api/v1/namespaces/{NS}/pods", {
        "metadata": {"name": name, "namespace": NS,
                     "labels": {QUEUE_LABEL: queue, **(labels or {})},
                     "ownerReferences": [{"apiVersion": owner.get("apiVersion", "v1"),
                                          "kind": owner["kind"], "name": meta["name"],
                                          "uid": meta["uid"], "controller": True}]},
        "spec": {"schedulingGates": [{"name": ADMISSION_GATE}],
                 "containers": [{"name": "c", "image": "x",
                                 "resources": {"requests": {"cpu": "1"}}}]},
        "status": {"phase": "Pending"}})


def with_kind(obj: dict[str, Any], kind: str, api_version: str) -> dict[str, Any]:
    return {**obj, "kind": kind, "apiVersion": api_version}
