"""API objects shaped as the apiserver and kube-scheduler send them, and a
small in-memory world (store + extender state) to decide against.

`pod()` mirrors what kube-scheduler marshals into ExtenderArgs.Pod: a full
v1.Pod with metadata (uid, creationTimestamp, labels, ownerReferences),
spec (containers with resources, priority, schedulerName, ...) and status.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from typing import Any

from arbiter.cache.store import KINDS, ClusterStore
from extender.state import ExtenderState

QUEUE_LABEL = "arbiter.dev/queue"
_uids = itertools.count(1)


def uid() -> str:
    return f"00000000-0000-4000-8000-{next(_uids):012d}"


def consumer_uid(kind: str, namespace: str, name: str) -> str:
    """The uid of a Job or pod, the same every time it is named: a unit built
    for it (`unit`) stands for it by that uid, as the loop's units do."""
    return f"{kind.lower()}-{namespace}-{name}-uid"


# The consumer a loop-made unit stands for, by its name's prefix.
_CONSUMER_KINDS = {"job-": ("Job", "batch/v1"), "pod-": ("Pod", "v1"),
                   "group-": ("PodGroup", "arbiter.dev/v1alpha1")}


def node(name: str, cpu: str = "4", memory: str = "16Gi", labels: Mapping[str, str] | None = None,
         ready: bool = True) -> dict[str, Any]:
    resources = {"cpu": cpu, "memory": memory, "pods": "110"}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "uid": uid(),
            "labels": {"kubernetes.io/hostname": name, **(labels or {})},
        },
        "spec": {},
        "status": {
            "allocatable": resources,
            "capacity": resources,
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def queue(name: str, *, weight: int = 1, capability: Mapping[str, str] | None = None,
          guarantee: Mapping[str, str] | None = None,
          node_selector: Mapping[str, str] | None = None,
          reclaimable: bool = True) -> dict[str, Any]:
    spec: dict[str, Any] = {"weight": weight, "reclaimable": reclaimable}
    if capability is not None:
        spec["capability"] = dict(capability)
    if guarantee is not None:
        spec["guarantee"] = dict(guarantee)
    if node_selector is not None:
        spec["nodeSelector"] = dict(node_selector)
    return {
        "apiVersion": "arbiter.dev/v1alpha1",
        "kind": "Queue",
        "metadata": {"name": name, "uid": uid()},
        "spec": spec,
    }


def pool(name: str, node_selector: Mapping[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "arbiter.dev/v1alpha1",
        "kind": "Pool",
        "metadata": {"name": name, "uid": uid()},
        "spec": {"nodeSelector": dict(node_selector)},
    }


def unit(namespace: str, name: str, queue_name: str, *, phase: str = "Running",
         count: int = 1, cpu: str = "1", priority: int = 0,
         admission: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A QueueUnit; `admission` is its status.admission ({pool, nodes: {podSet: [node]}})."""
    status: dict[str, Any] = {"phase": phase}
    if admission is not None:
        status["admission"] = dict(admission)
    return {
        "apiVersion": "arbiter.dev/v1alpha1",
        "kind": "QueueUnit",
        "metadata": {"namespace": namespace, "name": name, "uid": uid()},
        "spec": {
            "queue": queue_name,
            "priority": priority,
            "podSets": [{"name": "main", "count": count, "requests": {"cpu": cpu}}],
            **_consumer_ref(namespace, name),
        },
        "status": status,
    }


def _consumer_ref(namespace: str, name: str) -> dict[str, Any]:
    """spec.consumerRef of a unit the loop made under `name` (none for a reservation)."""
    for prefix, (kind, api_version) in _CONSUMER_KINDS.items():
        if name.startswith(prefix):
            consumer = name.removeprefix(prefix)
            ref = {"apiVersion": api_version, "kind": kind, "namespace": namespace,
                   "name": consumer}
            if kind != "PodGroup":
                ref["uid"] = consumer_uid(kind, namespace, consumer)
            return {"consumerRef": ref}
    return {}


def pod(name: str, *, namespace: str = "team-a", queue_name: str | None = "a",
        cpu: str = "1", memory: str | None = None, node_name: str | None = None,
        phase: str = "Pending", job: str | None = None, group: str | None = None,
        priority: int = 0, pod_uid: str | None = None) -> dict[str, Any]:
    labels: dict[str, str] = {"app": name}
    if queue_name is not None:
        labels[QUEUE_LABEL] = queue_name
    if group is not None:
        labels["arbiter.dev/pod-group"] = group
    if job is not None:
        labels["batch.kubernetes.io/job-name"] = job
    requests: dict[str, str] = {"cpu": cpu}
    if memory is not None:
        requests["memory"] = memory
    metadata: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "uid": pod_uid or consumer_uid("Pod", namespace, name),
        "resourceVersion": "4242",
        "creationTimestamp": "2025-01-01T00:00:00Z",
        "labels": labels,
    }
    if job is not None:
        metadata["ownerReferences"] = [{
            "apiVersion": "batch/v1", "kind": "Job", "name": job,
            "uid": consumer_uid("Job", namespace, job),
            "controller": True, "blockOwnerDeletion": True,
        }]
    spec: dict[str, Any] = {
        "containers": [{
            "name": "main",
            "image": "registry.k8s.io/pause:3.10",
            "resources": {"requests": requests, "limits": dict(requests)},
            "terminationMessagePath": "/dev/termination-log",
            "imagePullPolicy": "IfNotPresent",
        }],
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 30,
        "dnsPolicy": "ClusterFirst",
        "serviceAccountName": "default",
        "securityContext": {},
        "schedulerName": "default-scheduler",
        "tolerations": [
            {"key": "node.kubernetes.io/not-ready", "operator": "Exists",
             "effect": "NoExecute", "tolerationSeconds": 300},
        ],
        "priority": priority,
        "enableServiceLinks": True,
        "preemptionPolicy": "PreemptLowerPriority",
    }
    if node_name is not None:
        spec["nodeName"] = node_name
    return {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": metadata,
        "spec": spec,
        "status": {"phase": phase, "qosClass": "Guaranteed"},
    }


def extender_args(pod_obj: Mapping[str, Any], names: Iterable[str]) -> dict[str, Any]:
    """ExtenderArgs as a nodeCacheCapable kube-scheduler sends it."""
    return {"Pod": pod_obj, "Nodes": None, "NodeNames": list(names)}


def extender_args_nodes(pod_obj: Mapping[str, Any],
                        nodes: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """ExtenderArgs as kube-scheduler sends it to an extender that is not nodeCacheCapable."""
    return {
        "Pod": pod_obj,
        "Nodes": {"metadata": {}, "items": list(nodes)},
        "NodeNames": None,
    }


def preemption_args(pod_obj: Mapping[str, Any],
                    victims: Mapping[str, Iterable[str]], pdb: int = 0) -> dict[str, Any]:
    """ExtenderPreemptionArgs from a nodeCacheCapable scheduler (UIDs only)."""
    return {
        "Pod": pod_obj,
        "NodeNameToVictims": None,
        "NodeNameToMetaVictims": {
            name: {"Pods": [{"UID": u} for u in uids], "NumPDBViolations": pdb}
            for name, uids in victims.items()
        },
    }


def synced_store() -> ClusterStore:
    """A store that says its first sync is done (as after the watchers' LISTs)."""
    store = ClusterStore()
    store.synced_kinds.update(KINDS)
    return store


class World:
    """A ClusterStore fed with API objects, and the extender state following it."""

    def __init__(self, **state_options: Any) -> None:
        self.store = synced_store()
        self.state = ExtenderState(self.store, **state_options)

    def add(self, kind: Any, obj: Mapping[str, Any]) -> Mapping[str, Any]:
        self.store.apply(kind, "ADDED", obj)
        return obj

    def nodes(self, count: int, cpu: str = "4", prefix: str = "node-",
              labels: Mapping[str, str] | None = None) -> list[str]:
        names = [f"{prefix}{i}" for i in range(count)]
        for name in names:
            self.add("Node", node(name, cpu=cpu, labels=labels))
        return names

    def queue(self, name: str, **options: Any) -> None:
        self.add("Queue", queue(name, **options))

    def unit(self, namespace: str, name: str, queue_name: str, **options: Any) -> None:
        self.add("QueueUnit", unit(namespace, name, queue_name, **options))

    def pool(self, name: str, **node_selector: str) -> None:
        self.add("Pool", pool(name, node_selector))

    def pod(self, name: str, **options: Any) -> dict[str, Any]:
        obj = pod(name, **options)
        self.add("Pod", obj)
        return obj
