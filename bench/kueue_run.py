"""Kueue's manager as a local process beside a sandbox (for bench/compare_kueue.py).

What Kueue's kustomize overlay does in a cluster, done by hand for a process
on 127.0.0.1 (facts: KUEUE.md of the issue):

- its CRDs, server-side applied, with the conversion webhook on the CRDs
  that have one upstream (`/convert`, our URL and CA);
- a Configuration (v1beta2): webhook on 127.0.0.1 with certificates we issue,
  no internal cert management, no leader election, only `batch/job`, the
  shipped controller concurrency and client QPS (300/500), and fair sharing
  on with the preemption strategies Kueue documents;
- its webhook configurations with the `kueue-` name prefix, every
  `clientConfig.service` turned into our URL plus caBundle, the framework
  webhooks kept away from kube-system and kueue-system;
- the manager always reads its metrics certificate from
  /etc/kueue/metrics/certs: it runs in a private mount namespace with a
  tmpfs-backed overlay on /etc, so the host's /etc is never touched.

It acts as user `kueue-manager` in `system:masters`, as arbiter does
(`kube-arbiter`), so neither is throttled by API priority and fairness.
"""

from __future__ import annotations

import base64
import json
import shlex
import time
from pathlib import Path
from typing import Any

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from arbiter.sandbox import Sandbox
from arbiter.sandbox.config import kubeconfig
from arbiter.sandbox.kueue import KueueBuild
from arbiter.sandbox.probe import http_get
from arbiter.sandbox.process import ProcessRecord, free_ports, is_running, stop
from certs import ensure_serving_certificate
from certs.authority import cert_pem, issue, key_pem, write_private, write_public

KUEUE_USER = "kueue-manager"
KUEUE_NAMESPACE = "kueue-system"
CONVERTED_CRDS = ("localqueues", "clusterqueues", "cohorts", "workloads", "multikueueclusters")
# Kueue's recommended fair-sharing preemption (its config's commented default).
FAIR_SHARING = {"preemptionStrategies": ["LessThanOrEqualToFinalShare", "LessThanInitialShare"]}
# As shipped in config/components/manager/controller_manager_config.yaml.
CONCURRENCY = {"Job.batch": 5, "Pod": 5, "Workload.kueue.x-k8s.io": 10,
               "LocalQueue.kueue.x-k8s.io": 5, "Cohort.kueue.x-k8s.io": 1,
               "ClusterQueue.kueue.x-k8s.io": 5, "ResourceFlavor.kueue.x-k8s.io": 1}


class KueueProcess:
    """Install Kueue into `sandbox` and run its manager; `stop` undoes the webhooks."""

    def __init__(self, sandbox: Sandbox, build: KueueBuild, *,
                 job_concurrency: int = CONCURRENCY["Job.batch"]) -> None:
        self.sandbox = sandbox
        self.build = build
        # Workers of Kueue's Job reconciler (its `Job.batch` groupKindConcurrency).
        self.job_concurrency = job_concurrency
        self.dir = sandbox.dir / "kueue"
        self.record: ProcessRecord | None = None
        self.webhook_port, self.health_port, self.metrics_port = free_ports(3)

    @property
    def pid(self) -> int | None:
        return self.record.pid if self.record is not None else None

    # ---- files -------------------------------------------------------------

    def _certificates(self) -> Path:
        certs = ensure_serving_certificate(self.dir / "certs", ["localhost"], ["127.0.0.1"])
        return certs.ca_file

    def _client_kubeconfig(self) -> Path:
        keys = self.sandbox.pki
        ca_cert = x509.load_pem_x509_certificate(keys.ca_cert.read_bytes())
        ca_key = serialization.load_pem_private_key(keys.ca_key.read_bytes(), password=None)
        assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
        cert, key = issue(ca_cert, ca_key, KUEUE_USER, organizations=("system:masters",),
                          client=True)
        cert_file, key_file = self.dir / "client.crt", self.dir / "client.key"
        write_public(cert_file, cert_pem(cert))
        write_private(key_file, key_pem(key))
        path = self.dir / "kubeconfig"
        document = kubeconfig(self.sandbox.apiserver_url, keys.ca_cert, cert_file, key_file,
                              KUEUE_USER)
        path.write_text(yaml.safe_dump(document))
        return path

    def _configuration(self) -> Path:
        document: dict[str, Any] = {
            "apiVersion": "config.kueue.x-k8s.io/v1beta2", "kind": "Configuration",
            "health": {"healthProbeBindAddress": f"127.0.0.1:{self.health_port}"},
            "metrics": {"bindAddress": f"127.0.0.1:{self.metrics_port}"},
            "webhook": {"host": "127.0.0.1", "port": self.webhook_port,
                        "certDir": str(self.dir / "certs")},
            "leaderElection": {"leaderElect": False},
            "internalCertManagement": {"enable": False},
            "controller": {"groupKindConcurrency": {
                **CONCURRENCY, "Job.batch": self.job_concurrency}},
            "clientConnection": {"qps": 300, "burst": 500},
            "integrations": {"frameworks": ["batch/job"]},
            "featureGates": {"VisibilityOnDemand": False},
            "fairSharing": FAIR_SHARING,
        }
        path = self.dir / "config.yaml"
        path.write_text(yaml.safe_dump(document, sort_keys=False))
        return path

    def _url(self, path: str) -> str:
        return f"https://127.0.0.1:{self.webhook_port}{path}"

    def _ca_bundle(self) -> str:
        return base64.b64encode((self.dir / "certs" / "ca.crt").read_bytes()).decode()

    # ---- install -------------------------------------------------------------

    def install_crds(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        self._certificates()
        documents = []
        for path in self.build.crd_files:
            crd = yaml.safe_load(path.read_text())
            if crd["spec"]["names"]["plural"] in CONVERTED_CRDS:
                crd["spec"]["conversion"] = {"strategy": "Webhook", "webhook": {
                    "conversionReviewVersions": ["v1"],
                    "clientConfig": {"url": self._url("/convert"), "caBundle": self._ca_bundle()},
                }}
            documents.append(yaml.safe_dump(crd))
        self.sandbox.apply_yaml("---\n".join(documents), server_side=True)
        self.sandbox.kubectl("wait", "--for=condition=Established", "--timeout=60s",
                             "crd", "--all")
        self.sandbox.kubectl("create", "namespace", KUEUE_NAMESPACE, check=False)

    def webhook_configurations(self) -> list[dict[str, Any]]:
        selector = {"matchExpressions": [{"key": "kubernetes.io/metadata.name",
                                          "operator": "NotIn",
                                          "values": ["kube-system", KUEUE_NAMESPACE]}]}
        documents = [d for d in yaml.safe_load_all(self.build.webhooks_file.read_text()) if d]
        for document in documents:
            document["metadata"]["name"] = "kueue-" + document["metadata"]["name"]
            for hook in document["webhooks"]:
                path = hook["clientConfig"]["service"]["path"]
                hook["clientConfig"] = {"url": self._url(path), "caBundle": self._ca_bundle()}
                if "kueue-x-k8s-io" not in path:
                    hook["namespaceSelector"] = selector
        return documents

    # ---- run -------------------------------------------------------------------

    def start(self, timeout: float = 120.0) -> int:
        config_file = self._configuration()
        client = self._client_kubeconfig()
        metrics_certs = "/etc/kueue/metrics/certs"
        overlay = self.dir / "etc-overlay"
        overlay.mkdir(exist_ok=True)
        o = shlex.quote(str(overlay))
        certs = self.dir / "certs"
        script = (
            f"set -e; mount -t tmpfs tmpfs {o}; mkdir {o}/upper {o}/work; "
            f"mount -t overlay overlay -o lowerdir=/etc,upperdir={o}/upper,workdir={o}/work /etc; "
            f"mkdir -p {metrics_certs}; "
            f"cp {shlex.quote(str(certs / 'tls.crt'))} {shlex.quote(str(certs / 'tls.key'))} "
            f"{metrics_certs}/; "
            f"exec {shlex.quote(str(self.build.binary))} --config={shlex.quote(str(config_file))} "
            "--zap-log-level=info"
        )
        args = ["unshare", "--mount", "--propagation", "private", "sh", "-c", script]
        env = {"KUBECONFIG": str(client), "PATH": "/usr/bin:/bin:/usr/sbin:/sbin"}
        health = f"http://127.0.0.1:{self.health_port}/readyz"
        # Recorded among the sandbox's processes, so `Sandbox.down` stops it
        # by pid with the rest, whatever happens to this script.
        self.record = self.sandbox._spawn(
            "kueue", args, ports={"webhook": self.webhook_port, "health": self.health_port},
            health_url=health, env=env)
        deadline = time.monotonic() + timeout
        while True:
            if not is_running(self.record):
                raise RuntimeError(f"kueue exited; see {self.record.log}")
            status, _ = http_get(health, None, timeout=2.0)
            if status == 200:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"kueue not ready after {timeout:.0f}s; see {self.record.log}")
            time.sleep(0.5)
        self.sandbox.apply_yaml("---\n".join(json.dumps(d) for d in
                                             self.webhook_configurations()))
        return self.record.pid

    def remove_webhooks(self) -> None:
        """Its webhooks fail closed: without them gone, no Job can be created anywhere."""
        for kind in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration"):
            for document in self.webhook_configurations():
                if document["kind"].lower() == kind:
                    self.sandbox.kubectl("delete", kind, document["metadata"]["name"],
                                         "--ignore-not-found", check=False)

    def stop(self) -> None:
        """Webhooks first (while the apiserver still runs), then the manager, by pid."""
        if self.record is None:
            return
        try:
            self.remove_webhooks()
        finally:
            stop(self.record)
