"""QueueUnits: which ones should exist and what the loop should do about
each (what their consumers are doing: `arbiter.loop.consumers`). Pure
functions of cache records.

Naming (one unit per consumer):

- a managed Job `x` → QueueUnit `job-x` (owner: the Job, controller);
- a gated plain pod `p` → `pod-p` (owner: the pod, controller);
- a pod group `g` (pods labelled `arbiter.dev/pod-group: g`) → `group-g`,
  created once as many gated pods as its `arbiter.dev/pod-group-size` are
  present. Every pod present at creation is an owner (none is the
  controller): Kubernetes' garbage collector deletes a dependent only when
  all its owners are gone, so the unit lives exactly as long as any pod of
  the group does, and no cleanup code is needed.
- a QueueUnit a user creates without `consumerRef` is a reservation: it is
  admitted like any unit and holds its capacity while `Dequeued`.

Which consumer a pod belongs to, and the unit's name, are decided in
`arbiter.cache.ownership` (shared with the extender); a name longer than a
QueueUnit may be (253) is cut and suffixed with a hash (`arbiter.core.api.unit_name`,
shared with the webhook).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from arbiter.cache.ownership import (
    POD_KINDS,
    WORKLOAD_CONSUMERS,
    ConsumerKey,
    gate_consumer,
    workload_key,
)
from arbiter.cache.records import (
    JobRecord,
    PodRecord,
    PodSet,
    PriorityClassRecord,
    RuntimeClassRecord,
    UnitRecord,
)
from arbiter.core.api import (
    API_VERSION,
    CONSUMER_KIND_LABEL,
    MAX_POD_SETS,
    MIN_PARALLELISM_ANNOTATION,
    QUEUE_LABEL,
    QUEUE_UNIT,
    UnitPhase,
)
from arbiter.core.api import unit_name as api_unit_name
from arbiter.core.model import MAIN_POD_SET, demand_of
from arbiter.core.resources import EMPTY, Resources
from arbiter.integrations import BY_KIND
from arbiter.loop.consumers import Consumer
from arbiter.loop.timeouts import admission_deadline, record_due, release_deadline

# consumerRef.apiVersion of a pod group: there is no such object, the
# kind names the label that gathers its pods.
POD_GROUP_API_VERSION = API_VERSION


def consumer_key(unit: UnitRecord) -> ConsumerKey | None:
    if unit.consumer is None:
        return None
    if unit.consumer.kind not in ("Job", "Pod", "PodGroup"):
        return workload_key(unit)
    return ConsumerKey(unit.consumer.kind, unit.namespace, unit.consumer.name)


# -- desired units ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Owner:
    api_version: str
    kind: str
    name: str
    uid: str
    controller: bool = False
    block_owner_deletion: bool = False


# The QueueUnit a workload should have, as the loop would write it.
@dataclass(frozen=True, slots=True)
class DesiredUnit:
    namespace: str
    name: str
    queue: str
    consumer: ConsumerKey
    consumer_uid: str
    consumer_api_version: str
    pod_sets: tuple[PodSet, ...]
    priority: int = 0
    priority_class: str | None = None
    owners: tuple[Owner, ...] = ()

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def demand(self) -> Resources:
        return demand_of(self.pod_sets)


def priority_of_class(
    name: str | None, classes: Mapping[str, PriorityClassRecord]
) -> int:
    """A priorityClassName's value; without one, the global default's (else 0)."""
    if name is not None:
        record = classes.get(name)
        return record.value if record is not None else 0
    for record in classes.values():
        if record.global_default:
            return record.value
    return 0


def min_parallelism(job: JobRecord) -> int | None:
    """The Job's `arbiter.dev/min-parallelism` (partial admission), capped
    at its parallelism; None when absent or not a whole number >= 1 (the
    webhook refuses those; a Job created while it was down runs whole)."""
    text = (dict(job.annotations).get(MIN_PARALLELISM_ANNOTATION) or "").strip()
    # ASCII digits only and short: "²" passes isdigit() and 5,000 digits pass
    # it too, and int() raises on both (in the loop, for every unit).
    if not (text.isascii() and text.isdigit() and len(text) <= 9) or int(text) < 1:
        return None
    return min(int(text), job.parallelism)


def job_unit(job: JobRecord, classes: Mapping[str, PriorityClassRecord],
             runtimes: Mapping[str, RuntimeClassRecord] | None = None) -> DesiredUnit | None:
    """The unit a managed Job needs; None when it needs none (no queue,
    finished, or nothing to run). Its pods request what the template says
    plus their RuntimeClass's overhead, as the apiserver will give them."""
    if job.queue is None or job.outcome is not None or job.parallelism <= 0:
        return None
    runtime = (runtimes or {}).get(job.runtime_class or "")
    requests = job.pod_requests if runtime is None else job.pod_requests + runtime.overhead
    consumer = ConsumerKey("Job", job.namespace, job.name)
    return DesiredUnit(
        namespace=job.namespace,
        name=consumer.unit_name,
        queue=job.queue,
        consumer=consumer,
        consumer_uid=job.uid,
        consumer_api_version="batch/v1",
        pod_sets=(PodSet(MAIN_POD_SET, job.parallelism, requests,
                         min_parallelism(job)),),
        priority=priority_of_class(job.priority_class, classes),
        priority_class=job.priority_class,
        owners=(Owner("batch/v1", "Job", job.name, job.uid, True, True),),
    )


def wants_pod_unit(pod: PodRecord) -> bool:
    """A gated pod outside a pod group is its own unit, a Job's pod too
    (`arbiter.cache.ownership`: a Job arbiter holds has no gated pods)."""
    # `not pod.pod_group`: its `gate_consumer` is the pod itself (spelled
    # out: a full pass asks this of every pod).
    return pod.gated and pod.queue is not None and not pod.pod_group and not pod.terminating


def pod_unit(pod: PodRecord) -> DesiredUnit | None:
    if not wants_pod_unit(pod) or pod.queue is None:
        return None
    consumer = gate_consumer(pod)
    return DesiredUnit(
        namespace=pod.namespace,
        name=consumer.unit_name,
        queue=pod.queue,
        consumer=consumer,
        consumer_uid=pod.uid,
        consumer_api_version="v1",
        pod_sets=(PodSet(MAIN_POD_SET, 1, pod.requests),),
        priority=pod.priority,
        owners=(Owner("v1", "Pod", pod.name, pod.uid, True, True),),
    )


def group_pod_sets(pods: Iterable[PodRecord]) -> tuple[PodSet, ...]:
    """One pod set per distinct request vector (at most 8; beyond, one set
    holding the sum, which keeps the demand exact)."""
    pods = list(pods)
    shapes = Counter(pod.requests for pod in pods)
    if len(shapes) > MAX_POD_SETS:
        total = EMPTY
        for pod in pods:
            total = total + pod.requests
        return (PodSet(MAIN_POD_SET, 1, total),)
    ordered = sorted(shapes.items(), key=lambda item: (-item[1], sorted(item[0].items())))
    return tuple(
        PodSet(MAIN_POD_SET if index == 0 else f"set-{index}", count, requests)
        for index, (requests, count) in enumerate(ordered)
    )


def group_unit(namespace: str, group: str, pods: Iterable[PodRecord]) -> DesiredUnit | None:
    """The unit of a pod group, once as many gated pods as its declared size
    are present (the size is read from its pods' annotation)."""
    members = sorted(
        (p for p in pods if not p.terminating and p.pod_group == group),
        key=lambda p: (p.created, p.name),
    )
    gated = [p for p in members if p.gated and p.queue is not None]
    sizes = [p.pod_group_size for p in members if p.pod_group_size]
    if not gated or not sizes or len(gated) < max(sizes):
        return None
    queue = gated[0].queue
    assert queue is not None
    consumer = ConsumerKey("PodGroup", namespace, group)
    return DesiredUnit(
        namespace=namespace,
        name=consumer.unit_name,
        queue=queue,
        consumer=consumer,
        consumer_uid="",
        consumer_api_version=POD_GROUP_API_VERSION,
        pod_sets=group_pod_sets(gated),
        priority=max(p.priority for p in gated),
        owners=tuple(Owner("v1", "Pod", p.name, p.uid) for p in gated),
    )


def alternate_name(unit: DesiredUnit) -> str:
    """The name a consumer's unit takes when its own is taken by a unit that
    is not its (matched by uid): the usual name and the consumer's uid (a
    group's: its first pod's)."""
    uid = unit.consumer_uid or (unit.owners[0].uid if unit.owners else "")
    return api_unit_name(unit.name, uid[:8] or "x")


def _resource_list(resources: Resources) -> dict[str, str]:
    return resources.to_quantities()


def pod_sets_json(pod_sets: Iterable[PodSet]) -> list[dict[str, Any]]:
    out = []
    for pod_set in pod_sets:
        item: dict[str, Any] = {
            "name": pod_set.name,
            "count": pod_set.count,
            "requests": _resource_list(pod_set.requests),
        }
        if pod_set.min_count is not None:
            item["minCount"] = pod_set.min_count
        out.append(item)
    return out


def manifest(unit: DesiredUnit) -> dict[str, Any]:
    """The QueueUnit object to create for a desired unit."""
    spec: dict[str, Any] = {
        "queue": unit.queue,
        "priority": unit.priority,
        "consumerRef": {
            "apiVersion": unit.consumer_api_version,
            "kind": unit.consumer.kind,
            "namespace": unit.namespace,
            "name": unit.consumer.name,
        },
        "podSets": pod_sets_json(unit.pod_sets),
    }
    if unit.consumer_uid:
        spec["consumerRef"]["uid"] = unit.consumer_uid
    if unit.priority_class:
        spec["priorityClassName"] = unit.priority_class
    owners = [
        {
            "apiVersion": owner.api_version,
            "kind": owner.kind,
            "name": owner.name,
            "uid": owner.uid,
            **({"controller": True} if owner.controller else {}),
            **({"blockOwnerDeletion": True} if owner.block_owner_deletion else {}),
        }
        for owner in unit.owners
    ]
    return {
        "apiVersion": API_VERSION,
        "kind": QUEUE_UNIT.kind,
        "metadata": {
            "name": unit.name,
            "namespace": unit.namespace,
            "labels": {QUEUE_LABEL: unit.queue, CONSUMER_KIND_LABEL: unit.consumer.kind},
            "ownerReferences": owners,
        },
        "spec": spec,
    }


def spec_drift(unit: UnitRecord, desired: DesiredUnit) -> dict[str, Any] | None:
    """A merge patch bringing a waiting unit's spec in line with its consumer
    (a Job's parallelism changed, or a tenant edited the unit); None when
    nothing differs."""
    patch: dict[str, Any] = {}
    if unit.pod_sets != desired.pod_sets:
        patch["podSets"] = pod_sets_json(desired.pod_sets)
    if unit.queue != desired.queue:
        patch["queue"] = desired.queue
    if unit.priority != desired.priority:
        patch["priority"] = desired.priority
    return patch or None


def follows_consumer(unit: UnitRecord) -> bool:
    """A waiting unit whose spec is derived from its consumer now: a Job's,
    and a pod's or a group's before its first admission (its pods are then
    released: what they ask is fixed)."""
    ref = unit.consumer
    if ref is None or unit.phase != "Enqueued":
        return False
    if ref.kind in POD_KINDS:
        return unit.admissions == 0
    return ref.kind == "Job" or ref.kind in WORKLOAD_CONSUMERS


def group_members(unit: UnitRecord, pods: Iterable[PodRecord]) -> tuple[str, ...]:
    """The uids a pod group's unit admits: the pods it admitted before, else
    its gated pods, oldest first, as far as its admitted demand covers them."""
    if unit.members:
        return unit.members
    budget = demand_of(unit.admitted_pod_sets)
    chosen = []
    for pod in sorted((p for p in pods if p.gated and not p.terminating),
                      key=lambda p: (p.created, p.name, p.uid)):
        if pod.requests.fits_in(budget):
            budget = budget - pod.requests
            chosen.append(pod.uid)
    return tuple(sorted(chosen))


# -- the step a unit needs --------------------------------------------------------------

Disposition = Literal["pending", "admitted"] | None
# "checked" / "requeue" / "reject": a Reserved unit's admission checks
# passed, asked for a retry, or rejected it (arbiter.loop.checks).
# "rehold": a serving workload resized while admitted goes back to Enqueued
# and its pods are made again (arbiter.loop.workloads).
# "adopt": a waiting unit whose consumer runs all the same (released outside
# arbiter, or by an admission whose status write did not land) is counted
# admitted from now, with an admission on record, in `phase`.
StepKind = Literal["none", "phase", "release", "hold", "backoff", "checked", "requeue",
                   "reject", "rehold", "record", "adopt"]


@dataclass(frozen=True, slots=True)
class Step:
    """One write a unit needs. `phase`: set status.phase; `release`: finish
    an admission (unsuspend / ungate); `hold`: re-suspend a Job whose unit
    is no longer admitted; `backoff`: Dequeued → TimeoutBackoff, then hold;
    `record`: write the admission a unit created admitted carries in an
    annotation into its status."""

    kind: StepKind
    phase: UnitPhase | None = None
    message: str = ""
    # "requeue": seconds before the unit may be admitted again.
    delay: float = 0.0


NOTHING = Step("none")


def pods_unit(unit: UnitRecord) -> bool:
    """A plain pod's or a pod group's unit (released by lifting gates, never put back)."""
    return unit.consumer is not None and unit.consumer.kind in POD_KINDS


def gate_workload(unit: UnitRecord) -> bool:
    """A unit of a workload held by gating its pods (StatefulSet, LWS):
    its pods come and go while it is admitted, each let go as it comes."""
    ref = unit.consumer
    return ref is not None and ref.kind in WORKLOAD_CONSUMERS \
        and BY_KIND[ref.kind].hold == "gate"


def suspend_workload(unit: UnitRecord) -> bool:
    """A unit of a workload held by its suspend field (JobSet, a declared kind)."""
    ref = unit.consumer
    return ref is not None and ref.kind in WORKLOAD_CONSUMERS \
        and BY_KIND[ref.kind].hold == "suspend"


def lets_pods_go(unit: UnitRecord) -> bool:
    """A unit whose workload's pods arrive gated and are let go while it is
    admitted, each as it comes: a gate-held workload's, or a suspend-held one
    whose controller makes the pods (`Integration.gated_pods`: KubeRay). Resized
    while admitted, it is requeued at its new size (else its extra pods wait)."""
    ref = unit.consumer
    return ref is not None and ref.kind in WORKLOAD_CONSUMERS \
        and (BY_KIND[ref.kind].hold == "gate" or BY_KIND[ref.kind].gated_pods)


def held(unit: UnitRecord, consumer: Consumer) -> Consumer:
    """`consumer`, with a pod unit's released but unbound pods counted as
    held outside `Dequeued`. Their gates were lifted by an earlier admission
    and cannot come back, but while the unit is not admitted the extender
    keeps them off every node: they wait exactly as gated pods do, and are
    not work "released outside arbiter"."""
    if consumer is Consumer.RELEASED and unit.phase != "Dequeued" and pods_unit(unit) \
            and unit.admissions > 0:
        return Consumer.HELD
    return consumer


def disposition(unit: UnitRecord, consumer: Consumer) -> Disposition:
    """Where the unit belongs in the engine: waiting, holding capacity, or out."""
    if consumer in (Consumer.MISSING, Consumer.SUCCEEDED, Consumer.FAILED):
        return None
    consumer = held(unit, consumer)
    phase = unit.phase
    if unit.reserved:
        return "admitted"  # quota held while its admission checks run (§12)
    if phase in ("Enqueued", "Reserved"):
        # Released without an admission (created while arbiter was away):
        # it uses capacity all the same.
        return "pending" if consumer in (Consumer.HELD, Consumer.NONE) else "admitted"
    if phase == "Dequeued":
        return "admitted"
    if phase == "Running":
        # A Job suspended by someone else while running is requeued.
        return None if consumer is Consumer.HELD else "admitted"
    if phase == "TimeoutBackoff":
        # Until the re-suspend lands, its pods may still be there.
        return "admitted" if consumer in (Consumer.RELEASED, Consumer.RUNNING) else None
    return None


# What a consumer that ended makes of its unit: (phase, message).
ENDED_PHASES: dict[Consumer, tuple[UnitPhase, str]] = {
    Consumer.SUCCEEDED: ("Succeed", "finished"),
    Consumer.FAILED: ("Failed", "failed"),
}


def record_step(unit: UnitRecord, consumer: Consumer, now: float, within: float) -> Step:
    """Write the admission of a unit created admitted into its status, in
    one write with the phase its consumer reached: when it ends, or once
    `within` s of its creation are over (Running, or the admission alone).
    Until then the annotation is the record (a short Job: one write in all)."""
    if consumer in ENDED_PHASES:
        return Step("record", *ENDED_PHASES[consumer])
    if consumer in (Consumer.RUNNING, Consumer.RELEASED) and now < record_due(unit, within):
        return NOTHING
    if consumer is Consumer.RUNNING:
        return Step("record", "Running", "running")
    return Step("record")


def decide(
    unit: UnitRecord,
    consumer: Consumer,
    *,
    now: float,
    timeout: float,
    backoff_until: float | None = None,
    started: float = 0.0,
    record_within: float = 0.0,
) -> Step:
    """The one transition rule table (DESIGN §2 phases)."""
    phase = unit.phase
    consumer = held(unit, consumer)
    if unit.unwritten and consumer is not Consumer.MISSING:
        # Created admitted (the fast path, DESIGN §16): its admission goes
        # into its status with the phase reached, before any other step (a
        # Job may finish before the watch brings its unit).
        return record_step(unit, consumer, now, record_within)
    if consumer is Consumer.MISSING or phase in ("Succeed", "Failed"):
        return NOTHING  # garbage collection follows the owner
    if consumer in ENDED_PHASES:
        return Step("phase", *ENDED_PHASES[consumer])
    if consumer is Consumer.NONE:
        return NOTHING  # a reservation only moves when admitted
    if phase in ("Enqueued", "Reserved"):
        if phase == "Enqueued" and unit.admissions > 0 \
                and consumer in (Consumer.RELEASED, Consumer.RUNNING):
            # Taken back, yet let go: the hold did not land (a leader killed before its
            # suspend) or the cache is behind it. Adopting it would undo the take-back.
            return Step("hold", message="let go after arbiter took it back; held again")
        if consumer is Consumer.RELEASED:
            return Step("adopt", "Dequeued", "released outside arbiter; counted as admitted")
        if consumer is Consumer.RUNNING:
            return Step("adopt", "Running", "running; released outside arbiter")
        return NOTHING
    if phase == "Dequeued":
        if consumer is Consumer.RUNNING:
            return Step("phase", "Running", "running")
        deadline = admission_deadline(unit, timeout, started)
        unlet = release_deadline(unit, timeout) if consumer is Consumer.HELD else None
        if unlet is not None and now >= unlet:
            return Step(
                "backoff",
                "TimeoutBackoff",
                f"not let go {timeout:g}s after admission (its release did not go through); "
                "requeued after backoff",
            )
        if deadline is not None and now >= deadline:
            if pods_unit(unit):
                # A gate cannot be put back: the pods stay, unbound (the
                # extender places no pod of a unit that is not admitted),
                # and the unit's allocation goes to the next in line.
                return Step(
                    "backoff",
                    "TimeoutBackoff",
                    f"not scheduled {timeout:g}s after admission; allocation freed, the pods "
                    "wait unscheduled and are requeued after backoff",
                )
            return Step(
                "backoff",
                "TimeoutBackoff",
                f"not running {timeout:g}s after admission; suspended and requeued after backoff",
            )
        if consumer is Consumer.HELD:
            return Step("release")
        return NOTHING
    if phase == "Running":
        if consumer is Consumer.HELD and gate_workload(unit):
            # Its pods were made again (a rolling update, a deleted pod):
            # still admitted, they are let go again.
            return Step("release")
        if consumer is Consumer.HELD:
            return Step("phase", "Enqueued", "suspended outside arbiter; requeued")
        return NOTHING
    if phase == "TimeoutBackoff":
        if consumer is Consumer.RUNNING and pods_unit(unit):
            # Bound just as it timed out (a filter answered before): it runs.
            return Step("phase", "Running", "started after its admission timed out")
        if consumer in (Consumer.RELEASED, Consumer.RUNNING):
            return Step("hold")
        if backoff_until is not None and now >= backoff_until:
            return Step("phase", "Enqueued", "backoff over; waiting for admission again")
        return NOTHING
    return NOTHING
