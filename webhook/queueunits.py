"""QueueUnits: the unit of admission, created by the loop or by a user.

Mutating (CREATE, UPDATE): the seed's `resourceUnit` × `resourceNo`
shorthand becomes one pod set named "main"; an empty `spec.queue` is filled
by the shared resolver; the unit carries its queue as a label.

Validating: 1–8 pod sets with unique names, counts ≥ 1, 1 ≤ minCount ≤
count, valid quantities; users (not arbiter) may only reserve in an
existing, Open queue, may not change the queue or pod sets of an
admitted unit, and may not set or change `spec.consumerRef`: the unit
named by it is the one the loop admits in the consumer's stead, so only
arbiter (which creates those units) may write it.

Status (UPDATE of the status subresource): the status is arbiter's record
of admission, which a new leader trusts (a forged `Dequeued` with an
admission entry would be released). Others (admission-check controllers,
`arbiter approve|reject`) may change only the `state`, `message` and
`lastTransitionTime` of the entries of `status.admissionChecks`, and only
while the unit is Reserved.
"""

from __future__ import annotations

from typing import Any

from arbiter.api import ADMITTED_PHASES, API_GROUP, MAX_POD_SETS, QUEUE_LABEL, QUEUE_UNIT
from arbiter.core.jsonvalues import brief, json_equal
from arbiter.core.quantities import QuantityError
from arbiter.core.resources import Resources
from webhook.patch import set_label
from webhook.queueing import QUEUE_KINDS, check_open, no_queue_message, not_ready
from webhook.review import (
    ALLOW,
    AdmissionEnv,
    AdmissionRequest,
    Decision,
    Obj,
    PatchOp,
    allow,
    deny,
    get_map,
    is_int,
    namespaced_object,
    require_object,
    text_field,
)

GROUP, KIND = API_GROUP, QUEUE_UNIT.kind
SHORTHAND_POD_SET = "main"


def mutate(request: AdmissionRequest, env: AdmissionEnv) -> Decision:
    if request.operation not in ("CREATE", "UPDATE"):
        return ALLOW
    unit, meta, labels, namespace = namespaced_object(request, KIND)
    if not env.store.is_managed_namespace(namespace):
        return ALLOW
    spec = get_map(unit, "spec", "request.object.spec")
    if spec is None:
        return ALLOW  # nothing to convert; validation explains what is missing
    ops: list[PatchOp] = []
    pod_sets = spec.get("podSets")
    resource_no = spec.get("resourceNo", 1)
    resource_unit = spec.get("resourceUnit")
    # The patch repeats resourceUnit: only a flat map of quantities (anything
    # else is denied by validation, and a deep value could not be written back).
    flat_unit = isinstance(resource_unit, dict) and all(
        isinstance(v, str | int | float) for v in resource_unit.values())
    if flat_unit and not pod_sets and is_int(resource_no) and resource_no >= 1:
        pod_set = {"name": SHORTHAND_POD_SET, "count": resource_no,
                   "requests": spec["resourceUnit"]}
        ops.append({"op": "add", "path": "/spec/podSets", "value": [pod_set]})
        ops.append({"op": "remove", "path": "/spec/resourceUnit"})
        if "resourceNo" in spec:
            ops.append({"op": "remove", "path": "/spec/resourceNo"})
    queue = spec.get("queue")
    if request.operation == "CREATE" and (queue is None or queue == ""):
        queue = env.store.resolve_queue(namespace, labels)
        if queue is not None:
            ops.append({"op": "add", "path": "/spec/queue", "value": queue})
    if isinstance(queue, str) and queue:
        set_label(ops, (), meta, labels, QUEUE_LABEL, queue)
    return allow(ops)


def check_pod_sets(spec: Obj) -> list[str]:
    errors: list[str] = []
    pod_sets = spec.get("podSets")
    shorthand = spec.get("resourceUnit") is not None
    if pod_sets and shorthand:
        return ["spec: set either podSets or resourceUnit × resourceNo, not both"]
    if shorthand and not pod_sets:
        resource_no = spec.get("resourceNo", 1)
        if not is_int(resource_no) or resource_no < 1:
            errors.append(f"spec.resourceNo: {brief(resource_no)} must be an integer ≥ 1")
        _check_requests(spec.get("resourceUnit"), "spec.resourceUnit", errors)
        return errors
    if not isinstance(pod_sets, list) or not pod_sets:
        return ["spec.podSets: at least one pod set is required (or resourceUnit × resourceNo)"]
    if len(pod_sets) > MAX_POD_SETS:
        # Checking each set past the limit would only cost time.
        return [f"spec.podSets: {len(pod_sets)} pod sets, at most {MAX_POD_SETS} allowed"]
    names: set[str] = set()
    for index, pod_set in enumerate(pod_sets):
        where = f"spec.podSets[{index}]"
        if not isinstance(pod_set, dict):
            errors.append(f"{where}: must be an object")
            continue
        name = pod_set.get("name", SHORTHAND_POD_SET)
        if not isinstance(name, str) or not name:
            errors.append(f"{where}.name: must be a non-empty string")
        elif name in names:
            errors.append(f'{where}.name: "{name:.60}" is used by another pod set')
        else:
            names.add(name)
        raw_count = pod_set.get("count")
        count: int | None = raw_count if is_int(raw_count) and raw_count >= 1 else None
        if count is None:
            errors.append(f"{where}.count: {brief(raw_count)} must be an integer ≥ 1")
        min_count = pod_set.get("minCount")
        if min_count is not None:
            if not is_int(min_count) or min_count < 1:
                errors.append(f"{where}.minCount: {brief(min_count)} must be an integer ≥ 1")
            elif count is not None and min_count > count:
                errors.append(f"{where}.minCount: {min_count} exceeds count {count}")
        _check_requests(pod_set.get("requests"), f"{where}.requests", errors)
    return errors


def _check_requests(requests: Any, where: str, errors: list[str]) -> None:
    try:
        Resources.parse(requests, field=where)
    except QuantityError as error:
        errors.append(str(error))


# Same opening as mutate (operation, object, managed namespace): both hooks must
# skip exactly the same requests, and each stays readable on its own.
def validate(request: AdmissionRequest, env: AdmissionEnv) -> Decision:
    if request.operation not in ("CREATE", "UPDATE"):
        return ALLOW
    unit, meta, labels, namespace = namespaced_object(request, KIND)
    if not env.store.is_managed_namespace(namespace):
        return ALLOW
    name = request.name or text_field(meta, "name")
    if request.sub_resource:
        return _validate_status(request, env, unit, f"{namespace}/{name}")
    spec = unit.get("spec")
    if not isinstance(spec, dict):
        return deny(f'QueueUnit "{namespace}/{name}" is invalid: spec: must be an object',
                    code=422)
    errors = check_pod_sets(spec)
    queue = spec.get("queue")
    if not isinstance(queue, str) or not queue:
        errors.append("spec.queue: " + no_queue_message(namespace, "QueueUnit"))
    for key in ("priority",):
        if spec.get(key) is not None and not is_int(spec.get(key)):
            errors.append(f"spec.{key}: must be an integer")
    consumer = spec.get("consumerRef")
    if consumer is not None and not (
        isinstance(consumer, dict) and isinstance(consumer.get("kind"), str)
        and isinstance(consumer.get("name"), str)
    ):
        errors.append("spec.consumerRef: must be an object reference with kind and name")
    if errors:
        return deny(f'QueueUnit "{namespace}/{name}" is invalid: ' + "; ".join(errors),
                    code=422)
    if env.is_arbiter(request):
        return ALLOW
    if consumer is not None and not _same_consumer(request, consumer):
        return deny(f'QueueUnit "{namespace}/{name}": spec.consumerRef is set by kube-arbiter '
                    "only; leave it out of units you create", code=403)
    assert isinstance(queue, str)
    if request.operation == "UPDATE":
        return _validate_update(request, env, namespace, name, spec)
    waiting = not_ready(env, QUEUE_KINDS)
    if waiting is not None:
        return waiting
    return check_open(env, queue, namespace, labels, "QueueUnit") or ALLOW


def _same_consumer(request: AdmissionRequest, consumer: Any) -> bool:
    """An UPDATE that keeps the unit's existing consumerRef as it was."""
    if request.operation != "UPDATE":
        return False
    old_spec = require_object(request, old=True).get("spec")
    return isinstance(old_spec, dict) and json_equal(consumer, old_spec.get("consumerRef"))


def _validate_update(request: AdmissionRequest, env: AdmissionEnv, namespace: str,
                     name: str, spec: Obj) -> Decision:
    old = require_object(request, old=True)
    status = old.get("status")
    phase = status.get("phase") if isinstance(status, dict) else None
    if not isinstance(phase, str):
        phase = None  # a phase that is not a string is no admitted phase
    old_spec = old.get("spec") if isinstance(old.get("spec"), dict) else {}
    assert isinstance(old_spec, dict)
    if phase in ADMITTED_PHASES:
        for key in ("queue", "podSets"):
            if not json_equal(spec.get(key), old_spec.get(key)):
                return deny(
                    f'QueueUnit "{namespace}/{name}" is admitted ({phase}): spec.{key} '
                    "cannot change"
                )
        return ALLOW
    if not json_equal(spec.get("queue"), old_spec.get("queue")):
        return check_open(env, str(spec.get("queue")), namespace, None, "QueueUnit") or ALLOW
    return ALLOW


# What a check's controller may set on its entry of status.admissionChecks.
CHECK_ENTRY_FIELDS = frozenset({"state", "message", "lastTransitionTime"})


def _validate_status(request: AdmissionRequest, env: AdmissionEnv, unit: Obj,
                     key: str) -> Decision:
    if request.sub_resource != "status" or env.is_arbiter(request):
        return ALLOW
    refused = _foreign_status_change(require_object(request, old=True).get("status"),
                                     unit.get("status"))
    if refused is None:
        return ALLOW
    return deny(f'QueueUnit "{key}": {refused}; the rest of the status is '
                "kube-arbiter's record of admission", code=403)


def _foreign_status_change(old: Any, new: Any) -> str | None:
    """Why a status change by someone other than arbiter is refused, or None."""
    old = old if isinstance(old, dict) else {}
    new = new if isinstance(new, dict) else {}
    changed = [k for k in old.keys() | new.keys()
               if k != "admissionChecks" and not json_equal(old.get(k), new.get(k))]
    if changed:
        return (f"status.{min(changed)[:60]} may be written by kube-arbiter only "
                "(others may set status.admissionChecks[].state and .message)")
    before, after = old.get("admissionChecks"), new.get("admissionChecks")
    if json_equal(before, after):
        return None
    if old.get("phase") != "Reserved":
        return "status.admissionChecks may change only while the unit is Reserved"
    if not isinstance(before, list) or not isinstance(after, list) or len(before) != len(after):
        return "status.admissionChecks: entries may not be added or removed"
    for index, (was, now) in enumerate(zip(before, after, strict=True)):
        if not isinstance(was, dict) or not isinstance(now, dict):
            return f"status.admissionChecks[{index}]: must be an object"
        for key in was.keys() | now.keys():
            if key not in CHECK_ENTRY_FIELDS and not json_equal(was.get(key), now.get(key)):
                return f"status.admissionChecks[{index}].{str(key)[:60]} cannot change"
    return None
