"""QueueUnits: the unit of admission, created by the loop or by a user.

Mutating (CREATE, UPDATE): the seed's `resourceUnit` × `resourceNo`
shorthand becomes one pod set named "main"; an empty `spec.queue` is filled
by the shared resolver; the unit carries its queue as a label.

Validating: 1–8 pod sets with unique names, counts ≥ 1, 1 ≤ minCount ≤
count, valid quantities; users (not arbiter) may only reserve in an
existing, Open queue, may not change the queue or pod sets of an
admitted unit, and may not set or change `spec.consumerRef`: the unit
named by it is the one the loop admits in the consumer's stead, so only
arbiter (which creates those units) may write it. Users may not create
units under the loop's names (`job-`, `pod-`, `group-`, `jobset-`, `sts-`,
`lws-`), nor change any of the spec of a unit the loop made (one with a
consumerRef or a loop name).

Status (UPDATE of the status subresource): the status is arbiter's record
of admission, which a new leader trusts (a forged `Dequeued` with an
admission entry would be released). Others (admission-check controllers,
`arbiter approve|reject`) may change only the `state`, `message` and
`lastTransitionTime` of the entries of `status.admissionChecks`, and only
while the unit is Reserved; `lastTransitionTime` only together with the
entry's state and never to a time ahead of now (it starts a check's
timeout: a time far ahead would disable it). Which entries a user may
answer at all is RBAC's (verb `approve` on `admissionchecks`, named):
the ValidatingAdmissionPolicy in manifests/approvals.yaml.
"""

from __future__ import annotations

import time
from typing import Any

from arbiter.core.api import (
    ADMITTED_PHASES,
    ADMITTED_STATUS_ANNOTATION,
    API_GROUP,
    MAX_POD_SETS,
    QUEUE_LABEL,
    QUEUE_UNIT,
    group_unit_name,
    job_unit_name,
    parse_rfc3339,
    pod_unit_name,
    unit_name,
)
from arbiter.core.jsonvalues import brief, json_equal
from arbiter.core.quantities import QuantityError
from arbiter.core.resources import Resources
from arbiter.integrations import OPTIONAL
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
# The names the loop gives the units it makes ("job-", "pod-", "group-", and
# a held workload's: "jobset-", "sts-", "lws-"): the webhook and the extender
# find a consumer's unit by them, so a user's reservation may not take one.
LOOP_PREFIXES: tuple[str, ...] = (
    *(name("") for name in (job_unit_name, pod_unit_name, group_unit_name)),
    *(unit_name(i.prefix, "") for i in OPTIONAL if not i.per_pod))


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
    refused = _admitted_status_problem(request, meta) or _loop_unit_problem(request, name, spec)
    if refused is not None:
        return deny(f'QueueUnit "{namespace}/{name}": {refused}', code=403)
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


def _admitted_status_problem(request: AdmissionRequest, meta: Obj | None) -> str | None:
    """A unit the loop created admitted records that in an annotation the
    cache reads as its status (DESIGN §16): nobody else may set or change it."""
    def recorded(obj: Obj | None) -> Any:
        annotations = obj.get("annotations") if isinstance(obj, dict) else None
        return annotations.get(ADMITTED_STATUS_ANNOTATION) \
            if isinstance(annotations, dict) else None

    old = None
    if request.operation == "UPDATE":
        old = require_object(request, old=True).get("metadata")
    if json_equal(recorded(meta), recorded(old)):
        return None
    return (f"metadata.annotations.{ADMITTED_STATUS_ANNOTATION}: set by kube-arbiter only "
            "(it records an admission)")


def _loop_unit_problem(request: AdmissionRequest, name: str, spec: Obj) -> str | None:
    """Why a user may not write this unit: a new one under a loop name, or
    a change to the spec of one the loop made (its pod sets, queue and
    priority are its consumer's; a smaller copy would be admitted small)."""
    if request.operation == "CREATE":
        if name.startswith(LOOP_PREFIXES):
            shown = ", ".join(f'"{prefix}"' for prefix in LOOP_PREFIXES)
            return (f"metadata.name: names starting with {shown} are kube-arbiter's (the "
                    "units it makes for Jobs, pods, pod groups and workloads); name your "
                    "reservation otherwise")
        return None
    old = require_object(request, old=True)
    old_spec = old.get("spec")
    if not isinstance(old_spec, dict):
        old_spec = {}
    if old_spec.get("consumerRef") is None and not name.startswith(LOOP_PREFIXES):
        return None  # a user's reservation
    changed = sorted(str(key)[:60] for key in spec.keys() | old_spec.keys()
                     if not json_equal(spec.get(key), old_spec.get(key)))
    if not changed:
        return None
    return (f"spec.{changed[0]} cannot change: kube-arbiter made this unit for its consumer "
            "and writes its spec (pod sets, queue, priority) from the consumer only")


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
# Seconds a check's new lastTransitionTime may be ahead of this server's
# clock (clock skew between the answering client and arbiter).
CLOCK_SKEW = 60.0


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
        refused = _transition_time_change(was, now, f"status.admissionChecks[{index}]")
        if refused is not None:
            return refused
    return None


def _transition_time_change(was: dict[str, Any], now: dict[str, Any], where: str) -> str | None:
    """Why an entry's new lastTransitionTime is refused, or None."""
    stamp = now.get("lastTransitionTime")
    if json_equal(was.get("lastTransitionTime"), stamp):
        return None
    if json_equal(was.get("state"), now.get("state")):
        return f"{where}.lastTransitionTime may change only together with its state"
    when = parse_rfc3339(stamp) if isinstance(stamp, str) else None
    if when is None or not isinstance(stamp, str):
        return f"{where}.lastTransitionTime: {brief(stamp)} is not an RFC 3339 time"
    if when > time.time() + CLOCK_SKEW:
        return f"{where}.lastTransitionTime: {stamp[:40]} is in the future"
    return None
