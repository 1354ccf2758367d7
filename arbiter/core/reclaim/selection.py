"""Which admitted units reclaim (across queues) or preemption (inside a
queue) takes back for one waiting unit: the rules and the selection
(DESIGN.md §3 "Reclaim"; the stopping rule is the README's "Reclaim: the
exact stopping rule"). `arbiter.core.reclaim.flat.plan` serves several
units in one pass with them. Pure: no I/O, no clock.

Every comparison is exact: amounts are integers (millicores, bytes, counts)
and shares are compared by cross-multiplying. `share(q)` is q's weighted
dominant share, max over resources r with capacity of
allocated_q[r] / (capacity[r] * weight_q), as admission computes it.

**Who may reclaim.** A waiting unit w of queue T may take resources back
from other queues when w does not fit in the free capacity, T stays within
its capability with w admitted, some allowed victims exist (below), and T
has been starving for the grace period (the caller says which queues are
`due`; `Plan.starving` tells it which queues are starving now: those whose
unit does not fit, within the capability, while T is under its guarantee
with it or some queue that could lose is richer than T — whether or not
the victims are at hand right now).

**Who may lose: the move rule.** An admitted unit u of another queue V (V
`reclaimable`) may be taken for w when V stays at or above its guarantee
(allocated_V[r] - u[r] >= guarantee_V[r] on every resource u requests) and

* either T is *under guarantee* with w (allocated_T + w <= guarantee_T on
  every resource w requests, admission's test): guarantees come first,
  shares do not matter;
* or share(V without u) > share(T without w), strictly: V, even after the
  loss, is still richer than T is before its gain.

Several victims for one w: each is checked against its queue *after* the
victims taken from that queue before it, so a set S is allowed exactly when
every victim queue V satisfies the rule with all of S_V taken at once
(shares and amounts only fall as more is taken, so checking the last one
is checking them all, and dropping victims from an allowed set keeps it
allowed). T's share is the one before w, whatever the other victims.

Each such move raises the sorted vector of weighted shares (leximin) once
admission admits the unit it was made for (which `plan` sees to: below);
for same-shaped units the fixpoint is progressive filling's allocation
(ties aside). The README gives the argument and what it does not cover.

**Order.** Candidates are tried lowest queue priority first, then lowest unit
priority, then most recently admitted, then most recently created, then key.

**Selection** (the same for both kinds): walk the candidates in order; take a
candidate when it is allowed (given those taken so far) and useful (it
requests a resource in which w is still short); stop as soon as w fits in
free + freed. Then drop, last taken first, every victim the fit does not
need: no single victim of the result can be spared. If the walk ends before
w fits, nothing is taken (None): evicting would not let w run.

**Within a queue.** A queue with `within_queue == "LowerPriority"` lets a
waiting unit displace admitted units of the *same* queue with a strictly
lower priority, when it does not fit because the queue is at its capability
or the cluster is full. What w is short of is then, per resource, the larger
of the cluster shortfall (w - free) and the capability overshoot
(allocated + w - capability): each victim reduces both. Within-queue
preemption is used only when reclaim across queues cannot serve w at all
(at its capability, or no allowed victims); when reclaim could serve w but
T's grace has not passed, w waits for it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from arbiter.core.reclaim.rules import (
    capacity_of,
    cover_greedily,
    shortfall,
    stays_richer,
    under_guarantee,
    weighted_share,
    within_capability,
)
from arbiter.core.reclaim.tree import ReclaimTree
from arbiter.core.resources import EMPTY, Resources

__all__ = [
    "Admitted", "ReclaimQueue", "Room", "Victim", "Waiting", "floor_of", "may_reclaim",
    "select_reclaim", "select_within_queue", "victim_order",
]

WithinQueue = Literal["Never", "LowerPriority"]
Reason = Literal["reclaim", "withinQueue"]


@dataclass(frozen=True, slots=True)
class ReclaimQueue:
    """A queue as reclaim sees it: its spec (plus its deserved share, which
    the move rule does not use any more; messages and status may)."""

    name: str
    weight: int = 1
    guarantee: Resources = EMPTY
    capability: Resources = EMPTY  # resources absent are unlimited
    deserved: Resources = EMPTY
    priority: int = 0
    reclaimable: bool = True
    within_queue: WithinQueue = "Never"
    # Its place in a tree of queues (DESIGN §11; `arbiter.core.reclaim.tree`).
    parent: str | None = None
    child_order: str = "Fair"


# Two types, not one with a flag, so a waiting unit can never be passed where
# a victim is expected.
@dataclass(frozen=True, slots=True)
class Admitted:
    """An admitted unit (holds capacity); `admitted` is when, `created` its submission."""

    key: str
    queue: str
    demand: Resources
    priority: int = 0
    admitted: float = 0.0
    created: float = 0.0


@dataclass(frozen=True, slots=True)
class Waiting:
    """A waiting unit, as its queue offers it."""

    key: str
    queue: str
    demand: Resources
    priority: int = 0


@dataclass(frozen=True, slots=True)
class Victim:
    unit: Admitted
    reason: Reason
    for_unit: str  # key of the waiting unit it makes room for
    for_queue: str
    # Taken because for_queue was under its guarantee (shares not compared).
    guarantee: bool = False


class Room(Protocol):
    """Node fit for a pass (DESIGN §10; `arbiter.core.reclaim.room`): whether
    a waiting unit's pods fit on nodes it may use once `victims` are gone,
    with what the pass did so far; `serve` books it so; `cover` is
    `cover_greedily` for the unit with node fit."""

    def fits(self, unit: Waiting, victims: Sequence[Admitted] = ()) -> bool: ...

    def usable(self, unit: Waiting, victim: Admitted) -> bool: ...

    def serve(self, unit: Waiting, victims: Sequence[Admitted]) -> None: ...

    def cover(self, unit: Waiting, need: dict[str, int], candidates: Iterable[Admitted],
              allowed: Callable[[Admitted], bool], take: Callable[[Admitted], None],
              reset: Callable[[], None]) -> list[Admitted] | None: ...


# -- the rules ---------------------------------------------------------------------


def floor_of(queue: ReclaimQueue) -> Resources:
    """What reclaim never takes a queue below: its guarantee (the move rule
    keeps it above its taker's share as well, see the module doc)."""
    return queue.guarantee


def may_reclaim(queue: ReclaimQueue, allocated: Mapping[str, int], unit: Waiting,
                free: Mapping[str, int]) -> bool:
    """Whether reclaim could be needed for `unit` at all: it does not fit and
    is within its queue's capability (whether victims exist is `select_reclaim`'s)."""
    return (not unit.demand.fits_in(free)
            and within_capability(allocated, unit.demand, queue.capability))


VictimKey = tuple[int, int, float, float, str]


def victim_order(queues: Mapping[str, ReclaimQueue]) -> Callable[[Admitted], VictimKey]:
    """Sort key: lowest queue priority, lowest priority, newest admitted, newest created.

    (Times are negated; the key breaks the last ties, ascending.)
    """

    def key(unit: Admitted) -> VictimKey:
        spec = queues.get(unit.queue)
        return (spec.priority if spec is not None else 0, unit.priority,
                -unit.admitted, -unit.created, unit.key)

    return key


# -- selection -----------------------------------------------------------------------


def select_reclaim(
    unit: Waiting,
    free: Mapping[str, int],
    queues: Mapping[str, ReclaimQueue],
    allocated: Mapping[str, Mapping[str, int]],
    candidates: Iterable[Admitted],
    *,
    ordered: bool = False,
    capacity: Mapping[str, int] | None = None,
    held: Mapping[str, int] | None = None,
    tree: ReclaimTree | None = None,
    over: Mapping[str, int] | None = None,
    room: Room | None = None,
) -> list[Admitted] | None:
    """Victims in other reclaimable queues that let `unit` fit under the move
    rule; [] when it fits already, None when no allowed set would do. With
    `tree`, the rule is judged where taker and victim meet, on subtree
    totals; `over`: how far the unit takes its parents over capability
    (victims come from the capped subtree); `room`: its pods must fit on
    nodes too. `allocated`: what each queue holds; `held`: what `unit`'s
    queue holds (default: its `allocated`); `capacity` (default: free +
    all allocated): what shares are of. `candidates` are sorted here unless
    `ordered`. The caller checks `may_reclaim` and capability."""
    need = shortfall(unit.demand, free)
    for r, v in (over or {}).items():
        need[r] = max(need.get(r, 0), v)
    if not need and (room is None or room.fits(unit)):
        return []
    taker = queues.get(unit.queue)
    if held is None:
        held = allocated.get(unit.queue, EMPTY)
    shares_of = capacity if capacity is not None else capacity_of(free, allocated)
    guaranteed = taker is not None and under_guarantee(held, unit.demand, taker.guarantee)
    bar = weighted_share(held, shares_of, taker.weight if taker is not None else 1)
    pool = candidates if ordered else sorted(candidates, key=victim_order(queues))
    remaining: dict[str, dict[str, int]] = {}
    # Verdicts by (queue, demand) without a tree: valid until that queue loses a unit.
    known: dict[tuple[str, Resources], bool] = {}

    def allowed(victim: Admitted) -> bool:
        if tree is not None:
            return rule(victim)
        shape = (victim.queue, victim.demand)
        found = known.get(shape)
        if found is None:
            found = known[shape] = rule(victim)
        return found

    def rule(victim: Admitted) -> bool:
        spec = queues.get(victim.queue)
        if spec is None or not spec.reclaimable or victim.queue == unit.queue:
            return False
        if tree is not None:
            return tree.allows(unit.queue, unit.demand, victim.queue, victim.demand, remaining)
        left = remaining.get(victim.queue)
        if left is None:
            left = remaining[victim.queue] = dict(allocated.get(victim.queue, EMPTY))
        low = spec.guarantee
        if not all(left.get(r, 0) - v >= low.get_amount(r)
                   for r, v in victim.demand.items() if v > 0):
            return False
        if guaranteed:
            return True
        after = dict(left)
        for r, v in victim.demand.items():
            after[r] = after.get(r, 0) - v
        return stays_richer(after, shares_of, spec.weight, bar)

    def take(victim: Admitted) -> None:
        for name in tree.paths[victim.queue] if tree is not None else (victim.queue,):
            left = remaining[name]
            for r, v in victim.demand.items():
                left[r] = left.get(r, 0) - v
        for shape in [s for s in known if s[0] == victim.queue]:
            del known[shape]

    def reset() -> None:
        remaining.clear()
        known.clear()

    if room is None:
        return cover_greedily(need, pool, allowed, take)
    return room.cover(unit, need, pool, allowed, take, reset)


def select_within_queue(
    unit: Waiting,
    free: Mapping[str, int],
    queue: ReclaimQueue,
    allocated: Mapping[str, int],
    candidates: Iterable[Admitted],
    *,
    ordered: bool = False,
    room: Room | None = None,
) -> list[Admitted] | None:
    """Admitted units of `unit`'s own queue with a strictly lower priority whose
    removal lets it fit (in the cluster, on nodes with `room`, within the
    queue's capability); [] when it fits already, None when they would not do."""
    need = shortfall(unit.demand, free)
    for r, v in unit.demand.items():
        if v > 0 and r in queue.capability:
            over = allocated.get(r, 0) + v - queue.capability[r]
            if over > need.get(r, 0):
                need[r] = over
    if not need and (room is None or room.fits(unit)):
        return []
    if queue.within_queue != "LowerPriority":
        return None
    mine = (c for c in candidates if c.queue == unit.queue and c.priority < unit.priority)
    pool = mine if ordered else sorted(mine, key=victim_order({queue.name: queue}))
    if room is None:
        return cover_greedily(need, pool, lambda _: True, lambda _: None)
    return room.cover(unit, need, pool, lambda _: True, lambda _: None, lambda: None)
