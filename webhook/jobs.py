"""batch/v1 Jobs: created suspended in their queue, unsuspended only by arbiter.

Mutating (CREATE): resolve the queue, label the Job and its pod template
(so the Job's pods arrive labelled and are not gated again) and set
`spec.suspend: true`.

Validating: CREATE is denied like a pod without a usable queue, or when
its `arbiter.dev/min-parallelism` (partial admission, DESIGN §12) is not a
whole number from 1 to its parallelism. UPDATE of
a Job arbiter manages (it carries the queue label) may not remove the
label, may not move an admitted Job to another queue, may only move a
waiting Job to an existing, Open queue, and may not flip `spec.suspend`
from true to false unless arbiter asks or the Job's QueueUnit
(`job-<name>`) is admitted.
"""

from __future__ import annotations

from arbiter.api import (
    ADMITTED_PHASES,
    MIN_PARALLELISM_ANNOTATION,
    QUEUE_LABEL,
    job_unit_name,
)
from webhook.patch import set_label
from webhook.queueing import check_new_work, check_open, not_ready
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
    if not env.store.is_managed_namespace(namespace):
        return ALLOW
    queue = env.store.resolve_queue(namespace, labels)
    if queue is None:
        return ALLOW  # the validating webhook denies it with the reason
    ops: list[PatchOp] = []
    set_label(ops, (), meta, labels, QUEUE_LABEL, queue)
    if spec is None:
        ops.append({"op": "add", "path": "/spec", "value": {"suspend": True}})
        return allow(ops)
    template = get_map(spec, "template", "request.object.spec.template")
    if template is not None:
        template_meta, template_labels = get_metadata(template, "request.object.spec.template")
        set_label(ops, ("spec", "template"), template_meta, template_labels, QUEUE_LABEL, queue)
    if not _suspended(spec, "request.object.spec"):
        ops.append({"op": "add", "path": "/spec/suspend", "value": True})
    return allow(ops)


def validate(request: AdmissionRequest, env: AdmissionEnv) -> Decision:
    if request.operation == "CREATE":
        job, meta, labels, namespace = namespaced_object(request, KIND)
        spec = get_map(job, "spec", "request.object.spec")  # checked everywhere, as in mutate
        if not env.store.is_managed_namespace(namespace):
            return ALLOW
        problem = min_parallelism_problem(meta, spec)
        if problem is not None:
            return deny(problem)
        return check_new_work(env, namespace, labels, "Job")
    if request.operation == "UPDATE":
        return _validate_update(request, env)
    return ALLOW


def _validate_update(request: AdmissionRequest, env: AdmissionEnv) -> Decision:
    old, old_meta, old_labels, namespace = namespaced_object(request, KIND, old=True)
    old_spec = get_map(old, "spec", "request.oldObject.spec")
    new = require_object(request)
    _, new_labels = get_metadata(new, "request.object")
    new_spec = get_map(new, "spec", "request.object.spec")
    old_queue = (old_labels or {}).get(QUEUE_LABEL)
    if not old_queue or not env.store.is_managed_namespace(namespace):
        return ALLOW  # not a Job arbiter holds
    if env.is_arbiter(request):
        return ALLOW
    name = request.name or text_field(old_meta, "name")
    waiting = not_ready(env, ("Queue", "Namespace", "QueueUnit"))
    if waiting is not None:
        return waiting
    unit = env.store.units.get(f"{namespace}/{job_unit_name(name)}")
    old_suspended = _suspended(old_spec, "request.oldObject.spec")
    admitted = (unit is not None and unit.phase in ADMITTED_PHASES) or not old_suspended
    new_queue = (new_labels or {}).get(QUEUE_LABEL)
    job = f'Job "{namespace}/{name}"'
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
    if old_suspended and not _suspended(new_spec, "request.object.spec") and not (
        unit is not None and unit.phase in ADMITTED_PHASES
    ):
        return deny(
            f'{job} is waiting for queue "{old_queue}" to admit it: only kube-arbiter may set '
            "spec.suspend to false"
        )
    return ALLOW
