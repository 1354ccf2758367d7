"""The owner walk for KubeRay's objects, by uid at every step: a RayJob's
RayCluster and its pods, and its submitter Job and that Job's pod, all
reach the RayJob (they have no unit of their own); a RayJob on an existing
cluster (`clusterSelector`) is no queue's, so its submitter Job is its own
work; forged references reach nothing."""

from __future__ import annotations

from typing import Any

from arbiter.cache.ownership import ConsumerKey
from arbiter.cache.store import ClusterStore
from arbiter.core.api import QUEUE_LABEL
from arbiter.loop.workloads import desired, pods_of
from tests.cache.test_workloads import NS, job_obj, meta, pod_obj, ref, store_with, template
from tests.integrations.test_ray import cluster_spec, group

QUEUE = {QUEUE_LABEL: "q"}


def rayjob_obj(uid: str = "rj", **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": meta("rj", uid, labels=QUEUE),
            "spec": {"suspend": False, "shutdownAfterJobFinishes": True,
                     "rayClusterSpec": cluster_spec(group("cpu", 2)), **spec}}


def raycluster_obj(name: str, uid: str, *owners: dict[str, Any],
                   namespace: str = NS) -> dict[str, Any]:
    # KubeRay copies the RayJob's labels (the queue's too) onto the cluster it makes.
    return {"apiVersion": "ray.io/v1", "kind": "RayCluster",
            "metadata": meta(name, uid, *owners, namespace=namespace, labels=QUEUE),
            "spec": cluster_spec(group("cpu", 2))}


def rayjob_store() -> ClusterStore:
    """A RayJob as KubeRay lays it out: its RayCluster (controller: the
    RayJob) with a head and a worker pod, and its submitter Job (controller:
    the RayJob) with its pod."""
    store = store_with("raycluster", "rayjob")
    store.apply("RayJob", "ADDED", rayjob_obj())
    store.apply("RayCluster", "ADDED", raycluster_obj("rj-abcde", "rc", ref("RayJob", "rj", "rj")))
    store.apply("Pod", "ADDED", pod_obj("rj-abcde-head", "head", ref("RayCluster", "rj-abcde",
                                                                     "rc")))
    store.apply("Pod", "ADDED", pod_obj("rj-abcde-cpu-worker-x", "worker",
                                        ref("RayCluster", "rj-abcde", "rc")))
    store.apply("Job", "ADDED", job_obj("rj", "submitter", ref("RayJob", "rj", "rj")))
    store.apply("Pod", "ADDED", pod_obj("rj-xyz", "submit", ref("Job", "rj", "submitter")))
    return store


def test_every_object_of_a_rayjob_reaches_it_by_uid() -> None:
    store = rayjob_store()
    rayjob = store.workloads["RayJob"][f"{NS}/rj"]
    for kind, uid in (("RayCluster", "rc"), ("Pod", "head"), ("Pod", "worker"),
                      ("Job", "submitter"), ("Pod", "submit")):
        assert store.root_workload(NS, kind, uid) is rayjob, (kind, uid)
    assert {p.uid for p in store.workload_pods(rayjob)} == {"head", "worker", "submit"}
    assert {p.uid for p in pods_of(store, rayjob, "")} == {"head", "worker", "submit"}


def test_the_rayjobs_cluster_has_no_unit_of_its_own() -> None:
    store = rayjob_store()
    cluster = store.workloads["RayCluster"][f"{NS}/rj-abcde"]
    assert cluster.queue == "q" and cluster.units  # labelled, with a readable spec
    assert desired(store, ConsumerKey("RayCluster", NS, "rj-abcde"), {}) is None
    wanted = desired(store, ConsumerKey("RayJob", NS, "rj"), {})
    assert wanted is not None and [ps.name for ps in wanted.pod_sets] == [
        "head", "cpu", "submitter"]


def test_a_cluster_made_before_its_rayjob_is_seen_waits() -> None:
    store = store_with("raycluster", "rayjob")
    store.apply("RayCluster", "ADDED", raycluster_obj("rj-abcde", "rc", ref("RayJob", "rj", "rj")))
    assert store.owner_pending("RayJob", "rj")
    assert desired(store, ConsumerKey("RayCluster", NS, "rj-abcde"), {}) is None


def test_forged_references_reach_nothing() -> None:
    store = rayjob_store()
    # The cluster's name with another uid, another namespace's cluster, a
    # RayJob's uid named as a RayCluster.
    store.apply("Pod", "ADDED", pod_obj("p1", "forged1", ref("RayCluster", "rj-abcde", "other")))
    store.apply("Pod", "ADDED", pod_obj("p2", "forged2", ref("RayCluster", "rj-abcde", "rc"),
                                        namespace="team-b"))
    store.apply("Pod", "ADDED", pod_obj("p3", "forged3", ref("RayCluster", "rj", "rj")))
    assert store.root_workload(NS, "Pod", "forged1") is None
    assert store.root_workload("team-b", "Pod", "forged2") is None
    assert store.root_workload(NS, "Pod", "forged3") is None
    rayjob = store.workloads["RayJob"][f"{NS}/rj"]
    assert "forged3" not in {p.uid for p in store.workload_pods(rayjob)}


def test_a_rayjob_on_an_existing_cluster_is_no_queues() -> None:
    store = store_with("raycluster", "rayjob")
    store.apply("RayJob", "ADDED", rayjob_obj(clusterSelector={"ray.io/cluster": "shared"}))
    store.apply("Job", "ADDED", job_obj("rj", "submitter", ref("RayJob", "rj", "rj")))
    record = store.workloads["RayJob"][f"{NS}/rj"]
    # Labelled by its tenant, still not held: its submitter Job is its own work.
    assert record.queue is None and record.units == ()
    assert store.root_workload(NS, "Job", "submitter") is None
    assert desired(store, ConsumerKey("RayJob", NS, "rj"), {}) is None


def test_a_standalone_raycluster_is_its_own_root() -> None:
    store = store_with("raycluster")
    store.apply("RayCluster", "ADDED", raycluster_obj("rc", "rc"))
    store.apply("Pod", "ADDED", {**pod_obj("rc-head", "head", ref("RayCluster", "rc", "rc")),
                                 "spec": template()["spec"]})
    cluster = store.workloads["RayCluster"][f"{NS}/rc"]
    assert store.root_workload(NS, "Pod", "head") is cluster
    wanted = desired(store, ConsumerKey("RayCluster", NS, "rc"), {})
    assert wanted is not None and wanted.name == "raycluster-rc"
    assert [(ps.name, ps.count) for ps in wanted.pod_sets] == [("head", 1), ("cpu", 2)]
