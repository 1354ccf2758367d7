"""Node fit for a reclaim pass (DESIGN.md §10): "evicting them actually lets
it start". Pure: no I/O.

Reclaim judges shares on cluster totals, but a waiting unit starts only where
its pods fit on nodes of its queue's pools. `NodeRoom` answers the pass's
node questions (`arbiter.core.reclaim.flat.Room`): whether a unit's pods fit
once some victims are gone, by first-fit decreasing like admission, and
books what the pass decided (victims' pods gone from their planned nodes,
a served unit's pods placed) as changes over the engine's node state, whose
free amounts it never writes (`NodeSet.find` may lower a set's floor, which
is a search cache).

Cost: per question, the members of each of the unit's node sets that have
room for one of its pods now (`NodeSet.find`, over live bits) plus the nodes
the pass changed, not every node.
"""

from __future__ import annotations

import functools
import heapq
import itertools
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from fractions import Fraction

from arbiter.core.model import MAIN_POD_SET, Placement, Unit
from arbiter.core.placement import NodeSet, NodeView, Pairs
from arbiter.core.reclaim.rules import cover_greedily
from arbiter.core.reclaim.selection import Admitted, Waiting

__all__ = ["NODE_EXTRA", "NodeRoom"]

# Victims taken node by node beyond what covers a unit in total while its
# pods still fit on no node (each take costs one node-fit check).
NODE_EXTRA = 256
NODE_CANDIDATES = 4096  # candidates the node-by-node walk regroups, at most

Change = dict[int, dict[int, int]]  # node position -> resource index -> signed amount
# (pool, per placement: (pod set, node position, one pod's pairs, pods))
Placed = tuple[str, list[tuple[str, int, Pairs, int]]]


class NodeRoom:
    """Node fit of one reclaim pass (see the module doc)."""

    def __init__(self, view: NodeView, waiting: Mapping[str, Unit],
                 capacity: Mapping[str, int],
                 leaving: Iterable[tuple[str, Pairs]] = ()) -> None:
        """`leaving`: (node, amounts) already being freed there: pods of
        victims taken back (still admitted, or their pods still terminating),
        counted as free like their room in total."""
        self._view = view
        self._waiting = waiting  # key -> the waiting unit (its pod sets)
        self._capacity = capacity
        self._change: Change = {}  # what the pass did on nodes so far
        self._held: dict[str, list[tuple[int, Pairs]]] = {}
        # Per queue: its node sets' nodes, and each victim's first node of them (-1: none).
        self._usable: dict[str, set[int]] = {}
        self._first: dict[str, dict[str, int]] = {}
        position = view.index.position
        self._free_up(self._change, ((position[name], pairs) for name, pairs in leaving
                                     if name in position), None)
        self._runs: dict[str, list[tuple[int, Pairs, str]]] = {}
        self._local: dict[int, dict[int, int]] = {}  # id(node set) -> position -> member

    # -- the pass's questions ----------------------------------------------------------
    def fits(self, unit: Waiting, victims: Sequence[Admitted] = ()) -> bool:
        return self._place(unit, self._with(victims)) is not None

    def serve(self, unit: Waiting, victims: Sequence[Admitted]) -> None:
        self._change.update(self._with(victims))
        self._book(unit)  # (None: served in total only, within-queue room say)

    def _book(self, unit: Waiting | Unit) -> Placed | None:
        """Place the unit with the pass's changes and book its pods there."""
        placed = self._place(unit, self._change)
        for _, g, pairs, count in placed[1] if placed is not None else ():
            amounts = self._change.setdefault(g, {})
            for r, a in pairs:
                amounts[r] = amounts.get(r, 0) - a * count
        return placed

    def placement(self, unit: Unit) -> Placement | None:
        """Where `unit`'s pods go now (as `serve` would book them), booked;
        None: no node set of its queue holds them (nothing booked)."""
        placed = self._book(unit)
        if placed is None:
            return None
        pool, pods = placed
        names = self._view.index.names
        nodes: dict[str, tuple[str, ...]] = dict.fromkeys(
            (name for _, _, name in self._runs_of(unit)), ())
        for pod_set, g, _, count in pods:
            nodes[pod_set] += (names[g],) * count
        return Placement(pool, nodes)

    def usable(self, unit: Waiting, victim: Admitted) -> bool:
        """Whether `victim` holds room on a node `unit`'s queue may use."""
        usable = self._nodes_of(unit.queue)
        return any(g in usable for g, _ in self._holdings(victim.key))

    def _nodes_of(self, queue: str) -> set[int]:
        usable = self._usable.get(queue)
        if usable is None:
            usable = self._usable[queue] = set()
            for node_set in self._view.sets(queue):
                usable.update(node_set.members)
        return usable

    def cover(self, unit: Waiting, need: dict[str, int], candidates: Iterable[Admitted],
              allowed: Callable[[Admitted], bool], take: Callable[[Admitted], None],
              reset: Callable[[], None]) -> list[Admitted] | None:
        """`cover_greedily` in victim order, the unit's pods to fit on nodes
        too; when that finds no such set, once more node by node (victims
        sharing a node together, `by_node`) after `reset` undid the takes."""
        placed = functools.partial(self.fits, unit)
        seen: list[Admitted] = []

        def walked() -> Iterator[Admitted]:
            for victim in candidates:
                seen.append(victim)
                yield victim

        rest = walked()
        chosen = cover_greedily(need, rest, allowed, take, placed, unit.demand)
        if chosen is not None:
            return chosen
        reset()
        # The candidates the first walk did not reach, up to a bound: the
        # second walk costs a look at each one's nodes.
        for _ in itertools.islice(rest, max(0, NODE_CANDIDATES - len(seen))):
            pass
        # Nodes in the order of their first victim the rules allow (with
        # nothing taken yet; taking more only refuses more): a candidate never
        # allowed must not decide which node is tried first, or the same
        # victims grouped from a list with or without it (the loop leaves out
        # queues at their floor, `arbiter fairshare` does not) end elsewhere.
        return cover_greedily(need, self.by_node(unit, [v for v in seen if allowed(v)]),
                              allowed, take, placed, unit.demand, extra=NODE_EXTRA)

    def by_node(self, unit: Waiting, victims: Sequence[Admitted]) -> list[Admitted]:
        """`victims` node by node: each under the first node it holds of the
        unit's node sets, nodes in the order of their first victim, victim
        order kept within a node (so the victims a node needs come together);
        those holding none of those nodes left out."""
        first = self._first.setdefault(unit.queue, {})
        usable = self._nodes_of(unit.queue)
        groups: dict[int, list[Admitted]] = {}
        for victim in victims:
            g = first.get(victim.key)
            if g is None:
                g = first[victim.key] = next(
                    (at for at, _ in self._holdings(victim.key) if at in usable), -1)
            if g >= 0:
                groups.setdefault(g, []).append(victim)
        return [victim for group in groups.values() for victim in group]

    # -- inside ------------------------------------------------------------------------
    def _with(self, victims: Sequence[Admitted]) -> Change:
        """The pass's changes plus `victims`' pods gone (only the nodes they touch copied)."""
        if not victims:
            return self._change
        change = dict(self._change)
        held = self._holdings
        self._free_up(change, (pod for victim in victims for pod in held(victim.key)), set())
        return change

    def _holdings(self, key: str) -> list[tuple[int, Pairs]]:
        """What admitted `key`'s plan holds, per node position (kept for the pass)."""
        got = self._held.get(key)
        if got is None:
            position = self._view.index.position
            got = self._held[key] = [(position[name], pairs)
                                     for name, pairs in self._view.held(key)
                                     if name in position]
        return got

    def _free_up(self, change: Change, holdings: Iterable[tuple[int, Pairs]],
                 copied: set[int] | None) -> None:
        """Add `holdings` (node position, amounts) to `change`; with `copied`,
        each node's amounts are copied first (`change` is a copy of the pass's)."""
        for g, pairs in holdings:
            if copied is not None and g not in copied:
                change[g] = dict(change.get(g, {}))
                copied.add(g)
            amounts = change.setdefault(g, {})
            for r, a in pairs:
                amounts[r] = amounts.get(r, 0) + a

    def _runs_of(self, unit: Waiting | Unit) -> list[tuple[int, Pairs, str]]:
        """The unit's pods as runs of equal pods, largest dominant share first."""
        runs = self._runs.get(unit.key)
        if runs is None:
            full = unit if isinstance(unit, Unit) else self._waiting.get(unit.key)
            pairs = self._view.pairs
            if full is not None and full.pods:
                sized = [(ps.count, pairs(ps.requests), ps.requests, ps.name)
                         for ps in full.pods]
            else:
                sized = [(1, pairs(unit.demand), unit.demand, MAIN_POD_SET)]
            capacity = self._capacity

            def dominant(run: tuple[int, Pairs, Mapping[str, int], str]) -> Fraction:
                return max((Fraction(v, capacity[r]) for r, v in run[2].items()
                            if v > 0 and capacity.get(r, 0) > 0), default=Fraction(0))

            sized.sort(key=dominant, reverse=True)
            runs = self._runs[unit.key] = [(count, p, name) for count, p, _, name in sized]
        return runs

    def _members(self, node_set: NodeSet) -> dict[int, int]:
        local = self._local.get(id(node_set))
        if local is None:
            local = self._local[id(node_set)] = {g: m for m, g in enumerate(node_set.members)}
        return local

    def _place(self, unit: Waiting | Unit, change: Change) -> Placed | None:
        """First-fit decreasing of the unit's pods on the first of its node
        sets where all fit, with `change` over the engine's free amounts:
        its pool, and (pod set, node position, pod pairs, count) per
        placement; None: nowhere."""
        runs = self._runs_of(unit)
        for node_set in self._view.sets(unit.queue):
            n = len(node_set.members)
            if not n:
                continue
            local = self._members(node_set)
            changed = sorted(local[g] for g in change if g in local)
            placed = _first_fit(node_set, [(c, p) for c, p, _ in runs], changed, change)
            if placed is not None:
                members = node_set.members
                return node_set.pool, [(runs[ri][2], members[m], pairs, count)
                                       for ri, m, pairs, count in placed]
        return None


def _first_fit(node_set: NodeSet, runs: list[tuple[int, Pairs]], changed: list[int],
               change: Change) -> list[tuple[int, int, Pairs, int]] | None:
    """`NodeSet.place` over free amounts plus `change` (on members `changed`),
    without touching the set: per run, as many pods per member as fit, in
    member order. Only members with room for one pod now, or changed, are
    looked at: the others hold none. Per placement: (run, member, pairs, count)."""
    fr = node_set.fr
    members = node_set.members
    used: dict[int, dict[int, int]] = {}  # member -> what earlier runs took there
    out: list[tuple[int, int, Pairs, int]] = []
    for ri, (count, pairs) in enumerate(runs):
        if count <= 0:
            continue
        if not pairs:  # requests nothing: any member holds it
            out.append((ri, 0, pairs, count))
            continue
        for m in _candidates(node_set, pairs, changed):
            extra = change.get(members[m])
            taken = used.get(m)
            k = count
            for r, a in pairs:
                free = fr[r][m] + (extra.get(r, 0) if extra else 0) \
                    - (taken.get(r, 0) if taken else 0)
                if free < a * k:
                    k = free // a
                    if k <= 0:
                        break
            if k <= 0:
                continue
            out.append((ri, m, pairs, k))
            amounts = used.setdefault(m, {})
            for r, a in pairs:
                amounts[r] = amounts.get(r, 0) + a * k
            count -= k
            if not count:
                break
        if count:
            return None
    return out


def _candidates(node_set: NodeSet, pairs: Pairs, changed: list[int]) -> Iterator[int]:
    """Members in order, each once: those with room for one pod of `pairs`
    now, merged with the `changed` ones."""
    n = len(node_set.members)

    def roomy() -> Iterator[int]:
        m = node_set.find(pairs, 0)
        while m < n:
            yield m
            m = node_set.find(pairs, m + 1)

    last = -1
    for m in heapq.merge(roomy(), changed):
        if m != last:
            last = m
            yield m
