"""RayCluster and RayJob (`ray.io/v1`, KubeRay v1.5), held by `spec.suspend`.

A RayCluster is one unit: pod set `head` (1 pod) and one per worker group
(named as the group) of `replicas x numOfHosts` pods, `replicas` clamped
into `[minReplicas, maxReplicas]` as KubeRay clamps it (a suspended group:
none). Requests count what KubeRay adds to the pods it makes from the
templates: the `wait-gcs-ready` init container of every worker (200m CPU,
256Mi), and with in-tree autoscaling the `autoscaler` container of the head
(500m, 512Mi, or `spec.autoscalerOptions.resources`). KubeRay makes the pods
itself (controller: the RayCluster), deletes them all when suspended, and
copies the templates (where placement is written) into new pods.

In-tree autoscaling: admitted at each group's `maxReplicas`. The autoscaler
(a container of the head pod) scales a group by writing its `replicas`,
between min and max, asking no one; admitted at the ceiling, every pod it
can make was admitted, so the cluster never runs beyond or below what its
queue granted, and `replicas` changes need no new admission. Refusing
autoscaling clusters instead would shut out Ray's common setup; the price
is that the queue is charged the ceiling, which the tenant chooses.
A group left at the CRD's default `maxReplicas` (2^31-1) cannot be admitted
at all: the spec is refused, naming the field.

A RayJob is one unit (it must set `shutdownAfterJobFinishes`: KubeRay
refuses to suspend one that keeps its cluster, and that cluster would
outlive the unit): its `spec.rayClusterSpec` pod sets plus the submitter:
in `K8sJobMode` (the default) a pod set `submitter` of 1 pod of
`spec.submitterPodTemplate`, else KubeRay's default submitter container
(500m CPU, 200Mi); in `SidecarMode` that container joins the head pod; in
`HTTPMode` and `InteractiveMode` there is no submitter pod. KubeRay makes
the RayCluster (copying the RayJob's labels and `rayClusterSpec`, so the
placement) and the submitter Job, both with the RayJob as controller: they
are its children, never held on their own. A RayJob with a
`spec.clusterSelector` runs on an existing RayCluster (of its namespace,
the one named by `ray.io/cluster`): arbiter does not hold it (`holds`), its
cluster's unit already counts the pods, and its submitter Job is queued as
a plain Job of the namespace.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from arbiter.core.api import MAX_POD_SETS
from arbiter.core.podrequests import effective_pod_requests
from arbiter.integrations.base import (
    Integration,
    Limit,
    Obj,
    Outcome,
    Path,
    PodSetSpec,
    UnitSpec,
    condition_true,
    count_at,
    dig,
    whole,
)

GROUP, VERSION = "ray.io", "v1"
HEAD = "head"
SUBMITTER = "submitter"
# A pod set's name length (a QueueUnit's pod sets: core.api.MAX_POD_SETS).
MAX_NAME = 63
# Pods of one worker group arbiter queues (autoscaled: at maxReplicas).
MAX_GROUP_PODS = 10_000
MAX_INT32 = 2**31 - 1  # the CRD's default maxReplicas

# What KubeRay v1.5 adds to the pods it makes (controllers/ray/common).
WAIT_GCS = {"name": "wait-gcs-ready", "resources": {
    "requests": {"cpu": "200m", "memory": "256Mi"}, "limits": {"cpu": "200m", "memory": "256Mi"}}}
AUTOSCALER_RESOURCES = {"requests": {"cpu": "500m", "memory": "512Mi"},
                        "limits": {"cpu": "500m", "memory": "512Mi"}}
SUBMITTER_CONTAINER = {"name": "ray-job-submitter", "resources": {
    "requests": {"cpu": "500m", "memory": "200Mi"}, "limits": {"cpu": "1", "memory": "1Gi"}}}
SUBMISSION_MODES = ("K8sJobMode", "HTTPMode", "InteractiveMode", "SidecarMode")

CLUSTER_READABLE = (
    "a head pod template and 0 to {groups} worker groups, each with a pod template, a "
    "unique groupName (not \"head\"{extra}) and whole-number replicas, minReplicas, "
    f"maxReplicas and numOfHosts, at most {MAX_GROUP_PODS} pods a group (with "
    "spec{path}.enableInTreeAutoscaling, maxReplicas x numOfHosts: it is admitted at that "
    "size)")


def _with(spec: Mapping[str, Any], key: str, added: Mapping[str, Any]) -> dict[str, Any]:
    """`spec` with `added` appended to its list `key` (the template is not changed)."""
    existing = spec.get(key) or []
    return {**spec, key: [*(existing if isinstance(existing, list) else [existing]), added]}


def _requests(obj: Obj, template: Path, containers: tuple[Mapping[str, Any], ...] = (),
              init: tuple[Mapping[str, Any], ...] = ()) -> Any:
    """One pod's requests from the template at `template` with the containers
    KubeRay adds; None when there is no pod spec there."""
    spec = dig(obj, (*template, "spec"))
    if not isinstance(spec, Mapping):
        return None
    for container in containers:
        spec = _with(spec, "containers", container)
    for container in init:
        spec = _with(spec, "initContainers", container)
    return effective_pod_requests(spec)


def _workers(group: Obj, autoscaling: bool) -> int | None:
    """Pods of one worker group, as KubeRay counts them; None when unreadable."""
    if dig(group, ("suspend",)) is True:
        return 0
    replicas = count_at(group, ("replicas",), 0)
    low = count_at(group, ("minReplicas",), 0)
    high = count_at(group, ("maxReplicas",), MAX_INT32)
    hosts = count_at(group, ("numOfHosts",), 1)
    if replicas is None or low is None or high is None or hosts is None:
        return None
    wanted = high if autoscaling or low > high else min(max(replicas, low), high)
    pods = wanted * hosts
    return pods if pods <= MAX_GROUP_PODS else None


def cluster_pod_sets(obj: Obj, base: Path, *, reserved: tuple[str, ...] = (),
                     head_extra: tuple[Mapping[str, Any], ...] = ()) -> list[PodSetSpec] | None:
    """The pod sets of the RayClusterSpec at `base`: `head`, then each worker
    group with pods; None when it does not read. `reserved`: pod set names
    a group may not take; `head_extra`: containers joining the head pod."""
    head: Path = (*base, "headGroupSpec", "template")
    groups = dig(obj, (*base, "workerGroupSpecs"))
    if groups is None:
        groups = []
    if not isinstance(groups, list) or len(groups) + 1 + len(reserved) > MAX_POD_SETS:
        return None
    autoscaling = dig(obj, (*base, "enableInTreeAutoscaling")) is True
    if autoscaling:
        resources = dig(obj, (*base, "autoscalerOptions", "resources"))
        head_extra = (*head_extra, {"name": "autoscaler", "resources": resources
                                    if isinstance(resources, Mapping) else AUTOSCALER_RESOURCES})
    head_requests = _requests(obj, head, head_extra)
    if head_requests is None:
        return None
    sets = [PodSetSpec(HEAD, 1, head_requests, head)]
    taken = {HEAD, *reserved}
    for index, group in enumerate(groups):
        name = dig(group, ("groupName",))
        template: Path = (*base, "workerGroupSpecs", index, "template")
        if not isinstance(group, Mapping) or not isinstance(name, str) or not name \
                or len(name) > MAX_NAME or name in taken:
            return None
        taken.add(name)
        count = _workers(group, autoscaling)
        requests = _requests(obj, template, init=(WAIT_GCS,))
        if count is None or requests is None:
            return None
        if count:
            sets.append(PodSetSpec(name, count, requests, template))
    return sets


def cluster_templates(obj: Obj, base: Path) -> tuple[Path, ...]:
    """The head's and every worker group's pod template paths."""
    groups = dig(obj, (*base, "workerGroupSpecs"))
    count = len(groups) if isinstance(groups, list) else 0
    return ((*base, "headGroupSpec", "template"),
            *((*base, "workerGroupSpecs", index, "template") for index in range(count)))


def cluster_ready(status: Any) -> int:
    """Ready pods from a RayClusterStatus: ready workers and a ready head."""
    head = condition_true({"status": status}, ("HeadPodReady",)) is not None
    return whole(dig(status, ("readyWorkerReplicas",))) + int(head)


class RayCluster(Integration):
    name = "raycluster"
    group = GROUP
    version = VERSION
    resource = "rayclusters"
    kind = "RayCluster"
    prefix = "raycluster"
    children = ("Pod",)
    sized_by = "its worker group's replicas, minReplicas, maxReplicas and numOfHosts"
    readable = "spec: " + CLUSTER_READABLE.format(groups=MAX_POD_SETS - 1, extra="", path="")
    # KubeRay makes the pods itself: they arrive gated, and the loop lets
    # go as many as the admitted unit counts.
    gated_pods = True

    def templates(self, obj: Obj) -> tuple[Path, ...]:
        return cluster_templates(obj, ("spec",))

    def units(self, obj: Obj) -> tuple[UnitSpec, ...] | None:
        sets = cluster_pod_sets(obj, ("spec",))
        return None if sets is None else (UnitSpec("", tuple(sets)),)

    def ready(self, obj: Obj) -> int:
        return cluster_ready(dig(obj, ("status",)))


class RayJob(Integration):
    name = "rayjob"
    group = GROUP
    version = VERSION
    resource = "rayjobs"
    kind = "RayJob"
    prefix = "rayjob"
    children = ("RayCluster", "Job", "Pod")
    readable = ("spec.shutdownAfterJobFinishes true (KubeRay suspends no other), "
                "spec.submissionMode one of " + ", ".join(SUBMISSION_MODES) + ", "
                "spec.submitterPodTemplate a pod template when set, and "
                "spec.rayClusterSpec: " + CLUSTER_READABLE.format(
                    groups=MAX_POD_SETS - 2, extra=', not "submitter"', path=".rayClusterSpec"))
    unheld = "spec.clusterSelector set (running on an existing RayCluster)"
    gated_pods = True

    def holds(self, obj: Obj) -> bool:
        # On an existing cluster: that cluster's unit counts its pods.
        selector = dig(obj, ("spec", "clusterSelector"))
        return not (isinstance(selector, Mapping) and selector)

    def _mode(self, obj: Obj) -> str | None:
        mode = dig(obj, ("spec", "submissionMode"))
        mode = "K8sJobMode" if mode is None else mode
        return mode if mode in SUBMISSION_MODES else None

    def templates(self, obj: Obj) -> tuple[Path, ...]:
        paths = cluster_templates(obj, ("spec", "rayClusterSpec"))
        if isinstance(dig(obj, ("spec", "submitterPodTemplate")), Mapping):
            paths = (*paths, ("spec", "submitterPodTemplate"))
        return paths

    def units(self, obj: Obj) -> tuple[UnitSpec, ...] | None:
        if not self.holds(obj):
            return ()
        mode = self._mode(obj)
        # KubeRay refuses to suspend a RayJob that keeps its cluster after
        # the job (ValidationFailed); and that cluster would outlive the unit.
        if mode is None or dig(obj, ("spec", "shutdownAfterJobFinishes")) is not True:
            return None
        submitter = mode == "K8sJobMode"
        sets = cluster_pod_sets(
            obj, ("spec", "rayClusterSpec"), reserved=(SUBMITTER,) if submitter else (),
            head_extra=(SUBMITTER_CONTAINER,) if mode == "SidecarMode" else ())
        if sets is None:
            return None
        if submitter:
            custom: Path = ("spec", "submitterPodTemplate")
            given = dig(obj, custom)
            if given is None:
                requests = effective_pod_requests({"containers": [SUBMITTER_CONTAINER]})
            elif isinstance(given, Mapping):
                requests = _requests(obj, custom)
            else:
                return None
            if requests is None:
                return None
            sets.append(PodSetSpec(SUBMITTER, 1, requests, custom))
        return (UnitSpec("", tuple(sets)),)

    def child_limits(self, pod_sets: Mapping[str, Limit], groups: int, child_kind: str,
                     direct: bool) -> Mapping[str, Limit] | None:
        # KubeRay makes its RayCluster from `rayClusterSpec`: the same head
        # and worker group pod sets (a SidecarMode head counts its submitter).
        if child_kind != "RayCluster":
            return None
        return {name: limit for name, limit in pod_sets.items() if name != SUBMITTER}

    def outcome(self, obj: Obj) -> Outcome | None:
        deployment = dig(obj, ("status", "jobDeploymentStatus"))
        if deployment == "Complete":
            return "Complete" if dig(obj, ("status", "jobStatus")) == "SUCCEEDED" else "Failed"
        return "Failed" if deployment in ("Failed", "ValidationFailed") else None

    def ready(self, obj: Obj) -> int:
        return cluster_ready(dig(obj, ("status", "rayClusterStatus")))
