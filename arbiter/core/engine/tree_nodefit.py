"""Node fit of the tree engine (DESIGN §10 for `arbiter.core.engine.tree`).

Pure: no I/O. The flat engine's node fit is woven into its incremental
structures (`arbiter.core.engine.flat_nodefit`); the tree engine rebuilds its
offers after every change anyway, so it only asks, of the nodes and plans in
its `NodeBook` (`arbiter.core.engine.nodefit`), where a unit's pods would go
now (`place`: the first pool of its queue's order, narrowed by the queue's
nodeSelector, where all of them fit, first-fit decreasing as in
`arbiter.core.placement`), and holds that plan (`commit`).
"""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction

from arbiter.core.engine.nodefit import NodeBook
from arbiter.core.model import MAIN_POD_SET, Placement, QueueSpec, Unit
from arbiter.core.placement import NodeSet, Pairs, fit_placement

__all__ = ["TreeFitResult", "commit", "place"]

# (node set, pod set names in placement order, per pod set the member of each pod)
TreeFitResult = tuple[NodeSet, tuple[str, ...], list[list[int]]]


def place(book: NodeBook, unit: Unit, spec: QueueSpec,
          capacity: Mapping[str, int]) -> TreeFitResult | None:
    """Where the unit's pods would go now (first-fit decreasing in the
    first pool of `spec`'s order with room for all); None: nowhere, or no nodes."""
    index = book.index
    if index is None:
        return None
    sets = unit.pods or ()
    runs = [(ps.count, book.pairs(ps.requests), ps.name) for ps in sets] \
        or [(1, book.pairs(unit.demand), MAIN_POD_SET)]

    def largest_first(run: tuple[int, Pairs, str]) -> Fraction:
        names = book.names
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


def commit(book: NodeBook, unit: Unit, fit: TreeFitResult) -> Placement:
    """Hold the plan `place` found (nothing changed on the nodes since)."""
    node_set, names, members = fit
    placement = fit_placement(node_set.pool, node_set.names, names, members,
                              (ps.name for ps in unit.pods))
    book.hold(unit, placement)
    return placement
