"""Reality is charged (DESIGN §13): every bound, unfinished pod in a managed
namespace counts against exactly one queue, whatever its labels say.

A pod is *held* by a unit matched by uid, in the pod's own namespace:

- a Pod unit whose consumerRef.uid is the pod's own uid (a plain pod);
- a pod group's unit that recorded the pod's uid at admission
  (`status.admittedPods`; a group admitted before that was recorded holds
  every pod carrying its label);
- a Job unit whose consumerRef.uid is the pod's controller ownerRef uid,
  or, for a pod with no controller ownerRef (its Job deleted with
  `--cascade=orphan`), the uid in the Job controller's
  `batch.kubernetes.io/controller-uid` label: the unit of a vanished Job
  keeps counting until its pods are gone. That label only picks among the
  namespace's own units, and a pod so held is never covered by a unit that
  no longer counts, so editing it moves a charge between queues the
  namespace uses, never off them.

A unit the engine counts as admitted *covers* the pods it holds up to its
admitted demand, oldest first. Every other pod is *unqueued usage*: a pod
no unit holds (nodeName set at creation, a Job released around arbiter, a
Job orphan-deleted after admission: its pods lose their ownerRef), and a
held pod its unit does not cover (parallelism raised, a resize, a unit's
podSets patched down, a consumer gone). It is charged to its holding unit's
queue (whether that unit counts or not: its queue is its workload's) when
that queue admits the pod's namespace, else to its namespace's queue
(`ClusterStore.resolve_queue` without labels: the Queue listing the
namespace, else the namespace's label; the pod's own queue label is never
read, so relabelling a running pod moves nothing). With no such queue, or
one arbiter does not know, its requests come off the engine's capacity, as
an unmanaged pod's do.

Unqueued usage enters the engine as one admitted unit per pod
(`arbiter.loop.mirror.unqueued_key`), so shares, capability, deserved and
reclaim all see it; reclaiming one evicts the pod. Pods without a queue
label (outside arbiter's webhook altogether) stay unmanaged capacity use
(`ClusterStore.capacity`), as before.

Incremental: a pod change, a unit change (its record or its place in the
engine) and a consumer's units changing mark what to look at again;
`flush` (once per cycle) recomputes only those.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Callable, Iterable

from arbiter.cache.capacity import ACTIVE_POD_PHASES
from arbiter.cache.ownership import WORKLOAD_CONSUMERS, ConsumerKey
from arbiter.cache.records import PodRecord, UnitRecord
from arbiter.cache.store import ClusterStore
from arbiter.core.model import MAIN_POD_SET, Placement, PodSet, Unit
from arbiter.core.resources import Resources
from arbiter.loop.index import LoopIndex, pod_root
from arbiter.loop.mirror import EngineMirror, unqueued_key

UnitLookup = Callable[[str], UnitRecord | None]


def chargeable(store: ClusterStore, pod: PodRecord | None) -> bool:
    """A pod that holds a node's resources, in a namespace arbiter manages,
    that went through arbiter's webhook (it carries a queue label), and is
    not on its way out (an evicted victim's room counts as free already:
    charging it again would take more victims for the same shortfall)."""
    return (pod is not None and bool(pod.node_name) and pod.phase in ACTIVE_POD_PHASES
            and not pod.terminating and pod.queue is not None
            and store.is_managed_namespace(pod.namespace))


def _consumers_of(pod: PodRecord, store: ClusterStore) -> tuple[ConsumerKey, ...]:
    """Every consumer whose unit might hold `pod` (checked by uid after):
    the workload unit its controller chain reaches first, when one does."""
    keys = [ConsumerKey("Pod", pod.namespace, pod.name)]
    root = pod_root(store, pod)
    if root is not None:
        keys.insert(0, root)
    if pod.pod_group:
        keys.append(ConsumerKey("PodGroup", pod.namespace, pod.pod_group))
    if pod.job_name:
        keys.append(ConsumerKey("Job", pod.namespace, pod.job_name))
    if pod.orphan_of is not None:
        keys.append(ConsumerKey("Job", pod.namespace, pod.orphan_of[0]))
    return tuple(keys)


def _queue_to_charge(store: ClusterStore, holder: UnitRecord | None, pod: PodRecord) -> str:
    """The queue an uncovered pod counts against: its holding unit's, when that
    queue admits the pod's namespace; else the namespace's own queue ("": none,
    off the capacity). A unit naming a queue that refuses its namespace (the
    webhook bypassed, or the Queue changed since) never charges that queue."""
    if holder is not None and store.queue_admits(holder.queue, pod.namespace):
        return holder.queue
    return store.resolve_queue(pod.namespace, None) or ""


def holds(unit: UnitRecord, pod: PodRecord, store: ClusterStore | None = None) -> bool:
    """Whether `unit` holds `pod`, by uid only (a workload's unit: by the
    uids of the pod's controller chain, which `store` follows)."""
    ref = unit.consumer
    if ref is None or unit.namespace != pod.namespace:
        return False
    if ref.kind in WORKLOAD_CONSUMERS:
        root = store.root_workload(pod.namespace, pod.owner_kind, pod.owner_uid) \
            if store is not None else None
        return root is not None and bool(ref.uid) and root.uid == ref.uid \
            and root.kind == ref.kind
    if ref.kind == "Pod":
        return ref.name == pod.name and bool(ref.uid) and ref.uid == pod.uid
    if ref.kind == "PodGroup":
        if ref.name != pod.pod_group:
            return False
        return pod.uid in unit.members if unit.members else unit.admissions > 0
    if ref.kind == "Job":
        return bool(ref.uid) and ((ref.name == pod.job_name and ref.uid == pod.job_uid)
                                  or pod.orphan_of == (ref.name, ref.uid))
    return False


class Charges:
    """Which unit holds each bound pod, and which pods are unqueued usage."""

    def __init__(self) -> None:
        self._holder: dict[str, str] = {}  # chargeable pod uid -> unit key ("": none)
        self._held: dict[str, set[str]] = defaultdict(set)  # unit key -> pod uids
        self._by_consumer: dict[ConsumerKey, set[str]] = defaultdict(set)
        self._consumers: dict[str, tuple[ConsumerKey, ...]] = {}  # pod uid -> its keys
        # pod uid -> (its engine key, the queue it is charged to; "": none)
        self.charged: dict[str, tuple[str, str]] = {}
        self._dirty_pods: set[str] = set()
        self._dirty_units: set[str] = set()
        # Units reclaim is taking back (`NodeModel.set_leaving`): their pods
        # are on their way out and their room is the taker's already, so
        # they are charged nowhere (charging them to the victim's queue
        # would take the room back and reclaim again, for ever).
        self._leaving: frozenset[str] = frozenset()

    # -- what changed --------------------------------------------------------------
    def pod(self, uid: str) -> None:
        self._dirty_pods.add(uid)

    def unit(self, key: str) -> None:
        self._dirty_units.add(key)

    def consumers(self, keys: Iterable[ConsumerKey]) -> None:
        """A unit of these consumers came, went or changed: who holds their pods may too."""
        for key in keys:
            self._dirty_pods.update(self._by_consumer.get(key, ()))

    def everything(self, store: ClusterStore) -> None:
        self._dirty_pods.update(store.pods)
        self._dirty_pods.update(self._holder)

    def set_leaving(self, keys: Iterable[str]) -> None:
        leaving = frozenset(keys)
        if leaving != self._leaving:
            self._dirty_units.update(leaving ^ self._leaving)
            self._leaving = leaving

    # -- recomputing ------------------------------------------------------------------
    def pending(self) -> bool:
        return bool(self._dirty_pods or self._dirty_units)

    def flush(self, store: ClusterStore, index: LoopIndex, mirror: EngineMirror,
              unit_of: UnitLookup, *, limit: int | None = None) -> None:
        """Bring the engine's unqueued entries up to date with what changed
        (at most `limit` pods; the rest wait for the next call: a new
        leader's first look at every pod must not stall the event loop)."""
        units = self._dirty_units
        self._dirty_units = set()
        if limit is None or len(self._dirty_pods) <= limit:
            pods, self._dirty_pods = self._dirty_pods, set()
        else:
            pods = set(itertools.islice(self._dirty_pods, limit))
            self._dirty_pods -= pods
        for uid in pods:
            pod = store.pods.get(uid)
            if not chargeable(store, pod):
                if uid not in self._consumers and uid not in self._holder:
                    continue  # never charged, still not: the common case
                pod = None
            self._index(uid, pod, store)
            holder = self._find_holder(pod, index, unit_of, store) if pod is not None else None
            old = self._holder.get(uid)
            if holder:
                units.add(holder)  # its requests may have changed (a resize)
            if old == holder:
                continue
            if old:
                self._unhold(old, uid)
                units.add(old)
            if holder is None:
                del self._holder[uid]
                self._charge(store, mirror, uid, None, None)
            else:
                self._holder[uid] = holder
                if holder:
                    self._held[holder].add(uid)
        for key in units:
            self._cover(key, store, mirror, unit_of)
        for uid in pods:
            if self._holder.get(uid) == "":
                pod = store.pods.get(uid)
                assert pod is not None
                queue = store.resolve_queue(pod.namespace, None) or ""
                self._charge(store, mirror, uid, pod, queue)

    def _index(self, uid: str, pod: PodRecord | None, store: ClusterStore) -> None:
        old = self._consumers.pop(uid, ())
        for key in old:
            members = self._by_consumer.get(key)
            if members is not None:
                members.discard(uid)
                if not members:
                    del self._by_consumer[key]
        if pod is not None:
            keys = _consumers_of(pod, store)
            self._consumers[uid] = keys
            for key in keys:
                self._by_consumer[key].add(uid)

    def _unhold(self, key: str, uid: str) -> None:
        members = self._held.get(key)
        if members is not None:
            members.discard(uid)
            if not members:
                del self._held[key]

    @staticmethod
    def _find_holder(pod: PodRecord, index: LoopIndex, unit_of: UnitLookup,
                     store: ClusterStore) -> str:
        for consumer in _consumers_of(pod, store):
            for key in index.units_for(consumer):
                unit = unit_of(key)
                if unit is not None and holds(unit, pod, store):
                    return key
        return ""

    def _cover(self, key: str, store: ClusterStore, mirror: EngineMirror,
               unit_of: UnitLookup) -> None:
        """Charge the pods unit `key` holds that its admitted demand does not cover."""
        uids = self._held.get(key)
        if not uids:
            return
        if key in self._leaving:
            for uid in uids:
                self._charge(store, mirror, uid, None, None)
            return
        entry = mirror.entries.get(key)
        counted = entry is not None and entry[0] in ("admitted", "orphan")
        budget = entry[1].demand if entry is not None and counted else None
        record = unit_of(key)
        pods = sorted((p for p in map(store.pods.get, uids) if p is not None),
                      key=lambda p: (p.created, p.name, p.uid))
        for pod in pods:
            if budget is not None and pod.requests.fits_in(budget):
                budget = budget - pod.requests
                self._charge(store, mirror, pod.uid, None, None)
                continue
            self._charge(store, mirror, pod.uid, pod, _queue_to_charge(store, record, pod))

    def _charge(self, store: ClusterStore, mirror: EngineMirror, uid: str,
                pod: PodRecord | None,
                queue: str | None) -> None:
        """Charge `pod` to `queue` as unqueued usage ("" for no queue: off the
        capacity), or nothing (`pod` None)."""
        if pod is None or queue is None:
            known = self.charged.pop(uid, None)
            if known is not None:
                mirror.set_unqueued(known[0], None)
                mirror.nodes.charge(uid, None, store.pods.get(uid))
            return
        key = unqueued_key(pod.namespace, pod.name, uid)
        if self.charged.get(uid, ("", None))[0] not in ("", key):
            self._charge(store, mirror, uid, None, None)  # renamed: a new key
        self.charged[uid] = (key, queue)
        # Planned at its node, so that node fit (and a reclaim pass) sees
        # where its room is.
        pool = store.pool_of_node(pod.node_name or "")
        plan = Placement(pool, {MAIN_POD_SET: (pod.node_name,)}) \
            if pool is not None and pod.node_name else None
        mirror.nodes.charge(uid, key, pod)
        mirror.set_unqueued(key, Unit(
            key=key, queue=queue, demand=pod.requests, priority=pod.priority,
            created=pod.created, pods=(PodSet(MAIN_POD_SET, 1, pod.requests),)), plan)

    def usage(self, store: ClusterStore) -> dict[str, tuple[Resources, int]]:
        """Per queue: its unqueued usage and how many pods make it (tests, views)."""
        out: dict[str, tuple[Resources, int]] = {}
        for uid, (_, queue) in self.charged.items():
            pod = store.pods.get(uid)
            if pod is None:
                continue
            total, count = out.get(queue, (Resources(), 0))
            out[queue] = (total + pod.requests, count + 1)
        return out
