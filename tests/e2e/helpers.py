"""What the end-to-end tests share: unique names, polling, kubectl JSON in
and out, object builders, tenants (a namespace and its Queue) and their
cleanup, arbiter's HTTPS endpoints, and `scenario` for tests that make
queues compete on a quiet cluster.

Every helper that talks to the cluster takes the session's `Sandbox`
(tests/e2e/conftest.py).
"""

from __future__ import annotations

import datetime as dt
import json
import ssl
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from prometheus_client.parser import text_string_to_metric_families

from arbiter.cache.convert import unit_status
from arbiter.core.api import ADMISSION_GATE
from arbiter.sandbox import POD_COMPLETE_DELAY_ANNOTATION, Sandbox
from arbiter.sandbox.components import repo_root
from arbiter.sandbox.probe import http_get

T = TypeVar("T")
# The session's cluster: 10 fake nodes × 1 CPU (conftest.E2E_NODES).
CPUS = 10
# How long the webhook takes to see a new Queue in its cache.
QUEUE_SETTLE = 0.5

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


# -- names, time, polling ----------------------------------------------------------------


def suffix() -> str:
    return uuid.uuid4().hex[:6]


def unique_name(prefix: str) -> str:
    return f"{prefix}-{suffix()}"


def timestamp(value: str) -> dt.datetime:
    """An RFC 3339 time as the apiserver writes it ("...Z")."""
    return dt.datetime.fromisoformat(value.replace("Z", "+00:00"))


def wait_for(what: str, check: Callable[[], T | None], timeout: float = 60.0,
             poll: float = 0.25) -> T:
    """Call `check` until it returns something truthy, and return that."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(poll)


def run_arbiter(*args: str, timeout: float = 60.0,
                check: bool = False) -> subprocess.CompletedProcess[str]:
    """`python -m arbiter ARGS` from the repository, output captured as text."""
    return subprocess.run([sys.executable, "-m", "arbiter", *args], capture_output=True,
                          text=True, cwd=repo_root(), timeout=timeout, check=check)


# -- kubectl -----------------------------------------------------------------------------


def get(sandbox: Sandbox, *args: str) -> Any:
    """`kubectl get ARGS -o json`, parsed."""
    return json.loads(sandbox.kubectl("get", *args, "-o", "json").stdout)


def create(sandbox: Sandbox, *objects: dict[str, Any]) -> None:
    """`kubectl create` of `objects` in one call."""
    sandbox.kubectl("create", "-f", "-",
                    input=json.dumps({"apiVersion": "v1", "kind": "List", "items": list(objects)}))


def lease_holder(sandbox: Sandbox) -> str:
    lease = get(sandbox, "lease", "kube-arbiter", "-n", "arbiter-system")
    return str(lease["spec"].get("holderIdentity") or "")


# -- objects -----------------------------------------------------------------------------


def queue(name: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "arbiter.dev/v1alpha1", "kind": "Queue",
            "metadata": {"name": name}, "spec": spec}


def namespace(name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name}
    if labels:
        metadata["labels"] = labels
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": metadata}


def pod(name: str, ns: str, cpu: str = "1") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns},
            "spec": {"restartPolicy": "Never", "containers": [{
                "name": "main", "image": "busybox", "resources": {"requests": {"cpu": cpu}}}]}}


def job(name: str, ns: str, *, cpu: str = "1", runs_for: str = "3s") -> dict[str, Any]:
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "namespace": ns},
            "spec": {"backoffLimit": 0, "template": {
                "metadata": {"annotations": {POD_COMPLETE_DELAY_ANNOTATION: runs_for}},
                "spec": {"restartPolicy": "Never", "containers": [{
                    "name": "main", "image": "busybox",
                    "resources": {"requests": {"cpu": cpu}}}]}}}}


def priority_class(name: str, value: int) -> dict[str, Any]:
    return {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
            "metadata": {"name": name}, "value": value}


def job_complete(obj: dict[str, Any]) -> bool:
    """Whether a Job (as kubectl returns it) has its Complete condition."""
    return any(c["type"] == "Complete" and c["status"] == "True"
               for c in (obj.get("status") or {}).get("conditions") or [])


# -- tenants: a namespace and the Queue that lists it ------------------------------------


def create_namespace(sandbox: Sandbox, name: str) -> None:
    sandbox.kubectl("create", "namespace", name)


def apply_queue(sandbox: Sandbox, name: str, *, settle: float = QUEUE_SETTLE,
                **spec: Any) -> None:
    """Apply a Queue, then give the webhook's cache `settle` seconds to see it."""
    sandbox.apply_yaml(json.dumps(queue(name, **spec)))
    time.sleep(settle)


def create_tenant(sandbox: Sandbox, ns: str, queue_name: str, *,
                  settle: float = QUEUE_SETTLE, **spec: Any) -> None:
    """Namespace `ns` and Queue `queue_name` listing it (plus `spec`)."""
    create_namespace(sandbox, ns)
    apply_queue(sandbox, queue_name, settle=settle, namespaces=[ns], **spec)


def grant(sandbox: Sandbox, ns: str, user: str, rules: list[dict[str, Any]]) -> None:
    """A Role of `rules` in `ns`, bound to `user` (a tenant's verbs there, for `--as`)."""
    create(sandbox,
           {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": "tenant", "namespace": ns}, "rules": rules},
           {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": "tenant", "namespace": ns},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                        "name": "tenant"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                          "name": user}]})


def delete_tenants(sandbox: Sandbox, namespaces: Iterable[str], queues: Iterable[str], *,
                   wait: float = 0.0) -> None:
    """Delete namespaces, then queues, whatever is left of them. With `wait`,
    wait up to that many seconds for the namespaces (and their pods) to go."""
    how = f"--timeout={wait:g}s" if wait else "--wait=false"
    namespaces, queues = list(namespaces), list(queues)
    if namespaces:
        sandbox.kubectl("delete", "namespace", *namespaces, "--ignore-not-found", how,
                        check=False)
    if queues:
        sandbox.kubectl("delete", "queue", *queues, "--ignore-not-found", check=False)


@contextmanager
def tenant(sandbox: Sandbox, prefix: str, *, settle: float = QUEUE_SETTLE, wait: float = 0.0,
           **spec: Any) -> Iterator[tuple[str, str]]:
    """A new namespace and a Queue that lists it: (namespace, queue); both
    deleted afterwards (see `delete_tenants` for `wait`)."""
    ns, queue_name = unique_name(prefix), unique_name("q")
    create_tenant(sandbox, ns, queue_name, settle=settle, **spec)
    try:
        yield ns, queue_name
    finally:
        delete_tenants(sandbox, [ns], [queue_name], wait=wait)


# -- arbiter's endpoints -----------------------------------------------------------------


def arbiter_get(sandbox: Sandbox, path: str, name: str = "arbiter") -> tuple[int, bytes]:
    context = ssl.create_default_context(cafile=str(sandbox.arbiter_cert_dir / "ca.crt"))
    # The debug API is served on the metrics listener only (DESIGN §13).
    base = sandbox.arbiter_metrics_url(name) if path.startswith("/debug/") \
        else sandbox.arbiter_url(name)
    return http_get(base + path, context)


@contextmanager
def arbiter_with(sandbox: Sandbox, args: list[str]) -> Iterator[None]:
    """The primary arbiter restarted with `args` (leading again) for the
    block; the default restored afterwards."""
    sandbox.stop_arbiter()
    sandbox.start_arbiter(args)
    wait_for("arbiter leads", lambda: metrics(sandbox)[("arbiter_leader", ())] == 1.0,
             timeout=60)
    try:
        yield
    finally:
        sandbox.stop_arbiter()
        sandbox.start_arbiter()
        wait_for("arbiter leads again",
                 lambda: metrics(sandbox)[("arbiter_leader", ())] == 1.0, timeout=60)


def debug_queues(sandbox: Sandbox, name: str = "arbiter") -> dict[str, Any]:
    status, body = arbiter_get(sandbox, "/debug/queues", name)
    assert status == 200, body[:200]
    document: dict[str, Any] = json.loads(body)
    return document


def metrics(sandbox: Sandbox, name: str = "arbiter") -> Samples:
    """Every sample of /metrics by (sample name, sorted labels)."""
    status, body = arbiter_get(sandbox, "/metrics", name)
    assert status == 200, body[:200]
    out = {}
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


# -- units and pods ----------------------------------------------------------------------


def units(sandbox: Sandbox, ns: str) -> list[dict[str, Any]]:
    """The QueueUnits of `ns`, each with its status as the API documents it:
    a unit created admitted (the fast path) has its admission in the
    `arbiter.dev/admitted-status` annotation until its status is written
    (when its Job ends, or a minute after)."""
    items: list[dict[str, Any]] = get(sandbox, "queueunits", "-n", ns)["items"]
    return [{**unit, "status": unit_status(unit)} for unit in items]


def released(sandbox: Sandbox, ns: str) -> list[str]:
    """Names of the pods in `ns` without arbiter's admission gate."""
    return sorted(p["metadata"]["name"] for p in get(sandbox, "pods", "-n", ns)["items"]
                  if not any(g.get("name") == ADMISSION_GATE
                             for g in p["spec"].get("schedulingGates") or []))


def admissions(unit: dict[str, Any]) -> list[dict[str, Any]]:
    return list(unit_status(unit).get("admissions") or [])


# -- scenarios: queues competing on a quiet cluster --------------------------------------


def reservation(name: str, ns: str, queue_name: str, count: int) -> dict[str, Any]:
    """A QueueUnit without a consumer: `count` CPUs held while it is admitted."""
    return {"apiVersion": "arbiter.dev/v1alpha1", "kind": "QueueUnit",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"queue": queue_name, "podSets": [
                {"name": "main", "count": count, "requests": {"cpu": "1"}}]}}


def hold_cluster(sandbox: Sandbox, ns: str, queue_name: str, cpus: int = CPUS) -> None:
    """Take `cpus` CPUs (all, by default) with a reservation (until `let_go`)."""
    create(sandbox, reservation("hold", ns, queue_name, cpus))
    wait_for("the reservation admitted", lambda: (get(sandbox, "queueunit", "hold", "-n", ns)
                                                  .get("status") or {}).get("phase") == "Dequeued")


def let_go(sandbox: Sandbox, ns: str) -> None:
    sandbox.kubectl("delete", "queueunit", "hold", "-n", ns)



@contextmanager
def scenario(sandbox: Sandbox, queues: dict[str, dict[str, Any]],
             namespaces: list[str]) -> Iterator[None]:
    """Queues and namespaces for one test, on a quiet cluster; removed after."""
    wait_for("a quiet cluster (all 10 CPUs free)", lambda: _quiet(sandbox), timeout=120)
    create(sandbox, *(queue(name, **spec) for name, spec in queues.items()),
           *(namespace(ns) for ns in namespaces))
    time.sleep(1.0)  # the webhook resolves queues from its cache
    try:
        yield
    finally:
        for ns in namespaces:
            sandbox.kubectl("delete", "namespace", ns, "--wait=false", check=False)
        for ns in namespaces:
            wait_for(f"namespace {ns} gone", _gone(sandbox, "namespace", ns), timeout=120)
        for name in queues:
            # Denied while the cache still sees admitted units: retry.
            wait_for(f"queue {name} deleted", _deleted(sandbox, "queue", name), timeout=60)


def _gone(sandbox: Sandbox, kind: str, name: str) -> Callable[[], bool]:
    return lambda: sandbox.kubectl("get", kind, name, check=False).returncode != 0


def _deleted(sandbox: Sandbox, kind: str, name: str) -> Callable[[], bool]:
    return lambda: sandbox.kubectl("delete", kind, name, "--ignore-not-found",
                                   check=False).returncode == 0


def _quiet(sandbox: Sandbox) -> bool:
    document = debug_queues(sandbox)
    cpu = f"{CPUS}"
    return bool(document["capacity"].get("cpu") == cpu and document["free"].get("cpu") == cpu)
