"""Configuration documents the sandbox writes: kubeconfigs, the
KubeSchedulerConfiguration and the fake Nodes. Pure functions, no I/O."""

from __future__ import annotations

import base64
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Nodes that kwok manages carry this annotation (kwok runs with
# --manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake).
KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"
NODE_LABEL = ("type", "kwok")
# Job-owned pods complete after this annotation's duration ("30s", "5m");
# pods not owned by a Job run until deleted. Without it: 1 s.
POD_COMPLETE_DELAY_ANNOTATION = "pod-complete.stage.kwok.x-k8s.io/delay"
MAX_PODS_PER_NODE = 110


@dataclass(frozen=True, slots=True)
class NodeShape:
    """How many fake nodes the sandbox makes, and what each can hold."""

    count: int = 4
    cpu: str = "8"
    memory: str = "32Gi"
    gpu: int = 0


def _b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def kubeconfig(
    server: str, ca_file: Path, cert_file: Path, key_file: Path, user: str
) -> dict[str, Any]:
    """A self-contained kubeconfig (certificates embedded) for one client identity."""
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "arbiter-sandbox",
                "cluster": {"server": server, "certificate-authority-data": _b64(ca_file)},
            }
        ],
        "users": [
            {
                "name": user,
                "user": {
                    "client-certificate-data": _b64(cert_file),
                    "client-key-data": _b64(key_file),
                },
            }
        ],
        "contexts": [
            {"name": "arbiter-sandbox", "context": {"cluster": "arbiter-sandbox", "user": user}}
        ],
        "current-context": "arbiter-sandbox",
    }


def scheduler_config(
    extender_url: str | None,
    ca_file: str | None,
    *,
    kubeconfig_path: str = "",
    client_cert: tuple[str, str] | None = None,
) -> dict[str, Any]:
    """KubeSchedulerConfiguration for the sandbox's kube-scheduler.

    `extender_url` (e.g. "https://127.0.0.1:PORT/scheduler") adds arbiter as
    an extender at the top level (extenders apply to every profile), with the
    stanza of manifests/scheduler/kube-scheduler-config.yaml (the choices are
    explained there; tests/extender keeps the two equal); `ca_file` is the CA
    that signed arbiter's serving certificate; `client_cert` (certificate,
    key) what kube-scheduler proves itself with to the extender.
    No extender when `extender_url` is None.
    """
    config: dict[str, Any] = {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "leaderElection": {"leaderElect": False},
        "clientConnection": {
            # The defaults (50/100) throttle bind calls well below what the
            # scheduler can do; sandbox throughput tests want the scheduler,
            # not the client rate limiter, to be the bottleneck.
            "qps": 500,
            "burst": 1000,
        },
        "profiles": [{"schedulerName": "default-scheduler"}],
    }
    if kubeconfig_path:
        config["clientConnection"]["kubeconfig"] = kubeconfig_path
    if extender_url is not None:
        extender: dict[str, Any] = {
            "urlPrefix": extender_url,
            "filterVerb": "filter",
            "prioritizeVerb": "prioritize",
            "preemptVerb": "preempt",
            "weight": 2,
            "nodeCacheCapable": True,
            "enableHTTPS": extender_url.startswith("https://"),
            "httpTimeout": "2s",
            "ignorable": True,
        }
        tls: dict[str, str] = {}
        if ca_file is not None:
            tls["caFile"] = ca_file
        if client_cert is not None:
            tls["certFile"], tls["keyFile"] = client_cert
        if tls:
            extender["tlsConfig"] = tls
        config["extenders"] = [extender]
    return config


def node_name(index: int) -> str:
    return f"kwok-node-{index}"


def fake_node(index: int, cpu: str, memory: str, gpu: int) -> dict[str, Any]:
    """One fake Node for kwok to run: allocatable = capacity, its own pod CIDR."""
    name = node_name(index)
    resources = {"cpu": cpu, "memory": memory, "pods": str(MAX_PODS_PER_NODE)}
    if gpu > 0:
        resources["nvidia.com/gpu"] = str(gpu)
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {KWOK_NODE_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"},
            "labels": {
                NODE_LABEL[0]: NODE_LABEL[1],
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "node-role.kubernetes.io/agent": "",
            },
        },
        # kwok hands out pod IPs from the node's podCIDR (else from one small
        # global /24), so each node gets a /24 of its own from 10.100.0.0 up
        # (clear of the 10.96.0.0/16 service range; room for ~39,000 nodes).
        "spec": {"podCIDR": f"10.{100 + index // 256}.{index % 256}.0/24"},
        "status": {"allocatable": dict(resources), "capacity": dict(resources)},
    }


def node_list(count: int, cpu: str, memory: str, gpu: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "List",
        "items": [fake_node(i, cpu, memory, gpu) for i in range(count)],
    }
