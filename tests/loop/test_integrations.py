"""Workloads of the integrations through the loop (DESIGN §14), on the
in-memory apiserver: units made from the spec, admitted whole, released by
unsuspending or by letting gated pods go, taken back, charged by the
controller chain (uids, never names)."""

from __future__ import annotations

from typing import Any

from arbiter.core.api import QUEUE_LABEL
from arbiter.integrations.lws import GROUP_INDEX_LABEL
from tests.loop.harness import Cluster
from tests.loop.workloads import NS, owned_pod, queued, template, with_kind

JOBSETS = f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/{NS}/jobsets"
STATEFULSETS = f"/apis/apps/v1/namespaces/{NS}/statefulsets"
LWSS = f"/apis/leaderworkerset.x-k8s.io/v1/namespaces/{NS}/leaderworkersets"


async def jobset(c: Cluster, name: str, queue: str = "q") -> dict[str, Any]:
    def replicated(job: str, replicas: int) -> dict[str, Any]:
        return {"name": job, "replicas": replicas,
                "template": {"metadata": {"labels": {QUEUE_LABEL: queue}},
                             "spec": {"parallelism": 1, "completions": 1,
                                      "template": template(queue)}}}
    return await c.api.create(JOBSETS, {
        "metadata": {"name": name, "namespace": NS, "labels": {QUEUE_LABEL: queue}},
        "spec": {"suspend": True,
                 "replicatedJobs": [replicated("driver", 1), replicated("workers", 3)]}})


async def statefulset(c: Cluster, name: str, replicas: int, queue: str = "q") -> dict[str, Any]:
    return await c.api.create(STATEFULSETS, {
        "metadata": {"name": name, "namespace": NS, "labels": {QUEUE_LABEL: queue}},
        "spec": {"replicas": replicas, "template": template(queue)}})


async def test_a_jobset_is_one_unit_admitted_whole_when_it_all_fits() -> None:
    c = await queued(3)
    await jobset(c, "train")
    await c.settle()
    unit = c.unit_obj(NS, "jobset-train")
    assert unit["spec"]["consumerRef"]["kind"] == "JobSet"
    assert unit["spec"]["consumerRef"]["apiVersion"] == "jobset.x-k8s.io/v1alpha2"
    assert [(s["name"], s["count"]) for s in unit["spec"]["podSets"]] == \
        [("driver", 1), ("workers", 3)]
    assert c.phase(NS, "jobset-train") in (None, "Enqueued")  # 4 CPUs asked, 3 there
    assert c.api.objects[f"{JOBSETS}/train"]["spec"]["suspend"] is True
    await c.node("node-3")
    await c.settle()
    assert c.phase(NS, "jobset-train") == "Dequeued"
    assert c.api.objects[f"{JOBSETS}/train"]["spec"]["suspend"] is False


async def test_a_jobsets_child_jobs_get_no_unit_of_their_own() -> None:
    c = await queued(4)
    owner = with_kind(await jobset(c, "train"), "JobSet", "jobset.x-k8s.io/v1alpha2")
    child = await c.job(NS, "train-driver-0", "q")
    c.api.edit(f"/apis/batch/v1/namespaces/{NS}/jobs/train-driver-0", lambda o: o[
        "metadata"].__setitem__("ownerReferences", [{
            "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "name": "train",
            "uid": owner["metadata"]["uid"], "controller": True}]))
    await c.settle()
    assert child["metadata"]["name"] not in {u["metadata"]["name"] for u in
                                             c.api.of_kind("queueunits")}
    assert sorted(u["metadata"]["name"] for u in c.api.of_kind("queueunits")) == \
        ["jobset-train"]


async def test_a_job_naming_a_jobset_that_does_not_exist_waits_unqueued() -> None:
    c = await queued(4)
    await c.job(NS, "stray", "q")
    c.api.edit(f"/apis/batch/v1/namespaces/{NS}/jobs/stray", lambda o: o[
        "metadata"].__setitem__("ownerReferences", [{
            "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "name": "ghost",
            "uid": "forged-uid", "controller": True}]))
    await c.settle()
    assert c.api.of_kind("queueunits") == []
    assert c.suspended(NS, "stray")


async def test_a_statefulset_gets_its_unit_before_any_pod_and_lets_pods_go_as_they_come(
) -> None:
    c = await queued(3)
    sts = with_kind(await statefulset(c, "web", 3), "StatefulSet", "apps/v1")
    await c.settle()
    assert c.phase(NS, "sts-web") == "Dequeued"
    assert c.unit_obj(NS, "sts-web")["spec"]["podSets"][0]["count"] == 3
    # OrderedReady: the controller makes web-0 first, the next once it is Ready.
    await owned_pod(c, "web-0", sts)
    await c.settle()
    assert not c.gated(NS, "web-0")
    await owned_pod(c, "web-1", sts)
    await owned_pod(c, "web-2", sts)
    await c.settle()
    assert not c.gated(NS, "web-1") and not c.gated(NS, "web-2")
    # A fourth pod claiming the StatefulSet was never admitted: it stays gated.
    await owned_pod(c, "web-3", sts)
    await c.settle()
    assert c.gated(NS, "web-3")


async def test_a_statefulset_with_too_little_room_runs_no_pod() -> None:
    c = await queued(2)
    sts = with_kind(await statefulset(c, "web", 3), "StatefulSet", "apps/v1")
    await owned_pod(c, "web-0", sts)
    await c.settle()
    assert c.phase(NS, "sts-web") in (None, "Enqueued")
    assert c.gated(NS, "web-0")


async def test_scaling_an_admitted_statefulset_to_zero_frees_its_quota() -> None:
    c = await queued(3)
    sts = with_kind(await statefulset(c, "web", 3), "StatefulSet", "apps/v1")
    await c.settle()
    await owned_pod(c, "web-0", sts)
    await c.settle()
    assert c.phase(NS, "sts-web") == "Dequeued"
    await c.api.merge_patch(f"{STATEFULSETS}/web", {"spec": {"replicas": 0}})
    await c.settle()
    assert c.phase(NS, "sts-web") == "Enqueued"
    assert f"/api/v1/namespaces/{NS}/pods/web-0" not in c.api.objects
    # The room is free: another StatefulSet of 3 is admitted.
    await statefulset(c, "other", 3)
    await c.settle()
    assert c.phase(NS, "sts-other") == "Dequeued"


async def test_a_lws_is_one_unit_per_group_all_or_nothing() -> None:
    c = await queued(4)
    await c.api.create(LWSS, {
        "metadata": {"name": "serve", "namespace": NS, "labels": {QUEUE_LABEL: "q"}},
        "spec": {"replicas": 2, "leaderWorkerTemplate": {
            "size": 3, "workerTemplate": template("q")}}})
    await c.settle()
    phases = sorted(c.phase(NS, f"lws-serve-{i}") or "Enqueued" for i in range(2))
    assert phases == ["Dequeued", "Enqueued"]
    unit = c.unit_obj(NS, "lws-serve-0")
    assert [(s["name"], s["count"]) for s in unit["spec"]["podSets"]] == \
        [("leader", 1), ("workers", 2)]


async def test_lws_pods_are_let_go_by_their_groups_unit_through_the_chain() -> None:
    c = await queued(3)
    lws = with_kind(await c.api.create(LWSS, {
        "metadata": {"name": "serve", "namespace": NS, "labels": {QUEUE_LABEL: "q"}},
        "spec": {"replicas": 2, "leaderWorkerTemplate": {
            "size": 3, "workerTemplate": template("q")}}}),
        "LeaderWorkerSet", "leaderworkerset.x-k8s.io/v1")
    leaders = with_kind(await c.api.create(STATEFULSETS, {
        "metadata": {"name": "serve", "namespace": NS, "ownerReferences": [{
            "apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
            "name": "serve", "uid": lws["metadata"]["uid"], "controller": True}]},
        "spec": {"replicas": 2, "template": template("q")}}), "StatefulSet", "apps/v1")
    await c.settle()
    admitted = [i for i in range(2) if c.phase(NS, f"lws-serve-{i}") == "Dequeued"]
    assert len(admitted) == 1
    assert "sts-serve" not in {u["metadata"]["name"] for u in c.api.of_kind("queueunits")}
    group, other = str(admitted[0]), str(1 - admitted[0])
    leader = with_kind(await owned_pod(c, f"serve-{group}", leaders,
                                       labels={GROUP_INDEX_LABEL: group}), "Pod", "v1")
    await owned_pod(c, f"serve-{other}", leaders, labels={GROUP_INDEX_LABEL: other})
    workers = with_kind(await c.api.create(STATEFULSETS, {
        "metadata": {"name": f"serve-{group}", "namespace": NS, "ownerReferences": [{
            "apiVersion": "v1", "kind": "Pod", "name": f"serve-{group}",
            "uid": leader["metadata"]["uid"], "controller": True}]},
        "spec": {"replicas": 2, "template": template("q")}}), "StatefulSet", "apps/v1")
    for index in (1, 2):
        await owned_pod(c, f"serve-{group}-{index}", workers, labels={GROUP_INDEX_LABEL: group})
    await c.settle()
    assert c.released_pods(NS) == sorted(
        [f"serve-{group}", f"serve-{group}-1", f"serve-{group}-2"])
    assert c.gated(NS, f"serve-{other}")


async def test_a_jobset_is_placed_into_every_template_and_finishing_frees_its_quota() -> None:
    c = await queued(gpu=4)
    await jobset(c, "train")
    await c.settle()
    spec = c.api.objects[f"{JOBSETS}/train"]["spec"]
    assert spec["suspend"] is False
    selectors = [job["template"]["spec"]["template"]["spec"].get("nodeSelector")
                 for job in spec["replicatedJobs"]]
    assert selectors == [{"pool": "gpu"}, {"pool": "gpu"}]
    # Finished: the unit ends and its room goes to the next.
    c.api.set_status(f"{JOBSETS}/train", {"conditions": [{"type": "Completed",
                                                         "status": "True"}]})
    await c.settle()
    assert c.phase(NS, "jobset-train") == "Succeed"
    await jobset(c, "next")
    await c.settle()
    assert c.phase(NS, "jobset-next") == "Dequeued"


async def test_holding_a_jobset_again_suspends_it_and_takes_the_placement_off() -> None:
    c = await queued(gpu=4)
    await jobset(c, "train")
    await c.settle()
    unit = c.store.units[f"{NS}/jobset-train"]
    await c.controller.actions.hold(unit)
    spec = c.api.objects[f"{JOBSETS}/train"]["spec"]
    assert spec["suspend"] is True
    assert [job["template"]["spec"]["template"]["spec"].get("nodeSelector")
            for job in spec["replicatedJobs"]] == [None, None]
    assert "arbiter.dev/placed" not in (
        c.api.objects[f"{JOBSETS}/train"]["metadata"].get("annotations") or {})


async def test_the_running_pods_of_an_admitted_statefulset_are_its_units_not_unqueued(
) -> None:
    c = await queued(3)
    sts = with_kind(await statefulset(c, "web", 2), "StatefulSet", "apps/v1")
    await c.settle()
    for index in range(2):
        await owned_pod(c, f"web-{index}", sts)
    await c.settle()
    for index in range(2):
        def bind(pod: dict[str, Any], node: str = f"node-{index}") -> None:
            pod["spec"]["nodeName"] = node
            pod["status"]["phase"] = "Running"
        c.api.edit(f"/api/v1/namespaces/{NS}/pods/web-{index}", bind)
    await c.settle()
    assert c.phase(NS, "sts-web") == "Running"
    assert c.controller.charges.usage(c.store) == {}


async def test_a_statefulsets_pods_labelled_into_a_pod_group_are_still_its_units() -> None:
    c = await queued(3)
    sts = with_kind(await statefulset(c, "web", 2), "StatefulSet", "apps/v1")
    for index in range(2):
        await owned_pod(c, f"web-{index}", sts, labels={
            "arbiter.dev/pod-group": "g"})
    c.api.edit(f"/api/v1/namespaces/{NS}/pods/web-0", lambda o: o["metadata"].setdefault(
        "annotations", {}).__setitem__("arbiter.dev/pod-group-size", "2"))
    await c.settle()
    assert sorted(u["metadata"]["name"] for u in c.api.of_kind("queueunits")) == ["sts-web"]
    assert c.released_pods(NS) == ["web-0", "web-1"]


async def test_a_jobsets_bound_pods_count_once_on_their_nodes() -> None:
    """The pods of a JobSet's child Jobs are its unit's on their nodes (by
    the chain pod -> Job -> JobSet), not uncovered usage besides its plan:
    counted twice, taking the JobSet back would never make room."""
    c = await queued(4)
    owner = with_kind(await jobset(c, "train"), "JobSet", "jobset.x-k8s.io/v1alpha2")
    await c.settle()
    assert c.phase(NS, "jobset-train") == "Dequeued"
    for index, job in enumerate(("driver", "workers-0", "workers-1", "workers-2")):
        name = f"train-{job}"
        await c.job(NS, name, "q", suspend=False)
        c.api.edit(f"/apis/batch/v1/namespaces/{NS}/jobs/{name}", lambda o: o[
            "metadata"].__setitem__("ownerReferences", [{
                "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "name": "train",
                "uid": owner["metadata"]["uid"], "controller": True}]))
        await c.job_pod(NS, name, f"{name}-pod", node=f"node-{index}")
    await c.settle()
    nodes = c.controller.mirror.nodes
    assert [nodes.used(f"node-{i}") for i in range(4)] == [nodes.used("none")] * 4
    assert nodes.uncovered_pods(f"{NS}/jobset-train") == []
    assert sorted(u["metadata"]["name"] for u in c.api.of_kind("queueunits")) == \
        ["jobset-train"]


async def test_an_admitted_statefulset_scaled_up_is_held_again_and_queued_at_its_new_size(
) -> None:
    c = await queued(3)
    sts = with_kind(await statefulset(c, "web", 2), "StatefulSet", "apps/v1")
    await c.settle()
    for index in range(2):
        await owned_pod(c, f"web-{index}", sts)
    await c.settle()
    assert c.released_pods(NS) == ["web-0", "web-1"]
    await c.api.merge_patch(f"{STATEFULSETS}/web", {"spec": {"replicas": 4}})
    await c.settle()
    # Its pods are made again (the controller would) and wait: 4 do not fit in 3.
    assert c.api.of_kind("pods") == []
    assert c.unit_obj(NS, "sts-web")["spec"]["podSets"][0]["count"] == 4
    assert c.phase(NS, "sts-web") == "Enqueued"
    await c.node("node-3")
    await c.settle()
    assert c.phase(NS, "sts-web") == "Dequeued"
