"""A tenant or an approver against arbiter's surfaces on the real control
plane (issue #25 rows 12 and 16; 10 fake nodes x 1 CPU).

- A PodDisruptionBudget with minAvailable = all over a tenant's plain pods
  blocks reclaim's evictions; after --reclaim-pdb-timeout the pods are
  deleted instead and the starving queue gets its share.
- An approver may answer only the admission check RBAC lets them
  `approve` (manifests/approvals.yaml, a ValidatingAdmissionPolicy the
  apiserver evaluates), and cannot push a check's timestamp ahead.

The module restarts the primary arbiter with a short grace and PDB timeout
and restores the default afterwards.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from arbiter.core.api import APPROVAL_CONTROLLER, format_rfc3339
from arbiter.sandbox import Sandbox
from arbiter.sandbox.components import repo_root
from tests.e2e.helpers import (
    CPUS,
    arbiter_with,
    create,
    pod,
    scenario,
    suffix,
    wait_for,
)
from tests.e2e.test_admission_checks import admission_check, phase_is, wide_job
from tests.e2e.test_reclaim import events, running

GRACE = 5.0
PDB_TIMEOUT = 15.0


@pytest.fixture(scope="module", autouse=True)
def short_timeouts(sandbox: Sandbox) -> Iterator[None]:
    with arbiter_with(sandbox, ["--reclaim-grace", str(GRACE),
                                "--reclaim-pdb-timeout", str(PDB_TIMEOUT)]):
        yield


def test_a_pdb_over_all_of_a_tenants_pods_does_not_freeze_reclaim(sandbox: Sandbox) -> None:
    tag = suffix()
    qa, qb = f"pa-{tag}", f"pb-{tag}"
    with scenario(sandbox, {qa: {"namespaces": [qa]}, qb: {"namespaces": [qb]}}, [qa, qb]):
        labelled = [pod(f"p{i:02d}", qa) for i in range(CPUS)]
        for body in labelled:
            body["metadata"]["labels"] = {"app": "hold"}
        create(sandbox, *labelled)
        wait_for("A runs 10 pods", lambda: len(running(sandbox, qa)) == CPUS)
        create(sandbox, {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                         "metadata": {"name": "all", "namespace": qa},
                         "spec": {"minAvailable": CPUS,
                                  "selector": {"matchLabels": {"app": "hold"}}}})
        # The sandbox runs no disruption controller: the apiserver answers
        # every eviction of a pod a PDB covers with 429 until that controller
        # has processed it, which is what minAvailable = all answers too.
        started = time.monotonic()
        create(sandbox, *(pod(f"p{i:02d}", qb) for i in range(CPUS)))
        wait_for("evictions blocked", lambda: events(sandbox, qa, "EvictionBlocked"),
                 timeout=60)
        assert len(running(sandbox, qa)) == CPUS
        wait_for("A and B at 5 and 5", lambda: (len(running(sandbox, qa)),
                                                len(running(sandbox, qb))) == (5, 5),
                 timeout=PDB_TIMEOUT + 150)
        took = time.monotonic() - started
        assert took >= PDB_TIMEOUT
        overridden = events(sandbox, qa, "PodDisruptionBudgetOverridden")
        assert overridden and "PodDisruptionBudget blocked" in overridden[0]["message"]
        assert {e["involvedObject"]["kind"] for e in overridden} >= {"Pod", "QueueUnit"}
        print(f"PDB over all pods: B got its share in {took:.1f}s "
              f"(grace {GRACE:g}s, --reclaim-pdb-timeout {PDB_TIMEOUT:g}s)")


def _grant(sandbox: Sandbox, ns: str, check: str, group: str) -> str:
    """RBAC for `group`: patch unit status in `ns`, approve `check` only."""
    docs = [
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": "approver", "namespace": ns},
         "rules": [{"apiGroups": ["arbiter.dev"], "resources": ["queueunits/status"],
                    "verbs": ["get", "patch"]},
                   {"apiGroups": ["arbiter.dev"], "resources": ["queueunits"],
                    "verbs": ["get"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": "approver", "namespace": ns},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                     "name": "approver"},
         "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group",
                       "name": group}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": f"approve-{check}"},
         "rules": [{"apiGroups": ["arbiter.dev"], "resources": ["admissionchecks"],
                    "resourceNames": [check], "verbs": ["approve"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": f"approve-{check}"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                     "name": f"approve-{check}"},
         "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group",
                       "name": group}]},
    ]
    create(sandbox, *docs)
    return f"approve-{check}"


def _answer(sandbox: Sandbox, ns: str, unit: str, index: int, name: str, group: str,
            **entry: Any) -> Any:
    ops = [{"op": "test", "path": f"/status/admissionChecks/{index}/name", "value": name}]
    ops += [{"op": "replace", "path": f"/status/admissionChecks/{index}/{key}", "value": value}
            for key, value in entry.items()]
    return sandbox.kubectl("patch", "queueunit", unit, "-n", ns, "--subresource=status",
                           "--type=json", "-p", json.dumps(ops), "--as=alice",
                           f"--as-group={group}", check=False)


def test_an_approver_answers_only_the_check_rbac_names(sandbox: Sandbox) -> None:
    policy = repo_root() / "manifests" / "approvals.yaml"
    sandbox.kubectl("apply", "-f", str(policy))
    s = suffix()
    ns, group = f"appr-{s}", f"approvers-{s}"
    granted = ""
    try:
        with admission_check(sandbox, f"mine-{s}", controllerName=APPROVAL_CONTROLLER) as mine, \
                admission_check(sandbox, f"theirs-{s}",
                                controllerName=APPROVAL_CONTROLLER) as theirs, \
                scenario(sandbox, {ns: {"namespaces": [ns], "admissionChecks": [
                    {"name": mine}, {"name": theirs}]}}, [ns]):
            granted = _grant(sandbox, ns, mine, group)
            time.sleep(2)  # the policy's and RBAC's caches in the apiserver
            create(sandbox, wide_job("big", ns, 2))
            wait_for("the Job Reserved", lambda: phase_is(sandbox, ns, "big", "Reserved"))
            now = format_rfc3339(time.time())
            other = _answer(sandbox, ns, "job-big", 1, theirs, group, state="Ready",
                            lastTransitionTime=now)
            assert other.returncode != 0, other.stdout
            assert "RBAC lets you approve" in other.stderr, other.stderr
            far = format_rfc3339(time.time() + 10 * 365 * 86400)
            ahead = _answer(sandbox, ns, "job-big", 0, mine, group, lastTransitionTime=far)
            assert ahead.returncode != 0 and "lastTransitionTime" in ahead.stderr, ahead.stderr
            own = _answer(sandbox, ns, "job-big", 0, mine, group, state="Ready",
                          lastTransitionTime=now)
            assert own.returncode == 0, own.stderr
            time.sleep(2)
            assert phase_is(sandbox, ns, "big", "Reserved")  # theirs still Pending
    finally:
        if granted:
            sandbox.kubectl("delete", "clusterrole,clusterrolebinding", granted,
                            "--ignore-not-found", check=False)
        sandbox.kubectl("delete", "-f", str(policy), "--ignore-not-found", check=False)
