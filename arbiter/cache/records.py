"""Slim, immutable records: only the fields arbiter's decisions read.

Whole Kubernetes objects are never kept; at 100,000 pods that is the
difference between tens and thousands of MiB.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from arbiter.core.api import (
    ADMITTED_PHASES,
    DEFAULT_RETRY_DELAY,
    CheckState,
    QueuePolicy,
    QueueState,
    UnitPhase,
    WithinQueuePreemption,
)
from arbiter.core.model import ChildOrder, Placement
from arbiter.core.resources import EMPTY, Resources
from arbiter.core.selectors import LabelSelector

JobOutcome = Literal["Complete", "Failed"]


@dataclass(frozen=True, slots=True)
class QueueCheck:
    """One entry of Queue spec.admissionChecks: the check applies to the
    queue's units whose labels include every selector pair (all without one)."""

    name: str
    selector: tuple[tuple[str, str], ...] = ()

    def applies(self, labels: Mapping[str, str]) -> bool:
        return all(labels.get(key) == value for key, value in self.selector)


@dataclass(frozen=True, slots=True)
class AdmissionCheckRecord:
    """An AdmissionCheck (DESIGN §12): who answers it and how long it may take."""

    name: str
    controller: str = ""
    retry_delay: int = DEFAULT_RETRY_DELAY
    # Seconds a unit may wait Pending on it before it is retried; None: forever.
    timeout: int | None = None
    resource_version: str = ""


@dataclass(frozen=True, slots=True)
class UnitCheck:
    """One entry of QueueUnit status.admissionChecks."""

    name: str
    state: CheckState = "Pending"
    message: str = ""
    # lastTransitionTime, seconds since the epoch (0.0 when absent).
    since: float = 0.0


@dataclass(frozen=True, slots=True)
class QueueRecord:
    name: str
    weight: int = 1
    guarantee: Resources = EMPTY
    # Resources absent from capability are unlimited.
    capability: Resources = EMPTY
    parent: str | None = None
    child_order: ChildOrder = "Fair"  # DESIGN §11; only read on a parent
    namespaces: tuple[str, ...] = ()
    # spec.namespaceSelector: the namespaces whose labels it matches may use
    # the queue too (DESIGN §3); None when absent.
    namespace_selector: LabelSelector | None = None
    policy: QueuePolicy = "Priority"
    blocking: bool = False
    priority: int = 0
    reclaimable: bool = True
    state: QueueState = "Open"
    node_selector: tuple[tuple[str, str], ...] = ()
    # spec.pools: the pools its work may use, in order (empty: every pool by
    # name, `default` last; DESIGN §10).
    pools: tuple[str, ...] = ()
    within_queue: WithinQueuePreemption = "Never"
    # spec.admissionChecks (DESIGN §12), in order.
    admission_checks: tuple[QueueCheck, ...] = ()
    uid: str = ""
    resource_version: str = ""
    created: float = 0.0


@dataclass(frozen=True, slots=True)
class NamespaceRecord:
    name: str
    # Value of the namespace's arbiter.dev/queue label, if any.
    queue_label: str | None = None
    # False when labelled arbiter.dev/managed: "false".
    managed_label: bool = True
    # Labelled arbiter.dev/managed: "true" (an admin's, or arbiter's own in
    # `listed` mode).
    opted_in: bool = False
    # That "true" was put there by arbiter (its annotation says so): arbiter
    # may take it away again, never an admin's.
    marked: bool = False
    # Its labels, for the Queues' namespaceSelectors (namespaces carry few).
    labels: Mapping[str, str] = field(default_factory=dict, hash=False)


@dataclass(frozen=True, slots=True)
class NodeRecord:
    name: str
    allocatable: Resources = EMPTY
    ready: bool = False
    schedulable: bool = True
    labels: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class Toleration:
    """One pod toleration, as a Pool asks for it to be added to admitted pods."""

    key: str = ""
    operator: str = "Equal"  # Equal | Exists
    value: str = ""
    effect: str = ""  # "" (every effect) | NoSchedule | PreferNoSchedule | NoExecute
    toleration_seconds: int | None = None

    def to_api(self) -> dict[str, Any]:
        """The pod spec form, without empty fields."""
        out: dict[str, Any] = {}
        if self.key:
            out["key"] = self.key
        out["operator"] = self.operator
        if self.value and self.operator != "Exists":
            out["value"] = self.value
        if self.effect:
            out["effect"] = self.effect
        if self.toleration_seconds is not None:
            out["tolerationSeconds"] = self.toleration_seconds
        return out


@dataclass(frozen=True, slots=True)
class Taint:
    """A taint a Pool expects its nodes to carry (informational: arbiter never taints)."""

    key: str
    value: str = ""
    effect: str = "NoSchedule"


@dataclass(frozen=True, slots=True)
class PoolRecord:
    """A Pool (DESIGN §10): the nodes whose labels include every selector pair.

    A node belongs to the first Pool, by name, that selects it; nodes no Pool
    selects form the pool `default` (arbiter.core.model.DEFAULT_POOL)."""

    name: str
    node_selector: tuple[tuple[str, str], ...] = ()
    tolerations: tuple[Toleration, ...] = ()
    taints: tuple[Taint, ...] = ()
    uid: str = ""
    resource_version: str = ""

    def selects(self, labels: Mapping[str, str]) -> bool:
        return all(labels.get(key) == value for key, value in self.node_selector)


@dataclass(frozen=True, slots=True)
class UnitAdmission:
    """QueueUnit status.admission: the pool an admitted unit went to and the
    planned node of each of its pods, per pod set (pod set name -> nodes)."""

    pool: str
    nodes: tuple[tuple[str, tuple[str, ...]], ...] = ()

    @classmethod
    def from_placement(cls, placement: Placement) -> UnitAdmission:
        return cls(placement.pool, tuple(sorted(
            (name, tuple(nodes)) for name, nodes in placement.nodes.items())))

    def placement(self) -> Placement:
        return Placement(self.pool, dict(self.nodes))

    def to_api(self) -> dict[str, Any]:
        return {"pool": self.pool, "nodes": {name: list(nodes) for name, nodes in self.nodes}}

    def planned_nodes(self) -> frozenset[str]:
        return frozenset(node for _, nodes in self.nodes for node in nodes)


# Records are plain field lists: any likeness to other records is of shape only
# (deliberate; each names what its own kind needs).
@dataclass(frozen=True, slots=True)
class OwnerRef:
    kind: str
    name: str
    uid: str
    controller: bool = False


@dataclass(frozen=True, slots=True)
class PodRecord:
    uid: str
    namespace: str
    name: str
    requests: Resources = EMPTY
    node_name: str | None = None
    phase: str = "Pending"
    queue: str | None = None
    gated: bool = False
    # Owning Job's name when the pod's controller is a batch/v1 Job, and
    # that ownerRef's uid: a pod is a Job unit's only when the uid matches.
    job_name: str | None = None
    job_uid: str = ""
    # (job-name, controller-uid) from the Job controller's labels on a pod
    # with no controller ownerRef: a Job deleted with --cascade=orphan
    # leaves its pods these, and its unit charged until they are gone.
    orphan_of: tuple[str, str] | None = None
    pod_group: str | None = None
    pod_group_size: int | None = None
    # Its controller ownerRef (any kind), for the owner walk
    # (`arbiter.cache.workloads`); "" when it has none.
    owner_kind: str = ""
    owner_uid: str = ""
    # The LeaderWorkerSet group-index label: which of its LWS's units it is
    # in (the chain to the LWS is checked by uid).
    group_index: str = ""
    priority: int = 0
    scheduler_name: str = "default-scheduler"
    terminating: bool = False
    created: float = 0.0


@dataclass(frozen=True, slots=True)
class JobRecord:
    uid: str
    namespace: str
    name: str
    queue: str | None = None
    suspended: bool = False
    parallelism: int = 1
    # Effective requests of one pod of the template.
    pod_requests: Resources = EMPTY
    priority_class: str | None = None
    # The template's runtimeClassName when the template states no overhead:
    # its pods get the RuntimeClass's overhead (added to the unit's demand).
    runtime_class: str | None = None
    outcome: JobOutcome | None = None
    active: int = 0
    ready: int = 0
    started: bool = False
    created: float = 0.0
    annotations: tuple[tuple[str, str], ...] = ()
    # status.startTime and the time it finished (completionTime, or when its
    # Complete/Failed condition turned True); 0.0 when unset. For JobFlow.
    start_time: float = 0.0
    finish_time: float = 0.0
    # Its controller ownerRef (a JobSet's, a JobFlow's): "" when none.
    owner_kind: str = ""
    owner_uid: str = ""
    # Which write of ours the cache has seen (`InFlightWrites.override`).
    resource_version: str = ""

    @property
    def demand(self) -> Resources:
        return self.pod_requests.scale(self.parallelism)


@dataclass(frozen=True, slots=True)
class PodSet:
    name: str
    count: int
    requests: Resources
    min_count: int | None = None


@dataclass(frozen=True, slots=True)
class UnitRecord:
    """A QueueUnit: the unit of admission."""

    uid: str
    namespace: str
    name: str
    queue: str
    priority: int = 0
    priority_class: str | None = None
    pod_sets: tuple[PodSet, ...] = ()
    consumer: OwnerRef | None = None
    phase: UnitPhase = "Enqueued"
    attempts: int = 0
    admissions: int = 0
    position: int | None = None
    created: float = 0.0
    last_allocate_time: str | None = None
    resource_version: str = ""
    message: str = ""
    # status.admission: set once admitted with node fit (None before, or
    # when admitted without nodes).
    admission: UnitAdmission | None = None
    extra: tuple[tuple[str, str], ...] = field(default=())
    labels: tuple[tuple[str, str], ...] = ()
    # status.admissionChecks while Reserved (DESIGN §12).
    checks: tuple[UnitCheck, ...] = ()
    # status.requeueAt: a unit a check sent back waits until then (epoch seconds).
    requeue_at: float | None = None
    # Pods per pod set of the last admission, when fewer than asked
    # (partial admission: status.admissions[-1].replicas); () when whole.
    replicas: tuple[tuple[str, int], ...] = ()
    # status.admittedPods: the uids of a pod group's pods at its admission;
    # only these are released, and only these are its (DESIGN §13).
    members: tuple[str, ...] = ()
    # Created admitted (the fast path, DESIGN §16): its admission is in the
    # `arbiter.dev/admitted-status` annotation, not in its status yet.
    unwritten: bool = False

    @property
    def demand(self) -> Resources:
        total = EMPTY
        for pod_set in self.pod_sets:
            total = total + pod_set.requests.scale(pod_set.count)
        return total

    @property
    def reserved(self) -> bool:
        """Quota held, waiting on admission checks (its work not released)."""
        return self.phase == "Reserved" and bool(self.checks)

    @property
    def admitted_pod_sets(self) -> tuple[PodSet, ...]:
        """The pod sets as admitted: `replicas` pods where fewer were admitted."""
        if not self.replicas:
            return self.pod_sets
        counts = dict(self.replicas)
        return tuple(
            PodSet(ps.name, counts[ps.name], ps.requests, ps.min_count)
            if ps.name in counts else ps for ps in self.pod_sets)

    @property
    def admitted(self) -> bool:
        return self.phase in ADMITTED_PHASES

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class RuntimeClassRecord:
    """A RuntimeClass: only what its pods add to their requests."""

    name: str
    overhead: Resources = EMPTY


@dataclass(frozen=True, slots=True)
class PriorityClassRecord:
    name: str
    value: int
    global_default: bool = False
