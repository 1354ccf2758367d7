"""Pure helpers of `arbiter.sandbox`: configuration documents, stage edits, cache keys."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from arbiter.sandbox import build, components, config, pki, process

POD_COMPLETE = """\
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: pod-complete
spec:
  resourceRef: {apiGroup: v1, kind: Pod}
  delay:
    durationMilliseconds: 1000
    durationFrom:
      expressionFrom: '.metadata.annotations["pod-complete.stage.kwok.x-k8s.io/delay"]'
    jitterDurationMilliseconds: 5000
  next:
    statusTemplate: |
      phase: Succeeded
      {{ $now := Now }}
"""


def test_scheduler_config_with_extender() -> None:
    document = config.scheduler_config("https://127.0.0.1:8443/scheduler", "/tmp/ca.crt",
                                       client_cert=("/tmp/s.crt", "/tmp/s.key"))
    assert document["kind"] == "KubeSchedulerConfiguration"
    assert document["leaderElection"] == {"leaderElect": False}
    (extender,) = document["extenders"]
    assert extender == {
        "urlPrefix": "https://127.0.0.1:8443/scheduler",
        "filterVerb": "filter",
        "prioritizeVerb": "prioritize",
        "preemptVerb": "preempt",
        "weight": 2,
        "nodeCacheCapable": True,
        "enableHTTPS": True,
        "httpTimeout": "2s",
        "ignorable": True,
        "tlsConfig": {"caFile": "/tmp/ca.crt", "certFile": "/tmp/s.crt",
                      "keyFile": "/tmp/s.key"},
    }
    # Extenders are top level, never inside a profile.
    assert all("extenders" not in profile for profile in document["profiles"])


def test_scheduler_config_without_extender() -> None:
    assert "extenders" not in config.scheduler_config(None, None)


def test_fake_nodes() -> None:
    node = config.fake_node(300, "1", "8Gi", 2)
    assert node["metadata"]["name"] == "kwok-node-300"
    assert node["metadata"]["annotations"][config.KWOK_NODE_ANNOTATION] == "fake"
    assert node["metadata"]["labels"]["type"] == "kwok"
    assert node["status"]["allocatable"] == {
        "cpu": "1",
        "memory": "8Gi",
        "pods": "110",
        "nvidia.com/gpu": "2",
    }
    assert node["status"]["capacity"] == node["status"]["allocatable"]
    assert "nvidia.com/gpu" not in config.fake_node(0, "1", "8Gi", 0)["status"]["allocatable"]
    cidrs = {config.fake_node(i, "1", "1Gi", 0)["spec"]["podCIDR"] for i in range(600)}
    assert len(cidrs) == 600
    assert not any(c.startswith("10.96.") for c in cidrs)


def test_pod_complete_stage_loses_default_jitter_only() -> None:
    edited = yaml.safe_load(build.stage_document(POD_COMPLETE, "pod-complete.yaml"))
    original = yaml.safe_load(POD_COMPLETE)
    del original["spec"]["delay"]["jitterDurationMilliseconds"]
    assert edited == original
    assert build.stage_document(POD_COMPLETE, "pod-ready.yaml") == POD_COMPLETE


def test_the_node_heartbeat_is_slowed_to_a_kubelets_pace_and_the_rest_kept(
        tmp_path: Path) -> None:
    stages = tmp_path / "toolchain"
    stages.mkdir()
    heartbeat: dict[str, Any] = {"apiVersion": "kwok.x-k8s.io/v1alpha1", "kind": "Stage",
        "metadata": {"name": "node-heartbeat"},
        "spec": {"delay": {"durationMilliseconds": 20000, "jitterDurationMilliseconds": 25000},
                 "next": {"statusTemplate": "conditions:\n- type: Ready\n"}}}
    (stages / "node-heartbeat.yaml").write_text(yaml.safe_dump(heartbeat))
    (stages / "pod-ready.yaml").write_text("kind: Stage\n")
    files = sorted(stages.glob("*.yaml"))
    out = components.sandbox_stages(files, tmp_path / "sandbox")
    assert out[1] == files[1]  # pod-ready: the toolchain's own file
    assert out[0] == tmp_path / "sandbox" / "node-heartbeat.yaml"
    written = yaml.safe_load(out[0].read_text())
    assert written["spec"]["delay"] == {"durationMilliseconds": 300_000,
                                        "jitterDurationMilliseconds": 330_000}
    assert written["spec"]["next"] == heartbeat["spec"]["next"]
    assert yaml.safe_load(files[0].read_text()) == heartbeat  # the cache is not touched


def test_cache_key_tracks_module_contents(tmp_path: Path) -> None:
    for module, require in (
        ("k8s", "k8s.io/kubernetes v1.36.3"),
        ("etcd", "go.etcd.io/etcd/server/v3 v3.6.8"),
        ("kwok", "sigs.k8s.io/kwok v0.8.0"),
    ):
        (tmp_path / module).mkdir()
        (tmp_path / module / "go.mod").write_text(f"module x\n\nrequire {require}\n")
        (tmp_path / module / "go.sum").write_text("")
    versions = build.pinned_versions(tmp_path)
    assert versions == build.Versions("v1.36.3", "v3.6.8", "v0.8.0")
    key = build.cache_key(versions, tmp_path, "go1.26")
    assert key.startswith("k8s-v1.36.3_etcd-v3.6.8_kwok-v0.8.0_")
    assert build.cache_key(versions, tmp_path, "go1.26") == key
    assert build.cache_key(versions, tmp_path, "go1.27") != key
    (tmp_path / "k8s" / "main.go").write_text("package main\n")
    assert build.cache_key(versions, tmp_path, "go1.26") != key


def test_cache_root_honours_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(build.CACHE_ENV, str(tmp_path / "cache"))
    assert build.cache_root() == tmp_path / "cache"


def test_pki_identities(tmp_path: Path) -> None:
    keys = pki.create_pki(tmp_path)
    assert keys.complete()
    admin = x509.load_pem_x509_certificate(keys.client_cert("admin").read_bytes())
    orgs = [a.value for a in admin.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)]
    assert orgs == ["system:masters"]
    usages = admin.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert ExtendedKeyUsageOID.CLIENT_AUTH in usages
    serving = x509.load_pem_x509_certificate(keys.apiserver_cert.read_bytes())
    sans = serving.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "kubernetes.default.svc" in sans.get_values_for_type(x509.DNSName)
    assert oct(keys.ca_key.stat().st_mode & 0o777) == "0o600"


def test_free_ports_are_distinct() -> None:
    ports = process.free_ports(20)
    assert len(set(ports)) == 20


def test_free_ports_avoid_the_ephemeral_range() -> None:
    """Outgoing connections take ephemeral ports: a listener picked from
    there can lose its port before it binds it."""
    low, high = process.listen_port_range()
    ephemeral_low, _ = process._ephemeral_range()
    if ephemeral_low >= low + 1000:  # the usual layout (32768-60999 here)
        assert high <= ephemeral_low
    ports = process.free_ports(30)
    assert all(low <= port < high for port in ports), ports


def test_spawned_process_is_stopped_by_pid(tmp_path: Path) -> None:
    record = process.spawn(
        "sleeper",
        [sys.executable, "-c", "import time; print('up', flush=True); time.sleep(60)"],
        tmp_path / "sleeper.log",
        cwd=tmp_path,
    )
    assert process.is_running(record)
    assert os.getpgid(record.pid) == record.pid  # own session: Ctrl-C does not reach it
    process.stop(record, timeout=5)
    assert not process.is_running(record)
    assert process.exit_code(record.pid) == -15
    # A record whose start time does not match (a recycled pid) is never signalled.
    impostor = process.ProcessRecord("x", os.getpid(), -2, [], "")
    assert not process.is_running(impostor)
    assert not process.signal_process(impostor, 0)


def test_dead_child_is_not_running(tmp_path: Path) -> None:
    record = process.spawn("quick", ["true"], tmp_path / "quick.log", cwd=tmp_path)
    deadline = time.monotonic() + 5
    while process.is_running(record) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not process.is_running(record)
    assert process.exit_code(record.pid) == 0
    assert "starting: true" in (tmp_path / "quick.log").read_text()


def test_a_process_whose_recording_fails_is_stopped_and_none_starts_once_closed(
        tmp_path: Path) -> None:
    """A chaos run restarts replicas from threads; one whose record could
    not be written (state.json raced, the directory torn down) ran on
    unknown to anyone, and so unstopped."""
    started: list[process.ProcessRecord] = []

    def fail(record: process.ProcessRecord) -> None:
        started.append(record)
        raise OSError("state.json: no such file or directory")

    spawner = process.Spawner()
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    with pytest.raises(OSError):
        spawner.start(fail, "sleeper", sleeper, tmp_path / "sleeper.log", cwd=tmp_path)
    assert len(started) == 1 and not process.remains(started[0])
    spawner.close()
    with pytest.raises(process.SpawnRefused):
        spawner.start(started.append, "late", sleeper, tmp_path / "late.log", cwd=tmp_path)
    assert len(started) == 1  # nothing spawned
    spawner.reopen()
    record = spawner.start(started.append, "again", ["true"], tmp_path / "again.log",
                           cwd=tmp_path)
    assert started[-1] is record
