"""The admission webhook on the real apiserver (sandbox with arbiter, which
installs its own webhook configurations with --webhook-url)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from arbiter.sandbox import Sandbox
from tests.e2e.helpers import (
    apply_queue,
    create_namespace,
    create_tenant,
    delete_tenants,
    get,
    unique_name,
    wait_for,
)
from tests.e2e.helpers import queue as queue_object

# More than the sandbox's 10 × 1 CPU: the admission loop can never admit it,
# so what we observe is what the webhook stored.
TOO_BIG = "100"


@pytest.fixture
def cleanup(sandbox: Sandbox) -> Iterator[tuple[list[str], list[str]]]:
    """Namespaces and queues a test appends here are deleted after it, so the
    never-admittable work it leaves does not linger in the session sandbox."""
    namespaces: list[str] = []
    queues: list[str] = []
    yield namespaces, queues
    delete_tenants(sandbox, namespaces, queues)


def _run(sandbox: Sandbox, namespace: str, name: str, *extra: str,
         check: bool = True) -> Any:
    return sandbox.kubectl("run", name, "-n", namespace, "--image=busybox",
                           "--restart=Never", *extra, check=check)


def test_pod_without_queue_is_denied_with_the_fix(
    sandbox: Sandbox, cleanup: tuple[list[str], list[str]]
) -> None:
    namespace = unique_name("noqueue")
    cleanup[0].append(namespace)
    create_namespace(sandbox, namespace)
    result = _run(sandbox, namespace, "web", check=False)
    assert result.returncode != 0
    assert 'admission webhook "pods.validate.arbiter.dev" denied the request' in result.stderr
    assert (f'namespace "{namespace}" has no queue: label the pod or namespace with '
            f'arbiter.dev/queue=<queue>, or list "{namespace}" in a Queue\'s '
            "spec.namespaces") in result.stderr
    assert get(sandbox, "pods", "-n", namespace)["items"] == []


def test_job_in_queued_namespace_is_stored_suspended(
    sandbox: Sandbox, cleanup: tuple[list[str], list[str]]
) -> None:
    namespace, queue = unique_name("jobs"), unique_name("q")
    cleanup[0].append(namespace)
    cleanup[1].append(queue)
    create_tenant(sandbox, namespace, queue)
    job = {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "train",
                                                              "namespace": namespace},
        "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [{
            "name": "main", "image": "busybox",
            "resources": {"requests": {"cpu": TOO_BIG}}}]}}},
    }
    created = json.loads(sandbox.kubectl("create", "-f", "-", "-o", "json",
                                         input=json.dumps(job)).stdout)
    assert created["spec"]["suspend"] is True
    assert created["metadata"]["labels"]["arbiter.dev/queue"] == queue
    assert created["spec"]["template"]["metadata"]["labels"]["arbiter.dev/queue"] == queue
    stored = get(sandbox, "job", "train", "-n", namespace)
    assert stored["spec"]["suspend"] is True
    # A user cannot start it before arbiter admits it.
    patch = sandbox.kubectl("patch", "job", "train", "-n", namespace, "--type=merge",
                            "-p", '{"spec":{"suspend":false}}', check=False)
    assert patch.returncode != 0
    assert "only kube-arbiter may set spec.suspend to false" in patch.stderr
    time.sleep(1.0)
    assert get(sandbox, "pods", "-n", namespace)["items"] == []


def test_pod_is_stored_gated(sandbox: Sandbox, cleanup: tuple[list[str], list[str]]) -> None:
    namespace, queue = unique_name("pods"), unique_name("q")
    cleanup[0].append(namespace)
    cleanup[1].append(queue)
    create_namespace(sandbox, namespace)
    sandbox.kubectl("label", "namespace", namespace, f"arbiter.dev/queue={queue}")
    apply_queue(sandbox, queue)
    _run(sandbox, namespace, "web", f"--overrides={json.dumps({'spec': {'containers': [{'name': 'web', 'image': 'busybox', 'resources': {'requests': {'cpu': TOO_BIG}}}]}})}")  # noqa: E501
    pod = get(sandbox, "pod", "web", "-n", namespace)
    assert pod["metadata"]["labels"]["arbiter.dev/queue"] == queue
    assert {"name": "arbiter.dev/admission"} in pod["spec"]["schedulingGates"]

    def gated_condition() -> Any:
        conditions = get(sandbox, "pod", "web", "-n", namespace)["status"].get("conditions", [])
        return next((c for c in conditions if c["type"] == "PodScheduled"), None)

    condition = wait_for("PodScheduled condition", gated_condition)
    assert condition["status"] == "False" and condition["reason"] == "SchedulingGated"
    # Only arbiter lifts the gate.
    lift = sandbox.kubectl("patch", "pod", "web", "-n", namespace, "--type=json", "-p",
                           '[{"op":"remove","path":"/spec/schedulingGates"}]', check=False)
    assert lift.returncode != 0 and "only kube-arbiter may remove" in lift.stderr


def test_closed_queue_denies(sandbox: Sandbox, cleanup: tuple[list[str], list[str]]) -> None:
    namespace, queue = unique_name("closed"), unique_name("q")
    cleanup[0].append(namespace)
    cleanup[1].append(queue)
    create_tenant(sandbox, namespace, queue, state="Closed")
    result = _run(sandbox, namespace, "web", check=False)
    assert result.returncode != 0
    assert f'queue "{queue}"' in result.stderr and "is Closed" in result.stderr


def test_invalid_queue_is_denied_naming_the_field(sandbox: Sandbox) -> None:
    queue = unique_name("bad")
    document = json.dumps(queue_object(queue, guarantee={"cpu": "4"}, capability={"cpu": "2"}))
    result = sandbox.kubectl("create", "-f", "-", input=document, check=False)
    assert result.returncode != 0
    assert "spec.guarantee.cpu (4) exceeds spec.capability.cpu (2)" in result.stderr


def test_kube_system_works_while_arbiter_is_down(
    sandbox: Sandbox, cleanup: tuple[list[str], list[str]]
) -> None:
    name = unique_name("sys")
    managed = unique_name("managed")
    cleanup[0].append(managed)
    create_namespace(sandbox, managed)
    sandbox.stop_arbiter()
    try:
        created = _run(sandbox, "kube-system", name, check=False)
        assert created.returncode == 0, created.stderr
        pod = get(sandbox, "pod", name, "-n", "kube-system")
        assert "schedulingGates" not in pod["spec"]
        # A managed namespace fails closed meanwhile.
        refused = _run(sandbox, managed, "web", check=False)
        assert refused.returncode != 0 and "failed calling webhook" in refused.stderr
    finally:
        sandbox.start_arbiter()
        sandbox.kubectl("delete", "pod", name, "-n", "kube-system", "--wait=false",
                        check=False)


def test_queue_tree_on_the_apiserver(sandbox: Sandbox,
                                     cleanup: tuple[list[str], list[str]]) -> None:
    """DESIGN §11 against the real apiserver: the CRD takes parent and
    childOrder (and shows a Parent column), work labelled for a parent is
    denied naming its children, a parent cannot be deleted, and the loop
    writes the parent's subtree totals."""
    namespace, parent, child = unique_name("tree"), unique_name("org"), unique_name("team")
    cleanup[0].append(namespace)
    create_namespace(sandbox, namespace)
    apply_queue(sandbox, parent, childOrder="Queue")
    apply_queue(sandbox, child, parent=parent)
    try:
        table = sandbox.kubectl("get", "queue", child).stdout
        assert "PARENT" in table.splitlines()[0] and parent in table, table
        denied = _run(sandbox, namespace, "web", f"--labels=arbiter.dev/queue={parent}",
                      check=False)
        assert denied.returncode != 0
        assert (f'queue "{parent}"' in denied.stderr and "is a parent queue" in denied.stderr
                and f'"{child}"' in denied.stderr), denied.stderr
        kept = sandbox.kubectl("delete", "queue", parent, check=False)
        assert kept.returncode != 0 and f"is the parent of {child}" in kept.stderr
        one_cpu = {"spec": {"containers": [{"name": "web", "image": "busybox",
                                            "resources": {"requests": {"cpu": "1"}}}]}}
        _run(sandbox, namespace, "web", f"--labels=arbiter.dev/queue={child}",
             f"--overrides={json.dumps(one_cpu)}")

        def subtree() -> Any:
            status = get(sandbox, "queue", parent).get("status") or {}
            held = (status.get("subtree") or {}).get("allocated") or {}
            return status if held.get("cpu") == "1" else None

        status = wait_for("the parent's subtree totals", subtree, timeout=60)
        assert status["subtree"]["deserved"] == {"cpu": "1"}
    finally:
        # The child holds an admitted unit until its namespace is gone, and
        # the parent its child: delete in that order, each once allowed.
        sandbox.kubectl("delete", "namespace", namespace, "--timeout=60s", check=False)

        def deleted(name: str) -> bool:
            return sandbox.kubectl("delete", "queue", name, "--ignore-not-found",
                                   check=False).returncode == 0

        wait_for(f"queue {child} to be deletable", lambda: deleted(child), timeout=60, poll=1.0)
        wait_for(f"queue {parent} to be deletable", lambda: deleted(parent), timeout=60,
                 poll=1.0)
