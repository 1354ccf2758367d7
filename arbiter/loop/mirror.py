"""The fair-share engine, kept in step with the units the loop sees.

The engine is pure and incremental (DESIGN §4); this wrapper owns one and
applies each unit's *disposition* (pending / admitted / out) to it, so a
cycle touches only what changed. Units whose queue is Closed stay out of the
engine's pending set ("parked") but are still reported as waiting; admitted
units of a queue arbiter does not know ("orphans") cannot be given to the
engine, so their demand is taken off its capacity instead.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Mapping
from typing import Literal

from arbiter.cache.records import PodRecord, PodSet, QueueRecord, UnitRecord
from arbiter.cache.store import ClusterStore
from arbiter.core.deserved import deserved, hierarchical_deserved
from arbiter.core.engine import Engine, engine_suits, new_engine
from arbiter.core.engine.tree import HierarchicalEngine
from arbiter.core.model import Placement, QueueSpec, Unit, demand_of
from arbiter.core.model import PodSet as EnginePodSet
from arbiter.core.partial import admit_partial, can_shrink
from arbiter.core.resources import EMPTY, Resources
from arbiter.loop.nodes import NodeModel
from arbiter.loop.units import DesiredUnit, Disposition

State = Literal["pending", "parked", "admitted", "orphan"]

# Engine keys of unqueued usage (arbiter.loop.charges): one admitted entry
# per pod, `unqueued:<namespace>/<pod>/<uid>` (no unit has a colon in its key).
UNQUEUED_PREFIX = "unqueued:"


def unqueued_key(namespace: str, pod: str, uid: str) -> str:
    return f"{UNQUEUED_PREFIX}{namespace}/{pod}/{uid}"


def unqueued_pod(key: str) -> tuple[str, str, str] | None:
    """(namespace, name, uid) of the pod an unqueued entry stands for; None
    for a unit's key."""
    if not key.startswith(UNQUEUED_PREFIX):
        return None
    namespace, _, rest = key.removeprefix(UNQUEUED_PREFIX).partition("/")
    name, _, uid = rest.partition("/")
    return namespace, name, uid


def _essence(record: QueueRecord | None) -> tuple[QueueSpec, str] | None:
    return None if record is None else (queue_spec(record), record.state)


def queue_spec(record: QueueRecord) -> QueueSpec:
    # Field by field: mypy checks each name and type, which a generic copy by
    # field name would not.
    return QueueSpec(
        name=record.name,
        weight=record.weight,
        guarantee=record.guarantee,
        capability=record.capability,
        blocking=record.blocking,
        policy=record.policy,
        pools=record.pools,
        node_selector=dict(record.node_selector),
        parent=record.parent,
        child_order=record.child_order,
    )


class EngineMirror:
    """The engine plus the per-unit state it was told about: the flat
    `AdmissionEngine`, or `HierarchicalEngine` while some queue has a parent
    (DESIGN §11); it is swapped, units, plans and nodes handed over, when
    that changes."""

    def __init__(self) -> None:
        self.queues: dict[str, QueueRecord] = {}
        self.capacity: Resources = EMPTY
        self.entries: dict[str, tuple[State, Unit]] = {}
        self.engine: Engine = new_engine(EMPTY, ())
        self._orphan_demand: Resources = EMPTY
        # Demand of each queue's pending units, summed in place.
        self._pending_demand: dict[str, dict[str, int]] = {}
        self.waiting: Counter[str] = Counter()  # pending + parked, by queue
        self.admitted: Counter[str] = Counter()  # admitted + orphan, by queue
        # Unqueued usage (arbiter.loop.charges), by queue: pods and their requests.
        self.unqueued_pods: Counter[str] = Counter()
        self.unqueued: dict[str, Resources] = {}
        # Nodes, Pools and what runs on each node (DESIGN §10).
        self.nodes = NodeModel(lambda: self.engine)
        # Pending units that may be admitted with fewer pods (DESIGN §12),
        # each with the free capacity at its last vain try (not tried again
        # before that changes).
        self.shrinkable: dict[str, Resources | None] = {}

    # -- configuration -----------------------------------------------------------
    def engine_capacity(self) -> Resources:
        return (self.capacity - self._orphan_demand).clamp_min(0)

    def set_capacity(self, capacity: Resources) -> None:
        if capacity != self.capacity:
            self.capacity = capacity
            self.engine.set_capacity(self.engine_capacity())

    def set_queues(self, queues: Mapping[str, QueueRecord]) -> None:
        """Bring the engine's queues up to date. Only what decides admission
        counts (a status write changes the record but not the spec)."""
        old = self.queues
        self.queues = dict(queues)
        changed = {
            name for name in set(old) | set(queues)
            if _essence(old.get(name)) != _essence(queues.get(name))
        }
        if not changed:
            return
        if not engine_suits(self.engine, queues.values()):
            self._replace_engine()
        else:
            for name in sorted(changed):
                record = queues.get(name)
                if record is None:
                    self.engine.remove_queue(name)
                else:
                    self.engine.add_queue(queue_spec(record))
        # Units of those queues may move between pending/parked, admitted/orphan.
        for key, (state, unit) in list(self.entries.items()):
            if unit.queue not in changed:
                continue
            wanted = self._state_for(
                "admitted" if state in ("admitted", "orphan") else "pending", unit)
            if wanted != state:
                plan = self.engine.plan(key)
                self._remove(key, state, unit)
                self._add(key, wanted, unit, plan)

    def _replace_engine(self) -> None:
        """A flat engine for a flat set of queues, the tree engine once some
        queue has a parent: the new one learns every queue, unit and plan."""
        old = self.engine
        specs = [queue_spec(record) for record in self.queues.values()]
        engine = new_engine(self.engine_capacity(), specs)
        for key, (state, unit) in self.entries.items():
            if state == "pending":
                engine.add_pending(unit)
            elif state == "admitted":
                engine.add_admitted(unit, old.plan(key))
        self.engine = engine
        self.nodes.engine_replaced()

    # -- units ---------------------------------------------------------------------
    def _state_for(self, disposition: Literal["pending", "admitted"], unit: Unit) -> State:
        queue = self.queues.get(unit.queue)
        if disposition == "admitted":
            return "admitted" if queue is not None else "orphan"
        return "pending" if queue is not None and queue.state == "Open" else "parked"

    def state(self, key: str) -> State | None:
        entry = self.entries.get(key)
        return entry[0] if entry is not None else None

    def set(self, key: str, disposition: Disposition, unit: Unit | None,
            placement: Placement | None = None) -> None:
        """Make the engine agree that `key` is pending / admitted / gone
        (`placement`: an admitted unit's recorded plan, used when the engine
        learns of it admitted: after a restart, or admitted by another leader)."""
        new: tuple[State, Unit] | None = None
        if disposition is not None and unit is not None:
            new = (self._state_for(disposition, unit), unit)
        old = self.entries.get(key)
        if old == new:
            return
        if old is not None:
            self._remove(key, *old)
        if new is not None:
            self._add(key, *new, placement)

    def _add(self, key: str, state: State, unit: Unit, placement: Placement | None = None) -> None:
        self.entries[key] = (state, unit)
        if state == "pending":
            self.engine.add_pending(unit)
            self._count_pending(unit, 1)
            if can_shrink(unit):
                self.shrinkable[key] = None
        elif state == "admitted":
            self.engine.add_admitted(unit, placement)
            self.nodes.planned(key, self.engine.plan(key) is not None)
        elif state == "orphan":
            self._orphan_demand = self._orphan_demand + unit.demand
            self.engine.set_capacity(self.engine_capacity())
        if state in ("pending", "parked"):
            self.waiting[unit.queue] += 1
        elif key.startswith(UNQUEUED_PREFIX):
            self._count_unqueued(unit, 1)
        else:
            self.admitted[unit.queue] += 1

    def _remove(self, key: str, state: State, unit: Unit) -> None:
        del self.entries[key]
        if state == "pending":
            self.engine.remove_pending(key)
            self._count_pending(unit, -1)
            self.shrinkable.pop(key, None)
        elif state == "admitted":
            self.engine.release(key)
            self.nodes.planned(key, False)
        elif state == "orphan":
            self._orphan_demand = self._orphan_demand - unit.demand
            self.engine.set_capacity(self.engine_capacity())
        if key.startswith(UNQUEUED_PREFIX):
            self._count_unqueued(unit, -1)
            return
        counter = self.waiting if state in ("pending", "parked") else self.admitted
        counter[unit.queue] -= 1
        if counter[unit.queue] <= 0:
            del counter[unit.queue]

    def set_unqueued(self, key: str, unit: Unit | None,
                     placement: Placement | None = None) -> None:
        """Count (or stop counting) one pod's unqueued usage as admitted."""
        self.set(key, "admitted" if unit is not None else None, unit, placement)

    def _count_unqueued(self, unit: Unit, sign: int) -> None:
        queue = unit.queue
        self.unqueued_pods[queue] += sign
        total = self.unqueued.get(queue, EMPTY) + unit.demand.scale(sign)
        if self.unqueued_pods[queue] <= 0:
            del self.unqueued_pods[queue]
            self.unqueued.pop(queue, None)
        else:
            self.unqueued[queue] = total

    def _count_pending(self, unit: Unit, sign: int) -> None:
        total = self._pending_demand.get(unit.queue)
        if total is None:
            total = self._pending_demand[unit.queue] = {}
        for name, amount in unit.demand.items():
            total[name] = total.get(name, 0) + sign * amount

    def admit_all(self) -> list[Unit]:
        """Progressive filling (DESIGN §4); the units come back admitted
        (assumed) in the order the engine chose them."""
        self.sync_nodes()
        chosen = self.engine.admit_all()
        if self.shrinkable:
            chosen += self._admit_partial()
        for unit in chosen:
            self.shrinkable.pop(unit.key, None)
            self.nodes.planned(unit.key, self.engine.plan(unit.key) is not None)
            # The pending entry (whole: a shrunk unit was admitted as a copy).
            self._count_pending(self.entries[unit.key][1], -1)
            self.entries[unit.key] = ("admitted", unit)
            self.waiting[unit.queue] -= 1
            if self.waiting[unit.queue] <= 0:
                del self.waiting[unit.queue]
            self.admitted[unit.queue] += 1
        return chosen

    def _admit_partial(self) -> list[Unit]:
        """Units that fit only with fewer pods, tried once everything that
        fits whole is admitted (arbiter.core.partial), oldest first; one
        that did not fit is tried again only once the free capacity changed."""
        free = self.engine.free()
        tried = [key for key, last in self.shrinkable.items() if last != free]
        units = sorted((self.entries[key][1] for key in tried),
                       key=lambda u: (-u.priority, u.created, u.key))
        chosen = admit_partial(self.engine, units)
        left = self.engine.free()
        for key in tried:
            if key in self.shrinkable:
                self.shrinkable[key] = left
        return chosen

    def sync_nodes(self) -> None:
        """Give the engine what changed on nodes since the last call."""
        self.nodes.flush(self._admitted_unit)

    def _admitted_unit(self, key: str) -> Unit | None:
        entry = self.entries.get(key)
        return entry[1] if entry is not None and entry[0] == "admitted" else None

    def plan(self, key: str) -> Placement | None:
        return self.engine.plan(key)

    def waiting_units(self, queue: str) -> list[Unit]:
        """Units of `queue` not admitted: engine order first, then parked ones."""
        ordered = self.engine.pending(queue) if queue in self.queues else []
        if self.waiting.get(queue, 0) > len(ordered):
            parked = [u for s, u in self.entries.values() if s == "parked" and u.queue == queue]
            parked.sort(key=lambda u: (-u.priority, u.created, u.key))
            ordered = [*ordered, *parked]
        return ordered

    def waiting_by_queue(self) -> dict[str, list[Unit]]:
        """Every queue's waiting units in admission order."""
        return {name: self.waiting_units(name)
                for name in self.queues if self.waiting.get(name)}

    def demand(self) -> dict[str, Resources]:
        """Each known queue's demand for `deserved`: admitted + waiting in the engine."""
        return {
            name: self.engine.allocated(name) + Resources(self._pending_demand.get(name, {}))
            for name in self.queues
        }

    def deserved(self) -> dict[str, Resources]:
        """Each known queue's deserved share of the engine's capacity, given
        its demand (one computation for Queue status and reclaim alike)."""
        specs = [queue_spec(q) for q in self.queues.values()]
        fill = hierarchical_deserved if isinstance(self.engine, HierarchicalEngine) else deserved
        return fill(self.engine_capacity(), specs, self.demand())


# -- units as the engine takes them ------------------------------------------------------


def submitted(store: ClusterStore, unit: UnitRecord, pods: tuple[PodRecord, ...]) -> float:
    """When the work was submitted: its consumer's creation (the Job, the
    pod, the group's first pod) — the unit follows by milliseconds that may
    cross a second — or the unit's own for a reservation."""
    ref = unit.consumer
    if ref is not None and ref.kind == "Job":
        job = store.jobs.get(f"{unit.namespace}/{ref.name}")
        if job is not None and job.created:
            return job.created
    elif ref is not None and ref.kind in store.workloads:
        workload = store.workloads[ref.kind].get(f"{unit.namespace}/{ref.name}")
        if workload is not None and workload.uid == ref.uid and workload.created:
            return workload.created
    elif pods:
        first = min(p.created for p in pods)
        if first:
            return first
    return unit.created


def engine_unit(unit: UnitRecord, created: float | None = None, key: str | None = None) -> Unit:
    """The unit as the engine takes it; one admitted with fewer pods than it
    asks (partial admission) counts for the pods admitted. `key`: the
    store's key for it (kept as is: `unit.key` builds a new string)."""
    pod_sets = unit.admitted_pod_sets
    return Unit(
        key=unit.key if key is None else key,
        queue=unit.queue,
        demand=demand_of(pod_sets),
        priority=unit.priority,
        created=unit.created if created is None else created,
        pods=_engine_pods(pod_sets),
    )


def desired_engine_unit(desired: DesiredUnit, created: float) -> Unit:
    """A unit not written yet, as the engine will take it (the fast path)."""
    return Unit(key=desired.key, queue=desired.queue, demand=demand_of(desired.pod_sets),
                priority=desired.priority, created=created,
                pods=_engine_pods(desired.pod_sets))


@functools.lru_cache(maxsize=4096)
def _engine_pods(pod_sets: tuple[PodSet, ...]) -> tuple[EnginePodSet, ...]:
    return tuple(EnginePodSet(ps.name, ps.count, ps.requests, ps.min_count)
                 for ps in pod_sets)


def recorded_plan(unit: UnitRecord) -> Placement | None:
    """The plan an admitted unit's status records (None: none recorded)."""
    return unit.admission.placement() if unit.admission is not None else None

