"""The workload controllers the sandbox can run beside its control plane,
so that arbiter's integrations are tested against the real thing: JobSet
(`sigs.k8s.io/jobset`), LeaderWorkerSet (`sigs.k8s.io/lws`), KubeRay
(`ray`: RayCluster, RayJob) and Kubeflow Trainer v2 (`trainer`: TrainJob,
which runs its trainers as JobSets, so it brings JobSet along), each its
upstream manager built from the Go module proxy (`controllers`).

What their kustomize overlays do in a cluster, done for a local process
(`Sandbox.start_integrations` runs the steps in this order):

1. their CRDs from the module, server-side applied;
2. the manager on 127.0.0.1 as its own user (`pki.CLIENTS`), with a
   Configuration: health probes and webhook server on free loopback ports,
   metrics off, no leader election, and no internal cert rotation (it
   writes a Secret for an in-cluster Service): the webhook server gets a
   certificate from the sandbox's CA instead (Trainer's has no cert
   directory setting: it reads controller-runtime's default under TMPDIR,
   so TMPDIR points there; KubeRay takes flags and serves no webhook);
3. once its webhooks answer, their configurations from the module (pod
   webhooks limited by upstream's objectSelector patches), each
   `clientConfig.service` replaced by our URL and the sandbox's CA; then
   the objects it needs from its module (Trainer's `torch-distributed`
   ClusterTrainingRuntime, validated by its webhook).

The webhooks stay on because the controllers need them: JobSet defaults
there what its controller relies on (success and startup policy, Indexed
completion, the pods' restartPolicy, without which its Jobs are invalid),
LWS its restart and rollout policies, and LWS's pod webhook labels each
leader pod with its group index and key, which its controller reads.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from arbiter.sandbox import pki
from arbiter.sandbox.controllers import (
    JOBSET,
    KUBERAY,
    LWS,
    TRAINER,
    GoController,
    ensure_controller_built,
)
from arbiter.sandbox.probe import http_get, verified_context
from arbiter.sandbox.process import free_ports


@dataclass(frozen=True, slots=True)
class Integration:
    controller: GoController
    # The apiVersion of the manager's Configuration; "" for a manager set by flags.
    config_api: str
    kinds: tuple[str, ...]  # arbiter's --integrations names it serves
    requires: tuple[str, ...] = ()  # integrations it needs running (started first)


INTEGRATIONS = {
    "jobset": Integration(JOBSET, "config.jobset.x-k8s.io/v1alpha1", ("jobset",)),
    "lws": Integration(LWS, "config.lws.x-k8s.io/v1alpha1", ("lws",)),
    "ray": Integration(KUBERAY, "", ("raycluster", "rayjob")),
    "trainer": Integration(TRAINER, "config.trainer.kubeflow.org/v1alpha1", ("trainer",),
                           requires=("jobset",)),
}
# Kinds arbiter integrates whose controllers kube-controller-manager runs.
BUILT_IN = ("statefulset", "deployment")


def arbiter_integrations(running: Iterable[str]) -> tuple[str, ...]:
    """arbiter's `--integrations` when the processes `running` run: the
    built-in kinds and those whose controller the sandbox started (a kind
    without its CRD would only be reported as missing)."""
    started = set(running)
    return (*BUILT_IN, *(kind for name, integration in INTEGRATIONS.items() if name in started
                         for kind in integration.kinds))


def with_requirements(names: Iterable[str]) -> tuple[str, ...]:
    """`names` with the integrations they need, each needed one before its user."""
    ordered: dict[str, None] = {}
    for name in names:
        ordered.update(dict.fromkeys(INTEGRATIONS[name].requires))
        ordered[name] = None
    return tuple(ordered)


def parse(text: str) -> tuple[str, ...]:
    """`jobset,lws` (or `all`, or `none`/empty) as integration names; unknown
    names raise ValueError naming them and the known ones."""
    words = [w.strip() for w in text.split(",") if w.strip()]
    if words in ([], ["none"]):
        return ()
    if words == ["all"]:
        return tuple(INTEGRATIONS)
    unknown = [w for w in words if w not in INTEGRATIONS]
    if unknown:
        raise ValueError(f"unknown integration(s) {', '.join(unknown)}: "
                         f"choose from {', '.join(INTEGRATIONS)}, all or none")
    return tuple(dict.fromkeys(words))


def configuration(integration: Integration, *, health_port: int, webhook_port: int,
                  cert_dir: Path) -> dict[str, Any]:
    """The manager's Configuration (all share controller-runtime's shape but
    Trainer's, which is strictly decoded: no certDir, its own cert switch)."""
    document: dict[str, Any] = {
        "apiVersion": integration.config_api,
        "kind": "Configuration",
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
        "metrics": {"bindAddress": "0"},
        "webhook": {"host": "127.0.0.1", "port": webhook_port, "certDir": str(cert_dir)},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
    }
    if integration.controller is TRAINER:
        del document["webhook"]["certDir"], document["internalCertManagement"]
        document["certManagement"] = {"enable": False}
    return document


def flags(*, health_port: int) -> list[str]:
    """KubeRay's flags: as the Configurations above, with no webhook server."""
    return ["--metrics-addr=0", f"--health-probe-bind-address=127.0.0.1:{health_port}",
            "--enable-leader-election=false", "--zap-log-level=info"]


def webhook_configurations(name: str, documents: Iterable[dict[str, Any]], webhook_port: int,
                           ca_pem: bytes) -> list[dict[str, Any]]:
    """Upstream's webhook configurations, named as its overlay names them
    (`<name>-` prefix) and pointing at the local webhook server."""
    bundle = base64.b64encode(ca_pem).decode()
    result = []
    for document in documents:
        document = {**document, "metadata": {"name": f"{name}-{document['metadata']['name']}"}}
        document["webhooks"] = [
            {**hook, "clientConfig": {
                "url": f"https://127.0.0.1:{webhook_port}{hook['clientConfig']['service']['path']}",
                "caBundle": bundle}}
            for hook in document["webhooks"]]
        result.append(document)
    return result


@dataclass(frozen=True, slots=True)
class Launch:
    """One integration controller ready to start: files written, ports chosen."""

    name: str
    args: list[str]
    env: dict[str, str]
    ports: dict[str, int]
    crd_files: list[Path]
    webhooks: list[dict[str, Any]]
    resources: list[Path]  # applied once its webhooks are configured

    @property
    def health_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['health']}/readyz"

    def after_ready(self) -> str:
        """What to apply once it serves: its webhook configurations, then the
        objects it needs (Trainer's runtime, which its webhook validates)."""
        return "---\n".join([*(yaml.safe_dump(d) for d in self.webhooks),
                             *(path.read_text() for path in self.resources)])

    def webhook_urls(self) -> list[str]:
        return sorted({hook["clientConfig"]["url"] for document in self.webhooks
                       for hook in document["webhooks"]})


def prepare(name: str, directory: Path, keys: pki.Pki, kubeconfig: Path) -> Launch:
    """Build (or find cached) the controller `name` and write what it runs with."""
    integration = INTEGRATIONS[name]
    build = ensure_controller_built(integration.controller)
    health_port, webhook_port = free_ports(2)
    # Only what it needs: e.g. an ENABLE_WEBHOOKS=false around would turn LWS's off.
    env = {"KUBECONFIG": str(kubeconfig), "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    if not integration.config_api:
        return Launch(
            name=name, args=[str(build.binary), *flags(health_port=health_port)], env=env,
            ports={"health": health_port}, crd_files=build.crd_files, webhooks=[],
            resources=build.extra_files)
    cert_dir = directory / "certs"
    if integration.controller is TRAINER:
        # Where controller-runtime's webhook server looks when not told.
        env["TMPDIR"] = str(directory / "tmp")
        cert_dir = directory / "tmp" / "k8s-webhook-server" / "serving-certs"
    ca_file = pki.issue_serving(keys, cert_dir, f"{name}-webhook")
    config_file = directory / "config.yaml"
    config_file.write_text(yaml.safe_dump(configuration(
        integration, health_port=health_port, webhook_port=webhook_port, cert_dir=cert_dir)))
    upstream = [d for d in yaml.safe_load_all(build.webhooks_file.read_text()) if d]
    return Launch(
        name=name,
        args=[str(build.binary), f"--config={config_file}", "--zap-log-level=info"],
        env=env,
        ports={"health": health_port, "webhook": webhook_port},
        crd_files=build.crd_files,
        webhooks=webhook_configurations(name, upstream, webhook_port, ca_file.read_bytes()),
        resources=build.extra_files,
    )


def serving(launch: Launch, ca_file: Path) -> bool:
    """Ready, and every webhook path registered: LWS reports ready before
    it registers its webhooks (a 404 until then, which fails admission)."""
    if http_get(launch.health_url, timeout=2.0)[0] != 200:
        return False
    context = verified_context(ca_file)
    # A GET without a review is answered 200 with an error review by a
    # registered controller-runtime webhook, 404 by an unregistered path.
    return all(http_get(url, context, timeout=2.0)[0] == 200 for url in launch.webhook_urls())
