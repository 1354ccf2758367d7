"""What the extender needs beyond the cache's records, kept current cheaply.

kube-scheduler calls filter for every pod with every feasible node, so no
request may walk all pods. `ExtenderState` subscribes to the store's change
notifications and keeps running sums that a request reads in O(1) per node:

- what each node's bound pods request (bin-packing),
- what each queue's bound pods request (the `capability` check): a pod is
  charged to the queue of the unit that holds it, matched by uid
  (`unit_of`), else to its namespace's queue; never by its own labels,
  which are the tenant's to write,
- on which nodes each gang (a Job's or a pod group's pods) already runs
  (locality),
- the cluster's total allocatable (the pod's dominant resource),
- per queue nodeSelector in use, the nodes it matches (`nodesets.py`),
- per pod shape being scheduled, each node's encoded packing score
  (`scores.py`),

plus the pods approved but not yet seen bound (`assumed`). A pod "holds" its
requests from the moment it has a node until it reaches a terminal phase or
is gone, as kube-scheduler counts it (terminating pods still hold theirs).

Everything runs on the asyncio loop that applies watch events, so a request
sees a consistent state and its decision and its `assume` are atomic.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from arbiter.cache.fastpath import job_token
from arbiter.cache.ownership import (
    gate_consumer,
    holding_unit,
    pod_consumer,
    pod_workload,
)
from arbiter.cache.records import PodRecord, UnitRecord
from arbiter.cache.store import WORKLOAD_KINDS, ClusterStore, Kind
from arbiter.core.fastpath import FastPathToken
from arbiter.core.resources import Resources
from extender.assumed import AssumedPods
from extender.nodesets import Labels, SelectorNodeSets
from extender.scores import ScoreTables

TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})

Amounts = dict[str, int]


def unit_name(pod: PodRecord) -> str:
    """The name of the QueueUnit a managed pod belongs to, by the loop's
    naming: `job-<job>` for a Job's pods, `group-<group>` for a pod group's,
    else `pod-<pod>`; the unit lives in the pod's namespace."""
    return pod_consumer(pod).unit_name


def unit_key(pod: PodRecord) -> str:
    """`namespace/name` of the pod's QueueUnit, as `ClusterStore.units` keys it."""
    return pod_consumer(pod).unit_key


def gang_key(pod: PodRecord) -> str | None:
    """The unit key for pods that come in gangs (Job, pod group); None for a lone pod."""
    return unit_key(pod) if pod.job_name or pod.pod_group else None


@dataclass(frozen=True, slots=True)
class _Held:
    """What one bound, non-terminal pod contributes to the sums."""

    node: str
    namespace: str
    queue: str | None
    gang: str | None
    requests: Resources
    # The keys of the units that could hold the pod (`ExtenderState._unit_pods`).
    unit_keys: frozenset[str]


def _index_one(table: dict[str, set[str]], key: str, uid: str, sign: int) -> None:
    uids = table.setdefault(key, set())
    if sign > 0:
        uids.add(uid)
    else:
        uids.discard(uid)
        if not uids:
            del table[key]


def _add_one(table: dict[str, dict[str, int]], outer: str, inner: str, delta: int) -> None:
    """table[outer][inner] += delta, dropping zeros (and empty inner tables)."""
    values = table.get(outer)
    if values is None:
        values = table[outer] = {}
    total = values.get(inner, 0) + delta
    if total:
        values[inner] = total
    else:
        values.pop(inner, None)
        if not values:
            del table[outer]


_EMPTY_AMOUNTS: Mapping[str, int] = {}


class ExtenderState:
    def __init__(
        self,
        store: ClusterStore,
        *,
        assume_ttl: float = 30.0,
        overcommit: float = 1.0,
        locality_weight: int = 1,
        binpack_weight: int = 1,
        clock: Callable[[], float] = time.monotonic,
        fast_path_key: bytes | None = None,
    ) -> None:
        if locality_weight < 0 or binpack_weight < 0:
            raise ValueError("prioritize weights must not be negative")
        self.store = store
        self.overcommit = overcommit
        # Checks the token of a Job admitted at creation (DESIGN §16).
        self.fast_path_key = fast_path_key
        self.locality_weight = locality_weight
        self.binpack_weight = binpack_weight
        self.assumed = AssumedPods(assume_ttl, clock)
        self._held: dict[str, _Held] = {}
        # unit key -> uids of held pods a unit of that name could hold: a
        # unit's arrival or change re-charges exactly those pods.
        self._unit_pods: dict[str, set[str]] = {}
        # namespace -> uids of its held pods: a pod no unit holds is charged
        # to its namespace's queue, so a Namespace change (its queue label,
        # managed or not) or a Queue's namespaces changing re-charge them.
        # Marked stale per burst of changes and re-charged once, soon after
        # (`_recharge_stale`), not once per event of a list.
        self._namespace_pods: dict[str, set[str]] = {}
        self._stale_namespaces: set[str] = set()
        self._all_stale = False
        self._recharge_scheduled = False
        self._access_seen = store.access_generation
        # resource -> node -> amount: prioritize reads one resource for many
        # nodes, so it gets a plain dict per resource (C-speed lookups).
        self._used_by_resource: dict[str, dict[str, int]] = {}
        self._queue_used: dict[str, Amounts] = {}
        self._gang_nodes: dict[str, dict[str, int]] = {}
        self._node_allocatable: dict[str, Resources] = {}
        self._allocatable_by_resource: dict[str, dict[str, int]] = {}
        self._allocatable_total: Amounts = {}
        self.node_sets = SelectorNodeSets(store.nodes)
        self.scores = ScoreTables(
            known=store.nodes,
            used_by_resource=self._used_by_resource,
            allocatable_by_resource=self._allocatable_by_resource,
        )
        self._listening = False
        self.rebuild()
        store.listeners.append(self.on_change)
        self._listening = True

    def close(self) -> None:
        """Stop following the store."""
        if self._listening:
            self.store.listeners.remove(self.on_change)
            self._listening = False

    # -- maintenance -----------------------------------------------------------
    def rebuild(self) -> None:
        self._held.clear()
        self._unit_pods.clear()
        self._namespace_pods.clear()
        self._used_by_resource.clear()
        self._queue_used.clear()
        self._gang_nodes.clear()
        self.scores.clear()
        for uid in list(self.store.pods):
            self._update_pod(uid)
        self._rebuild_nodes()

    def _rebuild_nodes(self) -> None:
        self._node_allocatable.clear()
        self._allocatable_by_resource.clear()
        self._allocatable_total.clear()
        self.scores.clear()
        self.node_sets.rebuild()
        for name in self.store.nodes:
            self._update_node(name)
        self._retain_selectors()

    def on_change(self, kind: Kind, key: str) -> None:
        if kind == "Pod":
            self._update_pod(key)
        elif kind == "Node":
            self.node_sets.update(key)
            self._update_node(key)
        elif kind == "Queue":
            self._retain_selectors()
            if self.store.access_generation != self._access_seen:
                self._access_seen = self.store.access_generation
                self._mark_stale(None)
        elif kind == "Namespace":
            self._mark_stale(key)
        elif kind == "QueueUnit":
            for uid in tuple(self._unit_pods.get(key, ())):
                self._update_pod(uid)
        elif kind in WORKLOAD_KINDS or kind == "Job":
            self._update_chain(kind, key)

    def _update_chain(self, kind: Kind, key: str) -> None:
        """A workload (or a child Job) seen or changed: the pods below it on
        controller chains may now reach a held root (or no longer), so their
        unit, queue and gang are found again. A Job of no controller has no
        chain of its own to follow."""
        record = self.store.table(kind).get(key)
        if record is None or (kind == "Job" and not record.owner_uid):
            return
        for uid in self.store.owners.descendants(record.uid):
            if uid in self.store.pods:
                self._update_pod(uid)

    def _mark_stale(self, namespace: str | None) -> None:
        """The charges of `namespace`'s held pods (None: every namespace's)
        may have moved; re-charge them once the current burst of watch
        events has been applied (at the latest before the next read)."""
        if namespace is None:
            self._all_stale = True
        elif namespace in self._namespace_pods:
            self._stale_namespaces.add(namespace)
        else:
            return
        if self._recharge_scheduled:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # applied outside a loop (tools, tests): now
            self._recharge_stale()
            return
        self._recharge_scheduled = True
        loop.call_soon(self._recharge_stale)

    def _recharge_stale(self) -> None:
        """O(held pods of the stale namespaces); all of them after a Queue's
        namespaces changed (an admin's edit, not a request)."""
        self._recharge_scheduled = False
        if self._all_stale:
            uids: list[str] = list(self._held)
        else:
            uids = [uid for namespace in self._stale_namespaces
                    for uid in self._namespace_pods.get(namespace, ())]
        self._all_stale = False
        self._stale_namespaces.clear()
        for uid in uids:
            self._update_pod(uid)

    def _retain_selectors(self) -> None:
        # O(queues) per Queue event, never per request.
        self.node_sets.retain(queue.node_selector for queue in self.store.queues.values())

    def _holding(self, pod: PodRecord | None) -> _Held | None:
        if pod is None or not pod.node_name or pod.phase in TERMINAL_PHASES:
            return None
        workload = pod_workload(self.store, pod)
        # A held workload's pods are one gang per unit (an LWS group's).
        root_key = workload[0].unit_key(workload[1]) if workload is not None else None
        keys = {pod_consumer(pod).unit_key, gate_consumer(pod).unit_key}
        return _Held(pod.node_name, pod.namespace, self.charged_queue(pod),
                     root_key or gang_key(pod),
                     pod.requests, frozenset(keys if root_key is None else keys | {root_key}))

    def _index(self, uid: str, held: _Held, sign: int) -> None:
        for key in held.unit_keys:
            _index_one(self._unit_pods, key, uid, sign)
        _index_one(self._namespace_pods, held.namespace, uid, sign)

    def _update_pod(self, uid: str) -> None:
        pod = self.store.pods.get(uid)
        if pod is None or pod.node_name or pod.phase in TERMINAL_PHASES:
            # Bound (now counted as held), gone or finished: no longer assumed.
            self.assumed.forget(uid)
        new = self._holding(pod)
        old = self._held.get(uid)
        if old == new:
            return
        if old is not None:
            self._apply(old, -1)
            self._index(uid, old, -1)
        if new is not None:
            self._apply(new, 1)
            self._index(uid, new, 1)
            self._held[uid] = new
        else:
            self._held.pop(uid, None)

    def _apply(self, held: _Held, sign: int) -> None:
        for resource, value in held.requests.items():
            _add_one(self._used_by_resource, resource, held.node, sign * value)
            self.scores.usage_changed(resource, held.node)
        if held.queue is not None:
            for resource, value in held.requests.items():
                _add_one(self._queue_used, held.queue, resource, sign * value)
        if held.gang is not None:
            _add_one(self._gang_nodes, held.gang, held.node, sign)

    def _update_node(self, name: str) -> None:
        record = self.store.nodes.get(name)
        old = self._node_allocatable.get(name)
        new = record.allocatable if record is not None else None
        if old == new:
            return
        self.scores.node_changed(name)
        if old is not None:
            for resource, value in old.items():
                self._allocatable_total[resource] = self._allocatable_total.get(resource, 0) - value
                _add_one(self._allocatable_by_resource, resource, name, -value)
            del self._node_allocatable[name]
        if new is not None:
            for resource, value in new.items():
                self._allocatable_total[resource] = self._allocatable_total.get(resource, 0) + value
                _add_one(self._allocatable_by_resource, resource, name, value)
            self._node_allocatable[name] = new

    # -- queries ---------------------------------------------------------------
    def node_used(self, node: str) -> Mapping[str, int]:
        """What the pods bound to `node` request."""
        return {
            resource: nodes[node]
            for resource, nodes in self._used_by_resource.items()
            if node in nodes
        }

    def used_by_node(self, resource: str) -> Mapping[str, int]:
        """node -> what its bound pods request of `resource` (absent: 0)."""
        return self._used_by_resource.get(resource, _EMPTY_AMOUNTS)

    def allocatable_by_node(self, resource: str) -> Mapping[str, int]:
        """node -> its allocatable `resource` (absent: 0)."""
        self.allocatable_total()  # recount first if a relist dropped nodes silently
        return self._allocatable_by_resource.get(resource, _EMPTY_AMOUNTS)

    def queue_in_use(self, queue: str, *, excluding: str | None = None) -> Resources:
        """Bound pods of `queue` plus its assumed ones (not counting pod `excluding`)."""
        if self._all_stale or self._stale_namespaces:
            self._recharge_stale()
        bound = Resources(self._queue_used.get(queue, _EMPTY_AMOUNTS))
        return bound + self.assumed.usage(queue, excluding=excluding)

    def gang_nodes(self, gang: str) -> Mapping[str, int]:
        """node -> number of the gang's pods bound there."""
        return self._gang_nodes.get(gang, _EMPTY_AMOUNTS)

    def allocatable_total(self) -> Mapping[str, int]:
        if len(self._node_allocatable) != len(self.store.nodes):
            # A relist removed nodes without a notification: recount.
            self._rebuild_nodes()
        return self._allocatable_total

    def node_labels(self, name: str) -> Labels | None:
        """The node's labels as a set of pairs; None for a node the cache does not know."""
        return self.node_sets.labels(name)

    def unit_of(self, pod: PodRecord) -> UnitRecord | None:
        """The unit that holds `pod`, when it stands for this very pod: for a
        pod of a held workload (its controller chain reaches it by uid), that
        workload's unit for the workload's uid; for a Job's pod, the Job of
        the pod's controller uid; for a plain pod, the pod's uid. A unit
        found by name alone (a stale one of a deleted Job or pod of that
        name) holds nothing. A pod group's unit records no uid: its pods are
        the ones labelled so at creation (the label cannot change), in the
        unit's own namespace."""
        workload = pod_workload(self.store, pod)
        if workload is not None:
            return self.store.workload_unit(*workload)
        unit = holding_unit(pod, self.store.units, self.store.unit_by_consumer_uid)[1]
        consumer = None if unit is None else unit.consumer
        if consumer is None:
            return None
        if consumer.kind == "Job":
            uid = pod.job_uid
        elif consumer.kind == "Pod":
            uid = pod.uid
        elif consumer.kind == "PodGroup":
            return unit
        else:
            return None  # a workload's unit holds only the pods of its chain
        return unit if uid and consumer.uid == uid else None

    def admitted_at_creation(self, pod: PodRecord) -> FastPathToken | None:
        """The token of the pod's Job when arbiter let that Job through
        admitted at its creation (DESIGN §16) and its unit is not seen yet:
        arbiter's own record, checked (HMAC) against the Job as cached, by
        the uid the pod's controller ref names. A tenant's annotation never
        verifies."""
        if not pod.job_name or not pod.job_uid:
            return None
        job = self.store.jobs.get(f"{pod.namespace}/{pod.job_name}")
        if job is None or job.uid != pod.job_uid or job.suspended:
            return None
        return job_token(self.fast_path_key, job)

    def released_job(self, pod: PodRecord, unit: UnitRecord) -> bool:
        """Whether the pod's Job, whose unit still reads Enqueued here, was
        let go by arbiter: the loop sends a Job's unsuspend together with
        its unit's status write (DESIGN §16), and only arbiter may unsuspend
        a held Job (the webhook), so either write is the admission's record."""
        if unit.phase != "Enqueued" or unit.consumer is None or unit.consumer.kind != "Job" \
                or not pod.job_name or not self.store.queue_admits(unit.queue, unit.namespace):
            return False
        job = self.store.jobs.get(f"{pod.namespace}/{pod.job_name}")
        return job is not None and job.uid == pod.job_uid == unit.consumer.uid \
            and not job.suspended and job.outcome is None

    def charged_queue(self, pod: PodRecord) -> str | None:
        """The queue a bound pod counts against: its unit's, else (no unit
        stands for it: it was never queued) its namespace's queue."""
        unit = self.unit_of(pod)
        if unit is not None:
            return unit.queue
        if not self.is_managed(pod):
            return None
        return self.store.resolve_queue(pod.namespace, None)

    def is_managed(self, pod: PodRecord) -> bool:
        """Arbiter manages every pod in a managed namespace, labelled or not:
        the webhook's rule (DESIGN §3), from the same function. A pod there
        without a queue label got past the webhook (bypassed, or created
        before arbiter) and is checked all the same."""
        return self.store.is_managed_namespace(pod.namespace)

    def queue_of(self, pod: PodRecord) -> str | None:
        """The queue a pod being placed is checked against: its unit's;
        without one (it will be refused) the queue the webhook resolves,
        its label, else its namespace's (`ClusterStore.resolve_queue`)."""
        unit = self.unit_of(pod)
        if unit is not None:
            return unit.queue
        if pod.queue is not None:
            return pod.queue
        return self.store.resolve_queue(pod.namespace, None)
