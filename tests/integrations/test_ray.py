"""RayCluster and RayJob (KubeRay v1.5 `ray.io/v1`) read as KubeRay makes
their pods: pod sets with the containers KubeRay adds, replicas clamped as
it clamps them, autoscaled clusters at maxReplicas, the submitter by mode,
`clusterSelector` RayJobs not held, unreadable specs refused."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from arbiter.core.api import MAX_POD_SETS
from arbiter.core.quantities import QuantityError
from arbiter.core.resources import Resources
from arbiter.integrations import BY_KIND, DEFAULT_NAMES
from arbiter.integrations.base import PodSetSpec, UnitSpec, dig
from arbiter.integrations.ray import MAX_GROUP_PODS, RayCluster, RayJob

RAY_CLUSTER, RAY_JOB = RayCluster(), RayJob()


def res(**amounts: str) -> Resources:
    return Resources.parse(amounts)


def template(cpu: str = "1", memory: str = "1Gi") -> dict[str, Any]:
    return {"spec": {"containers": [{"name": "ray-head", "image": "rayproject/ray:2.52.0",
                                     "resources": {"requests": {"cpu": cpu,
                                                                "memory": memory}}}]}}


def group(name: str = "cpu", replicas: int | None = 4, **fields: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"groupName": name, "rayStartParams": {}, "template": template(),
                            **fields}
    if replicas is not None:
        spec["replicas"] = replicas
    return spec


def cluster_spec(*groups: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {"headGroupSpec": {"rayStartParams": {}, "template": template()},
            "workerGroupSpecs": list(groups), **fields}


def raycluster(*groups: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {"apiVersion": "ray.io/v1", "kind": "RayCluster",
            "metadata": {"name": "rc", "namespace": "ml", "uid": "rc-uid"},
            "spec": {"suspend": True, **cluster_spec(*groups, **fields)}}


def rayjob(*groups: dict[str, Any], cluster: dict[str, Any] | None = None,
           **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "ray.io/v1", "kind": "RayJob",
            "metadata": {"name": "rj", "namespace": "ml", "uid": "rj-uid"},
            "spec": {"suspend": True, "entrypoint": "python train.py",
                     "shutdownAfterJobFinishes": True,
                     "rayClusterSpec": cluster if cluster is not None else cluster_spec(*groups),
                     **spec}}


def sets(obj: dict[str, Any]) -> dict[str, tuple[int, Resources]]:
    units = BY_KIND[obj["kind"]].units(obj)
    assert units is not None and len(units) == 1 and units[0].suffix == ""
    return {ps.name: (ps.count, ps.requests) for ps in units[0].pod_sets}


# The wait-gcs-ready init container (200m, 256Mi) is below a 1-CPU, 1Gi worker.
WORKER = res(cpu="1", memory="1Gi")


def test_registered_and_on_by_default() -> None:
    assert BY_KIND["RayCluster"] is not None and BY_KIND["RayJob"] is not None
    assert {"raycluster", "rayjob"} <= set(DEFAULT_NAMES)
    assert RAY_CLUSTER.collection_path("ml") == "/apis/ray.io/v1/namespaces/ml/rayclusters"
    assert RAY_JOB.object_path("ml", "rj") == "/apis/ray.io/v1/namespaces/ml/rayjobs/rj"
    assert RAY_CLUSTER.hold == RAY_JOB.hold == "suspend" and RAY_CLUSTER.gated_pods


def test_raycluster_head_and_one_set_per_worker_group() -> None:
    obj = raycluster(group("cpu", 4), group("big", 2, numOfHosts=2))
    units = RAY_CLUSTER.units(obj)
    assert units == (UnitSpec("", (
        PodSetSpec("head", 1, WORKER, ("spec", "headGroupSpec", "template")),
        PodSetSpec("cpu", 4, WORKER, ("spec", "workerGroupSpecs", 0, "template")),
        PodSetSpec("big", 4, WORKER, ("spec", "workerGroupSpecs", 1, "template")),
    )),)
    assert RAY_CLUSTER.templates(obj) == (
        ("spec", "headGroupSpec", "template"), ("spec", "workerGroupSpecs", 0, "template"),
        ("spec", "workerGroupSpecs", 1, "template"))
    assert RAY_CLUSTER.suspended(obj)


def test_worker_init_container_counts_for_small_workers() -> None:
    obj = raycluster(group("tiny", 2))
    obj["spec"]["workerGroupSpecs"][0]["template"] = template("100m", "64Mi")
    # KubeRay's wait-gcs-ready init container asks 200m, 256Mi before the worker starts.
    assert sets(obj)["tiny"] == (2, res(cpu="200m", memory="256Mi"))


@pytest.mark.parametrize(("fields", "pods"), [
    ({"replicas": 3}, 3),
    ({"replicas": 1, "minReplicas": 2, "maxReplicas": 5}, 2),  # raised to min
    ({"replicas": 9, "minReplicas": 0, "maxReplicas": 5}, 5),  # cut to max
    ({"replicas": 3, "minReplicas": 6, "maxReplicas": 4}, 4),  # min > max: max
    ({"replicas": 3, "numOfHosts": 4}, 12),
    ({"replicas": 3, "suspend": True}, 0),  # a suspended group makes no pods
])
def test_worker_count_as_kuberay_clamps_it(fields: dict[str, Any], pods: int) -> None:
    obj = raycluster({**group("g", None), **fields})
    assert sets(obj).get("g", (0, None))[0] == pods


def test_a_group_without_replicas_makes_min_replicas() -> None:
    # The CRD defaults replicas and minReplicas to 0: a bare group makes no pod.
    assert set(sets(raycluster(group("g", None)))) == {"head"}
    assert sets(raycluster(group("g", None, minReplicas=2)))["g"][0] == 2


def test_autoscaling_admits_at_max_replicas_with_the_autoscaler_sidecar() -> None:
    obj = raycluster(group("cpu", 1, minReplicas=1, maxReplicas=6),
                     enableInTreeAutoscaling=True)
    found = sets(obj)
    assert found["cpu"] == (6, WORKER)  # not the current replicas: the autoscaler moves them
    assert found["head"] == (1, res(cpu="1500m", memory="1536Mi"))  # + 500m, 512Mi
    # The autoscaler rewriting replicas does not change the unit.
    scaled = copy.deepcopy(obj)
    scaled["spec"]["workerGroupSpecs"][0]["replicas"] = 4
    assert RAY_CLUSTER.units(scaled) == RAY_CLUSTER.units(obj)
    # autoscalerOptions.resources replace the sidecar's.
    obj["spec"]["autoscalerOptions"] = {"resources": {"limits": {"cpu": "2", "memory": "1Gi"}}}
    assert sets(obj)["head"] == (1, res(cpu="3", memory="2Gi"))


def test_autoscaling_without_a_max_is_refused() -> None:
    # The CRD's default maxReplicas (2^31-1): no queue could admit that.
    obj = raycluster(group("cpu", 1, maxReplicas=2**31 - 1), enableInTreeAutoscaling=True)
    assert RAY_CLUSTER.units(obj) is None
    assert "enableInTreeAutoscaling, maxReplicas x numOfHosts" in RAY_CLUSTER.readable
    assert "maxReplicas" in RAY_CLUSTER.readable
    obj["spec"]["workerGroupSpecs"][0]["maxReplicas"] = MAX_GROUP_PODS
    assert sets(obj)["cpu"][0] == MAX_GROUP_PODS


@pytest.mark.parametrize("broken", [
    lambda o: o["spec"]["headGroupSpec"].pop("template"),
    lambda o: o["spec"]["workerGroupSpecs"][0].pop("template"),
    lambda o: o["spec"]["workerGroupSpecs"][0].update(replicas="4"),
    lambda o: o["spec"]["workerGroupSpecs"][0].update(replicas=-1),
    lambda o: o["spec"]["workerGroupSpecs"][0].update(numOfHosts=True),
    lambda o: o["spec"]["workerGroupSpecs"][0].update(groupName="head"),
    lambda o: o["spec"]["workerGroupSpecs"][0].update(groupName=""),
    lambda o: o["spec"]["workerGroupSpecs"][0].update(groupName="g" * 64),
    lambda o: o["spec"]["workerGroupSpecs"].append(group("cpu")),  # a name twice
    lambda o: o["spec"].update(workerGroupSpecs={"cpu": {}}),
    lambda o: o["spec"]["workerGroupSpecs"].extend(group(f"g{i}") for i in range(MAX_POD_SETS)),
    lambda o: o["spec"]["workerGroupSpecs"][0].update(replicas=MAX_GROUP_PODS + 1),
])
def test_unreadable_clusters_have_no_unit(broken: Any) -> None:
    obj = raycluster(group("cpu", 4))
    broken(obj)
    assert RAY_CLUSTER.units(obj) is None


def test_a_malformed_quantity_raises_naming_it() -> None:
    obj = raycluster(group("cpu", 4))
    obj["spec"]["workerGroupSpecs"][0]["template"] = template("lots")
    with pytest.raises(QuantityError, match="cpu"):
        RAY_CLUSTER.units(obj)


def test_readable_names_the_fields() -> None:
    for field in ("head pod template", "groupName", "replicas",
                  "minReplicas", "maxReplicas", "numOfHosts"):
        assert field in RAY_CLUSTER.readable
    for field in ("spec.submissionMode", "spec.submitterPodTemplate", "spec.rayClusterSpec",
                  "spec.rayClusterSpec.enableInTreeAutoscaling"):
        assert field in RAY_JOB.readable


def test_raycluster_ready_counts_ready_workers_and_the_head() -> None:
    obj = raycluster(group("cpu", 4))
    assert RAY_CLUSTER.ready(obj) == 0
    obj["status"] = {"readyWorkerReplicas": 3, "conditions": [
        {"type": "HeadPodReady", "status": "True"}]}
    assert RAY_CLUSTER.ready(obj) == 4
    assert RAY_CLUSTER.outcome(obj) is None  # a cluster serves: it never finishes


def test_rayjob_is_the_cluster_plus_the_default_submitter() -> None:
    obj = rayjob(group("cpu", 2))
    base = ("spec", "rayClusterSpec")
    assert RAY_JOB.units(obj) == (UnitSpec("", (
        PodSetSpec("head", 1, WORKER, (*base, "headGroupSpec", "template")),
        PodSetSpec("cpu", 2, WORKER, (*base, "workerGroupSpecs", 0, "template")),
        # KubeRay's default submitter container: 500m, 200Mi (limits 1, 1Gi).
        PodSetSpec("submitter", 1, res(cpu="500m", memory="200Mi"),
                   ("spec", "submitterPodTemplate")),
    )),)
    assert RAY_JOB.templates(obj) == ((*base, "headGroupSpec", "template"),
                                      (*base, "workerGroupSpecs", 0, "template"))


def test_rayjob_submitter_pod_template_and_modes() -> None:
    obj = rayjob(group("cpu", 2), submitterPodTemplate=template("2", "2Gi"))
    assert sets(obj)["submitter"] == (1, res(cpu="2", memory="2Gi"))
    assert RAY_JOB.templates(obj)[-1] == ("spec", "submitterPodTemplate")
    for mode in ("HTTPMode", "InteractiveMode"):
        assert set(sets(rayjob(group("cpu", 2), submissionMode=mode))) == {"head", "cpu"}
    # SidecarMode: the submitter container joins the head pod.
    sidecar = sets(rayjob(group("cpu", 2), submissionMode="SidecarMode"))
    assert set(sidecar) == {"head", "cpu"}
    assert sidecar["head"] == (1, res(cpu="1500m", memory="1224Mi"))
    assert RAY_JOB.units(rayjob(group("cpu", 2), submissionMode="Batch")) is None
    assert RAY_JOB.units(rayjob(group("cpu", 2), submitterPodTemplate="x")) is None
    # "submitter" is the submitter's pod set: a group may not take the name.
    assert RAY_JOB.units(rayjob(group("submitter", 2))) is None
    assert set(sets(rayjob(group("submitter", 2), submissionMode="HTTPMode"))) == {
        "head", "submitter"}


def test_rayjob_must_shut_its_cluster_down() -> None:
    # KubeRay refuses to suspend one that keeps its cluster (ValidationFailed).
    for value in (False, None, "true"):
        obj = rayjob(group("cpu", 2))
        obj["spec"]["shutdownAfterJobFinishes"] = value
        assert RAY_JOB.units(obj) is None, value
    assert "spec.shutdownAfterJobFinishes true" in RAY_JOB.readable


def test_rayjob_autoscaled_cluster_at_max() -> None:
    cluster = cluster_spec(group("cpu", 0, maxReplicas=3), enableInTreeAutoscaling=True)
    found = sets(rayjob(cluster=cluster))
    assert found["cpu"][0] == 3 and found["head"][1] == res(cpu="1500m", memory="1536Mi")


def test_rayjob_on_an_existing_cluster_is_not_held() -> None:
    obj = rayjob(cluster={}, clusterSelector={"ray.io/cluster": "shared"})
    del obj["spec"]["rayClusterSpec"]
    assert not RAY_JOB.holds(obj) and RAY_JOB.units(obj) == ()
    assert "clusterSelector" in RAY_JOB.unheld
    assert RAY_JOB.holds(rayjob(group("cpu", 1), clusterSelector={}))
    assert RAY_CLUSTER.holds(raycluster())


@pytest.mark.parametrize(("status", "outcome"), [
    ({"jobDeploymentStatus": "Running", "jobStatus": "RUNNING"}, None),
    ({"jobDeploymentStatus": "Complete", "jobStatus": "SUCCEEDED"}, "Complete"),
    ({"jobDeploymentStatus": "Complete", "jobStatus": "FAILED"}, "Failed"),
    ({"jobDeploymentStatus": "Complete", "jobStatus": "STOPPED"}, "Failed"),
    ({"jobDeploymentStatus": "Failed"}, "Failed"),
    ({"jobDeploymentStatus": "ValidationFailed"}, "Failed"),
    ({"jobDeploymentStatus": "Suspended"}, None),
])
def test_rayjob_outcome(status: dict[str, Any], outcome: str | None) -> None:
    obj = rayjob(group("cpu", 1))
    obj["status"] = status
    assert RAY_JOB.outcome(obj) == outcome


def test_rayjob_ready_from_its_cluster_status() -> None:
    obj = rayjob(group("cpu", 2))
    obj["status"] = {"rayClusterStatus": {"readyWorkerReplicas": 2, "conditions": [
        {"type": "HeadPodReady", "status": "True"}]}}
    assert RAY_JOB.ready(obj) == 3
    assert dig(obj, ("spec", "suspend")) is True and RAY_JOB.suspended(obj)
