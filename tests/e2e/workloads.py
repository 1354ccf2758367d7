"""What the integration e2e files (tests/e2e/test_integration_*.py) share:
the workloads they queue, built as a user writes them (the JobSet and LWS
webhooks default the rest), and reading their units and pods.

They run on the `integrated` sandbox (tests/e2e/conftest.py: 8 fake nodes
x 1 CPU, the JobSet and LeaderWorkerSet controllers, arbiter queueing every
kind); "room" is a queue's `capability` unless a test says otherwise.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from arbiter.core.api import ADMISSION_GATE
from arbiter.sandbox import POD_COMPLETE_DELAY_ANNOTATION, Sandbox
from tests.e2e.helpers import apply_queue, debug_queues, get, unique_name, wait_for

CPUS = 8  # conftest.INTEGRATED_NODES
NODES = [f"kwok-node-{index}" for index in range(CPUS)]
LONG = "10m"  # a Job's pods that run until the test ends
GROUP_INDEX = "leaderworkerset.sigs.k8s.io/group-index"


def container(cpu: str = "1") -> dict[str, Any]:
    return {"name": "main", "image": "busybox", "resources": {"requests": {"cpu": cpu}}}


def jobset(name: str, ns: str, *, workers: int = 3, runs_for: str = LONG) -> dict[str, Any]:
    """A driver (1 pod) and `workers` workers (one Job of `workers` pods), 1 CPU each."""
    template = {"metadata": {"annotations": {POD_COMPLETE_DELAY_ANNOTATION: runs_for}},
                "spec": {"containers": [container()]}}
    return {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"replicatedJobs": [
                {"name": "driver", "replicas": 1, "template": {"spec": {"template": template}}},
                {"name": "workers", "replicas": 1, "template": {"spec": {
                    "parallelism": workers, "completions": workers, "template": template}}},
            ]}}


def job_of(name: str, ns: str, pods: int, runs_for: str = LONG) -> dict[str, Any]:
    """A Job of `pods` pods of 1 CPU (the same size as a JobSet of that many)."""
    template = {"metadata": {"annotations": {POD_COMPLETE_DELAY_ANNOTATION: runs_for}},
                "spec": {"restartPolicy": "Never", "containers": [container()]}}
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "namespace": ns},
            "spec": {"parallelism": pods, "completions": pods, "backoffLimit": 0,
                     "template": template}}


def statefulset(name: str, ns: str, replicas: int) -> dict[str, Any]:
    """OrderedReady (the default): each pod only once the one before is Ready."""
    labels = {"app": name}
    return {"apiVersion": "apps/v1", "kind": "StatefulSet",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"replicas": replicas, "serviceName": name,
                     "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels},
                                  "spec": {"containers": [container()]}}}}


def deployment(name: str, ns: str, replicas: int) -> dict[str, Any]:
    labels = {"app": name}
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"replicas": replicas, "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels},
                                  "spec": {"containers": [container()]}}}}


def leaderworkerset(name: str, ns: str, groups: int, size: int) -> dict[str, Any]:
    return {"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"replicas": groups, "leaderWorkerTemplate": {
                "size": size, "workerTemplate": {"spec": {"containers": [container()]}}}}}


# -- reading -----------------------------------------------------------------------------


def pods(sandbox: Sandbox, ns: str, selector: str = "") -> list[dict[str, Any]]:
    """The pods of `ns` (matching `selector`) that are not on their way out."""
    args = ["-l", selector] if selector else []
    items: list[dict[str, Any]] = get(sandbox, "pods", "-n", ns, *args)["items"]
    return [p for p in items if not p["metadata"].get("deletionTimestamp")]


def gated(pod: dict[str, Any]) -> bool:
    return any(g.get("name") == ADMISSION_GATE for g in pod["spec"].get("schedulingGates") or [])


def running(sandbox: Sandbox, ns: str, selector: str = "") -> list[str]:
    return sorted(p["metadata"]["name"] for p in pods(sandbox, ns, selector)
                  if (p.get("status") or {}).get("phase") == "Running")


def unit(sandbox: Sandbox, ns: str, name: str) -> dict[str, Any] | None:
    found = sandbox.kubectl("get", "queueunit", name, "-n", ns, "-o", "json", check=False)
    document: dict[str, Any] | None = json.loads(found.stdout) if found.returncode == 0 else None
    return document


def suspended(sandbox: Sandbox, ns: str, kind: str, name: str) -> bool:
    return get(sandbox, kind, name, "-n", ns)["spec"].get("suspend") is True


def phase(obj: dict[str, Any] | None) -> str:
    return str(((obj or {}).get("status") or {}).get("phase") or "")


def pod_sets(obj: dict[str, Any]) -> dict[str, int]:
    return {s["name"]: s["count"] for s in obj["spec"]["podSets"]}


def consumer(obj: dict[str, Any]) -> dict[str, str]:
    """A workload as a QueueUnit's `spec.consumerRef` must name it."""
    return {"apiVersion": obj["apiVersion"], "kind": obj["kind"],
            "name": obj["metadata"]["name"], "uid": obj["metadata"]["uid"]}


def consumer_ref(obj: dict[str, Any]) -> dict[str, str]:
    ref = obj["spec"].get("consumerRef") or {}
    return {k: str(ref.get(k)) for k in ("apiVersion", "kind", "name", "uid")}


def allocated_cpu(sandbox: Sandbox, queue_name: str) -> str:
    """What the loop charges `queue_name` in CPU ("0" when nothing)."""
    view = debug_queues(sandbox)["queues"].get(queue_name) or {}
    return str((view.get("allocated") or {}).get("cpu", "0"))


def set_room(sandbox: Sandbox, ns: str, queue_name: str, cpus: int, **spec: Any) -> None:
    """The Queue listing `ns`, capped at `cpus` CPUs."""
    apply_queue(sandbox, queue_name, namespaces=[ns], capability={"cpu": str(cpus)}, **spec)


def quiet(sandbox: Sandbox) -> None:
    """Wait until every CPU is free (the last test's pods gone)."""
    def free() -> bool:
        document = debug_queues(sandbox)
        return bool(document["capacity"].get("cpu") == document["free"].get("cpu") == str(CPUS))

    wait_for(f"a quiet cluster (all {CPUS} CPUs free)", free, timeout=90)


@contextmanager
def pool(sandbox: Sandbox, nodes: list[str]) -> Iterator[tuple[str, dict[str, str]]]:
    """A Pool of `nodes` (labelled for it): (its name, its nodeSelector);
    the Pool and the labels go afterwards."""
    name = unique_name("pool")
    selector = {"e2e.arbiter.dev/pool": name}
    sandbox.kubectl("label", "node", *nodes, f"e2e.arbiter.dev/pool={name}", "--overwrite")
    sandbox.apply_yaml(json.dumps({"apiVersion": "arbiter.dev/v1alpha1", "kind": "Pool",
                                   "metadata": {"name": name},
                                   "spec": {"nodeSelector": selector}}))
    try:
        yield name, selector
    finally:
        sandbox.kubectl("delete", "pool", name, "--ignore-not-found", check=False)
        sandbox.kubectl("label", "node", *nodes, "e2e.arbiter.dev/pool-", check=False)
