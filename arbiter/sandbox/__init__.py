"""`arbiter sandbox`: a real local Kubernetes control plane (etcd, kube-apiserver,
kube-controller-manager, kube-scheduler, kwok fake nodes, and arbiter itself),
built from the Go wrapper modules in `sandbox/` and run as background
processes: `cluster.Sandbox` drives it, `components` holds each process's
command line, `probe` their health checks, `pki` the certificates.

`Sandbox(directory).up(...)` starts, each as a detached background process
logging to `DIR/logs/<component>.log`:

- etcd (plain HTTP on loopback, data in `DIR/etcd`),
- kube-apiserver (RBAC + Node authorization, service accounts, admission
  webhooks on; serving on a free port of 127.0.0.1),
- kube-controller-manager (job, statefulset, deployment, replicaset,
  garbage collector, namespace, service account and service-account token
  controllers; no node lifecycle, so fake nodes never get evicted),
- kube-scheduler (with arbiter as its extender unless `arbiter=False`;
  see `config.scheduler_config`),
- kwok, faking N nodes and their pods' lifecycles,
- the arbiter server from this checkout (`python -m arbiter serve`), with
  `--integrations` naming StatefulSet, Deployment and the integration
  controllers that run (started later on a running sandbox, they restart it),
- when asked (`up(integrations=["jobset", "lws", "ray", "trainer"])`; the
  CLI's `up` runs all by default), the JobSet, LeaderWorkerSet, KubeRay and
  Kubeflow Trainer controllers with their CRDs and webhooks (and Trainer's
  `torch-distributed` runtime), built from their Go modules
  (`integrations`; Trainer brings JobSet along).

Then it installs `manifests/crds/*.yaml`, creates the fake nodes and waits
until everything is healthy and every node is Ready. `DIR/state.json`
records pids and ports so another process (`arbiter sandbox down`) can stop
exactly what was started.

Pod lifecycles under kwok: a pod bound to a fake node turns Running/Ready at
once. A pod owned by a Job then completes (phase Succeeded) after the
duration in its annotation `pod-complete.stage.kwok.x-k8s.io/delay` (Go
duration: "2s", "5m"; 1 s without the annotation), so a test keeps a Job's
pods running as long as it needs by setting that annotation in the Job's pod
template. Pods not owned by a Job run until deleted; a deleted pod is
removed at once.
"""

from arbiter.sandbox.cluster import ARBITER_NAMESPACE, Sandbox
from arbiter.sandbox.config import POD_COMPLETE_DELAY_ANNOTATION, NodeShape, scheduler_config
from arbiter.sandbox.probe import SandboxError
from arbiter.sandbox.process import KubectlError

__all__ = [
    "ARBITER_NAMESPACE",
    "POD_COMPLETE_DELAY_ANNOTATION",
    "KubectlError",
    "NodeShape",
    "Sandbox",
    "SandboxError",
    "scheduler_config",
]
