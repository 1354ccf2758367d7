"""manifests/rbac.yaml: exactly the privileges arbiter uses, tied to the code.

The expected table below is the review point: widening the RBAC means
changing it here, next to the reason. tests/e2e/test_manifests.py proves on
a real apiserver that these rules are enough to run.
"""

from __future__ import annotations

from typing import Any

from arbiter.cache.convert import job_from_api, pod_from_api
from arbiter.cache.watch import RESOURCES
from arbiter.core.api import ADMISSION_GATE, QUEUE_LABEL
from arbiter.jobflow.patch import build_job
from arbiter.loop.units import job_unit, pod_unit
from arbiter.server.config import ServeConfig
from tests.deploy.manifests import MANIFESTS, documents, env, one
from webhook.configuration import CONFIGURATION_NAME

Grant = tuple[str, str, str, str]  # (apiGroup, resource, verb, resourceName or "")

CLUSTER: set[Grant] = {
    ("", "namespaces", "list", ""), ("", "namespaces", "watch", ""),
    # --managed-namespaces listed: the managed label on admitted namespaces.
    ("", "namespaces", "patch", ""),
    ("", "nodes", "list", ""), ("", "nodes", "watch", ""),
    ("", "pods", "get", ""), ("", "pods", "list", ""), ("", "pods", "watch", ""),
    ("", "pods", "patch", ""), ("", "pods", "delete", ""),
    ("", "pods/eviction", "create", ""), ("", "pods/status", "patch", ""),
    ("", "pods/finalizers", "update", ""), ("batch", "jobs/finalizers", "update", ""),
    # A held Job's lingering startTime (arbiter.loop.actions._unlock_template).
    ("batch", "jobs/status", "patch", ""),
    ("", "events", "create", ""),
    *{("batch", "jobs", verb, "") for verb in
      ("get", "list", "watch", "create", "patch", "delete")},
    # Workload integrations: the cache, suspend and placement, unit owners.
    *{(group, plural, verb, "") for group, plural in (
        ("jobset.x-k8s.io", "jobsets"), ("leaderworkerset.x-k8s.io", "leaderworkersets"),
        ("apps", "statefulsets"), ("trainer.kubeflow.org", "trainjobs"))
      for verb in ("get", "list", "watch", "patch")},
    *{(group, f"{plural}/finalizers", "update", "") for group, plural in (
        ("jobset.x-k8s.io", "jobsets"), ("leaderworkerset.x-k8s.io", "leaderworkersets"),
        ("apps", "statefulsets"), ("trainer.kubeflow.org", "trainjobs"))},
    ("apps", "deployments", "list", ""), ("apps", "deployments", "watch", ""),
    *{("ray.io", plural, verb, "") for plural in ("rayclusters", "rayjobs")
      for verb in ("get", "list", "watch", "patch")},
    *{("ray.io", f"{plural}/finalizers", "update", "") for plural in ("rayclusters", "rayjobs")},
    # --debug-api token: who holds the bearer token, and may they get Queues.
    ("authentication.k8s.io", "tokenreviews", "create", ""),
    ("authorization.k8s.io", "subjectaccessreviews", "create", ""),
    ("scheduling.k8s.io", "priorityclasses", "list", ""),
    ("scheduling.k8s.io", "priorityclasses", "watch", ""),
    ("node.k8s.io", "runtimeclasses", "list", ""),
    ("node.k8s.io", "runtimeclasses", "watch", ""),
    ("arbiter.dev", "queues", "get", ""), ("arbiter.dev", "queues", "list", ""),
    ("arbiter.dev", "queues", "watch", ""), ("arbiter.dev", "queues/status", "patch", ""),
    *{("arbiter.dev", "queueunits", verb, "") for verb in
      ("get", "list", "watch", "create", "patch")},
    ("arbiter.dev", "queueunits/status", "patch", ""),
    ("arbiter.dev", "pools", "list", ""), ("arbiter.dev", "pools", "watch", ""),
    ("arbiter.dev", "pools/status", "patch", ""),
    ("arbiter.dev", "admissionchecks", "list", ""),
    ("arbiter.dev", "admissionchecks", "watch", ""),
    ("arbiter.dev", "jobflows", "list", ""), ("arbiter.dev", "jobflows", "watch", ""),
    ("arbiter.dev", "jobtemplates", "list", ""), ("arbiter.dev", "jobtemplates", "watch", ""),
    ("arbiter.dev", "jobflows/status", "patch", ""),
    ("arbiter.dev", "jobflows/finalizers", "update", ""),
    *{("admissionregistration.k8s.io", kind, verb, "kube-arbiter")
      for kind in ("mutatingwebhookconfigurations", "validatingwebhookconfigurations")
      for verb in ("get", "update")},
}
NAMESPACE: set[Grant] = {
    ("coordination.k8s.io", "leases", "get", "kube-arbiter"),
    ("coordination.k8s.io", "leases", "update", "kube-arbiter"),
    ("coordination.k8s.io", "leases", "create", ""),
    ("", "secrets", "get", "kube-arbiter-certs"),
    ("", "secrets", "update", "kube-arbiter-certs"),
    ("", "secrets", "create", ""),
}


def _grants(role: dict[str, Any]) -> set[Grant]:
    grants: set[Grant] = set()
    for rule in role["rules"]:
        names = rule.get("resourceNames") or [""]
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    for name in names:
                        grants.add((group, resource, verb, name))
    return grants


def test_cluster_role_is_exactly_what_arbiter_uses() -> None:
    assert _grants(one("ClusterRole")) == CLUSTER


def test_namespaced_role_is_exactly_what_arbiter_uses() -> None:
    role = one("Role")
    assert role["metadata"]["namespace"] == "arbiter-system"
    assert _grants(role) == NAMESPACE


def test_no_wildcards_secrets_or_privilege_escalation_cluster_wide() -> None:
    for kind in ("ClusterRole", "Role"):
        for group, resource, verb, _ in _grants(one(kind)):
            assert "*" not in (group, resource, verb)
            assert verb not in ("escalate", "bind", "impersonate", "deletecollection")
    cluster_resources = {resource for _, resource, _, _ in CLUSTER}
    assert not cluster_resources & {"secrets", "serviceaccounts", "roles", "clusterroles",
                                    "rolebindings", "clusterrolebindings", "nodes/status"}
    # No pod is created, no node written (a pod is deleted only past a
    # PodDisruptionBudget that blocked reclaim too long: arbiter/loop/evict.py).
    assert not {(r, v) for _, r, v, _ in CLUSTER} & {
        ("pods", "create"), ("nodes", "patch"), ("nodes", "update")}


def test_every_watched_kind_can_be_listed_and_watched() -> None:
    grants = _grants(one("ClusterRole"))
    for resource in RESOURCES:
        parts = resource.path.strip("/").split("/")
        group = "" if parts[0] == "api" else parts[1]
        plural = parts[-1]
        for verb in ("list", "watch"):
            assert (group, plural, verb, "") in grants, (resource.kind, verb)


def test_names_in_the_rules_are_the_names_arbiter_uses() -> None:
    config = ServeConfig()
    names = {(r, n) for _, r, _, n in NAMESPACE | CLUSTER if n}
    assert ("leases", config.lease_name) in names
    assert ("secrets", env(one("Deployment"))["ARBITER_CERT_SECRET"]) in names
    assert ("validatingwebhookconfigurations", CONFIGURATION_NAME) in names
    webhooks = [o for o in documents(MANIFESTS / "webhooks.yaml")]
    assert {o["metadata"]["name"] for o in webhooks} == {CONFIGURATION_NAME}


def test_bindings_give_the_roles_to_the_deployment_service_account() -> None:
    account = one("ServiceAccount")
    subject = {"kind": "ServiceAccount", "name": account["metadata"]["name"],
               "namespace": account["metadata"]["namespace"]}
    for binding, role in (("ClusterRoleBinding", "ClusterRole"), ("RoleBinding", "Role")):
        found = one(binding)
        assert found["subjects"] == [subject]
        assert found["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": role,
                                    "name": one(role)["metadata"]["name"]}
    deployment = one("Deployment")
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == \
        account["metadata"]["name"]


def test_every_block_owner_deletion_owner_s_finalizers_may_be_updated() -> None:
    """OwnerReferencesPermissionEnforcement: setting blockOwnerDeletion on a
    reference needs `update` on the owner's finalizers subresource."""
    meta = {"namespace": "team-a", "uid": "u1", "labels": {QUEUE_LABEL: "a"}}
    containers = [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]
    managed_job = {"metadata": {**meta, "name": "train"}, "spec": {
        "suspend": True, "template": {"spec": {"containers": containers}}}}
    managed_pod = {"metadata": {**meta, "name": "web"}, "spec": {
        "containers": containers, "schedulingGates": [{"name": ADMISSION_GATE}]}}
    units = (job_unit(job_from_api(managed_job), {}), pod_unit(pod_from_api(managed_pod)))
    owners: set[tuple[str, str]] = set()
    for unit in units:
        assert unit is not None
        owners |= {(o.api_version, o.kind) for o in unit.owners if o.block_owner_deletion}
    step_job = build_job(flow="f", flow_uid="u2", namespace="team-a", step="s", attempt=0,
                         name="f-s", template_spec={}, patch=None, queue=None)
    owners |= {(ref["apiVersion"], ref["kind"]) for ref in step_job["metadata"]["ownerReferences"]
               if ref.get("blockOwnerDeletion")}
    assert owners == {("batch/v1", "Job"), ("v1", "Pod"), ("arbiter.dev/v1alpha1", "JobFlow")}
    grants = _grants(one("ClusterRole"))
    for api_version, kind in owners:
        group = api_version.rpartition("/")[0]
        assert (group, f"{kind.lower()}s/finalizers", "update", "") in grants, kind
