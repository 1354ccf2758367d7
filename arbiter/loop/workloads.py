"""The loop's side of the integrations (DESIGN §14): the units a workload
needs, what it is doing, and which of its pods a unit lets go. Pure
functions of cache records.

A workload unit is named `<prefix>-<name>[-<part>]` (`ConsumerKey.unit_name`),
owned by the workload (controller), and its consumerRef names the workload
with its uid. The part (an LWS group's index) is read back from the unit's
name: a unit is a workload's only when its consumerRef's uid is the
workload's, so a renamed or hand-made unit never stands for a group.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from arbiter.cache.ownership import ConsumerKey
from arbiter.cache.records import PodRecord, PriorityClassRecord, UnitRecord
from arbiter.cache.store import ClusterStore
from arbiter.cache.workloads import WorkloadRecord
from arbiter.integrations import held_kinds
from arbiter.integrations.lws import GROUP_INDEX_LABEL
from arbiter.loop.consumers import Consumer
from arbiter.loop.units import DesiredUnit, Owner, priority_of_class

FINISHED_POD_PHASES = ("Succeeded", "Failed")


def record_of(store: ClusterStore, key: ConsumerKey) -> WorkloadRecord | None:
    """The workload behind `key`, when its integration is switched on."""
    if key.kind not in held_kinds(store.integrations):
        return None
    return store.workloads.get(key.kind, {}).get(f"{key.namespace}/{key.name}")


def consumers_of(record: WorkloadRecord) -> list[ConsumerKey]:
    """One consumer per unit its spec asks for."""
    return [ConsumerKey(record.kind, record.namespace, record.name, unit.suffix)
            for unit in record.units or ()]


def desired(store: ClusterStore, key: ConsumerKey,
            classes: Mapping[str, PriorityClassRecord]) -> DesiredUnit | None:
    """The unit `key` needs: none when the workload is gone, has no queue,
    finished, is another held workload's child, or its spec asks for no
    such part (scaled down)."""
    record = record_of(store, key)
    if record is None or record.queue is None or record.outcome is not None:
        return None
    if store.root_workload(record.namespace, record.owner_kind, record.owner_uid) is not None \
            or store.owner_pending(record.owner_kind, record.owner_uid):
        return None  # a child (an LWS's StatefulSet): its root holds it
    spec = next((u for u in record.units or () if u.suffix == key.part), None)
    if spec is None or not spec.pod_sets:
        return None
    integration = record.integration
    return DesiredUnit(
        namespace=record.namespace,
        name=key.unit_name,
        queue=record.queue,
        consumer=key,
        consumer_uid=record.uid,
        consumer_api_version=integration.api_version,
        pod_sets=spec.pod_sets,
        priority=priority_of_class(record.priority_class, classes),
        priority_class=record.priority_class,
        owners=(Owner(integration.api_version, record.kind, record.name, record.uid,
                      True, True),),
    )


def pods_of(store: ClusterStore, record: WorkloadRecord, part: str) -> tuple[PodRecord, ...]:
    """The workload's pods (by controller chain) in unit `part`, live ones."""
    integration = record.integration
    return tuple(
        pod for pod in store.workload_pods(record)
        if integration.unit_of_pod({GROUP_INDEX_LABEL: pod.group_index}) == part)


def state(record: WorkloadRecord | None, uid: str, pods: Sequence[PodRecord]) -> Consumer:
    """A workload unit's consumer as the cache sees it. Suspend-held: like
    a Job (its status). Gate-held (serving): running once any pod of it is
    bound, released while pods are let go but none bound yet, held while
    none is let go (all gated, or none made yet)."""
    if record is None or record.uid != uid:
        return Consumer.MISSING
    if record.outcome == "Complete":
        return Consumer.SUCCEEDED
    if record.outcome == "Failed":
        return Consumer.FAILED
    live = [p for p in pods if not p.terminating and p.phase not in FINISHED_POD_PHASES]
    bound = any(p.node_name or p.phase == "Running" for p in live)
    if record.integration.hold == "suspend":
        if record.suspended:
            return Consumer.HELD
        started = record.ready > 0 or (record.integration.ready_from_pods and bound)
        return Consumer.RUNNING if started else Consumer.RELEASED
    if bound:
        return Consumer.RUNNING
    if any(not p.gated for p in live):
        return Consumer.RELEASED
    return Consumer.HELD


def to_let_go(unit: UnitRecord, pods: Iterable[PodRecord]) -> list[PodRecord]:
    """The gated pods an admitted gate-held unit lets go now: oldest first,
    as many as its admitted count leaves room for beside the pods already
    let go (a pod past that stays gated: it was never admitted)."""
    live = [p for p in pods if not p.terminating and p.phase not in FINISHED_POD_PHASES]
    room = sum(ps.count for ps in unit.admitted_pod_sets) - sum(not p.gated for p in live)
    gated = sorted((p for p in live if p.gated), key=lambda p: (p.created, p.name, p.uid))
    return gated[:max(0, room)]
