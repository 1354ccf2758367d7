"""The incremental engine's per-queue state (see `arbiter.core.engine.flat`).

Pure data and small helpers, apart so that the engine and its node wait
(`arbiter.core.engine.flat_nodefit`) share one definition: a queue's
pending units grouped by shape, its allocation in resource-index lists, and
the heap entries the engine keys queues by.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Callable, Hashable
from operator import attrgetter

from arbiter.core.model import PodSet, QueuePolicy, QueueSpec, Unit
from arbiter.core.placement import NodeSet, Pairs, Runs

__all__ = [
    "CAND", "DIRTY", "IDLE", "KEY_FUNCS", "PARKED", "UNLIMITED", "CandEntry", "Entry", "Fit",
    "KeyFunc", "OrderKey", "Pairs", "QueueState", "Runs", "Shape", "ShapeEntry", "ShapeKey",
    "compact_sorted", "fifo_key", "insert_sorted", "priority_key", "shape_key", "sort_units",
]

UNLIMITED = 1 << 200  # capability of an uncapped resource

# Queue states. Every change of state bumps the queue's version, which makes
# its heap entries stale.
CAND = 0  # has a candidate unit that fits
PARKED = 1  # nothing it offers fits now
IDLE = 2  # unknown queue (no spec)
DIRTY = 3  # must be re-examined from scratch before the next decision

OrderKey = tuple[int, float, str] | tuple[float, str]
ShapeKey = tuple[Hashable, ...]  # a demand's names and amounts, as given (plus its pod sets)
KeyFunc = Callable[[Unit], OrderKey]


def priority_key(unit: Unit) -> OrderKey:
    return (-unit.priority, unit.created, unit.key)


def fifo_key(unit: Unit) -> OrderKey:
    return (unit.created, unit.key)


KEY_FUNCS: dict[str, KeyFunc] = {"Priority": priority_key, "FIFO": fifo_key}
_BY_CREATED = attrgetter("created", "key")
_BY_PRIORITY = attrgetter("priority")


def shape_key(unit: Unit) -> ShapeKey:
    """Units with equal keys fit or fail together (in aggregate and on nodes).

    One flat tuple, hashed per unit: the demand's names and amounts, then
    per pod set its name, count, request names and amounts (fixed arity, so
    the parts cannot run into each other)."""
    key: ShapeKey = unit.demand.names_amounts()
    for ps in unit.pods:
        key = (*key, ps.name, ps.count, *ps.requests.names_amounts())
    return key


def sort_units(units: list[Unit], order: KeyFunc) -> None:
    """Sort in queue order with C-level keys (stable passes, least significant first)."""
    units.sort(key=_BY_CREATED)
    if order is priority_key:
        units.sort(key=_BY_PRIORITY, reverse=True)  # stable: keeps (created, key) order


class Shape:
    """The pending units of one queue that have the same demand, in queue order.

    Equal demands fit or fail together, so a queue's next unit is the earliest
    head among its shapes that fit; shapes found not to fit are *rejected*
    until the queue is re-examined (which growth of free capacity triggers).
    The engine keeps no per-unit record: `units[head:]` are exactly the
    shape's pending units (admission always takes the head; a removed unit is
    deleted from the list), sorted unless `unsorted`.
    """

    __slots__ = (
        "gap", "gapneed", "head", "key", "noroom", "pairs", "plannames", "podneed", "pods",
        "rejected", "rungen", "runs", "tail", "units", "unsorted", "ver",
    )

    key: ShapeKey  # its key in the queue's `shapes`
    pairs: Pairs
    units: list[Unit]
    head: int
    tail: OrderKey | None  # order key of the last unit appended (or later)
    unsorted: bool
    rejected: bool
    ver: int  # the valid entry of this shape in its queue's heap
    pods: tuple[PodSet, ...]  # of every unit in the shape
    runs: Runs  # node fit: (pod count, pairs of one pod), largest dominant share first
    # (the pod set of each run, every pod set): for Plan
    plannames: tuple[tuple[str, ...], tuple[str, ...]]
    rungen: int  # capacity generation `runs` were sorted for (-1: not yet)
    podneed: tuple[int, int] | None  # one run: its pod packed (placement.packed_pod); else None
    noroom: bool  # rejected because no node had room
    # When no room: how many pods it lacked then on its best node set (1 for
    # more runs), and for one run its pod times that many, packed as
    # `podneed`: a node that grew alone makes it fit only if it holds this.
    gap: int
    gapneed: tuple[int, int] | None

    def __init__(self, key: ShapeKey, pairs: Pairs, pods: tuple[PodSet, ...] = ()) -> None:
        self.key = key
        self.pairs = pairs
        self.pods = pods
        self.runs = ()
        self.plannames = ((), ())
        self.rungen = -1
        self.podneed = None
        self.noroom = False
        self.gap = 1
        self.gapneed = None
        self.units = []
        self.head = 0
        self.tail = None
        self.unsorted = False
        self.rejected = False
        self.ver = 0

    def first(self) -> Unit | None:
        return self.units[self.head] if self.head < len(self.units) else None

    def tidy(self, order: KeyFunc) -> None:
        """Drop the units before the head; sort the rest if needed."""
        units = self.units[self.head :]
        if self.unsorted:
            sort_units(units, order)
            self.unsorted = False
        self.units = units
        self.head = 0
        self.tail = order(units[-1]) if units else None

    def index(self, unit: Unit, order: KeyFunc) -> int:
        """Position of the pending `unit` in `units` (-1 if absent)."""
        units = self.units
        if not self.unsorted:
            at = bisect_left(units, order(unit), lo=self.head, key=order)
            if at < len(units) and units[at] is unit:
                return at
        for at in range(self.head, len(units)):
            if units[at] is unit:
                return at
        return -1


ShapeEntry = tuple[OrderKey, int, Shape]  # (order key of the shape's head, ver, shape)


class QueueState:
    __slots__ = (
        "alloc",
        "bare",
        "blocking",
        "cand",
        "capl",
        "credit",
        "cshape",
        "divl",
        "divs",
        "gapmin",
        "gapmins",
        "guar",
        "hasguar",
        "head",
        "inwait",
        "mins",
        "nadmitted",
        "name",
        "nodemins",
        "nodemixed",
        "nodeneed",
        "nodeshape",
        "noroom",
        "noroomflag",
        "nsets",
        "nsgen",
        "nwver",
        "optflag",
        "order",
        "policy",
        "shapes",
        "share",
        "sheap",
        "spec",
        "status",
        "thr",
        "version",
        "waitmark",
        "wversion",
    )

    name: str
    spec: QueueSpec | None
    policy: QueuePolicy
    order: KeyFunc  # order key of a unit inside this queue
    blocking: bool
    alloc: list[int]  # per resource index
    capl: list[int]  # capability per resource index, UNLIMITED when absent
    guar: list[int]  # guarantee per resource index
    hasguar: bool
    # Some shape requests nothing, so is within any guarantee (even none):
    # with lazy node fit the queue's key may then drop to flag 0 like one
    # with a guarantee (see `_push_cand`). Set when such a shape is made,
    # recomputed on re-examination.
    bare: bool
    divs: list[tuple[int, int]]  # (index, capacity * weight) for capacity > 0
    divl: list[int]  # capacity * weight per resource index, 0 where capacity is 0
    shapes: dict[ShapeKey, Shape]
    sheap: list[ShapeEntry]  # heads of the shapes not rejected (lazy deletion)
    cand: Unit | None  # the unit it offers now (fits)
    cshape: Shape | None  # ... and its shape
    head: Unit | None  # blocking: its head when that does not fit
    status: int
    version: int
    share: int  # exact weighted dominant share, scaled (see module doc)
    thr: dict[int, int]  # resource -> smallest demand of a rejected unit failing there
    mins: dict[int, int] | None  # element-wise min demand of rejected units
    optflag: int  # best under-guarantee flag among rejected units (2 = none)
    inwait: bool  # has a valid waiting-list entry
    wversion: int
    nadmitted: int
    nodemins: dict[int, int] | None  # element-wise min pod of shapes with no node room
    nodemixed: bool  # one of `noroom` has pods of more than one size
    nodeneed: tuple[int, int]  # `nodemins` packed (placement.packed_pod; (0, 0): None)
    gapmins: dict[int, int] | None  # element-wise min of their pods times `Shape.gap`
    gapmin: tuple[int, int]  # `gapmins` packed
    nodeshape: Shape | None  # blocking: the head's shape when no node has room for it
    noroom: list[Shape]  # its shapes no node had room for
    noroomflag: int  # best guarantee flag among them when rejected (2 = none)
    nsets: list[NodeSet]  # node sets of its pools, in preference order
    nsgen: int  # node generation `nsets` were built for (-1: not yet)
    nwver: int  # its valid entry in the engine's node-waiting list
    waitmark: int  # NodeIndex.grown_total when its shapes without room were all full
    # A node grown since that may hold some of its pods but too few for any
    # shape (see Shape.gapneed) and so did not wake it; -1: none.
    credit: int

    def __init__(self, name: str, nres: int) -> None:
        self.name = name
        self.spec = None
        self.policy = "Priority"
        self.order = priority_key
        self.blocking = False
        self.alloc = [0] * nres
        self.capl = [UNLIMITED] * nres
        self.guar = [0] * nres
        self.hasguar = False
        self.bare = False
        self.divs = []
        self.divl = [0] * nres
        self.shapes = {}
        self.sheap = []
        self.cand = None
        self.cshape = None
        self.head = None
        self.status = IDLE
        self.version = 0
        self.share = 0
        self.thr = {}
        self.mins = None
        self.optflag = 2
        self.inwait = False
        self.wversion = 0
        self.nadmitted = 0
        self.nodemins = None
        self.nodemixed = False
        self.nodeneed = (0, 0)
        self.gapmins = None
        self.gapmin = (0, 0)
        self.nodeshape = None
        self.noroom = []
        self.noroomflag = 2
        self.nsets = []
        self.nsgen = -1
        self.nwver = 0
        self.waitmark = 0
        self.credit = -1

    def units(self) -> list[Unit]:
        """Pending units in queue order."""
        units = [u for shape in self.shapes.values() for u in shape.units[shape.head :]]
        sort_units(units, self.order)
        return units


# (flag, share, name, 1, version, queue) and (optflag, share, name, 0, wversion,
# queue): a waiting entry sorts before a heap entry of the same queue and key.
Entry = tuple[int, int, str, int, int, QueueState]
CandEntry = tuple[int, int, QueueState]  # (-demand, version, queue)


def insert_sorted(entries: list[Entry], entry: Entry) -> int:
    """Put `entry` into the sorted waiting list `entries`; its position (the
    caller moves its cursor when that is before it)."""
    at = bisect_right(entries, entry)
    entries.insert(at, entry)
    return at


def compact_sorted(entries: list[Entry], cursor: int,
                   live: Callable[[Entry], bool]) -> tuple[list[Entry], int]:
    """A waiting list without its stale entries, and where its cursor lands
    (the live entries before it stay before it)."""
    kept = [e for e in entries[:cursor] if live(e)]
    at = len(kept)
    kept.extend(e for e in entries[cursor:] if live(e))
    return kept, at


# A node-fit answer: the node set, and per run the member index of each pod.
Fit = tuple[NodeSet, list[list[int]]]
