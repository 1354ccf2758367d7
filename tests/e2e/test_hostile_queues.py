"""A tenant cannot use another team's queue (DESIGN §13), and with
`--managed-namespaces listed` only the namespaces the Queues admit depend on
arbiter (DESIGN §3), on the real control plane.

The tenant is user "mallory" with the usual namespaced verbs on pods, Jobs
and QueueUnits in its own namespace only (a Role), as kubectl impersonates it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from arbiter.core.api import (
    ADMISSION_GATE,
    MANAGED_BY_ARBITER_ANNOTATION,
    MANAGED_LABEL,
    QUEUE_LABEL,
)
from arbiter.sandbox import Sandbox
from tests.e2e.helpers import (
    QUEUE_SETTLE,
    arbiter_with,
    create,
    delete_tenants,
    get,
    job,
    namespace,
    pod,
    queue,
    unique_name,
    wait_for,
)

TENANT = "mallory"


def _tenant_role(ns: str) -> list[dict[str, Any]]:
    """A Role and RoleBinding: what a tenant usually has in its own namespace."""
    return [
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": "tenant", "namespace": ns},
         "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["*"]},
                   {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["*"]},
                   {"apiGroups": ["arbiter.dev"], "resources": ["queueunits", "jobflows"],
                    "verbs": ["*"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": "tenant", "namespace": ns},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "tenant"},
         "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                       "name": TENANT}]},
    ]


def _as_tenant(sandbox: Sandbox, obj: dict[str, Any]) -> tuple[bool, str]:
    """`kubectl create` as the tenant: (created, stderr)."""
    result = sandbox.kubectl("create", f"--as={TENANT}", "-f", "-", input=json.dumps(obj),
                             check=False)
    return result.returncode == 0, result.stderr


def _labelled(obj: dict[str, Any], queue_name: str) -> dict[str, Any]:
    obj["metadata"].setdefault("labels", {})[QUEUE_LABEL] = queue_name
    return obj


def _reservation(name: str, ns: str, queue_name: str) -> dict[str, Any]:
    return {"apiVersion": "arbiter.dev/v1alpha1", "kind": "QueueUnit",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"queue": queue_name, "podSets": [
                {"name": "main", "count": 1, "requests": {"cpu": "1"}}]}}


@contextmanager
def _teams(sandbox: Sandbox) -> Iterator[dict[str, str]]:
    """Namespaces ta (mallory's), tb (another team's) and gold (labelled
    tier=<unique>), Queues qa listing ta, qb listing tb, qg selecting gold."""
    names = {key: unique_name(key) for key in ("ta", "tb", "gold", "qa", "qb", "qg", "tier")}
    create(sandbox,
           namespace(names["ta"]), namespace(names["tb"]),
           namespace(names["gold"], {"tier": names["tier"]}),
           queue(names["qa"], namespaces=[names["ta"]]),
           queue(names["qb"], namespaces=[names["tb"]]),
           queue(names["qg"], namespaceSelector={"matchLabels": {"tier": names["tier"]}}),
           *_tenant_role(names["ta"]), *_tenant_role(names["gold"]))
    time.sleep(2 * QUEUE_SETTLE)
    try:
        yield names
    finally:
        delete_tenants(sandbox, [names["ta"], names["tb"], names["gold"]],
                       [names["qa"], names["qb"], names["qg"]], wait=30)


def test_a_tenant_cannot_use_another_teams_queue(sandbox: Sandbox) -> None:
    with _teams(sandbox) as n:
        ta, qa, qb = n["ta"], n["qa"], n["qb"]
        foreign = (f'does not admit namespace "{ta}" (neither its spec.namespaces nor its '
                   f'spec.namespaceSelector): namespace "{ta}" may use ')
        attempts = {
            "Job": _labelled(job("sneaky", ta), qb),
            "pod": _labelled(pod("sneaky", ta), qb),
            "QueueUnit": _reservation("sneaky", ta, qb),
        }
        for what, obj in attempts.items():
            created, stderr = _as_tenant(sandbox, obj)
            assert not created, what
            assert f'queue "{qb}" (from ' in stderr and foreign in stderr, (what, stderr)
            # Queues of other tests in this sandbox may crowd the (bounded) list.
            choices = stderr.split(foreign, 1)[1]
            assert f'"{qa}"' in choices or " more" in choices, stderr
        # A pod group member and a queue selected for another namespace: the same.
        group = _labelled(pod("member", ta), qb)
        group["metadata"]["labels"]["arbiter.dev/pod-group"] = "g"
        group["metadata"]["annotations"] = {"arbiter.dev/pod-group-size": "2"}
        created, stderr = _as_tenant(sandbox, group)
        assert not created and foreign in stderr, stderr
        created, stderr = _as_tenant(sandbox, _labelled(pod("gpu", ta), n["qg"]))
        assert not created and f'queue "{n["qg"]}"' in stderr and foreign in stderr, stderr
        # Nothing was created; the tenant's own queue works.
        assert get(sandbox, "pods,jobs,queueunits", "-n", ta)["items"] == []
        created, stderr = _as_tenant(sandbox, job("mine", ta))
        assert created, stderr
        wait_for("the tenant's own Job admitted", lambda: get(
            sandbox, "job", "mine", "-n", ta)["spec"].get("suspend") is False, timeout=60)


def test_a_namespace_selected_by_a_queue_may_use_it(sandbox: Sandbox) -> None:
    with _teams(sandbox) as n:
        gold, qg = n["gold"], n["qg"]
        created, stderr = _as_tenant(sandbox, _labelled(job("train", gold), qg))
        assert created, stderr
        wait_for("the selected namespace's Job admitted", lambda: get(
            sandbox, "job", "train", "-n", gold)["spec"].get("suspend") is False, timeout=60)
        unit = get(sandbox, "queueunit", "job-train", "-n", gold)
        assert unit["spec"]["queue"] == qg


def _gated(sandbox: Sandbox, ns: str, name: str) -> bool:
    spec = get(sandbox, "pod", name, "-n", ns)["spec"]
    return any(g["name"] == ADMISSION_GATE for g in spec.get("schedulingGates") or [])


def _ns_meta(sandbox: Sandbox, ns: str) -> dict[str, Any]:
    meta: dict[str, Any] = get(sandbox, "namespace", ns)["metadata"]
    return meta


def test_listed_mode_manages_only_the_namespaces_queues_admit(sandbox: Sandbox) -> None:
    free, listed, queue_name = unique_name("infra"), unique_name("batch"), unique_name("q")
    create(sandbox, namespace(free), namespace(listed))
    try:
        with arbiter_with(sandbox, ["--managed-namespaces", "listed"]):
            # No Queue admits `free`: its pods are arbiter's business in no way,
            # not even while arbiter is down.
            sandbox.kubectl("create", "-n", free, "-f", "-", input=json.dumps(pod("web", free)))
            assert not _gated(sandbox, free, "web")
            assert QUEUE_LABEL not in (get(sandbox, "pod", "web", "-n", free)["metadata"]
                                       .get("labels") or {})
            sandbox.stop_arbiter()
            try:
                sandbox.kubectl("create", "-n", free, "-f", "-",
                                input=json.dumps(pod("while-down", free)))
            finally:
                sandbox.start_arbiter(["--managed-namespaces", "listed"])
            # A Queue admits `listed`: arbiter labels it, and its work is held.
            create(sandbox, queue(queue_name, namespaces=[listed]))
            meta = wait_for("arbiter labels the admitted namespace", lambda: (
                m if (m := _ns_meta(sandbox, listed)).get("labels", {}).get(MANAGED_LABEL)
                == "true" else None), timeout=30)
            assert meta["annotations"][MANAGED_BY_ARBITER_ANNOTATION] == "kube-arbiter"
            assert MANAGED_LABEL not in (_ns_meta(sandbox, free).get("labels") or {})
            big = pod("big", listed, cpu="50")  # more than the cluster: stays held
            wait_for("the webhook holds the admitted namespace's pods", lambda: _create_held(
                sandbox, listed, big), timeout=30)
            held = get(sandbox, "pod", "big", "-n", listed)
            assert held["metadata"]["labels"][QUEUE_LABEL] == queue_name
            wait_for("its QueueUnit", lambda: sandbox.kubectl(
                "get", "queueunit", "pod-big", "-n", listed, check=False).returncode == 0,
                timeout=30)
            # The Queue lets it go: arbiter takes its own label away again.
            sandbox.kubectl("patch", "queue", queue_name, "--type=merge", "-p",
                            json.dumps({"spec": {"namespaces": [free + "-none"]}}))
            wait_for("arbiter removes its label", lambda: MANAGED_LABEL not in (
                _ns_meta(sandbox, listed).get("labels") or {}), timeout=30)
            assert MANAGED_BY_ARBITER_ANNOTATION not in (
                _ns_meta(sandbox, listed).get("annotations") or {})
    finally:
        delete_tenants(sandbox, [free, listed], [queue_name], wait=30)


def _create_held(sandbox: Sandbox, ns: str, obj: dict[str, Any]) -> bool:
    """Create `obj` (once) and report whether it came in gated; a pod created
    before the webhook selected the namespace is deleted for another try."""
    name = obj["metadata"]["name"]
    if sandbox.kubectl("get", "pod", name, "-n", ns, check=False).returncode != 0:
        sandbox.kubectl("create", "-n", ns, "-f", "-", input=json.dumps(obj))
    if _gated(sandbox, ns, name):
        return True
    sandbox.kubectl("delete", "pod", name, "-n", ns, "--wait=false", check=False)
    return False
