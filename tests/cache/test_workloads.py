"""Workload records and the owner walk (DESIGN §14): which held workload an
object's controller chain reaches, by uid at every step; a forged or
foreign reference reaches none."""

from __future__ import annotations

from typing import Any

import pytest

from arbiter.cache.records import PodSet
from arbiter.cache.store import ClusterStore
from arbiter.cache.workloads import MAX_CHAIN, OwnerIndex, WorkloadError, workload_from_api
from arbiter.core.api import PLACED_ANNOTATION, QUEUE_LABEL
from arbiter.core.resources import Resources
from arbiter.integrations import enabled
from arbiter.integrations.jobset import JobSet
from arbiter.integrations.lws import GROUP_INDEX_LABEL

NS = "ml"
CPU1 = Resources.parse({"cpu": "1"})


def ref(kind: str, name: str, uid: str, controller: bool = True) -> dict[str, Any]:
    api = {"JobSet": "jobset.x-k8s.io/v1alpha2", "Job": "batch/v1", "Pod": "v1",
           "LeaderWorkerSet": "leaderworkerset.x-k8s.io/v1"}.get(kind, "apps/v1")
    return {"apiVersion": api, "kind": kind, "name": name, "uid": uid,
            "controller": controller, "blockOwnerDeletion": True}


def meta(name: str, uid: str, *owners: dict[str, Any], namespace: str = NS,
         labels: dict[str, str] | None = None, **extra: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"name": name, "namespace": namespace, "uid": uid,
                           "labels": dict(labels or {}), **extra}
    if owners:
        out["ownerReferences"] = list(owners)
    return out


def template(cpu: str = "1") -> dict[str, Any]:
    return {"spec": {"containers": [{"name": "c", "image": "busybox",
                                     "resources": {"requests": {"cpu": cpu}}}]}}


def jobset_obj(name: str = "train", uid: str = "js", queue: str | None = "q") -> dict[str, Any]:
    return {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
            "metadata": meta(name, uid, labels={QUEUE_LABEL: queue} if queue else {}),
            "spec": {"suspend": True, "replicatedJobs": [
                {"name": "driver", "replicas": 1,
                 "template": {"spec": {"parallelism": 1, "completions": 1,
                                       "template": template()}}},
                {"name": "workers", "replicas": 3,
                 "template": {"spec": {"parallelism": 1, "completions": 1,
                                       "template": {**template(),
                                                    "spec": {**template()["spec"],
                                                             "priorityClassName": "high"}}}}}]}}


def job_obj(name: str, uid: str, *owners: dict[str, Any], namespace: str = NS) -> dict[str, Any]:
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": meta(name, uid, *owners, namespace=namespace),
            "spec": {"suspend": True, "parallelism": 1, "template": template()}}


def pod_obj(name: str, uid: str, *owners: dict[str, Any], namespace: str = NS,
            labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": meta(name, uid, *owners, namespace=namespace, labels=labels),
            "spec": template()["spec"], "status": {"phase": "Pending"}}


def sts_obj(name: str, uid: str, *owners: dict[str, Any], replicas: int = 1,
            labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "StatefulSet",
            "metadata": meta(name, uid, *owners, labels=labels),
            "spec": {"replicas": replicas, "template": template()}}


def lws_obj() -> dict[str, Any]:
    return {"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
            "metadata": meta("serve", "lws", labels={QUEUE_LABEL: "q"}),
            "spec": {"replicas": 2, "leaderWorkerTemplate": {
                "size": 3, "workerTemplate": template("2")}}}


def store_with(*names: str) -> ClusterStore:
    store = ClusterStore()
    store.integrations = enabled(names)
    return store


def jobset_store(*names: str) -> ClusterStore:
    """A JobSet, its child Job (controller: the JobSet) and that Job's pod."""
    store = store_with(*names)
    store.apply("JobSet", "ADDED", jobset_obj())
    store.apply("Job", "ADDED", job_obj("train-workers-0", "job", ref("JobSet", "train", "js")))
    store.apply("Pod", "ADDED", pod_obj("train-workers-0-0", "pod", ref("Job", "train-workers-0",
                                                                        "job")))
    return store


def lws_store(*names: str) -> ClusterStore:
    """An LWS as its controller lays it out: leader StatefulSet (controller:
    the LWS), leader pod (the StatefulSet), worker StatefulSet (the leader
    pod), worker pod (the worker StatefulSet)."""
    store = store_with(*names)
    index = {GROUP_INDEX_LABEL: "1", "leaderworkerset.sigs.k8s.io/name": "serve"}
    store.apply("LeaderWorkerSet", "ADDED", lws_obj())
    store.apply("StatefulSet", "ADDED", sts_obj("serve", "lsts", ref("LeaderWorkerSet", "serve",
                                                                     "lws"), replicas=2))
    store.apply("Pod", "ADDED", pod_obj("serve-1", "leader", ref("StatefulSet", "serve", "lsts"),
                                        labels=index))
    store.apply("StatefulSet", "ADDED", sts_obj("serve-1", "wsts", ref("Pod", "serve-1",
                                                                       "leader"), replicas=2))
    store.apply("Pod", "ADDED", pod_obj("serve-1-1", "worker", ref("StatefulSet", "serve-1",
                                                                   "wsts"), labels=index))
    return store


# -- records --------------------------------------------------------------------------


def test_a_jobset_becomes_a_slim_record_through_the_store() -> None:
    store = store_with("jobset")
    obj = jobset_obj()
    obj["metadata"]["annotations"] = {PLACED_ANNOTATION: "{}"}
    obj["metadata"]["creationTimestamp"] = "2026-01-02T03:04:05Z"
    store.apply("JobSet", "ADDED", obj)
    record = store.workloads["JobSet"][f"{NS}/train"]
    assert (record.kind, record.uid, record.namespace, record.name) == ("JobSet", "js", NS, "train")
    assert record.queue == "q" and record.suspended and record.created > 0
    assert record.units is not None and len(record.units) == 1
    assert record.units[0].pod_sets == (PodSet("driver", 1, CPU1), PodSet("workers", 3, CPU1))
    # The first template's priority class stands for the workload.
    assert record.priority_class is None
    assert record.unit_name() == "jobset-train" and record.unit_key() == f"{NS}/jobset-train"
    assert record.integration is store.integrations[0]


def test_record_fields_read_defensively() -> None:
    obj = jobset_obj(queue=None)
    obj["metadata"]["ownerReferences"] = [
        "junk", ref("TrainJob", "t", "tj", controller=False), ref("TrainJob", "t2", "tj2")]
    obj["spec"]["replicatedJobs"][0]["replicas"] = "many"
    obj["status"] = {"conditions": [{"type": "Completed", "status": "True"}]}
    record = workload_from_api(JobSet(), obj)
    assert record.queue is None and record.units is None and record.outcome == "Complete"
    assert (record.owner_kind, record.owner_uid) == ("TrainJob", "tj2")


def test_a_bad_quantity_is_a_workload_error_and_the_store_keeps_what_it_had() -> None:
    store = store_with("jobset")
    store.apply("JobSet", "ADDED", jobset_obj())
    bad = jobset_obj()
    bad["spec"]["replicatedJobs"][0]["template"]["spec"]["template"] = template("lots")
    with pytest.raises(WorkloadError):
        workload_from_api(JobSet(), bad)
    store.apply("JobSet", "MODIFIED", bad)
    assert store.workloads["JobSet"][f"{NS}/train"].units is not None


def test_lws_units_per_group_and_a_deleted_workload_leaves_the_index() -> None:
    store = lws_store("lws")
    record = store.workloads["LeaderWorkerSet"][f"{NS}/serve"]
    assert record.units is not None and [u.suffix for u in record.units] == ["0", "1"]
    assert record.unit_name("1") == "lws-serve-1"
    assert store.pods["worker"].group_index == "1"
    store.apply("LeaderWorkerSet", "DELETED", lws_obj())
    assert f"{NS}/serve" not in store.workloads["LeaderWorkerSet"]
    assert "lws" not in store.owners.links
    assert store.root_workload(NS, "Pod", "worker") is None


# -- the owner index ------------------------------------------------------------------


def test_chain_follows_kind_and_uid_and_stops_at_a_mismatch() -> None:
    index = OwnerIndex.empty()
    index.put("p", "Pod", "p", NS, "Job", "j")
    index.put("j", "Job", f"{NS}/j", NS, "JobSet", "s")
    index.put("s", "JobSet", f"{NS}/s", NS, "", "")
    assert index.chain(NS, "Pod", "p") == [("Pod", "p"), ("Job", f"{NS}/j"),
                                           ("JobSet", f"{NS}/s")]
    assert index.chain(NS, "Job", "j") == [("Job", f"{NS}/j"), ("JobSet", f"{NS}/s")]
    # A reference naming the wrong kind for a uid, an unknown uid, no uid.
    assert index.chain(NS, "JobSet", "j") == []
    assert index.chain(NS, "Pod", "nope") == [] and index.chain(NS, "Pod", "") == []
    # Another namespace's reference never reaches these.
    assert index.chain("other", "Pod", "p") == []


def test_chain_stops_where_a_link_lies_about_its_owners_kind() -> None:
    index = OwnerIndex.empty()
    index.put("p", "Pod", "p", NS, "StatefulSet", "j")  # j is a Job, not a StatefulSet
    index.put("j", "Job", f"{NS}/j", NS, "JobSet", "s")
    index.put("s", "JobSet", f"{NS}/s", NS, "", "")
    assert index.chain(NS, "Pod", "p") == [("Pod", "p")]


def test_chain_across_namespaces_stops_at_the_namespace_boundary() -> None:
    index = OwnerIndex.empty()
    index.put("p", "Pod", "p", NS, "Job", "j")
    index.put("j", "Job", "team/j", "team", "", "")
    assert index.chain(NS, "Pod", "p") == [("Pod", "p")]


def test_a_cycle_of_forged_refs_ends_and_repeats_nothing() -> None:
    index = OwnerIndex.empty()
    index.put("a", "StatefulSet", f"{NS}/a", NS, "Pod", "b")
    index.put("b", "Pod", "b", NS, "StatefulSet", "a")
    chain = index.chain(NS, "Pod", "b")
    assert chain == [("Pod", "b"), ("StatefulSet", f"{NS}/a")]
    assert index.chain(NS, "StatefulSet", "a") == [("StatefulSet", f"{NS}/a"), ("Pod", "b")]
    assert index.descendants("a") == ["b"] and index.descendants("b") == ["a"]
    self_owned = OwnerIndex.empty()
    self_owned.put("x", "Pod", "x", NS, "Pod", "x")
    assert self_owned.chain(NS, "Pod", "x") == [("Pod", "x")]
    assert self_owned.descendants("x") == []


def test_descendants_by_level_bounded_and_limited() -> None:
    index = OwnerIndex.empty()
    index.put("s", "JobSet", f"{NS}/s", NS, "", "")
    for i in range(3):
        index.put(f"j{i}", "Job", f"{NS}/j{i}", NS, "JobSet", "s")
        index.put(f"p{i}", "Pod", f"p{i}", NS, "Job", f"j{i}")
    assert sorted(index.descendants("s")) == ["j0", "j1", "j2", "p0", "p1", "p2"]
    assert len(index.descendants("s", limit=4)) == 4
    assert index.descendants("p0") == [] and index.descendants("nope") == []
    # Re-parenting moves a child; dropping forgets it.
    index.put("p0", "Pod", "p0", NS, "Job", "j1")
    assert index.children["j1"] == {"p0", "p1"} and "j0" not in index.children
    index.drop("p1")
    index.drop("p1")
    assert index.children["j1"] == {"p0"} and "p1" not in index.links
    # A chain deeper than MAX_CHAIN is cut.
    deep = OwnerIndex.empty()
    for i in range(MAX_CHAIN + 3):
        deep.put(f"n{i}", "Pod", f"n{i}", NS, "Pod", f"n{i + 1}")
    assert len(deep.chain(NS, "Pod", "n0")) == MAX_CHAIN
    assert len(deep.descendants(f"n{MAX_CHAIN + 2}")) == MAX_CHAIN
    index.put("", "Pod", "", NS, "Job", "j0")  # no uid: not indexed
    assert "" not in index.links


# -- the store's owner walk -----------------------------------------------------------


def test_a_jobset_pod_and_job_reach_the_jobset() -> None:
    store = jobset_store("jobset")
    root = store.root_workload(NS, "Pod", "pod")
    assert root is not None and (root.kind, root.uid) == ("JobSet", "js")
    assert store.root_workload(NS, "Job", "job") is root
    assert store.root_workload(NS, "JobSet", "js") is root
    assert [p.uid for p in store.workload_pods(root)] == ["pod"]


def test_an_lws_worker_pod_reaches_the_lws_through_the_leader_pod() -> None:
    store = lws_store("lws", "statefulset")
    for kind, uid in (("Pod", "worker"), ("StatefulSet", "wsts"), ("Pod", "leader"),
                      ("StatefulSet", "lsts")):
        root = store.root_workload(NS, kind, uid)
        assert root is not None and (root.kind, root.uid) == ("LeaderWorkerSet", "lws"), uid
    lws = store.workloads["LeaderWorkerSet"][f"{NS}/serve"]
    assert sorted(p.uid for p in store.workload_pods(lws)) == ["leader", "worker"]


def test_lws_statefulsets_without_a_queue_are_no_root_of_their_own() -> None:
    # With only the StatefulSet integration on, the LWS's StatefulSets (no
    # queue label: the LWS controller sets none) hold nothing.
    store = lws_store("statefulset")
    assert store.root_workload(NS, "Pod", "worker") is None
    # A StatefulSet of its own with a queue is its pods' root.
    store.apply("StatefulSet", "ADDED", sts_obj("db", "db", labels={QUEUE_LABEL: "q"}))
    store.apply("Pod", "ADDED", pod_obj("db-0", "db-0", ref("StatefulSet", "db", "db")))
    root = store.root_workload(NS, "Pod", "db-0")
    assert root is not None and root.uid == "db"


def test_a_deployments_pods_have_no_root() -> None:
    store = store_with("deployment")
    store.apply("Deployment", "ADDED", {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": meta("web", "dep", labels={QUEUE_LABEL: "q"}),
        "spec": {"replicas": 3, "template": template()}})
    store.apply("Pod", "ADDED", pod_obj("web-abc-1", "wp", ref("ReplicaSet", "web-abc", "rs")))
    assert store.root_workload(NS, "Pod", "wp") is None
    assert store.root_workload(NS, "Deployment", "dep") is None


def test_a_forged_uid_reaches_no_root() -> None:
    store = jobset_store("jobset")
    # The right name and kind, a made-up uid.
    store.apply("Pod", "ADDED", pod_obj("sneaky", "sneaky", ref("JobSet", "train", "not-js")))
    assert store.root_workload(NS, "Pod", "sneaky") is None
    # The real uid, but claimed as the wrong kind.
    store.apply("Pod", "ADDED", pod_obj("sneaky2", "sneaky2", ref("Job", "train", "js")))
    assert store.root_workload(NS, "Pod", "sneaky2") is None
    # The real uid from another namespace.
    store.apply("Pod", "ADDED", pod_obj("far", "far", ref("JobSet", "train", "js"),
                                        namespace="other"))
    assert store.root_workload("other", "Pod", "far") is None
    assert store.root_workload(NS, "Pod", "far") is None
    root = store.workloads["JobSet"][f"{NS}/train"]
    assert "far" not in {p.uid for p in store.workload_pods(root)}


def test_an_integration_not_switched_on_is_no_root() -> None:
    assert jobset_store().root_workload(NS, "Pod", "pod") is None
    assert jobset_store("lws", "statefulset").root_workload(NS, "Pod", "pod") is None
    assert lws_store("jobset").root_workload(NS, "Pod", "worker") is None


def test_a_workload_without_a_queue_is_no_root() -> None:
    store = store_with("jobset")
    store.apply("JobSet", "ADDED", jobset_obj(queue=None))
    store.apply("Job", "ADDED", job_obj("j", "job", ref("JobSet", "train", "js")))
    assert store.root_workload(NS, "Job", "job") is None


def test_a_replaced_workload_of_the_same_name_loses_its_old_children() -> None:
    store = jobset_store("jobset")
    store.apply("JobSet", "DELETED", jobset_obj())
    store.apply("JobSet", "ADDED", jobset_obj(uid="js2"))
    # The old Job still names the old uid: it is not the new JobSet's.
    assert store.root_workload(NS, "Pod", "pod") is None
    assert store.workload_pods(store.workloads["JobSet"][f"{NS}/train"]) == []


def test_workload_unit_checks_the_consumer_uid() -> None:
    store = jobset_store("jobset")
    record = store.workloads["JobSet"][f"{NS}/train"]

    def unit(uid: str | None) -> dict[str, Any]:
        spec: dict[str, Any] = {"queue": "q", "podSets": [{"name": "driver", "count": 1}]}
        if uid is not None:
            spec["consumerRef"] = {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
                                   "name": "train", "uid": uid}
        return {"apiVersion": "arbiter.dev/v1alpha1", "kind": "QueueUnit",
                "metadata": {"name": "jobset-train", "namespace": NS, "uid": "u1"},
                "spec": spec}

    assert store.workload_unit(record) is None
    store.apply("QueueUnit", "ADDED", unit("js"))
    found = store.workload_unit(record)
    assert found is not None and found.name == "jobset-train"
    assert store.workload_unit(record, "0") is None
    store.apply("QueueUnit", "MODIFIED", unit("someone-else"))
    assert store.workload_unit(record) is None
    store.apply("QueueUnit", "MODIFIED", unit(None))
    assert store.workload_unit(record) is None


def test_a_forged_cycle_through_a_held_workload_counts_each_pod_once() -> None:
    store = store_with("statefulset")
    store.apply("StatefulSet", "ADDED", sts_obj("db", "db", ref("Pod", "db-0", "db-0"),
                                                labels={QUEUE_LABEL: "q"}))
    store.apply("Pod", "ADDED", pod_obj("db-0", "db-0", ref("StatefulSet", "db", "db")))
    root = store.root_workload(NS, "Pod", "db-0")
    assert root is not None and root.uid == "db"
    assert [p.uid for p in store.workload_pods(root)] == ["db-0"]
