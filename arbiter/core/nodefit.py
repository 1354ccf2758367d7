"""Node fit of the admission engine (DESIGN.md §10): the per-node bookkeeping.

A mixin of `arbiter.core.fairshare.AdmissionEngine`, split from it so each
part reads on its own; it shares the engine's state (`QueueState`, `Shape`).

Node fit (DESIGN.md §10), only once `set_nodes` gave nodes: everything above
still decides on aggregate fit; node fit is checked lazily, only for the
queue about to win (`_next_placed`), by first-fit decreasing over the node
sets of its pools (`arbiter.core.placement`). A shape with no room is
rejected like one that does not fit in aggregate, and stays so through
re-examination until a node it could use grows. Its queue is then *woken*:
kept in a heap keyed by a lower bound of what it may offer, and re-checked
exactly only before a decision that key could beat (usually after the first
woken queue took the room, when an O(grown nodes) test sends it back to
waiting). Heap keys stay lower bounds
of the true keys: a queue with a guarantee is keyed by the best flag it may
still offer, and held aside while a queue with a smaller exact key wins.
Admitting a unit commits its plan on the nodes; `release` gives it back.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping
from fractions import Fraction
from typing import TYPE_CHECKING

from arbiter.core.model import MAIN_POD_SET, Node, Placement, Pool, Unit
from arbiter.core.placement import NodeIndex, NodeSet, Runs, packed_pod
from arbiter.core.quantities import format_quantity
from arbiter.core.queuestate import (
    DIRTY,
    Entry,
    Fit,
    MadePlan,
    Pairs,
    Plan,
    QueueState,
    Shape,
    made_plan,
    plan_holdings,
)
from arbiter.core.resources import EMPTY, Resources

__all__ = ["NodeFit"]

_ANY = (0, 0)  # packed like packed_pod: a pod every node holds


class NodeFit:
    """Node sets, plans of admitted units, and the queues waiting for room."""

    # The engine's own state, used here (set by AdmissionEngine.__init__).
    _admitted: dict[str, Unit]
    _cap: list[int]
    _index: dict[str, int]
    _names: list[str]
    _queues: dict[str, QueueState]
    _seq: int
    _capgen: int
    # Node fit state (`_init_node_fit`).
    _nodes: NodeIndex | None
    _nodegen: int
    _plans: dict[str, Plan]
    _nodewait: dict[str, QueueState]
    _woken: list[Entry]

    if TYPE_CHECKING:  # the engine's methods this part calls
        def _res(self, name: str) -> int: ...
        def _pairs(self, demand: Mapping[str, int]) -> Pairs: ...
        def _mark_dirty(self, q: QueueState) -> None: ...
        def _examine(self, q: QueueState) -> None: ...
        def _flag(self, q: QueueState, pairs: Pairs) -> int: ...

    def _init_node_fit(self) -> None:
        # Node fit (DESIGN §10), only once nodes are given: None = aggregate only.
        self._nodes = None
        self._nodegen = 0  # bumped when the node model is replaced
        self._capgen = 0  # bumped when capacity changes (pod order of node fit)
        self._plans = {}
        self._nodewait = {}  # queues with shapes no node has room for
        # Queues taken from `_nodewait` because a node they could use grew,
        # keyed (lowest guarantee flag of those shapes, share, name): a lower
        # bound of what they may offer. Re-checked only before a decision
        # that key could beat (see `_next_placed`).
        self._woken = []

    # -- nodes (DESIGN §10) --------------------------------------------------
    def set_nodes(self, nodes: Iterable[Node] | None, pools: Iterable[Pool] = ()) -> None:
        """Replace the node model (None: aggregate fit only, as without nodes).

        From then on a unit is admitted only where its pods fit on nodes.
        Plans of admitted units are kept and count again on nodes of the same
        name. Every queue is re-examined."""
        self._nodes = None
        self._nodegen += 1
        if nodes is not None:
            nodes = list(nodes)
            for node in nodes:
                for name in node.allocatable:
                    self._res(name)
                for name in node.used:
                    self._res(name)
            index = NodeIndex(nodes, pools, len(self._names))
            for g, node in enumerate(index.nodes):
                for name, amount in (node.allocatable - node.used).items():
                    index.free[self._index[name]][g] = amount
            self._nodes = index
            for key in list(self._plans):
                self._apply(self._made(key)[1], -1)
        self._nodewait = {}
        self._woken = []
        for q in self._queues.values():
            if q.spec is not None:
                self._mark_dirty(q)

    def set_node_used(self, name: str, used: Resources) -> None:
        """What node `name` runs that the engine holds no plan for changed
        (pods bound or finished); ValueError for an unknown node."""
        index = self._nodes
        g = None if index is None else index.position.get(name)
        if index is None or g is None:
            raise ValueError(f"unknown node {name}")
        node = index.nodes[g]
        delta = [(self._res(r), node.used.get_amount(r) - used.get_amount(r))
                 for r in set(node.used) | set(used)]
        index.nodes[g] = Node(node.name, node.labels, node.allocatable, used)
        if index.change(g, delta):
            self._wake(g)

    def plan(self, key: str) -> Placement | None:
        """Where the admitted unit `key` goes (None: not admitted, or no nodes)."""
        return self._made(key)[0] if key in self._plans else None

    def replan(self, key: str, placement: Placement) -> None:
        """The admitted unit's pods go elsewhere (they bound to other nodes)."""
        unit = self._admitted.get(key)
        if unit is None:
            raise ValueError(f"unit {key} is not admitted")
        held = self._plans.pop(key, None)
        if held is not None:
            self._apply(plan_holdings(held), 1)
        self._hold(unit, placement)

    def plans(self) -> dict[str, Placement]:
        """The plan of every admitted unit that has one, by unit key."""
        return {key: self._made(key)[0] for key in list(self._plans)}

    def pool_usage(self) -> dict[str, tuple[Resources, Resources]]:
        """Per pool: (capacity = its nodes' allocatable, allocated = planned pods).

        O(nodes + plans): for status and metrics, not for every decision."""
        index = self._nodes
        if index is None:
            return {}
        capacity: dict[str, Resources] = {name: EMPTY for name in index.pool_order}
        for g, node in enumerate(index.nodes):
            pool = index.pool_of[g]
            capacity[pool] = capacity.get(pool, EMPTY) + node.allocatable
        allocated: dict[str, dict[str, int]] = {name: {} for name in capacity}
        names = self._names
        for key in list(self._plans):
            for node_name, pairs in self._made(key)[1]:
                at = index.position.get(node_name)
                if at is None:
                    continue
                amounts = allocated[index.pool_of[at]]
                for r, a in pairs:
                    amounts[names[r]] = amounts.get(names[r], 0) + a
        return {name: (capacity[name], Resources(allocated[name])) for name in capacity}

    def pool_of(self, node: str) -> str | None:
        """The pool node `node` belongs to (None: unknown node, or no nodes)."""
        index = self._nodes
        g = None if index is None else index.position.get(node)
        return None if index is None or g is None else index.pool_of[g]

    # -- node fit --------------------------------------------------------------
    def _hold(self, unit: Unit, placement: Placement) -> None:
        """Record `placement` for the admitted `unit` and count its pods on its nodes."""
        requests = {ps.name: ps.requests for ps in unit.pods} or {MAIN_POD_SET: unit.demand}
        per_node: dict[str, dict[int, int]] = {}
        for pod_set, names in placement.nodes.items():
            pairs = self._pairs(requests.get(pod_set, EMPTY))
            for name in names:
                amounts = per_node.setdefault(name, {})
                for r, a in pairs:
                    amounts[r] = amounts.get(r, 0) + a
        used = [(name, tuple(amounts.items())) for name, amounts in per_node.items()]
        self._plans[unit.key] = (placement, used)
        self._apply(used, -1)

    def _apply(self, used: list[tuple[str, Pairs]], sign: int) -> None:
        """Take (sign -1) or give back (+1) what a plan holds on its nodes."""
        index = self._nodes
        if index is None:
            return
        for name, pairs in used:
            g = index.position.get(name)
            if g is not None and index.change(g, [(r, sign * a) for r, a in pairs]):
                self._wake(g)

    def _wake(self, g: int) -> None:
        """Node g grew: wake the queues whose shapes found no room and might
        use it (its pool and selector are theirs, it holds as many pods of
        one of their shapes as that shape lacked); `_recheck` tells exactly,
        later. A queue g holds some pods of, but too few, keeps g as its
        credit: a second node that holds some wakes it."""
        index = self._nodes
        assert index is not None
        word = index.packed(g)
        grown = [node_set for node_set, _ in index.member_of[g]]
        gen = self._nodegen
        woken: list[QueueState] = []
        for q in self._nodewait.values():  # inlined packed tests and _may_fit: this loop is hot
            need, guards = q.nodeneed
            if need < 0 or (word - need) & guards != guards:
                continue  # not even its smallest pod fits on g
            if q.nsgen == gen:
                for node_set in q.nsets:
                    if node_set in grown:
                        break
                else:
                    continue
                for shape in q.noroom:
                    if shape.head < len(shape.units):
                        pod = shape.podneed
                        if pod is None or (pod[0] >= 0 and (word - pod[0]) & pod[1] == pod[1]):
                            break
                else:
                    continue  # no pod of theirs fits on g: their room is unchanged
                credit = q.credit
                if credit >= 0 and credit != g:
                    if (index.packed(credit) - need) & guards == guards:
                        woken.append(q)  # two nodes hold some: their sum may do
                        continue
                    q.credit = -1  # it shrank since: it holds none now
                for shape in q.noroom:
                    if shape.head < len(shape.units):
                        gap = shape.gapneed
                        if gap is None or (gap[0] >= 0 and (word - gap[0]) & gap[1] == gap[1]):
                            break
                else:
                    q.credit = g
                    continue  # g alone holds too few pods of every shape
            woken.append(q)
        if not woken:
            return
        # Every node that grew since q's waitmark without waking q had no room
        # for any of its pods then (or is its credit) and only shrank since:
        # from now on only g, its credit and the nodes that grow later can
        # hold one (see `_still_waiting`).
        mark = index.grown_total - 1  # g's growth is the last one counted
        nodewait = self._nodewait
        entries: list[Entry] = []
        for q in woken:
            del nodewait[q.name]
            q.waitmark = mark
            if q.spec is None or q.status == DIRTY:
                self._mark_dirty(q)
                continue
            # A blocking queue too: its head's shape is among those without
            # room, so `_recheck` re-examines it exactly when that may fit.
            # Keyed by the best guarantee flag its shapes had when rejected:
            # a lower bound, as q's allocation only grew since (a release
            # re-examines q). Re-checked lazily, see `_take_woken`.
            q.woken = True
            self._seq += 1
            entries.append((q.noroomflag, q.share, q.name, 0, self._seq, q))
        heap = self._woken
        if len(entries) > len(heap):
            heap.extend(entries)
            heapq.heapify(heap)
        else:
            for entry in entries:
                heapq.heappush(heap, entry)

    def _recheck(self, q: QueueState, tested: bool = False) -> None:
        """A woken queue: re-examine it if one of its shapes without room may
        fit now, else it keeps waiting for a node to grow (`tested`: the
        caller found `_still_waiting` False)."""
        q.woken = False
        if q.status == DIRTY or q.spec is None:
            return
        if not tested and self._still_waiting(q):
            self._nodewait[q.name] = q
            return
        nodes = self._grown_nodes(q)
        # The one node that holds some pod of q (-1: none or several): a
        # shape it holds too few pods of is still full, keeping it as credit.
        single = -1
        if nodes is not None:
            need, guards = q.nodeneed
            holders = [g for g, word in nodes if need >= 0 and (word - need) & guards == guards]
            if len(holders) == 1:
                single = holders[0]
        for shape in q.noroom:
            if shape.head >= len(shape.units):
                continue
            pod = shape.podneed
            if nodes is not None and pod is not None:
                # As in `_still_waiting`, per shape: no grown node holds one
                # of its pods, or only one holds too few, so it is still full.
                need, guards = pod
                held = [word for _, word in nodes
                        if need >= 0 and (word - need) & guards == guards]
                if not held:
                    continue
                gap = shape.gapneed
                if (single >= 0 and gap is not None
                        and (gap[0] < 0 or (held[0] - gap[0]) & gap[1] != gap[1])):
                    continue
            if not self._still_no_room(q, shape):
                self._mark_dirty(q)
                self._examine(q)
                return
            shape.gapneed = self._gap_need(q, shape)  # what it lacks now
        self._nodewait[q.name] = q
        assert self._nodes is not None
        q.waitmark = self._nodes.grown_total
        q.credit = single

    def _grown_nodes(self, q: QueueState, cache: dict[tuple[int, int],
                                                      list[tuple[int, int]] | None] | None = None
                     ) -> list[tuple[int, int]] | None:
        """The nodes grown since q's waitmark and its credit, each once, with
        their packed free amounts (None: too many to tell). `cache`, by
        waitmark and credit, is the caller's for as long as no node changes
        (queues woken together share a mark)."""
        key = (q.waitmark, q.credit)
        if cache is not None and key in cache:
            return cache[key]
        index = self._nodes
        assert index is not None
        grown = index.grown_since(q.waitmark)
        nodes = None
        if grown is not None and len(grown) <= 64:
            packed = index.packed
            if q.credit >= 0:
                grown = [*grown, q.credit]
            nodes = [(g, packed(g)) for g in dict.fromkeys(grown)]
        if cache is not None:
            cache[key] = nodes
        return nodes

    def _still_waiting(self, q: QueueState, cache: dict[tuple[int, int],
                                                        list[tuple[int, int]] | None] | None = None
                       ) -> bool:
        """Cheap sufficient test that no shape of q without room fits now:
        each was full (on every node set) when q began to wait, lacking the
        pods its `gapneed` counts; the nodes that did not grow since only
        shrank, and of those that grew (and q's credit) none has room now
        even for q's smallest pod, or just one does, for fewer pods than any
        shape lacks. (First fit of one run of equal pods fails on less room;
        mixed runs are left to `_recheck`.) `cache`: see `_grown_nodes`."""
        index = self._nodes
        if index is None or not q.nodemins:
            return False
        if q.nodemixed:
            for shape in q.noroom:
                if shape.podneed is None and shape.head < len(shape.units):
                    return False
        nodes = self._grown_nodes(q, cache)
        if nodes is None:
            return False
        need, guards = q.nodeneed  # inlined packed test: called per woken queue
        holder = -1
        held = 0
        if need >= 0:
            for g, word in nodes:
                if (word - need) & guards == guards:
                    if holder >= 0:
                        return False
                    holder, held = g, word
        if holder >= 0:
            for shape in q.noroom:
                if shape.head < len(shape.units):
                    gap = shape.gapneed
                    if gap is None or (gap[0] >= 0 and (held - gap[0]) & gap[1] == gap[1]):
                        return False
        q.waitmark = index.grown_total
        q.credit = holder
        return True

    def _gap_need(self, q: QueueState, shape: Shape) -> tuple[int, int] | None:
        """`shape` just found no room on any of q's node sets: its pod times
        the fewest pods it lacked on one (from `NodeSet.fails`), packed; None
        for more runs. At least one pod when a set keeps no record."""
        runs = shape.runs
        if len(runs) != 1:
            return None
        run = runs[0]
        count, pairs = run
        gap = count
        if q.nsgen == self._nodegen:
            for node_set in q.nsets:
                if node_set.members:
                    failed = node_set.fails.get(run)
                    lack = count - failed[2] if failed is not None else 1
                    if lack < gap:
                        gap = lack
        else:
            gap = 1
        if gap <= 1:
            return shape.podneed
        return packed_pod(tuple([(r, a * gap) for r, a in pairs]))

    def _runs(self, shape: Shape) -> Runs:
        """The shape's pods as runs of equal pods, largest dominant share first
        (ties: pod set order): the order first-fit decreasing places them in."""
        if shape.rungen != self._capgen:
            cap = self._cap
            items = [(ps.count, self._pairs(ps.requests), ps.name) for ps in shape.pods]
            if not shape.pods:
                items = [(1, shape.pairs, MAIN_POD_SET)]

            def dominant(item: tuple[int, Pairs, str]) -> Fraction:
                return max((Fraction(a, cap[r]) for r, a in item[1] if cap[r] > 0),
                           default=Fraction(0))

            if len(items) > 1:
                items.sort(key=dominant, reverse=True)  # stable for equal shares
            shape.runs = tuple((count, pairs) for count, pairs, _ in items)
            shape.plannames = (tuple(name for _, _, name in items),
                               tuple(ps.name for ps in shape.pods))
            shape.podneed = packed_pod(shape.runs[0][1]) if len(items) == 1 else None
            shape.rungen = self._capgen
        return shape.runs

    def _queue_sets(self, q: QueueState) -> list[NodeSet]:
        if q.nsgen != self._nodegen:
            index = self._nodes
            assert index is not None and q.spec is not None
            order = q.spec.pools or index.pool_order
            selector = q.spec.selector_key()
            q.nsets = [index.node_set(pool, selector) for pool in dict.fromkeys(order)]
            q.nsgen = self._nodegen
        return q.nsets

    def _place(self, q: QueueState, shape: Shape) -> Fit | None:
        """First pool of q's order where a unit of `shape` fits on nodes."""
        runs = shape.runs if shape.rungen == self._capgen else self._runs(shape)
        for node_set in q.nsets if q.nsgen == self._nodegen else self._queue_sets(q):
            if node_set.members:
                got = node_set.place(runs)
                if got is not None:
                    return node_set, got
        return None

    def _commit(self, unit: Unit, shape: Shape, fit: Fit) -> None:
        """Take what `fit` places on its nodes; the plan is built when asked."""
        node_set, got = fit
        members = node_set.members
        index = self._nodes
        assert index is not None
        take = index.take
        for (_, pairs), placed in zip(shape.runs, got, strict=True):
            # `placed` holds each member once per pod, in runs: one take per run.
            end = len(placed)
            at = 0
            while at < end:
                m = placed[at]
                stop = at + 1
                while stop < end and placed[stop] == m:
                    stop += 1
                take(members[m], pairs, stop - at)
                at = stop
        self._plans[unit.key] = (node_set.pool, node_set.names, tuple(map(tuple, got)),
                                 shape.runs, shape.plannames)

    def _made(self, key: str) -> MadePlan:
        """The plan of admitted `key` as (placement, per-node holdings), kept so."""
        held = self._plans[key]
        if len(held) != 2:
            held = self._plans[key] = made_plan(held)
        return held

    def _node_reject(self, q: QueueState, shape: Shape) -> None:
        """No node has room for `shape` now: skip it until a node it could use grows."""
        if q.blocking:
            q.nodeshape = shape
        else:
            shape.rejected = True
        shape.noroom = True
        q.noroom.append(shape)
        if shape.podneed is None:
            q.nodemixed = True
        smallest: dict[int, int] | None = q.nodemins
        for _, pairs in shape.runs:
            if smallest is None:
                smallest = dict(pairs)
            else:
                pod = dict(pairs)
                smallest = {r: min(a, pod[r]) for r, a in smallest.items() if r in pod}
        q.nodemins = smallest
        q.nodeneed = packed_pod(tuple(smallest.items())) if smallest is not None else _ANY
        flag = self._flag(q, shape.pairs)
        if flag < q.noroomflag:
            q.noroomflag = flag
        shape.gapneed = self._gap_need(q, shape)
        if q.name not in self._nodewait and not q.woken:
            assert self._nodes is not None
            q.waitmark = self._nodes.grown_total
            q.credit = -1
        self._nodewait[q.name] = q

    def _still_no_room(self, q: QueueState, shape: Shape) -> bool:
        """A shape that found no room still finds none (checked on the nodes
        that grew since, see NodeSet.still_full); False when unsure."""
        if self._nodes is None or q.nsgen != self._nodegen or len(shape.runs) != 1:
            return False
        run = shape.runs[0]
        for ns in q.nsets:  # noqa: SIM110 - a plain loop is faster than all() here
            if ns.members and not ns.still_full(run):
                return False
        return True

    def _optimistic_flag(self, q: QueueState) -> int:
        """0 when some shape it may still offer keeps q within its guarantee."""
        alloc = q.alloc
        guar = q.guar
        for shape in q.shapes.values():  # `_flag` inlined: called per admission
            if shape.rejected or shape.head >= len(shape.units):
                continue
            for i, a in shape.pairs:
                if alloc[i] + a > guar[i]:
                    break
            else:
                return 0
        return 1

    def _no_room(self, q: QueueState, shape: Shape) -> str:
        """Why no node holds a unit of `shape`: the largest free slot it could use."""
        sets = self._queue_sets(q)
        pools = ", ".join(ns.pool for ns in sets)
        if not any(ns.members for ns in sets):
            return f"no nodes in its pools ({pools})"
        runs = self._runs(shape)
        pods = sum(count for count, _ in runs)
        _, pairs = runs[0]
        cap = self._cap
        best: tuple[Fraction, int, int, str] | None = None  # (shortfall, r, free, node)
        for r, a in pairs:
            free, node = max((ns.largest(r) for ns in sets if ns.members),
                             key=lambda slot: slot[0])
            short = Fraction(a - free, cap[r]) if cap[r] > 0 else Fraction(a - free)
            if best is None or short > best[0]:
                best = (short, r, max(free, 0), node)
        if best is None:
            return f"no node in its pools ({pools})"
        _, r, free, node = best
        name = self._names[r]
        need = dict(pairs)[r]
        text = (f"no node has room: largest free: {format_quantity(name, free)} {name} on "
                f"{node}; needs {format_quantity(name, need)} {name} per pod")
        return text + (f" for {pods} pods" if pods > 1 else "")
