"""The engine's nodes, kept in step with the cache (DESIGN §10).

The engine decides node fit on Ready, schedulable nodes, each with a `used`
amount: what runs there that the engine holds no plan for. Admitted units
with a plan count their pods at their planned nodes inside the engine, so a
bound pod counts in `used` only while its unit has no plan — an unmanaged
pod, a pod of a unit admitted without a plan (released outside arbiter, or
admitted before node fit), a pod of a queue arbiter does not know. Each pod
is counted exactly once: by its unit's plan, or in its node's `used`.

When a planned unit's pod binds, the plan follows the real binding
(the engine's `replan`): the bound pods at their nodes, the planned nodes
of the pods not bound yet after them.

Incremental: a pod event changes one node's `used` (pushed to the engine
once per cycle, per node that changed); a unit gaining or losing its plan
moves its own bound pods in or out of `used`. Only a change of the node set
itself (a node added, removed, made Ready/unschedulable, relabelled, resized)
or of the Pools rebuilds the engine's node model, O(nodes); a heartbeat does
nothing.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Set
from dataclasses import dataclass

from arbiter.cache.capacity import ACTIVE_POD_PHASES, add_into
from arbiter.cache.ownership import pod_consumer, pod_workload
from arbiter.cache.records import NodeRecord, PodRecord, PoolRecord
from arbiter.cache.store import ClusterStore
from arbiter.core.engine import Engine
from arbiter.core.model import MAIN_POD_SET, Node, Placement, Pool, Unit
from arbiter.core.resources import Resources


@dataclass(frozen=True, slots=True)
class _Bound:
    """A pod that holds resources on a node."""

    unit: str  # the key of the unit its consumer would have
    node: str
    requests: Resources


def _bound(pod: PodRecord | None, store: ClusterStore | None = None) -> _Bound | None:
    """A bound, active pod under the unit that holds it: its workload's (the
    controller chain, by uid: a JobSet's pods are the JobSet unit's, not
    their child Job's), else its consumer's."""
    if pod is None or not pod.node_name or pod.phase not in ACTIVE_POD_PHASES:
        return None
    found = pod_workload(store, pod) if store is not None else None
    unit = found[0].unit_key(found[1]) if found is not None else pod_consumer(pod).unit_key
    return _Bound(unit, pod.node_name, pod.requests)


def _node_shape(node: NodeRecord) -> tuple[object, ...]:
    """What the engine's node model is made of (a heartbeat changes none of it)."""
    return (node.allocatable, node.ready, node.schedulable, node.labels)


def follow_bindings(plan: Placement, unit: Unit, bound: Iterable[_Bound]) -> Placement:
    """`plan` with the pods that bound at their real nodes: per pod set, the
    bound pods' nodes, then the planned nodes of the pods not bound yet
    (planned nodes a bound pod took first, then the rest in order)."""
    sets = unit.pods
    default = sets[0].name if sets else MAIN_POD_SET
    counts = {ps.name: ps.count for ps in sets} or {MAIN_POD_SET: 1}
    actual: dict[str, list[str]] = {}
    for pod in bound:
        # The first pod set asking these requests with a place left (sets
        # asking the same, a JobSet's driver and workers, fill in order).
        alike = [ps.name for ps in sets if ps.requests == pod.requests]
        name = next((n for n in alike if len(actual.get(n, ())) < counts[n]),
                    alike[0] if alike else default)
        actual.setdefault(name, []).append(pod.node)
    nodes: dict[str, tuple[str, ...]] = {}
    for name in {*plan.nodes, *actual}:
        there = sorted(actual.get(name, ()))
        rest = list(plan.nodes.get(name, ()))
        for node in there:
            if node in rest:
                rest.remove(node)
        room = max(0, counts.get(name, len(there)) - len(there))
        nodes[name] = (*there, *rest[:room])
    return Placement(plan.pool, nodes)


# A unit's plan, unit, placed pods' version (`NodeModel._placed_at`), and
# the nodes it has unbound slots on.
_Slots = tuple[Placement, Unit | None, int, tuple[str, ...]]


def _planned(plan: Placement) -> list[str]:
    """The planned node of every pod (a node once per pod planned there)."""
    return [node for nodes in plan.nodes.values() for node in nodes]


class NodeModel:
    """Nodes, Pools and per-node `used` for one engine (flat or tree)."""

    def __init__(self, engine: Callable[[], Engine], overcommit: float = 1.0) -> None:
        self._engine = engine
        self.overcommit = overcommit
        self.enabled = False  # until the first rebuild: the engine fits on aggregates only
        self._nodes: dict[str, NodeRecord] = {}
        self._shapes: dict[str, tuple[object, ...]] = {}
        self._pools: list[Pool] = []
        self._pods: dict[str, _Bound] = {}  # by pod uid
        self._keys: dict[str, str] = {}  # pod uid -> its unqueued entry's key
        self._by_unit: dict[str, set[str]] = {}  # unit key -> uids of its bound pods
        self._used: dict[str, dict[str, int]] = {}  # node -> requests of uncovered pods
        self._covered: set[str] = set()  # units whose pods the engine counts by plan
        self._in_engine: set[str] = set()
        self._rebuild_engine = False
        self._dirty_nodes: set[str] = set()
        self._replan: set[str] = set()
        # Units whose move waits (see `_follow`) -> their pods counted in `used` meanwhile.
        self._deferred: dict[str, list[_Bound]] = {}
        self._plan_dropped = False
        # Units reclaim took back (or is taking back): their pods, while they
        # terminate, are not counted (see `set_leaving`).
        self._leaving: set[str] = set()
        # Pods of such a unit that were bound when it was admitted again
        # (the old admission's, not deleted yet): its new plan does not
        # follow them, and, like a victim's pods, they count nowhere. Pod
        # uid -> when that ends unless the pod is terminating by then (None:
        # not stamped yet). See `expire_stale`.
        self._stale: dict[str, float | None] = {}
        self._terminating: set[str] = set()  # bound pods being deleted
        self._store: ClusterStore | None = None  # for the owner walk (`_bound`)
        self._slots: dict[str, _Slots] = {}  # by unit key, as `_unbound_slots` last saw
        # Unit key -> a tick taken when what `_placed` returns for it last
        # changed (a pod bound, gone, stale or not); absent: no bound pods.
        # `_unbound_slots` compares these instead of the pods themselves.
        self._placed_at: dict[str, int] = {}
        self._tick = 0

    # -- from the cache ------------------------------------------------------------
    def rebuild(self, store: ClusterStore) -> None:
        """Everything from the store once (a new leader, a full pass): O(pods + nodes)."""
        self.enabled = True
        self._store = store
        self._nodes = dict(store.nodes)
        self._shapes = {name: _node_shape(node) for name, node in self._nodes.items()}
        self.set_pools(store.pools.values())
        self._pods = {}
        self._by_unit = {}
        self._stale = {uid: until for uid, until in self._stale.items() if uid in store.pods}
        self._slots = {}
        self._placed_at = {}
        self._terminating = set()
        self._used = {}
        self._deferred = {}
        self._covered = set(self._engine().plans())
        for uid, pod in store.pods.items():
            self.on_pod(uid, pod)
        self._replan.update(self._covered)
        self._rebuild_engine = True

    def on_node(self, name: str, node: NodeRecord | None) -> bool:
        """A Node changed; whether the engine's node model must change."""
        shape = _node_shape(node) if node is not None else None
        if self._shapes.get(name) == shape:
            return False
        if node is None:
            self._nodes.pop(name, None)
            self._shapes.pop(name, None)
        else:
            self._nodes[name] = node
            self._shapes[name] = shape  # type: ignore[assignment]
        self._rebuild_engine = True
        return True

    def set_pools(self, pools: Iterable[PoolRecord]) -> None:
        wanted = [Pool(p.name, dict(p.node_selector)) for p in sorted(pools, key=lambda p: p.name)]
        if [(p.name, p.node_selector) for p in wanted] != [
                (p.name, p.node_selector) for p in self._pools]:
            self._pools = wanted
            self._rebuild_engine = True

    def charge(self, uid: str, key: str | None, pod: PodRecord | None) -> None:
        """Count bound pod `uid` under engine key `key` (its unqueued usage,
        `arbiter.loop.charges`, planned at its node), or under its consumer's
        unit again (None)."""
        if key is None:
            self._keys.pop(uid, None)
        else:
            self._keys[uid] = key
        self.on_pod(uid, pod)

    def on_pod(self, uid: str, pod: PodRecord | None) -> bool:
        """A pod changed; whether a node's usage or a plan may change."""
        new = _bound(pod, self._store)
        if new is not None and pod is not None and pod.terminating:
            self._terminating.add(uid)
        else:
            self._terminating.discard(uid)
        if new is not None and uid in self._keys:
            new = _Bound(self._keys[uid], new.node, new.requests)
        old = self._pods.get(uid)
        if old == new:
            return False
        if new is None:
            self._stale.pop(uid, None)
        if old is not None:
            self._count(old, -1)
            members = self._by_unit.get(old.unit)
            if members is not None:
                members.discard(uid)
                if not members:
                    del self._by_unit[old.unit]
            del self._pods[uid]
            self._placed_changed(old.unit)
        if new is not None:
            self._pods[uid] = new
            self._by_unit.setdefault(new.unit, set()).add(uid)
            self._count(new, +1)
            self._placed_changed(new.unit)
        return True

    def _placed_changed(self, key: str) -> None:
        if key in self._by_unit:
            self._tick += 1
            self._placed_at[key] = self._tick
        else:
            self._placed_at.pop(key, None)

    def _count(self, pod: _Bound, sign: int) -> None:
        if pod.unit in self._covered:
            self._replan.add(pod.unit)
            return
        if pod.unit in self._leaving:
            return
        add_into(self._used.setdefault(pod.node, {}), pod.requests, sign)
        self._dirty_nodes.add(pod.node)

    @property
    def leaving(self) -> Set[str]:
        """The units set by `set_leaving`."""
        return self._leaving

    def set_leaving(self, keys: Set[str]) -> None:
        """Units reclaim is taking back or took back whose pods may still be
        on their nodes: those pods no longer count in `used`. Reclaim chose
        them so that their room goes to the units it served, as the engine
        frees a victim at once; anyone else fitting beside the pods first
        would make the served unit reclaim again. The units admitted there
        wait, Pending, until the pods have left."""
        if keys == self._leaving:
            return
        changes = [(key, +1) for key in self._leaving - keys]
        changes += [(key, -1) for key in keys - self._leaving]
        self._leaving = set(keys)
        for key, sign in changes:
            if key not in self._covered:
                self._count_extra((self._pods[uid] for uid in self._by_unit.get(key, ())), sign)

    def expire_stale(self, now: float, ttl: float) -> None:
        """Stale pods (see `planned`) not terminating `ttl` seconds after
        they were first seen here are the unit's after all: its Job was
        admitted again before the Job controller acted on the suspension, so
        they were never deleted. Its plan follows them again; left stale,
        they would count on no node for good."""
        for uid, until in list(self._stale.items()):
            if uid in self._terminating:
                continue  # the old admission's for sure: stale until it is gone
            if until is None:
                self._stale[uid] = now + ttl
            elif now >= until:
                del self._stale[uid]
                pod = self._pods.get(uid)
                if pod is not None:
                    self._placed_changed(pod.unit)
                    if pod.unit in self._covered:
                        self._replan.add(pod.unit)

    def engine_replaced(self) -> None:
        """A new engine took over (flat <-> tree): give it the nodes again."""
        self._rebuild_engine = self.enabled

    # -- from the engine ------------------------------------------------------------
    def planned(self, key: str, has_plan: bool) -> None:
        """Unit `key` has (or no longer has) a plan in the engine: its bound
        pods move out of (into) their nodes' `used`."""
        if has_plan == (key in self._covered):
            return
        pods = [self._pods[uid] for uid in self._by_unit.get(key, ())]
        if has_plan:
            if key in self._leaving:
                # Admitted again before the pods it was taken back from left:
                # the new plan (made as offline, where a victim's room is
                # free at once) is where its new pods go. Followed, it moved
                # to the old pods' nodes and took room reclaim had chosen
                # otherwise, and the loop ended elsewhere than the engine.
                self._stale.update(dict.fromkeys(self._by_unit.get(key, ())))
                self._placed_changed(key)
            for pod in pods:
                self._count(pod, -1)
            self._covered.add(key)
            self._replan.add(key)
        else:
            self._covered.discard(key)
            self._replan.discard(key)
            self._plan_dropped = True
            self._count_extra(self._deferred.pop(key, ()), -1)
            for uid in self._by_unit.get(key, ()):
                self._stale.pop(uid, None)
            self._placed_changed(key)
            for pod in pods:
                self._count(pod, +1)

    def flush(self, units: Callable[[str], Unit | None]) -> None:
        """Push what changed to the engine (once per cycle, before admitting);
        `units(key)`: the admitted engine unit of `key`, for plans to follow."""
        if not self.enabled:
            return
        engine = self._engine()
        if self._rebuild_engine:
            self._rebuild_engine = False
            self._dirty_nodes.clear()
            nodes = [self._node(node) for node in self._nodes.values()
                     if node.ready and node.schedulable]
            self._in_engine = {node.name for node in nodes}
            engine.set_nodes(nodes, self._pools)
        # A waiting move can only be made after a binding or a plan gone:
        # otherwise its O(plans) look is not taken again.
        if self._replan or (self._deferred and self._plan_dropped):
            self._follow(engine, units)  # may change some nodes' `used`
        self._plan_dropped = False
        if self._dirty_nodes:
            for name in sorted(self._dirty_nodes):
                if name in self._in_engine:
                    engine.set_node_used(name, Resources(self._used.get(name, {})))
            self._dirty_nodes.clear()

    def _follow(self, engine: Engine, units: Callable[[str], Unit | None]) -> None:
        """Plans follow their pods' bindings, except a move that may be half
        of a swap not fully seen yet.

        Two pods of the same shape bound to each other's planned nodes reach
        us one watch event after the other. Moving the first one's plan at
        once would count its new node twice (its pod, and the other unit's
        slot there) and show its old node free, though the second pod is
        there already, unseen: enough to admit a unit there whose pods then
        stay Pending. So while another unit still has a pod not seen bound
        planned on the node a pod arrived at, the move waits, and the arrived
        pod counts in that node's `used` as well, on top of its unit's plan:
        every node counts at least what the move would give it (the plan
        covers the pods bound where planned and the slots left), so waiting
        can only delay an admission, never let one through. When the other
        pod's binding shows (or its unit goes), the move is made; the extra
        count goes.
        """
        waiting: dict[str, set[str]] | None = None
        for key in sorted(self._replan | self._deferred.keys()):
            self._count_extra(self._deferred.pop(key, ()), -1)
            plan = engine.plan(key)
            unit = units(key)
            if plan is None or unit is None:
                continue
            bound = self._placed(key)
            moved = follow_bindings(plan, unit, bound)
            if moved.nodes == plan.nodes:
                continue
            off_plan = Counter(pod.node for pod in bound) - Counter(_planned(plan))
            if off_plan:
                if waiting is None:  # rare: only with a pod bound off its plan
                    waiting = self._unbound_slots(engine, units)
                if any(waiting.get(node, set()) - {key} for node in off_plan):
                    extra = []
                    for pod in bound:
                        if off_plan[pod.node] > 0:
                            off_plan[pod.node] -= 1
                            extra.append(pod)
                    self._deferred[key] = extra
                    self._count_extra(extra, +1)
                    continue
            engine.replan(key, moved)
        self._replan.clear()

    def _placed(self, key: str) -> list[_Bound]:
        """Unit `key`'s bound pods its plan follows (not the stale ones)."""
        return [self._pods[uid] for uid in self._by_unit.get(key, ()) if uid not in self._stale]

    def _unbound_slots(self, engine: Engine,
                       units: Callable[[str], Unit | None]) -> dict[str, set[str]]:
        """Node -> the units with a pod not seen bound yet planned there, by
        their plans as followed to their bindings (so both halves of a swap,
        once seen, claim nothing). O(plans), but a unit whose plan (the same
        object: a replan makes a new one), unit and placed pods (their
        version, `_placed_at`) are as last time keeps its answer: when the
        scheduler binds off plan this runs most cycles, and following every
        plan anew was most of the leader's CPU (listing and comparing every
        plan's pods was still 13-27 % of a warm standby's samples in chaos
        run 11)."""
        waiting: dict[str, set[str]] = {}
        slots: dict[str, _Slots] = {}
        for key, plan in engine.plans().items():
            unit = units(key)
            version = self._placed_at.get(key, 0)
            seen = self._slots.get(key)
            if seen is not None and seen[0] is plan and seen[1] is unit and seen[2] == version:
                nodes = seen[3]
            else:
                bound = self._placed(key)
                followed = follow_bindings(plan, unit, bound) if unit is not None else plan
                nodes = tuple(Counter(_planned(followed)) - Counter(pod.node for pod in bound))
            slots[key] = (plan, unit, version, nodes)
            for node in nodes:
                waiting.setdefault(node, set()).add(key)
        self._slots = slots
        return waiting

    def _count_extra(self, pods: Iterable[_Bound], sign: int) -> None:
        """Count pods in their nodes' `used` although their unit has a plan."""
        for pod in pods:
            add_into(self._used.setdefault(pod.node, {}), pod.requests, sign)
            self._dirty_nodes.add(pod.node)

    def _node(self, node: NodeRecord) -> Node:
        allocatable = node.allocatable
        if self.overcommit != 1.0:
            allocatable = Resources({k: int(v * self.overcommit) for k, v in allocatable.items()})
        return Node(node.name, dict(node.labels), allocatable,
                    Resources(self._used.get(node.name, {})))

    # -- queries ---------------------------------------------------------------------
    def nodes_by_pool(self, pool_of: Callable[[str], str | None]) -> Counter[str]:
        """How many Ready, schedulable nodes the engine has in each pool."""
        return Counter(pool for pool in map(pool_of, self._in_engine) if pool is not None)

    def labels(self, node: str) -> dict[str, str]:
        record = self._nodes.get(node)
        return dict(record.labels) if record is not None else {}

    def used(self, node: str) -> Resources:
        return Resources(self._used.get(node, {}))

    def bound_nodes(self, key: str) -> list[str]:
        """The node of each running pod of unit `key` (for the web view)."""
        return sorted(self._pods[uid].node for uid in self._by_unit.get(key, ()))

    def uncovered_pods(self, key: str) -> list[tuple[str, Resources]]:
        """(node, requests) of unit `key`'s bound pods counted in `used` (its
        unit holds no plan: a victim taken back whose pods still terminate)."""
        if key in self._covered:
            return []
        pods = (self._pods[uid] for uid in self._by_unit.get(key, ()))
        return [(pod.node, pod.requests) for pod in pods]
