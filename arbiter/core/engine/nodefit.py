"""The node-fit book both engines keep (DESIGN §10): nodes, plans, node use.

Pure: no I/O. Once `set_nodes` gave nodes, an engine admits a unit only
where its pods fit; the book holds what that needs besides the deciding:

* the resource numbering the node index is kept in (append only; the flat
  engine decides in the same numbering, `AdmissionEngine._res`);
* the node index (`arbiter.core.placement.NodeIndex`, None: aggregate fit
  only), and what runs on each node that no plan accounts for (`set_node_used`);
* the plan of every admitted unit that has one, counted on its nodes
  (`hold`, `keep`, `drop`), and the questions asked of them (`plan`,
  `plans`, `pool_usage`, `pool_of`, `node_view`).

Where a unit's pods would go is each engine's own question: the flat
engine's incremental node wait (`flat_nodefit`), the tree engine's plain
first fit (`tree_nodefit`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from arbiter.core.model import MAIN_POD_SET, Node, Placement, Pool, Unit
from arbiter.core.placement import NodeIndex, NodeSet, NodeView, Pairs, Runs, fit_placement
from arbiter.core.resources import EMPTY, Resources

__all__ = ["FitPlan", "MadePlan", "NodeBook", "NodeQueries", "Plan", "made_plan", "plan_holdings"]

# An admitted unit's plan: (placement, what it holds on each node by name);
# or, as the flat engine makes it, its first-fit answer in plain tuples:
# (pool, the node set's member names, per run the member index of each pod,
# the runs, (pod set of each run, every pod set)). That form is built into
# the first only when asked (most plans are read once, or only at release),
# and being tuples of strings and ints it is soon untracked by the garbage
# collector, so full collections stay rare while thousands of units are admitted.
MadePlan = tuple[Placement, list[tuple[str, Pairs]]]
FitPlan = tuple[str, tuple[str, ...], tuple[tuple[int, ...], ...], Runs,
                tuple[tuple[str, ...], tuple[str, ...]]]
Plan = MadePlan | FitPlan


def made_plan(plan: Plan) -> MadePlan:
    """`plan` as (placement, per-node holdings)."""
    if len(plan) == 2:
        return plan
    pool, names, got, _, (runnames, podsets) = plan
    return fit_placement(pool, names, runnames, got, podsets), plan_holdings(plan)


def plan_holdings(plan: Plan) -> list[tuple[str, Pairs]]:
    """What `plan` holds on each node by name (a release needs no Placement)."""
    if len(plan) == 2:
        return plan[1]
    _, names, got, runs, _ = plan
    held: dict[int, dict[int, int]] = {}
    for (_, pairs), placed in zip(runs, got, strict=True):
        for m in placed:
            amounts = held.setdefault(m, {})
            for r, a in pairs:
                amounts[r] = amounts.get(r, 0) + a
    return [(names[m], tuple(amounts.items())) for m, amounts in held.items()]


class NodeBook:
    """Resource numbering, the nodes (None until given) and the plans of
    admitted units. Methods that give room back say whether a node grew."""

    def __init__(self, on_new_resource: Callable[[], None] | None = None) -> None:
        self.index: NodeIndex | None = None
        self.number: dict[str, int] = {}  # resource name -> its index
        self.names: list[str] = []  # resource index -> its name
        self._on_new_resource = on_new_resource  # the owner's per-resource lists grow too
        self._plans: dict[str, Plan] = {}

    # -- resources ---------------------------------------------------------------
    def res(self, name: str) -> int:
        """The index of resource `name` (a new name gets the next one)."""
        i = self.number.get(name)
        if i is not None:
            return i
        i = self.number[name] = len(self.names)
        self.names.append(name)
        if self.index is not None:
            self.index.add_resource()
        if self._on_new_resource is not None:
            self._on_new_resource()
        return i

    def pairs(self, demand: Mapping[str, int]) -> Pairs:
        """`demand`'s non-zero amounts by resource index."""
        number = self.number
        out: list[tuple[int, int]] = []
        for name, amount in demand.items():
            if amount:
                i = number.get(name)
                out.append((self.res(name) if i is None else i, amount))
        return tuple(out)

    # -- nodes -------------------------------------------------------------------
    def set_nodes(self, nodes: Iterable[Node] | None, pools: Iterable[Pool] = ()) -> None:
        """Replace the nodes (None: aggregate fit only); the plans count again
        on the nodes of the same names."""
        self.index = None
        if nodes is None:
            return
        nodes = list(nodes)
        for node in nodes:
            for name in node.allocatable:
                self.res(name)
            for name in node.used:
                self.res(name)
        index = NodeIndex(nodes, pools, len(self.names))
        for g, node in enumerate(index.nodes):
            for i, amount in self.pairs(node.allocatable - node.used):
                index.free[i][g] = amount
        self.index = index
        for plan in self._plans.values():
            self._apply(plan_holdings(plan), -1)

    def set_node_used(self, name: str, used: Resources) -> bool:
        """What node `name` runs that no plan accounts for changed (pods
        bound or finished); True when that gave room. ValueError for an
        unknown node."""
        index = self.index
        g = None if index is None else index.position.get(name)
        if index is None or g is None:
            raise ValueError(f"unknown node {name}")
        node = index.nodes[g]
        delta = [(self.res(r), node.used.get_amount(r) - used.get_amount(r))
                 for r in set(node.used) | set(used)]
        index.nodes[g] = Node(node.name, node.labels, node.allocatable, used)
        return index.change(g, delta)

    def pool_of(self, node: str) -> str | None:
        """The pool node `node` belongs to (None: unknown node, or no nodes)."""
        index = self.index
        g = None if index is None else index.position.get(node)
        return None if index is None or g is None else index.pool_of[g]

    def pool_usage(self) -> dict[str, tuple[Resources, Resources]]:
        """Per pool: (capacity = its nodes' allocatable, allocated = planned pods).

        O(nodes + plans): for status and metrics, not for every decision."""
        index = self.index
        if index is None:
            return {}
        capacity: dict[str, Resources] = {name: EMPTY for name in index.pool_order}
        for g, node in enumerate(index.nodes):
            pool = index.pool_of[g]
            capacity[pool] = capacity.get(pool, EMPTY) + node.allocatable
        allocated: dict[str, dict[str, int]] = {name: {} for name in capacity}
        names = self.names
        for key in list(self._plans):
            for node_name, pairs in self._made(key)[1]:
                at = index.position.get(node_name)
                if at is None:
                    continue
                amounts = allocated[index.pool_of[at]]
                for r, a in pairs:
                    amounts[names[r]] = amounts.get(names[r], 0) + a
        return {name: (capacity[name], Resources(allocated[name])) for name in capacity}

    def node_view(self, sets: Callable[[str], list[NodeSet]]) -> NodeView | None:
        """The nodes for reclaim's node fit (None: no nodes); `sets` gives a
        queue's node sets in its pools' order."""
        index = self.index
        if index is None:
            return None
        return NodeView(index, self.pairs, sets, self.holdings)

    # -- plans -------------------------------------------------------------------
    def plan(self, key: str) -> Placement | None:
        """Where the admitted unit `key` goes (None: no plan)."""
        return self._made(key)[0] if key in self._plans else None

    def plans(self) -> dict[str, Placement]:
        """The plan of every admitted unit that has one, by unit key."""
        return {key: self._made(key)[0] for key in list(self._plans)}

    def holdings(self, key: str) -> list[tuple[str, Pairs]]:
        """What the plan of `key` holds on each node by name ([]: no plan)."""
        plan = self._plans.get(key)
        return plan_holdings(plan) if plan is not None else []

    def hold(self, unit: Unit, placement: Placement) -> bool:
        """Count `placement` (a recorded or moved plan) for the admitted
        `unit`, in place of its plan so far; True when that gave room."""
        grew = self.drop(unit.key)
        requests = {ps.name: ps.requests for ps in unit.pods} or {MAIN_POD_SET: unit.demand}
        per_node: dict[str, dict[int, int]] = {}
        for pod_set, names in placement.nodes.items():
            pairs = self.pairs(requests.get(pod_set, EMPTY))
            for name in names:
                amounts = per_node.setdefault(name, {})
                for r, a in pairs:
                    amounts[r] = amounts.get(r, 0) + a
        used = [(name, tuple(amounts.items())) for name, amounts in per_node.items()]
        self._plans[unit.key] = (placement, used)
        return self._apply(used, -1) or grew

    def keep(self, key: str, plan: FitPlan) -> None:
        """Record the plan of a fresh admission, already taken on its nodes."""
        self._plans[key] = plan

    def drop(self, key: str) -> bool:
        """The unit's plan is gone; True when that gave room."""
        plan = self._plans.pop(key, None)
        return plan is not None and self._apply(plan_holdings(plan), 1)

    def _apply(self, used: list[tuple[str, Pairs]], sign: int) -> bool:
        """Take (sign -1) or give back (+1) what a plan holds on its nodes;
        True when some node grew."""
        index = self.index
        if index is None:
            return False
        grew = False
        for name, pairs in used:
            g = index.position.get(name)
            if g is not None and index.change(g, [(r, sign * a) for r, a in pairs]):
                grew = True
        return grew

    def _made(self, key: str) -> MadePlan:
        """The plan of `key` as (placement, per-node holdings), kept so."""
        plan = self._plans[key]
        if len(plan) != 2:
            plan = self._plans[key] = made_plan(plan)
        return plan


class NodeQueries:
    """An engine's node questions that its `NodeBook` answers as it is:
    the same for both engines."""

    _book: NodeBook

    def plan(self, key: str) -> Placement | None:
        """Where the admitted unit `key` goes (None: not admitted, or no nodes)."""
        return self._book.plan(key)

    def plans(self) -> dict[str, Placement]:
        """The plan of every admitted unit that has one, by unit key."""
        return self._book.plans()

    def pool_usage(self) -> dict[str, tuple[Resources, Resources]]:
        """Per pool: (capacity = its nodes' allocatable, allocated = planned pods)."""
        return self._book.pool_usage()

    def pool_of(self, node: str) -> str | None:
        """The pool node `node` belongs to (None: unknown node, or no nodes)."""
        return self._book.pool_of(node)
