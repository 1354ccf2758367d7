"""A tenant cannot run more than its admission by editing what a held
workload's controller made for it (issue #29, webhook/children.py), on the
real KubeRay and LWS controllers: with the verbs a tenant has in its own
namespace (kubectl --as a user bound to a namespaced Role), raising a
RayJob's RayCluster's workers or requests, or an LWS's StatefulSets'
replicas, is refused with a message naming the field and the workload to
change instead; writes that stay within the workload pass, and the
controllers keep reconciling (KubeRay remakes a worker, the LWS controller
grows its leader StatefulSet when the LWS grows).

On the `integrated` sandbox (8 fake nodes x 1 CPU).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from arbiter.sandbox import POD_COMPLETE_DELAY_ANNOTATION, Sandbox
from tests.e2e.helpers import create, get, grant, tenant, wait_for
from tests.e2e.workloads import leaderworkerset, pods, quiet, running, unit

TENANT = "trudy"
TENANT_RULES = [{"apiGroups": ["ray.io"], "resources": ["rayjobs", "rayclusters"],
                 "verbs": ["create", "get", "list", "watch", "update", "patch", "delete"]},
                {"apiGroups": ["leaderworkerset.x-k8s.io", "apps"],
                 "resources": ["leaderworkersets", "statefulsets"],
                 "verbs": ["create", "get", "list", "watch", "update", "patch", "delete"]}]
IMAGE = "rayproject/ray:2.52.0"


@pytest.fixture
def space(integrated: Sandbox) -> Iterator[str]:
    """A namespace whose queue has room, and whose tenant may write its
    RayJobs, RayClusters, LeaderWorkerSets and StatefulSets."""
    quiet(integrated)
    with tenant(integrated, "child", wait=60) as (ns, _):
        grant(integrated, ns, TENANT, TENANT_RULES)
        yield ns


def tenant_patch(sb: Sandbox, ns: str, kind: str, name: str, ops: list[dict[str, Any]],
                 *, ok: bool) -> str:
    """A JSON patch as the tenant: its stderr, asserting it failed (or passed)."""
    result = sb.kubectl("patch", kind, name, "-n", ns, "--type=json", "-p", json.dumps(ops),
                        f"--as={TENANT}", check=False)
    assert (result.returncode == 0) == ok, result.stderr or result.stdout
    assert "forbidden: User" not in result.stderr, result.stderr  # RBAC is not the point
    return result.stderr


def replace(path: str, value: Any) -> list[dict[str, Any]]:
    return [{"op": "replace", "path": path, "value": value}]


def ray_template(cpu: str, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    template: dict[str, Any] = {"spec": {"containers": [{
        "name": "ray", "image": IMAGE, "resources": {"requests": {"cpu": cpu}}}]}}
    if annotations:
        template["metadata"] = {"annotations": annotations}
    return template


def test_a_rayjobs_cluster_cannot_be_grown_by_its_tenant(integrated: Sandbox,
                                                          space: str) -> None:
    sb, ns = integrated, space
    group = {"groupName": "cpu", "replicas": 1, "minReplicas": 0, "maxReplicas": 1,
             "rayStartParams": {}, "template": ray_template("250m")}
    create(sb, {"apiVersion": "ray.io/v1", "kind": "RayJob",
                "metadata": {"name": "rj", "namespace": ns},
                "spec": {"entrypoint": "python -c 'print(1)'", "shutdownAfterJobFinishes": True,
                         "rayClusterSpec": {"headGroupSpec": {"rayStartParams": {},
                                                              "template": ray_template("250m")},
                                            "workerGroupSpecs": [group]},
                         # The submitter keeps running (KWOK would complete it at once).
                         "submitterPodTemplate": ray_template(
                             "250m", {POD_COMPLETE_DELAY_ANNOTATION: "10m"})}})
    cluster = wait_for("KubeRay's RayCluster for the RayJob", lambda: next(
        iter(get(sb, "rayclusters", "-n", ns)["items"]), None))
    name = cluster["metadata"]["name"]
    wait_for("its head and worker Running",
             lambda: len(running(sb, ns, "ray.io/cluster")) == 2, timeout=90)

    # KubeRay clamps replicas into [minReplicas, maxReplicas]: both raised.
    more = tenant_patch(sb, ns, "raycluster", name,
                        replace("/spec/workerGroupSpecs/0/replicas", 3)
                        + replace("/spec/workerGroupSpecs/0/maxReplicas", 3), ok=False)
    assert f'RayCluster "{ns}/{name}": it belongs to RayJob "{ns}/rj"' in more, more
    assert "pod set 'cpu' (pod template spec.workerGroupSpecs[0].template" in more, more
    assert "would have 3 pods where the RayJob asks for 1" in more, more
    assert "change the RayJob instead" in more, more
    bigger = tenant_patch(sb, ns, "raycluster", name, replace(
        "/spec/workerGroupSpecs/0/template/spec/containers/0/resources/requests/cpu", "2"),
        ok=False)
    assert "spec.workerGroupSpecs[0].template.spec.containers[].resources.requests" in bigger
    extra = tenant_patch(sb, ns, "raycluster", name, [
        {"op": "add", "path": "/spec/workerGroupSpecs/-",
         "value": {**group, "groupName": "more"}}], ok=False)
    assert "pod set 'more'" in extra, extra
    assert get(sb, "raycluster", name, "-n", ns)["spec"]["workerGroupSpecs"] == \
        cluster["spec"]["workerGroupSpecs"]

    # Within the RayJob: down to none and back to one pass; KubeRay keeps
    # reconciling (a worker deleted is made again, let go and Running).
    for replicas in (0, 1):
        tenant_patch(sb, ns, "raycluster", name,
                     replace("/spec/workerGroupSpecs/0/replicas", replicas), ok=True)
    worker = wait_for("a worker", lambda: next(
        iter(pods(sb, ns, "ray.io/node-type=worker")), None), timeout=60)
    sb.kubectl("delete", "pod", worker["metadata"]["name"], "-n", ns, "--wait=false")
    wait_for("KubeRay's new worker let go and Running", lambda: [
        p for p in pods(sb, ns, "ray.io/node-type=worker")
        if p["metadata"]["uid"] != worker["metadata"]["uid"]
        and (p.get("status") or {}).get("phase") == "Running"], timeout=60)
    assert len(pods(sb, ns, "ray.io/node-type=worker")) == 1


def test_an_lws_statefulsets_cannot_be_grown_by_its_tenant(integrated: Sandbox,
                                                           space: str) -> None:
    sb, ns = integrated, space
    workload = leaderworkerset("serve", ns, groups=1, size=2)
    workload["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0][
        "resources"]["requests"]["cpu"] = "250m"
    create(sb, workload)
    wait_for("the group's leader and worker Running", lambda: len(running(sb, ns)) == 2,
             timeout=90)
    leader = get(sb, "statefulset", "serve", "-n", ns)  # controller: the LWS
    workers = get(sb, "statefulset", "serve-0", "-n", ns)  # controller: the leader pod
    assert leader["metadata"]["ownerReferences"][0]["kind"] == "LeaderWorkerSet"
    assert workers["metadata"]["ownerReferences"][0]["kind"] == "Pod"

    groups = tenant_patch(sb, ns, "statefulset", "serve", replace("/spec/replicas", 2),
                          ok=False)
    assert f'StatefulSet "{ns}/serve": it belongs to LeaderWorkerSet "{ns}/serve"' in groups
    assert "sized by spec.replicas) would have 2 pods where the LeaderWorkerSet asks for 1" \
        in groups, groups
    assert "change the LeaderWorkerSet instead" in groups
    more = tenant_patch(sb, ns, "statefulset", "serve-0", replace("/spec/replicas", 3),
                        ok=False)
    assert "would have 3 pods where the LeaderWorkerSet asks for 1" in more, more
    bigger = tenant_patch(sb, ns, "statefulset", "serve-0", replace(
        "/spec/template/spec/containers/0/resources/requests/cpu", "1"), ok=False)
    assert "spec.template.spec.containers[].resources.requests would ask for cpu 1" in bigger
    assert get(sb, "statefulset", "serve-0", "-n", ns)["spec"]["replicas"] == 1

    # The LWS grown by its tenant: the LWS controller grows its leader
    # StatefulSet (that write follows the LWS), and the new group runs.
    result = sb.kubectl("patch", "leaderworkerset", "serve", "-n", ns, "--type=merge",
                        "-p", json.dumps({"spec": {"replicas": 2}}), f"--as={TENANT}")
    assert result.returncode == 0
    wait_for("the second group's unit", lambda: unit(sb, ns, "lws-serve-1"))
    wait_for("both groups Running", lambda: len(running(sb, ns)) == 4, timeout=90)
    assert get(sb, "statefulset", "serve", "-n", ns)["spec"]["replicas"] == 2
