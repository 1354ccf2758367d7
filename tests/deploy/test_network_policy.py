"""manifests/network-policy/ (issue #25 row 8): each listener is reachable
from its one caller only: the webhooks from the control plane, the extender
from kube-scheduler, /metrics from the monitoring namespace."""

from __future__ import annotations

from tests.deploy.manifests import MANIFESTS, container, documents, kustomization, one

DIRECTORY = MANIFESTS / "network-policy"


def _policy() -> dict[str, object]:
    resources = kustomization(DIRECTORY)["resources"]
    [policy] = [doc for resource in resources for doc in documents(DIRECTORY / resource)]
    assert policy["kind"] == "NetworkPolicy"
    return policy


def test_the_policy_is_apart_from_the_base() -> None:
    # Its control-plane range is the cluster's own: a wrong one would close
    # the fail-closed webhooks, so it is never applied with the base.
    assert "network-policy" not in " ".join(kustomization()["resources"])
    assert "CONTROL_PLANE_CIDR" in (DIRECTORY / "networkpolicy.yaml").read_text()


def test_each_listener_is_open_to_its_caller_only() -> None:
    policy = _policy()
    deployment = one("Deployment")
    spec = policy["spec"]
    assert isinstance(spec, dict)
    assert policy["metadata"]["namespace"] == deployment["metadata"]["namespace"]  # type: ignore[index]
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert spec["podSelector"]["matchLabels"].items() <= pod_labels.items()
    assert spec["policyTypes"] == ["Ingress"]
    named_ports = {p["name"] for p in container(deployment)["ports"]}
    callers: dict[str, list[str]] = {}
    for rule in spec["ingress"]:
        for port in rule["ports"]:
            assert port["port"] in named_ports, port
            for peer in rule["from"]:
                if "ipBlock" in peer:
                    who = "control-plane"
                elif "podSelector" in peer:
                    who = "scheduler-pods"
                else:
                    who = "ns:" + peer["namespaceSelector"]["matchLabels"][
                        "kubernetes.io/metadata.name"]
                callers.setdefault(port["port"], []).append(who)
    assert callers == {"https": ["control-plane"],
                       "extender": ["control-plane", "scheduler-pods"],
                       "metrics": ["ns:monitoring"]}
    # Nothing is open to everyone (an empty `from` or peer).
    assert all(rule.get("from") for rule in spec["ingress"])
    scheduler = spec["ingress"][1]["from"][0]
    assert scheduler["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": "kube-system"}
