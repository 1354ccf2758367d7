"""Each kind reads its spec and status as the upstream APIs shape them
(JobSet v0.12 `jobset.x-k8s.io/v1alpha2`, LWS v0.9 `leaderworkerset.x-k8s.io/v1`,
apps/v1, batch/v1): pod sets, templates, outcome, readiness, suspension."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from arbiter.core.api import MAX_POD_SETS
from arbiter.core.model import MAIN_POD_SET
from arbiter.core.quantities import QuantityError
from arbiter.core.resources import Resources
from arbiter.integrations import BY_KIND
from arbiter.integrations.base import PodSetSpec, UnitSpec, dig, pointer
from arbiter.integrations.deployment import Deployment
from arbiter.integrations.job import Job, Pod
from arbiter.integrations.jobset import JobSet
from arbiter.integrations.lws import GROUP_INDEX_LABEL, LeaderWorkerSet
from arbiter.integrations.statefulset import StatefulSet

CPU1 = Resources.parse({"cpu": "1"})


def pod_template(cpu: str = "1", **spec: Any) -> dict[str, Any]:
    return {"metadata": {"labels": {"app": "x"}},
            "spec": {"containers": [{"name": "main", "image": "busybox",
                                     "resources": {"requests": {"cpu": cpu}}}], **spec}}


def replicated_job(name: str, replicas: int | None = 1, **job_spec: Any) -> dict[str, Any]:
    job: dict[str, Any] = {"name": name, "template": {
        "spec": {"backoffLimit": 0, "template": pod_template(), **job_spec}}}
    if replicas is not None:
        job["replicas"] = replicas
    return job


def jobset(*jobs: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
            "metadata": {"name": "train", "namespace": "ml", "uid": "js-uid"},
            "spec": {"suspend": True, "replicatedJobs": list(jobs), **spec}}


def lws(replicas: int | None = 2, size: int | None = 3, leader: bool = True) -> dict[str, Any]:
    template: dict[str, Any] = {"workerTemplate": pod_template("2")}
    if leader:
        template["leaderTemplate"] = pod_template("1")
    if size is not None:
        template["size"] = size
    spec: dict[str, Any] = {"leaderWorkerTemplate": template, "startupPolicy": "LeaderCreated"}
    if replicas is not None:
        spec["replicas"] = replicas
    return {"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
            "metadata": {"name": "serve", "namespace": "ml", "uid": "lws-uid"}, "spec": spec}


def apps(kind: str, replicas: int | None = 3) -> dict[str, Any]:
    spec: dict[str, Any] = {"selector": {"matchLabels": {"app": "x"}},
                            "template": pod_template()}
    if replicas is not None:
        spec["replicas"] = replicas
    return {"apiVersion": "apps/v1", "kind": kind,
            "metadata": {"name": "web", "namespace": "ml", "uid": "apps-uid"}, "spec": spec}


def batch_job(**spec: Any) -> dict[str, Any]:
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": "j", "namespace": "ml", "uid": "job-uid"},
            "spec": {"suspend": True, "template": pod_template(), **spec}}


def conditions(*types: str, status: str = "True") -> dict[str, Any]:
    return {"conditions": [{"type": t, "status": status, "reason": "R", "message": ""}
                           for t in types]}


# -- JobSet ---------------------------------------------------------------------------


def test_jobset_one_unit_one_pod_set_per_replicated_job() -> None:
    obj = jobset(replicated_job("driver", 1, parallelism=1, completions=1),
                 replicated_job("workers", 3, parallelism=2, completions=2))
    units = JobSet().units(obj)
    assert units == (UnitSpec("", (
        PodSetSpec("driver", 1, CPU1, ("spec", "replicatedJobs", 0, "template", "spec",
                                       "template")),
        PodSetSpec("workers", 6, CPU1, ("spec", "replicatedJobs", 1, "template", "spec",
                                        "template")),
    )),)
    # The pointer names the template inside the object.
    assert dig(obj, units[0].pod_sets[1].template) is obj["spec"]["replicatedJobs"][1][
        "template"]["spec"]["template"]
    assert pointer(units[0].pod_sets[1].template) == \
        "/spec/replicatedJobs/1/template/spec/template"


def test_jobset_defaults_replicas_parallelism_and_completions() -> None:
    # replicas absent: the CRD defaults it to 1; parallelism absent: the Job's 1;
    # completions absent: a work queue of `parallelism` pods.
    units = JobSet().units(jobset(replicated_job("a", None), replicated_job("b", 2, parallelism=4)))
    assert units is not None
    assert [(s.name, s.count) for s in units[0].pod_sets] == [("a", 1), ("b", 8)]


def test_jobset_completions_below_parallelism_bound_the_pods() -> None:
    units = JobSet().units(jobset(replicated_job("w", 2, parallelism=5, completions=3)))
    assert units is not None and units[0].pod_sets[0].count == 2 * 3


def test_jobset_replicas_zero_sets_are_left_out_and_all_zero_needs_no_unit() -> None:
    units = JobSet().units(jobset(replicated_job("a", 0), replicated_job("b", 2)))
    assert units is not None and [s.name for s in units[0].pod_sets] == ["b"]
    assert JobSet().units(jobset(replicated_job("a", 0), replicated_job("b", 1,
                                                                        parallelism=0))) == ()


@pytest.mark.parametrize("bad", [
    {"replicas": -1}, {"replicas": "2"}, {"replicas": True},
    {"template": {"spec": {"parallelism": "x", "template": pod_template()}}},
    {"template": {"spec": {"completions": -3, "template": pod_template()}}},
    {"template": {"spec": {"template": {"metadata": {}}}}},  # no pod spec
    {"template": "nope"},
])
def test_jobset_malformed_fields_give_no_unit(bad: dict[str, Any]) -> None:
    job = {**replicated_job("a"), **bad}
    assert JobSet().units(jobset(replicated_job("ok"), job)) is None


def test_jobset_without_replicated_jobs_or_with_too_many_gives_no_unit() -> None:
    assert JobSet().units(jobset()) is None
    assert JobSet().units({"spec": {"replicatedJobs": "x"}}) is None
    many = [replicated_job(f"j{i}") for i in range(MAX_POD_SETS + 1)]
    assert JobSet().units(jobset(*many)) is None
    units = JobSet().units(jobset(*many[:MAX_POD_SETS]))
    assert units is not None and len(units[0].pod_sets) == MAX_POD_SETS


def test_jobset_bad_quantity_raises_quantity_error() -> None:
    obj = jobset(replicated_job("a"))
    obj["spec"]["replicatedJobs"][0]["template"]["spec"]["template"] = pod_template("lots")
    with pytest.raises(QuantityError):
        JobSet().units(obj)


def test_jobset_templates_pod_and_job_level() -> None:
    obj = jobset(replicated_job("a"), replicated_job("b"))
    assert JobSet().templates(obj) == (
        ("spec", "replicatedJobs", 0, "template", "spec", "template"),
        ("spec", "replicatedJobs", 1, "template", "spec", "template"))
    assert JobSet().job_templates(obj) == (("spec", "replicatedJobs", 0, "template"),
                                           ("spec", "replicatedJobs", 1, "template"))
    assert JobSet().templates({"spec": {}}) == ()


def test_jobset_outcome_from_its_conditions() -> None:
    obj = jobset(replicated_job("a"))
    assert JobSet().outcome(obj) is None
    obj["status"] = conditions("Suspended", "StartupPolicyCompleted")
    assert JobSet().outcome(obj) is None
    obj["status"] = conditions("Completed")
    assert JobSet().outcome(obj) == "Complete"
    obj["status"] = conditions("Failed")
    assert JobSet().outcome(obj) == "Failed"
    obj["status"] = conditions("Completed", "Failed", status="False")
    assert JobSet().outcome(obj) is None
    # A Job's condition name is not a JobSet's.
    obj["status"] = conditions("Complete")
    assert JobSet().outcome(obj) is None


def test_jobset_ready_counts_ready_and_succeeded_child_jobs() -> None:
    obj = jobset(replicated_job("a"), replicated_job("b", 3))
    assert JobSet().ready(obj) == 0
    obj["status"] = {"replicatedJobsStatus": [
        {"name": "a", "ready": 0, "succeeded": 1, "failed": 0, "active": 0, "suspended": 0},
        {"name": "b", "ready": 2, "succeeded": 0, "failed": 0, "active": 3, "suspended": 0},
    ]}
    assert JobSet().ready(obj) == 3
    # Only pending (active) Jobs: not started yet; junk counts as nothing.
    obj["status"] = {"replicatedJobsStatus": [{"name": "a", "ready": 0, "active": 1},
                                              {"name": "b", "ready": "2", "succeeded": True},
                                              "junk"]}
    assert JobSet().ready(obj) == 0


def test_jobset_suspended_only_when_true_and_suspend_patch() -> None:
    obj = jobset(replicated_job("a"))
    assert JobSet().suspended(obj)
    for value in (False, None, "true"):
        obj["spec"]["suspend"] = value
        assert not JobSet().suspended(obj)
    assert JobSet().suspend_ops(False) == [{"op": "add", "path": "/spec/suspend",
                                            "value": False}]


# -- LeaderWorkerSet ------------------------------------------------------------------


def test_lws_one_unit_per_group_leader_and_workers() -> None:
    units = LeaderWorkerSet().units(lws(replicas=2, size=3))
    leader = ("spec", "leaderWorkerTemplate", "leaderTemplate")
    workers = ("spec", "leaderWorkerTemplate", "workerTemplate")
    sets = (PodSetSpec("leader", 1, CPU1, leader),
            PodSetSpec("workers", 2, Resources.parse({"cpu": "2"}), workers))
    assert units == (UnitSpec("0", sets), UnitSpec("1", sets))


def test_lws_without_leader_template_leads_with_the_worker_template() -> None:
    obj = lws(replicas=1, size=2, leader=False)
    units = LeaderWorkerSet().units(obj)
    workers = ("spec", "leaderWorkerTemplate", "workerTemplate")
    cpu2 = Resources.parse({"cpu": "2"})
    assert units == (UnitSpec("0", (PodSetSpec("leader", 1, cpu2, workers),
                                    PodSetSpec("workers", 1, cpu2, workers))),)
    assert LeaderWorkerSet().templates(obj) == (workers,)
    assert LeaderWorkerSet().templates(lws()) == (
        ("spec", "leaderWorkerTemplate", "leaderTemplate"), workers)


def test_lws_defaults_replicas_and_size_to_one() -> None:
    units = LeaderWorkerSet().units(lws(replicas=None, size=None))
    assert units is not None and len(units) == 1
    assert [(s.name, s.count) for s in units[0].pod_sets] == [("leader", 1)]


def test_lws_replicas_zero_needs_no_unit() -> None:
    assert LeaderWorkerSet().units(lws(replicas=0)) == ()


@pytest.mark.parametrize("change", [
    lambda o: o["spec"].update(replicas=-1),
    lambda o: o["spec"].update(replicas="2"),
    lambda o: o["spec"]["leaderWorkerTemplate"].update(size=0),
    lambda o: o["spec"]["leaderWorkerTemplate"].update(size=2.5),
    lambda o: o["spec"]["leaderWorkerTemplate"].pop("workerTemplate"),
    lambda o: o["spec"]["leaderWorkerTemplate"].update(leaderTemplate={"spec": "x"}),
    lambda o: o["spec"].update(replicas=100_000),
])
def test_lws_malformed_or_oversized_gives_no_unit(change: Any) -> None:
    obj = lws()
    change(obj)
    assert LeaderWorkerSet().units(obj) is None


def test_lws_pod_group_from_its_index_label_and_readiness_in_groups() -> None:
    assert LeaderWorkerSet().unit_of_pod({GROUP_INDEX_LABEL: "1"}) == "1"
    assert LeaderWorkerSet().unit_of_pod({"app": "x"}) == ""
    obj = lws()
    assert LeaderWorkerSet().ready(obj) == 0 and LeaderWorkerSet().outcome(obj) is None
    obj["status"] = {"readyReplicas": 1, "replicas": 2, "updatedReplicas": 2,
                     **conditions("Available")}
    assert LeaderWorkerSet().ready(obj) == 1
    # A serving kind never finishes and has no suspend field.
    assert LeaderWorkerSet().outcome(obj) is None and not LeaderWorkerSet().suspended(obj)


# -- StatefulSet and Deployment -------------------------------------------------------


def test_statefulset_one_gang_unit_of_replicas() -> None:
    units = StatefulSet().units(apps("StatefulSet", 3))
    assert units == (UnitSpec("", (PodSetSpec(MAIN_POD_SET, 3, CPU1, ("spec", "template")),)),)
    assert StatefulSet().units(apps("StatefulSet", None)) == (
        UnitSpec("", (PodSetSpec(MAIN_POD_SET, 1, CPU1, ("spec", "template")),)),)
    assert StatefulSet().units(apps("StatefulSet", 0)) == ()
    assert StatefulSet().units(apps("StatefulSet", -2)) is None
    broken = apps("StatefulSet")
    broken["spec"]["template"] = None
    assert StatefulSet().units(broken) is None
    assert StatefulSet().templates(broken) == (("spec", "template"),)


def test_apps_readiness_from_ready_replicas_and_never_finished() -> None:
    for kind, integration in (("StatefulSet", StatefulSet()), ("Deployment", Deployment())):
        obj = apps(kind)
        assert integration.ready(obj) == 0
        obj["status"] = {"replicas": 3, "readyReplicas": 2, "availableReplicas": 2,
                         **conditions("Available")}
        assert integration.ready(obj) == 2
        obj["status"]["readyReplicas"] = True
        assert integration.ready(obj) == 0
        assert integration.outcome(obj) is None and not integration.suspended(obj)
        assert integration.hold == "gate"


def test_deployment_holds_nothing_its_pods_are_units() -> None:
    assert Deployment().units(apps("Deployment", 3)) == ()
    assert Deployment().per_pod and Deployment().templates(apps("Deployment")) == (
        ("spec", "template"),)


# -- Job and Pod ----------------------------------------------------------------------


def test_job_unit_counts_pods_at_once() -> None:
    def count(**spec: Any) -> int | None:
        units = Job().units(batch_job(**spec))
        return None if units is None else sum(s.count for u in units for s in u.pod_sets)
    assert count() == 1
    assert count(parallelism=4) == 4
    # Never more pods at once than completions (as the cache's JobRecord counts).
    assert count(parallelism=5, completions=2) == 2
    assert count(parallelism=2, completions=5) == 2
    assert count(parallelism=0) == 0 and Job().units(batch_job(parallelism=0)) == ()
    assert count(parallelism="3") is None and count(completions=-1) is None


def test_job_outcome_ready_and_suspend() -> None:
    obj = batch_job()
    assert Job().suspended(obj) and Job().outcome(obj) is None
    obj["status"] = {"active": 2, "ready": 1, **conditions("SuccessCriteriaMet")}
    assert Job().ready(obj) == 1 and Job().outcome(obj) is None
    obj["status"] = conditions("SuccessCriteriaMet", "Complete")
    assert Job().outcome(obj) == "Complete"
    obj["status"] = conditions("FailureTarget", "Failed")
    assert Job().outcome(obj) == "Failed"
    # JobSet's condition name is not a Job's.
    obj["status"] = conditions("Completed")
    assert Job().outcome(obj) is None


def test_pod_ready_from_its_ready_condition() -> None:
    obj = {"metadata": {"name": "p"}, "spec": pod_template()["spec"],
           "status": {"phase": "Running", **conditions("Ready", status="False")}}
    assert Pod().ready(obj) == 0
    obj["status"] = {"phase": "Running", **conditions("PodScheduled", "Ready")}
    assert Pod().ready(obj) == 1
    assert Pod().units(obj) == () and not Pod().suspended(obj)


# -- All kinds ------------------------------------------------------------------------


def test_reading_never_changes_the_object() -> None:
    objects = {"JobSet": jobset(replicated_job("a", 2)), "LeaderWorkerSet": lws(),
               "StatefulSet": apps("StatefulSet"), "Deployment": apps("Deployment"),
               "Job": batch_job(parallelism=2)}
    for kind, obj in objects.items():
        before = copy.deepcopy(obj)
        integration = BY_KIND[kind]
        integration.units(obj)
        integration.templates(obj)
        integration.outcome(obj)
        integration.ready(obj)
        assert obj == before, kind


def test_resource_paths_match_the_upstream_apis() -> None:
    assert JobSet().collection_path("ml") == "/apis/jobset.x-k8s.io/v1alpha2/namespaces/ml/jobsets"
    assert LeaderWorkerSet().object_path("ml", "s") == \
        "/apis/leaderworkerset.x-k8s.io/v1/namespaces/ml/leaderworkersets/s"
    assert StatefulSet().api_version == "apps/v1" and Deployment().resource == "deployments"
    assert Job().collection_path() == "/apis/batch/v1/jobs"
    assert Pod().collection_path("ml") == "/api/v1/namespaces/ml/pods"
    assert GROUP_INDEX_LABEL == "leaderworkerset.sigs.k8s.io/group-index"
