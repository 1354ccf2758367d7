"""The command lines of the sandbox's processes and the client files they
use: what each control-plane component is started with, and why.

Pure functions of paths and ports; `cluster.Sandbox` spawns the processes
and records them.
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

import yaml

from arbiter.sandbox import config, pki

ARBITER_COMMAND_ENV = "ARBITER_SANDBOX_ARBITER_COMMAND"
CONTROL_PLANE = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")
KCM_CONTROLLERS = (
    "job-controller",
    "garbage-collector-controller",
    "namespace-controller",
    "serviceaccount-controller",
    "serviceaccount-token-controller",
    "root-ca-certificate-publisher-controller",
    "ttl-after-finished-controller",
    # The workloads arbiter integrates: StatefulSets (also how LeaderWorkerSet
    # runs each group, `integrations`) and Deployments with their ReplicaSets.
    "statefulset-controller",
    "deployment-controller",
    "replicaset-controller",
)
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"


def repo_root() -> Path:
    return Path(__file__).resolve().parents[2]


def arbiter_command() -> list[str]:
    """How to run `arbiter`: this interpreter on this checkout, unless
    ARBITER_SANDBOX_ARBITER_COMMAND says otherwise (e.g. to run it under
    coverage: "python -m coverage run --parallel-mode -m arbiter")."""
    configured = os.environ.get(ARBITER_COMMAND_ENV, "").strip()
    return shlex.split(configured) if configured else [sys.executable, "-m", "arbiter"]


def write_client_files(keys: pki.Pki, server: str, *, admin_kubeconfig: Path,
                       kubeconfigs: Path, kubectl_path: Path, kubectl_binary: Path) -> None:
    """A kubeconfig per client identity, and a kubectl wrapper for the admin."""
    kubeconfigs.mkdir(exist_ok=True)
    for name, (user, _groups) in pki.CLIENTS.items():
        document = config.kubeconfig(
            server, keys.ca_cert, keys.client_cert(name), keys.client_key(name), user
        )
        target = admin_kubeconfig if name == "admin" else kubeconfigs / f"{name}.conf"
        target.write_text(yaml.safe_dump(document))
        target.chmod(0o600)
    kubectl_path.parent.mkdir(exist_ok=True)
    # A wrapper, not a symlink: it defaults to this sandbox's kubeconfig
    # even when KUBECONFIG points at a real cluster (--kubeconfig still wins).
    kubectl_path.write_text(
        "#!/bin/sh\n"
        f"KUBECONFIG='{admin_kubeconfig}' exec '{kubectl_binary}' \"$@\"\n"
    )
    kubectl_path.chmod(0o755)


def etcd_args(binary: Path, data_dir: Path, client_port: int, peer_port: int) -> list[str]:
    client_url, peer_url = f"http://127.0.0.1:{client_port}", f"http://127.0.0.1:{peer_port}"
    return [
        str(binary),
        "--name=sandbox",
        f"--data-dir={data_dir}",
        f"--listen-client-urls={client_url}",
        f"--advertise-client-urls={client_url}",
        f"--listen-peer-urls={peer_url}",
        f"--initial-advertise-peer-urls={peer_url}",
        f"--initial-cluster=sandbox={peer_url}",
        # A throwaway cluster: skipping fsync makes every write (and so
        # every test) much faster; durability across crashes is not wanted.
        "--unsafe-no-fsync=true",
        "--quota-backend-bytes=4294967296",
        "--log-level=warn",
    ]


def apiserver_args(binary: Path, keys: pki.Pki, etcd_port: int, port: int) -> list[str]:
    return [
        str(binary),
        f"--etcd-servers=http://127.0.0.1:{etcd_port}",
        "--bind-address=127.0.0.1",
        "--advertise-address=127.0.0.1",
        f"--secure-port={port}",
        f"--tls-cert-file={keys.apiserver_cert}",
        f"--tls-private-key-file={keys.apiserver_key}",
        f"--client-ca-file={keys.ca_cert}",
        "--authorization-mode=Node,RBAC",
        f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
        f"--service-account-key-file={keys.sa_pub}",
        f"--service-account-signing-key-file={keys.sa_key}",
        f"--service-cluster-ip-range={pki.SERVICE_CIDR}",
        # The default reconciler publishes the advertise address as the
        # `kubernetes` Service's endpoint, and loopback addresses are
        # invalid there: it would log an error every 10 s. Nothing in the
        # sandbox reaches the apiserver through that Service.
        "--endpoint-reconciler-type=none",
        # This plugin taints every new Node not-ready; only the node
        # lifecycle controller (deliberately not run here) would lift it.
        "--disable-admission-plugins=TaintNodesByCondition",
        "--allow-privileged=true",
        "--profiling=false",
    ]


def controller_manager_args(binary: Path, keys: pki.Pki, kubeconfig: Path,
                            port: int) -> list[str]:
    return [
        str(binary),
        f"--kubeconfig={kubeconfig}",
        "--bind-address=127.0.0.1",
        f"--secure-port={port}",
        f"--controllers={','.join(KCM_CONTROLLERS)}",
        "--leader-elect=false",
        # Each controller acts as its own service account with the RBAC
        # role upstream gives it, as in a real cluster.
        "--use-service-account-credentials=true",
        f"--service-account-private-key-file={keys.sa_key}",
        f"--root-ca-file={keys.ca_cert}",
        # Client-side throttling (default 20 qps) would make the Job
        # controller, not the system under test, the bottleneck.
        "--kube-api-qps=200",
        "--kube-api-burst=400",
        # Each Job sync waits on pod creates and status writes; on a loaded
        # two-core apiserver ~1 s a sync, so 10 at a time capped the chaos
        # flood at ~7 Jobs/s with every admitted Job still waiting for pods.
        "--concurrent-job-syncs=50",
        "--profiling=false",
    ]


def scheduler_args(binary: Path, config_file: Path, port: int) -> list[str]:
    return [str(binary), f"--config={config_file}", "--bind-address=127.0.0.1",
            f"--secure-port={port}", "--profiling=false"]


# A kubelet reports an unchanged node status every 5 minutes
# (nodeStatusReportFrequency; its 10 s heartbeat goes to a Lease). kwok's
# heartbeat stage patches every node's status every 20-25 s instead: at
# 2,000 nodes ~90 Node writes a second, each sent to every Node watcher,
# which took a large share of the apiserver on this two-core machine.
NODE_STATUS_REPORT_MS = 300_000
NODE_STATUS_REPORT_JITTER_MS = 330_000  # kwok: delay + rand(jitter - delay)


def sandbox_stages(stages: Sequence[Path], target: Path) -> list[Path]:
    """The toolchain's kwok stages, with the node heartbeat written again
    under `target` at a kubelet's pace; the others as they are."""
    out = []
    for path in stages:
        if path.name != "node-heartbeat.yaml":
            out.append(path)
            continue
        document = yaml.safe_load(path.read_text())
        document["spec"]["delay"] = {"durationMilliseconds": NODE_STATUS_REPORT_MS,
                                     "jitterDurationMilliseconds": NODE_STATUS_REPORT_JITTER_MS}
        target.mkdir(parents=True, exist_ok=True)
        written = target / path.name
        written.write_text(yaml.safe_dump(document, sort_keys=False))
        out.append(written)
    return out


def kwok_args(binary: Path, kubeconfig: Path, port: int, stages: Sequence[Path]) -> list[str]:
    return [
        str(binary),
        f"--kubeconfig={kubeconfig}",
        f"--manage-nodes-with-annotation-selector={config.KWOK_NODE_ANNOTATION}=fake",
        f"--server-address=127.0.0.1:{port}",
        "--node-ip=127.0.0.1",
        # At INFO kwok logs every node and pod patch: megabytes per test run.
        "--v=WARN",
        *(f"--config={stage}" for stage in stages),
    ]


def arbiter_args(*, kubeconfig: Path, port: int, extender_port: int, metrics_port: int,
                 client_ca: Path, cert_dir: Path, webhook_port: int, namespace: str,
                 integrations: Sequence[str], extra_args: Sequence[str]) -> list[str]:
    """`arbiter serve` on 127.0.0.1:`port`, its extender on `extender_port`
    answering only clients whose certificate `client_ca` signed
    (kube-scheduler's), and metrics with the debug API and the web view
    (loopback: everything here is local) on `metrics_port`; the webhook configurations point at
    `webhook_port` (the primary replica's). `integrations`: the workload
    kinds it queues (`--integrations`; `extra_args` may override it)."""
    return [
        *arbiter_command(), "serve",
        "--kubeconfig", str(kubeconfig),
        "--host", "127.0.0.1",
        "--port", str(port),
        "--extender-port", str(extender_port),
        "--extender-client-ca", str(client_ca),
        "--metrics-port", str(metrics_port),
        "--debug-api", "loopback",
        "--web-view", "loopback",
        "--cert-dir", str(cert_dir),
        "--webhook-url", f"https://127.0.0.1:{webhook_port}",
        "--integrations", ",".join(integrations),
        "--namespace", namespace,
        *extra_args,
    ]


def extra_arbiter_args(args: Sequence[str]) -> list[str]:
    """The `extra_args` an `arbiter_args` command line was made with."""
    return list(args[list(args).index("--namespace") + 2:])


def arbiter_env(extra: dict[str, str] | None) -> dict[str, str]:
    """This process's environment, with this checkout importable and `extra` added."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(repo_root()), env.get("PYTHONPATH", "")) if p
    )
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


def scheduler_document(directory: Path, keys: pki.Pki, extender_port: int | None,
                       ca_file: Path | None) -> dict[str, object]:
    """kube-scheduler's configuration: it calls the primary arbiter's extender
    port, trusting arbiter's CA and proving itself with its own client
    certificate (arbiter requires one signed by the sandbox's CA)."""
    extender = None if extender_port is None else f"https://127.0.0.1:{extender_port}/scheduler"
    return config.scheduler_config(
        extender,
        None if ca_file is None else str(ca_file),
        kubeconfig_path=str(directory / "kubeconfigs" / "kube-scheduler.conf"),
        client_cert=(str(keys.client_cert("kube-scheduler")),
                     str(keys.client_key("kube-scheduler"))),
    )
