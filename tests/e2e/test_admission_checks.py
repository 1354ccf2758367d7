"""Admission checks and partial admission on the real control plane
(DESIGN §12; 10 fake nodes × 1 CPU).

A Queue with the approval check: its Job waits Reserved with its quota
counted, `arbiter approve` starts it, `arbiter reject` fails it before any
pod exists; a check that times out gives the quota back; a SIGKILLed leader
loses no check state. A Job annotated `arbiter.dev/min-parallelism` runs
with the pods that fit.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from arbiter.core.api import APPROVAL_CONTROLLER, MIN_PARALLELISM_ANNOTATION
from arbiter.sandbox import Sandbox
from tests.e2e.helpers import (
    CPUS,
    admissions,
    create,
    debug_queues,
    get,
    job,
    metrics,
    run_arbiter,
    scenario,
    suffix,
    wait_for,
)


@contextmanager
def admission_check(sandbox: Sandbox, name: str, **spec: Any) -> Iterator[str]:
    create(sandbox, {"apiVersion": "arbiter.dev/v1alpha1", "kind": "AdmissionCheck",
                     "metadata": {"name": name}, "spec": spec})
    try:
        yield name
    finally:
        sandbox.kubectl("delete", "admissioncheck", name, "--ignore-not-found", check=False)


def wide_job(name: str, ns: str, parallelism: int, *, runs_for: str = "120s",
             minimum: int | None = None) -> dict[str, Any]:
    obj = job(name, ns, runs_for=runs_for)
    obj["spec"]["parallelism"] = parallelism
    obj["spec"]["completions"] = parallelism
    if minimum is not None:
        obj["metadata"]["annotations"] = {MIN_PARALLELISM_ANNOTATION: str(minimum)}
    return obj


def unit_status(sandbox: Sandbox, ns: str, job_name: str) -> dict[str, Any]:
    found = sandbox.kubectl("get", "queueunit", f"job-{job_name}", "-n", ns, "-o", "json",
                            check=False)
    if found.returncode != 0:
        return {}
    return dict(json.loads(found.stdout).get("status") or {})


def phase_is(sandbox: Sandbox, ns: str, job_name: str, phase: str) -> bool:
    return unit_status(sandbox, ns, job_name).get("phase") == phase


def job_pods(sandbox: Sandbox, ns: str, job_name: str) -> list[dict[str, Any]]:
    listed: list[dict[str, Any]] = get(sandbox, "pods", "-n", ns, "-l",
                                       f"batch.kubernetes.io/job-name={job_name}")["items"]
    return listed


def free_cpu(sandbox: Sandbox) -> str:
    return str(debug_queues(sandbox)["free"].get("cpu"))


def arbiter_cli(sandbox: Sandbox, *args: str) -> str:
    done = run_arbiter(*args, "--kubeconfig", str(sandbox.kubeconfig))
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_approval_holds_quota_approve_starts_reject_fails(sandbox: Sandbox) -> None:
    s = suffix()
    gated, plain = f"gated-{s}", f"plain-{s}"
    with admission_check(sandbox, f"approval-{s}", controllerName=APPROVAL_CONTROLLER) as check, \
            scenario(sandbox, {gated: {"namespaces": [gated],
                                       "admissionChecks": [{"name": check}]},
                               plain: {"namespaces": [plain]}}, [gated, plain]):
        create(sandbox, wide_job("big", gated, 6))
        wait_for("the big Job Reserved", lambda: phase_is(sandbox, gated, "big", "Reserved"))
        assert get(sandbox, "job", "big", "-n", gated)["spec"]["suspend"] is True
        checks = unit_status(sandbox, gated, "big")["admissionChecks"]
        assert [(c["name"], c["state"]) for c in checks] == [(check, "Pending")]
        assert free_cpu(sandbox) == f"{CPUS - 6}"
        assert metrics(sandbox)[("arbiter_admission_check_state",
                                 (("check", check), ("state", "Pending")))] == 1.0
        # The reserved quota is counted: 5 CPUs of another queue do not fit.
        create(sandbox, wide_job("other", plain, 5))
        time.sleep(3)
        assert not admissions({"status": unit_status(sandbox, plain, "other")})
        assert arbiter_cli(sandbox, "queues").count(f"{gated}/job-big") == 1

        # Even the cluster admin cannot forge an admission through the status.
        forged = sandbox.kubectl("patch", "queueunit", "job-big", "-n", gated,
                                 "--subresource=status", "--type=merge",
                                 "-p", '{"status":{"phase":"Dequeued"}}', check=False)
        assert forged.returncode != 0 and "record of admission" in forged.stderr, forged
        assert phase_is(sandbox, gated, "big", "Reserved")

        arbiter_cli(sandbox, "approve", f"{gated}/job-big", "--message", "ok")
        approved = time.monotonic()
        wait_for("the big Job started", lambda: get(sandbox, "job", "big", "-n", gated)
                 ["spec"].get("suspend") is False, timeout=10, poll=0.05)
        assert time.monotonic() - approved <= 2.0
        assert phase_is(sandbox, gated, "big", "Dequeued") or \
            phase_is(sandbox, gated, "big", "Running")

        create(sandbox, wide_job("doomed", gated, 1))
        wait_for("the doomed Job Reserved",
                 lambda: phase_is(sandbox, gated, "doomed", "Reserved"))
        arbiter_cli(sandbox, "reject", f"{gated}/job-doomed", "--message", "too costly")
        wait_for("the doomed unit Failed", lambda: phase_is(sandbox, gated, "doomed", "Failed"))
        failed = unit_status(sandbox, gated, "doomed")
        assert "too costly" in failed["message"]
        assert any(c["type"] == "AdmissionCheckRejected" for c in failed["conditions"])
        time.sleep(2)
        assert get(sandbox, "job", "doomed", "-n", gated)["spec"]["suspend"] is True
        assert job_pods(sandbox, gated, "doomed") == []
        events = get(sandbox, "events", "-n", gated,
                     "--field-selector", "involvedObject.name=doomed")["items"]
        assert any(e["reason"] == "AdmissionCheckRejected" for e in events)


def test_a_check_that_times_out_requeues_and_frees_the_quota(sandbox: Sandbox) -> None:
    s = suffix()
    ns = f"slow-{s}"
    with admission_check(sandbox, f"slow-{s}", controllerName="example.com/never",
                         timeoutSeconds=3, retryDelaySeconds=600) as check, \
            scenario(sandbox, {ns: {"namespaces": [ns], "admissionChecks": [{"name": check}]}},
                     [ns]):
        create(sandbox, wide_job("w", ns, 4))
        wait_for("Reserved", lambda: phase_is(sandbox, ns, "w", "Reserved"))
        assert free_cpu(sandbox) == f"{CPUS - 4}"
        wait_for("requeued after the timeout", lambda: phase_is(sandbox, ns, "w", "Enqueued"),
                 timeout=30)
        status = unit_status(sandbox, ns, "w")
        assert "timed out after 3s" in status["message"] and status.get("requeueAt")
        assert status["attempts"] == 1
        wait_for("the quota freed", lambda: free_cpu(sandbox) == f"{CPUS}", timeout=10)
        assert get(sandbox, "job", "w", "-n", ns)["spec"]["suspend"] is True


def test_sigkill_while_reserved_loses_no_check_state(sandbox: Sandbox) -> None:
    s = suffix()
    ns = f"crash-{s}"
    with admission_check(sandbox, f"boss-{s}", controllerName=APPROVAL_CONTROLLER) as check, \
            scenario(sandbox, {ns: {"namespaces": [ns], "admissionChecks": [{"name": check}]}},
                     [ns]):
        create(sandbox, wide_job("a", ns, 2), wide_job("b", ns, 2))
        wait_for("both Reserved", lambda: phase_is(sandbox, ns, "a", "Reserved")
                 and phase_is(sandbox, ns, "b", "Reserved"))
        arbiter_cli(sandbox, "approve", f"{ns}/job-a")
        sandbox.kill_arbiter()
        sandbox.start_arbiter()  # waits out the dead leader's Lease, then rebuilds
        wait_for("a released", lambda: get(sandbox, "job", "a", "-n", ns)["spec"]
                 .get("suspend") is False, timeout=90)
        assert phase_is(sandbox, ns, "b", "Reserved")
        assert [c["state"] for c in unit_status(sandbox, ns, "b")["admissionChecks"]] == \
            ["Pending"]
        # The new process waits out the dead leader's Lease before it leads.
        wait_for("the new arbiter leads",
                 lambda: metrics(sandbox)[("arbiter_leader", ())] == 1.0, timeout=90)
        wait_for("b's quota counted by the new leader",
                 lambda: free_cpu(sandbox) == f"{CPUS - 4}", timeout=30)
        assert phase_is(sandbox, ns, "b", "Reserved")
        arbiter_cli(sandbox, "approve", f"{ns}/job-b")
        wait_for("b released", lambda: get(sandbox, "job", "b", "-n", ns)["spec"]
                 .get("suspend") is False, timeout=10)
        for name in ("a", "b"):
            assert len(unit_status(sandbox, ns, name)["admissions"]) == 1


def test_partial_admission_runs_a_job_with_the_pods_that_fit(sandbox: Sandbox) -> None:
    s = suffix()
    held, flexible, rigid = f"held-{s}", f"flex-{s}", f"rigid-{s}"
    with scenario(sandbox, {held: {"namespaces": [held]}, flexible: {"namespaces": [flexible]},
                            rigid: {"namespaces": [rigid]}}, [held, flexible, rigid]):
        create(sandbox, {"apiVersion": "arbiter.dev/v1alpha1", "kind": "QueueUnit",
                         "metadata": {"name": "hold", "namespace": held},
                         "spec": {"queue": held, "podSets": [
                             {"name": "main", "count": CPUS - 5, "requests": {"cpu": "1"}}]}})
        wait_for("5 CPUs free", lambda: free_cpu(sandbox) == "5")
        create(sandbox, wide_job("whole", rigid, 8))
        time.sleep(1)
        create(sandbox, wide_job("part", flexible, 8, minimum=3))
        wait_for("the annotated Job runs", lambda: get(sandbox, "job", "part", "-n", flexible)
                 ["spec"].get("suspend") is False)
        spec = get(sandbox, "job", "part", "-n", flexible)["spec"]
        assert spec["parallelism"] == 5
        status = unit_status(sandbox, flexible, "part")
        assert status["admissions"][-1]["replicas"] == {"main": 5}
        wait_for("5 pods running", lambda: len(
            [p for p in job_pods(sandbox, flexible, "part")
             if p["status"].get("phase") == "Running"]) == 5)
        assert get(sandbox, "job", "whole", "-n", rigid)["spec"]["suspend"] is True
        assert not admissions({"status": unit_status(sandbox, rigid, "whole")})
        samples = metrics(sandbox)
        assert samples[("arbiter_partial_admissions_total", (("queue", flexible),))] == 1.0
        # Without the annotation there is no way in; the webhook refuses a bad one.
        bad = wide_job("bad", flexible, 4, minimum=9)
        refused = sandbox.kubectl("create", "-f", "-", input=json.dumps(bad),
                                  check=False)
        assert refused.returncode != 0 and MIN_PARALLELISM_ANNOTATION in refused.stderr


def test_the_approvers_example_grants_one_namespace_and_reading_checks(
        sandbox: Sandbox) -> None:
    """examples/approvers-rbac.yaml as shipped: its group may answer units
    of gpu-team only, and nothing but their status."""
    example = (Path(__file__).resolve().parents[2] / "examples" / "approvers-rbac.yaml")
    sandbox.apply_yaml(example.read_text())
    try:
        def can(*args: str) -> bool:
            done = sandbox.kubectl("auth", "can-i", *args, "--as=alice",
                                   "--as-group=gpu-approvers", check=False)
            return done.stdout.strip() == "yes"

        assert can("patch", "queueunits.arbiter.dev", "--subresource=status", "-n", "gpu-team")
        assert can("get", "queueunits.arbiter.dev", "-n", "gpu-team")
        assert can("get", "admissionchecks.arbiter.dev")
        assert not can("patch", "queueunits.arbiter.dev", "--subresource=status",
                       "-n", "default")
        assert not can("patch", "queueunits.arbiter.dev", "-n", "gpu-team")
        assert not can("update", "jobs.batch", "-n", "gpu-team")
        assert not can("patch", "queues.arbiter.dev")
    finally:
        sandbox.kubectl("delete", "-f", str(example), "--ignore-not-found", "--wait=false",
                        check=False)
