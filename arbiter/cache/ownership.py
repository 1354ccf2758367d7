"""Which consumer a pod belongs to, and so which QueueUnit holds it: the one
decision, shared by the loop (which creates the units) and the extender
(which looks a pod's unit up).

A pod of a Job belongs to the Job, a pod labelled with a pod group to the
group, any other pod to itself; each consumer has one unit, named by
`arbiter.core.api` in the pod's namespace.

A gated pod is the exception: its gate is lifted by its pod group's unit,
else by its own, even when a Job controls it. A Job arbiter holds is
released by unsuspending it (or let through at creation), so the webhook
never gates its pods (a pod of a Job its cache has not seen yet is refused,
retryably); a Job's pod that is gated belongs to a Job arbiter does not
hold (created before arbiter, while its namespace was opted out, or while
the webhook was removed: the Job carries no queue and was never suspended).
Holding such a pod until a Job unit that will never exist is admitted
would keep it gated forever; admitting it as the plain pod the webhook
took it for queues it fairly, and an eviction (reclaim) makes the Job controller create a new
pod, gated and queued again.

A pod of a held workload (its controller chain reaches one by uid: a
StatefulSet's, an LWS's, a JobSet's child Job's) belongs to that workload's
unit (`pod_workload`, `pod_holding_unit`), before any of the above.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from arbiter.cache.records import PodRecord, UnitRecord
from arbiter.cache.store import ClusterStore
from arbiter.cache.workloads import WorkloadRecord
from arbiter.core.api import group_unit_name, job_unit_name, pod_unit_name, workload_unit_name
from arbiter.integrations import BY_KIND
from arbiter.integrations.lws import GROUP_INDEX_LABEL

# "Job", "Pod", "PodGroup", or an integration's workload kind ("JobSet", ...).
ConsumerKind = str


# Kinds whose units are made from pods: one pod, or a pod group's pods.
POD_KINDS = ("Pod", "PodGroup")


# Kinds whose units the integrations make from a workload's spec (declared
# kinds join at startup: arbiter.cache.declared).
WORKLOAD_CONSUMERS: set[str] = {
    kind for kind, integration in BY_KIND.items()
    if not integration.per_pod and kind not in ("Job", "Pod")}


@dataclass(frozen=True, slots=True)
class ConsumerKey:
    """What a unit stands for, by kind, namespace and name (not uid: a
    deleted consumer must still find the unit it leaves behind)."""

    kind: ConsumerKind
    namespace: str
    name: str
    # Which of a workload's units (an LWS group's index); "" for the rest.
    part: str = ""

    def __str__(self) -> str:
        part = f"[{self.part}]" if self.part else ""
        return f"{self.kind}/{self.namespace}/{self.name}{part}"

    @property
    def unit_name(self) -> str:
        """The name of this consumer's QueueUnit."""
        if self.kind == "Job":
            return job_unit_name(self.name)
        if self.kind == "PodGroup":
            return group_unit_name(self.name)
        if self.kind in WORKLOAD_CONSUMERS:
            return workload_unit_name(BY_KIND[self.kind].prefix, self.name, self.part)
        return pod_unit_name(self.name)

    @property
    def unit_key(self) -> str:
        """`namespace/name` of this consumer's QueueUnit, as the store keys it."""
        return f"{self.namespace}/{self.unit_name}"


def part_of(unit: UnitRecord) -> str:
    """Which of its workload's units `unit` is ("" for a one-unit workload)."""
    ref = unit.consumer
    if ref is None:
        return ""
    head = f"{BY_KIND[ref.kind].prefix}-{ref.name}-"
    rest = unit.name[len(head):] if unit.name.startswith(head) else ""
    return rest if rest.isascii() and rest.isdigit() and len(rest) <= 6 else ""


def workload_key(unit: UnitRecord) -> ConsumerKey | None:
    ref = unit.consumer
    if ref is None or ref.kind not in WORKLOAD_CONSUMERS:
        return None
    return ConsumerKey(ref.kind, unit.namespace, ref.name, part_of(unit))


def pod_consumer(pod: PodRecord) -> ConsumerKey:
    """The consumer a pod belongs to: its Job, else its pod group, else itself."""
    if pod.job_name:
        return ConsumerKey("Job", pod.namespace, pod.job_name)
    if pod.pod_group:
        return ConsumerKey("PodGroup", pod.namespace, pod.pod_group)
    return ConsumerKey("Pod", pod.namespace, pod.name)


def gate_consumer(pod: PodRecord) -> ConsumerKey:
    """The consumer whose unit lifts a gated pod's gate: its pod group, else
    the pod itself (never a Job: see the module's doc)."""
    if pod.pod_group:
        return ConsumerKey("PodGroup", pod.namespace, pod.pod_group)
    return ConsumerKey("Pod", pod.namespace, pod.name)


def holding_unit(
    pod: PodRecord, units: Mapping[str, UnitRecord],
    by_consumer_uid: Mapping[str, str] | None = None,
) -> tuple[str, UnitRecord | None]:
    """The key of the unit that holds `pod`, and that unit if it exists: the
    unit its gate was (or will be) lifted by when that unit stands for it,
    else its consumer's (`pod_consumer`). Found by uid first (`by_consumer_uid`:
    the store's index of units by their consumer's uid), the pod's own and
    then its Job's, so a unit the loop named apart is found too; else by name.
    A few lookups at most."""
    if by_consumer_uid:
        for uid in (pod.uid, pod.job_uid):
            key = by_consumer_uid.get(uid) if uid else None
            if key is not None and key.partition("/")[0] == pod.namespace and key in units:
                return key, units[key]
    consumer = pod_consumer(pod)
    if consumer.kind == "Job":
        gate = gate_consumer(pod)
        unit = units.get(gate.unit_key)
        if unit is not None and unit.consumer is not None and (
                gate.kind == "PodGroup" or unit.consumer.uid in ("", pod.uid)):
            return gate.unit_key, unit
    return consumer.unit_key, units.get(consumer.unit_key)


def pod_workload(store: ClusterStore, pod: PodRecord) -> tuple[WorkloadRecord, str] | None:
    """The held workload the pod's controller chain reaches (by uid at every
    step: `ClusterStore.root_workload`), and which of its units the pod is
    in (an LWS group's index, from the pod's label; the chain is checked)."""
    if not pod.owner_uid:
        return None
    root = store.root_workload(pod.namespace, pod.owner_kind, pod.owner_uid)
    if root is None:
        return None
    return root, root.integration.unit_of_pod({GROUP_INDEX_LABEL: pod.group_index})


def pod_holding_unit(store: ClusterStore, pod: PodRecord) -> tuple[str, UnitRecord | None]:
    """`holding_unit`, first through the pod's held workload: the key of its
    workload's unit and that unit if it exists (by name: whether it stands
    for this workload is `ClusterStore.workload_unit`'s uid check)."""
    found = pod_workload(store, pod)
    if found is not None:
        key = found[0].unit_key(found[1])
        return key, store.units.get(key)
    return holding_unit(pod, store.units, store.unit_by_consumer_uid)
