"""A TrainJob's record takes its units from the JobSet Trainer makes of it
(same namespace and name, controlled by the TrainJob's uid), whichever
arrives first; anything else claiming to be that JobSet counts for nothing.
The chain pod -> Job -> JobSet -> TrainJob reaches the TrainJob, by uid."""

from __future__ import annotations

from typing import Any

from arbiter.cache.ownership import ConsumerKey
from arbiter.cache.records import PodSet
from arbiter.cache.store import ClusterStore
from arbiter.core.api import QUEUE_LABEL
from arbiter.core.resources import Resources
from arbiter.loop.workloads import consumers_of, desired
from tests.cache.test_workloads import CPU1, NS, job_obj, jobset_obj, meta, pod_obj, ref, store_with


def trainjob_obj(name: str = "tune", uid: str = "tj", namespace: str = NS,
                 queue: str | None = "q") -> dict[str, Any]:
    return {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
            "metadata": meta(name, uid, namespace=namespace,
                             labels={QUEUE_LABEL: queue} if queue else {}),
            "spec": {"suspend": True, "runtimeRef": {"name": "torch-distributed"},
                     "trainer": {"numNodes": 2}}}


def child_jobset(name: str = "tune", uid: str = "js", owner_uid: str = "tj",
                 owner_kind: str = "TrainJob") -> dict[str, Any]:
    """The JobSet as Trainer makes it: named as the TrainJob, no queue label."""
    obj = jobset_obj(name, uid, queue=None)
    obj["metadata"]["ownerReferences"] = [ref(owner_kind, name, owner_uid)]
    return obj


def ref_tj(name: str = "tune", uid: str = "tj") -> dict[str, Any]:
    return {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "name": name,
            "uid": uid, "controller": True}


def store(*names: str) -> ClusterStore:
    return store_with(*(names or ("trainer", "jobset")))


def units_of(s: ClusterStore, key: str = f"{NS}/tune") -> Any:
    return s.workloads["TrainJob"][key].units


SETS = (PodSet("driver", 1, CPU1), PodSet("workers", 3, CPU1))


def test_no_units_until_its_jobset_is_seen_then_the_jobsets() -> None:
    s = store()
    s.apply("TrainJob", "ADDED", trainjob_obj())
    assert units_of(s) is None
    seen: list[tuple[str, str]] = []
    s.listeners.append(lambda kind, key: seen.append((kind, key)))
    child = child_jobset()
    child["metadata"]["ownerReferences"] = [ref_tj()]
    child["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"][
        "priorityClassName"] = "high"
    s.apply("JobSet", "ADDED", child)
    (unit,) = units_of(s)
    assert unit.suffix == "" and unit.pod_sets == SETS
    assert ("TrainJob", f"{NS}/tune") in seen  # the loop looks at the TrainJob again
    # The pods' priority class comes with them.
    assert s.workloads["TrainJob"][f"{NS}/tune"].priority_class == "high"


def test_the_jobset_first_then_the_trainjob() -> None:
    s = store()
    child = child_jobset()
    child["metadata"]["ownerReferences"] = [ref_tj()]
    s.apply("JobSet", "ADDED", child)
    s.apply("TrainJob", "ADDED", trainjob_obj())
    (unit,) = units_of(s)
    assert unit.pod_sets == SETS
    # A status update of the TrainJob keeps them.
    updated = trainjob_obj()
    updated["status"] = {"conditions": [{"type": "Suspended", "status": "True"}]}
    s.apply("TrainJob", "MODIFIED", updated)
    assert units_of(s)[0].pod_sets == SETS


def test_a_jobset_another_object_controls_or_named_otherwise_gives_nothing() -> None:
    s = store()
    s.apply("TrainJob", "ADDED", trainjob_obj())
    for forged in (child_jobset(owner_uid="someone-else"), child_jobset(name="other"),
                   child_jobset(owner_kind="JobSet")):
        forged["metadata"]["ownerReferences"][0]["apiVersion"] = "trainer.kubeflow.org/v1alpha1"
        s.apply("JobSet", "ADDED", forged)
    assert units_of(s) is None


def test_a_jobset_of_a_namesake_in_another_namespace_gives_nothing() -> None:
    s = store()
    s.apply("TrainJob", "ADDED", trainjob_obj())
    s.apply("TrainJob", "ADDED", trainjob_obj(uid="tj-b", namespace="team-b"))
    foreign = child_jobset(uid="js-b", owner_uid="tj")  # names team-ml's TrainJob's uid
    foreign["metadata"]["namespace"] = "team-b"
    s.apply("JobSet", "ADDED", foreign)
    assert units_of(s) is None and units_of(s, "team-b/tune") is None


def test_its_jobset_deleted_and_made_again_keeps_then_follows_the_units() -> None:
    s = store()
    s.apply("TrainJob", "ADDED", trainjob_obj())
    s.apply("JobSet", "ADDED", child_jobset())
    s.apply("JobSet", "DELETED", child_jobset())
    assert units_of(s)[0].pod_sets == SETS
    s.apply("TrainJob", "MODIFIED", trainjob_obj())
    assert units_of(s)[0].pod_sets == SETS
    bigger = child_jobset(uid="js2")
    bigger["spec"]["replicatedJobs"][1]["replicas"] = 5
    s.apply("JobSet", "ADDED", bigger)
    assert units_of(s)[0].pod_sets == (PodSet("driver", 1, CPU1), PodSet("workers", 5, CPU1))


def test_a_new_trainjob_of_the_same_name_starts_without_units() -> None:
    s = store()
    s.apply("TrainJob", "ADDED", trainjob_obj())
    s.apply("JobSet", "ADDED", child_jobset())
    s.apply("JobSet", "DELETED", child_jobset())
    s.apply("TrainJob", "DELETED", trainjob_obj())
    s.apply("TrainJob", "ADDED", trainjob_obj(uid="tj-new"))
    assert units_of(s) is None


def test_four_levels_pod_job_jobset_trainjob_reach_the_trainjob_by_uid() -> None:
    s = store()
    s.apply("TrainJob", "ADDED", trainjob_obj())
    s.apply("JobSet", "ADDED", child_jobset())
    s.apply("Job", "ADDED", job_obj("tune-node-0", "job", ref("JobSet", "tune", "js")))
    s.apply("Pod", "ADDED", pod_obj("tune-node-0-0", "pod", ref("Job", "tune-node-0", "job")))
    for kind, uid in (("Pod", "pod"), ("Job", "job"), ("JobSet", "js"), ("TrainJob", "tj")):
        root = s.root_workload(NS, kind, uid)
        assert root is not None and (root.kind, root.uid) == ("TrainJob", "tj"), kind
    # The JobSet is the TrainJob's child: no unit of its own, even with the jobset
    # integration on; the TrainJob has one.
    jobset = s.workloads["JobSet"][f"{NS}/tune"]
    assert [desired(s, k, {}) for k in consumers_of(jobset)] == [None]
    (wanted,) = [desired(s, k, {}) for k in consumers_of(s.workloads["TrainJob"][f"{NS}/tune"])]
    assert wanted is not None and wanted.name == "trainjob-tune" and wanted.pod_sets == SETS
    assert wanted.consumer == ConsumerKey("TrainJob", NS, "tune")
    assert wanted.consumer_api_version == "trainer.kubeflow.org/v1alpha1"


def test_with_the_trainer_integration_off_the_jobset_is_its_own_work() -> None:
    s = store("jobset")
    s.apply("TrainJob", "ADDED", trainjob_obj())
    labelled = child_jobset()
    labelled["metadata"]["labels"] = {QUEUE_LABEL: "q"}
    s.apply("JobSet", "ADDED", labelled)
    assert s.root_workload(NS, "JobSet", "js") is not None
    assert s.root_workload(NS, "JobSet", "js").kind == "JobSet"  # type: ignore[union-attr]


def test_a_trainjob_of_a_whole_cpu_per_node_is_charged_per_pod() -> None:
    s = store()
    s.apply("TrainJob", "ADDED", trainjob_obj())
    child = child_jobset()
    child["spec"]["replicatedJobs"] = [{"name": "node", "replicas": 1, "template": {"spec": {
        "parallelism": 2, "completions": 2, "template": {"spec": {"containers": [
            {"name": "node", "image": "x", "resources": {"requests": {"cpu": "1"}}}]}}}}}]
    s.apply("JobSet", "ADDED", child)
    assert units_of(s)[0].pod_sets == (PodSet("node", 2, Resources.parse({"cpu": "1"})),)
