"""batch/v1 Jobs: created suspended in their queue, unsuspended only by arbiter.

Mutating (CREATE): resolve the queue, label the Job and its pod template
(so the Job's pods arrive labelled and are not gated again) and set
`spec.suspend: true` (also when no queue resolves: the validating call may
reach another replica, whose cache may know the Queue). Until the cache
has listed Queues and Namespaces, both webhooks answer CREATE with a
retryable denial (`queueing.not_ready_for`), never a guess.

Validating: CREATE is denied like a pod without a usable queue, when
its `arbiter.dev/min-parallelism` (partial admission, DESIGN §12) is not a
whole number from 1 to its parallelism, when its pod template claims DRA
devices (`resourceClaims`: not charged yet), and, from anyone but
arbiter, when it arrives unsuspended (a later mutating webhook dropped
arbiter's patch). UPDATE of a Job arbiter manages (it carries the queue
label) may not remove the label, may not move an admitted Job to another
queue, may only move a waiting Job to an existing, Open queue, may not
flip `spec.suspend` from true to false unless arbiter asks or the Job's
QueueUnit (`job-<name>`) is admitted for this Job's uid, and may not raise
`spec.parallelism` once admitted (lowering is fine; a waiting Job may
change freely and the loop queues its new size).

A child Job (its controller chain reaches a held workload by uid, say a
JobSet's: `webhook.held.held_root`) has no unit of its own: its root's
unit decides. It carries the root's queue; it is created suspended unless
the root's unit is admitted (then its controller creates or resumes it),
may arrive unsuspended only then, and its controller may unsuspend it only
then. Its queue was checked with its root's, so it is not checked again.
It may not grow (parallelism, completions, requests) by an UPDATE, while
its root waits either: its root's unit counts its pods (`webhook.children`).
No Job may take a held workload as its controller by an UPDATE.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

from arbiter.cache.convert import ConversionError, job_from_api
from arbiter.cache.fastpath import job_token
from arbiter.cache.workloads import WorkloadRecord
from arbiter.core.api import MIN_PARALLELISM_ANNOTATION, QUEUE_LABEL
from arbiter.core.fastpath import FAST_PATH_ANNOTATION
from webhook.children import child_problem
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
from webhook.queueing import check_new_work, check_open, not_ready, not_ready_for
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
    get_map,
    get_metadata,
    is_int,
    namespaced_object,
    require_object,
    text_field,
)

GROUP, KIND = "batch", "Job"


def _suspended(spec: Obj | None, where: str) -> bool:
    value = None if spec is None else spec.get("suspend")
    if value is not None and not isinstance(value, bool):
        raise MalformedReview(f"{where}.suspend must be a boolean")
    return bool(value)


def min_parallelism_problem(meta: Obj | None, spec: Obj | None) -> str | None:
    """Why the Job's partial-admission annotation is unusable; None when it
    is fine or absent. The loop gives the unit's pod set this minCount."""
    annotations = None if meta is None else meta.get("annotations")
    text = annotations.get(MIN_PARALLELISM_ANNOTATION) \
        if isinstance(annotations, dict) else None
    if text is None:
        return None
    parallelism = 1 if spec is None else spec.get("parallelism", 1)
    if parallelism is None:
        parallelism = 1
    if not isinstance(parallelism, int) or isinstance(parallelism, bool):
        return None  # the apiserver's own validation says what is wrong
    shown = str(text)[:32]
    whole = isinstance(text, str) and text.isascii() and text.isdigit()
    if not whole or not 1 <= int(text) <= parallelism:
        return (f'annotation {MIN_PARALLELISM_ANNOTATION}: "{shown}" must be a whole number '
                f"from 1 to the Job's parallelism ({parallelism})")
    return None


def mutate(request: AdmissionRequest, env: AdmissionEnv) -> Decision:
    if request.operation != "CREATE":
        return ALLOW
    job, meta, labels, namespace = namespaced_object(request, KIND)
    spec = get_map(job, "spec", "request.object.spec")
    waiting = not_ready_for(env, namespace)
    if waiting is not None:
        return waiting
    if not env.store.is_managed_namespace(namespace):
        return ALLOW
    root = held_root(env, namespace, meta)
    queue = root.queue if root is not None else env.store.resolve_queue(namespace, labels)
    # A child of an admitted workload is created or resumed by its controller.
    # Held even without a queue here: the validating call may reach another
    # replica whose cache already has the Queue (it then admits a held Job).
    hold = root is None or not unit_admitted(env, root)
    ops: list[PatchOp] = []
    if queue is not None:
        set_label(ops, (), meta, labels, QUEUE_LABEL, queue)
    if spec is None:
        if hold:
            ops.append({"op": "add", "path": "/spec", "value": {"suspend": True}})
        return allow(ops)
    template = get_map(spec, "template", "request.object.spec.template")
    if template is not None and queue is not None:
        template_meta, template_labels = get_metadata(template, "request.object.spec.template")
        set_label(ops, ("spec", "template"), template_meta, template_labels, QUEUE_LABEL, queue)
    fast = _admit_on_create(request, env, job, meta, labels, namespace, queue) \
        if hold and root is None and queue is not None else None
    if fast is not None:
        ops += cast(list[PatchOp], fast)
        return allow(ops)
    annotations = None if meta is None else meta.get("annotations")
    if isinstance(annotations, dict) and FAST_PATH_ANNOTATION in annotations:
        # Only arbiter's webhook writes a token, and only on the fast path.
        ops.append({"op": "remove",
                    "path": "/metadata/annotations/" + FAST_PATH_ANNOTATION.replace("/", "~1")})
    if not _suspended(spec, "request.object.spec") and hold:
        ops.append({"op": "add", "path": "/spec/suspend", "value": True})
    return allow(ops)


def _admit_on_create(request: AdmissionRequest, env: AdmissionEnv, job: Obj, meta: Obj | None,
                     labels: Mapping[str, str] | None, namespace: str,
                     queue: str) -> list[dict[str, Any]] | None:
    """The leader's fast path (DESIGN §16): ops that let the Job through
    admitted, or None. Asked only of work the validating webhook will
    let in (a denied Job would hold its reservation until it expires),
    never for a dry run."""
    if env.admit_on_create is None or request.dry_run:
        return None
    spec = get_map(job, "spec", "request.object.spec")
    if min_parallelism_problem(meta, spec) or _template_problem(spec) \
            or not check_new_work(env, namespace, labels, "Job").allowed:
        return None
    name = request.name or text_field(meta, "name")
    return env.admit_on_create(namespace, name, queue, job)


def validate(request: AdmissionRequest, env: AdmissionEnv) -> Decision:
    if request.operation == "CREATE":
        return _validate_create(request, env)
    if request.operation == "UPDATE":
        return _validate_update(request, env)
    return ALLOW


def _validate_create(request: AdmissionRequest, env: AdmissionEnv) -> Decision:
    job, meta, labels, namespace = namespaced_object(request, KIND)
    spec = get_map(job, "spec", "request.object.spec")  # checked everywhere, as in mutate
    waiting = not_ready_for(env, namespace)
    if waiting is not None:
        return waiting
    if not env.store.is_managed_namespace(namespace):
        return ALLOW
    root = held_root(env, namespace, meta)
    if root is not None:
        return _validate_child_create(request, env, root, meta, spec)
    problem = min_parallelism_problem(meta, spec) or _template_problem(spec)
    if problem is not None:
        return deny(problem)
    decision = check_new_work(env, namespace, labels, "Job")
    if not decision.allowed or env.is_arbiter(request):
        return decision
    if not _suspended(spec, "request.object.spec") \
            and not _admitted_at_creation(env, job, labels):
        # arbiter's mutating webhook suspended it; a later one undid that.
        name = request.name or text_field(meta, "name")
        return deny(
            f'Job "{namespace}/{name}" has spec.suspend false: a Job in a managed namespace '
            "is created suspended and only kube-arbiter starts it once its queue admits it "
            "(did another mutating webhook drop kube-arbiter's patch?)"
        )
    return decision


def _admitted_at_creation(env: AdmissionEnv, job: Obj,
                          labels: Mapping[str, str] | None) -> bool:
    """Whether arbiter's webhook let this Job through admitted (DESIGN §16):
    its token verifies for this namespace, name, demand and queue, and the
    Job is created within the token's life."""
    if env.fast_path_key is None:
        return False
    try:
        record = job_from_api(job)
    except ConversionError:
        return False
    token = job_token(env.fast_path_key, record)
    return token is not None and token.queue == (labels or {}).get(QUEUE_LABEL)


def _token_of(meta: Obj | None) -> object:
    annotations = None if meta is None else meta.get("annotations")
    return annotations.get(FAST_PATH_ANNOTATION) if isinstance(annotations, dict) else None


def _validate_child_create(request: AdmissionRequest, env: AdmissionEnv, root: WorkloadRecord,
                           meta: Obj | None, spec: Obj | None) -> Decision:
    """A Job of a held workload: no unit, no queue check of its own; it may
    run only when its root's unit is admitted."""
    problem = _template_problem(spec)
    if problem is not None:
        return deny(problem)
    if env.is_arbiter(request) or _suspended(spec, "request.object.spec") \
            or unit_admitted(env, root):
        return ALLOW
    name = request.name or text_field(meta, "name") or text_field(meta, "generateName")
    return deny(
        f'Job "{root.namespace}/{name}" of {root.kind} "{root.key}" has spec.suspend false, '
        f'but queue "{root.queue}" has not admitted the {root.kind} yet: its Jobs are created '
        f"suspended until kube-arbiter starts the {root.kind}"
    )


def _template_problem(spec: Obj | None) -> str | None:
    """What the pod template may not carry (DRA claims), or None."""
    template = None if spec is None else get_map(spec, "template",
                                                 "request.object.spec.template")
    pod_spec = None if template is None else get_map(template, "spec",
                                                     "request.object.spec.template.spec")
    return claims_problem(pod_spec, "spec.template.spec")


def _parallelism(spec: Obj | None) -> int | None:
    value = 1 if spec is None else spec.get("parallelism", 1)
    return value if is_int(value) else None


def _validate_update(request: AdmissionRequest, env: AdmissionEnv) -> Decision:
    old, old_meta, old_labels, namespace = namespaced_object(request, KIND, old=True)
    old_spec = get_map(old, "spec", "request.oldObject.spec")
    new = require_object(request)
    new_meta, new_labels = get_metadata(new, "request.object")
    new_spec = get_map(new, "spec", "request.object.spec")
    old_queue = (old_labels or {}).get(QUEUE_LABEL)
    if not old_queue or not env.store.is_managed_namespace(namespace):
        return ALLOW  # not a Job arbiter holds
    if env.is_arbiter(request):
        return ALLOW
    name = request.name or text_field(old_meta, "name")
    if _token_of(old_meta) != _token_of(new_meta):
        return deny(f'Job "{namespace}/{name}": metadata.annotations.{FAST_PATH_ANNOTATION} '
                    "is written by kube-arbiter only (it records an admission at creation)")
    waiting = not_ready(env, ("Queue", "Namespace", "QueueUnit"))
    if waiting is not None:
        return waiting
    job = f'Job "{namespace}/{name}"'
    joined = joins_held_root(env, namespace, old_meta, new_meta)
    if joined is not None:
        return deny(joins_message(job, joined))
    root = held_root(env, namespace, old_meta, "request.oldObject.metadata")
    if root is not None:
        problem = child_problem(env, root, KIND, old, new,
                                controller_ref(old_meta, "request.oldObject.metadata"))
        if problem is not None:
            return deny(f"{job}: {problem}")
    # A child Job runs when its root's unit is admitted (it has none of its own).
    unit_ok = unit_admitted(env, root) if root is not None else \
        admitted_job_unit(env, namespace, text_field(old_meta, "uid")) is not None
    old_suspended = _suspended(old_spec, "request.oldObject.spec")
    new_suspended = _suspended(new_spec, "request.object.spec")
    admitted = unit_ok or not old_suspended
    new_queue = (new_labels or {}).get(QUEUE_LABEL)
    if not new_queue:
        return deny(
            f"{job} belongs to queue \"{old_queue}\": the {QUEUE_LABEL} label cannot be "
            "removed (set it to another queue instead, while the Job waits)"
        )
    if new_queue != old_queue:
        if admitted:
            return deny(
                f'{job} was admitted by queue "{old_queue}" and cannot move to queue '
                f'"{new_queue}"; delete and recreate it to run in another queue'
            )
        denial = check_open(env, new_queue, namespace, new_labels, "Job")
        if denial is not None:
            return denial
    if old_suspended and not new_suspended and not unit_ok:
        if root is not None:
            return deny(
                f'{job} belongs to {root.kind} "{root.key}", which is waiting for queue '
                f'"{root.queue}" to admit it: its Jobs may be unsuspended only once '
                f"kube-arbiter starts the {root.kind}"
            )
        return deny(
            f'{job} is waiting for queue "{old_queue}" to admit it: only kube-arbiter may set '
            "spec.suspend to false"
        )
    before, after = _parallelism(old_spec), _parallelism(new_spec)
    if admitted and before is not None and after is not None and after > before:
        # The queue was charged for `before` pods; a waiting (suspended) Job
        # may grow freely: the loop re-reads its demand before admitting it.
        return deny(
            f"{job} was admitted by queue \"{old_queue}\" for spec.parallelism {before}: "
            f"spec.parallelism cannot be raised ({after}) after admission; lower it, or "
            "delete and recreate the Job to queue the larger size"
        )
    return ALLOW
