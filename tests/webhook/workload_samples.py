"""The integrations' workloads as the apiserver hands them to webhooks (and
to the cache's watch), their children with controller ownerReferences, and
the units the loop makes for them."""

from __future__ import annotations

import copy
from typing import Any

from arbiter.cache.store import ClusterStore
from arbiter.integrations import OPTIONAL, enabled
from arbiter.integrations.lws import GROUP_INDEX_LABEL
from tests.webhook.admission_samples import (
    ARBITER_USER,
    QUEUE_LABEL,
    TENANT,
    env_for,
    kubectl_run_pod,
    make_store,
    namespace_obj,
    object_meta,
    parse,
    review,
    unit_obj,
)
from webhook.endpoints import BY_PATH
from webhook.review import Decision

Json = dict[str, Any]
ARBITER = {"username": ARBITER_USER}
QUEUED = {QUEUE_LABEL: "team-a"}

def pod_template(cpu: str = "1", labels: Json | None = None) -> Json:
    template: Json = {"spec": {"containers": [{
        "name": "main", "image": "busybox", "resources": {"requests": {"cpu": cpu}}}],
        "restartPolicy": "Never"}}
    if labels is not None:
        template["metadata"] = {"labels": dict(labels)}
    return template


def jobset(name: str, namespace: str = "team-a", *, labels: Json | None = None,
           suspend: bool | None = None, validating: bool = False,
           jobs: tuple[tuple[str, int], ...] = (("driver", 1), ("workers", 3))) -> Json:
    """A JobSet of replicatedJobs (name, replicas), one 1-CPU pod each."""
    spec: Json = {"replicatedJobs": [
        {"name": job, "replicas": replicas, "template": {"spec": {
            "parallelism": 1, "completions": 1, "template": pod_template()}}}
        for job, replicas in jobs]}
    if suspend is not None:
        spec["suspend"] = suspend
    return {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
            "metadata": object_meta(name, namespace, labels, validating), "spec": spec}


def statefulset(name: str, namespace: str = "team-a", *, labels: Json | None = None,
                replicas: int = 3, validating: bool = False) -> Json:
    return {"apiVersion": "apps/v1", "kind": "StatefulSet",
            "metadata": object_meta(name, namespace, labels, validating),
            "spec": {"replicas": replicas, "serviceName": name,
                     "selector": {"matchLabels": {"app": name}},
                     "podManagementPolicy": "OrderedReady",
                     "template": pod_template(labels={"app": name})}}


def deployment(name: str, namespace: str = "team-a", *, labels: Json | None = None,
               replicas: int = 3, validating: bool = False) -> Json:
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": object_meta(name, namespace, labels, validating),
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                     "template": pod_template(labels={"app": name})}}


def lws(name: str, namespace: str = "team-a", *, labels: Json | None = None,
        replicas: int = 2, size: int = 3, validating: bool = False) -> Json:
    """A LeaderWorkerSet of `replicas` groups of `size` pods (leader + workers)."""
    return {"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
            "metadata": object_meta(name, namespace, labels, validating),
            "spec": {"replicas": replicas, "leaderWorkerTemplate": {
                "size": size, "leaderTemplate": pod_template(),
                "workerTemplate": pod_template()}}}


def owned_by(obj: Json, owner: Json) -> Json:
    """`obj` with `owner` as its controller ownerReference (by its uid)."""
    result = copy.deepcopy(obj)
    result["metadata"]["ownerReferences"] = [{
        "apiVersion": owner["apiVersion"], "kind": owner["kind"],
        "name": owner["metadata"]["name"], "uid": owner["metadata"]["uid"],
        "controller": True, "blockOwnerDeletion": True}]
    return result


def child_pod(name: str, owner: Json, *, queue: str | None = "team-a",
              group_index: str | None = None, gated: bool = True) -> Json:
    """A pod a workload's controller made, as the cache sees it."""
    labels: Json = {"app": name}
    if queue is not None:
        labels[QUEUE_LABEL] = queue
    if group_index is not None:
        labels[GROUP_INDEX_LABEL] = group_index
    pod = kubectl_run_pod(name, owner["metadata"]["namespace"], labels=labels,
                          validating=True)
    if gated:
        pod["spec"]["schedulingGates"] = [{"name": "arbiter.dev/admission"}]
    return owned_by(pod, owner)


def workload_unit(owner: Json, phase: str, suffix: str = "", *, queue: str = "team-a") -> Json:
    """The unit the loop made for `owner` (one of its units: `suffix`)."""
    prefix = {i.kind: i.prefix for i in OPTIONAL}[owner["kind"]]
    meta = owner["metadata"]
    name = f"{prefix}-{meta['name']}" + (f"-{suffix}" if suffix else "")
    return unit_obj(name, meta["namespace"], {
        "queue": queue,
        "consumerRef": {"apiVersion": owner["apiVersion"], "kind": owner["kind"],
                        "namespace": meta["namespace"], "name": meta["name"],
                        "uid": meta["uid"]},
        "podSets": [{"name": "main", "count": 1, "requests": {"cpu": "1"}}]}, phase=phase)


def switch_on(store: ClusterStore, *names: str) -> ClusterStore:
    """The store with these optional integrations switched on (all when none named)."""
    store.integrations = enabled(names or tuple(i.name for i in OPTIONAL))
    return store


def cache(store: ClusterStore, *objects: Json) -> None:
    """Apply the objects as watch events (the real converters run)."""
    for obj in objects:
        kind = obj["kind"]
        store.apply(kind, "ADDED", obj)


def held_store(*objects: Json, queues: list[Json], namespaces: list[str],
               units: list[Json] | None = None) -> ClusterStore:
    """A store of `queues`, `namespaces` and `units` with every optional
    integration switched on and `objects` cached."""
    store = make_store(queues=queues, namespaces=[namespace_obj(n) for n in namespaces],
                       units=units or [])
    switch_on(store)
    cache(store, *objects)
    return store


def ask(path: str, operation: str, obj: Json, store: ClusterStore, *,
        old: Json | None = None, user: Json | None = None) -> Decision:
    """The decision of the endpoint at `path` on `obj` (from a tenant unless `user`)."""
    request = parse(review(obj["kind"], operation, obj, old=old, user=user or TENANT))
    return BY_PATH[path].decide(request, env_for(store))
