"""Slim, immutable records: only the fields arbiter's decisions read.

Whole Kubernetes objects are never kept; at 100,000 pods that is the
difference between tens and thousands of MiB.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from arbiter.api import (
    ADMITTED_PHASES,
    QueuePolicy,
    QueueState,
    UnitPhase,
    WithinQueuePreemption,
)
from arbiter.core.resources import EMPTY, Resources

JobOutcome = Literal["Complete", "Failed"]


@dataclass(frozen=True, slots=True)
class QueueRecord:
    name: str
    weight: int = 1
    guarantee: Resources = EMPTY
    # Resources absent from capability are unlimited.
    capability: Resources = EMPTY
    parent: str | None = None
    namespaces: tuple[str, ...] = ()
    policy: QueuePolicy = "Priority"
    blocking: bool = False
    priority: int = 0
    reclaimable: bool = True
    state: QueueState = "Open"
    node_selector: tuple[tuple[str, str], ...] = ()
    within_queue: WithinQueuePreemption = "Never"
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


@dataclass(frozen=True, slots=True)
class NodeRecord:
    name: str
    allocatable: Resources = EMPTY
    ready: bool = False
    schedulable: bool = True
    labels: tuple[tuple[str, str], ...] = ()


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
    # Owning Job's name when the pod's controller is a batch/v1 Job.
    job_name: str | None = None
    pod_group: str | None = None
    pod_group_size: int | None = None
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
    extra: tuple[tuple[str, str], ...] = field(default=())

    @property
    def demand(self) -> Resources:
        total = EMPTY
        for pod_set in self.pod_sets:
            total = total + pod_set.requests.scale(pod_set.count)
        return total

    @property
    def admitted(self) -> bool:
        return self.phase in ADMITTED_PHASES

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class PriorityClassRecord:
    name: str
    value: int
    global_default: bool = False
