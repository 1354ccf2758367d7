"""Weighted DRF admission: which tenant's next unit is admitted (DESIGN.md §4).

Pure: no I/O, no clock. Two implementations of the same semantics live here:

* `admission_order` — the plain reference: every step rescans every queue.
  Short and obviously right; the tests hold the engine to it.
* `AdmissionEngine` — the incremental engine the admission loop keeps alive
  across events (pending units added and removed, units released, queues and
  capacity changed).

Semantics (discrete progressive filling). Repeat: among the queues whose
*next unit* fits — fits in free capacity and keeps the queue within its
capability on every resource the unit requests (resources absent from the
capability are unlimited; a queue already over its capability in one
resource, say after the capability was lowered, may still take units that do
not request it, as with a Kubernetes ResourceQuota) — pick the
queue that is *under guarantee* (allocated + unit <= guarantee on every
resource the unit requests) first, then the lowest weighted dominant share
(dominant share / weight, compared exactly), ties by queue name; admit that
unit. The next unit of a non-blocking queue is its first unit in queue order
that fits now, and the under-guarantee flag is that unit's (so a big unit
ahead of a small one competes by share alone even if the small one would be
within the guarantee); a blocking queue only ever offers its head. Stop when
nothing fits. Queue order: `Priority` = priority desc, creation time, key; `FIFO` =
creation time, key. A unit whose queue is unknown is never admitted; a unit
requesting a resource the cluster has none of never fits.

How the engine stays incremental (an admission costs O(log queues + log
shapes), plus O(1) for each shape it finds no longer fits, once per pass):

* Every queue with a candidate (its next unit, known to fit) sits in a heap
  keyed (not under guarantee, weighted share, name). Shares are compared
  exactly as one integer, floor(allocated_r * 2**K / (capacity_r * weight))
  maximised over r, with 2**K larger than the product of any two
  denominators, so two different fractions never share a key and equal ones
  always do.
* Inside a queue, pending units are grouped by *shape* (equal demand
  vectors), each shape in queue order. Equal demands fit or fail together,
  so the queue's next unit is the earliest head among the shapes that fit: a
  small heap of shape heads per queue finds it in O(log shapes), however
  many identical units wait. A shape found not to fit is *rejected*; while
  nothing grows it stays unfittable, so it is not looked at again. The
  engine keeps no record per unit besides the `Unit` itself in its shape's
  list (cheap to build, and nothing extra for the garbage collector).
* Free capacity only shrinks while admitting, which can take the candidate of
  another queue out of reach. Per resource, a max-heap of the candidates'
  demands finds exactly those queues after each admission (lazy deletion by
  version). A resource's heap is only kept once its free capacity drops
  below the largest candidate demand seen: before that nothing can fail.
* A queue with rejected shapes also has an entry in the *waiting list*,
  sorted by an optimistic key (best under-guarantee flag among its rejected
  units, its share, its name) and carrying a cheap necessary condition for
  any of them to fit again (per resource, the smallest demand that failed
  there; and the element-wise minimum of their demands). When free capacity
  grows (a release), a cursor over that list is rewound; `next` walks it only
  as far as the best candidate's key and re-examines a queue only when its
  condition holds. Without growth the cursor never moves back, so a queue
  whose head cannot fit is not looked at again. (So a release costs at most
  one cheap check per waiting queue, spread over the next calls.)
* Anything that changes a queue itself (its spec, a release from it, a new
  head) marks it dirty; dirty queues are re-examined from the start on the
  next call. A capacity change re-examines every queue.

Node fit (DESIGN.md §10), only once `set_nodes` gave nodes: the nodes and
plans are a `NodeBook` (`arbiter.core.engine.nodefit`, the tree engine keeps
one too); the queues waiting for room are `arbiter.core.engine.flat_nodefit`
(a mixin of the engine); `_next_placed` below is the decision loop that uses
them.
"""

from __future__ import annotations

import heapq
from bisect import bisect_right
from collections.abc import Iterable, Mapping
from fractions import Fraction
from itertools import compress

from arbiter.core.engine.flat_nodefit import NodeFit
from arbiter.core.engine.flat_state import (
    CAND,
    DIRTY,
    IDLE,
    KEY_FUNCS,
    PARKED,
    UNLIMITED,
    CandEntry,
    Entry,
    Fit,
    OrderKey,
    Pairs,
    QueueState,
    Shape,
    ShapeEntry,
    ShapeKey,
    compact_sorted,
    insert_sorted,
    shape_key,
)
from arbiter.core.engine.nodefit import NodeBook
from arbiter.core.model import Node, Placement, Pool, QueuePolicy, QueueSpec, Unit
from arbiter.core.resources import EMPTY, Resources

__all__ = ["AdmissionEngine", "admission_order", "dominant_share_of", "format_share",
           "order_key"]


def order_key(unit: Unit, policy: QueuePolicy) -> OrderKey:
    """Sort key of `unit` inside a queue with `policy`."""
    if policy == "FIFO":
        return (unit.created, unit.key)
    return (-unit.priority, unit.created, unit.key)


# ---------------------------------------------------------------------------
# Reference implementation
# ---------------------------------------------------------------------------


def dominant_share_of(allocated: Mapping[str, int], capacity: Mapping[str, int]) -> Fraction:
    """max over r of allocated_r / capacity_r (resources with capacity 0 ignored)."""
    shares = [Fraction(v, capacity[r]) for r, v in allocated.items()
              if v > 0 and capacity.get(r, 0) > 0]
    return max(shares, default=Fraction(0))


def format_share(share: Fraction) -> float:
    """A dominant share as arbiter shows it (`arbiter fairshare`, Queue status):
    the correctly rounded float, rounded to 4 places."""
    return round(float(share), 4)


def admission_order(
    capacity: Resources,
    queues: Iterable[QueueSpec],
    pending: Iterable[Unit],
    admitted: Iterable[Unit] = (),
) -> list[Unit]:
    """The units of `pending` in the order they are admitted (full rescan per step)."""
    specs = {spec.name: spec for spec in queues}
    allocated: dict[str, Resources] = {name: EMPTY for name in specs}
    used = EMPTY
    for unit in admitted:
        used = used + unit.demand
        allocated[unit.queue] = allocated.get(unit.queue, EMPTY) + unit.demand
    waiting: dict[str, list[Unit]] = {name: [] for name in specs}
    for unit in pending:
        if unit.queue in waiting:
            waiting[unit.queue].append(unit)
    for name, units in waiting.items():
        units.sort(key=lambda u, p=specs[name].policy: order_key(u, p))  # type: ignore[misc]

    order: list[Unit] = []
    while True:
        free = capacity - used
        best: tuple[tuple[bool, Fraction, str], Unit] | None = None
        for name, spec in specs.items():
            held = allocated[name]
            chosen: Unit | None = None
            for unit in waiting[name]:
                within = all(
                    held.get_amount(r) + v <= spec.capability[r]
                    for r, v in unit.demand.items()
                    if r in spec.capability
                )
                if within and unit.demand.fits_in(free):
                    chosen = unit
                    break
                if spec.blocking:
                    break
            if chosen is None:
                continue
            under = all(
                held.get_amount(r) + v <= spec.guarantee.get_amount(r)
                for r, v in chosen.demand.items()
            )
            key = (not under, dominant_share_of(held, capacity) / spec.weight, name)
            if best is None or key < best[0]:
                best = (key, chosen)
        if best is None:
            return order
        unit = best[1]
        waiting[unit.queue].remove(unit)
        allocated[unit.queue] = allocated[unit.queue] + unit.demand
        used = used + unit.demand
        order.append(unit)


# ---------------------------------------------------------------------------
# Incremental engine
# ---------------------------------------------------------------------------

# A shape drops the admitted units before its head once they are more than
# half of its list and more than this many (tests lower it to exercise that).
TIDY_MIN = 32


class AdmissionEngine(NodeFit):
    """Incremental weighted-DRF admission over a changing set of queues and units."""

    def __init__(
        self,
        capacity: Resources,
        queues: Iterable[QueueSpec] = (),
        nodes: Iterable[Node] | None = None,
        pools: Iterable[Pool] = (),
    ) -> None:
        self._book = NodeBook(self._add_resource)
        # The book numbers resources (nodes and decisions share the numbering);
        # bound once here: they are called per unit.
        self._index = self._book.number
        self._names = self._book.names
        self._res = self._book.res
        self._pairs = self._book.pairs
        self._cap: list[int] = []
        self._free: list[int] = []
        # Per resource: a max-heap of candidates' demands, kept only once free
        # capacity drops below the largest candidate demand seen (`_candmax`);
        # until then no candidate can be pushed out of reach in it.
        self._candheaps: list[list[CandEntry]] = []
        self._candon: list[bool] = []
        self._candmax: list[int] = []
        self._shift = 0
        self._wbits = 1
        self._queues: dict[str, QueueState] = {}
        self._pending: dict[str, Unit] = {}
        self._admitted: dict[str, Unit] = {}
        self._heap: list[Entry] = []
        self._wait: list[Entry] = []
        self._cursor = 0
        self._wlive = 0
        self._dirtyq: list[QueueState] = []
        self._seq = 0
        self._init_node_fit()
        self.set_capacity(capacity)
        for spec in queues:
            self.add_queue(spec)
        if nodes is not None:
            self.set_nodes(nodes, pools)

    # -- resources -----------------------------------------------------------
    def _add_resource(self) -> None:
        """The book numbered a new resource: every per-resource list gets its slot."""
        self._cap.append(0)
        self._free.append(0)
        self._candheaps.append([])
        self._candon.append(False)
        self._candmax.append(0)
        for q in self._queues.values():
            q.alloc.append(0)
            q.capl.append(UNLIMITED)
            q.guar.append(0)
            q.divl.append(0)

    def _vector(self, values: list[int]) -> Resources:
        # compress/filter skip the zeros in C: a vector has a slot for every
        # resource name ever seen (thousands, if tenants make them up).
        return Resources(zip(compress(self._names, values), filter(None, values), strict=True))

    def _recompute_shift(self) -> None:
        top = max(self._cap, default=1)
        self._shift = 2 * (max(top, 1).bit_length() + self._wbits) + 2
        for q in self._queues.values():
            self._set_divs(q)

    def _set_divs(self, q: QueueState) -> None:
        weight = q.spec.weight if q.spec is not None else 1
        q.divs = [(i, c * weight) for i, c in enumerate(self._cap) if c > 0]
        q.divl = [c * weight if c > 0 else 0 for c in self._cap]

    # -- configuration -------------------------------------------------------
    def set_capacity(self, capacity: Resources) -> None:
        """Replace the cluster capacity; every queue is re-examined."""
        for name, amount in capacity.items():
            if amount < 0:
                raise ValueError(f"capacity {name} must not be negative")
            self._res(name)
        used = [c - f for c, f in zip(self._cap, self._free, strict=True)]
        self._cap = [capacity.get(name, 0) for name in self._names]
        self._free = [c - u for c, u in zip(self._cap, used, strict=True)]
        self._capgen += 1
        self._recompute_shift()
        self._reset_structures()

    def _reset_structures(self) -> None:
        self._heap = []
        self._wait = []
        self._cursor = 0
        self._wlive = 0
        self._candheaps = [[] for _ in self._names]
        self._candon = [False] * len(self._names)
        self._candmax = [0] * len(self._names)
        self._reset_node_wait()
        for q in self._queues.values():
            q.inwait = False
            if q.spec is not None:
                self._mark_dirty(q)

    def add_queue(self, spec: QueueSpec) -> None:
        """Add `spec`, or replace the queue of the same name (its units stay)."""
        for name in spec.guarantee:
            self._res(name)
        for name in spec.capability:
            self._res(name)
        q = self._queue(spec.name)
        nres = len(self._names)
        q.spec = spec
        q.blocking = spec.blocking
        q.capl = [UNLIMITED] * nres
        for name, amount in spec.capability.items():
            q.capl[self._index[name]] = amount
        q.guar = [0] * nres
        for name, amount in spec.guarantee.items():
            q.guar[self._index[name]] = amount
        q.hasguar = any(amount > 0 for amount in spec.guarantee.values())
        if spec.policy != q.policy:
            q.policy = spec.policy
            q.order = KEY_FUNCS[spec.policy]
            for shape in q.shapes.values():
                shape.unsorted = True
                shape.tail = None  # keys of the old order do not compare with new ones
        if spec.weight.bit_length() > self._wbits:
            self._wbits = spec.weight.bit_length()
            self._recompute_shift()
            self._reset_structures()
        self._set_divs(q)
        q.nsgen = -1  # its pools or nodeSelector may have changed
        self._mark_dirty(q)

    def remove_queue(self, name: str) -> None:
        """Forget the queue's spec: its units stay but are never admitted."""
        q = self._queues.get(name)
        if q is None or q.spec is None:
            return
        q.spec = None
        self._bump(q)
        q.cand = q.cshape = q.head = None
        q.status = IDLE
        self._set_divs(q)

    def _queue(self, name: str) -> QueueState:
        q = self._queues.get(name)
        if q is None:
            q = QueueState(name, len(self._names))
            self._queues[name] = q
        return q

    # -- units ---------------------------------------------------------------
    def add_pending(self, unit: Unit) -> None:
        """Add a unit waiting for admission (replaces a pending unit with that key)."""
        key = unit.key
        if key in self._pending or key in self._admitted:
            if key in self._admitted:
                raise ValueError(f"unit {key} is already admitted")
            self.remove_pending(key)
        q = self._queues.get(unit.queue)
        if q is None:
            q = self._queue(unit.queue)
        # Units of one demand share a shape (and its resource-index pairs).
        # Keyed by the demand's items as given: an equal demand spelt in
        # another order just makes a second shape, which is still correct.
        skey = shape_key(unit) if unit.pods else unit.demand.names_amounts()
        shape = q.shapes.get(skey)
        if shape is None:
            shape = q.shapes[skey] = Shape(skey, self._pairs(unit.demand), unit.pods)
            if not shape.pairs:
                q.bare = True
        self._pending[key] = unit
        okey = q.order(unit)
        units = shape.units
        tail = shape.tail
        if q.status == DIRTY or q.status == IDLE:
            # Re-examined (and sorted) before the next decision.
            if tail is not None and okey < tail:
                shape.unsorted = True
            else:
                shape.tail = okey
            units.append(unit)
            return
        if tail is not None and okey < tail:
            at = bisect_right(units, okey, lo=shape.head, key=q.order)
            units.insert(at, unit)
        else:
            at = len(units)
            units.append(unit)
            shape.tail = okey
        if at != shape.head:
            return  # behind an earlier unit of the same demand: changes nothing now
        if q.blocking:
            self._push_shape(q, shape)
            current = q.cand or q.head
            if current is None or okey < q.order(current):
                self._find_blocking(q)
            return
        if shape.rejected:
            return  # known not to fit (until the queue is re-examined)
        self._push_shape(q, shape)
        cand = q.cand
        if cand is not None and not okey < q.order(cand):
            if self._nodes is not None and (q.hasguar or not shape.pairs) and q.status == CAND:
                self._push_cand(q)  # its optimistic guarantee flag may drop
            return  # comes after the unit the queue offers now
        if self._fits(q, shape.pairs):
            q.cand = unit
            q.cshape = shape
            q.status = CAND
            self._push_cand(q)
        else:
            shape.rejected = True
            if (self._skip(q, shape.pairs) or not q.inwait) and q.thr:
                self._wait_insert(q)

    def remove_pending(self, key: str) -> None:
        """Drop a pending unit (deleted, or moved elsewhere). Unknown keys are ignored."""
        unit = self._pending.pop(key, None)
        if unit is None:
            return
        q = self._queues[unit.queue]
        shape = q.shapes[shape_key(unit)]
        at = shape.index(unit, q.order)
        assert at >= 0
        del shape.units[at]
        if q.status != CAND and q.status != PARKED:
            return  # re-examined from scratch before the next decision
        if at == shape.head:
            self._push_shape(q, shape)
        if q.blocking:
            if unit is q.cand or unit is q.head:
                self._find_blocking(q)
        elif unit is q.cand:
            self._find(q)

    def add_admitted(self, unit: Unit, placement: Placement | None = None) -> None:
        """Record a unit that is already admitted: it counts in its queue's allocation.

        With `placement` (its recorded plan) its pods also count on those nodes;
        without, the caller counts its bound pods in the nodes' `used`."""
        key = unit.key
        if key in self._admitted:
            self.release(key)
        if key in self._pending:
            self.remove_pending(key)
        q = self._queue(unit.queue)
        pairs = self._pairs(unit.demand)
        self._admitted[key] = unit
        if placement is not None:
            self._grew(self._book.hold(unit, placement))
        q.nadmitted += 1
        alloc = q.alloc
        free = self._free
        for i, amount in pairs:
            alloc[i] += amount
            free[i] -= amount
        if q.spec is not None:
            self._mark_dirty(q)
        self._invalidate(pairs)

    def release(self, key: str) -> None:
        """An admitted unit is gone (finished, deleted, preempted). Unknown keys are ignored."""
        unit = self._admitted.pop(key, None)
        if unit is None:
            return
        q = self._queues[unit.queue]
        q.nadmitted -= 1
        alloc = q.alloc
        free = self._free
        for i, amount in self._pairs(unit.demand):
            alloc[i] -= amount
            free[i] += amount
        self._grew(self._book.drop(key))
        self._cursor = 0  # free capacity grew: rejected units may fit again
        if q.spec is not None:
            self._mark_dirty(q)

    # -- decisions -----------------------------------------------------------
    def next(self) -> Unit | None:
        """Admit the next unit per DESIGN.md §4 and return it; None when nothing fits.

        With nodes, "fits" also means its pods fit on the nodes of one of its
        queue's pools (§10); `plan(key)` then tells where."""
        if self._dirtyq:
            self._process_dirty()
        if self._nodes is not None:
            return self._next_placed()
        pop = heapq.heappop
        while True:
            heap = self._heap  # _valid_top, inlined (compaction may replace the heap)
            while heap and heap[0][4] != heap[0][5].version:
                pop(heap)
            top = heap[0] if heap else None
            wait = self._wait
            c = self._cursor
            if c < len(wait) and (top is None or not wait[c] > top):  # else it stays put
                hit = self._scan_waiting(top)
                if hit is not None:
                    self._examine(hit)
                    continue
            if top is None:
                return None
            best = top[5]
            if best.inwait and self._qualifies(best):
                # One of its own rejected units may fit again, and would come
                # first in its queue; its waiting entry can sort after its
                # heap entry (worse guarantee flag), so check it here.
                self._examine(best)
                continue
            # Its entry stays on top: _push_cand replaces it in one step if the
            # queue has a next candidate (else it is dropped as stale later).
            return self._admit(best)

    def _next_placed(self) -> Unit | None:
        """`next` with node fit, checked lazily: only the queue about to win is placed.

        A candidate was chosen on aggregate fit; nodes may have filled since.
        So the winner is placed on nodes first: no room -> its shape is
        rejected (until a node it could use grows) and its queue offers its
        next unit. Heap keys stay lower bounds of the true keys (see
        `_push_cand`); a queue whose exact key is worse than its entry is
        *held* aside, placed, until it is the smallest of held and heap.
        """
        held: list[tuple[Entry, Entry, Fit]] = []  # (exact entry, heap entry, fit)
        while True:
            top = self._valid_top()
            if held:
                held = [h for h in held if h[1][4] == h[1][5].version]
            limit = top
            first = min(held) if held else None
            if first is not None and (top is None or first[0] < top):
                limit = first[0]
            if self._nodewait and self._take_node_waiting(limit, top, held):
                continue
            hit = self._scan_waiting(limit)
            if hit is not None:
                self._examine(hit)
                continue
            if first is not None and limit is not top:
                for entry in held:
                    if entry is not first:
                        heapq.heappush(self._heap, entry[1])
                return self._admit(first[1][5], first[2])
            if top is None:
                return None
            q = top[5]
            if q.inwait and self._qualifies(q):
                self._examine(q)
                continue
            shape = q.cshape
            assert shape is not None
            fit = self._place(q, shape)
            if fit is None:
                self._node_reject(q, shape)
                if q.blocking:
                    self._find_blocking(q)
                else:
                    self._find(q)
                continue
            exact = self._flag(q, shape.pairs)
            if exact <= top[0]:
                for entry in held:
                    heapq.heappush(self._heap, entry[1])
                return self._admit(q, fit)
            heapq.heappop(self._heap)
            held.append(((exact, *top[1:]), top, fit))

    def _take_node_waiting(self, limit: Entry | None, top: Entry | None,
                           held: list[tuple[Entry, Entry, Fit]]) -> bool:
        """Re-check one queue waiting for node room that a grown node may
        give room to and that could come before `limit`, or whose own
        decision is next (it may offer an earlier unit); True if one was."""
        nodewait = self._nodewait
        index = self._nodes
        assert index is not None
        total = index.grown_total
        cache: dict[tuple[int, int], list[tuple[int, int]] | None] = {}  # no node changes here
        for entry in (top, *(h[0] for h in held)):
            if entry is None:
                continue
            q = entry[5]
            if (nodewait.get(q.name) is q and q.waitmark != total and q.status != DIRTY
                    and not self._still_waiting(q, cache)):
                self._recheck(q, tested=True)
                return True
        waiting = self._nwlist
        c = self._nwcursor
        end = len(waiting)
        while c < end:
            entry = waiting[c]
            if limit is not None and entry > limit:
                break
            c += 1
            q = entry[5]
            if (entry[4] != q.nwver or q.waitmark == total or nodewait.get(q.name) is not q
                    or q.status == DIRTY or q.spec is None):
                continue
            # `_still_waiting`'s usual answer inlined: no grown node (nor its
            # credit) holds even q's smallest pod. This loop is hot.
            key = (q.waitmark, q.credit)
            nodes = cache[key] if key in cache else self._grown_nodes(q, cache)
            need, guards = q.nodeneed
            if nodes is not None and need >= 0 and not q.nodemixed:
                for _, word in nodes:
                    if (word - need) & guards == guards:
                        break
                else:
                    q.waitmark = total
                    q.credit = -1
                    continue
            if self._still_waiting(q, cache):
                continue
            self._nwcursor = c
            self._recheck(q, tested=True)
            return True
        self._nwcursor = c
        return False

    def _valid_top(self) -> Entry | None:
        heap = self._heap
        while heap:
            top = heap[0]
            if top[4] == top[5].version:
                return top
            heapq.heappop(heap)
        return None

    def _scan_waiting(self, top: Entry | None) -> QueueState | None:
        """Advance the waiting-list cursor up to `top`; a queue whose rejected
        units may fit again stops it."""
        wait = self._wait  # compaction may replace it: read it on every call
        c = self._cursor
        end = len(wait)
        free = self._free
        hit: QueueState | None = None
        while c < end:
            entry = wait[c]
            if top is not None and entry > top:
                break
            q = entry[5]
            if entry[4] == q.wversion:
                # Inlined first half of _qualifies: usually nothing passes.
                for i, t in q.thr.items():
                    if free[i] >= t:
                        if self._qualifies(q):
                            hit = q
                        break
                if hit is not None:
                    break
            c += 1
        self._cursor = c
        return hit

    def admit_all(self) -> list[Unit]:
        """Admit until nothing fits; the admitted units in order."""
        out: list[Unit] = []
        step = self.next
        unit = step()
        while unit is not None:
            out.append(unit)
            unit = step()
        return out

    # -- queries -------------------------------------------------------------
    def capacity(self) -> Resources:
        return self._vector(self._cap)

    def free(self) -> Resources:
        """Capacity minus everything admitted (negative where over-committed)."""
        return self._vector(self._free)

    def allocated(self, queue: str) -> Resources:
        q = self._queues.get(queue)
        return EMPTY if q is None else self._vector(q.alloc)

    def spec(self, queue: str) -> QueueSpec | None:
        q = self._queues.get(queue)
        return None if q is None else q.spec

    def pending(self, queue: str) -> list[Unit]:
        """Pending units of `queue` in queue order (position = index)."""
        q = self._queues.get(queue)
        return [] if q is None else q.units()

    def admitted(self, queue: str) -> list[Unit]:
        """Admitted units of `queue` (in the order the engine learnt of them)."""
        return [unit for unit in self._admitted.values() if unit.queue == queue]

    def admitted_count(self, queue: str) -> int:
        q = self._queues.get(queue)
        return 0 if q is None else q.nadmitted

    def is_pending(self, key: str) -> bool:
        return key in self._pending

    def is_admitted(self, key: str) -> bool:
        return key in self._admitted

    def dominant_share(self, queue: str) -> Fraction:
        """max over r of allocated_r / capacity_r (resources with capacity 0 ignored)."""
        q = self._queues.get(queue)
        if q is None:
            return Fraction(0)
        cap, alloc = self._cap, q.alloc
        return max(
            (Fraction(alloc[i], cap[i]) for i in compress(range(len(alloc)), alloc)
             if cap[i] > 0),
            default=Fraction(0),
        )

    def weighted_share(self, queue: str) -> Fraction:
        spec = self.spec(queue)
        return self.dominant_share(queue) / (spec.weight if spec is not None else 1)

    def explain(self, queue: str) -> str:
        """Why the head of `queue` waits; "" when nothing waits."""
        q = self._queues.get(queue)
        if q is None:
            return ""
        units = q.units()
        if not units:
            return ""
        if q.spec is None:
            return f"queue {queue} does not exist"
        return self._reason(q, units[0])

    def explain_unit(self, key: str) -> str:
        """Why the pending unit `key` waits; "" when it is not pending."""
        unit = self._pending.get(key)
        if unit is None:
            return ""
        q = self._queues[unit.queue]
        if q.spec is None:
            return f"queue {q.name} does not exist"
        if q.blocking:
            head = q.units()[0]
            if head is not unit and self._reason(q, head) != _FITS:
                return f"blocked behind head unit {head.key}"
        return self._reason(q, unit)

    def _reason(self, q: QueueState, unit: Unit) -> str:
        names = self._names
        pairs = self._pairs(unit.demand)
        capped = [names[i] for i, a in pairs if q.alloc[i] + a > q.capl[i]]
        if capped:
            return f"queue at capability ({', '.join(capped)})"
        absent = [names[i] for i, a in pairs if self._cap[i] <= 0]
        if absent:
            return f"cluster has no capacity for ({', '.join(absent)})"
        full = [names[i] for i, a in pairs if a > self._free[i]]
        if full:
            return f"cluster full ({', '.join(full)})"
        if self._nodes is not None:
            shape = q.shapes.get(shape_key(unit))
            if shape is not None and self._place(q, shape) is None:
                return self._no_room(q, shape)
        return _FITS

    # -- internals -----------------------------------------------------------
    def _bump(self, q: QueueState) -> None:
        """Make every heap and waiting entry of `q` stale."""
        self._seq += 1
        q.version = self._seq
        if q.inwait:
            q.inwait = False
            self._wlive -= 1
        q.wversion = self._seq

    def _mark_dirty(self, q: QueueState) -> None:
        if q.status == DIRTY:
            return
        self._bump(q)
        q.cand = q.cshape = q.head = None
        q.status = DIRTY
        self._dirtyq.append(q)

    def _process_dirty(self) -> None:
        dirty = self._dirtyq
        self._dirtyq = []
        for q in dirty:
            if q.status == DIRTY:
                self._examine(q)

    def _share_of(self, q: QueueState) -> int:
        shift = self._shift
        alloc = q.alloc
        best = 0
        for i, div in q.divs:
            a = alloc[i]
            if a > 0:
                v = (a << shift) // div
                if v > best:
                    best = v
        return best

    def _examine(self, q: QueueState) -> None:
        """Re-derive everything about `q` from scratch (O(shapes), not O(units))."""
        self._bump(q)
        q.cand = q.cshape = q.head = None
        if q.spec is None:
            q.status = IDLE
            return
        q.thr = {}
        q.mins = None
        q.optflag = 2
        if q.nodemins is not None or q.nodeshape is not None:
            q.nodemins = None
            q.nodemixed = False
            q.nodeshape = None
            q.noroom = []
            q.noroomflag = 2
            self._nodewait.pop(q.name, None)
        q.share = self._share_of(q)
        order = q.order
        sheap: list[ShapeEntry] = []
        seq = self._seq
        empty: list[ShapeKey] = []
        noroom: list[Shape] = []
        bare = False
        for skey, shape in q.shapes.items():
            if shape.unsorted or (shape.head > TIDY_MIN and shape.head * 2 > len(shape.units)):
                shape.tidy(order)
            unit = shape.first()
            if unit is None:
                empty.append(skey)
                continue
            if not shape.pairs:
                bare = True
            if shape.noroom and not q.blocking and self._still_no_room(q, shape):
                noroom.append(shape)  # cheaper than offering it and placing it again
                continue
            shape.noroom = False
            shape.rejected = False
            seq += 1
            shape.ver = seq
            sheap.append((order(unit), seq, shape))
        self._seq = seq
        for skey in empty:
            del q.shapes[skey]
        q.bare = bare
        heapq.heapify(sheap)
        q.sheap = sheap
        for shape in noroom:
            self._node_reject(q, shape)
        if q.blocking:
            self._find_blocking(q)
        else:
            self._find(q)

    def _push_shape(self, q: QueueState, shape: Shape) -> None:
        """The head of `shape` changed: give it a fresh heap entry."""
        self._seq += 1
        shape.ver = self._seq
        if shape.head > TIDY_MIN and shape.head * 2 > len(shape.units):
            shape.tidy(q.order)
        unit = shape.first()
        if unit is None:
            if q.shapes.get(shape.key) is shape:
                del q.shapes[shape.key]
            return
        if shape.rejected:
            return
        sheap = q.sheap
        heapq.heappush(sheap, (q.order(unit), shape.ver, shape))
        if len(sheap) > 2 * len(q.shapes) + 16:
            q.sheap = sheap = [e for e in sheap if e[1] == e[2].ver and not e[2].rejected]
            heapq.heapify(sheap)

    def _fits(self, q: QueueState, pairs: Pairs) -> bool:
        free = self._free
        alloc = q.alloc
        capl = q.capl
        for i, a in pairs:  # noqa: SIM110 - a plain loop is faster than all() here
            if a > free[i] or alloc[i] + a > capl[i]:
                return False
        return True

    def _flag(self, q: QueueState, pairs: Pairs) -> int:
        """0 when admitting a unit of `pairs` keeps `q` within its guarantee, else 1."""
        if not q.hasguar:
            return 1 if pairs else 0
        alloc = q.alloc
        guar = q.guar
        for i, a in pairs:
            if alloc[i] + a > guar[i]:
                return 1
        return 0

    def _skip(self, q: QueueState, pairs: Pairs) -> bool:
        """Record that a unit of `pairs` does not fit; True when q's optimistic flag improved."""
        free = self._free
        alloc = q.alloc
        capl = q.capl
        first = -1
        need = 0
        for i, a in pairs:
            if alloc[i] + a > capl[i]:
                return False  # waits for its own queue to shrink or change
            if first < 0 and a > free[i]:
                first, need = i, a
        thr = q.thr.get(first)
        if thr is None or need < thr:
            q.thr[first] = need
        mins = q.mins
        if mins is None:
            q.mins = dict(pairs)
        else:
            demand = dict(pairs)
            for i in list(mins):
                a = demand.get(i, 0)
                if a <= 0:
                    del mins[i]
                elif a < mins[i]:
                    mins[i] = a
        flag = self._flag(q, pairs)
        if flag < q.optflag:
            q.optflag = flag
            return True
        return False

    def _qualifies(self, q: QueueState) -> bool:
        """Might one of q's rejected units fit now? (a necessary condition)"""
        free = self._free
        for i, t in q.thr.items():
            if free[i] >= t:
                break
        else:
            return False
        mins = q.mins
        if mins is not None:
            for i, m in mins.items():
                if free[i] < m:
                    return False
        return True

    def _push_cand(self, q: QueueState) -> None:
        shape = q.cshape
        assert shape is not None
        pairs = shape.pairs
        self._seq += 1
        version = self._seq
        q.version = version
        heap = self._heap
        flag = self._flag(q, pairs)
        if flag and (q.hasguar or q.bare) and self._nodes is not None:
            # Node fit is checked only when the queue wins; if its candidate
            # then has no room, a later unit within its guarantee may be next
            # (a unit requesting nothing is within any, even in a queue
            # without one). Keep the key a lower bound of what it may offer.
            flag = self._optimistic_flag(q)
        entry: Entry = (flag, q.share, q.name, 1, version, q)
        if heap and heap[0][5] is q:
            heapq.heapreplace(heap, entry)  # its own, now stale, entry
        else:
            heapq.heappush(heap, entry)
        if len(heap) > 2 * len(self._queues) + 64:
            self._heap = heap = [e for e in heap if e[4] == e[5].version]
            heapq.heapify(heap)
        on = self._candon
        for i, a in pairs:
            if on[i]:
                ch = self._candheaps[i]
                heapq.heappush(ch, (-a, version, q))
                if len(ch) > 4 * len(self._queues) + 64:
                    ch = [e for e in ch if e[1] == e[2].version]
                    heapq.heapify(ch)
                    self._candheaps[i] = ch
            elif a > self._candmax[i]:
                self._candmax[i] = a

    def _park(self, q: QueueState) -> None:
        self._seq += 1
        q.version = self._seq
        q.cand = q.cshape = None
        q.status = PARKED

    def _find(self, q: QueueState, lowered: bool = False) -> None:
        """Non-blocking: offer the earliest head among the shapes that fit."""
        sheap = q.sheap
        free = self._free
        alloc = q.alloc
        capl = q.capl
        while sheap:
            _, ver, shape = sheap[0]
            if ver != shape.ver or shape.rejected:
                heapq.heappop(sheap)
                continue
            for r, a in shape.pairs:
                if a > free[r] or alloc[r] + a > capl[r]:
                    break
            else:
                q.cand = shape.units[shape.head]
                q.cshape = shape
                q.status = CAND
                self._push_cand(q)
                break
            heapq.heappop(sheap)
            shape.rejected = True
            if self._skip(q, shape.pairs):
                lowered = True
        else:
            self._park(q)
        if q.thr and (lowered or not q.inwait):
            self._wait_insert(q)

    def _find_blocking(self, q: QueueState) -> None:
        """Blocking: only the head of the queue is offered."""
        sheap = q.sheap
        found: Shape | None = None
        while sheap:
            _, ver, shape = sheap[0]
            if ver == shape.ver:
                found = shape
                break
            heapq.heappop(sheap)
        # The head may have changed: forget what was recorded about the old one.
        if q.inwait:
            q.inwait = False
            self._wlive -= 1
        self._seq += 1
        q.wversion = self._seq
        q.thr = {}
        q.mins = None
        q.optflag = 2
        q.head = found.units[found.head] if found is not None else None
        noroom = found is not None and found is q.nodeshape
        if found is not None and not noroom and self._fits(q, found.pairs):
            q.cand = q.head
            q.cshape = found
            q.status = CAND
            self._push_cand(q)
            return
        self._park(q)
        if found is not None and not noroom:
            self._skip(q, found.pairs)
            if q.thr:
                self._wait_insert(q)

    def _wait_insert(self, q: QueueState) -> None:
        if not q.inwait:
            q.inwait = True
            self._wlive += 1
        self._seq += 1
        q.wversion = self._seq
        wait = self._wait
        at = insert_sorted(wait, (q.optflag, q.share, q.name, 0, q.wversion, q))
        if at < self._cursor:
            if self._qualifies(q):
                self._cursor = at
            else:
                self._cursor += 1
        if len(wait) > 2 * self._wlive + 64:
            self._wait, self._cursor = compact_sorted(
                wait, self._cursor, lambda e: e[4] == e[5].wversion)

    def _admit(self, q: QueueState, fit: Fit | None = None) -> Unit:
        unit = q.cand
        shape = q.cshape
        assert unit is not None and shape is not None
        if fit is not None:
            self._commit(unit, shape, fit)
        pairs = shape.pairs
        q.nadmitted += 1
        key = unit.key
        del self._pending[key]
        self._admitted[key] = unit
        free = self._free
        alloc = q.alloc
        # Only the resources it requests grew: they alone can raise the share.
        shift = self._shift
        divl = q.divl
        share = q.share
        for i, a in pairs:
            held = alloc[i] + a
            alloc[i] = held
            free[i] -= a
            div = divl[i]
            if div:
                part = (held << shift) // div
                if part > share:
                    share = part
        q.share = share
        # The unit was its shape's head. The shape's heap entry is the first
        # valid one (anything above it is stale or rejected): replace it by
        # the shape's next head in one step.
        shape.head += 1
        sheap = q.sheap
        while sheap and (sheap[0][2] is not shape or sheap[0][1] != shape.ver):
            heapq.heappop(sheap)
        if not sheap:
            self._push_shape(q, shape)
        else:
            if shape.head > TIDY_MIN and shape.head * 2 > len(shape.units):
                shape.tidy(q.order)
            self._seq += 1
            shape.ver = self._seq
            at = shape.head
            head = shape.units[at] if at < len(shape.units) else None
            if head is None:
                heapq.heappop(sheap)
                if q.shapes.get(shape.key) is shape:
                    del q.shapes[shape.key]
            else:
                heapq.heapreplace(sheap, (q.order(head), shape.ver, shape))
        if q.blocking:
            self._find_blocking(q)
        else:
            self._find(q)
        self._invalidate(pairs)
        return unit

    def _activate(self, i: int) -> None:
        """Start keeping the candidate heap of resource `i`."""
        self._candon[i] = True
        heap: list[CandEntry] = []
        for q in self._queues.values():
            shape = q.cshape
            if q.status == CAND and shape is not None:
                for j, a in shape.pairs:
                    if j == i:
                        heap.append((-a, q.version, q))
        heapq.heapify(heap)
        self._candheaps[i] = heap

    def _invalidate(self, pairs: Pairs) -> None:
        """Free capacity shrank on `pairs`' resources: re-place candidates out of reach."""
        free = self._free
        cheaps = self._candheaps
        on = self._candon
        for i, _ in pairs:
            limit = free[i]
            if not on[i]:
                if limit >= self._candmax[i]:
                    continue  # every candidate still fits in this resource
                self._activate(i)
            while True:
                ch = cheaps[i]  # _push_cand may have compacted it
                if not ch or -ch[0][0] <= limit:
                    break
                _, version, q = heapq.heappop(ch)
                if version != q.version:
                    continue
                shape = q.cshape
                assert shape is not None
                if q.blocking:
                    self._find_blocking(q)
                else:
                    shape.rejected = True
                    self._find(q, self._skip(q, shape.pairs))


_FITS = "fits now; waiting for the next admission pass"
