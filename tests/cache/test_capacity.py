"""Cluster capacity, kept incrementally (issue 13, items 10 and 14).

Capacity is the allocatable of Ready, schedulable nodes minus the requests
of unmanaged Pending/Running pods placed on those same nodes (no queue
label, or in a namespace arbiter does not manage). The property
test drives random node and pod events through the store (as the watchers
do) and compares it after every event with a from-scratch recomputation.
"""

from __future__ import annotations

import random
import time
from typing import Any

from arbiter.cache.capacity import CapacityLedger
from arbiter.cache.records import NodeRecord, PodRecord
from arbiter.cache.store import ClusterStore
from arbiter.core.resources import EMPTY, Resources

GIB = 2**30


def node(name: str, cpu: str = "4", *, ready: bool = True, cordoned: bool = False,
         gpu: str | None = None) -> dict[str, Any]:
    allocatable = {"cpu": cpu, "memory": "16Gi"}
    if gpu is not None:
        allocatable["nvidia.com/gpu"] = gpu
    return {"metadata": {"name": name}, "spec": {"unschedulable": cordoned},
            "status": {"allocatable": allocatable, "conditions": [
                {"type": "Ready", "status": "True" if ready else "False"}]}}


def pod(uid: str, node_name: str | None, cpu: str = "1", *, queue: str | None = None,
        phase: str = "Running", namespace: str = "ns") -> dict[str, Any]:
    labels = {"arbiter.dev/queue": queue} if queue else {}
    spec: dict[str, Any] = {"containers": [{"name": "c", "resources": {
        "requests": {"cpu": cpu, "memory": "1Gi"}}}]}
    if node_name:
        spec["nodeName"] = node_name
    return {"metadata": {"name": uid, "namespace": namespace, "uid": uid, "labels": labels},
            "spec": spec, "status": {"phase": phase}}


def test_pods_on_a_cordoned_node_do_not_lower_capacity() -> None:
    store = ClusterStore()
    store.apply("Node", "ADDED", node("n1", "4"))
    store.apply("Node", "ADDED", node("n2", "8", cordoned=True))
    for i in range(3):
        store.apply("Pod", "ADDED", pod(f"p{i}", "n2", "1"))
    assert store.capacity().get_amount("cpu") == 4000


def test_pods_on_a_not_ready_node_do_not_lower_capacity() -> None:
    store = ClusterStore()
    store.apply("Node", "ADDED", node("n1", "4"))
    store.apply("Node", "ADDED", node("n2", "8", ready=False))
    store.apply("Pod", "ADDED", pod("p", "n2", "3"))
    assert store.capacity().get_amount("cpu") == 4000
    # The node comes back: its pods count again.
    store.apply("Node", "MODIFIED", node("n2", "8"))
    assert store.capacity().get_amount("cpu") == 9000


def reference_capacity(store: ClusterStore, overcommit: float = 1.0) -> Resources:
    """From scratch: the definition, walking everything."""
    counted = {name for name, record in store.nodes.items()
               if record.ready and record.schedulable}
    total = EMPTY
    for name in counted:
        total = total + store.nodes[name].allocatable
    for record in store.pods.values():
        unmanaged = record.queue is None or not store.is_managed_namespace(record.namespace)
        if (unmanaged and record.node_name in counted
                and record.phase in ("Pending", "Running")):
            total = total - record.requests
    if overcommit != 1.0:
        total = Resources({k: int(v * overcommit) for k, v in total.items()})
    return total.clamp_min(0)


def namespace(name: str, managed: bool | None) -> dict[str, Any]:
    labels = {} if managed is None else {"arbiter.dev/managed": str(managed).lower()}
    return {"metadata": {"name": name, "labels": labels}}


def queue(name: str, namespaces: list[str]) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"namespaces": namespaces}}


def test_incremental_capacity_equals_a_recomputation_after_random_events() -> None:
    """Nodes, pods, and the namespaces' managed verdict (labels; in `listed`
    mode also the Queues naming them) change in any order."""
    rng = random.Random(1413)
    node_names = [f"n{i}" for i in range(5)]
    uids = [f"p{i}" for i in range(30)]
    namespaces = ["ns", "other", "kube-system"]
    phases = ["Pending", "Running", "Succeeded", "Failed"]
    for round_ in range(60):
        store = ClusterStore(managed_mode="listed" if round_ % 2 else "all")
        for _ in range(150):
            roll = rng.random()
            if roll < 0.1:
                store.apply("Namespace", "MODIFIED", namespace(
                    rng.choice(namespaces), rng.choice([None, True, False])))
            elif roll < 0.15:
                if rng.random() < 0.3:
                    store.apply("Queue", "DELETED", {"metadata": {"name": "q"}})
                else:
                    store.apply("Queue", "MODIFIED", queue(
                        "q", rng.sample(namespaces, rng.randint(0, 2))))
            elif roll < 0.4:
                name = rng.choice(node_names)
                if rng.random() < 0.2:
                    store.apply("Node", "DELETED", {"metadata": {"name": name}})
                else:
                    store.apply("Node", "MODIFIED", node(
                        name, str(rng.randint(0, 8)), ready=rng.random() < 0.7,
                        cordoned=rng.random() < 0.3,
                        gpu=rng.choice([None, "1", "2"])))
            else:
                uid = rng.choice(uids)
                if rng.random() < 0.15:
                    store.apply("Pod", "DELETED", {"metadata": {"uid": uid}})
                else:
                    store.apply("Pod", "MODIFIED", pod(
                        uid, rng.choice([None, *node_names, "elsewhere"]),
                        f"{rng.randint(0, 3000)}m", queue=rng.choice([None, None, "q"]),
                        phase=rng.choice(phases), namespace=rng.choice(namespaces)))
            assert store.capacity() == reference_capacity(store)
            assert store.capacity(1.5) == reference_capacity(store, 1.5)
        if rng.random() < 0.5:
            # A relist drops whatever is gone.
            store.replace_all("Node", [node(n, "2") for n in node_names[:2]])
            store.replace_all("Pod", [pod("p0", "n0", "500m")])
            assert store.capacity() == reference_capacity(store)


def test_capacity_is_read_without_walking_the_pods() -> None:
    store = ClusterStore()
    for i in range(100):
        store.upsert_node(NodeRecord(name=f"n{i}", allocatable=Resources(
            {"cpu": 64_000, "memory": 256 * GIB}), ready=True))
    for i in range(50_000):
        store.upsert_pod(PodRecord(uid=f"u{i}", namespace="ns", name=f"p{i}",
                                   requests=Resources({"cpu": 100}), node_name=f"n{i % 100}",
                                   phase="Running"))
    started = time.perf_counter()
    for _ in range(100):
        capacity = store.capacity()
    per_call = (time.perf_counter() - started) / 100
    assert capacity.get_amount("cpu") == 100 * 64_000 - 50_000 * 100
    assert per_call < 0.001, per_call


def test_a_queue_labelled_pod_in_an_unmanaged_namespace_takes_capacity() -> None:
    """Its label charges it to no queue (the loop charges managed namespaces
    only): it must come off the capacity, and go back to being charged when
    the namespace is managed again."""
    store = ClusterStore()
    store.apply("Node", "ADDED", node("n1", "8"))
    store.apply("Pod", "ADDED", pod("p", "n1", "3", queue="q", namespace="team"))
    store.apply("Pod", "ADDED", pod("s", "n1", "1", queue="q", namespace="kube-system"))
    assert store.capacity().get_amount("cpu") == 7000  # kube-system is excluded
    store.apply("Namespace", "MODIFIED", namespace("team", False))
    assert store.capacity().get_amount("cpu") == 4000
    store.apply("Namespace", "MODIFIED", namespace("team", None))
    assert store.capacity().get_amount("cpu") == 7000
    store.apply("Pod", "DELETED", {"metadata": {"uid": "s"}})
    assert store.capacity().get_amount("cpu") == 8000


class _CountingPods(dict[str, PodRecord]):
    """The store's pods, counting the records the ledger reads back."""

    reads = 0

    def get(self, key: str, default: Any = None) -> Any:
        self.reads += 1
        return super().get(key, default)


def test_a_namespace_changing_counts_only_its_own_labelled_pods_again() -> None:
    pods = _CountingPods()
    off: set[str] = set()
    ledger = CapacityLedger({"n1": NodeRecord(name="n1", allocatable=Resources(
        {"cpu": 100_000}), ready=True)}, pods, lambda ns: ns not in off)
    ledger.count_node(ledger.nodes["n1"], +1)
    for i in range(1_000):
        pod = PodRecord(uid=f"b{i}", namespace="big", name=f"b{i}", queue="q",
                        requests=Resources({"cpu": 10}), node_name="n1", phase="Running")
        pods[pod.uid] = pod
        ledger.count_pod(pod, +1)
    small = PodRecord(uid="s", namespace="small", name="s", queue="q",
                      requests=Resources({"cpu": 500}), node_name="n1", phase="Running")
    pods["s"] = small
    ledger.count_pod(small, +1)
    assert ledger.total().get_amount("cpu") == 100_000
    off.add("small")
    ledger.namespace_changed("small")
    assert ledger.total().get_amount("cpu") == 99_500
    assert pods.reads == 2  # its one pod, taken off and counted again
    ledger.namespace_changed(None)  # a Queue changed: no namespace's verdict did
    assert pods.reads == 2
