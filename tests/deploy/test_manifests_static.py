"""The kustomize base, read as YAML: complete, consistent with the code, hardened.

tests/e2e/test_manifests.py applies the same base to the real apiserver;
these checks need no cluster.
"""

from __future__ import annotations

import argparse
import json
import re
from typing import Any

import pytest

from arbiter.base import metrics
from arbiter.cli import serve as serve_cli
from arbiter.server.config import ServeConfig
from arbiter.server.context import serving_names
from tests.deploy.dockerfile import stages
from tests.deploy.manifests import (
    MANIFESTS,
    ROOT,
    base_objects,
    container,
    documents,
    env,
    kustomization,
    one,
)
from webhook.configuration import desired_configurations, service_account_username


def _serve_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    subparsers = parser.add_subparsers()
    serve_cli.add_parser(subparsers)
    serve: argparse.ArgumentParser = subparsers.choices["serve"]
    return serve


def _labels_match(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(key) == value for key, value in selector.items())


def test_every_crd_file_is_in_the_kustomization() -> None:
    resources = kustomization()["resources"]
    crd_files = sorted(f"crds/{p.name}" for p in (MANIFESTS / "crds").glob("*.yaml"))
    assert crd_files, "no CRDs"
    assert sorted(r for r in resources if r.startswith("crds/")) == crd_files
    for resource in resources:
        assert (MANIFESTS / resource).is_file(), resource
    crds = [o for o in base_objects() if o["kind"] == "CustomResourceDefinition"]
    assert {c["spec"]["names"]["plural"] for c in crds} == {
        "queues", "queueunits", "jobflows", "jobtemplates", "pools", "admissionchecks"}


def test_base_holds_cluster_objects_only() -> None:
    resources = kustomization()["resources"]
    # A KubeSchedulerConfiguration is a file for kube-scheduler, not an API
    # object; the ServiceMonitor needs the Prometheus Operator's CRDs.
    assert not [r for r in resources if r.startswith(("scheduler", "monitoring"))]
    kinds = [o["kind"] for o in base_objects()]
    assert sorted(set(kinds)) == sorted([
        "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition", "Deployment",
        "FlowSchema", "MutatingWebhookConfiguration", "Namespace", "PodDisruptionBudget", "Role",
        "RoleBinding", "Service", "ServiceAccount", "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding", "ValidatingWebhookConfiguration"])
    namespaced = [o for o in base_objects() if o["kind"] in (
        "Deployment", "Service", "ServiceAccount", "Role", "RoleBinding",
        "PodDisruptionBudget")]
    assert {o["metadata"]["namespace"] for o in namespaced} == {"arbiter-system"}
    assert one("Namespace")["metadata"]["name"] == "arbiter-system"


def test_flow_schemas_put_arbiters_lease_and_writes_ahead_of_tenants() -> None:
    """Arbiter's ServiceAccount, and only it, is matched: its Lease requests
    at `leader-election` (a renewal queued behind tenants ends leadership),
    the rest at `workload-high`, both before the catch-all `service-accounts`
    (9000) that would put it at `workload-low`."""
    deployment = one("Deployment")
    account = deployment["spec"]["template"]["spec"]["serviceAccountName"]
    namespace = deployment["metadata"]["namespace"]
    schemas = {o["metadata"]["name"]: o["spec"] for o in base_objects()
               if o["kind"] == "FlowSchema"}
    assert set(schemas) == {"kube-arbiter-leader-election", "kube-arbiter"}
    for spec in schemas.values():
        assert [s for rule in spec["rules"] for s in rule["subjects"]] == [
            {"kind": "ServiceAccount",
             "serviceAccount": {"name": account, "namespace": namespace}}]
        assert spec["matchingPrecedence"] < 900
    lease, rest = schemas["kube-arbiter-leader-election"], schemas["kube-arbiter"]
    assert lease["priorityLevelConfiguration"]["name"] == "leader-election"
    assert rest["priorityLevelConfiguration"]["name"] == "workload-high"
    # The Lease schema is matched first, and only for the Lease's namespace.
    assert lease["matchingPrecedence"] < rest["matchingPrecedence"]
    [rule] = lease["rules"][0]["resourceRules"]
    assert rule["resources"] == ["leases"] and rule["namespaces"] == [namespace]
    assert set(rule["verbs"]) >= {"get", "update", "create"}
    assert ServeConfig().namespace == namespace  # where the Lease lives


def test_deployment_is_highly_available_and_hardened() -> None:
    deployment = one("Deployment")
    spec = deployment["spec"]
    pod = spec["template"]["spec"]
    main = container(deployment)
    assert spec["replicas"] == 2
    assert spec["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    assert _labels_match(spec["selector"]["matchLabels"], spec["template"]["metadata"]["labels"])
    assert pod["serviceAccountName"] == one("ServiceAccount")["metadata"]["name"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    security = main["securityContext"]
    assert security["allowPrivilegeEscalation"] is False
    assert security["readOnlyRootFilesystem"] is True
    assert security["capabilities"] == {"drop": ["ALL"]}
    # Same non-root uid as the image.
    _, (_, final) = stages()
    assert final.last("USER").value == f"{pod['securityContext']['runAsUser']}:" \
        f"{pod['securityContext']['runAsGroup']}"
    resources = main["resources"]
    assert set(resources["requests"]) == {"cpu", "memory"}
    assert set(resources["limits"]) >= {"memory"}
    # Health: readiness is the cache sync, liveness the event loop.
    assert main["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert main["livenessProbe"]["httpGet"]["path"] == "/healthz"
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        assert main[probe]["httpGet"]["scheme"] == "HTTPS"
        assert main[probe]["httpGet"]["port"] == "https"
    # The grace period covers preStop + the server's 20 s drain.
    assert pod["terminationGracePeriodSeconds"] >= 5 + 20


def test_deployment_configuration_matches_the_server_and_the_image() -> None:
    deployment = one("Deployment")
    main = container(deployment)
    variables = env(deployment)
    flags = {a.option_strings[0] for a in _serve_parser()._actions if a.option_strings}
    for name in [e["name"] for e in main["env"]]:
        assert name.startswith("ARBITER_")
        flag = "--" + name.removeprefix("ARBITER_").lower().replace("_", "-")
        assert flag in flags, f"{name} configures no flag of `arbiter serve`"
    port = int(variables["ARBITER_PORT"])
    assert port == ServeConfig().port
    extender_port = int(variables["ARBITER_EXTENDER_PORT"])
    assert extender_port == ServeConfig().extender_port
    metrics_port = int(variables["ARBITER_METRICS_PORT"])
    assert metrics_port == ServeConfig().metrics_port
    assert main["ports"] == [
        {"name": "https", "containerPort": port, "protocol": "TCP"},
        {"name": "extender", "containerPort": extender_port, "protocol": "TCP"},
        {"name": "metrics", "containerPort": metrics_port, "protocol": "TCP"}]
    _, (_, final) = stages()
    assert final.last("EXPOSE").value == f"{port} {extender_port} {metrics_port}"
    # The certificate directory is a writable volume (the root is read-only).
    mounts = {m["mountPath"]: m["name"] for m in main["volumeMounts"]}
    assert variables["ARBITER_CERT_DIR"] in mounts
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    assert "emptyDir" in volumes[mounts[variables["ARBITER_CERT_DIR"]]]
    # The extender requires kube-scheduler's client certificate, signed by a
    # CA mounted from a Secret the installer creates (required: no silent
    # fallback to an open extender).
    client_ca = variables["ARBITER_EXTENDER_CLIENT_CA"]
    ca_dir = client_ca.rsplit("/", 1)[0]
    secret = volumes[mounts[ca_dir]]["secret"]
    assert secret["secretName"] == "kube-arbiter-extender-client-ca"
    assert not secret.get("optional", False)
    assert variables["ARBITER_CERT_SECRET"] == "kube-arbiter-certs"
    assert variables["ARBITER_SERVICE_NAME"] == one("Service")["metadata"]["name"]
    images = kustomization()["images"]
    assert [i["name"] for i in images] == [main["image"]]


def test_service_pdb_and_webhooks_point_at_the_pods() -> None:
    deployment = one("Deployment")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    service = one("Service")
    assert _labels_match(service["spec"]["selector"], pod_labels)
    assert service["spec"]["ports"] == [
        {"name": "https", "port": 443, "targetPort": "https", "protocol": "TCP"},
        {"name": "extender", "port": 9444, "targetPort": "extender", "protocol": "TCP"},
        {"name": "metrics", "port": 9445, "targetPort": "metrics", "protocol": "TCP"}]
    pdb = one("PodDisruptionBudget")
    assert _labels_match(pdb["spec"]["selector"]["matchLabels"], pod_labels)
    assert pdb["spec"]["minAvailable"] == 1
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        for hook in one(kind)["webhooks"]:
            target = hook["clientConfig"]["service"]
            assert (target["namespace"], target["name"], target["port"]) == (
                service["metadata"]["namespace"], service["metadata"]["name"], 443)


def test_webhooks_exclude_what_the_deployment_excludes() -> None:
    deployment = one("Deployment")
    variables = env(deployment)
    excluded = {*variables["ARBITER_EXCLUDED_NAMESPACES"].split(","), "arbiter-system"}
    # arbiter's own writes (as the Deployment's ServiceAccount) skip the
    # hooks that allow them anyway.
    account = service_account_username(deployment["metadata"]["namespace"],
                                       deployment["spec"]["template"]["spec"]["serviceAccountName"])
    mutating, validating = desired_configurations(
        service=("arbiter-system", "kube-arbiter"), excluded_namespaces=excluded,
        own_usernames=[account])
    assert one("MutatingWebhookConfiguration") == mutating
    assert one("ValidatingWebhookConfiguration") == validating


def test_servicemonitor_scrapes_the_service_and_verifies_its_certificate() -> None:
    monitoring = kustomization(MANIFESTS / "monitoring")
    [monitor] = documents(MANIFESTS / "monitoring" / monitoring["resources"][0])
    service = one("Service")
    assert monitor["kind"] == "ServiceMonitor"
    assert _labels_match(monitor["spec"]["selector"]["matchLabels"],
                         service["metadata"]["labels"])
    assert monitor["spec"]["namespaceSelector"]["matchNames"] == [
        service["metadata"]["namespace"]]
    [endpoint] = monitor["spec"]["endpoints"]
    assert endpoint["port"] == "metrics"
    assert "metrics" in {p["name"] for p in service["spec"]["ports"]}
    assert (endpoint["scheme"], endpoint["path"]) == ("https", "/metrics")
    tls = endpoint["tlsConfig"]
    assert tls["ca"]["secret"] == {"name": env(one("Deployment"))["ARBITER_CERT_SECRET"],
                                   "key": "ca.crt"}
    dns, _ = serving_names(ServeConfig())
    assert tls["serverName"] in dns
    [generator] = monitoring["configMapGenerator"]
    assert generator["options"]["labels"]["grafana_dashboard"] == "1"
    assert generator["files"] == ["kube-arbiter.json=grafana-dashboard.json"]


def _metric_names() -> set[str]:
    names = set()
    for collector in metrics.REGISTRY._collector_to_names:
        names.update(metrics.REGISTRY._collector_to_names[collector])
    return names


def _exprs(dashboard: dict[str, Any]) -> list[str]:
    return [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]


def test_dashboard_queries_only_metrics_arbiter_exports() -> None:
    dashboard = json.loads((MANIFESTS / "monitoring" / "grafana-dashboard.json").read_text())
    exported = _metric_names()
    used = {m for expr in _exprs(dashboard) for m in re.findall(r"\barbiter_[a-z_]+", expr)}
    assert used
    assert used <= exported, used - exported
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])


@pytest.mark.parametrize(("theme", "pattern"), [
    ("queue shares over time", r"arbiter_queue_dominant_share"),
    ("allocated vs deserved", r"arbiter_queue_deserved"),
    ("pending per queue", r"arbiter_queue_pending_units"),
    ("admission wait p50", r"histogram_quantile\(0\.5, .*arbiter_admission_wait_seconds_bucket"),
    ("admission wait p99", r"histogram_quantile\(0\.99, .*arbiter_admission_wait_seconds_bucket"),
    ("webhook latency", r"histogram_quantile\(0\.99, .*arbiter_webhook_duration_seconds_bucket"),
    ("extender latency", r"histogram_quantile\(0\.99, .*arbiter_extender_duration_seconds_bucket"),
])
def test_dashboard_shows(theme: str, pattern: str) -> None:
    dashboard = json.loads((MANIFESTS / "monitoring" / "grafana-dashboard.json").read_text())
    assert any(re.search(pattern, expr) for expr in _exprs(dashboard)), theme


def test_dockerfile_is_pinned_small_and_non_root() -> None:
    args, (build, final) = stages()
    image = args["PYTHON_IMAGE"]
    assert re.fullmatch(r"python:3\.11\.\d+-slim-bookworm", image), image
    assert build.image == final.image == image
    assert build.name == "build" and final.name is None
    assert final.last("USER").value == "65532:65532"
    assert final.last("ENTRYPOINT").exec_form() == ["arbiter", "serve"]
    assert not final.all("RUN")  # nothing installed into the final image
    # Every package the wheel is built from is copied into the build stage.
    copied = {source.rstrip("/") for sources, _, _ in build.copies() for source in sources}
    for package in ("arbiter", "webhook", "extender", "certs"):
        assert package in copied
    assert {"pyproject.toml", "README.md", "scripts/install-runtime.sh"} <= copied


def test_dockerignore_keeps_out_nothing_the_dockerfile_copies() -> None:
    ignored = [line.strip().rstrip("/") for line in
               (ROOT / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")]
    assert {".git", ".venv", ".sandbox", "tests"} <= set(ignored)
    _, (build, _) = stages()
    for sources, _, _ in build.copies():
        for source in sources:
            top = source.rstrip("/").split("/", 1)[0]
            assert top not in ignored, f"{source} is copied but .dockerignore drops it"
