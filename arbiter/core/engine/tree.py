"""Hierarchical queues (DESIGN §11): H-DRF admission over a tree of queues.

Pure: no I/O, no clock.

Why a separate engine: the flat `AdmissionEngine` is tuned for one level
(shape heaps, a waiting list, lazy node fit) and a flat set of queues must
keep exactly its results. So `new_engine` (`arbiter.core.engine`) makes it
whenever no queue has a parent (`has_hierarchy`), and this engine, with the
same public methods (the `Engine` contract), only for a tree. It shares the
engine's exact share comparison and queue order (`order_key`). Node fit
(§10), once nodes are given (`set_nodes`, `arbiter.core.engine.tree_nodefit`):
a unit fits only when its pods also fit on the nodes of its queue's pools,
first-fit decreasing.

Semantics (§11, held to the plain rescan in `tests/fairshare`):

* A queue's *subtree allocation* is what its subtree's units hold. A unit
  fits when it fits the free capacity and keeps every queue on its path to
  the top within its capability (on the resources the unit requests).
* A parent's guarantee is, per resource, the larger of its own and its
  children's together, so a child's guarantee also counts one level up.
* A *Fair* node (the root, or a parent with `childOrder: Fair`) offers the
  offer of its best child: under guarantee first (subtree allocation + the
  child's offered unit <= its guarantee on every requested resource), then
  the lowest subtree dominant share / weight (exact), then name.
* A *group* (a leaf outside any `childOrder: Queue` subtree, or the topmost
  `childOrder: Queue` parent with its whole subtree) offers its first unit,
  in its own policy, that fits; a blocking group offers its head or nothing.
  Inside a Queue-ordered subtree the children act as quotas only: their
  capability and guarantee count, their weight, policy and blocking do not.
* A queue whose chain of parents is broken (missing parent, cycle) and a
  parent's own units are never admitted.

How it stays incremental between admissions (O(depth · log fan-out) per
admitted unit, plus one rescan of each group whose offer stops fitting):

* Each group scans its sorted units with a cursor. While admitting, free
  capacity and every capability's headroom only shrink, so a unit skipped
  once stays unfittable: the cursor never moves back within a pass.
* Each Fair node keeps a heap of its children's keys (flag, share, name),
  with lazy deletion by version. An admission changes the keys on its path
  only, plus those of groups whose offer no longer fits.
* Those groups are found exactly, per limited resource, by max-heaps of the
  offers' demands: one for free capacity, one per capped queue (over the
  offers below it). After an admission only the heaps of the resources it
  took, at the root and at the capped queues on its path, are looked at.
* Node fit is tested when a group scans (as part of "fits") and again for
  the offer about to win: admissions since the scan may have taken its
  room; then its group scans on, as a fresh scan would.
* Anything else (units added or removed, a release, a spec or capacity
  change) marks the engine stale: the next decision rebuilds the tree, the
  groups and the heaps from scratch (O(units log units)).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from itertools import count
from typing import Protocol

from arbiter.core.engine.flat_state import KEY_FUNCS, sort_units
from arbiter.core.engine.tree_nodefit import commit, place
from arbiter.core.engine.tree_state import TreeState
from arbiter.core.model import QueueSpec, Unit
from arbiter.core.resources import Resources

__all__ = ["HierarchicalEngine", "has_hierarchy"]

Pairs = tuple[tuple[int, int], ...]  # (resource index, amount > 0)


class Parented(Protocol):
    """A queue's spec or cache record: all `has_hierarchy` reads."""

    @property
    def parent(self) -> str | None: ...


def has_hierarchy(queues: Iterable[Parented]) -> bool:
    """Whether some queue names a parent (then `HierarchicalEngine` decides)."""
    return any(spec.parent for spec in queues)


class _Node:
    """A queue in the tree (or the virtual root, spec None)."""

    __slots__ = (
        "alloc", "capl", "children", "cursor", "depth", "divs", "fair", "group", "guar",
        "heap", "lheaps", "limits", "name", "offer", "oversion", "parent", "path", "spec",
        "units", "version",
    )

    def __init__(self, name: str, spec: QueueSpec | None, nres: int) -> None:
        self.name = name
        self.spec = spec
        self.parent: _Node | None = None
        self.children: list[_Node] = []
        self.depth = 0
        self.alloc = [0] * nres  # subtree allocation per resource index
        self.guar = [0] * nres  # effective guarantee (see module doc)
        self.capl: dict[int, int] = {}  # capability, only the resources it names
        self.divs: list[tuple[int, int]] = []  # (index, capacity * weight), capacity > 0
        self.path: list[_Node] = []  # itself and its ancestors, top last (no root)
        self.limits: list[_Node] = []  # the capped queues on `path`
        self.fair = False  # chooses among its children by key (has `heap`)
        self.group: _Node | None = None  # the group scanning its units, if admissible
        # A group's pending units in its order, each with its leaf and demand.
        self.units: list[tuple[Unit, _Node, Pairs]] = []
        self.cursor = 0  # a group's first unit not yet admitted nor skipped
        self.heap: list[_Entry] = []  # a Fair node's children with an offer
        self.offer: tuple[Unit, _Node, Pairs] | None = None  # (unit, its leaf, pairs)
        self.version = 0  # of its valid entry in its parent's heap
        self.oversion = 0  # a group's: of its offer's valid entries in limit heaps
        # Per resource index, a max-heap of the offers below that this queue's
        # capability (the root: free capacity) limits.
        self.lheaps: dict[int, list[_Limit]] = {}


def _deepest_first(node: _Node) -> int:
    return -node.depth


_Entry = tuple[int, int, str, int, _Node]  # (not under, share, name, version, child)
_Limit = tuple[int, int, int, _Node]  # (-demand, sequence number, offer version, group)


class HierarchicalEngine(TreeState):
    """H-DRF admission over a tree of queues (DESIGN §11); see the module doc.
    Specs, units, plans and the queries are `TreeState`'s."""

    def __init__(self, capacity: Resources, queues: Iterable[QueueSpec] = ()) -> None:
        super().__init__(capacity, queues)
        self._index: dict[str, int] = {}
        self._nodes: dict[str, _Node] = {}
        self._root = _Node("", None, 0)
        self._free: list[int] = []
        self._cap: list[int] = []
        self._shift = 0
        self._seq = count()  # ties in the limit heaps (groups do not compare)
        self._groups: list[_Node] = []  # every group with units
        # Per resource: the largest demand of a unit in a group, and whether
        # free capacity fell below it (its free-capacity heap is kept).
        self._need: list[int] = []
        self._watched: list[bool] = []

    # -- decisions -----------------------------------------------------------
    def next(self) -> Unit | None:
        """Admit the next unit per §11 and return it; None when nothing fits."""
        if self._stale:
            self._rebuild()
        while True:
            offer = self._root.offer
            if offer is None:
                return None
            unit, leaf, pairs = offer
            group = leaf.group
            assert group is not None
            if self._book.index is None:
                break
            fit = place(self._book, unit, self._spec(leaf), self._capacity)
            if fit is not None:
                commit(self._book, unit, fit)
                break
            # Its nodes filled since its group's scan: skip it, as that scan
            # would now (room on nodes only shrinks while admitting).
            self._scan(group)
            self._settle(group.path)
        self.remove_pending(unit.key)
        self._hold(unit)
        self._stale = False  # the structures below follow this admission
        free = self._free
        for i, a in pairs:
            free[i] -= a
        for node in leaf.path:
            alloc = node.alloc
            for i, a in pairs:
                alloc[i] += a
        group.cursor += 1  # the offer was at the cursor
        self._scan(group)
        overrun = self._overrun(leaf, pairs)
        if not overrun:
            self._settle(leaf.path)  # deepest first already
            return unit
        dirty: set[_Node] = set(leaf.path)
        for found in set(overrun):
            if found is not group:
                self._scan(found)
                dirty.update(found.path)
        self._settle(sorted(dirty, key=_deepest_first))
        return unit

    def admit_all(self) -> list[Unit]:
        out: list[Unit] = []
        unit = self.next()
        while unit is not None:
            out.append(unit)
            unit = self.next()
        return out

    # -- internals -----------------------------------------------------------
    def _pairs(self, demand: Resources) -> Pairs:
        """`demand` in this rebuild's numbering (every rebuild numbers afresh,
        apart from the node book's append-only one)."""
        index = self._index
        out = []
        for name, amount in demand.items():
            if amount:
                i = index.get(name)
                if i is None:
                    i = index[name] = len(index)
                out.append((i, amount))
        return tuple(out)

    def _rebuild(self) -> None:
        """Build the tree, the groups and every heap from the specs and units."""
        self._stale = False
        specs = self._specs
        index: dict[str, int] = {}
        self._index = index
        for name in self._capacity:
            index.setdefault(name, len(index))
        for spec in specs.values():
            self._pairs(spec.guarantee)
            for name in spec.capability:
                index.setdefault(name, len(index))
        shapes: dict[tuple[tuple[str, int], ...], Pairs] = {}  # equal demands, one Pairs

        def pairs_of(demand: Resources) -> Pairs:
            items = tuple(demand.items())
            got = shapes.get(items)
            if got is None:
                got = shapes[items] = self._pairs(demand)
            return got

        pending = {key: pairs_of(u.demand) for key, u in self._pending.items()}
        held = [(u, pairs_of(u.demand)) for u in self._admitted.values()]
        nres = len(index)
        self._cap = [0] * nres
        for name, amount in self._capacity.items():
            self._cap[index[name]] = amount
        self._free = list(self._cap)
        top = max(self._cap, default=1)
        wbits = max((s.weight.bit_length() for s in specs.values()), default=1)
        self._shift = 2 * (max(top, 1).bit_length() + wbits) + 2
        self._build_tree(nres)
        for unit, pairs in held:
            for i, a in pairs:
                self._free[i] -= a
            holder = self._nodes.get(unit.queue)
            for member in holder.path if holder is not None else ():
                for i, a in pairs:
                    member.alloc[i] += a
        groups: dict[_Node, list[Unit]] = {}
        nodes = self._nodes
        for unit in self._pending.values():
            owner = nodes.get(unit.queue)
            if owner is None or owner.group is None or owner.children:
                continue  # unknown, detached, or a parent's own unit: never admitted
            groups.setdefault(owner.group, []).append(unit)
        need = self._need = [0] * nres
        self._watched = [False] * nres
        self._groups = list(groups)
        for group, units in groups.items():
            sort_units(units, KEY_FUNCS[self._spec(group).policy])
            members = group.units = [(u, nodes[u.queue], pending[u.key]) for u in units]
            for _, _, pairs in members:
                for i, a in pairs:
                    if a > need[i]:
                        need[i] = a
            self._scan(group)
        self._settle(sorted(nodes.values(), key=_deepest_first))

    def _build_tree(self, nres: int) -> None:
        """Nodes, parents, children, groups and effective guarantees."""
        index = self._index
        root = self._root = _Node("", None, nres)
        root.fair = True
        nodes = self._nodes = {}
        for name, spec in self._specs.items():
            node = nodes[name] = _Node(name, spec, nres)
            node.capl = {index[r]: amount for r, amount in spec.capability.items()}
            node.divs = [(i, c * spec.weight) for i, c in enumerate(self._cap) if c > 0]
        for node in nodes.values():
            parent_name = self._spec(node).parent
            node.parent = nodes.get(parent_name) if parent_name else root
        attached = [n for n in nodes.values() if self._attach(n)]
        for node in sorted(attached, key=lambda n: n.name):
            assert node.parent is not None
            node.parent.children.append(node)
        for node in sorted(attached, key=lambda n: n.depth):
            above = node.parent
            if above is not None and above.group is not None:
                node.group = above.group  # inside a Queue-ordered subtree
            elif not node.children or self._spec(node).child_order == "Queue":
                node.group = node
            else:
                node.fair = True
        for node in sorted(attached, key=lambda n: -n.depth):
            guar = node.guar
            for child in node.children:
                for i, a in enumerate(child.guar):
                    guar[i] += a
            for r, amount in self._spec(node).guarantee.items():
                i = index[r]
                guar[i] = max(guar[i], amount)

    @staticmethod
    def _spec(node: _Node) -> QueueSpec:
        spec = node.spec
        assert spec is not None  # every node but the root has one
        return spec

    def _attach(self, node: _Node) -> bool:
        """Set the node's depth, path and capped queues; False when its chain
        of parents is broken (then it is never admitted)."""
        path = [node]
        seen = {node.name}
        current = node.parent
        while current is not self._root:
            if current is None or current.name in seen:
                node.path = [node]
                return False
            path.append(current)
            seen.add(current.name)
            current = current.parent
        node.path = path
        node.depth = len(path)
        node.limits = [n for n in path if n.capl]
        return True

    def _fits(self, pairs: Pairs, leaf: _Node) -> bool:
        free = self._free
        for i, a in pairs:
            if free[i] < a:
                return False
        for node in leaf.limits:
            capl = node.capl
            alloc = node.alloc
            for i, a in pairs:
                cap = capl.get(i)
                if cap is not None and alloc[i] + a > cap:
                    return False
        return True

    def _scan(self, group: _Node) -> None:
        """Set the group's offer: its first unit from the cursor that fits."""
        group.oversion += 1
        group.offer = None
        units = group.units
        blocking = group.spec is not None and group.spec.blocking
        at = group.cursor
        while at < len(units):
            member = units[at]
            leaf = member[1]
            pairs = member[2]
            if self._fits(pairs, leaf) and (self._book.index is None or place(
                    self._book, member[0], self._spec(leaf), self._capacity) is not None):
                group.offer = member
                self._watch(group, leaf, pairs)
                break
            if blocking:
                break
            at += 1
        group.cursor = at

    def _watch(self, group: _Node, leaf: _Node, pairs: Pairs) -> None:
        """Record the group's new offer in the limit heaps it could overrun."""
        entry_version = group.oversion
        seq = next(self._seq)
        lheaps = self._root.lheaps
        watched = self._watched
        for i, a in pairs:
            if watched[i]:
                heapq.heappush(lheaps[i], (-a, seq, entry_version, group))
        for node in leaf.limits:
            capl = node.capl
            lheaps = node.lheaps
            for i, a in pairs:
                if i in capl:
                    heapq.heappush(lheaps.setdefault(i, []), (-a, seq, entry_version, group))

    def _overrun(self, leaf: _Node, pairs: Pairs) -> list[_Node]:
        """The groups whose offer no longer fits after `pairs` went to `leaf`."""
        found: list[_Node] = []
        lheaps = self._root.lheaps
        free = self._free
        watched = self._watched
        for i, _ in pairs:
            if not watched[i]:
                if free[i] >= self._need[i]:
                    continue  # no unit asks for more than is free: none can overrun
                self._watch_free(i)
            self._pop_over(lheaps[i], free[i], found)
        for node in leaf.limits:
            for i, _ in pairs:
                cap = node.capl.get(i)
                if cap is not None:
                    self._pop_over(node.lheaps.get(i), cap - node.alloc[i], found)
        return found

    def _watch_free(self, i: int) -> None:
        """Start the free-capacity heap of resource `i`: until free capacity
        fell below the largest demand of any unit, no offer could overrun it."""
        self._watched[i] = True
        heap = self._root.lheaps[i] = []
        for group in self._groups:
            offer = group.offer
            if offer is not None:
                for r, a in offer[2]:
                    if r == i:
                        heap.append((-a, next(self._seq), group.oversion, group))
        heapq.heapify(heap)

    @staticmethod
    def _pop_over(heap: list[_Limit] | None, room: int, found: list[_Node]) -> None:
        while heap:
            need, _, version, group = heap[0]
            if version != group.oversion:
                heapq.heappop(heap)
            elif -need > room:
                heapq.heappop(heap)
                found.append(group)
            else:
                return

    def _settle(self, dirty: Iterable[_Node]) -> None:
        """Recompute the offers and heap entries of `dirty` nodes (deepest
        first), then the root's offer."""
        shift = self._shift
        push = heapq.heappush
        for node in dirty:
            parent = node.parent
            if parent is None or not parent.fair:
                continue  # inside a Queue-ordered subtree: not chosen by key
            if node.fair:
                node.offer = self._top(node)
            node.version = version = node.version + 1
            offer = node.offer
            if offer is None:
                continue
            alloc = node.alloc
            guar = node.guar
            flag = 0
            for i, a in offer[2]:
                if alloc[i] + a > guar[i]:
                    flag = 1
                    break
            # AdmissionEngine._share_of, inlined: this loop runs once per node
            # per rebuild, and a call per node cost ~10 % of the tree pass.
            share = 0  # see AdmissionEngine: exact, as one scaled integer
            for i, div in node.divs:
                held = alloc[i]
                if held > 0:
                    scaled = (held << shift) // div
                    if scaled > share:
                        share = scaled
            push(parent.heap, (flag, share, node.name, version, node))
        self._root.offer = self._top(self._root)

    @staticmethod
    def _top(node: _Node) -> tuple[Unit, _Node, Pairs] | None:
        heap = node.heap
        while heap:
            entry = heap[0]
            child = entry[4]
            if entry[3] == child.version and child.offer is not None:
                return child.offer
            heapq.heappop(heap)
        return None
