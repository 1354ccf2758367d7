"""The KubeSchedulerConfiguration in manifests/ and the sandbox's are one stanza."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from arbiter.sandbox import config as sandbox_config

MANIFEST = Path(__file__).resolve().parents[2] / "manifests" / "scheduler" / (
    "kube-scheduler-config.yaml"
)
# The only fields allowed to differ: where arbiter is and which CA file.
LOCAL = ("urlPrefix", "tlsConfig")


def manifest_extender() -> dict[str, Any]:
    document = yaml.safe_load(MANIFEST.read_text())
    assert document["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    assert document["kind"] == "KubeSchedulerConfiguration"
    (extender,) = document["extenders"]
    assert isinstance(extender, dict)
    return extender


def test_manifest_stanza_speaks_the_extender_protocol() -> None:
    extender = manifest_extender()
    assert extender["urlPrefix"].startswith("https://")
    assert extender["urlPrefix"].endswith("/scheduler")
    assert (extender["filterVerb"], extender["prioritizeVerb"], extender["preemptVerb"]) == (
        "filter", "prioritize", "preempt")
    assert "bindVerb" not in extender
    assert extender["nodeCacheCapable"] is True
    assert extender["enableHTTPS"] is True
    assert extender["tlsConfig"]["caFile"]
    # kube-scheduler proves who it is: the extender requires a client certificate.
    assert extender["tlsConfig"]["certFile"] and extender["tlsConfig"]["keyFile"]
    assert isinstance(extender["ignorable"], bool)
    assert "managedResources" not in extender  # every pod is sent
    # A short timeout, as a Go duration.
    assert extender["httpTimeout"].endswith("s")
    assert 0 < float(extender["httpTimeout"][:-1]) <= 3


def test_sandbox_uses_the_same_stanza() -> None:
    document = sandbox_config.scheduler_config("https://127.0.0.1:1234/scheduler", "/x/ca.crt",
                                               client_cert=("/x/s.crt", "/x/s.key"))
    (sandbox,) = document["extenders"]
    manifest = manifest_extender()
    assert {k: v for k, v in sandbox.items() if k not in LOCAL} == {
        k: v for k, v in manifest.items() if k not in LOCAL
    }
    assert sandbox["tlsConfig"] == {"caFile": "/x/ca.crt", "certFile": "/x/s.crt",
                                    "keyFile": "/x/s.key"}
    assert set(sandbox["tlsConfig"]) <= set(manifest["tlsConfig"])
    assert "extenders" not in document["profiles"][0]
