"""RayCluster and RayJob through the loop, on the in-memory apiserver: one
unit admitted whole, placed into every template, unsuspended; the pods
KubeRay makes (gated) let go as many as the unit counts; held again by
suspending; a worker group scaled after admission goes back to the queue
at its new size (the autoscaler's scaling does not); a RayJob's cluster
and submitter Job are its own, with no unit of theirs."""

from __future__ import annotations

from typing import Any

from arbiter.core.api import QUEUE_LABEL
from tests.loop.workloads import NS, gpu_node, owned_pod, queued, template, with_kind

RAYCLUSTERS = f"/apis/ray.io/v1/namespaces/{NS}/rayclusters"
RAYJOBS = f"/apis/ray.io/v1/namespaces/{NS}/rayjobs"
POD_SETS = [("head", 1), ("cpu", 4)]


def cluster_spec(workers: int = 4, queue: str = "q", **fields: Any) -> dict[str, Any]:
    return {"headGroupSpec": {"rayStartParams": {}, "template": template(queue)},
            "workerGroupSpecs": [{"groupName": "cpu", "replicas": workers, "minReplicas": 0,
                                  "maxReplicas": 8, "rayStartParams": {},
                                  "template": template(queue)}], **fields}


async def raycluster(c: Any, name: str, workers: int = 4, **fields: Any) -> dict[str, Any]:
    created = await c.api.create(RAYCLUSTERS, {
        "metadata": {"name": name, "namespace": NS, "labels": {QUEUE_LABEL: "q"}},
        "spec": {"suspend": True, **cluster_spec(workers, **fields)}})
    return with_kind(created, "RayCluster", "ray.io/v1")


def selectors(spec: dict[str, Any]) -> list[Any]:
    return [spec["headGroupSpec"]["template"]["spec"].get("nodeSelector"),
            *(g["template"]["spec"].get("nodeSelector") for g in spec["workerGroupSpecs"])]


async def test_a_raycluster_is_admitted_whole_placed_and_its_pods_let_go() -> None:
    c = await queued(gpu=4)
    rc = await raycluster(c, "rc")
    await c.settle()
    unit = c.unit_obj(NS, "raycluster-rc")
    assert unit["spec"]["consumerRef"]["kind"] == "RayCluster"
    assert [(s["name"], s["count"]) for s in unit["spec"]["podSets"]] == POD_SETS
    assert c.phase(NS, "raycluster-rc") in (None, "Enqueued")  # 5 CPUs asked, 4 there
    assert c.api.objects[f"{RAYCLUSTERS}/rc"]["spec"]["suspend"] is True
    await gpu_node(c, 4)
    await c.settle()
    assert c.phase(NS, "raycluster-rc") == "Dequeued"
    spec = c.api.objects[f"{RAYCLUSTERS}/rc"]["spec"]
    assert spec["suspend"] is False
    assert selectors(spec) == [{"pool": "gpu"}] * 2
    # KubeRay makes the head and 4 workers (gated at the door): all let go.
    for name in ("rc-head", *(f"rc-cpu-worker-{i}" for i in range(4))):
        await owned_pod(c, name, rc)
    await c.settle()
    assert len(c.released_pods(NS)) == 5
    assert all(c.api.objects[f"/api/v1/namespaces/{NS}/pods/{p}"]["spec"].get("nodeSelector")
               == {"pool": "gpu"} for p in c.released_pods(NS))
    # A sixth pod naming the cluster was never admitted: it stays gated.
    await owned_pod(c, "rc-extra", rc)
    await c.settle()
    assert c.gated(NS, "rc-extra")


async def test_holding_a_raycluster_suspends_it_and_takes_the_placement_off() -> None:
    c = await queued(gpu=5)
    await raycluster(c, "rc")
    await c.settle()
    assert c.api.objects[f"{RAYCLUSTERS}/rc"]["spec"]["suspend"] is False
    await c.controller.actions.hold(c.store.units[f"{NS}/raycluster-rc"])
    spec = c.api.objects[f"{RAYCLUSTERS}/rc"]["spec"]
    assert spec["suspend"] is True and selectors(spec) == [None, None]


async def test_a_worker_group_scaled_after_admission_is_queued_again_at_its_new_size() -> None:
    c = await queued(5)
    rc = await raycluster(c, "rc")
    await c.settle()
    assert c.phase(NS, "raycluster-rc") == "Dequeued"
    for name in ("rc-head", *(f"rc-cpu-worker-{i}" for i in range(4))):
        await owned_pod(c, name, rc)
    await c.settle()
    await c.api.merge_patch(f"{RAYCLUSTERS}/rc", {"spec": {"workerGroupSpecs": [
        {**cluster_spec()["workerGroupSpecs"][0], "replicas": 5}]}})
    await c.settle()
    # Suspended (KubeRay deletes its pods) and waiting whole at 6 pods: 5 nodes.
    assert c.api.objects[f"{RAYCLUSTERS}/rc"]["spec"]["suspend"] is True
    assert c.phase(NS, "raycluster-rc") == "Enqueued"
    assert [(s["name"], s["count"]) for s in c.unit_obj(NS, "raycluster-rc")["spec"][
        "podSets"]] == [("head", 1), ("cpu", 5)]
    await c.node("node-5")
    await c.settle()
    assert c.phase(NS, "raycluster-rc") == "Dequeued"


async def test_the_autoscaler_moving_replicas_keeps_the_admission() -> None:
    c = await queued(9, cpu="2")  # the head asks 1.5 CPUs with the autoscaler
    await raycluster(c, "rc", 1, enableInTreeAutoscaling=True)
    await c.settle()
    unit = c.unit_obj(NS, "raycluster-rc")
    assert [(s["name"], s["count"]) for s in unit["spec"]["podSets"]] == [("head", 1),
                                                                          ("cpu", 8)]
    assert c.phase(NS, "raycluster-rc") == "Dequeued"
    await c.api.merge_patch(f"{RAYCLUSTERS}/rc", {"spec": {"workerGroupSpecs": [
        {**cluster_spec()["workerGroupSpecs"][0], "replicas": 6}]}})
    await c.settle()
    assert c.phase(NS, "raycluster-rc") == "Dequeued"
    assert c.api.objects[f"{RAYCLUSTERS}/rc"]["spec"]["suspend"] is False


async def test_a_rayjob_is_one_unit_with_its_cluster_and_submitter_as_children() -> None:
    c = await queued(4)
    job = with_kind(await c.api.create(RAYJOBS, {
        "metadata": {"name": "rj", "namespace": NS, "labels": {QUEUE_LABEL: "q"}},
        "spec": {"suspend": True, "entrypoint": "python x.py", "shutdownAfterJobFinishes": True,
                 "rayClusterSpec": cluster_spec(2)}}), "RayJob", "ray.io/v1")
    await c.settle()
    unit = c.unit_obj(NS, "rayjob-rj")
    assert [(s["name"], s["count"]) for s in unit["spec"]["podSets"]] == [
        ("head", 1), ("cpu", 2), ("submitter", 1)]
    assert c.phase(NS, "rayjob-rj") == "Dequeued"
    assert c.api.objects[f"{RAYJOBS}/rj"]["spec"]["suspend"] is False
    # KubeRay makes the cluster (the RayJob's labels copied) and the submitter Job.
    owner = [{"apiVersion": "ray.io/v1", "kind": "RayJob", "name": "rj",
              "uid": job["metadata"]["uid"], "controller": True}]
    rc = with_kind(await c.api.create(RAYCLUSTERS, {
        "metadata": {"name": "rj-x", "namespace": NS, "labels": {QUEUE_LABEL: "q"},
                     "ownerReferences": owner},
        "spec": cluster_spec(2)}), "RayCluster", "ray.io/v1")
    submitter = await c.job(NS, "rj", "q")
    c.api.edit(f"/apis/batch/v1/namespaces/{NS}/jobs/rj", lambda o: o["metadata"].__setitem__(
        "ownerReferences", owner))
    await c.settle()
    assert sorted(u["metadata"]["name"] for u in c.api.of_kind("queueunits")) == ["rayjob-rj"]
    for name in ("rj-x-head", "rj-x-cpu-0", "rj-x-cpu-1"):
        await owned_pod(c, name, rc)
    await owned_pod(c, "rj-submit", with_kind(submitter, "Job", "batch/v1"))
    await c.settle()
    assert c.released_pods(NS) == ["rj-submit", "rj-x-cpu-0", "rj-x-cpu-1", "rj-x-head"]
    # Finished (KubeRay's report): its unit ends, it is not queued again.
    c.api.set_status(f"{RAYJOBS}/rj", {"jobDeploymentStatus": "Complete",
                                       "jobStatus": "SUCCEEDED"})
    await c.settle()
    assert c.phase(NS, "rayjob-rj") == "Succeed"
    assert c.api.objects[f"{RAYJOBS}/rj"]["spec"]["suspend"] is False
