"""A hostile tenant at the door (issue #25, DESIGN §13): each try, made with
the verbs a tenant has in its own namespace (kubectl --as a user bound to a
namespaced Role), fails with the webhook's message.

Rows 6 (a pod group's late members) and 9 (resource names) are here too.
Row 14 (a later mutating webhook drops arbiter's patch) needs a second
webhook the sandbox does not run: tests/webhook/test_door.py pins it on
the validating endpoint.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from arbiter.core.api import (
    ADMISSION_GATE,
    POD_GROUP_LABEL,
    POD_GROUP_SIZE_ANNOTATION,
    QUEUE_LABEL,
)
from arbiter.sandbox import Sandbox
from tests.e2e.helpers import get, grant, job, pod, tenant, unique_name, wait_for

TENANT = "mallory"
# Verbs a tenant has in its own namespace, and nothing cluster-scoped.
TENANT_RULES = [
    {"apiGroups": [""], "resources": ["pods", "pods/resize"],
     "verbs": ["create", "get", "list", "watch", "update", "patch", "delete"]},
    {"apiGroups": ["batch"], "resources": ["jobs"],
     "verbs": ["create", "get", "list", "watch", "update", "patch", "delete"]},
    {"apiGroups": ["arbiter.dev"], "resources": ["queueunits"],
     "verbs": ["create", "get", "list", "watch", "update", "patch", "delete"]},
]


@pytest.fixture(scope="module")
def space(sandbox: Sandbox) -> Iterator[tuple[str, str, str]]:
    """(namespace, its queue, another team's queue); the tenant may write
    pods, Jobs and QueueUnits in the namespace."""
    with tenant(sandbox, "hostile") as (ns, queue), tenant(sandbox, "victim") as (_, other):
        grant(sandbox, ns, TENANT, TENANT_RULES)
        yield ns, queue, other


def as_tenant(sandbox: Sandbox, *args: str, body: dict[str, Any] | None = None) -> str:
    """kubectl ARGS as the tenant; its stderr, asserting that it failed."""
    result = sandbox.kubectl(*args, f"--as={TENANT}", check=False,
                             input=None if body is None else json.dumps(body))
    assert result.returncode != 0, f"the tenant's {args} succeeded: {result.stdout}"
    assert "forbidden: User" not in result.stderr, result.stderr  # RBAC is not the point
    return result.stderr


def tenant_ok(sandbox: Sandbox, *args: str, body: dict[str, Any] | None = None) -> Any:
    result = sandbox.kubectl(*args, f"--as={TENANT}", "-o", "json",
                             input=None if body is None else json.dumps(body))
    return json.loads(result.stdout)


def running_pod(sandbox: Sandbox, ns: str, name: str) -> dict[str, Any]:
    def bound() -> dict[str, Any] | None:
        obj: dict[str, Any] = get(sandbox, "pod", name, "-n", ns)
        return obj if obj["spec"].get("nodeName") else None
    return wait_for(f"pod {name} admitted and bound", bound, timeout=60)


def test_node_name_is_denied(sandbox: Sandbox, space: tuple[str, str, str]) -> None:
    ns, _, _ = space
    body = pod("pinned", ns, cpu="100m")
    body["spec"]["nodeName"] = "kwok-node-0"
    stderr = as_tenant(sandbox, "create", "-f", "-", body=body)
    assert 'admission webhook "pods.validate.arbiter.dev" denied the request' in stderr
    assert f'pod "{ns}/pinned": spec.nodeName is set' in stderr


def test_dra_claims_are_denied(sandbox: Sandbox, space: tuple[str, str, str]) -> None:
    ns, _, _ = space
    body = pod("gpus", ns, cpu="100m")
    body["spec"]["resourceClaims"] = [{"name": "gpus",
                                       "resourceClaimTemplateName": "eight-gpus"}]
    stderr = as_tenant(sandbox, "create", "-f", "-", body=body)
    assert "spec.resourceClaims: kube-arbiter cannot charge devices" in stderr
    claimed = job("gpus", ns, cpu="100m")
    claimed["spec"]["template"]["spec"]["resourceClaims"] = body["spec"]["resourceClaims"]
    stderr = as_tenant(sandbox, "create", "-f", "-", body=claimed)
    assert "spec.template.spec.resourceClaims: kube-arbiter cannot charge" in stderr


def test_loop_unit_names_and_specs_are_arbiters(sandbox: Sandbox,
                                                space: tuple[str, str, str]) -> None:
    ns, queue, _ = space
    name = unique_name("big")
    # Row 3: a reservation under the name of the Job's unit-to-be.
    reservation = {"apiVersion": "arbiter.dev/v1alpha1", "kind": "QueueUnit",
                   "metadata": {"name": f"job-{name}", "namespace": ns},
                   "spec": {"queue": queue, "podSets": [
                       {"name": "main", "count": 1, "requests": {"cpu": "10m"}}]}}
    stderr = as_tenant(sandbox, "create", "-f", "-", body=reservation)
    assert 'names starting with "job-", "pod-", "group-"' in stderr
    assert "are kube-arbiter's" in stderr
    # Row 7: the Job waits (more than the cluster has); its unit's podSets
    # cut down to 10m would be admitted small.
    tenant_ok(sandbox, "create", "-f", "-", body=job(name, ns, cpu="4", runs_for="10m"))
    unit = wait_for("the loop's unit, waiting", lambda: next(
        (u for u in get(sandbox, "queueunits", "-n", ns)["items"]
         if u["metadata"]["name"] == f"job-{name}" and (u.get("status") or {}).get("phase")),
        None))
    assert unit["status"]["phase"] == "Enqueued"
    patch = {"spec": {"podSets": [{"name": "main", "count": 1,
                                   "requests": {"cpu": "10m"}}]}}
    stderr = as_tenant(sandbox, "patch", "queueunit", f"job-{name}", "-n", ns,
                       "--type=merge", "-p", json.dumps(patch))
    assert (f'QueueUnit "{ns}/job-{name}": spec.podSets cannot change: kube-arbiter made '
            "this unit for its consumer") in stderr
    # Row 10: a pod that names the waiting Job as its controller.
    waiting = get(sandbox, "job", name, "-n", ns)
    assert waiting["spec"]["suspend"] is True
    forged = pod(f"{name}-forged", ns, cpu="100m")
    forged["metadata"]["labels"] = {QUEUE_LABEL: queue}
    forged["metadata"]["ownerReferences"] = [{
        "apiVersion": "batch/v1", "kind": "Job", "name": name,
        "uid": waiting["metadata"]["uid"], "controller": True}]
    stderr = as_tenant(sandbox, "create", "-f", "-", body=forged)
    assert (f'pod of Job "{ns}/{name}": metadata.ownerReferences names that Job as its '
            f'controller, but queue "{queue}" has not admitted it yet') in stderr
    sandbox.kubectl("delete", "job", name, "-n", ns, "--wait=false")


def test_admitted_parallelism_cannot_rise(sandbox: Sandbox,
                                          space: tuple[str, str, str]) -> None:
    ns, queue, _ = space
    name = unique_name("small")
    tenant_ok(sandbox, "create", "-f", "-", body=job(name, ns, cpu="100m", runs_for="10m"))
    wait_for("the Job admitted", lambda: get(sandbox, "job", name, "-n", ns)["spec"]
             .get("suspend") is False, timeout=60)
    stderr = as_tenant(sandbox, "patch", "job", name, "-n", ns, "--type=merge",
                       "-p", '{"spec": {"parallelism": 8}}')
    assert (f'Job "{ns}/{name}" was admitted by queue "{queue}" for spec.parallelism 1: '
            "spec.parallelism cannot be raised (8) after admission") in stderr
    sandbox.kubectl("delete", "job", name, "-n", ns, "--wait=false")


def test_a_running_pod_keeps_its_queue_and_size(sandbox: Sandbox,
                                                space: tuple[str, str, str]) -> None:
    ns, queue, other = space
    name = unique_name("web")
    tenant_ok(sandbox, "create", "-f", "-", body=pod(name, ns, cpu="100m"))
    running = running_pod(sandbox, ns, name)
    assert not any(g["name"] == ADMISSION_GATE
                   for g in running["spec"].get("schedulingGates") or [])
    # Row 11: relabelled into another team's queue.
    stderr = as_tenant(sandbox, "label", "pod", name, "-n", ns, f"{QUEUE_LABEL}={other}",
                       "--overwrite")
    assert 'admission webhook "pod-labels.validate.arbiter.dev" denied the request' in stderr
    assert f"its {QUEUE_LABEL} label cannot change ('{queue}' to '{other}')" in stderr
    assert get(sandbox, "pod", name, "-n", ns)["metadata"]["labels"][QUEUE_LABEL] == queue
    # Row 13: an in-place resize from 100m to 800m (what a node has: the
    # apiserver refuses more than its allocatable itself). It takes a
    # resize only for pods whose kubelet reports container resources (its
    # sign of support), which KWOK's stages do not: report them, as admin.
    statuses = get(sandbox, "pod", name, "-n", ns)["status"]["containerStatuses"]
    for status in statuses:
        status["resources"] = {"requests": {"cpu": "100m"}}
    sandbox.kubectl("patch", "pod", name, "-n", ns, "--subresource=status", "--type=merge",
                    "-p", json.dumps({"status": {"containerStatuses": statuses}}))
    resize = {"spec": {"containers": [{"name": "main",
                                       "resources": {"requests": {"cpu": "800m"}}}]}}
    stderr = as_tenant(sandbox, "patch", "pod", name, "-n", ns, "--subresource=resize",
                       "-p", json.dumps(resize))
    assert 'admission webhook "pod-resize.validate.arbiter.dev" denied the request' in stderr
    assert "pods/resize may not raise spec.containers[].resources requests" in stderr
    assert "(cpu 100m to 800m)" in stderr
    sandbox.kubectl("delete", "pod", name, "-n", ns, "--wait=false")


def test_pods_joining_an_admitted_group_stay_held(sandbox: Sandbox,
                                                  space: tuple[str, str, str]) -> None:
    # Row 6: a group of 2 is admitted; 4 more pods labelled into it later are
    # not released with it (its release covers the pods recorded at
    # admission), so they never run on its quota.
    ns, _, _ = space
    group = unique_name("grp")

    def member(index: int) -> dict[str, Any]:
        body = pod(f"{group}-{index}", ns, cpu="100m")
        body["metadata"]["labels"] = {POD_GROUP_LABEL: group}
        body["metadata"]["annotations"] = {POD_GROUP_SIZE_ANNOTATION: "2"}
        return body

    for index in range(2):
        tenant_ok(sandbox, "create", "-f", "-", body=member(index))
    for index in range(2):
        running_pod(sandbox, ns, f"{group}-{index}")
    for index in range(2, 6):
        tenant_ok(sandbox, "create", "-f", "-", body=member(index))
    deadline = time.monotonic() + 8  # several loop cycles
    while time.monotonic() < deadline:
        for index in range(2, 6):
            late = get(sandbox, "pod", f"{group}-{index}", "-n", ns)
            assert not late["spec"].get("nodeName"), late["metadata"]["name"]
            assert {"name": ADMISSION_GATE} in late["spec"].get("schedulingGates", [])
        time.sleep(1)
    unit = get(sandbox, "queueunit", f"group-{group}", "-n", ns)
    first = {get(sandbox, "pod", f"{group}-{i}", "-n", ns)["metadata"]["uid"] for i in range(2)}
    assert set(unit["status"]["admittedPods"]) == first


def test_seventeen_resource_names_are_denied(sandbox: Sandbox,
                                             space: tuple[str, str, str]) -> None:
    # Row 9: every name is a slot in every queue's status pass.
    ns, _, _ = space
    body = job(unique_name("names"), ns, cpu="100m")
    resources = body["spec"]["template"]["spec"]["containers"][0]["resources"]
    extended = {f"example.com/r{i:02d}": "1" for i in range(16)}
    resources["requests"].update(extended)
    resources["limits"] = dict(extended)  # the apiserver wants limits for these
    stderr = as_tenant(sandbox, "create", "-f", "-", body=body)
    assert "spec.template.spec names 17 resources" in stderr
    assert "at most 16 are allowed per unit (--max-resource-names)" in stderr
