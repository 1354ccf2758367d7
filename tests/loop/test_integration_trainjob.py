"""TrainJobs through the loop on the in-memory apiserver: one unit whose pod
sets are the JobSet's Trainer makes (none before it), admitted whole,
released by unsuspending with the pool's placement in arbiter's
runtimePatches entry, held again without touching that entry, finished from
its condition, and its JobSet's pods charged as its own (by uid)."""

from __future__ import annotations

from typing import Any

from arbiter.core.api import QUEUE_LABEL
from arbiter.integrations.trainjob import MANAGER
from arbiter.loop.placement import PodDirectives
from tests.loop.harness import Cluster
from tests.loop.workloads import NS, gpu_node, queued

TRAINJOBS = f"/apis/trainer.kubeflow.org/v1alpha1/namespaces/{NS}/trainjobs"
JOBSETS = f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/{NS}/jobsets"
USER_PATCH = {"manager": "example.com/tenant", "trainingRuntimeSpec": {"template": {"spec": {
    "replicatedJobs": [{"name": "node", "template": {"spec": {"template": {
        "metadata": {"annotations": {"a": "b"}}}}}}]}}}}


async def trainjob(c: Cluster, name: str = "tune", nodes: int = 2) -> dict[str, Any]:
    """A TrainJob as the webhook leaves it (queue label, suspended) and,
    as Trainer makes it, its JobSet: `nodes` pods of 1 CPU in `node`."""
    owner = await c.api.create(TRAINJOBS, {
        "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
        "metadata": {"name": name, "namespace": NS, "labels": {QUEUE_LABEL: "q"}},
        "spec": {"suspend": True, "runtimeRef": {"name": "torch-distributed"},
                 "trainer": {"numNodes": nodes}, "runtimePatches": [USER_PATCH]}})
    return owner


async def trainers_jobset(c: Cluster, owner: dict[str, Any], nodes: int = 2) -> dict[str, Any]:
    meta = owner["metadata"]
    return await c.api.create(JOBSETS, {
        "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
        "metadata": {"name": meta["name"], "namespace": NS, "ownerReferences": [{
            "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
            "name": meta["name"], "uid": meta["uid"], "controller": True}]},
        "spec": {"suspend": True, "replicatedJobs": [{
            "name": "node", "replicas": 1, "template": {"spec": {
                "parallelism": nodes, "completions": nodes, "template": {"spec": {
                    "containers": [{"name": "node", "image": "x",
                                    "resources": {"requests": {"cpu": "1"}}}]}}}}}]}})


def units(c: Cluster) -> list[str]:
    return sorted(u["metadata"]["name"] for u in c.api.of_kind("queueunits"))


def spec(c: Cluster, name: str = "tune") -> dict[str, Any]:
    result: dict[str, Any] = c.api.objects[f"{TRAINJOBS}/{name}"]["spec"]
    return result


def ours(c: Cluster) -> dict[str, Any] | None:
    return next((p for p in spec(c).get("runtimePatches", []) if p["manager"] == MANAGER), None)


async def test_no_unit_until_its_jobset_is_seen_then_one_unit_of_the_jobsets_pods() -> None:
    c = await queued(4)
    owner = await trainjob(c)
    await c.settle()
    assert units(c) == [] and spec(c)["suspend"] is True
    await trainers_jobset(c, owner)
    await c.settle()
    assert units(c) == ["trainjob-tune"]  # the JobSet has none of its own
    unit = c.unit_obj(NS, "trainjob-tune")
    assert unit["spec"]["consumerRef"]["kind"] == "TrainJob"
    assert unit["spec"]["consumerRef"]["uid"] == owner["metadata"]["uid"]
    assert [(s["name"], s["count"]) for s in unit["spec"]["podSets"]] == [("node", 2)]


async def test_admitted_whole_only_when_both_nodes_fit_then_unsuspended_and_placed() -> None:
    c = await queued(gpu=1)
    await trainers_jobset(c, await trainjob(c))
    await c.settle()
    assert c.phase(NS, "trainjob-tune") in (None, "Enqueued")  # 2 CPUs asked, 1 there
    assert spec(c)["suspend"] is True and ours(c) is None
    # The JobSet stays as Trainer made it: arbiter never writes the child.
    assert c.api.objects[f"{JOBSETS}/tune"]["spec"]["suspend"] is True
    await gpu_node(c, 1)
    await c.settle()
    assert c.phase(NS, "trainjob-tune") == "Dequeued"
    assert spec(c)["suspend"] is False
    assert spec(c)["runtimePatches"][0] == USER_PATCH  # the tenant's entry stays first
    entry = ours(c)
    assert entry is not None
    (job,) = entry["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    assert job == {"name": "node", "template": {"spec": {"template": {"spec": {
        "nodeSelector": {"pool": "gpu"}}}}}}


async def test_held_again_it_is_suspended_and_its_entry_waits_for_the_next_release() -> None:
    c = await queued(gpu=2)
    await trainers_jobset(c, await trainjob(c))
    await c.settle()
    placed = ours(c)
    assert placed is not None and spec(c)["suspend"] is False
    unit = c.store.units[f"{NS}/trainjob-tune"]
    await c.controller.actions.hold(unit)
    assert spec(c)["suspend"] is True
    # Trainer refuses runtimePatches changes while the JobSet's Jobs are active.
    assert spec(c)["runtimePatches"] == [USER_PATCH, placed]
    # The next release, into another pool, replaces it in the unsuspending write.
    await c.controller.actions.release_workload(
        unit, (), PodDirectives(node_selector=(("pool", "cpu"),)))
    assert spec(c)["suspend"] is False
    assert spec(c)["runtimePatches"][0] == USER_PATCH
    entry = ours(c)
    assert entry is not None and len(spec(c)["runtimePatches"]) == 2
    (job,) = entry["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    assert job["template"]["spec"]["template"]["spec"] == {"nodeSelector": {"pool": "cpu"}}


async def test_finished_from_its_condition_and_its_room_goes_to_the_next() -> None:
    c = await queued(2)
    await trainers_jobset(c, await trainjob(c))
    await c.settle()
    assert c.phase(NS, "trainjob-tune") == "Dequeued"
    other = await trainjob(c, "next")
    await trainers_jobset(c, other)
    await c.settle()
    assert c.phase(NS, "trainjob-next") in (None, "Enqueued")
    c.api.set_status(f"{TRAINJOBS}/tune", {"conditions": [{"type": "Complete",
                                                          "status": "True"}]})
    await c.settle()
    assert c.phase(NS, "trainjob-tune") == "Succeed"
    assert c.phase(NS, "trainjob-next") == "Dequeued"


async def test_the_pods_of_its_jobsets_jobs_are_its_own_on_their_nodes() -> None:
    """pod -> Job -> JobSet -> TrainJob, by uid: charged as the TrainJob's
    unit, never as uncovered usage or a unit of their own."""
    c = await queued(2)
    child = await trainers_jobset(c, await trainjob(c))
    await c.settle()
    assert c.phase(NS, "trainjob-tune") == "Dequeued"
    await c.job(NS, "tune-node-0", "q", suspend=False)
    c.api.edit(f"/apis/batch/v1/namespaces/{NS}/jobs/tune-node-0", lambda o: o[
        "metadata"].__setitem__("ownerReferences", [{
            "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "name": "tune",
            "uid": child["metadata"]["uid"], "controller": True}]))
    for index in range(2):
        await c.job_pod(NS, "tune-node-0", f"tune-node-0-{index}", node=f"node-{index}")
    await c.settle()
    nodes = c.controller.mirror.nodes
    assert nodes.uncovered_pods(f"{NS}/trainjob-tune") == []
    assert [nodes.used(f"node-{i}") for i in range(2)] == [nodes.used("none")] * 2
    assert units(c) == ["trainjob-tune"]
    assert c.controller.charges.usage(c.store) == {}
