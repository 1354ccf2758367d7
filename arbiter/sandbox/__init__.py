"""`arbiter sandbox`: a real local Kubernetes control plane (etcd, kube-apiserver,
kube-controller-manager, kube-scheduler, kwok fake nodes, and arbiter itself),
built from the Go wrapper modules in `sandbox/` and run as background
processes. See `arbiter.sandbox.cluster` for the Python API.
"""

from arbiter.sandbox.cluster import (
    ARBITER_NAMESPACE,
    KubectlError,
    NodeShape,
    Sandbox,
    SandboxError,
)
from arbiter.sandbox.config import POD_COMPLETE_DELAY_ANNOTATION, scheduler_config

__all__ = [
    "ARBITER_NAMESPACE",
    "POD_COMPLETE_DELAY_ANNOTATION",
    "KubectlError",
    "NodeShape",
    "Sandbox",
    "SandboxError",
    "scheduler_config",
]
