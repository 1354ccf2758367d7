"""Placement-aware admission in the loop (DESIGN §10): node fit from the
cache, the plan written with the admission and given to the work, plans
kept across a restart and following real bindings."""

from __future__ import annotations

from typing import Any

from arbiter.base import metrics
from arbiter.base.kubeapi import job_path, pod_path
from arbiter.core.model import Placement
from arbiter.core.resources import Resources
from arbiter.loop.publisher import StatusPublisher
from tests.loop.harness import Cluster

POOLS = "/apis/arbiter.dev/v1alpha1/pools"


async def node(cluster: Cluster, name: str, cpu: str = "1", **labels: str) -> None:
    await cluster.api.create("/api/v1/nodes", {
        "metadata": {"name": name, "labels": labels},
        "status": {"allocatable": {"cpu": cpu, "memory": "8Gi", "pods": "110"},
                   "conditions": [{"type": "Ready", "status": "True"}]},
    })


async def pool(cluster: Cluster, name: str, selector: dict[str, str], **spec: Any) -> None:
    await cluster.api.create(POOLS, {"metadata": {"name": name},
                                     "spec": {"nodeSelector": selector, **spec}})


async def publish(cluster: Cluster) -> StatusPublisher:
    publisher = cluster.controller.publisher
    await publisher.publish()
    await cluster.controller.writes.wait()
    return publisher


def status(cluster: Cluster, ns: str, name: str) -> dict[str, Any]:
    return dict(cluster.unit_obj(ns, name).get("status") or {})


async def test_a_queue_confined_by_node_selector_admits_what_its_nodes_hold() -> None:
    cluster = Cluster()
    for index in range(4):
        await node(cluster, f"n{index}", **({"zone": "a"} if index >= 2 else {}))
    await cluster.queue("small", nodeSelector={"zone": "a"})
    for index in range(5):
        await cluster.job("ns", f"j{index}", "small")
    await cluster.settle()
    admitted = [i for i in range(5) if not cluster.suspended("ns", f"j{i}")]
    assert len(admitted) == 2
    planned = sorted(status(cluster, "ns", f"job-j{i}")["admission"]["nodes"]["main"][0]
                     for i in admitted)
    assert planned == ["n2", "n3"]
    for index in admitted:
        template = cluster.api.objects[job_path("ns", f"j{index}")]["spec"]["template"]
        assert template["spec"]["nodeSelector"] == {"zone": "a"}
    # A second queue without limits gets the other two nodes, not more.
    await cluster.queue("open")
    for index in range(4):
        await cluster.job("ns2", f"o{index}", "open")
    await cluster.settle()
    assert sum(not cluster.suspended("ns2", f"o{i}") for i in range(4)) == 2


async def test_a_pool_gives_its_selector_and_tolerations_to_the_work() -> None:
    cluster = Cluster()
    await node(cluster, "plain")
    await node(cluster, "gpu-0", cpu="2", accel="a100")
    await pool(cluster, "gpu", {"accel": "a100"},
               tolerations=[{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}])
    await cluster.queue("ml", pools=["gpu"])
    await cluster.job("ns", "train", "ml")
    await cluster.pod("ns", "probe", "ml", cpu="100m")
    await cluster.settle()
    assert status(cluster, "ns", "job-train")["admission"] == {
        "pool": "gpu", "nodes": {"main": ["gpu-0"]}}
    spec = cluster.api.objects[job_path("ns", "train")]["spec"]
    assert spec["suspend"] is False
    assert spec["template"]["spec"]["nodeSelector"] == {"accel": "a100"}
    assert spec["template"]["spec"]["tolerations"] == [
        {"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}]
    # The gated pod: the gate gone, selector and toleration added in one patch.
    pod = cluster.api.objects[pod_path("ns", "probe")]["spec"]
    assert not pod.get("schedulingGates")
    assert pod["nodeSelector"] == {"accel": "a100"}
    assert pod["tolerations"] == [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert "into pool gpu" in status(cluster, "ns", "job-train")["message"]


async def test_fragmented_free_space_waits_with_the_largest_free_slot() -> None:
    cluster = Cluster()
    for index in range(3):
        await node(cluster, f"n{index}")
        await cluster.pod("other", f"fill-{index}", None, cpu="600m", gated=False,
                          node=f"n{index}", phase="Running")
    await cluster.queue("q")
    # 1.2 CPU free in total, 400m on each node.
    await cluster.job("ns", "wide", "q", cpu="500m", parallelism=2)
    await cluster.job("ns", "narrow", "q", cpu="100m", parallelism=2)
    await cluster.settle()
    assert cluster.suspended("ns", "wide") and not cluster.suspended("ns", "narrow")
    assert status(cluster, "ns", "job-narrow")["admission"]["nodes"]["main"] == ["n0", "n0"]
    before = metrics.REGISTRY.get_sample_value("arbiter_unit_unplaceable_total",
                                               {"queue": "q"}) or 0.0
    await publish(cluster)
    await publish(cluster)
    assert metrics.REGISTRY.get_sample_value("arbiter_unit_unplaceable_total",
                                             {"queue": "q"}) == before + 1  # once per unit
    message = status(cluster, "ns", "job-wide")["message"]
    assert "no node has room: largest free: 400m cpu on n1" in message, message
    assert "needs 500m cpu per pod" in message


async def test_a_restart_keeps_the_plans_and_admits_nothing_twice() -> None:
    cluster = Cluster()
    for index in range(2):
        await node(cluster, f"n{index}")
    await cluster.queue("q")
    for index in range(3):
        await cluster.job("ns", f"j{index}", "q")
    await cluster.settle()
    plans = dict(cluster.controller.mirror.engine.plans())
    assert len(plans) == 2
    await cluster.controller.close()
    cluster.controller.stop_listening()
    fresh = cluster.new_controller()
    await fresh.settle()
    assert fresh.mirror.engine.plans() == plans
    assert sum(cluster.admissions("ns", f"job-j{i}") for i in range(3)) == 2
    free = fresh.mirror.engine.pool_usage()["default"]
    assert free == (Resources.parse({"cpu": "2", "memory": "16Gi", "pods": "220"}),
                    Resources.parse({"cpu": "2"}))


async def test_the_plan_follows_the_binding_and_nothing_counts_twice() -> None:
    cluster = Cluster()
    for index in range(3):
        await node(cluster, f"n{index}")
    await cluster.queue("q")
    await cluster.pod("ns", "p", "q")
    await cluster.settle()
    mirror = cluster.controller.mirror
    assert mirror.plan("ns/pod-p") == Placement("default", {"main": ("n0",)})
    # kube-scheduler put it on n2 instead.
    cluster.api.edit(pod_path("ns", "p"), lambda pod: pod["spec"].update(nodeName="n2"))
    await cluster.settle()
    assert mirror.plan("ns/pod-p") == Placement("default", {"main": ("n2",)})
    assert mirror.nodes.used("n2") == Resources()  # counted by the plan, not twice
    # Two more pods: they go where there is room, n0 and n1.
    await cluster.pod("ns", "a", "q")
    await cluster.pod("ns", "b", "q")
    await cluster.pod("ns", "c", "q")
    await cluster.settle()
    assert sorted(cluster.released_pods("ns")) == ["a", "b", "p"]
    # The pod finishes: its room comes back, and c gets it.
    cluster.set_pod_phase("ns", "p", "Succeeded")
    await cluster.settle()
    assert sorted(cluster.released_pods("ns")) == ["a", "b", "c", "p"]


async def test_pool_and_queue_status() -> None:
    cluster = Cluster()
    await node(cluster, "a0", tier="fast")
    await node(cluster, "a1", tier="fast")
    await node(cluster, "b0")
    await pool(cluster, "fast", {"tier": "fast"})
    await cluster.queue("q", pools=["fast"])
    await cluster.job("ns", "j", "q")
    await cluster.settle()
    await publish(cluster)
    pool_status = cluster.api.objects[f"{POOLS}/fast"]["status"]
    assert pool_status["nodes"] == 2 and pool_status["allocated"] == {"cpu": "1"}
    assert pool_status["capacitySummary"].startswith("cpu=2,")
    assert cluster.queue_status("q")["pools"] == [
        {"name": "fast", "admitted": 1, "allocated": {"cpu": "1"}}]
    sample = metrics.REGISTRY.get_sample_value
    assert sample("arbiter_pool_capacity", {"pool": "fast", "resource": "cpu"}) == 2.0
    assert sample("arbiter_pool_allocated", {"pool": "fast", "resource": "cpu"}) == 1.0
    assert sample("arbiter_pool_allocated", {"pool": "default", "resource": "cpu"}) == 0.0


async def test_reclaim_takes_victims_only_where_the_waiting_unit_can_run() -> None:
    """Queue a fills four nodes; queue b may only use n0 and n1 (where a's
    oldest pods run). Victim order alone would pick a's newest pods, on n2
    and n3, which frees nothing b can use: the restriction picks n0's and n1's."""
    from tests.reclaim.test_loop import ReclaimCluster

    c = ReclaimCluster(grace=5.0)
    for index in range(4):
        c.clock.advance(1)
        await node(c, f"n{index}", **({"zone": "a"} if index < 2 else {}))
    await c.queue("a")
    await c.queue("b", nodeSelector={"zone": "a"})
    for index in range(4):
        c.clock.advance(1)
        await c.pod("na", f"p{index}", "a")
        await c.settle()
    c.running_pods("na")
    await c.settle()
    assert sorted(n for _, p in c.controller.mirror.engine.plans().items()
                  for n in p.nodes["main"]) == ["n0", "n1", "n2", "n3"]
    await c.pods("nb", "b", 2)
    await c.settle()
    for _ in range(4):
        await c.look(3.0)
    assert sorted(c.evicting.evicted) == ["p0", "p1"]
    await c.look()
    assert c.released_pods("nb") == ["p-000", "p-001"]
    plans = [c.controller.mirror.plan(f"nb/pod-p-00{i}") for i in range(2)]
    assert sorted(p.nodes["main"][0] for p in plans if p is not None) == ["n0", "n1"]
