"""Node fit for the tree engine (DESIGN §10 for `arbiter.core.engine.tree`).

Pure: no I/O. The flat engine's node fit is woven into its incremental
structures (`arbiter.core.engine.flat_nodefit`); the tree engine rebuilds its offers
after every change anyway, so it only needs the plain questions, asked of
the same first-fit-decreasing node sets (`arbiter.core.placement`):

* where would this unit's pods go now (`place`: the first pool of its
  queue's order, narrowed by the queue's nodeSelector, where all of them fit);
* hold a plan (`commit` for a fresh admission, `hold` for a recorded one)
  and give it back (`drop`).

Resources get indices here of their own (append only), apart from the tree
engine's, which it renumbers on every rebuild.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from fractions import Fraction

from arbiter.core.model import MAIN_POD_SET, Node, Placement, Pool, QueueSpec, Unit
from arbiter.core.placement import NodeIndex, NodeSet, NodeView, Pairs, fit_placement
from arbiter.core.resources import EMPTY, Resources

__all__ = ["TreeFit", "TreeFitResult"]

# (node set, pod set names in placement order, per pod set the member of each pod)
TreeFitResult = tuple[NodeSet, tuple[str, ...], list[list[int]]]
_Used = list[tuple[str, Pairs]]  # per node name: what a plan holds there


class TreeFit:
    """The nodes (None until given), and the plans of admitted units."""

    def __init__(self) -> None:
        self.index: NodeIndex | None = None
        self._res: dict[str, int] = {}
        self._names: list[str] = []
        self._plans: dict[str, tuple[Placement, _Used]] = {}

    @property
    def enabled(self) -> bool:
        return self.index is not None

    def _pairs(self, demand: Mapping[str, int]) -> Pairs:
        out = []
        for name, amount in demand.items():
            if amount:
                i = self._res.get(name)
                if i is None:
                    i = self._res[name] = len(self._names)
                    self._names.append(name)
                    if self.index is not None:
                        self.index.add_resource()
                out.append((i, amount))
        return tuple(out)

    # -- nodes ---------------------------------------------------------------------
    def set_nodes(self, nodes: Iterable[Node] | None, pools: Iterable[Pool] = ()) -> None:
        """Replace the nodes (None: aggregate fit only); plans count again on
        the nodes of the same names."""
        self.index = None
        if nodes is None:
            return
        nodes = list(nodes)
        for node in nodes:
            self._pairs(node.allocatable)
            self._pairs(node.used)
        index = NodeIndex(nodes, pools, len(self._names))
        for g, node in enumerate(index.nodes):
            for i, amount in self._pairs(node.allocatable - node.used):
                index.free[i][g] = amount
        self.index = index
        for _, used in self._plans.values():
            self._apply(used, -1)

    def set_node_used(self, name: str, used: Resources) -> None:
        index = self.index
        g = None if index is None else index.position.get(name)
        if index is None or g is None:
            raise ValueError(f"unknown node {name}")
        node = index.nodes[g]
        delta = self._pairs(node.used - used)
        index.nodes[g] = Node(node.name, node.labels, node.allocatable, used)
        index.change(g, delta)

    def pool_of(self, node: str) -> str | None:
        index = self.index
        g = None if index is None else index.position.get(node)
        return None if index is None or g is None else index.pool_of[g]

    def pool_usage(self) -> dict[str, tuple[Resources, Resources]]:
        """Per pool: (its nodes' allocatable, what plans hold on them)."""
        index = self.index
        if index is None:
            return {}
        out: dict[str, tuple[Resources, Resources]] = {
            name: (EMPTY, EMPTY) for name in index.pool_order}
        for g, node in enumerate(index.nodes):
            total, held = out.get(index.pool_of[g], (EMPTY, EMPTY))
            out[index.pool_of[g]] = (total + node.allocatable, held)
        for _, used in self._plans.values():
            for name, pairs in used:
                at = index.position.get(name)
                if at is not None:
                    pool = index.pool_of[at]
                    total, held = out[pool]
                    out[pool] = (total, held + Resources({self._names[i]: a for i, a in pairs}))
        return out

    def node_view(self, spec: Callable[[str], QueueSpec | None]) -> NodeView | None:
        """The nodes for reclaim's node fit (None: no nodes); `spec` finds a queue."""
        index = self.index
        if index is None:
            return None

        def sets(queue: str) -> list[NodeSet]:
            found = spec(queue)
            if found is None:
                return []
            selector = found.selector_key()
            return [index.node_set(pool, selector)
                    for pool in dict.fromkeys(found.pools or index.pool_order)]

        def held(key: str) -> list[tuple[str, Pairs]]:
            got = self._plans.get(key)
            return got[1] if got is not None else []

        return NodeView(index, self._pairs, sets, held)

    # -- plans ---------------------------------------------------------------------
    def plan(self, key: str) -> Placement | None:
        held = self._plans.get(key)
        return None if held is None else held[0]

    def plans(self) -> dict[str, Placement]:
        return {key: held[0] for key, held in self._plans.items()}

    def hold(self, unit: Unit, placement: Placement) -> None:
        """Count `placement` (a recorded or moved plan) for the admitted `unit`."""
        self.drop(unit.key)
        requests = {ps.name: ps.requests for ps in unit.pods} or {MAIN_POD_SET: unit.demand}
        per_node: dict[str, Resources] = {}
        for pod_set, names in placement.nodes.items():
            for name in names:
                per_node[name] = per_node.get(name, EMPTY) + requests.get(pod_set, EMPTY)
        used = [(name, self._pairs(amounts)) for name, amounts in per_node.items()]
        self._plans[unit.key] = (placement, used)
        self._apply(used, -1)

    def drop(self, key: str) -> None:
        held = self._plans.pop(key, None)
        if held is not None:
            self._apply(held[1], 1)

    def _apply(self, used: _Used, sign: int) -> None:
        index = self.index
        if index is None:
            return
        for name, pairs in used:
            g = index.position.get(name)
            if g is not None:
                index.change(g, [(i, sign * a) for i, a in pairs])

    # -- fit -----------------------------------------------------------------------
    def place(self, unit: Unit, spec: QueueSpec,
              capacity: Mapping[str, int]) -> TreeFitResult | None:
        """Where the unit's pods would go now (first-fit decreasing in the
        first pool of `spec`'s order with room for all); None: nowhere."""
        index = self.index
        if index is None:
            return None
        sets = unit.pods or ()
        runs = [(ps.count, self._pairs(ps.requests), ps.name) for ps in sets] \
            or [(1, self._pairs(unit.demand), MAIN_POD_SET)]

        def largest_first(run: tuple[int, Pairs, str]) -> Fraction:
            names = self._names
            return max((Fraction(a, capacity[names[i]]) for i, a in run[1]
                        if capacity.get(names[i], 0) > 0), default=Fraction(0))

        runs.sort(key=largest_first, reverse=True)
        counted = tuple((count, pairs) for count, pairs, _ in runs)
        selector = spec.selector_key()
        for pool in dict.fromkeys(spec.pools or index.pool_order):
            node_set = index.node_set(pool, selector)
            if node_set.members:
                got = node_set.place(counted)
                if got is not None:
                    return node_set, tuple(name for _, _, name in runs), got
        return None

    def commit(self, unit: Unit, fit: TreeFitResult) -> Placement:
        """Hold the plan `place` found (nothing changed on the nodes since)."""
        node_set, names, members = fit
        placement = fit_placement(node_set.pool, node_set.names, names, members,
                                  (ps.name for ps in unit.pods))
        self.hold(unit, placement)
        return placement
