"""Pods: label with the queue and hold with the admission scheduling gate.

Mutating (CREATE): resolve the queue, set `arbiter.dev/queue`, add the
`arbiter.dev/admission` gate. A pod whose controller is a batch/v1 Job and
that already carries the queue label is not gated: the Job webhook put the
label into the Job's pod template, the Job is the unit of admission, and
its pods exist only once arbiter has unsuspended it. Both facts are on the
pod and anyone may write them, so the owner is checked against the cache:
the Job must be there, with the same uid, managed (its queue label set).
That is safe against the cache lagging: the Job controller creates pods
only once arbiter unsuspended the Job, which it does from the cache. A pod
that claims a Job arbiter does not know is gated like a plain pod, and the
loop admits it as one (its own QueueUnit; see `arbiter.cache.ownership`). Until the cache has
listed Jobs, such pods get a retryable denial instead of a guess.

Validating: CREATE is denied when no queue resolves, the queue does not
exist or is Closed. UPDATE (sent only for pods that held the gate, see
manifests/webhooks.yaml) may not lift the gate or move the pod to another
queue unless arbiter itself asks.
"""

from __future__ import annotations

from typing import Any

from arbiter.api import ADMISSION_GATE, QUEUE_LABEL
from webhook.patch import set_label
from webhook.queueing import check_new_work, not_ready

# The same review helpers as jobs.py imports: each kind's module names what it uses.
from webhook.review import (
    ALLOW,
    AdmissionEnv,
    AdmissionRequest,
    Decision,
    MalformedReview,
    Obj,
    PatchOp,
    allow,
    deny,
    get_list,
    get_map,
    get_metadata,
    namespaced_object,
    require_object,
)

GROUP, KIND = "", "Pod"


def job_owner(meta: Obj | None,
              where: str = "request.object.metadata") -> tuple[str, str] | None:
    """(name, uid) of the pod's controller when it is a batch/v1 Job, else None."""
    if meta is None:
        return None
    refs = get_list(meta, "ownerReferences", f"{where}.ownerReferences") or []
    for index, ref in enumerate(refs):
        if not isinstance(ref, dict):
            raise MalformedReview(f"{where}.ownerReferences[{index}] must be an object")
        if (ref.get("controller") is True and ref.get("kind") == "Job"
                and ref.get("apiVersion") == "batch/v1"):
            name, uid = ref.get("name"), ref.get("uid")
            return (name if isinstance(name, str) else "", uid if isinstance(uid, str) else "")
    return None


def managed_job_pod(env: AdmissionEnv, namespace: str, meta: Obj | None,
                    labels: dict[str, str] | None) -> bool | Decision:
    """Whether the pod belongs to a Job arbiter holds (so it is not gated).

    True only when the pod carries the queue label and its controller is a
    Job that is in the cache with the same uid and a queue; a denial while
    the cache has not listed Jobs yet and the pod claims one.
    """
    if not (labels and labels.get(QUEUE_LABEL)):
        return False
    owner = job_owner(meta)
    if owner is None:
        return False
    waiting = not_ready(env, ("Job",))
    if waiting is not None:
        return waiting
    name, uid = owner
    job = env.store.jobs.get(f"{namespace}/{name}")
    return job is not None and bool(uid) and job.uid == uid and job.queue is not None


def _gates(spec: Obj | None, where: str) -> list[Any] | None:
    if spec is None:
        return None
    gates = get_list(spec, "schedulingGates", f"{where}.schedulingGates")
    if gates is not None:
        for index, gate in enumerate(gates):
            if not isinstance(gate, dict):
                raise MalformedReview(f"{where}.schedulingGates[{index}] must be an object")
    return gates


def has_gate(spec: Obj | None, where: str) -> bool:
    return any(g.get("name") == ADMISSION_GATE for g in _gates(spec, where) or ())


def mutate(request: AdmissionRequest, env: AdmissionEnv) -> Decision:
    if request.operation != "CREATE":
        return ALLOW
    pod, meta, labels, namespace = namespaced_object(request, KIND)
    if not env.store.is_managed_namespace(namespace):
        return ALLOW
    spec = get_map(pod, "spec", "request.object.spec")
    gates = _gates(spec, "request.object.spec")
    queue = env.store.resolve_queue(namespace, labels)
    if queue is None:
        return ALLOW  # the validating webhook denies it with the reason
    job_pod = managed_job_pod(env, namespace, meta, labels)
    if isinstance(job_pod, Decision):
        return job_pod
    ops: list[PatchOp] = []
    set_label(ops, (), meta, labels, QUEUE_LABEL, queue)
    warnings: list[str] = []
    if not job_pod:
        if spec is not None and spec.get("nodeName"):
            # The apiserver forbids scheduling gates on a pod bound at creation.
            warnings.append(
                "spec.nodeName is set: the pod bypasses the scheduler and is not held "
                f'for queue "{queue}"'
            )
        elif spec is None:
            ops.append({"op": "add", "path": "/spec",
                        "value": {"schedulingGates": [{"name": ADMISSION_GATE}]}})
        elif gates is None:
            ops.append({"op": "add", "path": "/spec/schedulingGates",
                        "value": [{"name": ADMISSION_GATE}]})
        elif not any(g.get("name") == ADMISSION_GATE for g in gates):
            ops.append({"op": "add", "path": "/spec/schedulingGates/-",
                        "value": {"name": ADMISSION_GATE}})
    return allow(ops, warnings)


def validate(request: AdmissionRequest, env: AdmissionEnv) -> Decision:
    if request.operation == "CREATE":
        return _validate_create(request, env)
    if request.operation == "UPDATE":
        return _validate_update(request, env)
    return ALLOW


def _validate_create(request: AdmissionRequest, env: AdmissionEnv) -> Decision:
    _, meta, labels, namespace = namespaced_object(request, KIND)
    if not env.store.is_managed_namespace(namespace):
        return ALLOW
    job_pod = managed_job_pod(env, namespace, meta, labels)
    if isinstance(job_pod, Decision):
        return job_pod
    if job_pod:
        # A pod of a Job arbiter accepted: the Job was checked (and admitted).
        return ALLOW
    return check_new_work(env, namespace, labels, "pod")


def _validate_update(request: AdmissionRequest, env: AdmissionEnv) -> Decision:
    new = require_object(request)
    old, old_meta, old_labels, namespace = namespaced_object(request, KIND, old=True)
    if not env.store.is_managed_namespace(namespace) or env.is_arbiter(request):
        return ALLOW
    if not has_gate(get_map(old, "spec", "request.oldObject.spec"), "request.oldObject.spec"):
        return ALLOW
    _, new_labels = get_metadata(new, "request.object")
    queue = (old_labels or {}).get(QUEUE_LABEL, "")
    name = request.name or (old_meta or {}).get("name", "")
    if not has_gate(get_map(new, "spec", "request.object.spec"), "request.object.spec"):
        return deny(
            f'pod "{namespace}/{name}" is waiting for queue "{queue}" to admit it: only '
            f"kube-arbiter may remove the {ADMISSION_GATE} scheduling gate"
        )
    new_queue = (new_labels or {}).get(QUEUE_LABEL, "")
    if new_queue != queue:
        return deny(
            f'pod "{namespace}/{name}" is held for queue "{queue}": its {QUEUE_LABEL} label '
            "cannot change; delete and recreate the pod in the other queue"
        )
    return ALLOW
