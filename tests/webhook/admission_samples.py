"""AdmissionReviews shaped like the ones kube-apiserver sends (admission.k8s.io/v1).

Mutating webhooks see the object after defaulting and the built-in admission
plugins (service account volume, default tolerations) but before
`BeforeCreate`: no uid, no creationTimestamp, and with `generateName` no
name. Validating webhooks see it after `BeforeCreate`, with those set.
"""

from __future__ import annotations

import copy
import uuid
from typing import Any

import orjson

from arbiter.cache.store import KINDS, ClusterStore
from arbiter.core.api import ADMISSION_GATE, QUEUE_LABEL
from arbiter.integrations import OPTIONAL
from webhook.patch import apply_patch
from webhook.review import AdmissionEnv, AdmissionRequest, Decision, PatchOp, parse_review

Json = dict[str, Any]
ADMIN = {"username": "kubernetes-admin", "groups": ["system:masters", "system:authenticated"]}
ARBITER_USER = "system:serviceaccount:arbiter-system:kube-arbiter"
TENANT = {"username": "alice", "groups": ["system:authenticated"]}
JOB_CONTROLLER = {
    "username": "system:serviceaccount:kube-system:job-controller",
    "uid": "6a1c1b8e-0c55-4c0a-a0a4-3f1d3f7f1b1e",
    "groups": ["system:serviceaccounts", "system:serviceaccounts:kube-system",
               "system:authenticated"],
}

_GVR = {
    "Pod": ({"group": "", "version": "v1", "kind": "Pod"},
            {"group": "", "version": "v1", "resource": "pods"}),
    "Job": ({"group": "batch", "version": "v1", "kind": "Job"},
            {"group": "batch", "version": "v1", "resource": "jobs"}),
    "Queue": ({"group": "arbiter.dev", "version": "v1alpha1", "kind": "Queue"},
              {"group": "arbiter.dev", "version": "v1alpha1", "resource": "queues"}),
    "QueueUnit": ({"group": "arbiter.dev", "version": "v1alpha1", "kind": "QueueUnit"},
                  {"group": "arbiter.dev", "version": "v1alpha1", "resource": "queueunits"}),
    # The optional integrations' workloads (JobSet, StatefulSet, ...).
    **{i.kind: ({"group": i.group, "version": i.version, "kind": i.kind},
                {"group": i.group, "version": i.version, "resource": i.resource})
       for i in OPTIONAL},
}
_OPTIONS = {
    "CREATE": {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1",
               "fieldManager": "kubectl-client-side-apply", "fieldValidation": "Strict"},
    "UPDATE": {"kind": "UpdateOptions", "apiVersion": "meta.k8s.io/v1",
               "fieldManager": "kubectl-edit", "fieldValidation": "Strict"},
    "DELETE": {"kind": "DeleteOptions", "apiVersion": "meta.k8s.io/v1",
               "propagationPolicy": "Background"},
}


def review(kind: str, operation: str, obj: Json | None, *, old: Json | None = None,
           namespace: str | None = None, name: str | None = None,
           user: Json | None = None) -> Json:
    gvk, gvr = _GVR[kind]
    source = obj if obj is not None else old
    meta = (source or {}).get("metadata") or {}
    request: Json = {
        "uid": str(uuid.uuid4()),
        "kind": dict(gvk),
        "resource": dict(gvr),
        "requestKind": dict(gvk),
        "requestResource": dict(gvr),
        "operation": operation,
        "userInfo": dict(user or ADMIN),
        "object": obj,
        "oldObject": old,
        "dryRun": False,
        "options": _OPTIONS.get(operation),
    }
    request_name = name if name is not None else meta.get("name")
    if request_name:
        request["name"] = request_name
    ns = namespace if namespace is not None else meta.get("namespace")
    if ns:
        request["namespace"] = ns
    return {"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1", "request": request}


def kubectl_run_pod(name: str, namespace: str, *, labels: Json | None = None,
                    validating: bool = False, cpu: str | None = None) -> Json:
    """`kubectl run NAME --image=busybox` as the apiserver hands it to webhooks."""
    resources: Json = {} if cpu is None else {"requests": {"cpu": cpu}}
    meta: Json = {"name": name, "namespace": namespace,
                  "labels": dict(labels if labels is not None else {"run": name})}
    if labels is not None and not labels:
        del meta["labels"]
    if validating:
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = "2025-01-01T00:00:00Z"
    meta["managedFields"] = [{"manager": "kubectl-run", "operation": "Update",
                              "apiVersion": "v1", "time": "2025-01-01T00:00:00Z",
                              "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {}}}]
    return {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": meta,
        "spec": {
            "volumes": [{"name": "kube-api-access-x7k2p", "projected": {
                "sources": [{"serviceAccountToken": {"expirationSeconds": 3607,
                                                     "path": "token"}}],
                "defaultMode": 420}}],
            "containers": [{
                "name": name, "image": "busybox", "resources": resources,
                "volumeMounts": [{"name": "kube-api-access-x7k2p", "readOnly": True,
                                  "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}],
                "terminationMessagePath": "/dev/termination-log",
                "terminationMessagePolicy": "File",
                "imagePullPolicy": "Always",
            }],
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": 30,
            "dnsPolicy": "ClusterFirst",
            "serviceAccountName": "default",
            "serviceAccount": "default",
            "securityContext": {},
            "schedulerName": "default-scheduler",
            "tolerations": [
                {"key": "node.kubernetes.io/not-ready", "operator": "Exists",
                 "effect": "NoExecute", "tolerationSeconds": 300},
                {"key": "node.kubernetes.io/unreachable", "operator": "Exists",
                 "effect": "NoExecute", "tolerationSeconds": 300},
            ],
            "priority": 0,
            "enableServiceLinks": True,
            "preemptionPolicy": "PreemptLowerPriority",
        },
        "status": {"phase": "Pending", "qosClass": "BestEffort"},
    }


def held(pod: Json) -> Json:
    """`pod` with arbiter's gate, as the validating webhook sees a pod the
    mutating webhook held."""
    pod["spec"].setdefault("schedulingGates", []).append({"name": ADMISSION_GATE})
    return pod


def job_pod(job: str, namespace: str, *, queue: str | None, job_uid: str = "") -> Json:
    """A pod the Job controller creates (generateName, controller ownerReference)."""
    job_uid = job_uid or str(uuid.uuid4())
    labels = {"batch.kubernetes.io/controller-uid": job_uid, "batch.kubernetes.io/job-name": job,
              "controller-uid": job_uid, "job-name": job}
    if queue is not None:
        labels[QUEUE_LABEL] = queue
    pod = kubectl_run_pod("", namespace, labels=labels)
    del pod["metadata"]["name"]
    pod["metadata"]["generateName"] = f"{job}-"
    pod["metadata"]["finalizers"] = ["batch.kubernetes.io/job-tracking"]
    pod["metadata"]["ownerReferences"] = [{
        "apiVersion": "batch/v1", "kind": "Job", "name": job, "uid": job_uid,
        "controller": True, "blockOwnerDeletion": True}]
    pod["spec"]["restartPolicy"] = "Never"
    return pod


def object_meta(name: str, namespace: str, labels: Json | None, validating: bool) -> Json:
    """metadata as a mutating webhook sees it, or (`validating`) with the
    uid and creationTimestamp a validating one sees."""
    meta: Json = {"name": name, "namespace": namespace}
    if labels:
        meta["labels"] = dict(labels)
    if validating:
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = "2025-01-01T00:00:00Z"
    return meta


def job(name: str, namespace: str, *, labels: Json | None = None, suspend: bool | None = False,
        template_labels: Json | None = None, validating: bool = False) -> Json:
    """A Job as `kubectl create job NAME --image=busybox` sends it (after defaulting)."""
    meta = object_meta(name, namespace, labels, validating)
    template_meta: Json = {}
    if template_labels is not None:
        template_meta["labels"] = dict(template_labels)
    spec: Json = {
        "parallelism": 1, "completions": 1, "backoffLimit": 6,
        "selector": {"matchLabels": {"batch.kubernetes.io/controller-uid": "x"}},
        "manualSelector": False,
        "template": {
            "metadata": template_meta,
            "spec": {"containers": [{"name": name, "image": "busybox",
                                     "resources": {"requests": {"cpu": "1"}},
                                     "terminationMessagePath": "/dev/termination-log",
                                     "terminationMessagePolicy": "File",
                                     "imagePullPolicy": "Always"}],
                     "restartPolicy": "Never", "terminationGracePeriodSeconds": 30,
                     "dnsPolicy": "ClusterFirst", "securityContext": {},
                     "schedulerName": "default-scheduler"},
        },
        "completionMode": "NonIndexed",
        "podReplacementPolicy": "TerminatingOrFailed",
    }
    if suspend is not None:
        spec["suspend"] = suspend
    return {"kind": "Job", "apiVersion": "batch/v1", "metadata": meta, "spec": spec,
            "status": {}}


def queue_obj(name: str, **spec: Any) -> Json:
    full = {"weight": 1, "queuePolicy": "Priority", "blocking": False, "priority": 0,
            "reclaimable": True, "state": "Open", "preemption": {"withinQueue": "Never"}}
    full.update(spec)
    return {"apiVersion": "arbiter.dev/v1alpha1", "kind": "Queue",
            "metadata": {"name": name, "uid": str(uuid.uuid4()), "generation": 1,
                         "creationTimestamp": "2025-01-01T00:00:00Z"},
            "spec": full}


def unit_obj(name: str, namespace: str, spec: Json, *, phase: str | None = None,
             labels: Json | None = None) -> Json:
    obj: Json = {"apiVersion": "arbiter.dev/v1alpha1", "kind": "QueueUnit",
                 "metadata": {"name": name, "namespace": namespace}, "spec": spec}
    if labels:
        obj["metadata"]["labels"] = labels
    if phase is not None:
        obj["status"] = {"phase": phase}
    return obj


def namespace_obj(name: str, labels: Json | None = None) -> Json:
    all_labels = {"kubernetes.io/metadata.name": name, **(labels or {})}
    return {"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": name, "labels": all_labels}}


def make_store(*, queues: list[Json] | None = None, namespaces: list[Json] | None = None,
               units: list[Json] | None = None, jobs: list[Json] | None = None) -> ClusterStore:
    store = ClusterStore()
    store.replace_all("Queue", queues or [])
    store.replace_all("Namespace", namespaces or [])
    store.replace_all("QueueUnit", units or [])
    store.replace_all("Job", jobs or [])
    store.synced_kinds.update(KINDS)
    return store


def env_for(store: ClusterStore) -> AdmissionEnv:
    return AdmissionEnv(store=store, own_usernames={ARBITER_USER})


def parse(body: Json) -> AdmissionRequest:
    request = body["request"]
    return parse_review(orjson.dumps(body), request["kind"]["group"], request["kind"]["kind"])


def patched(obj: Json, decision: Decision) -> Json:
    """`obj` after the decision's JSON Patch, applied as the apiserver would."""
    ops: list[PatchOp] = list(decision.patch)
    return apply_patch(copy.deepcopy(obj), ops)  # type: ignore[no-any-return]


def gates(pod: Json) -> list[str]:
    return [g["name"] for g in pod.get("spec", {}).get("schedulingGates", [])]


__all__ = ["ADMISSION_GATE", "QUEUE_LABEL"]
