"""Raw API objects (decoded JSON dicts) -> slim records.

Objects in the cluster were validated by the apiserver, not necessarily by
arbiter (a Queue created while the webhook was down may carry a bad
quantity): converters raise `ConversionError` naming the field, and the
caller decides whether to skip the object.
"""

from __future__ import annotations

import sys
from collections.abc import Hashable, Mapping
from typing import Any, TypeVar, cast

import orjson

from arbiter.cache.records import (
    AdmissionCheckRecord,
    JobOutcome,
    JobRecord,
    NamespaceRecord,
    NodeRecord,
    OwnerRef,
    PodRecord,
    PodSet,
    PoolRecord,
    PriorityClassRecord,
    QueueCheck,
    QueueRecord,
    RuntimeClassRecord,
    Taint,
    Toleration,
    UnitAdmission,
    UnitCheck,
    UnitRecord,
)
from arbiter.core.api import (
    ADMISSION_GATE,
    ADMITTED_STATUS_ANNOTATION,
    CHECK_STATES,
    DEFAULT_RETRY_DELAY,
    MANAGED_BY_ARBITER_ANNOTATION,
    MANAGED_LABEL,
    POD_GROUP_LABEL,
    POD_GROUP_SIZE_ANNOTATION,
    QUEUE_LABEL,
    UnitPhase,
    is_arbiter_key,
    parse_rfc3339,
    parse_time,
)
from arbiter.core.jsonvalues import brief
from arbiter.core.podrequests import effective_pod_requests
from arbiter.core.quantities import QuantityError
from arbiter.core.resources import EMPTY, Resources
from arbiter.core.selectors import SelectorError, parse_selector
from arbiter.integrations.lws import GROUP_INDEX_LABEL as LWS_GROUP_INDEX_LABEL

Obj = Mapping[str, Any]
T = TypeVar("T", bound=Hashable)

# Equal immutable values decoded again and again (the same requests and pod
# sets on 100,000 pods, one namespace's name on each) kept once: every
# watch event decodes fresh copies. Bounded: cleared when full (it only
# shares, it never decides).
_SHARED: dict[Any, Any] = {}
_SHARED_LIMIT = 8192


def shared(value: T) -> T:
    """The copy of `value` seen before, if any (else `value`, now shared)."""
    found = _SHARED.get(value)
    if found is not None:
        return cast(T, found)
    if len(_SHARED) >= _SHARED_LIMIT:
        _SHARED.clear()
    _SHARED[value] = value
    return value


def _name(value: Any) -> str:
    """A name many records repeat (namespace, queue, phase, kind, node)."""
    return sys.intern(value) if type(value) is str else cast(str, value)


class ConversionError(ValueError):
    """An object that cannot be turned into a record; the message names the field."""


def _meta(obj: Obj) -> Obj:
    return cast(Obj, obj.get("metadata") or {})


def _labels(obj: Obj) -> Mapping[str, str]:
    return cast(Mapping[str, str], _meta(obj).get("labels") or {})


def _annotations(obj: Obj) -> Mapping[str, str]:
    return cast(Mapping[str, str], _meta(obj).get("annotations") or {})


def controller_owner(obj: Obj) -> OwnerRef | None:
    for ref in _meta(obj).get("ownerReferences") or []:
        if ref.get("controller"):
            return OwnerRef(kind=ref.get("kind", ""), name=ref.get("name", ""),
                            uid=ref.get("uid", ""), controller=True)
    return None


def _selector(value: Any, field: str) -> tuple[tuple[str, str], ...]:
    """matchLabels-style map -> sorted (key, value) pairs."""
    if value is None:
        return ()
    if not isinstance(value, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise ConversionError(f"{field}: must map label keys to string values")
    return tuple(sorted(value.items()))


def _names(value: Any, field: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ConversionError(f"{field}: must be a list of names")
    return tuple(dict.fromkeys(value))  # first mention wins: it is an order of preference


def _toleration(raw: Any, field: str) -> Toleration:
    if not isinstance(raw, Mapping):
        raise ConversionError(f"{field}: must be an object")
    seconds = raw.get("tolerationSeconds")
    if seconds is not None and (not isinstance(seconds, int) or isinstance(seconds, bool)):
        raise ConversionError(f"{field}.tolerationSeconds: must be an integer")
    return Toleration(key=str(raw.get("key") or ""),
                      operator="Exists" if raw.get("operator") == "Exists" else "Equal",
                      value=str(raw.get("value") or ""), effect=str(raw.get("effect") or ""),
                      toleration_seconds=seconds)


def _taint(raw: Any, field: str) -> Taint:
    if not isinstance(raw, Mapping) or not raw.get("key"):
        raise ConversionError(f"{field}: must be an object with a key")
    return Taint(key=str(raw["key"]), value=str(raw.get("value") or ""),
                 effect=str(raw.get("effect") or "NoSchedule"))


def pool_from_api(obj: Obj) -> PoolRecord:
    meta = _meta(obj)
    spec = cast(Obj, obj.get("spec") or {})
    tolerations = spec.get("tolerations") or []
    taints = spec.get("taints") or []
    if not isinstance(tolerations, list) or not isinstance(taints, list):
        raise ConversionError("spec.tolerations and spec.taints must be lists")
    return PoolRecord(
        name=meta.get("name", ""),
        node_selector=_selector(spec.get("nodeSelector"), "spec.nodeSelector"),
        tolerations=tuple(_toleration(t, f"spec.tolerations[{i}]")
                          for i, t in enumerate(tolerations)),
        taints=tuple(_taint(t, f"spec.taints[{i}]") for i, t in enumerate(taints)),
        uid=meta.get("uid", ""),
        resource_version=meta.get("resourceVersion", ""),
    )


def admission_from_status(raw: Any) -> UnitAdmission | None:
    """QueueUnit status.admission -> UnitAdmission; None when absent or malformed
    (a plan is advice the loop can redo, never a reason to drop the unit)."""
    if not isinstance(raw, Mapping) or not isinstance(raw.get("pool"), str):
        return None
    nodes = raw.get("nodes") or {}
    if not isinstance(nodes, Mapping):
        return None
    sets = []
    for name, planned in nodes.items():
        if not isinstance(planned, list) or not all(isinstance(n, str) for n in planned):
            return None
        sets.append((str(name), tuple(planned)))
    return UnitAdmission(pool=raw["pool"], nodes=tuple(sorted(sets)))


def _queue_checks(value: Any) -> tuple[QueueCheck, ...]:
    """Queue spec.admissionChecks: [{name, labelSelector: {matchLabels}}]."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise ConversionError("spec.admissionChecks: must be a list")
    checks = []
    for index, raw in enumerate(value):
        field = f"spec.admissionChecks[{index}]"
        if not isinstance(raw, Mapping) or not isinstance(raw.get("name"), str) \
                or not raw["name"]:
            raise ConversionError(f"{field}: must be an object with a name")
        selector = raw.get("labelSelector") or {}
        if not isinstance(selector, Mapping):
            raise ConversionError(f"{field}.labelSelector: must be an object")
        checks.append(QueueCheck(raw["name"], _selector(selector.get("matchLabels"),
                                                        f"{field}.labelSelector.matchLabels")))
    return tuple(checks)


def admission_check_from_api(obj: Obj) -> AdmissionCheckRecord:
    meta = _meta(obj)
    spec = cast(Obj, obj.get("spec") or {})
    delay = spec.get("retryDelaySeconds", DEFAULT_RETRY_DELAY)
    timeout = spec.get("timeoutSeconds")
    for name, value in (("retryDelaySeconds", delay), ("timeoutSeconds", timeout)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                  or value < 0):
            raise ConversionError(f"spec.{name}: {brief(value)} must be a whole number >= 0")
    return AdmissionCheckRecord(
        name=meta.get("name", ""),
        controller=str(spec.get("controllerName") or ""),
        retry_delay=delay if delay is not None else DEFAULT_RETRY_DELAY,
        timeout=timeout,
        resource_version=meta.get("resourceVersion", ""),
    )


def unit_checks_from_status(raw: Any) -> tuple[UnitCheck, ...]:
    """QueueUnit status.admissionChecks; an entry of unknown shape reads as
    Pending (it then waits, which is safe: nothing is released on it)."""
    if not isinstance(raw, list):
        return ()
    checks = []
    for entry in raw:
        if not isinstance(entry, Mapping) or not isinstance(entry.get("name"), str):
            continue
        state = entry.get("state")
        checks.append(UnitCheck(
            name=entry["name"],
            state=state if state in CHECK_STATES else "Pending",
            message=str(entry.get("message") or ""),
            since=parse_rfc3339(entry.get("lastTransitionTime")) or 0.0,
        ))
    return tuple(checks)


def replicas_from_status(status: Obj) -> tuple[tuple[str, int], ...]:
    """status.admissions[-1].replicas ({podSetName: count}) of a unit still
    holding that admission; () otherwise."""
    if status.get("phase") in (None, "Enqueued", "Succeed", "Failed"):
        return ()
    admissions = status.get("admissions")
    if not isinstance(admissions, list) or not admissions \
            or not isinstance(admissions[-1], Mapping):
        return ()
    replicas = admissions[-1].get("replicas")
    if not isinstance(replicas, Mapping):
        return ()
    return tuple(sorted((str(name), count) for name, count in replicas.items()
                        if isinstance(count, int) and not isinstance(count, bool)
                        and count >= 0))


def queue_from_api(obj: Obj) -> QueueRecord:
    meta = _meta(obj)
    spec = cast(Obj, obj.get("spec") or {})
    try:
        guarantee = Resources.parse(spec.get("guarantee"), field="spec.guarantee")
        capability = Resources.parse(
            spec.get("capability"), field="spec.capability", keep_zero=True
        )
    except QuantityError as error:
        raise ConversionError(str(error)) from error
    weight = spec.get("weight", 1)
    if not isinstance(weight, int) or isinstance(weight, bool) or weight <= 0:
        raise ConversionError(f"spec.weight: {brief(weight)} must be a positive integer")
    preemption = cast(Obj, spec.get("preemption") or {})
    try:
        namespace_selector = parse_selector(spec.get("namespaceSelector"),
                                            "spec.namespaceSelector")
    except SelectorError as error:
        raise ConversionError(str(error)) from error
    return QueueRecord(
        name=meta.get("name", ""),
        weight=weight,
        guarantee=guarantee,
        capability=capability,
        parent=spec.get("parent") or None,
        child_order="Queue" if spec.get("childOrder") == "Queue" else "Fair",
        namespaces=tuple(spec.get("namespaces") or ()),
        namespace_selector=namespace_selector,
        policy="FIFO" if spec.get("queuePolicy") == "FIFO" else "Priority",
        blocking=bool(spec.get("blocking", False)),
        priority=int(spec.get("priority", 0) or 0),
        reclaimable=bool(spec.get("reclaimable", True)),
        state="Closed" if spec.get("state") == "Closed" else "Open",
        node_selector=_selector(spec.get("nodeSelector"), "spec.nodeSelector"),
        pools=_names(spec.get("pools"), "spec.pools"),
        within_queue="LowerPriority"
        if preemption.get("withinQueue") == "LowerPriority" else "Never",
        admission_checks=_queue_checks(spec.get("admissionChecks")),
        uid=meta.get("uid", ""),
        resource_version=meta.get("resourceVersion", ""),
        created=parse_time(meta.get("creationTimestamp")),
    )


def namespace_from_api(obj: Obj) -> NamespaceRecord:
    labels = _labels(obj)
    return NamespaceRecord(
        name=_meta(obj).get("name", ""),
        queue_label=labels.get(QUEUE_LABEL) or None,
        managed_label=labels.get(MANAGED_LABEL) != "false",
        opted_in=labels.get(MANAGED_LABEL) == "true",
        marked=MANAGED_BY_ARBITER_ANNOTATION in _annotations(obj),
        labels=dict(labels),
    )


def node_from_api(obj: Obj) -> NodeRecord:
    status = cast(Obj, obj.get("status") or {})
    spec = cast(Obj, obj.get("spec") or {})
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )
    try:
        allocatable = Resources.parse(status.get("allocatable"), field="status.allocatable")
    except QuantityError as error:
        raise ConversionError(str(error)) from error
    return NodeRecord(
        name=_meta(obj).get("name", ""),
        allocatable=allocatable,
        ready=ready,
        schedulable=not spec.get("unschedulable", False),
        labels=tuple(sorted(_labels(obj).items())),
    )


def pod_from_api(obj: Obj) -> PodRecord:
    meta = _meta(obj)
    spec = cast(Obj, obj.get("spec") or {})
    status = cast(Obj, obj.get("status") or {})
    labels = _labels(obj)
    try:
        requests = effective_pod_requests(spec)
    except QuantityError as error:
        raise ConversionError(str(error)) from error
    owner = controller_owner(obj)
    size_text = _annotations(obj).get(POD_GROUP_SIZE_ANNOTATION)
    try:
        group_size = int(size_text) if size_text is not None else None
    except ValueError:
        group_size = None
    return PodRecord(
        uid=meta.get("uid", ""),
        namespace=_name(meta.get("namespace", "")),
        name=meta.get("name", ""),
        requests=shared(requests),
        node_name=_name(spec.get("nodeName")) or None,
        phase=_name(status.get("phase", "Pending")),
        queue=_name(labels.get(QUEUE_LABEL)) or None,
        gated=any(g.get("name") == ADMISSION_GATE for g in spec.get("schedulingGates") or []),
        job_name=owner.name if owner is not None and owner.kind == "Job" else None,
        job_uid=owner.uid if owner is not None and owner.kind == "Job" else "",
        orphan_of=_orphan_of(labels) if owner is None else None,
        pod_group=labels.get(POD_GROUP_LABEL) or None,
        pod_group_size=group_size,
        owner_kind=owner.kind if owner is not None else "",
        owner_uid=owner.uid if owner is not None else "",
        group_index=labels.get(LWS_GROUP_INDEX_LABEL, ""),
        priority=int(spec.get("priority", 0) or 0),
        scheduler_name=spec.get("schedulerName", "default-scheduler"),
        terminating=meta.get("deletionTimestamp") is not None,
        created=parse_time(meta.get("creationTimestamp")),
    )


def _job_outcome(status: Obj) -> JobOutcome | None:
    for condition in status.get("conditions") or []:
        if condition.get("status") != "True":
            continue
        if condition.get("type") == "Complete":
            return "Complete"
        if condition.get("type") == "Failed":
            return "Failed"
    return None


def _job_finish_time(status: Obj) -> float:
    if status.get("completionTime"):
        return parse_time(status["completionTime"])
    for condition in status.get("conditions") or []:
        if condition.get("status") == "True" and condition.get("type") in ("Complete", "Failed"):
            return parse_time(condition.get("lastTransitionTime"))
    return 0.0


def job_from_api(obj: Obj) -> JobRecord:
    meta = _meta(obj)
    spec = cast(Obj, obj.get("spec") or {})
    status = cast(Obj, obj.get("status") or {})
    template_spec = cast(Obj, (spec.get("template") or {}).get("spec") or {})
    try:
        pod_requests = effective_pod_requests(template_spec)
    except QuantityError as error:
        raise ConversionError(f"spec.template.{error}") from error
    parallelism = spec.get("parallelism", 1)
    completions = spec.get("completions")
    if isinstance(completions, int) and isinstance(parallelism, int):
        # Never more pods at once than completions still need.
        parallelism = min(parallelism, completions)
    owner = controller_owner(obj)
    return JobRecord(
        uid=meta.get("uid", ""),
        namespace=meta.get("namespace", ""),
        name=meta.get("name", ""),
        queue=_labels(obj).get(QUEUE_LABEL) or None,
        suspended=bool(spec.get("suspend", False)),
        parallelism=int(parallelism if parallelism is not None else 1),
        pod_requests=pod_requests,
        priority_class=template_spec.get("priorityClassName") or None,
        runtime_class=None if template_spec.get("overhead")
        else template_spec.get("runtimeClassName") or None,
        outcome=_job_outcome(status),
        active=int(status.get("active", 0) or 0),
        ready=int(status.get("ready", 0) or 0),
        started=status.get("startTime") is not None,
        created=parse_time(meta.get("creationTimestamp")),
        annotations=tuple(sorted(
            (k, v) for k, v in _annotations(obj).items() if is_arbiter_key(k)
        )),
        start_time=parse_time(status.get("startTime")),
        finish_time=_job_finish_time(status),
        owner_kind=owner.kind if owner is not None else "",
        owner_uid=owner.uid if owner is not None else "",
        resource_version=str(meta.get("resourceVersion") or ""),
    )


def pod_sets_from_spec(spec: Obj, field: str = "spec") -> tuple[PodSet, ...]:
    """QueueUnit pod sets, with `resourceUnit` x `resourceNo` as one pod set."""
    raw_sets = spec.get("podSets")
    try:
        if not raw_sets and spec.get("resourceUnit") is not None:
            count = spec.get("resourceNo", 1)
            return (PodSet(name="main", count=int(count),
                           requests=Resources.parse(spec["resourceUnit"],
                                                    field=f"{field}.resourceUnit")),)
        sets = []
        for index, raw in enumerate(raw_sets or []):
            sets.append(PodSet(
                name=raw.get("name", f"set-{index}"),
                count=int(raw.get("count", 1)),
                requests=Resources.parse(raw.get("requests"),
                                         field=f"{field}.podSets[{index}].requests"),
                min_count=raw.get("minCount"),
            ))
        return tuple(sets)
    except (QuantityError, TypeError, ValueError) as error:
        raise ConversionError(str(error)) from error


def _recorded_status(obj: Obj) -> Obj | None:
    """The admission a unit created admitted (the fast path, DESIGN §16)
    carries in its `arbiter.dev/admitted-status` annotation while its
    status has not been written from it (a written status has
    `admissions`); None otherwise."""
    status = obj.get("status")
    if isinstance(status, dict) and status.get("admissions"):
        return None
    text = _annotations(obj).get(ADMITTED_STATUS_ANNOTATION)
    if not text:
        return None
    try:
        recorded = orjson.loads(text)
    except orjson.JSONDecodeError:
        return None
    return recorded if isinstance(recorded, dict) and recorded.get("admissions") else None


def unit_status(obj: Obj) -> Obj:
    """A unit's status. One the loop created admitted (the fast path, DESIGN
    §16) records that admission in its `arbiter.dev/admitted-status`
    annotation (a status cannot be written with the object): its fields
    stand where the status has none, until the loop writes them into the
    status (then the annotation is only history: a field a later write
    removed must not come back from it). Only arbiter may set it (the
    QueueUnit webhook)."""
    return _status_with(obj, _recorded_status(obj))


def _status_with(obj: Obj, recorded: Obj | None) -> Obj:
    status = obj.get("status")
    status = status if isinstance(status, dict) else {}
    return status if recorded is None else {**recorded, **status}


def unit_from_api(obj: Obj) -> UnitRecord:
    meta = _meta(obj)
    spec = cast(Obj, obj.get("spec") or {})
    recorded = _recorded_status(obj)
    status = _status_with(obj, recorded)
    consumer_raw = spec.get("consumerRef")
    consumer = None
    if consumer_raw:
        consumer = OwnerRef(kind=_name(consumer_raw.get("kind", "")),
                            name=consumer_raw.get("name", ""), uid=consumer_raw.get("uid", ""))
    phase = cast(UnitPhase, _name(status.get("phase") or "Enqueued"))
    return UnitRecord(
        uid=meta.get("uid", ""),
        namespace=_name(meta.get("namespace", "")),
        name=meta.get("name", ""),
        queue=_name(spec.get("queue", "")),
        priority=int(spec.get("priority", 0) or 0),
        priority_class=spec.get("priorityClassName") or None,
        pod_sets=shared(pod_sets_from_spec(spec)),
        consumer=consumer,
        phase=phase,
        attempts=int(status.get("attempts", 0) or 0),
        admissions=len(status.get("admissions") or []),
        position=status.get("position"),
        created=parse_time(meta.get("creationTimestamp")),
        last_allocate_time=status.get("lastAllocateTime"),
        resource_version=meta.get("resourceVersion", ""),
        message=status.get("message", "") or "",
        admission=admission_from_status(status.get("admission")),
        labels=tuple(sorted(_labels(obj).items())),
        checks=unit_checks_from_status(status.get("admissionChecks")),
        requeue_at=parse_rfc3339(status.get("requeueAt")),
        replicas=replicas_from_status(status),
        members=_uids(status.get("admittedPods")),
        unwritten=recorded is not None,
    )


# The labels the Job controller puts on its pods (kept when a Job is deleted
# with --cascade=orphan, which only takes the ownerRef off).
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
JOB_UID_LABEL = "batch.kubernetes.io/controller-uid"


def _orphan_of(labels: Mapping[str, str]) -> tuple[str, str] | None:
    name, uid = labels.get(JOB_NAME_LABEL), labels.get(JOB_UID_LABEL)
    return (name, uid) if name and uid else None


def _uids(value: Any) -> tuple[str, ...]:
    """A list of uids (anything else: none)."""
    if not isinstance(value, list):
        return ()
    return tuple(sorted(item for item in value if isinstance(item, str) and item))


def runtime_class_from_api(obj: Obj) -> RuntimeClassRecord:
    overhead = (obj.get("overhead") or {}).get("podFixed")
    try:
        fixed = Resources.parse(overhead, field="overhead.podFixed")
    except QuantityError as error:
        raise ConversionError(str(error)) from error
    return RuntimeClassRecord(name=_meta(obj).get("name", ""), overhead=fixed)


def priority_class_from_api(obj: Obj) -> PriorityClassRecord:
    return PriorityClassRecord(
        name=_meta(obj).get("name", ""),
        value=int(obj.get("value", 0) or 0),
        global_default=bool(obj.get("globalDefault", False)),
    )




__all__ = [
    "EMPTY",
    "ConversionError",
    "admission_check_from_api",
    "admission_from_status",
    "controller_owner",
    "job_from_api",
    "namespace_from_api",
    "node_from_api",
    "pod_from_api",
    "pod_sets_from_spec",
    "pool_from_api",
    "priority_class_from_api",
    "queue_from_api",
    "runtime_class_from_api",
    "unit_from_api",
]
