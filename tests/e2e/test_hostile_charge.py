"""Reality is charged (issue #25 rows 4, 7 and the backstop) on the real
control plane (10 fake nodes x 1 CPU): what runs counts against a queue
whatever a tenant did to its Job or its unit."""

from __future__ import annotations

import json
import time
from typing import Any

from arbiter.sandbox import Sandbox
from tests.e2e.helpers import create, get, job, metrics, run_arbiter, tenant, wait_for

LONG = "10m"  # the pods run until the test deletes them


def big_job(name: str, ns: str, parallelism: int) -> dict[str, Any]:
    obj = job(name, ns, runs_for=LONG)
    obj["spec"]["parallelism"] = obj["spec"]["completions"] = parallelism
    return obj


def suspended(sandbox: Sandbox, ns: str, name: str) -> bool:
    return bool(get(sandbox, "job", name, "-n", ns)["spec"].get("suspend"))


def running_pods(sandbox: Sandbox, ns: str) -> list[dict[str, Any]]:
    return [p for p in get(sandbox, "pods", "-n", ns)["items"]
            if p["spec"].get("nodeName") and p["status"].get("phase") == "Running"]


def queue_status(sandbox: Sandbox, name: str) -> dict[str, Any]:
    return get(sandbox, "queue", name).get("status") or {}


def stays(what: str, check: Any, seconds: float = 4.0) -> None:
    """`check()` holds all along for `seconds` (the loop had time to act)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert check(), what
        time.sleep(0.5)


def test_an_orphan_deleted_job_keeps_its_room_as_unqueued_usage(sandbox: Sandbox) -> None:
    with tenant(sandbox, "orphan", capability={"cpu": "2"}) as (ns, queue_name):
        create(sandbox, big_job("first", ns, 2))
        wait_for("first's pods running", lambda: len(running_pods(sandbox, ns)) == 2,
                 timeout=60)
        sandbox.kubectl("delete", "job", "first", "-n", ns, "--cascade=orphan")
        create(sandbox, big_job("second", ns, 2))
        # The orphans still run: the queue is charged for them, shown as
        # unqueued usage, and the next Job is not admitted into their room.
        status = wait_for("unqueued usage in Queue status", lambda: (
            s if (s := queue_status(sandbox, queue_name)).get("unqueuedPods") == 2 else None),
            timeout=30)
        assert status["unqueued"] == {"cpu": "2"}
        assert status["allocated"] == {"cpu": "2"}
        stays("the second Job waits", lambda: suspended(sandbox, ns, "second"))
        samples = metrics(sandbox)
        assert samples[("arbiter_queue_unqueued",
                        (("queue", queue_name), ("resource", "cpu")))] == 2.0
        table = run_arbiter("queues", "--kubeconfig", str(sandbox.kubeconfig), check=True)
        row = next(line for line in table.stdout.splitlines() if queue_name in line)
        assert "2 pods: cpu 2" in row, table.stdout
        # Their room comes back when they are gone.
        for pod in running_pods(sandbox, ns):
            sandbox.kubectl("delete", "pod", pod["metadata"]["name"], "-n", ns, "--wait=false")
        wait_for("the second Job admitted", lambda: not suspended(sandbox, ns, "second"),
                 timeout=60)
        wait_for("no unqueued usage left",
                 lambda: queue_status(sandbox, queue_name).get("unqueuedPods") == 0, timeout=30)


def test_a_patched_down_unit_is_admitted_at_the_jobs_real_size(sandbox: Sandbox) -> None:
    # Capability 3, hog takes 2: the Job's 2 x 1 CPU wait, 10m would fit.
    with tenant(sandbox, "shrink", capability={"cpu": "3"}) as (ns, _):
        create(sandbox, big_job("hog", ns, 2))
        wait_for("hog admitted", lambda: not suspended(sandbox, ns, "hog"), timeout=60)
        create(sandbox, big_job("big", ns, 2))
        unit = wait_for("big's unit", lambda: next(
            (u for u in get(sandbox, "queueunits", "-n", ns)["items"]
             if (u["spec"].get("consumerRef") or {}).get("name") == "big"), None))
        name = unit["metadata"]["name"]
        small = {"spec": {"podSets": [{"name": "main", "count": 1,
                                       "requests": {"cpu": "10m"}}]}}
        patch = ("patch", "queueunit", name, "-n", ns, "--type=merge", "-p", json.dumps(small))
        # The door: nobody but arbiter writes a loop-made unit's spec.
        denied = sandbox.kubectl(*patch, check=False)
        assert denied.returncode != 0
        assert "spec.podSets cannot change" in denied.stderr, denied.stderr
        # The backstop, as if the door were bypassed: the write in arbiter's
        # own name (the sandbox's `kube-arbiter`, impersonated by the admin).
        sandbox.kubectl(*patch, "--as=kube-arbiter", "--as-group=system:masters")
        # The loop puts the Job's demand back and admits nothing meanwhile.
        wait_for("the unit's spec is the Job's again", lambda: get(
            sandbox, "queueunit", name, "-n", ns)["spec"]["podSets"][0]["count"] == 2,
            timeout=30)
        stays("big waits", lambda: suspended(sandbox, ns, "big"))
        sandbox.kubectl("delete", "job", "hog", "-n", ns, "--wait=false")
        wait_for("big admitted", lambda: not suspended(sandbox, ns, "big"), timeout=60)
        status = get(sandbox, "queueunit", name, "-n", ns)["status"]
        assert status["allocated"] == {"cpu": "2"}
