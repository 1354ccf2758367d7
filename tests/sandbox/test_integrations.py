"""The integration controllers' pure parts: which are known, what each runs
with, how upstream's webhook manifests become local ones, how builds are keyed."""

from __future__ import annotations

import argparse
import base64
import re
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509

from arbiter.integrations import parse_names
from arbiter.sandbox import Sandbox, cli, components, controllers, integrations, pki, process
from arbiter.sandbox.build import BuildError
from arbiter.sandbox.cluster import STATE_VERSION
from arbiter.sandbox.probe import SandboxError, wait_until

# As controller-gen writes them, before kustomize.
UPSTREAM: list[dict[str, Any]] = [
    {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
     "metadata": {"name": "mutating-webhook-configuration"},
     "webhooks": [
         {"name": "mjobset.kb.io", "failurePolicy": "Fail", "clientConfig": {"service": {
             "name": "webhook-service", "namespace": "system",
             "path": "/mutate-jobset-x-k8s-io-v1alpha2-jobset"}}},
         {"name": "mpod.kb.io", "clientConfig": {"service": {
             "name": "webhook-service", "namespace": "system", "path": "/mutate--v1-pod"}}},
     ]},
]
SELECTOR = {"matchExpressions": [{"key": "jobset.sigs.k8s.io/jobset-name",
                                  "operator": "Exists"}]}


def test_parse_names() -> None:
    assert integrations.parse("jobset,lws") == ("jobset", "lws")
    assert integrations.parse(" lws , jobset,lws") == ("lws", "jobset")
    assert integrations.parse("all") == tuple(integrations.INTEGRATIONS)
    assert integrations.parse("none") == integrations.parse("") == ()
    with pytest.raises(ValueError, match=r"unknown integration.*volcano"):
        integrations.parse("jobset,volcano")


def test_trainer_brings_jobset_along() -> None:
    # Trainer runs its trainers as JobSets: JobSet's controller starts first.
    assert integrations.with_requirements(["trainer"]) == ("jobset", "trainer")
    assert integrations.with_requirements(["ray", "jobset", "trainer"]) == (
        "ray", "jobset", "trainer")
    assert integrations.with_requirements([]) == ()


def test_configuration_keeps_everything_on_loopback(tmp_path: Path) -> None:
    for name in ("jobset", "lws", "trainer"):
        document = integrations.configuration(integrations.INTEGRATIONS[name], health_port=1001,
                                              webhook_port=1002, cert_dir=tmp_path)
        assert document["apiVersion"].startswith("config.")
        assert document["health"] == {"healthProbeBindAddress": "127.0.0.1:1001"}
        assert document["metrics"] == {"bindAddress": "0"}
        assert document["leaderElection"] == {"leaderElect": False}
        if name == "trainer":
            # Strictly decoded by Trainer: only its own fields.
            assert document["webhook"] == {"host": "127.0.0.1", "port": 1002}
            assert document["certManagement"] == {"enable": False}
            assert "internalCertManagement" not in document
        else:
            assert document["webhook"] == {"host": "127.0.0.1", "port": 1002,
                                           "certDir": str(tmp_path)}
            assert document["internalCertManagement"] == {"enable": False}
    assert integrations.flags(health_port=1001) == [
        "--metrics-addr=0", "--health-probe-bind-address=127.0.0.1:1001",
        "--enable-leader-election=false", "--zap-log-level=info"]


def test_webhook_configurations_point_at_the_local_server() -> None:
    documents = controllers.patched_webhooks(
        [dict(d, webhooks=list(d["webhooks"])) for d in UPSTREAM],
        [("MutatingWebhookConfiguration", [{"op": "replace", "path": "/webhooks/1", "value": {
            **UPSTREAM[0]["webhooks"][1], "objectSelector": SELECTOR}}])])
    (local,) = integrations.webhook_configurations("jobset", documents, 9443, b"CA PEM")
    assert local["metadata"] == {"name": "jobset-mutating-webhook-configuration"}
    bundle = base64.b64encode(b"CA PEM").decode()
    assert [hook["clientConfig"] for hook in local["webhooks"]] == [
        {"url": "https://127.0.0.1:9443/mutate-jobset-x-k8s-io-v1alpha2-jobset",
         "caBundle": bundle},
        {"url": "https://127.0.0.1:9443/mutate--v1-pod", "caBundle": bundle}]
    # Upstream's patch keeps the pod webhook off every pod that is not the controller's.
    assert local["webhooks"][1]["objectSelector"] == SELECTOR
    assert local["webhooks"][0]["failurePolicy"] == "Fail"
    # The upstream documents are not changed in place.
    assert "service" in UPSTREAM[0]["webhooks"][0]["clientConfig"]


def test_trainer_style_patches_rename_and_add_selectors() -> None:
    documents = [dict(d, metadata=dict(d["metadata"]),
                      webhooks=[dict(h) for h in d["webhooks"]]) for d in UPSTREAM]
    (patched,) = controllers.patched_webhooks(documents, [("MutatingWebhookConfiguration", [
        {"op": "replace", "path": "/metadata/name", "value": "defaulter.example.org"},
        {"op": "replace", "path": "/webhooks/0/clientConfig/service/name", "value": "svc"},
        {"op": "add", "path": "/webhooks/0/objectSelector", "value": SELECTOR}])])
    assert patched["metadata"]["name"] == "defaulter.example.org"
    assert patched["webhooks"][0]["objectSelector"] == SELECTOR
    assert patched["webhooks"][0]["clientConfig"]["service"]["name"] == "svc"
    assert "objectSelector" not in patched["webhooks"][1]


@pytest.mark.parametrize("operation", [
    {"op": "add", "path": "/webhooks/1", "value": {}},
    {"op": "replace", "path": "/webhooks/5", "value": {}},
    {"op": "replace", "path": "/metadata/uid", "value": "x"},
    {"op": "add", "path": "/spec/x", "value": "x"},
    {"op": "remove", "path": "/metadata/name"},
    {"op": "add", "path": "", "value": {}},
])
def test_unsupported_webhook_patch_fails_the_build(operation: dict[str, Any]) -> None:
    documents = [dict(d, webhooks=list(d["webhooks"])) for d in UPSTREAM]
    with pytest.raises(BuildError, match="unsupported operation"):
        controllers.patched_webhooks(documents, [("MutatingWebhookConfiguration", [operation])])
    with pytest.raises(BuildError, match="0 documents"):
        controllers.patched_webhooks(documents, [("ValidatingWebhookConfiguration", [])])


def test_wrapper_modules_pin_the_controllers() -> None:
    # JobSet at the version Kubeflow Trainer v2.3.0's go.mod requires (a
    # higher requirement would have raised it: the graph is shared).
    assert controllers.JOBSET.pinned_version() == "v0.12.0"
    assert controllers.LWS.pinned_version() == "v0.9.0"
    assert controllers.KUBERAY.pinned_version() == "v1.5.0"
    assert controllers.TRAINER.pinned_version() == "v2.3.0"
    shared = (controllers.JOBSET, controllers.LWS, controllers.KUBERAY, controllers.TRAINER)
    for controller in (controllers.JOBSET, controllers.LWS, controllers.TRAINER,
                       controllers.KUEUE):
        go_mod = (controller.wrapper_dir / "go.mod").read_text()
        # A `tool` line, or a line of a `tool (...)` block.
        assert re.search(rf"^(tool |\t){re.escape(controller.package)}$", go_mod, re.M)
    # KubeRay's reconcilers run from the wrapper's own main package.
    main = controllers.KUBERAY.wrapper_dir / controllers.KUBERAY.package / "main.go"
    assert '"github.com/ray-project/kuberay/ray-operator/controllers/ray"' in main.read_text()
    # One dependency graph: client-go and controller-runtime compile once.
    assert {controller.wrapper_dir for controller in shared} == {controllers.JOBSET.wrapper_dir}


def test_controller_cache_key_tracks_version_module_and_toolchain() -> None:
    key = controllers.JOBSET.cache_key("v0.12.0", "go1.26")
    assert re.fullmatch(r"jobset-v0\.12\.0_[0-9a-f]{12}", key)
    assert controllers.JOBSET.cache_key("v0.12.0", "go1.26") == key
    assert controllers.JOBSET.cache_key("v0.12.0", "go1.27") != key
    assert controllers.LWS.cache_key("v0.12.0", "go1.26") != key


def test_controller_cache_key_tracks_the_wrappers_go_sources(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "controllers" / "cmd" / "x").mkdir(parents=True)
    for name in ("go.mod", "go.sum"):
        (tmp_path / "controllers" / name).write_text(name)
    monkeypatch.setattr(controllers, "source_dir", lambda: tmp_path)
    key = controllers.KUBERAY.cache_key("v1.5.0", "go1.26")
    (tmp_path / "controllers" / "cmd" / "x" / "main.go").write_text("package main\n")
    assert controllers.KUBERAY.cache_key("v1.5.0", "go1.26") != key


def test_webhook_serving_certificate_from_the_sandbox_ca(tmp_path: Path) -> None:
    keys = pki.create_pki(tmp_path / "pki")
    ca_file = pki.issue_serving(keys, tmp_path / "certs", "jobset-webhook")
    assert ca_file == keys.ca_cert
    cert = x509.load_pem_x509_certificate((tmp_path / "certs" / "tls.crt").read_bytes())
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    # The caBundle the webhook configurations carry verifies it.
    cert.verify_directly_issued_by(x509.load_pem_x509_certificate(ca_file.read_bytes()))


def test_up_refuses_an_unknown_integration(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    args = argparse.Namespace(dir=tmp_path, nodes=1, node_gpu=0, node_cpu="1",
                              node_memory="1Gi", no_arbiter=True, timeout=1.0,
                              integrations="jobset,kueue")
    assert cli._up(args) == 2
    assert "unknown integration(s) kueue" in capsys.readouterr().err
    assert not (tmp_path / "state.json").exists()


def test_a_running_controller_is_not_started_again(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    sb = Sandbox(tmp_path, quiet=True)
    sb._state = {"version": STATE_VERSION, "nodes": {"count": 0}, "processes": {}}
    record = sb._spawn("jobset", [sys.executable, "-c", "import time; time.sleep(60)"],
                       ports={}, health_url=None)
    prepared: list[str] = []
    monkeypatch.setattr(integrations, "prepare", lambda name, *_: prepared.append(name))
    try:
        sb.start_integrations(["jobset"])
        assert prepared == []
        assert sb.processes()["jobset"].pid == record.pid
    finally:
        process.stop(record)


def test_a_controller_that_dies_at_start_fails_with_its_log(tmp_path: Path) -> None:
    log = tmp_path / "jobset.log"
    record = process.spawn("jobset", [sys.executable, "-c",
                                      "print('unable to start manager: no CRD'); exit(1)"],
                           log, cwd=tmp_path)
    with pytest.raises(SandboxError, match=r"(?s)jobset exited while waiting.*unable to start"):
        wait_until("jobset ready", lambda: False, time.monotonic() + 30,
                   lambda: {"jobset": record}, watch=["jobset"])


def test_a_controller_that_never_gets_ready_times_out_with_its_log(tmp_path: Path) -> None:
    log = tmp_path / "lws.log"
    record = process.spawn("lws", [sys.executable, "-c",
                                   "print('waiting for certs', flush=True); "
                                   "import time; time.sleep(60)"], log, cwd=tmp_path)
    try:
        with pytest.raises(SandboxError, match=r"(?s)timed out waiting for lws.*waiting for certs"):
            wait_until("lws ready", lambda: False, time.monotonic() + 1.0,
                       lambda: {"lws": record}, watch=["lws"])
    finally:
        process.stop(record)


def test_arbiter_is_told_the_integrations_the_sandbox_runs(tmp_path: Path) -> None:
    wanted = integrations.arbiter_integrations({"etcd", "lws", "arbiter"})
    args = components.arbiter_args(
        kubeconfig=tmp_path, port=1, extender_port=2, metrics_port=3, client_ca=tmp_path,
        cert_dir=tmp_path, webhook_port=1, namespace="arbiter-system", integrations=wanted,
        extra_args=["--reclaim-grace", "5"])
    # arbiter's own parser reads it: the built-in kinds and the started controller's.
    assert parse_names(args[args.index("--integrations") + 1]) == (
        "statefulset", "deployment", "lws")
    assert integrations.arbiter_integrations(()) == ("statefulset", "deployment")
    # Each controller's kinds, parsed by arbiter's own parser.
    for name, integration in integrations.INTEGRATIONS.items():
        kinds = integrations.arbiter_integrations({name})
        assert kinds == ("statefulset", "deployment", *integration.kinds)
        assert parse_names(",".join(kinds)) == kinds
    assert components.extra_arbiter_args(args) == ["--reclaim-grace", "5"]


def test_controllers_started_later_restart_a_running_arbiter(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sb = Sandbox(tmp_path, quiet=True)
    sb._state = {"version": STATE_VERSION, "nodes": {"count": 0}, "processes": {}}
    record = sb._spawn("arbiter", [sys.executable, "-c", "import time; time.sleep(60)",
                                   "--namespace", "arbiter-system", "--reclaim-grace", "5"],
                       ports={}, health_url=None)
    calls: list[object] = []
    launch = argparse.Namespace(crd_files=[], name="jobset")
    monkeypatch.setattr(sb, "_prepare_integrations", lambda names: [launch] if names else [])
    monkeypatch.setattr(sb, "_spawn_integrations", lambda launches: None)
    monkeypatch.setattr(sb, "_await_integrations", lambda launches, deadline: None)
    monkeypatch.setattr(sb, "stop_arbiter", lambda: calls.append("stop"))
    monkeypatch.setattr(sb, "start_arbiter", lambda extra: calls.append(extra))
    try:
        sb.start_integrations([])
        assert calls == []  # nothing new: arbiter keeps running
        sb.start_integrations(["jobset"])
        assert calls == ["stop", ["--reclaim-grace", "5"]]
    finally:
        process.stop(record)
