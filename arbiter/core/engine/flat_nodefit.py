"""Node fit of the flat engine (DESIGN.md §10): which queues wait for room.

A mixin of `arbiter.core.engine.flat.AdmissionEngine`, split from it so each
part reads on its own; it shares the engine's state (`QueueState`, `Shape`).
The nodes and the plans of admitted units are the engine's `NodeBook`
(`arbiter.core.engine.nodefit`, kept by both engines); this part is what the
flat engine adds to make node fit incremental.

Node fit, only once `set_nodes` gave nodes: everything above still decides
on aggregate fit; node fit is checked lazily, only for the queue about to
win (`_next_placed`), by first-fit decreasing over the node sets of its
pools (`arbiter.core.placement`). A shape with no room is rejected like one
that does not fit in aggregate, and stays so through re-examination until a
node it could use grows. Its queue then waits in a list sorted by a lower
bound of the key it may offer (its best guarantee flag among those shapes,
its share, its name), with a cursor like the engine's aggregate waiting
list: a node that grows only rewinds the cursor, and before a decision the
queues up to the winner's key are checked against the nodes grown since
(O(grown nodes) each, see `_still_waiting`); only those a grown node may now
give room are re-checked exactly (`_recheck`). So a release followed by
admissions that take the room again costs one cheap check per waiting
queue, not a wake, a heap entry and a re-check each. Admitting a unit
commits its plan on the nodes; `release` gives it back.
"""

from __future__ import annotations

from collections.abc import Iterable
from fractions import Fraction
from typing import TYPE_CHECKING

from arbiter.core.engine.flat_state import (
    DIRTY,
    Entry,
    Fit,
    Pairs,
    QueueState,
    Shape,
    compact_sorted,
    insert_sorted,
)
from arbiter.core.engine.nodefit import NodeQueries
from arbiter.core.model import MAIN_POD_SET, Node, Placement, Pool, Unit
from arbiter.core.placement import NodeIndex, NodeSet, NodeView, Runs, packed_pod
from arbiter.core.quantities import format_quantity
from arbiter.core.resources import Resources

__all__ = ["NodeFit"]

_ANY = (0, 0)  # packed like packed_pod: a pod every node holds


class NodeFit(NodeQueries):
    """The engine's node methods, over its `NodeBook`, and the queues waiting for room."""

    # The engine's own state, used here (set by AdmissionEngine.__init__).
    _admitted: dict[str, Unit]
    _cap: list[int]
    _queues: dict[str, QueueState]
    _seq: int
    _capgen: int
    # Node wait state (`_init_node_fit`).
    _nodegen: int
    _nodewait: dict[str, QueueState]
    _nwlist: list[Entry]
    _nwcursor: int

    if TYPE_CHECKING:  # the engine's methods this part calls
        def _mark_dirty(self, q: QueueState) -> None: ...
        def _examine(self, q: QueueState) -> None: ...
        def _flag(self, q: QueueState, pairs: Pairs) -> int: ...

    def _init_node_fit(self) -> None:
        self._nodegen = 0  # bumped when the node model is replaced
        self._capgen = 0  # bumped when capacity changes (pod order of node fit)
        self._reset_node_wait()

    @property
    def _nodes(self) -> NodeIndex | None:
        """The book's node index (None: aggregate fit only, as without nodes)."""
        return self._book.index

    def _reset_node_wait(self) -> None:
        self._nodewait = {}  # queues with shapes no node has room for
        # Their entries (lowest guarantee flag of those shapes, share, name,
        # 0, nwver, queue), sorted: a lower bound of what they may offer, as
        # their allocation only grew since (a release re-examines a queue).
        # Those before the cursor were found still waiting since the last
        # node grew (see `_take_node_waiting`); stale entries are skipped.
        self._nwlist = []
        self._nwcursor = 0

    def _grew(self, grew: bool) -> None:
        """A node grew (`grew`): it may give room to a queue waiting for some."""
        if grew:
            self._nwcursor = 0

    # -- nodes (DESIGN §10) --------------------------------------------------
    def set_nodes(self, nodes: Iterable[Node] | None, pools: Iterable[Pool] = ()) -> None:
        """Replace the node model (None: aggregate fit only, as without nodes).

        From then on a unit is admitted only where its pods fit on nodes.
        Plans of admitted units are kept and count again on nodes of the same
        name. Every queue is re-examined."""
        self._nodegen += 1
        self._book.set_nodes(nodes, pools)
        self._reset_node_wait()
        for q in self._queues.values():
            if q.spec is not None:
                self._mark_dirty(q)

    def set_node_used(self, name: str, used: Resources) -> None:
        """What node `name` runs that the engine holds no plan for changed
        (pods bound or finished); ValueError for an unknown node."""
        self._grew(self._book.set_node_used(name, used))

    def replan(self, key: str, placement: Placement) -> None:
        """The admitted unit's pods go elsewhere (they bound to other nodes)."""
        unit = self._admitted.get(key)
        if unit is None:
            raise ValueError(f"unit {key} is not admitted")
        self._grew(self._book.hold(unit, placement))

    def node_view(self) -> NodeView | None:
        """The nodes for reclaim's node fit (None: no nodes)."""

        def sets(queue: str) -> list[NodeSet]:
            q = self._queues.get(queue)
            return [] if q is None or q.spec is None else list(self._queue_sets(q))

        return self._book.node_view(sets)

    # -- node fit --------------------------------------------------------------
    def _node_wait_insert(self, q: QueueState) -> None:
        """Give waiting `q` a fresh entry at its key (its old one goes stale)."""
        self._seq += 1
        q.nwver = self._seq
        waiting = self._nwlist
        at = insert_sorted(waiting, (q.noroomflag, q.share, q.name, 0, q.nwver, q))
        if at < self._nwcursor:
            assert self._nodes is not None
            if q.waitmark == self._nodes.grown_total:
                self._nwcursor += 1  # checked since the last growth
            else:
                self._nwcursor = at
        if len(waiting) > 2 * len(self._nodewait) + 64:
            nodewait = self._nodewait
            self._nwlist, self._nwcursor = compact_sorted(
                waiting, self._nwcursor,
                lambda e: e[4] == e[5].nwver and nodewait.get(e[2]) is e[5])

    def _recheck(self, q: QueueState, tested: bool = False) -> None:
        """A waiting queue a grown node may give room: re-examine it if one of
        its shapes without room may fit now, else it keeps waiting for a node
        to grow (`tested`: the caller found `_still_waiting` False)."""
        if q.status == DIRTY or q.spec is None:
            return
        if not tested and self._still_waiting(q):
            return
        nodes = self._grown_nodes(q)
        # The grown nodes of q's sets (and its credit) that hold some pod of
        # q: only they may give its shapes room. When just one does, a shape
        # it holds too few pods of is still full, keeping it as credit.
        words: list[int] | None = None
        single = -1
        lowered = False
        if nodes is not None:
            need, guards = q.nodeneed
            holders = [(g, word) for g, word in nodes
                       if need >= 0 and (word - need) & guards == guards and self._may_use(q, g)]
            words = [word for _, word in holders]
            if len(holders) == 1:
                single = holders[0][0]
        for shape in q.noroom:
            if shape.head >= len(shape.units):
                continue
            pod = shape.podneed
            if words is not None and pod is not None:
                # As in `_still_waiting`, per shape: no grown node holds one
                # of its pods, or only one holds too few, so it is still full.
                need, guards = pod
                held = [word for word in words if need >= 0 and (word - need) & guards == guards]
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
            lacked = shape.gap
            self._set_gap(q, shape)  # what it lacks now
            lowered = lowered or shape.gap < lacked
        if lowered:  # `gapmin` must stay at most each shape's need; a higher one may stay
            q.gapmins = None
            for shape in q.noroom:
                self._fold_gap(q, shape)
        assert self._nodes is not None
        q.waitmark = self._nodes.grown_total
        q.credit = single

    def _may_use(self, q: QueueState, g: int) -> bool:
        """Node g is in one of q's node sets (True when unsure)."""
        if q.nsgen != self._nodegen:
            return True
        assert self._nodes is not None
        nsets = q.nsets
        for node_set, _ in self._nodes.member_of[g]:  # noqa: SIM110 - plain loop: hot
            if node_set in nsets:
                return True
        return False

    def _grown_nodes(self, q: QueueState, cache: dict[tuple[int, int],
                                                      list[tuple[int, int]] | None] | None = None
                     ) -> list[tuple[int, int]] | None:
        """The nodes grown since q's waitmark and its credit, each once, with
        their packed free amounts (None: too many to tell). `cache`, by
        waitmark and credit, is the caller's for as long as no node changes
        (queues checked together share a mark)."""
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
        pods its `gap` counts; the nodes that did not grow since only shrank,
        and of those that grew (and q's credit) none of q's node sets has
        room now even for q's smallest pod, or just one does, for fewer pods
        than any shape lacks: it becomes q's credit. (First fit of one run of
        equal pods fails on less room; with mixed runs any node of q's sets
        that grew sends q to `_recheck`.) `cache`: see `_grown_nodes`."""
        index = self._nodes
        if index is None or not q.nodemins:
            return False
        nodes = self._grown_nodes(q, cache)
        if nodes is None:
            return False
        need, guards = q.nodeneed  # inlined packed tests: called per waiting queue
        holder = -1
        held = 0
        mixed = q.nodemixed
        for g, word in nodes:
            if (mixed or (need >= 0 and (word - need) & guards == guards)) and self._may_use(q, g):
                if holder >= 0 or mixed:
                    return False
                holder, held = g, word
        if holder >= 0:
            need, guards = q.gapmin
            if need < 0 or (held - need) & guards == guards:  # some shape may get its gap
                for shape in q.noroom:
                    if shape.head < len(shape.units):
                        gap = shape.gapneed
                        if gap is None or (gap[0] >= 0 and (held - gap[0]) & gap[1] == gap[1]):
                            return False
        q.waitmark = index.grown_total
        q.credit = holder
        return True

    def _set_gap(self, q: QueueState, shape: Shape) -> None:
        """`shape` just found no room on any of q's node sets: the fewest pods
        it lacked on one (from `NodeSet.fails`; one when a set keeps no
        record or it has more runs), and for one run its `gapneed`."""
        runs = shape.runs
        gap = 1
        if len(runs) == 1 and q.nsgen == self._nodegen:
            run = runs[0]
            gap = run[0]
            for node_set in q.nsets:
                if node_set.members:
                    failed = node_set.fails.get(run)
                    lack = run[0] - failed[2] if failed is not None else 1
                    if lack < gap:
                        gap = lack
            gap = max(gap, 1)
        shape.gap = gap
        if len(runs) != 1 or gap == 1:
            shape.gapneed = shape.podneed
        else:
            shape.gapneed = packed_pod(tuple([(r, a * gap) for r, a in runs[0][1]]))

    @staticmethod
    def _fold_gap(q: QueueState, shape: Shape) -> None:
        """Lower q's `gapmins` (None: start over) to the shape's pods times
        its gap: per resource the least a node must hold for some shape of q
        without room to get the pods it lacks."""
        mins = q.gapmins
        gap = shape.gap
        for _, pairs in shape.runs:
            if mins is None:
                mins = {r: a * gap for r, a in pairs}
            else:
                pod = dict(pairs)
                mins = {r: min(a, pod[r] * gap) for r, a in mins.items() if r in pod}
        q.gapmins = mins
        q.gapmin = packed_pod(tuple(mins.items())) if mins is not None else _ANY

    def _runs(self, shape: Shape) -> Runs:
        """The shape's pods as runs of equal pods, largest dominant share first
        (ties: pod set order): the order first-fit decreasing places them in."""
        if shape.rungen != self._capgen:
            cap = self._cap
            items = [(ps.count, self._book.pairs(ps.requests), ps.name) for ps in shape.pods]
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
        self._book.keep(unit.key, (node_set.pool, node_set.names, tuple(map(tuple, got)),
                                   shape.runs, shape.plannames))

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
        self._set_gap(q, shape)
        first = q.name not in self._nodewait
        if first:
            q.gapmins = None
        self._fold_gap(q, shape)
        flag = self._flag(q, shape.pairs)
        if first:
            assert self._nodes is not None
            self._nodewait[q.name] = q
            q.waitmark = self._nodes.grown_total
            q.credit = -1
        if flag < q.noroomflag or first:
            q.noroomflag = min(flag, q.noroomflag)
            self._node_wait_insert(q)

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
        name = self._book.names[r]
        need = dict(pairs)[r]
        text = (f"no node has room: largest free: {format_quantity(name, free)} {name} on "
                f"{node}; needs {format_quantity(name, need)} {name} per pod")
        return text + (f" for {pods} pods" if pods > 1 else "")
