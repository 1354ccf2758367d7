"""The install manifests on the real apiserver, and arbiter under their RBAC.

`kubectl apply --server-side -k manifests/` is checked with a server-side
dry run and then for real. Then arbiter runs with a token of the manifests'
ServiceAccount (not as cluster admin) and must admit work end to end, while
requests outside its ClusterRole / Role are denied.

The session's primary arbiter is stopped for this module (its Lease and
webhook port are reused) and started again afterwards, which reinstalls its
webhook configurations: the base's webhooks.yaml points at a Service that
has no endpoint in the sandbox (there is no kubelet and no kube-proxy).
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from arbiter.core.fastpath import FAST_PATH_ANNOTATION
from arbiter.sandbox import Sandbox, process
from arbiter.sandbox.components import repo_root
from arbiter.sandbox.config import POD_COMPLETE_DELAY_ANNOTATION
from tests.e2e.helpers import (
    create,
    create_tenant,
    delete_tenants,
    get,
    job_complete,
    lease_holder,
    unique_name,
    wait_for,
)

MANIFESTS = repo_root() / "manifests"
NAMESPACE = "arbiter-system"
SERVICE_ACCOUNT = "kube-arbiter"
CERT_SECRET = "kube-arbiter-certs"
# Runs under the primary's name (and port): the sandbox then keeps no extra
# process record, and `start_arbiter()` afterwards restores the primary.
RBAC_ARBITER = "arbiter"
IDENTITY = "rbac-e2e"
POD_SELECTOR = "app.kubernetes.io/name=kube-arbiter,app.kubernetes.io/component=server"
WEBHOOK_KINDS = ("mutatingwebhookconfiguration", "validatingwebhookconfiguration")
# Objects of the base the sandbox does not need afterwards (the CRDs, the
# namespace and the webhook configurations stay: the session uses them).
REMOVED_AFTERWARDS = (
    ("deployment", "kube-arbiter", NAMESPACE),
    ("service", "kube-arbiter", NAMESPACE),
    ("poddisruptionbudget", "kube-arbiter", NAMESPACE),
    ("rolebinding", "kube-arbiter", NAMESPACE),
    ("role", "kube-arbiter", NAMESPACE),
    ("serviceaccount", "kube-arbiter", NAMESPACE),
    ("secret", CERT_SECRET, NAMESPACE),
    ("clusterrolebinding", "kube-arbiter", None),
    ("clusterrole", "kube-arbiter", None),
    ("flowschema", "kube-arbiter-leader-election", None),
    ("flowschema", "kube-arbiter", None),
    ("validatingadmissionpolicybinding", "arbiter-admission-check-approvers", None),
    ("validatingadmissionpolicy", "arbiter-admission-check-approvers", None),
)


def _base_objects(sandbox: Sandbox) -> list[dict[str, Any]]:
    rendered = sandbox.kubectl("kustomize", str(MANIFESTS)).stdout
    return [doc for doc in yaml.safe_load_all(rendered) if doc]


def _ids(objects: list[dict[str, Any]]) -> set[tuple[str, str]]:
    return {(obj["kind"], obj["metadata"]["name"]) for obj in objects}


@dataclass(frozen=True, slots=True)
class Applied:
    objects: list[dict[str, Any]]
    dry_run_output: str
    apply_output: str


def _pods_made(sandbox: Sandbox) -> int:
    """Pods the Deployment's ReplicaSet has made (0 while, say, Pod Security refuses them)."""
    status = get(sandbox, "deployment", "kube-arbiter", "-n", NAMESPACE).get("status") or {}
    return int(status.get("replicas") or 0)


@pytest.fixture(scope="module")
def applied(sandbox: Sandbox) -> Iterator[Applied]:
    """The base, applied for real; the sandbox put back afterwards."""
    objects = _base_objects(sandbox)
    primary = sandbox.processes().get("arbiter")
    primary_was_running = primary is not None and process.is_running(primary)
    if primary_was_running:
        sandbox.stop_arbiter("arbiter")
    try:
        # The session's arbiter installed URL-based configurations of the same
        # names; a server-side apply would merge our Service-based clientConfig
        # into them (both url and service: invalid). Start from none, as a
        # fresh cluster does.
        for kind in WEBHOOK_KINDS:
            sandbox.kubectl("delete", kind, "kube-arbiter", "--ignore-not-found")
        apply = ("apply", "--server-side", "--force-conflicts", "-k", str(MANIFESTS))
        dry = sandbox.kubectl(*apply, "--dry-run=server")
        real = sandbox.kubectl(*apply)
        # The sandbox runs the Deployment and ReplicaSet controllers: the
        # Deployment's pods are made for real (Pod Security "restricted"
        # must admit them), then scaled away, so that the fake nodes do not
        # keep capacity for arbiter pods that never serve.
        replicas = next(o for o in objects if o["kind"] == "Deployment")["spec"]["replicas"]
        wait_for(f"the Deployment's {replicas} pods created (Pod Security admits them)",
                 lambda: _pods_made(sandbox) == replicas, 60)
        sandbox.kubectl("scale", "deployment", "kube-arbiter", "-n", NAMESPACE,
                        "--replicas=0")
        wait_for("the Deployment's pods gone", lambda: not get(
            sandbox, "pods", "-n", NAMESPACE, "-l", POD_SELECTOR)["items"], 60)
        yield Applied(objects, dry.stdout, real.stdout)
    finally:
        for kind, name, namespace in REMOVED_AFTERWARDS:
            where = ["-n", namespace] if namespace else []
            sandbox.kubectl("delete", kind, name, *where, "--ignore-not-found",
                            "--wait=false", check=False)
        if primary_was_running:
            # Reinstalls the session's webhook configurations (URL, caBundle).
            sandbox.start_arbiter()


def test_dry_run_then_apply_accept_every_object(sandbox: Sandbox, applied: Applied) -> None:
    expected = _ids(applied.objects)
    # Namespace, 6 CRDs (Queue, QueueUnit, JobTemplate, JobFlow, Pool, AdmissionCheck),
    # ServiceAccount, ClusterRole(+Binding), Role(+Binding), Service,
    # Deployment, PDB, the two webhook configurations, the approvers'
    # ValidatingAdmissionPolicy (+Binding) and two FlowSchemas.
    assert len(expected) == 21
    assert {kind for kind, _ in expected} >= {
        "Namespace", "CustomResourceDefinition", "ServiceAccount", "ClusterRole",
        "ClusterRoleBinding", "Role", "RoleBinding", "Service", "Deployment",
        "PodDisruptionBudget", "MutatingWebhookConfiguration",
        "ValidatingWebhookConfiguration"}
    for output in (applied.dry_run_output, applied.apply_output):
        lines = [line for line in output.splitlines() if line.strip()]
        assert len(lines) == len(expected), output
    assert "serverside-applied (server dry run)" in applied.dry_run_output
    # Everything is stored as written.
    for obj in applied.objects:
        namespace = obj["metadata"].get("namespace")
        where = ["-n", namespace] if namespace else []
        stored = get(sandbox, obj["kind"].lower(), obj["metadata"]["name"], *where)
        assert stored["metadata"]["uid"]
    deployment = get(sandbox, "deployment", "kube-arbiter", "-n", NAMESPACE)
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    service = get(sandbox, "service", "kube-arbiter", "-n", NAMESPACE)
    assert service["spec"]["ports"][0]["port"] == 443
    # The namespace enforces Pod Security "restricted", and the Deployment's
    # pod template passes it: a server-side dry run of such a pod is admitted.
    template = deployment["spec"]["template"]
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "pss-check", "namespace": NAMESPACE,
                        "labels": template["metadata"]["labels"]},
           "spec": template["spec"]}
    checked = sandbox.kubectl("create", "--dry-run=server", "-f", "-", "-o", "name",
                              input=json.dumps(pod), check=False)
    assert checked.returncode == 0, checked.stderr
    assert "violate" not in checked.stderr  # no PodSecurity warning either


def _service_account_kubeconfig(sandbox: Sandbox, directory: Path) -> Path:
    token = sandbox.kubectl("create", "token", SERVICE_ACCOUNT, "-n", NAMESPACE,
                            "--duration=1h").stdout.strip()
    assert token.count(".") == 2  # a JWT
    document = {
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "sandbox", "cluster": {
            "server": sandbox.apiserver_url,
            "certificate-authority": str(sandbox.pki.ca_cert)}}],
        "users": [{"name": SERVICE_ACCOUNT, "user": {"token": token}}],
        "contexts": [{"name": SERVICE_ACCOUNT,
                      "context": {"cluster": "sandbox", "user": SERVICE_ACCOUNT}}],
        "current-context": SERVICE_ACCOUNT,
    }
    path = directory / "kube-arbiter-sa.conf"
    path.write_text(yaml.safe_dump(document))
    path.chmod(0o600)
    return path


@pytest.fixture(scope="module")
def sa_kubeconfig(sandbox: Sandbox, applied: Applied,
                  tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _service_account_kubeconfig(sandbox, tmp_path_factory.mktemp("sa"))


def _can_i(sandbox: Sandbox, kubeconfig: Path, *args: str) -> bool:
    # A later --kubeconfig overrides the sandbox's admin one.
    result = sandbox.kubectl("--kubeconfig", str(kubeconfig), "auth", "can-i", *args,
                             check=False)
    assert result.stdout.strip() in ("yes", "no"), result.stdout + result.stderr
    return result.stdout.strip() == "yes"


ALLOWED = [
    ("list", "pods", "--all-namespaces"),
    ("patch", "pods", "-n", "default"),
    ("create", "pods", "-n", "default", "--subresource=eviction"),
    ("patch", "pods", "-n", "default", "--subresource=status"),
    ("patch", "jobs.batch", "-n", "default"),
    ("create", "jobs.batch", "-n", "default"),
    ("watch", "nodes"),
    ("create", "events", "-n", "default"),
    ("create", "queueunits.arbiter.dev", "-n", "default"),
    ("patch", "queues.arbiter.dev", "--subresource=status"),
    ("patch", "queueunits.arbiter.dev", "-n", "default", "--subresource=status"),
    # Reclaim past a PodDisruptionBudget that blocked it too long (evict.py).
    ("delete", "pods", "-n", "default"),
    ("update", "leases.coordination.k8s.io/kube-arbiter", "-n", NAMESPACE),
    ("create", "leases.coordination.k8s.io", "-n", NAMESPACE),
    ("update", f"secrets/{CERT_SECRET}", "-n", NAMESPACE),
    ("update", "validatingwebhookconfigurations.admissionregistration.k8s.io/kube-arbiter"),
    ("update", "mutatingwebhookconfigurations.admissionregistration.k8s.io/kube-arbiter"),
]
DENIED = [
    ("delete", "nodes"),
    ("patch", "nodes"),
    ("create", "pods", "-n", "default"),
    ("get", "secrets", "-n", "kube-system"),
    ("list", "secrets", "-n", NAMESPACE),
    ("get", "secrets/other", "-n", NAMESPACE),
    ("update", "queues.arbiter.dev"),
    ("delete", "queueunits.arbiter.dev", "-n", "default"),
    ("update", "leases.coordination.k8s.io/other", "-n", NAMESPACE),
    ("create", "leases.coordination.k8s.io", "-n", "default"),
    ("update", "validatingwebhookconfigurations.admissionregistration.k8s.io/other"),
    ("create", "clusterrolebindings.rbac.authorization.k8s.io"),
    ("escalate", "clusterroles.rbac.authorization.k8s.io"),
    ("impersonate", "serviceaccounts", "-n", "default"),
    ("create", "serviceaccounts/token", "-n", NAMESPACE),
]


def test_service_account_gets_what_arbiter_needs_and_nothing_more(
        sandbox: Sandbox, sa_kubeconfig: Path) -> None:
    allowed = {" ".join(args): _can_i(sandbox, sa_kubeconfig, *args) for args in ALLOWED}
    assert all(allowed.values()), [k for k, v in allowed.items() if not v]
    denied = {" ".join(args): _can_i(sandbox, sa_kubeconfig, *args) for args in DENIED}
    assert not any(denied.values()), [k for k, v in denied.items() if v]
    # And a real request outside the RBAC is refused by the apiserver.
    request = sandbox.kubectl("--kubeconfig", str(sa_kubeconfig), "get", "secrets",
                              "-n", "kube-system", check=False)
    assert request.returncode != 0
    assert "forbidden" in request.stderr.lower()
    assert f"system:serviceaccount:{NAMESPACE}:{SERVICE_ACCOUNT}" in request.stderr


def _job(name: str, namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"parallelism": 2, "completions": 2, "backoffLimit": 0, "template": {
            "metadata": {"annotations": {POD_COMPLETE_DELAY_ANNOTATION: "2s"}},
            "spec": {"restartPolicy": "Never", "containers": [{
                "name": "main", "image": "example.invalid/work:1",
                "resources": {"requests": {"cpu": "250m", "memory": "128Mi"}}}]}}},
    }


def _pod(name: str, namespace: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace},
            "spec": {"containers": [{"name": "main", "image": "example.invalid/web:1",
                                     "resources": {"requests": {"cpu": "100m"}}}]}}


def _dispatched(sandbox: Sandbox) -> set[tuple[str, str]]:
    """(flow schema, priority level) pairs of kube-arbiter's FlowSchemas the
    apiserver has dispatched requests under (its APF metrics)."""
    text = sandbox.kubectl("get", "--raw", "/metrics").stdout
    out = set()
    for line in text.splitlines():
        if line.startswith("apiserver_flowcontrol_dispatched_requests_total{"):
            labels = dict(re.findall(r'(\w+)="([^"]*)"', line))
            if labels.get("flow_schema", "").startswith("kube-arbiter"):
                out.add((labels["flow_schema"], labels.get("priority_level", "")))
    return out


def test_arbiter_admits_work_under_the_service_account(
        sandbox: Sandbox, sa_kubeconfig: Path, tmp_path: Path) -> None:
    primary_port = sandbox.arbiter_port
    assert primary_port is not None
    # The session's CA (so the sandbox's health probe and kube-scheduler
    # trust this replica), copied: nothing this replica does touches the
    # session's files. Its serving certificate is issued anew, like a new
    # pod's, and everything is stored into the Secret the replicas share.
    cert_dir = tmp_path / "certs"
    cert_dir.mkdir()
    for name in ("ca.crt", "ca.key"):
        shutil.copy2(sandbox.arbiter_cert_dir / name, cert_dir / name)
    namespace, queue = unique_name("rbac"), unique_name("q")
    log = sandbox.logs_dir / f"{RBAC_ARBITER}.log"
    log_start = log.stat().st_size if log.exists() else 0
    pid = sandbox.start_arbiter(
        ["--kubeconfig", str(sa_kubeconfig), "--cert-dir", str(cert_dir),
         "--cert-secret", CERT_SECRET, "--identity", IDENTITY],
        name=RBAC_ARBITER)
    assert Path(sandbox.processes()[RBAC_ARBITER].log) == log
    stopped = False
    try:
        assert pid > 0
        # Leader election on the Lease (Role: get/update/create leases).
        wait_for("the Lease", lambda: lease_holder(sandbox).startswith(IDENTITY), 30)
        # API Priority and Fairness put its Lease requests at leader-election
        # and its other requests at workload-high (flowcontrol.yaml).
        wait_for("arbiter's requests in its flow schemas", lambda: _dispatched(sandbox) >= {
            ("kube-arbiter-leader-election", "leader-election"),
            ("kube-arbiter", "workload-high")}, 30)
        # The certificates went into the shared Secret (Role: create secrets).
        secret = get(sandbox, "secret", CERT_SECRET, "-n", NAMESPACE)
        assert set(secret["data"]) >= {"ca.crt", "tls.crt", "tls.key"}
        # The webhook configurations were replaced with URL-based ones
        # (ClusterRole: get/update on the two named kube-arbiter).
        hooks = get(sandbox, "validatingwebhookconfiguration", "kube-arbiter")
        assert hooks["webhooks"][0]["clientConfig"]["url"].startswith(
            f"https://127.0.0.1:{primary_port}/")

        create_tenant(sandbox, namespace, queue)

        # Admitted at creation (the default; the token's key read from the
        # certificate Secret): let through unsuspended, its unit created admitted.
        created = json.loads(sandbox.kubectl(
            "create", "-f", "-", "-o", "json", input=json.dumps(_job("train", namespace))).stdout)
        assert created["spec"]["suspend"] is False, created["spec"]
        assert FAST_PATH_ANNOTATION in created["metadata"]["annotations"]
        # Created suspended by its user: held; admitted, arbiter unsuspends it (patch jobs).
        held = _job("held", namespace)
        held["spec"]["suspend"] = True
        create(sandbox, held)
        create(sandbox, _pod("web", namespace))

        for name in ("train", "held"):
            wait_for(f"Job {name} to complete", lambda: job_complete(
                get(sandbox, "job", name, "-n", namespace)), 90)  # noqa: B023 (waited here)

        # Admitted: the pod's gate removed (patch pods) and the pod bound.
        def ungated_and_bound() -> bool:
            pod = get(sandbox, "pod", "web", "-n", namespace)
            return not pod["spec"].get("schedulingGates") and bool(pod["spec"].get("nodeName"))

        wait_for("the pod to be ungated and bound", ungated_and_bound, 60)
        # QueueUnits created and their status written (queueunits, /status).
        # (A unit created admitted has its status written when its Job ends.)
        units = wait_for("the units' status written", lambda: (lambda items: items if all(
            u.get("status", {}).get("phase") in ("Dequeued", "Running", "Succeed")
            for u in items) else None)(get(sandbox, "queueunits", "-n", namespace)["items"]),
            30)
        assert len(units) == 3
        # Queue status written (queues/status).
        wait_for("the Queue's status",
                  lambda: get(sandbox, "queue", queue).get("status", {}).get("admitted", 0)
                  >= 1 or bool(get(sandbox, "queue", queue).get("status", {}).get("allocated")),
                  30)
        # Events recorded in the tenant's namespace (events create).
        events = wait_for("an Admitted event", lambda: [
            e for e in get(sandbox, "events", "-n", namespace)["items"]
            if e.get("reason") == "Admitted"
            and e.get("source", {}).get("component") == "kube-arbiter"], 30)
        assert events

        # Graceful shutdown releases the Lease at once.
        code = sandbox.stop_arbiter(RBAC_ARBITER)
        stopped = True
        assert code == 0
        assert lease_holder(sandbox) == ""

        # Nothing arbiter tried was refused.
        text = log.read_text(errors="replace")[log_start:]
        assert "forbidden" not in text.lower(), [
            line for line in text.splitlines() if "forbidden" in line.lower()][:5]
        assert "HTTP 403" not in text
        assert "SelfSubjectReview failed" not in text
    finally:
        if not stopped:
            sandbox.stop_arbiter(RBAC_ARBITER)
        delete_tenants(sandbox, [namespace], [queue])


SERVICE_MONITOR_CRD = {
    # A stand-in for the Prometheus Operator's CRD (not installed in the
    # sandbox): enough for the apiserver to accept and store the kind.
    "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
    "metadata": {"name": "servicemonitors.monitoring.coreos.com"},
    "spec": {"group": "monitoring.coreos.com", "scope": "Namespaced",
             "names": {"kind": "ServiceMonitor", "plural": "servicemonitors",
                       "singular": "servicemonitor", "listKind": "ServiceMonitorList"},
             "versions": [{"name": "v1", "served": True, "storage": True,
                           "schema": {"openAPIV3Schema": {
                               "type": "object",
                               "x-kubernetes-preserve-unknown-fields": True}}}]},
}


def test_monitoring_kustomization_is_accepted(sandbox: Sandbox, applied: Applied) -> None:
    existed = sandbox.kubectl("get", "crd", "servicemonitors.monitoring.coreos.com",
                              check=False).returncode == 0
    if not existed:
        sandbox.apply_yaml(json.dumps(SERVICE_MONITOR_CRD))
        sandbox.kubectl("wait", "--for=condition=Established", "--timeout=60s",
                        "crd/servicemonitors.monitoring.coreos.com")
    try:
        result = sandbox.kubectl("apply", "--server-side", "--dry-run=server", "-k",
                                 str(MANIFESTS / "monitoring"))
        lines = sorted(line for line in result.stdout.splitlines() if line.strip())
        assert len(lines) == 2, result.stdout
        assert lines[0].startswith("configmap/kube-arbiter-dashboard")
        assert lines[1].startswith("servicemonitor.monitoring.coreos.com/kube-arbiter")
    finally:
        if not existed:
            sandbox.kubectl("delete", "crd", "servicemonitors.monitoring.coreos.com",
                            "--wait=false", check=False)
