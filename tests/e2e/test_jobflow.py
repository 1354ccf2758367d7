"""JobFlow on the real control plane: a DAG of Jobs that each go through their
queue, a step that fails for good, a cycle the webhook denies."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from arbiter.sandbox import POD_COMPLETE_DELAY_ANNOTATION, Sandbox
from tests.e2e.helpers import get, run_arbiter, tenant, timestamp, wait_for

FLOW_LABEL = "arbiter.dev/jobflow"
QUEUE_LABEL = "arbiter.dev/queue"
FLOW_TIMEOUT = 120.0


def _template(name: str, *, delay: str = "1s", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "arbiter.dev/v1alpha1", "kind": "JobTemplate",
        "metadata": {"name": name},
        "spec": {
            "backoffLimit": 0,
            **spec,
            "template": {
                "metadata": {"annotations": {POD_COMPLETE_DELAY_ANNOTATION: delay}},
                "spec": {"restartPolicy": "Never", "containers": [{
                    "name": "main", "image": "example.invalid/step:1",
                    "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}}]},
            },
        },
    }


def _flow(name: str, flows: list[dict[str, Any]]) -> dict[str, Any]:
    return {"apiVersion": "arbiter.dev/v1alpha1", "kind": "JobFlow",
            "metadata": {"name": name}, "spec": {"flows": flows}}


def _apply(sandbox: Sandbox, namespace: str, *objects: dict[str, Any],
           check: bool = True) -> subprocess.CompletedProcess[str]:
    text = "\n---\n".join(json.dumps(o) for o in objects)
    return sandbox.kubectl("apply", "-n", namespace, "-f", "-", input=text, check=check)


@pytest.fixture
def space(sandbox: Sandbox) -> Iterator[tuple[str, str]]:
    """A namespace listed by its own Queue, with JobTemplates `short` and
    `doomed` (fails: a 1 s deadline, pods that would run 10 minutes)."""
    with tenant(sandbox, "flow", settle=0) as (namespace, queue):
        _apply(sandbox, namespace, _template("short"),
               _template("doomed", delay="10m", activeDeadlineSeconds=1))
        # The webhook reads Queues and JobTemplates from its cache.
        time.sleep(1.0)
        yield namespace, queue


def _flow_status(sandbox: Sandbox, namespace: str, name: str) -> dict[str, Any]:
    status: dict[str, Any] = get(sandbox, "jobflow", name, "-n", namespace).get("status") or {}
    return status


def _phase_is(sandbox: Sandbox, namespace: str, name: str, *phases: str) -> dict[str, Any] | None:
    status = _flow_status(sandbox, namespace, name)
    return status if (status.get("state") or {}).get("phase") in phases else None


def _jobs(sandbox: Sandbox, namespace: str, flow: str) -> dict[str, dict[str, Any]]:
    items = get(sandbox, "jobs", "-n", namespace, "-l", f"{FLOW_LABEL}={flow}")["items"]
    return {job["metadata"]["name"]: job for job in items}


def test_dag_runs_in_dependency_order_through_the_queue(
        sandbox: Sandbox, space: tuple[str, str]) -> None:
    namespace, queue = space
    steps: list[dict[str, Any]] = [
        {"name": "a", "template": "short"},
        {"name": "b", "template": "short", "dependsOn": {"targets": ["a"]}},
        {"name": "c", "template": "short", "dependsOn": {"targets": ["b"]}},
        {"name": "d", "template": "short", "dependsOn": {"targets": ["b"]},
         "patch": {"parallelism": 2, "completions": 2}},
        {"name": "e", "template": "short", "dependsOn": {"targets": ["c", "d"]}},
    ]
    edges = {"b": ["a"], "c": ["b"], "d": ["b"], "e": ["c", "d"]}
    _apply(sandbox, namespace, _flow("dag", steps))
    status = wait_for("the flow to succeed",
                      lambda: _phase_is(sandbox, namespace, "dag", "Succeed", "Failed"),
                      timeout=FLOW_TIMEOUT, poll=0.5)
    assert status["state"] == {"phase": "Succeed"}, status

    names = {s: f"dag-{s}" for s in "abcde"}
    jobs = _jobs(sandbox, namespace, "dag")
    assert sorted(jobs) == sorted(names.values())  # one Job per step, no retries
    for step, targets in edges.items():
        job = jobs[names[step]]
        created = timestamp(job["metadata"]["creationTimestamp"])
        for target in targets:
            # Created only once its targets had completed.
            finished = timestamp(jobs[names[target]]["status"]["completionTime"])
            assert created >= finished, (step, target)
    assert jobs["dag-d"]["status"]["succeeded"] == 2  # the patch took effect

    units = {u["metadata"]["name"]: u
             for u in get(sandbox, "queueunits", "-n", namespace)["items"]}
    for job_name, job in jobs.items():
        # Each went through its queue: labelled, created suspended, admitted.
        assert job["metadata"]["labels"][QUEUE_LABEL] == queue
        owner = job["metadata"]["ownerReferences"][0]
        assert (owner["kind"], owner["name"], owner["controller"]) == ("JobFlow", "dag", True)
        unit = units[f"job-{job_name}"]
        assert unit["spec"]["queue"] == queue
        assert unit["status"]["phase"] in ("Dequeued", "Running", "Succeed"), unit["status"]
        assert unit["status"].get("admissions"), unit["status"]

    assert status["progress"] == "5/5"
    assert sorted(status["completedJobs"]) == sorted(names.values())
    assert status["failedJobs"] == [] and status["runningJobs"] == []
    for entry in status["steps"]:
        assert entry["phase"] == "Succeed", entry
        assert entry["restartCount"] == 0
        assert entry["jobName"] == names[entry["name"]]
        assert entry["createTime"] <= entry["startTime"] <= entry["finishTime"]
        assert entry["runningDuration"].endswith("s")
    conditions = {c["type"]: c["status"] for c in status["conditions"]}
    assert conditions["Succeeded"] == "True"

    # The printer columns.
    table = sandbox.kubectl("get", "jobflow", "dag", "-n", namespace).stdout
    assert "Succeed" in table and "5/5" in table

    # A started flow's steps cannot change.
    changed = sandbox.kubectl(
        "patch", "jobflow", "dag", "-n", namespace, "--type=json",
        "-p", json.dumps([{"op": "add", "path": "/spec/flows/-",
                           "value": {"name": "f", "template": "short"}}]), check=False)
    assert changed.returncode != 0
    assert "cannot change once the flow has started" in changed.stderr

    # arbiter flow status / from-job / to-job against the live cluster.
    def arbiter(*args: str) -> str:
        result = run_arbiter("flow", *args, "-n", namespace,
                             "--kubeconfig", str(sandbox.kubeconfig))
        assert result.returncode == 0, result.stderr
        return result.stdout

    tree = arbiter("status", "dag")
    assert tree.splitlines()[0] == f"JobFlow {namespace}/dag: Succeed (5/5 steps succeeded)"
    assert "└── b  Succeed" in tree
    assert "e  (see above)" in tree
    template = yaml.safe_load(arbiter("from-job", "dag-a", "--name", "copied"))
    assert template["kind"] == "JobTemplate"
    assert template["metadata"]["name"] == "copied"
    assert "selector" not in template["spec"]
    assert "status" not in template and "uid" not in template["metadata"]
    pod_labels = template["spec"]["template"].get("metadata", {}).get("labels", {})
    assert not {"controller-uid", "job-name", QUEUE_LABEL} & set(pod_labels)
    job = yaml.safe_load(arbiter("to-job", "short", "--name", "plain"))
    assert (job["kind"], job["metadata"]["name"]) == ("Job", "plain")
    assert job["spec"]["template"]["spec"]["containers"][0]["name"] == "main"


def test_step_failing_twice_fails_the_flow(sandbox: Sandbox, space: tuple[str, str]) -> None:
    namespace, _ = space
    steps: list[dict[str, Any]] = [
        {"name": "a", "template": "short"},
        {"name": "b", "template": "doomed", "dependsOn": {"targets": ["a"]}, "maxRetries": 1},
        {"name": "e", "template": "short", "dependsOn": {"targets": ["b"]}},
    ]
    _apply(sandbox, namespace, _flow("fails", steps))
    status = wait_for("the flow to fail",
                      lambda: _phase_is(sandbox, namespace, "fails", "Failed", "Succeed"),
                      timeout=FLOW_TIMEOUT, poll=0.5)
    assert status["state"]["phase"] == "Failed", status
    assert status["state"]["message"] == "step b failed after 2 attempts"
    # Give a wrong controller time to (wrongly) create e.
    time.sleep(3)
    jobs = _jobs(sandbox, namespace, "fails")
    assert sorted(jobs) == ["fails-a", "fails-b", "fails-b-r1"]
    for name in ("fails-b", "fails-b-r1"):
        reasons = [c.get("reason") for c in jobs[name]["status"].get("conditions", [])
                   if c["type"] == "Failed" and c["status"] == "True"]
        assert reasons == ["DeadlineExceeded"], jobs[name]["status"]
    status = _flow_status(sandbox, namespace, "fails")
    steps_by_name = {s["name"]: s for s in status["steps"]}
    assert steps_by_name["b"]["phase"] == "Failed"
    assert steps_by_name["b"]["restartCount"] == 1
    assert [h["jobName"] for h in steps_by_name["b"]["history"]] == ["fails-b", "fails-b-r1"]
    assert steps_by_name["e"]["phase"] == "Skipped"
    assert status["failedJobs"] == ["fails-b", "fails-b-r1"]
    assert status["completedJobs"] == ["fails-a"]


def test_cyclic_flow_is_denied_with_the_cycle_named(
        sandbox: Sandbox, space: tuple[str, str]) -> None:
    namespace, _ = space
    steps = [
        {"name": "a", "template": "short", "dependsOn": {"targets": ["b"]}},
        {"name": "b", "template": "short", "dependsOn": {"targets": ["a"]}},
    ]
    result = _apply(sandbox, namespace, _flow("loop", steps), check=False)
    assert result.returncode != 0
    assert 'admission webhook "jobflows.validate.arbiter.dev" denied the request' \
        in result.stderr
    assert "spec.flows: cycle a -> b -> a" in result.stderr
    found = get(sandbox, "jobflows", "-n", namespace)["items"]
    assert found == []
