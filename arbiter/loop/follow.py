"""What a store change means for the engine: one piece for the admission
loop and for a replica that does not lead (the debug API's view), so both
engines hold the same units, nodes, pools and charges.

`StoreFollower.note` takes each store change. It updates at once what
must see every change (the loop's indexes, the node model, the charges)
and marks what to look at again: units, consumers (whose units are looked
at), the queues, the capacity, or everything (a Namespace or an
AdmissionCheck changed, or the access rules of the Queues). A pass then
applies the marks: `begin` (queues, capacity, everything), `where` +
`place` per unit, the charges' `flush` and the nodes' `sync_nodes`.

The loop adds what only a leader has (`AdmissionController`): its writes in
flight (a unit it is admitting, a write the watch has not confirmed yet),
unit creation, steps and timers. A replica has none: `apply` is its pass,
from the store alone.
"""

from __future__ import annotations

import asyncio
import time

from arbiter.cache.ownership import ConsumerKey
from arbiter.cache.records import PodRecord, UnitRecord
from arbiter.cache.store import WORKLOAD_KINDS, ClusterStore, Kind
from arbiter.loop import workloads
from arbiter.loop.access import barred
from arbiter.loop.charges import Charges
from arbiter.loop.consumers import Consumer
from arbiter.loop.index import LoopIndex, consumer_state, desired_unit, pod_root
from arbiter.loop.mirror import EngineMirror, engine_unit, recorded_plan, submitted, unqueued_pod
from arbiter.loop.units import (
    DesiredUnit,
    Disposition,
    consumer_key,
    disposition,
    follows_consumer,
    spec_drift,
)


class StoreFollower:
    """The engine (`mirror`) with the indexes, node model and charges that
    keep it in step with one `ClusterStore`, and what is left to look at."""

    def __init__(self, store: ClusterStore, overcommit: float = 1.0) -> None:
        self.store = store
        self.overcommit = overcommit
        self.mirror = EngineMirror()
        self.mirror.nodes.overcommit = overcommit
        self.index = LoopIndex()
        # Bound pods no admitted unit covers (DESIGN §13, "reality is charged").
        self.charges = Charges()
        # What the next pass must look at.
        self.everything = True
        self.queues_dirty = True
        self.capacity_dirty = True
        self.units: set[str] = set()
        self.consumers: set[ConsumerKey] = set()
        self.indexed = False
        self._access_seen = store.access_generation
        # What each consumer asks, computed once per pass (the store does not
        # change during one).
        self._wanted: dict[ConsumerKey, DesiredUnit | None] = {}

    def on_change(self, kind: Kind, key: str) -> None:
        """Store listener (a replica's view)."""
        self.note(kind, key)

    def note(self, kind: Kind, key: str) -> bool:
        """Note what changed; False when nothing the engine sees did (a Node
        heartbeat, a kind not followed)."""
        store = self.store
        if kind == "QueueUnit":
            self.units.add(key)
            touched = self.index.on_unit(key, store.units.get(key))
            self.consumers.update(touched)
            self.charges.consumers(touched)
        elif kind == "Job":
            namespace, _, name = key.partition("/")
            self.consumers.add(ConsumerKey("Job", namespace, name))
        elif kind in WORKLOAD_KINDS:
            namespace, _, name = key.partition("/")
            record = store.workloads[kind].get(key)
            self.consumers.update(self.index.workload_consumers(kind, namespace, name))
            if record is not None:
                self.consumers.update(workloads.consumers_of(record))
        elif kind == "Pod":
            pod = store.pods.get(key)
            touched, capacity = self.index.on_pod(key, pod, pod_root(store, pod))
            self.mirror.nodes.on_pod(key, pod)
            self.charges.pod(key)
            self.consumers.update(touched)
            self.capacity_dirty = self.capacity_dirty or capacity
        elif kind == "Queue":
            self.queues_dirty = True
            if store.access_generation != self._access_seen:
                # Which namespaces may use which queue changed (rare): every
                # unit may be barred or cleared (arbiter.loop.access).
                self._access_seen = store.access_generation
                self.everything = True
        elif kind == "Node":
            node = store.nodes.get(key)
            placed = self.mirror.nodes.on_node(key, node)
            if not self.index.on_node(key, node) and not placed:
                return False  # a heartbeat: the capacity is the same
            self.capacity_dirty = True
        elif kind == "Pool":
            self.mirror.nodes.set_pools(store.pools.values())
        elif kind in ("Namespace", "AdmissionCheck"):
            self.everything = True  # rare: look at everything again
        else:
            return False
        return True

    def pending(self) -> bool:
        """Whether a pass has anything to do."""
        return bool(self.units or self.consumers or self.everything or self.queues_dirty
                    or self.capacity_dirty or self.charges.pending())

    # -- a pass ----------------------------------------------------------------------
    def begin(self) -> bool:
        """Start a pass: with `everything` marked, queue every consumer and
        unit (indexing the store the first time, the nodes again); bring
        the queues and capacity up to date. Whether everything was queued."""
        store, mirror = self.store, self.mirror
        self._wanted.clear()
        full = self.everything
        if full:
            self.everything = False
            if not self.indexed:
                self.index.rebuild(store)
                self.indexed = True
            mirror.nodes.rebuild(store)
            self.consumers.update(self.index.consumers(store))
            self.units.update(store.units)
            self.charges.everything(store)
            self.queues_dirty = self.capacity_dirty = True
        if self.queues_dirty:
            # Charges follow a namespace's queue, which only a Queue's
            # creation, deletion or namespaces change (the access generation:
            # a look at everything, above); a status write changes none.
            mirror.set_queues(store.queues)
            self.queues_dirty = False
        if self.capacity_dirty:
            mirror.set_capacity(store.capacity(self.overcommit))
            self.capacity_dirty = False
        return full

    async def resync(self, *, reindex: bool = False, chunk: int = 1000) -> None:
        """Queue every consumer and unit for a look, in slices, yielding
        between them (a large cache must not stall the webhook that shares
        this event loop). With `reindex`, rebuild the index and the node
        model first (`LoopIndex.fill`)."""
        store = self.store
        if reindex:
            self.indexed = False
            self.index = LoopIndex()
            await self.index.fill(store, chunk=chunk)
            self.mirror.nodes.rebuild(store)
        for consumers in self.index.consumer_slices(store, chunk):
            self.consumers.update(consumers)
            await asyncio.sleep(0)
        keys = list(store.units)
        for start in range(0, len(keys), chunk):
            self.units.update(keys[start:start + chunk])
            await asyncio.sleep(0)
        self.charges.everything(store)
        self.queues_dirty = self.capacity_dirty = True
        self.everything = False
        if reindex:
            # Only now: a standby handing over before every unit is queued
            # (so before its engine can have them all) must not count as warm.
            self.indexed = True

    def where(self, unit: UnitRecord, consumer: Consumer, now: float) -> Disposition:
        """Where the store puts `unit` in the engine: its disposition, but
        out while its queue does not admit its namespace (a barred unit is
        never admitted nor charged there), and a waiting one out while its
        spec is not its consumer's or an admission check sent it back
        until `requeue_at`."""
        if barred(self.store, unit) is not None:
            return None
        where = disposition(unit, consumer)
        if where == "pending" and (
                self.drifted(unit) or (unit.requeue_at is not None and unit.requeue_at > now)):
            return None
        return where

    def place(self, key: str, unit: UnitRecord, where: Disposition,
              pods: tuple[PodRecord, ...]) -> None:
        """Tell the engine that `unit` (whose consumer has `pods`) is `where`."""
        self.mirror.set(key, where, engine_unit(unit, submitted(self.store, unit, pods), key),
                        recorded_plan(unit))

    def desired(self, consumer: ConsumerKey) -> DesiredUnit | None:
        if consumer not in self._wanted:
            self._wanted[consumer] = desired_unit(self.store, self.index, consumer)
        return self._wanted[consumer]

    def drifted(self, unit: UnitRecord) -> bool:
        """A waiting unit whose spec (pod sets, queue, priority) is not what
        its consumer asks now, or whose consumer asks for no unit at all:
        what is admitted is the consumer's demand, never a tenant's edit of
        the unit (the loop writes the correction)."""
        if not follows_consumer(unit):
            return False
        key = consumer_key(unit)
        wanted = self.desired(key) if key is not None else None
        if wanted is None or unit.consumer is None or wanted.consumer_uid != unit.consumer.uid:
            return True
        return spec_drift(unit, wanted) is not None

    # -- a replica's pass --------------------------------------------------------------
    def look(self, key: str, now: float) -> None:
        """Put unit `key` where the store alone says (a replica that does
        not lead has no writes of its own to account for)."""
        if unqueued_pod(key) is not None:
            return  # a pod's unqueued usage (arbiter.loop.charges), not a unit
        self.charges.unit(key)
        unit = self.store.units.get(key)
        if unit is None or not self.store.is_managed_namespace(unit.namespace):
            self.mirror.set(key, None, None)
            return
        consumer, pods = consumer_state(self.store, self.index, unit)
        self.place(key, unit, self.where(unit, consumer, now), pods)

    def apply(self, now: float, budget: int | None = None) -> bool:
        """Bring the engine up to date with what changed, as a replica that
        does not lead: at most `budget` units and pods in all now (units
        first: charges depend on them), the rest at the next call. Whether
        it is up to date (its nodes too)."""
        self.begin()
        while self.consumers:
            self.units.update(self.index.units_for(self.consumers.pop()))
        left = budget if budget is not None else -1
        while self.units and left != 0:
            self.look(self.units.pop(), now)
            left -= 1
        if self.units:
            return False
        self.charges.flush(self.store, self.index, self.mirror, self.store.units.get,
                           limit=None if left < 0 else left)
        if self.charges.pending():
            return False
        self.mirror.sync_nodes()
        return True


def mirror_from_store(store: ClusterStore, overcommit: float = 1.0,
                      now: float | None = None) -> EngineMirror:
    """An engine over the cache as it is, with no loop behind it (a view
    built once: tests, benchmarks)."""
    follow = StoreFollower(store, overcommit)
    follow.apply(time.time() if now is None else now)
    return follow.mirror
