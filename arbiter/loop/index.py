"""Indexes the loop keeps beside the store: which units stand for which
consumer, which pods make up each pod group, which pods are unmanaged
(their requests lower the capacity), and what each node's capacity is
made of. Each one remembers what it saw, so a deletion (whose record the
store has already dropped) still finds its unit, group and capacity
effect, and a Node heartbeat is told from a change.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from arbiter.cache.ownership import WORKLOAD_CONSUMERS, ConsumerKey, pod_workload
from arbiter.cache.records import NodeRecord, PodRecord, UnitRecord
from arbiter.cache.store import ClusterStore
from arbiter.core.resources import Resources
from arbiter.loop import workloads
from arbiter.loop.consumers import Consumer, group_state, job_state, pod_state
from arbiter.loop.timeouts import admitted_at
from arbiter.loop.units import (
    DesiredUnit,
    consumer_key,
    group_unit,
    job_unit,
    pod_unit,
    wants_pod_unit,
)


@dataclass(frozen=True, slots=True)
class _PodSeen:
    namespace: str
    name: str
    group: str | None
    # For pods without a queue: what the capacity depends on, else None.
    footprint: tuple[object, ...] | None
    # The workload unit its controller chain reaches (arbiter.loop.workloads).
    root: ConsumerKey | None = None


class LoopIndex:
    def __init__(self) -> None:
        self.unit_consumer: dict[str, ConsumerKey] = {}
        # Tuples, not sets: nearly every consumer has one unit (a set of one
        # is 216 bytes, at 100,000 units 20 MiB; a tuple of one 48).
        self.units_by_consumer: dict[ConsumerKey, tuple[str, ...]] = {}
        self._pods: dict[str, _PodSeen] = {}
        self.group_members: dict[tuple[str, str], set[str]] = defaultdict(set)
        self._nodes: dict[str, tuple[Resources, bool, bool]] = {}
        # (kind, namespace, name) of a workload -> the parts its units stand for.
        self._parts: dict[tuple[str, str, str], set[str]] = defaultdict(set)

    def rebuild(self, store: ClusterStore) -> None:
        self.__init__()  # type: ignore[misc]
        for key, unit in store.units.items():
            self.on_unit(key, unit)
        for uid, pod in store.pods.items():
            self.on_pod(uid, pod, pod_root(store, pod))
        for name, node in store.nodes.items():
            self.on_node(name, node)

    async def fill(self, store: ClusterStore, *, chunk: int = 1000) -> None:
        """Index every unit and pod of `store`, yielding every `chunk` of them
        (a large cache must not stall the event loop). Listeners keep the
        index current meanwhile: each entry is indexed from the store as it
        is *now*."""
        for count, key in enumerate(list(store.units), start=1):
            self.on_unit(key, store.units.get(key))
            if count % chunk == 0:
                await asyncio.sleep(0)
        for count, uid in enumerate(list(store.pods), start=1):
            pod = store.pods.get(uid)
            self.on_pod(uid, pod, pod_root(store, pod))
            if count % chunk == 0:
                await asyncio.sleep(0)
        for name in list(store.nodes):
            self.on_node(name, store.nodes.get(name))

    # -- units ----------------------------------------------------------------------
    def on_unit(self, key: str, unit: UnitRecord | None) -> list[ConsumerKey]:
        """Record a unit change; returns the consumers it was / is linked to."""
        touched: list[ConsumerKey] = []
        old = self.unit_consumer.pop(key, None)
        if old is not None:
            touched.append(old)
            members = self.units_by_consumer.get(old)
            if members is not None:
                rest = tuple(k for k in members if k != key)
                if rest:
                    self.units_by_consumer[old] = rest
                else:
                    del self.units_by_consumer[old]
        if old is not None and old.kind in WORKLOAD_CONSUMERS \
                and not self.units_by_consumer.get(old):
            parts = self._parts.get((old.kind, old.namespace, old.name))
            if parts is not None:
                parts.discard(old.part)
                if not parts:
                    del self._parts[(old.kind, old.namespace, old.name)]
        new = consumer_key(unit) if unit is not None else None
        if new is not None:
            self.unit_consumer[key] = new
            members = self.units_by_consumer.get(new, ())
            if key not in members:
                self.units_by_consumer[new] = (*members, key)
            if new.kind in WORKLOAD_CONSUMERS:
                self._parts[(new.kind, new.namespace, new.name)].add(new.part)
            if new != old:
                touched.append(new)
        return touched

    def workload_consumers(self, kind: str, namespace: str, name: str) -> list[ConsumerKey]:
        """The consumers of a workload's existing units (every part)."""
        return [ConsumerKey(kind, namespace, name, part)
                for part in self._parts.get((kind, namespace, name), ())]

    def units_for(self, consumer: ConsumerKey) -> Iterable[str]:
        return self.units_by_consumer.get(consumer, ())

    # -- pods ---------------------------------------------------------------------------
    def on_pod(self, uid: str, pod: PodRecord | None,
               root: ConsumerKey | None = None) -> tuple[list[ConsumerKey], bool]:
        """Record a pod change (`root`: the workload unit its chain reaches);
        returns the consumers to look at again and whether the capacity may
        have changed (an unmanaged pod came, went, moved, or changed phase
        or requests)."""
        touched: list[ConsumerKey] = []
        old = self._pods.pop(uid, None)
        if root is not None:
            touched.append(root)
        if old is not None:
            if old.root is not None and old.root != root:
                touched.append(old.root)
            touched.append(ConsumerKey("Pod", old.namespace, old.name))
            if old.group is not None:
                touched.append(ConsumerKey("PodGroup", old.namespace, old.group))
                members = self.group_members.get((old.namespace, old.group))
                if members is not None:
                    members.discard(uid)
                    if not members:
                        del self.group_members[(old.namespace, old.group)]
        footprint = None
        if pod is not None:
            if pod.queue is None:
                footprint = (pod.node_name, pod.phase, pod.requests)
            self._pods[uid] = _PodSeen(pod.namespace, pod.name, pod.pod_group, footprint, root)
            if old is None or old.name != pod.name or old.namespace != pod.namespace:
                touched.append(ConsumerKey("Pod", pod.namespace, pod.name))
            if pod.pod_group is not None:
                self.group_members[(pod.namespace, pod.pod_group)].add(uid)
                if old is None or old.group != pod.pod_group:
                    touched.append(ConsumerKey("PodGroup", pod.namespace, pod.pod_group))
        capacity = (old.footprint if old is not None else None) != footprint
        return touched, capacity

    # -- nodes --------------------------------------------------------------------------
    def on_node(self, name: str, node: NodeRecord | None) -> bool:
        """Record a node change; whether the capacity may have changed.
        Heartbeats change a Node every few seconds; only what the capacity
        is made of counts."""
        seen = (node.allocatable, node.ready, node.schedulable) if node is not None else None
        if self._nodes.get(name) == seen:
            return False
        if seen is None:
            self._nodes.pop(name, None)
        else:
            self._nodes[name] = seen
        return True

    def group_pods(self, store: ClusterStore, namespace: str, group: str) -> list[PodRecord]:
        pods = (store.pods.get(uid) for uid in self.group_members.get((namespace, group), ()))
        return [pod for pod in pods if pod is not None]

    def consumers(self, store: ClusterStore) -> list[ConsumerKey]:
        """Every consumer that may want a unit (for a full pass)."""
        return [key for keys in self.consumer_slices(store, 2**62) for key in keys]

    def consumer_slices(self, store: ClusterStore, chunk: int) -> Iterator[list[ConsumerKey]]:
        """`consumers` in slices of at most `chunk` records looked at: the
        caller may yield between them (100k pods take a second). Read from
        snapshots, so the store may change meanwhile."""
        jobs, pods = list(store.jobs.values()), list(store.pods.values())
        for start in range(0, len(jobs), chunk):
            yield [ConsumerKey("Job", job.namespace, job.name)
                   for job in jobs[start:start + chunk]]
        for start in range(0, len(pods), chunk):
            yield [ConsumerKey("Pod", pod.namespace, pod.name)
                   for pod in pods[start:start + chunk] if wants_pod_unit(pod)]
        keys = [ConsumerKey("PodGroup", ns, group) for ns, group in self.group_members]
        for integration in store.integrations:
            for record in store.workloads.get(integration.kind, {}).values():
                keys += workloads.consumers_of(record)
        yield keys


def consumer_state(
    store: ClusterStore, index: LoopIndex, unit: UnitRecord, key: ConsumerKey | None = None
) -> tuple[Consumer, tuple[PodRecord, ...]]:
    """What the unit's consumer (`key`, when known already) is doing, as the
    cache sees it, and its pods."""
    ref = unit.consumer
    if key is None:
        key = consumer_key(unit)
    if key is None or ref is None:
        return Consumer.NONE, ()
    if key.kind == "Job":
        state = job_state(store.jobs.get(f"{key.namespace}/{key.name}"), ref.uid)
        if state is Consumer.RELEASED \
                and store.job_pods_started(key.namespace, ref.uid, admitted_at(unit)):
            state = Consumer.RUNNING  # its pods ran while its status lags behind them
        return state, ()
    if key.kind == "Pod":
        pod = store.pod_by_name(key.namespace, key.name)
        return pod_state(pod, ref.uid), ((pod,) if pod is not None else ())
    if key.kind != "PodGroup":
        record = workloads.record_of(store, key)
        pods = () if record is None or record.uid != ref.uid \
            else workloads.pods_of(store, record, key.part)
        return workloads.state(record, ref.uid, pods), pods
    pods = tuple(index.group_pods(store, key.namespace, key.name))
    if unit.members:  # admitted: only the pods recorded then are the group's
        pods = tuple(p for p in pods if p.uid in unit.members)
    return group_state(pods), pods


def desired_unit(
    store: ClusterStore, index: LoopIndex, consumer: ConsumerKey
) -> DesiredUnit | None:
    """The unit `consumer` needs now, if any (none outside managed namespaces)."""
    if not store.is_managed_namespace(consumer.namespace):
        return None
    if consumer.kind == "Job":
        job = store.jobs.get(f"{consumer.namespace}/{consumer.name}")
        if job is None or store.root_workload(job.namespace, job.owner_kind, job.owner_uid) \
                is not None or store.owner_pending(job.owner_kind, job.owner_uid):
            return None  # a held workload's child (a JobSet's Job): its root's unit
        return job_unit(job, store.priority_classes, store.runtime_classes)
    if consumer.kind == "Pod":
        pod = store.pod_by_name(consumer.namespace, consumer.name)
        if pod is None or pod_root(store, pod) is not None \
                or store.owner_pending(pod.owner_kind, pod.owner_uid):
            return None
        return pod_unit(pod)
    if consumer.kind != "PodGroup":
        return workloads.desired(store, consumer, store.priority_classes)
    # A workload's pods are its unit's, whatever group label they carry (an
    # OrderedReady StatefulSet never fills a group: it would wait for ever).
    pods = [p for p in index.group_pods(store, consumer.namespace, consumer.name)
            if pod_root(store, p) is None and not store.owner_pending(p.owner_kind, p.owner_uid)]
    return group_unit(consumer.namespace, consumer.name, pods)


def consumer_uid(store: ClusterStore, consumer: ConsumerKey) -> str | None:
    """The consumer's uid ("" for a pod group); None when it does not exist."""
    if consumer.kind == "Job":
        job = store.jobs.get(f"{consumer.namespace}/{consumer.name}")
        return job.uid if job is not None else None
    if consumer.kind == "Pod":
        pod = store.pod_by_name(consumer.namespace, consumer.name)
        return pod.uid if pod is not None else None
    if consumer.kind != "PodGroup":
        record = workloads.record_of(store, consumer)
        return record.uid if record is not None else None
    return ""


def pod_root(store: ClusterStore, pod: PodRecord | None) -> ConsumerKey | None:
    """The workload unit a pod's controller chain reaches (by uid), if any."""
    found = pod_workload(store, pod) if pod is not None else None
    if found is None:
        return None
    root, part = found
    return ConsumerKey(root.kind, root.namespace, root.name, part)
