"""RayCluster and RayJob at the door (the generic webhook/workloads.py):
labelled in every template and created suspended; a RayJob's RayCluster
(its controller reaches the RayJob by uid) passes untouched, a forged
reference to another team's RayJob makes nothing pass; a RayJob on an
existing cluster passes untouched and a held one cannot become one; an
autoscaled cluster without a ceiling is refused naming the field; the pods
KubeRay makes are gated (the loop lets them go)."""

from __future__ import annotations

import copy
from typing import Any

from arbiter.cache.store import ClusterStore
from arbiter.core.api import ADMISSION_GATE
from tests.webhook.admission_samples import (
    QUEUE_LABEL,
    Json,
    env_for,
    object_meta,
    parse,
    patched,
    queue_obj,
    review,
)
from tests.webhook.test_workloads import _create, _mutate, _update
from tests.webhook.workload_samples import (
    QUEUED,
    child_pod,
    held_store,
    owned_by,
    pod_template,
)
from webhook import pods

KUBERAY = {"username": "system:serviceaccount:ray-system:kuberay-operator"}


def cluster_spec(workers: int = 4, **fields: Any) -> Json:
    return {"headGroupSpec": {"rayStartParams": {}, "template": pod_template()},
            "workerGroupSpecs": [{"groupName": "cpu", "replicas": workers, "minReplicas": 0,
                                  "maxReplicas": 8, "rayStartParams": {},
                                  "template": pod_template()}], **fields}


def raycluster(name: str, namespace: str = "team-a", *, labels: Json | None = None,
               suspend: bool | None = None, validating: bool = False, **fields: Any) -> Json:
    spec = cluster_spec(**fields)
    if suspend is not None:
        spec["suspend"] = suspend
    return {"apiVersion": "ray.io/v1", "kind": "RayCluster",
            "metadata": object_meta(name, namespace, labels, validating), "spec": spec}


def rayjob(name: str, namespace: str = "team-a", *, labels: Json | None = None,
           suspend: bool | None = None, validating: bool = False, **spec: Any) -> Json:
    body: Json = {"entrypoint": "python train.py", "shutdownAfterJobFinishes": True,
                  "rayClusterSpec": cluster_spec(2), **spec}
    if suspend is not None:
        body["suspend"] = suspend
    return {"apiVersion": "ray.io/v1", "kind": "RayJob",
            "metadata": object_meta(name, namespace, labels, validating), "spec": body}


def _store(*objects: Json) -> ClusterStore:
    return held_store(*objects, queues=[queue_obj("team-a", namespaces=["team-a"]),
                                        queue_obj("team-b", namespaces=["team-b"])],
                      namespaces=["team-a", "team-b"])


def test_a_raycluster_is_labelled_in_head_and_worker_templates_and_suspended() -> None:
    obj = raycluster("rc")
    result = patched(obj, _mutate(obj, _store()))
    assert result["metadata"]["labels"] == QUEUED and result["spec"]["suspend"] is True
    assert result["spec"]["headGroupSpec"]["template"]["metadata"]["labels"] == QUEUED
    assert result["spec"]["workerGroupSpecs"][0]["template"]["metadata"]["labels"] == QUEUED
    assert _create(result, _store()).allowed
    # Unsuspended, from a tenant: refused (only arbiter starts it).
    started = copy.deepcopy(result)
    started["spec"]["suspend"] = False
    denial = _create(started, _store())
    assert not denial.allowed and "spec.suspend false" in denial.message


def test_a_rayjob_is_labelled_in_every_template_and_suspended() -> None:
    obj = rayjob("rj", submitterPodTemplate=pod_template("500m"))
    result = patched(obj, _mutate(obj, _store()))
    assert result["metadata"]["labels"] == QUEUED and result["spec"]["suspend"] is True
    cluster = result["spec"]["rayClusterSpec"]
    for template in (cluster["headGroupSpec"]["template"],
                     cluster["workerGroupSpecs"][0]["template"],
                     result["spec"]["submitterPodTemplate"]):
        assert template["metadata"]["labels"] == QUEUED
    assert _create(result, _store()).allowed


def test_a_rayjobs_cluster_passes_untouched_but_a_forged_reference_does_not() -> None:
    job = rayjob("rj", labels=QUEUED, suspend=False, validating=True)
    other = rayjob("theirs", "team-b", labels={QUEUE_LABEL: "team-b"}, suspend=False,
                   validating=True)
    store = _store(job, other)
    # KubeRay's RayCluster for the RayJob (its labels copied, no suspend).
    child = owned_by(raycluster("rj-x", labels=QUEUED, validating=True, workers=2), job)
    assert _mutate(child, store).patch == ()
    assert _create(child, store, KUBERAY).allowed
    # Pointing at another team's RayJob (its uid, from team-b) reaches nothing:
    # the cluster is held like any other, suspended and queued in team-a.
    forged = owned_by(raycluster("sneaky", validating=True), other)
    result = patched(forged, _mutate(forged, store))
    assert result["spec"]["suspend"] is True and result["metadata"]["labels"] == QUEUED
    running = copy.deepcopy(forged)
    running["spec"]["suspend"] = False
    assert not _create(running, store).allowed
    # The right name and kind with another uid: the same.
    renamed = copy.deepcopy(child)
    renamed["metadata"]["ownerReferences"][0]["uid"] = "not-the-rayjobs"
    assert patched(renamed, _mutate(renamed, store))["spec"]["suspend"] is True


def test_a_rayjob_on_an_existing_cluster_passes_untouched() -> None:
    obj = rayjob("rj", clusterSelector={"ray.io/cluster": "shared"})
    del obj["spec"]["rayClusterSpec"]
    store = _store()
    assert _mutate(obj, store).patch == ()
    created = copy.deepcopy(obj)
    created["metadata"] = object_meta("rj", "team-a", None, True)
    assert _create(created, store).allowed  # unsuspended, no queue: not arbiter's


def test_a_held_rayjob_cannot_turn_into_one_on_an_existing_cluster() -> None:
    old = rayjob("rj", labels=QUEUED, suspend=True, validating=True)
    store = _store(old)
    new = copy.deepcopy(old)
    new["spec"]["clusterSelector"] = {"ray.io/cluster": "theirs"}
    denial = _update(old, new, store)
    assert not denial.allowed and "spec.clusterSelector" in denial.message
    # Other edits of a waiting one pass (the loop re-reads its units).
    new = copy.deepcopy(old)
    new["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["replicas"] = 3
    assert _update(old, new, store).allowed


def test_an_autoscaled_cluster_without_a_ceiling_is_refused_naming_the_field() -> None:
    obj = raycluster("rc", labels=QUEUED, suspend=True, validating=True,
                     enableInTreeAutoscaling=True)
    obj["spec"]["workerGroupSpecs"][0]["maxReplicas"] = 2**31 - 1
    denial = _create(obj, _store())
    assert not denial.allowed
    assert "maxReplicas" in denial.message and "enableInTreeAutoscaling" in denial.message
    obj["spec"]["workerGroupSpecs"][0]["maxReplicas"] = 8
    assert _create(obj, _store()).allowed


def test_a_rayjob_keeping_its_cluster_is_refused_naming_the_field() -> None:
    obj = rayjob("rj", labels=QUEUED, suspend=True, validating=True,
                 shutdownAfterJobFinishes=False)
    denial = _create(obj, _store())
    assert not denial.allowed and "spec.shutdownAfterJobFinishes true" in denial.message


def test_a_bad_quantity_is_refused_naming_it() -> None:
    obj = raycluster("rc", labels=QUEUED, suspend=True, validating=True)
    obj["spec"]["headGroupSpec"]["template"] = pod_template("lots")
    denial = _create(obj, _store())
    assert not denial.allowed and "cpu" in denial.message


def test_the_pods_kuberay_makes_are_gated() -> None:
    cluster = raycluster("rc", labels=QUEUED, suspend=False, validating=True)
    store = _store(cluster)
    pod = child_pod("rc-head-x", cluster, gated=False)
    del pod["metadata"]["uid"]
    decision = pods.mutate(parse(review("Pod", "CREATE", pod, user=KUBERAY)), env_for(store))
    result = patched(pod, decision)
    # Let go by the loop while the unit is admitted, as many as it counts.
    assert [g["name"] for g in result["spec"]["schedulingGates"]] == [ADMISSION_GATE]
