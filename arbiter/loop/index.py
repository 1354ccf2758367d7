"""Indexes the loop keeps beside the store: which units stand for which
consumer, which pods make up each pod group, and which pods are unmanaged
(their requests lower the capacity). Each one remembers what it saw, so a
deletion (whose record the store has already dropped) still finds its
unit, group and capacity effect.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from arbiter.cache.ownership import ConsumerKey
from arbiter.cache.records import PodRecord, UnitRecord
from arbiter.cache.store import ClusterStore
from arbiter.loop.units import (
    Consumer,
    consumer_key,
    group_state,
    job_state,
    pod_state,
    wants_pod_unit,
)


@dataclass(frozen=True, slots=True)
class _PodSeen:
    namespace: str
    name: str
    group: str | None
    # For pods without a queue: what the capacity depends on, else None.
    footprint: tuple[object, ...] | None


class LoopIndex:
    def __init__(self) -> None:
        self.unit_consumer: dict[str, ConsumerKey] = {}
        self.units_by_consumer: dict[ConsumerKey, set[str]] = defaultdict(set)
        self._pods: dict[str, _PodSeen] = {}
        self.group_members: dict[tuple[str, str], set[str]] = defaultdict(set)

    def rebuild(self, store: ClusterStore) -> None:
        self.__init__()  # type: ignore[misc]
        for key, unit in store.units.items():
            self.on_unit(key, unit)
        for uid, pod in store.pods.items():
            self.on_pod(uid, pod)

    # -- units ----------------------------------------------------------------------
    def on_unit(self, key: str, unit: UnitRecord | None) -> list[ConsumerKey]:
        """Record a unit change; returns the consumers it was / is linked to."""
        touched: list[ConsumerKey] = []
        old = self.unit_consumer.pop(key, None)
        if old is not None:
            touched.append(old)
            members = self.units_by_consumer.get(old)
            if members is not None:
                members.discard(key)
                if not members:
                    del self.units_by_consumer[old]
        new = consumer_key(unit) if unit is not None else None
        if new is not None:
            self.unit_consumer[key] = new
            self.units_by_consumer[new].add(key)
            if new != old:
                touched.append(new)
        return touched

    def units_for(self, consumer: ConsumerKey) -> Iterable[str]:
        return tuple(self.units_by_consumer.get(consumer, ()))

    # -- pods ---------------------------------------------------------------------------
    def on_pod(self, uid: str, pod: PodRecord | None) -> tuple[list[ConsumerKey], bool]:
        """Record a pod change; returns the consumers to look at again and
        whether the capacity may have changed (an unmanaged pod came, went,
        moved, or changed phase or requests)."""
        touched: list[ConsumerKey] = []
        old = self._pods.pop(uid, None)
        if old is not None:
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
            self._pods[uid] = _PodSeen(pod.namespace, pod.name, pod.pod_group, footprint)
            if old is None or old.name != pod.name or old.namespace != pod.namespace:
                touched.append(ConsumerKey("Pod", pod.namespace, pod.name))
            if pod.pod_group is not None:
                self.group_members[(pod.namespace, pod.pod_group)].add(uid)
                if old is None or old.group != pod.pod_group:
                    touched.append(ConsumerKey("PodGroup", pod.namespace, pod.pod_group))
        capacity = (old.footprint if old is not None else None) != footprint
        return touched, capacity

    def group_pods(self, store: ClusterStore, namespace: str, group: str) -> list[PodRecord]:
        pods = (store.pods.get(uid) for uid in self.group_members.get((namespace, group), ()))
        return [pod for pod in pods if pod is not None]

    def consumers(self, store: ClusterStore) -> list[ConsumerKey]:
        """Every consumer that may want a unit (for a full pass)."""
        keys = [ConsumerKey("Job", job.namespace, job.name) for job in store.jobs.values()]
        keys += [
            ConsumerKey("Pod", pod.namespace, pod.name)
            for pod in store.pods.values()
            if wants_pod_unit(pod)
        ]
        keys += [ConsumerKey("PodGroup", ns, group) for ns, group in self.group_members]
        return keys


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
        return job_state(store.jobs.get(f"{key.namespace}/{key.name}"), ref.uid), ()
    if key.kind == "Pod":
        pod = store.pod_by_name(key.namespace, key.name)
        return pod_state(pod, ref.uid), ((pod,) if pod is not None else ())
    pods = tuple(index.group_pods(store, key.namespace, key.name))
    return group_state(pods), pods
