"""The shipped webhook configurations and the ones `arbiter serve` installs agree."""

from __future__ import annotations

import base64
from pathlib import Path

import yaml

from arbiter.cache.store import DEFAULT_EXCLUDED_NAMESPACES
from arbiter.server.config import ServeConfig
from arbiter.server.context import excluded_namespaces
from certs.publish import with_ca_bundle
from webhook.configuration import (
    OWN_WRITES_SKIP,
    desired_configurations,
    service_account_username,
)
from webhook.endpoints import BY_PATH

MANIFEST = Path(__file__).resolve().parents[2] / "manifests" / "webhooks.yaml"


def test_manifest_equals_the_generated_configurations() -> None:
    shipped = list(yaml.safe_load_all(MANIFEST.read_text()))
    generated = desired_configurations(
        service=("arbiter-system", "kube-arbiter"),
        excluded_namespaces=DEFAULT_EXCLUDED_NAMESPACES,
        own_usernames=[service_account_username("arbiter-system", "kube-arbiter")])
    assert shipped == list(generated)
    # arbiter's own writes skip the hooks that allow them anyway, as with --webhook-url.
    skipping = {hook["name"] for config in shipped for hook in config["webhooks"]
                if any(c["name"] == "not-kube-arbiter" for c in hook.get("matchConditions", []))}
    assert skipping == set(OWN_WRITES_SKIP)


def test_every_webhook_is_safe_for_the_control_plane() -> None:
    mutating, validating = desired_configurations(
        url="https://127.0.0.1:9443", ca_bundle=b"CA",
        excluded_namespaces=excluded_namespaces(ServeConfig(namespace="arbiter-x")))
    for config in (mutating, validating):
        for hook in config["webhooks"]:
            assert hook["timeoutSeconds"] <= 3
            assert hook["sideEffects"] == "None"
            assert hook["admissionReviewVersions"] == ["v1"]
            assert hook["clientConfig"]["url"].startswith("https://127.0.0.1:9443/webhook/")
            assert hook["clientConfig"]["url"][len("https://127.0.0.1:9443"):] in BY_PATH
            assert base64.b64decode(hook["clientConfig"]["caBundle"]) == b"CA"
            if hook["rules"][0]["scope"] == "Namespaced":
                names = hook["namespaceSelector"]["matchExpressions"][0]
                assert names["key"] == "kubernetes.io/metadata.name"
                assert names["operator"] == "NotIn"
                assert {"kube-system", "kube-public", "kube-node-lease",
                        "arbiter-x"} <= set(names["values"])


def test_ca_bundle_sync_rewrites_every_webhook_once() -> None:
    mutating, _ = desired_configurations(url="https://h", ca_bundle=b"old",
                                         excluded_namespaces=())
    assert with_ca_bundle(mutating, b"new")
    assert {h["clientConfig"]["caBundle"] for h in mutating["webhooks"]} == {
        base64.b64encode(b"new").decode()}
    assert not with_ca_bundle(mutating, b"new")


def test_every_served_endpoint_is_registered_exactly_where_it_is_served() -> None:
    mutating, validating = desired_configurations(url="https://h", excluded_namespaces=())
    registered = {(hook["clientConfig"]["url"][len("https://h"):], config is mutating)
                  for config in (mutating, validating) for hook in config["webhooks"]}
    assert registered == {(path, endpoint.mutating) for path, endpoint in BY_PATH.items()}


def test_own_writes_skip_only_the_hooks_that_allow_them_anyway() -> None:
    mutating, validating = desired_configurations(
        url="https://127.0.0.1:9443", excluded_namespaces=DEFAULT_EXCLUDED_NAMESPACES,
        own_usernames={"kube-arbiter", "system:serviceaccount:x:kube-arbiter"})
    hooks = {hook["name"]: hook for config in (mutating, validating)
             for hook in config["webhooks"]}
    assert set(OWN_WRITES_SKIP) <= set(hooks)  # no stale names
    for name, hook in hooks.items():
        skips = [c for c in hook.get("matchConditions", []) if c["name"] == "not-kube-arbiter"]
        if name not in OWN_WRITES_SKIP:
            assert skips == [], name  # e.g. jobs.mutate: JobFlow steps are held too
            continue
        expression = skips[0]["expression"]
        assert ('!(request.userInfo.username in ["kube-arbiter", '
                '"system:serviceaccount:x:kube-arbiter"])') in expression
        assert expression.startswith("request.operation != 'UPDATE' || ") == (
            OWN_WRITES_SKIP[name] == "updates")
    # The Job hook keeps its own condition beside the new one.
    assert [c["name"] for c in hooks["jobs.validate.arbiter.dev"]["matchConditions"]] == [
        "not-kube-arbiter", "managed-by-arbiter"]
    plain = desired_configurations(url="https://127.0.0.1:9443",
                                   excluded_namespaces=DEFAULT_EXCLUDED_NAMESPACES)
    assert all(c["name"] != "not-kube-arbiter" for config in plain
               for hook in config["webhooks"] for c in hook.get("matchConditions", []))
