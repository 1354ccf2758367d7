"""What the tree engine (`arbiter.core.engine.tree`) knows, and its queries.

Pure: no I/O. The queues' specs, the pending and admitted units (also by
queue, so the loop's per-queue questions cost that queue's units only), the
nodes and plans of admitted units (a `NodeBook`, `arbiter.core.engine.nodefit`),
and a `stale` flag: every change here marks the engine's decision structures
out of date; the engine rebuilds them before its next decision.
"""

from __future__ import annotations

from collections.abc import Iterable
from fractions import Fraction

from arbiter.core.engine.flat import dominant_share_of, order_key
from arbiter.core.engine.nodefit import NodeBook, NodeQueries
from arbiter.core.engine.tree_nodefit import place
from arbiter.core.model import Node, Placement, Pool, QueueSpec, Unit
from arbiter.core.placement import NodeSet, NodeView
from arbiter.core.resources import EMPTY, Resources

__all__ = ["TreeState"]


class TreeState(NodeQueries):
    """Specs, units and plans of a tree of queues (see the module doc)."""

    def __init__(self, capacity: Resources, queues: Iterable[QueueSpec] = ()) -> None:
        self._capacity = capacity
        self._specs: dict[str, QueueSpec] = {spec.name: spec for spec in queues}
        self._pending: dict[str, Unit] = {}
        self._admitted: dict[str, Unit] = {}
        self._pending_of: dict[str, dict[str, Unit]] = {}
        self._admitted_of: dict[str, dict[str, Unit]] = {}
        # What each queue's own admitted units hold, and all of them: sums kept
        # until a unit comes or goes (an admission only marks them: it is hot).
        self._held: dict[str, Resources] = {}
        self._used: Resources | None = EMPTY
        self._book = NodeBook()
        self._stale = True

    # -- configuration and units (each marks the engine stale) ---------------
    def set_capacity(self, capacity: Resources) -> None:
        self._capacity = capacity
        self._stale = True

    def add_queue(self, spec: QueueSpec) -> None:
        self._specs[spec.name] = spec
        self._stale = True

    def remove_queue(self, name: str) -> None:
        self._specs.pop(name, None)
        self._stale = True

    def add_pending(self, unit: Unit) -> None:
        """A waiting unit (replaces a pending one of the same key)."""
        if unit.key in self._admitted:
            raise ValueError(f"unit {unit.key} is already admitted")
        self.remove_pending(unit.key)
        self._pending[unit.key] = unit
        self._pending_of.setdefault(unit.queue, {})[unit.key] = unit
        self._stale = True

    def remove_pending(self, key: str) -> None:
        unit = self._pending.pop(key, None)
        if unit is not None:
            mine = self._pending_of[unit.queue]
            del mine[key]
            if not mine:
                del self._pending_of[unit.queue]
            self._stale = True

    def add_admitted(self, unit: Unit, placement: Placement | None = None) -> None:
        """A unit already admitted; with `placement` (its recorded plan) its
        pods count on those nodes too."""
        self.release(unit.key)
        self.remove_pending(unit.key)
        self._hold(unit)
        if placement is not None:
            self._book.hold(unit, placement)
        self._stale = True

    def _hold(self, unit: Unit) -> None:
        self._admitted[unit.key] = unit
        self._admitted_of.setdefault(unit.queue, {})[unit.key] = unit
        self._held.pop(unit.queue, None)
        self._used = None

    def release(self, key: str) -> None:
        unit = self._admitted.pop(key, None)
        if unit is None:
            return
        mine = self._admitted_of[unit.queue]
        del mine[key]
        if not mine:
            del self._admitted_of[unit.queue]
        self._held.pop(unit.queue, None)
        self._used = None
        self._book.drop(key)
        self._stale = True

    # -- nodes (DESIGN §10) ------------------------------------------------------
    def set_nodes(self, nodes: Iterable[Node] | None, pools: Iterable[Pool] = ()) -> None:
        self._book.set_nodes(nodes, pools)
        self._stale = True

    def set_node_used(self, name: str, used: Resources) -> None:
        self._book.set_node_used(name, used)
        self._stale = True

    def replan(self, key: str, placement: Placement) -> None:
        unit = self._admitted.get(key)
        if unit is None:
            raise ValueError(f"unit {key} is not admitted")
        self._book.hold(unit, placement)
        self._stale = True

    def node_view(self) -> NodeView | None:
        index = self._book.index

        def sets(queue: str) -> list[NodeSet]:
            found = self.spec(queue)
            if found is None or index is None:
                return []
            selector = found.selector_key()
            return [index.node_set(pool, selector)
                    for pool in dict.fromkeys(found.pools or index.pool_order)]

        return self._book.node_view(sets)

    # -- queries -------------------------------------------------------------
    def capacity(self) -> Resources:
        return self._capacity

    def free(self) -> Resources:
        if self._used is None:
            used = EMPTY
            for unit in self._admitted.values():
                used = used + unit.demand
            self._used = used
        return self._capacity - self._used

    def spec(self, queue: str) -> QueueSpec | None:
        return self._specs.get(queue)

    def children(self, queue: str) -> list[str]:
        """The names of `queue`'s children, sorted."""
        return sorted(s.name for s in self._specs.values() if s.parent == queue)

    def allocated(self, queue: str) -> Resources:
        """What the queue's own units hold (a parent's own: usually nothing)."""
        held = self._held.get(queue)
        if held is None:
            held = EMPTY
            for unit in self._admitted_of.get(queue, {}).values():
                held = held + unit.demand
            self._held[queue] = held
        return held

    def subtree_allocated(self, queue: str) -> Resources:
        """What the queue's whole subtree holds."""
        total = EMPTY
        for member in self._subtree(queue):
            total = total + self.allocated(member)
        return total

    def _subtree(self, queue: str) -> set[str]:
        members = {queue}
        grew = True
        while grew:
            grew = False
            for spec in self._specs.values():
                if spec.parent in members and spec.name not in members:
                    members.add(spec.name)
                    grew = True
        return members

    def pending(self, queue: str) -> list[Unit]:
        spec = self._specs.get(queue)
        policy = spec.policy if spec is not None else "Priority"
        return sorted(self._pending_of.get(queue, {}).values(),
                      key=lambda u: order_key(u, policy))

    def admitted(self, queue: str) -> list[Unit]:
        return list(self._admitted_of.get(queue, {}).values())

    def admitted_count(self, queue: str) -> int:
        return len(self._admitted_of.get(queue, {}))

    def is_pending(self, key: str) -> bool:
        return key in self._pending

    def is_admitted(self, key: str) -> bool:
        return key in self._admitted

    def dominant_share(self, queue: str) -> Fraction:
        return dominant_share_of(self.allocated(queue), self._capacity)

    def subtree_share(self, queue: str) -> Fraction:
        return dominant_share_of(self.subtree_allocated(queue), self._capacity)

    def explain(self, queue: str) -> str:
        """Why the head of `queue` waits; "" when nothing waits."""
        units = self.pending(queue)
        return self.explain_unit(units[0].key) if units else ""

    def explain_unit(self, key: str) -> str:
        """Why the pending unit `key` waits; "" when it is not pending."""
        unit = self._pending.get(key)
        if unit is None:
            return ""
        chain: list[QueueSpec] = []
        name: str | None = unit.queue
        while name is not None:
            spec = self._specs.get(name)
            if spec is None or spec in chain:
                return f"queue {name} does not exist" if spec is None else "queue tree has a cycle"
            chain.append(spec)
            name = spec.parent
        if self.children(unit.queue):
            return f"queue {unit.queue} is a parent: its children hold the work"
        for spec in chain:
            held = self.subtree_allocated(spec.name)
            capped = sorted(r for r, a in unit.demand.items()
                            if a and r in spec.capability
                            and held.get_amount(r) + a > spec.capability[r])
            if capped:
                where = "queue" if spec.name == unit.queue else f"parent queue {spec.name}"
                return f"{where} at capability ({', '.join(capped)})"
        free = self.free()
        full = sorted(r for r, a in unit.demand.items() if a > free.get_amount(r))
        if full:
            return f"cluster full ({', '.join(full)})"
        if self._book.index is not None and place(self._book, unit, chain[0],
                                                  self._capacity) is None:
            return "no node has room for its pods"
        return "waiting for its turn (fair share)"
