"""Workloads of the optional integrations (DESIGN §14): JobSet, StatefulSet,
LeaderWorkerSet, Deployment; one generic decision, read from each kind's
`Integration`. A kind whose integration is not switched on
(`--integrations`: `ClusterStore.integrations`) passes untouched.

A child (its controller chain reaches a held workload by uid: an LWS's
StatefulSets, a TrainJob's JobSet; `webhook.held.held_root`) passes: it has
no unit of its own, its root's decides; a child held by suspend is created
suspended while its root is not admitted (as a JobSet's Jobs are). So does
an object its kind does not hold (`Integration.holds`: a RayJob on an
existing RayCluster) pass untouched; a held one may not be changed into one.

Mutating (CREATE, managed namespace): resolve the queue as for a Job, label
the workload and every pod template (a JobSet's Job templates too, so its
Jobs and pods carry the queue), and set the suspend field true for a kind
held by it (JobSet; also when no queue resolves, and a retryable denial
before the cache has listed Queues and Namespaces, as for a Job). A
gate-held kind (StatefulSet, LWS) needs no more: its pods arrive gated
like every pod in a managed namespace. A Deployment
(`per_pod`) holds nothing: its pods, labelled, are queued one by one.

Validating: CREATE is denied without a usable queue (as a Job), with DRA
claims in a pod template, and, from anyone but arbiter, unsuspended when
the kind is held by suspend. UPDATE of a managed one (it carries the queue
label) may not remove the label, may not move an admitted one to another
queue (admitted: one of its units is, or a suspend-held one runs), may move
a waiting one only to a usable queue, may flip suspend from true to false
only when its unit is admitted (arbiter itself passes), may not add DRA
claims, and may not take a held workload as its controller. Replica
changes are allowed: the loop re-holds and requeues a changed workload.
A child, created or changed by anyone but arbiter, may not ask for more
pods, or bigger ones, than its root's spec does (`webhook.children`).
"""

from __future__ import annotations

from typing import Any

from arbiter.cache.workloads import WorkloadRecord, WorkloadUnit
from arbiter.core.api import QUEUE_LABEL
from arbiter.core.quantities import QuantityError
from arbiter.integrations import BY_KIND, OPTIONAL, Integration
from arbiter.integrations.base import Path, dig
from arbiter.integrations.declared import DeclaredIntegration
from webhook.children import child_problem, where
from webhook.held import (
    claims_problem,
    controller_ref,
    held_root,
    joins_held_root,
    joins_message,
    workload_admitted,
)
from webhook.patch import pointer, set_label
from webhook.queueing import check_new_work, check_open, not_ready, not_ready_for
from webhook.review import (
    ALLOW,
    AdmissionEnv,
    AdmissionRequest,
    Decision,
    MalformedReview,
    Namespaced,
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


def _templates(integration: Integration, obj: Obj,
               paths: tuple[Path, ...]) -> list[tuple[Path, Obj]]:
    """The templates at `paths` that are there (a missing one is the CRD's
    or the apiserver's to refuse); one of the wrong type is malformed."""
    found: list[tuple[Path, Obj]] = []
    for path in paths:
        value = dig(obj, path)
        if value is None:
            continue
        if not isinstance(value, dict):
            raise MalformedReview(f"{where(path)} must be an object")
        found.append((path, value))
    return found


def _suspended(integration: Integration, obj: Obj, base: str) -> bool:
    value = dig(obj, integration.suspend_path)
    if value is not None and not isinstance(value, bool):
        raise MalformedReview(f"{where(integration.suspend_path, base)} must be a boolean")
    return value is True


def _suspend_ops(integration: Integration, obj: Obj) -> list[PatchOp]:
    """Set the suspend field true, adding the missing parents whole (an
    "add" into a missing member fails on the apiserver)."""
    path = integration.suspend_path
    for depth in range(len(path) - 1):
        parent = dig(obj, path[: depth + 1])
        if parent is None:
            value: Any = True
            for step in reversed(path[depth + 1:]):
                value = {step: value}
            return [{"op": "add", "path": pointer(*map(str, path[: depth + 1])),
                     "value": value}]
        if not isinstance(parent, dict):
            raise MalformedReview(f"{where(path[: depth + 1])} must be an object")
    return [{"op": "add", "path": pointer(*map(str, path)), "value": True}]


def _enabled(request: AdmissionRequest, env: AdmissionEnv) -> Integration | None:
    """The integration reviewed, when it is switched on."""
    integration = BY_KIND.get(request.kind)
    if integration is None or all(i.kind != integration.kind for i in env.store.integrations):
        return None
    return integration


def _subject(request: AdmissionRequest, integration: Integration, target: Namespaced) -> str:
    name = request.name or text_field(target.meta, "name") or \
        text_field(target.meta, "generateName")
    return f'{integration.kind} "{target.namespace}/{name}"'


def mutate(request: AdmissionRequest, env: AdmissionEnv) -> Decision:
    integration = _enabled(request, env)
    if integration is None or request.operation != "CREATE":
        return ALLOW
    obj, meta, labels, namespace = namespaced_object(request, integration.kind)
    waiting = not_ready_for(env, namespace)
    if waiting is not None:
        return waiting
    if not env.store.is_managed_namespace(namespace) or not integration.holds(obj):
        return ALLOW
    root = held_root(env, namespace, meta)
    if root is not None:
        return allow(_child_suspend_ops(env, integration, obj, root))
    queue = env.store.resolve_queue(namespace, labels)
    ops: list[PatchOp] = []
    if queue is not None:  # held either way (`jobs.mutate` says why)
        set_label(ops, (), meta, labels, QUEUE_LABEL, queue)
        for path, template in _templates(integration, obj, integration.labelled(obj)):
            template_meta, template_labels = get_metadata(template, where(path))
            set_label(ops, tuple(map(str, path)), template_meta, template_labels,
                      QUEUE_LABEL, queue)
    if integration.hold == "suspend" and not _suspended(integration, obj, "request.object"):
        ops.extend(_suspend_ops(integration, obj))
    return allow(ops)


def _child_suspend_ops(env: AdmissionEnv, integration: Integration, obj: Obj,
                       root: WorkloadRecord) -> list[PatchOp]:
    """A suspend-held child (a TrainJob's JobSet) is created suspended while
    its root is not admitted, as a JobSet's Jobs are: it has no unit of its
    own, and its controller unsuspends it once the root runs. Only the child
    that spells out its root's pods (`units_from`): a RayJob's RayCluster is
    made once the RayJob runs and nothing would unsuspend it."""
    if integration.hold != "suspend" or root.integration.units_from != integration.kind \
            or workload_admitted(env, root) or _suspended(integration, obj, "request.object"):
        return []
    return _suspend_ops(integration, obj)


def _claims(integration: Integration, obj: Obj) -> str | None:
    """The first pod template that claims DRA devices, as a denial's reason."""
    for path, template in _templates(integration, obj, integration.templates(obj)):
        problem = claims_problem(get_map(template, "spec", where((*path, "spec"))),
                                 where((*path, "spec"), "")[1:])
        if problem is not None:
            return problem
    return None


def validate(request: AdmissionRequest, env: AdmissionEnv) -> Decision:
    integration = _enabled(request, env)
    if integration is None:
        return _child_of_kind_off(request, env) or _declared_off(request, env)
    if request.operation == "CREATE":
        return _validate_create(request, env, integration)
    if request.operation == "UPDATE":
        return _validate_update(request, env, integration)
    return ALLOW


def _as_child(request: AdmissionRequest, env: AdmissionEnv, integration: Integration,
              target: Namespaced, root: WorkloadRecord, old: Obj | None, new: Obj) -> Decision:
    """A held workload's child (`target`: the object as it was, on UPDATE)
    may not ask for more than its workload (`webhook.children`)."""
    meta_field = "request.oldObject.metadata" if old is not None else "request.object.metadata"
    problem = child_problem(env, root, integration.kind, old, new,
                            controller_ref(target.meta, meta_field))
    if problem is None:
        return ALLOW
    return deny(f"{_subject(request, integration, target)}: {problem}")


def _child_of_kind_off(request: AdmissionRequest, env: AdmissionEnv) -> Decision | None:
    """A kind queued on its own only when switched on is a held workload's
    child all the same when its root's integration is on (an LWS's
    StatefulSets with `--integrations lws`): it may not grow past its root.
    None: not such a child."""
    integration = BY_KIND.get(request.kind)
    if integration is None or integration not in OPTIONAL \
            or request.operation not in ("CREATE", "UPDATE"):
        return None
    update = request.operation == "UPDATE"
    target = namespaced_object(request, integration.kind, old=update)
    if not env.store.is_managed_namespace(target.namespace) or env.is_arbiter(request):
        return None
    root = held_root(env, target.namespace, target.meta,
                     "request.oldObject.metadata" if update else "request.object.metadata")
    if root is None:
        return None
    new = require_object(request) if update else target.obj
    return _as_child(request, env, integration, target, root, target.obj if update else None,
                     new)


def _declared_off(request: AdmissionRequest, env: AdmissionEnv) -> Decision:
    """A declared kind not switched on (its CRD not checked yet, or refused)
    is not created in a managed namespace: it would run unqueued."""
    integration = BY_KIND.get(request.kind)
    if not isinstance(integration, DeclaredIntegration) or request.operation != "CREATE":
        return ALLOW
    target = namespaced_object(request, integration.kind)
    if not env.store.is_managed_namespace(target.namespace):
        return ALLOW
    why = env.store.declared_off.get(integration.kind, "its CRD is not checked yet")
    return deny(f"{_subject(request, integration, target)}: kube-arbiter's declaration of "
                f"{integration.kind} is not switched on ({why}); retry later or ask the "
                "cluster admin")


def _validate_create(request: AdmissionRequest, env: AdmissionEnv,
                     integration: Integration) -> Decision:
    target = namespaced_object(request, integration.kind)
    obj, meta, labels, namespace = target
    waiting = not_ready_for(env, namespace)
    if waiting is not None:
        return waiting
    if not env.store.is_managed_namespace(namespace) or not integration.holds(obj):
        return ALLOW
    subject = _subject(request, integration, target)
    root = held_root(env, namespace, meta)
    if root is not None:
        if _child_suspend_ops(env, integration, obj, root):
            return deny(f'{subject} belongs to {root.kind} "{root.key}", which is waiting for '
                        f'queue "{root.queue}": it is created suspended until kube-arbiter '
                        f"starts the {root.kind}")
        if env.is_arbiter(request):
            return ALLOW
        return _as_child(request, env, integration, target, root, None, obj)
    problem = _claims(integration, obj) or _unreadable(integration, obj)
    if problem is not None:
        return deny(f"{subject}: {problem}")
    decision = check_new_work(env, namespace, labels, integration.kind)
    if not decision.allowed or env.is_arbiter(request):
        return decision
    if integration.hold == "suspend" and not _suspended(integration, obj, "request.object"):
        field = where(integration.suspend_path, "")[1:]
        return deny(
            f"{subject} has {field} false: a {integration.kind} in a managed namespace is "
            "created suspended and only kube-arbiter starts it once its queue admits it "
            "(did another mutating webhook drop kube-arbiter's patch?)"
        )
    return decision


def _unreadable(integration: Integration, obj: Obj) -> str | None:
    """Why the loop could not make its units from the spec (it would wait
    suspended or gated for ever, unexplained); None when it can."""
    if integration.per_pod or integration.units_from:
        return None  # no units, or none its own spec can say (a TrainJob's are its JobSet's)
    try:
        if integration.units(obj) is not None:
            return None
    except QuantityError as error:
        return f"a pod template's resources: {error}"
    return f"kube-arbiter queues a {integration.kind} with {integration.readable}"


def _as_record(env: AdmissionEnv, integration: Integration, old: Obj, meta: Obj | None,
               namespace: str) -> WorkloadRecord:
    """The workload as the apiserver holds it (`old`): its uid, whether it
    is suspended, and its units' suffixes from its spec (the cache's record
    of that uid when the spec does not read: a bad quantity)."""
    name, uid = text_field(meta, "name"), text_field(meta, "uid")
    try:
        specs = integration.units(old)
    except QuantityError:
        specs = None
    units: tuple[WorkloadUnit, ...] | None
    if specs is None:
        cached = env.store.workloads.get(integration.kind, {}).get(f"{namespace}/{name}")
        units = cached.units if cached is not None and cached.uid == uid else None
    else:
        units = tuple(WorkloadUnit(spec.suffix, ()) for spec in specs)
    return WorkloadRecord(kind=integration.kind, uid=uid, namespace=namespace, name=name,
                          suspended=_suspended(integration, old, "request.oldObject"),
                          units=units)


def _validate_update(request: AdmissionRequest, env: AdmissionEnv,
                     integration: Integration) -> Decision:
    target = namespaced_object(request, integration.kind, old=True)
    old, old_meta, old_labels, namespace = target
    new = require_object(request)
    new_meta, new_labels = get_metadata(new, "request.object")
    old_queue = (old_labels or {}).get(QUEUE_LABEL)
    if not env.store.is_managed_namespace(namespace) or env.is_arbiter(request):
        return ALLOW
    # A child (an LWS's StatefulSets carry no queue label of their own).
    root = held_root(env, namespace, old_meta, "request.oldObject.metadata")
    if not old_queue and root is None:
        return ALLOW
    waiting = not_ready(env, ("Queue", "Namespace", "QueueUnit"))
    if waiting is not None:
        return waiting
    subject = _subject(request, integration, target)
    joined = joins_held_root(env, namespace, old_meta, new_meta)
    if joined is not None:
        return deny(joins_message(subject, joined))
    if root is not None:
        # No unit of its own: it may not ask for more than its root does.
        return _as_child(request, env, integration, target, root, old, new)
    if integration.holds(old) and not integration.holds(new):
        # Its unit would vanish while its pods (admitted or not) stay.
        return deny(f'{subject} belongs to queue "{old_queue}": it cannot be changed to '
                    f"{integration.unheld}; delete and recreate it")
    record = _as_record(env, integration, old, old_meta, namespace)
    admitted = workload_admitted(env, record)
    new_queue = (new_labels or {}).get(QUEUE_LABEL)
    if not new_queue:
        return deny(
            f'{subject} belongs to queue "{old_queue}": the {QUEUE_LABEL} label cannot be '
            f"removed (set it to another queue instead, while the {integration.kind} waits)"
        )
    if new_queue != old_queue:
        if admitted:
            return deny(
                f'{subject} was admitted by queue "{old_queue}" and cannot move to queue '
                f'"{new_queue}"; delete and recreate it to run in another queue'
            )
        denial = check_open(env, new_queue, namespace, new_labels, integration.kind)
        if denial is not None:
            return denial
    if integration.hold == "suspend" and _suspended(integration, old, "request.oldObject") \
            and not _suspended(integration, new, "request.object") and not admitted:
        # Suspended before, so `admitted` means one of its units is.
        return deny(
            f'{subject} is waiting for queue "{old_queue}" to admit it: only kube-arbiter may '
            f"set {where(integration.suspend_path, '')[1:]} to false"
        )
    problem = _claims(integration, new)
    return deny(f"{subject}: {problem}") if problem is not None else ALLOW
