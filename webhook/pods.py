"""Pods: label with the queue and hold with the admission scheduling gate.

Mutating (CREATE): resolve the queue, set `arbiter.dev/queue`, add the
`arbiter.dev/admission` gate (gated also when no queue resolves, and a
retryable denial before the cache has listed Queues and Namespaces: as
for Jobs, `webhook.jobs`). A pod whose controller is a batch/v1 Job and
that already carries the queue label is not gated: the Job webhook put the
label into the Job's pod template, the Job is the unit of admission, and
its pods exist only once arbiter has unsuspended it. Both facts are on the
pod and anyone may write them, so the owner is checked against the cache:
the Job must be there, with the same uid, managed (its queue label set)
and admitted (`managed_job_pod`). A pod of a Job arbiter does not hold
(the Job carries no queue) is gated like a plain pod, and the loop admits
it as one (its own QueueUnit; see `arbiter.cache.ownership`). Until the
cache has listed Jobs and units, and while it has not seen the Job the pod
names (by uid: a Job admitted at creation makes pods at once), such pods
get a retryable denial instead of a guess.

Validating, in a managed namespace (a kubelet's mirror pods aside):
CREATE is denied with `spec.nodeName` set (past the queue and the
scheduler), with DRA `spec.resourceClaims` (not charged yet), when no
queue resolves, the queue does not exist or is Closed, and, from anyone
but arbiter, without the gate (a later mutating webhook dropped it).
UPDATE may not lift the gate, nor change the queue or pod-group label of
any pod; `pods/resize` may not raise requests (the queue was charged for
the old size). The configurations send only those UPDATEs (held pods,
changed labels, resizes: see `webhook.endpoints`).

Pods of a held workload (a StatefulSet's, an LWS's: their controller
chain reaches it by uid) are gated like any pod and let go by the loop
while the workload's unit is admitted; a pod of a JobSet's child Job
passes ungated only while the JobSet's unit is admitted and the JobSet has
fewer active pods than it admitted (a Job a tenant made under it gets none
past that; `managed_job_pod`);
so does a pod a suspend-held workload's controller makes itself (a declared
kind's), up to the count admitted (`workload_pod`).
A held pod may not be moved under a held workload by rewriting its
ownerReferences.
"""

from __future__ import annotations

from typing import Any

from arbiter.cache.workloads import WorkloadRecord
from arbiter.core.api import ADMISSION_GATE, POD_GROUP_LABEL, QUEUE_LABEL
from arbiter.core.jsonvalues import brief
from arbiter.core.podrequests import effective_pod_requests
from arbiter.core.quantities import QuantityError, format_quantity
from webhook.held import (
    admitted_job_unit,
    claims_problem,
    controller_ref,
    held_root,
    joins_held_root,
    joins_message,
    unit_admitted,
)
from webhook.patch import set_label
from webhook.queueing import check_new_work, not_ready, not_ready_for

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
    text_field,
)

GROUP, KIND = "", "Pod"


def job_owner(meta: Obj | None,
              where: str = "request.object.metadata") -> tuple[str, str] | None:
    """(name, uid) of the pod's controller when it is a batch/v1 Job, else None."""
    ref = controller_ref(meta, where)
    if ref is None or ref.get("kind") != "Job" or ref.get("apiVersion") != "batch/v1":
        return None
    return text_field(ref, "name"), text_field(ref, "uid")


def managed_job_pod(env: AdmissionEnv, namespace: str, meta: Obj | None,
                    labels: dict[str, str] | None) -> bool | Decision:
    """Whether the pod belongs to a Job arbiter admitted (so it is not gated).

    True only when the pod carries its Job's queue label and its controller
    is a managed Job in the cache with the same uid, admitted: unsuspended
    (only arbiter unsuspends a Job it holds), or its unit admitted for that
    uid. A denial while the cache has not listed Jobs and units yet, and
    for a pod that claims a Job its queue still holds: the Job controller
    creates no pods for a suspended Job, so the pod is forged or late, and
    a retryable denial (the controller retries) is right for both, where a
    gate would queue it again as a plain pod beside its Job.
    """
    if not (labels and labels.get(QUEUE_LABEL)):
        return False
    owner = job_owner(meta)
    if owner is None:
        return False
    waiting = not_ready(env, ("Job", "QueueUnit"))
    if waiting is not None:
        return waiting
    name, uid = owner
    job = env.store.jobs.get(f"{namespace}/{name}")
    if uid and (job is None or job.uid != uid):
        # A Job let through at creation (the fast path) or a JobSet's child
        # Job makes pods before its watch event reaches this cache; gated,
        # such a pod would be queued again as a plain pod beside its Job.
        return deny(
            f'pod of Job "{namespace}/{name}": metadata.ownerReferences names that Job as its '
            "controller, but kube-arbiter has not seen it yet; retry in a few seconds", code=503,
            recheck=("Job", f"{namespace}/{name}"))
    if job is None or not uid or job.queue != labels.get(QUEUE_LABEL):
        return False
    root = env.store.root_workload(namespace, "Job", uid)
    if root is not None:
        # A child Job (a JobSet's) has no unit: it runs when its root's unit
        # is admitted, and its controller unsuspends it only then.
        started = not job.suspended and unit_admitted(env, root)
    else:
        started = not job.suspended or admitted_job_unit(env, namespace, uid) is not None
    if started:
        # The Job's queue was charged for `parallelism` pods (which may not
        # grow while it runs): a pod past that is not the Job controller's
        # (it deletes its own excess), it is a tenant's passenger.
        active = env.store.active_job_pods(namespace, uid)
        if active >= job.parallelism:
            return deny(
                f'pod of Job "{namespace}/{name}": metadata.ownerReferences names that Job as '
                f"its controller, but it already has {active} active pods, as many as its "
                f"spec.parallelism ({job.parallelism}) that queue \"{job.queue}\" admitted")
        if root is None or (full := _full(env, root)) is None:
            return True
        # A Job a tenant made with its JobSet as controller is no more the
        # JobSet's admitted pods than a raised parallelism would be.
        return deny(f'pod of Job "{namespace}/{name}" of {root.kind} "{root.key}": the '
                    f"{root.kind} already has {full}")
    held = f'{root.kind} "{root.key}"' if root is not None else "it"
    return deny(
        f'pod of Job "{namespace}/{name}": metadata.ownerReferences names that Job as its '
        f'controller, but queue "{job.queue}" has not admitted {held} yet; the Job controller '
        "creates its pods once kube-arbiter starts the Job",
        # The leader may have started it a moment before this replica's watch said so.
        recheck=("Job", f"{namespace}/{name}"))


def workload_pod(env: AdmissionEnv, namespace: str, meta: Obj | None,
                 labels: dict[str, str] | None) -> bool | Decision:
    """Whether the pod is made directly by a suspend-held workload arbiter
    admitted (a declared kind's controller makes pods from its templates,
    only while it is unsuspended): not gated then, like an admitted Job's.

    True only when its controller ownerReference is that workload by uid in
    the cache, with its queue label, unsuspended and its unit admitted, and
    the pod is within the count admitted; a denial (the controller retries)
    while it is held (a late or forged pod) or past its count (a tenant's
    passenger). False for any other pod: gated as usual."""
    if not (labels and labels.get(QUEUE_LABEL)):
        return False
    ref = controller_ref(meta, "request.object.metadata")
    if ref is None or ref.get("kind") == "Job":
        return False
    root = held_root(env, namespace, meta)
    if root is None or root.uid != text_field(ref, "uid") \
            or root.integration.hold != "suspend" or root.queue != labels.get(QUEUE_LABEL):
        return False
    waiting = not_ready(env, ("QueueUnit",))
    if waiting is not None:
        return waiting
    subject = f'pod of {root.kind} "{root.key}"'
    if root.suspended or not unit_admitted(env, root):
        if root.integration.gated_pods:
            return False  # gated: the loop lets it go once this cache catches up
        return deny(f'{subject}: queue "{root.queue}" has not admitted it yet; its controller '
                    f"creates its pods once kube-arbiter starts the {root.kind}")
    full = _full(env, root)
    if full is None:
        return True
    return deny(f"{subject}: metadata.ownerReferences names it as controller, but it already "
                f"has {full}")


def _full(env: AdmissionEnv, root: WorkloadRecord) -> str | None:
    """Why an admitted workload may start no more pods: it has as many active
    ones (by controller chain, uid at every step) as its unit admitted; None
    while it has room (or no unit to say)."""
    unit = env.store.workload_unit(root)
    if unit is None:
        return None
    admitted = sum(ps.count for ps in unit.admitted_pod_sets or unit.pod_sets)
    active = sum(not p.terminating and p.phase not in ("Succeeded", "Failed")
                 for p in env.store.workload_pods(root))
    if active < admitted:
        return None
    return f'{active} active pods, as many as queue "{root.queue}" admitted'


def started_pod(env: AdmissionEnv, namespace: str, meta: Obj | None,
                labels: dict[str, str] | None) -> bool | Decision:
    """A pod of a Job arbiter admitted, or of an admitted suspend-held workload."""
    found = managed_job_pod(env, namespace, meta, labels)
    return found if found is not False else workload_pod(env, namespace, meta, labels)


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
    waiting = not_ready_for(env, namespace)
    if waiting is not None:
        return waiting
    if not env.store.is_managed_namespace(namespace):
        return ALLOW
    spec = get_map(pod, "spec", "request.object.spec")
    gates = _gates(spec, "request.object.spec")
    job_pod = started_pod(env, namespace, meta, labels)
    if isinstance(job_pod, Decision):
        return job_pod
    ops: list[PatchOp] = []
    # Gated even without a queue here: the validating call may reach another
    # replica whose cache already has the Queue (it then admits a held pod).
    queue = env.store.resolve_queue(namespace, labels)
    if queue is not None:
        set_label(ops, (), meta, labels, QUEUE_LABEL, queue)
    if job_pod or (spec is not None and spec.get("nodeName")):
        # A bound pod cannot be gated (the apiserver forbids it); validation
        # denies it unless a kubelet creates it (a static pod's mirror).
        return allow(ops)
    if spec is None:
        ops.append({"op": "add", "path": "/spec",
                    "value": {"schedulingGates": [{"name": ADMISSION_GATE}]}})
    elif gates is None:
        ops.append({"op": "add", "path": "/spec/schedulingGates",
                    "value": [{"name": ADMISSION_GATE}]})
    elif not any(g.get("name") == ADMISSION_GATE for g in gates):
        ops.append({"op": "add", "path": "/spec/schedulingGates/-",
                    "value": {"name": ADMISSION_GATE}})
    return allow(ops)


def validate(request: AdmissionRequest, env: AdmissionEnv) -> Decision:
    if request.operation == "CREATE":
        return _validate_create(request, env)
    if request.operation == "UPDATE":
        return _validate_update(request, env)
    return ALLOW


def _pod_name(request: AdmissionRequest, namespace: str, meta: Obj | None) -> str:
    name = request.name or text_field(meta, "name") or text_field(meta, "generateName")
    return f'pod "{namespace}/{name}"'


def _validate_create(request: AdmissionRequest, env: AdmissionEnv) -> Decision:
    pod, meta, labels, namespace = namespaced_object(request, KIND)
    waiting = None if request.is_node() else not_ready_for(env, namespace)
    if waiting is not None:
        return waiting
    if not env.store.is_managed_namespace(namespace) or request.is_node():
        # Kubelets create only the mirrors of their static pods (the Node
        # authorizer sees to it); the mirror annotation alone is anyone's.
        return ALLOW
    spec = get_map(pod, "spec", "request.object.spec")
    if spec is not None and spec.get("nodeName"):
        return deny(
            f"{_pod_name(request, namespace, meta)}: spec.nodeName is set, which would bypass "
            "its queue and the scheduler: in a managed namespace the scheduler places a pod "
            "once its queue admits it; leave spec.nodeName out (choose nodes with "
            "nodeSelector or affinity)"
        )
    problem = claims_problem(spec, "spec")
    if problem is not None:
        return deny(f"{_pod_name(request, namespace, meta)}: {problem}")
    job_pod = started_pod(env, namespace, meta, labels)
    if isinstance(job_pod, Decision):
        return job_pod
    if job_pod:
        # A pod of a Job arbiter admitted: the Job was checked (and admitted).
        return ALLOW
    decision = check_new_work(env, namespace, labels, "pod")
    if not decision.allowed or env.is_arbiter(request):
        return decision
    if not has_gate(spec, "request.object.spec"):
        # arbiter's mutating webhook gated it; a later one undid that.
        return deny(
            f"{_pod_name(request, namespace, meta)} has no {ADMISSION_GATE} scheduling gate: a "
            "pod in a managed namespace is held until its queue admits it (did another "
            "mutating webhook drop kube-arbiter's patch?)"
        )
    return decision


def _validate_update(request: AdmissionRequest, env: AdmissionEnv) -> Decision:
    new = require_object(request)
    old, old_meta, old_labels, namespace = namespaced_object(request, KIND, old=True)
    if not env.store.is_managed_namespace(namespace) or env.is_arbiter(request):
        return ALLOW
    pod = _pod_name(request, namespace, old_meta)
    old_spec = get_map(old, "spec", "request.oldObject.spec")
    new_spec = get_map(new, "spec", "request.object.spec")
    if request.sub_resource == "resize":
        return _validate_resize(pod, old_spec, new_spec)
    if request.sub_resource:
        return ALLOW
    new_meta, new_labels = get_metadata(new, "request.object")
    joined = joins_held_root(env, namespace, old_meta, new_meta)
    if joined is not None and has_gate(old_spec, "request.oldObject.spec"):
        # A held pod's gate is lifted by the unit it belongs to: a new owner
        # would make it an admitted workload's pod, uncharged.
        return deny(joins_message(pod, joined))
    queue = (old_labels or {}).get(QUEUE_LABEL, "")
    for key in (QUEUE_LABEL, POD_GROUP_LABEL):
        before, after = (old_labels or {}).get(key), (new_labels or {}).get(key)
        if before != after:
            # The queue that admitted a pod, and the group it was admitted
            # with, are settled at creation; the label is the tenant's to write.
            return deny(
                f'{pod} is in queue "{queue}": its {key} label cannot change '
                f"({brief(before, 60)} to {brief(after, 60)}); delete and recreate the pod "
                "to queue it elsewhere"
            )
    if has_gate(old_spec, "request.oldObject.spec") \
            and not has_gate(new_spec, "request.object.spec"):
        return deny(
            f'{pod} is waiting for queue "{queue}" to admit it: only '
            f"kube-arbiter may remove the {ADMISSION_GATE} scheduling gate"
        )
    return ALLOW


def _validate_resize(pod: str, old_spec: Obj | None, new_spec: Obj | None) -> Decision:
    """pods/resize may lower what a pod requests, never raise it: its queue
    was charged for the old size (raising it would be demand never admitted)."""
    try:
        before = effective_pod_requests(old_spec or {})
        after = effective_pod_requests(new_spec or {})
    except QuantityError as error:
        return deny(f"{pod}: {error}", code=422)
    raised = sorted(name for name, amount in after.items() if amount > before.get_amount(name))
    if not raised:
        return ALLOW
    shown = ", ".join(
        f"{name} {format_quantity(name, before.get_amount(name))} to "
        f"{format_quantity(name, after[name])}" for name in raised[:4])
    return deny(
        f"{pod}: pods/resize may not raise spec.containers[].resources requests in a managed "
        f"namespace ({shown}): its queue admitted it at its old size; delete and recreate the "
        "pod to queue the larger size"
    )
