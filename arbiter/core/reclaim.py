"""Reclaim across queues and preemption inside a queue: which admitted units
to take back, and for whom (DESIGN.md §3 "Reclaim"). Pure: no I/O, no clock.

Every comparison is exact and per resource (integers: millicores, bytes,
counts). For a queue p, `floor(p)` = max(deserved_p, guarantee_p) element-wise,
where `deserved` is the continuous weighted-DRF share (`deserved()`, DESIGN §4)
computed from every queue's demand (admitted + waiting).

**Who may reclaim.** A waiting unit u of queue q may take resources back from
other queues when

* u does not fit in the free capacity (the cluster is full *for u*);
* u is within q's capability (else reclaim could not help it);
* q stays within its deserved share with u admitted: for every resource r
  that u requests, allocated_q[r] + u[r] <= deserved_q[r] ("q is below its
  deserved share by at least u");
* q has been starving for the grace period (the caller says which queues are
  `due`; `Plan.starving` tells it which queues are starving now).

**Who may lose.** A victim is an admitted unit of another queue p that is
`reclaimable`. A set S of victims may be taken from p only if, for every
resource r requested by some unit of S in p,

    allocated_p[r] - S_p[r] >= floor_p[r]

i.e. p stays at or above both its deserved share and its guarantee in every
resource the victims give back. Resources no victim requests are untouched
by the reclaim, so they do not matter ("above deserved" is per resource, not
by dominant share). Since q stops at its deserved share and p at its own,
nothing reclaimed can be reclaimed back: no ping-pong.

**Order.** Candidates are tried lowest queue priority first, then lowest unit
priority, then most recently admitted, then most recently created, then key.

**Selection** (the same for both kinds): walk the candidates in order; take a
candidate when it is allowed (given those taken so far) and useful (it
requests a resource in which u is still short); stop as soon as u fits in
free + freed. Then drop, last taken first, every victim the fit does not
need: no single victim of the result can be spared. If the walk ends before
u fits, nothing is taken (None): evicting would not let u run.

**Within a queue.** A queue with `within_queue == "LowerPriority"` lets a
waiting unit displace admitted units of the *same* queue with a strictly
lower priority, when it does not fit because the queue is at its capability
or the cluster is full. What u is short of is then, per resource, the larger
of the cluster shortfall (u - free) and the capability overshoot
(allocated + u - capability): each victim reduces both. Within-queue
preemption is used only when reclaim across queues cannot serve u at all
(q not below its deserved share, at its capability, or no victims); when
reclaim could serve u but q's grace has not passed, u waits for it.

**Plan.** `plan` serves several waiting units in one pass, the way admission
would: repeatedly, the queue with the lowest weighted dominant share (then
name) offers its next waiting unit; a unit that fits in the projected free
capacity is counted as admitted without victims (capacity already being freed
goes to the queues that wait for it), otherwise victims are chosen as above
and the projected state updated (floors are checked against what the
victim queue's *admitted* units hold: a unit of it served in this pass never
turns its running units into surplus). A queue whose unit cannot be served
offers nothing more in this pass. The pass stops before it would exceed
`max_victims` victims (a single unit that needs more is still served).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Mapping, Sequence, Set
from dataclasses import dataclass
from fractions import Fraction
from typing import Literal

from arbiter.core.fairshare import dominant_share_of
from arbiter.core.resources import EMPTY, Resources

__all__ = [
    "Admitted",
    "Plan",
    "ReclaimQueue",
    "Victim",
    "Waiting",
    "floor_of",
    "may_reclaim",
    "plan",
    "select_reclaim",
    "select_within_queue",
    "victim_order",
    "within_capability",
    "within_deserved",
]

WithinQueue = Literal["Never", "LowerPriority"]
Reason = Literal["reclaim", "withinQueue"]


@dataclass(frozen=True, slots=True)
class ReclaimQueue:
    """A queue as reclaim sees it: its spec plus its deserved share."""

    name: str
    weight: int = 1
    guarantee: Resources = EMPTY
    capability: Resources = EMPTY  # resources absent are unlimited
    deserved: Resources = EMPTY
    priority: int = 0
    reclaimable: bool = True
    within_queue: WithinQueue = "Never"


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


@dataclass(frozen=True, slots=True)
class Plan:
    victims: tuple[Victim, ...] = ()
    # Waiting units the pass made room for (with or without victims), in order.
    served: tuple[str, ...] = ()
    # Queues whose unit could be served only by reclaim (due or not): they
    # are starving now; the caller measures the grace period from this.
    starving: frozenset[str] = frozenset()
    # Queues that could reclaim now but whose grace has not passed.
    waiting_for_grace: frozenset[str] = frozenset()


# -- the rules ---------------------------------------------------------------------


def within_deserved(allocated: Mapping[str, int], demand: Mapping[str, int],
                    deserved: Mapping[str, int]) -> bool:
    """allocated + demand <= deserved on every resource `demand` requests."""
    return all(allocated.get(r, 0) + v <= deserved.get(r, 0) for r, v in demand.items() if v > 0)


def within_capability(allocated: Mapping[str, int], demand: Mapping[str, int],
                      capability: Mapping[str, int]) -> bool:
    """allocated + demand <= capability on every requested, capped resource."""
    return all(allocated.get(r, 0) + v <= capability[r]
               for r, v in demand.items() if v > 0 and r in capability)


def floor_of(queue: ReclaimQueue) -> Resources:
    """What reclaim never takes a queue below: max(deserved, guarantee)."""
    return queue.deserved.maximum(queue.guarantee)


def may_reclaim(queue: ReclaimQueue, allocated: Mapping[str, int], unit: Waiting,
                free: Mapping[str, int]) -> bool:
    """Whether `unit` is a reason to reclaim for its queue (grace aside)."""
    return (not unit.demand.fits_in(free)
            and within_capability(allocated, unit.demand, queue.capability)
            and within_deserved(allocated, unit.demand, queue.deserved))


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


def _shortfall(demand: Mapping[str, int], free: Mapping[str, int]) -> dict[str, int]:
    return {r: v - free.get(r, 0) for r, v in demand.items() if v > free.get(r, 0)}


def _greedy(
    need: dict[str, int],
    ordered: Iterable[Admitted],
    allowed: Callable[[Admitted], bool],
    take: Callable[[Admitted], None],
) -> list[Admitted] | None:
    """Take candidates in order (allowed and useful) until `need` is covered,
    then drop every one the cover does not need (last taken first)."""
    if not need:
        return []
    short = dict(need)
    taken: list[Admitted] = []
    for unit in ordered:
        demand = unit.demand
        if not any(demand.get_amount(r) > 0 for r in short):
            continue  # frees nothing the unit is short of
        if not allowed(unit):
            continue
        take(unit)
        taken.append(unit)
        for r in list(short):
            left = short[r] - demand.get_amount(r)
            if left > 0:
                short[r] = left
            else:
                del short[r]
        if not short:
            break
    if short:
        return None
    surplus = {r: -v for r, v in need.items()}
    for unit in taken:
        for r in surplus:
            surplus[r] += unit.demand.get_amount(r)
    kept: list[Admitted] = []
    for unit in reversed(taken):
        if all(unit.demand.get_amount(r) <= surplus[r] for r in surplus):
            for r in surplus:
                surplus[r] -= unit.demand.get_amount(r)
        else:
            kept.append(unit)
    kept.reverse()
    return kept


def select_reclaim(
    unit: Waiting,
    free: Mapping[str, int],
    queues: Mapping[str, ReclaimQueue],
    allocated: Mapping[str, Mapping[str, int]],
    candidates: Iterable[Admitted],
    *,
    ordered: bool = False,
) -> list[Admitted] | None:
    """Victims in other reclaimable queues that let `unit` fit; [] when it
    fits already, None when no allowed set would do. `candidates` are sorted
    here unless `ordered` says they are in `victim_order` already. The
    caller checks that `unit`'s queue may reclaim (`may_reclaim`)."""
    need = _shortfall(unit.demand, free)
    if not need:
        return []
    pool = candidates if ordered else sorted(candidates, key=victim_order(queues))
    remaining: dict[str, dict[str, int]] = {}
    floors: dict[str, Resources] = {}

    def allowed(victim: Admitted) -> bool:
        spec = queues.get(victim.queue)
        if spec is None or not spec.reclaimable or victim.queue == unit.queue:
            return False
        left = remaining.get(victim.queue)
        if left is None:
            left = remaining[victim.queue] = dict(allocated.get(victim.queue, EMPTY))
            floors[victim.queue] = floor_of(spec)
        low = floors[victim.queue]
        return all(left.get(r, 0) - v >= low.get_amount(r)
                   for r, v in victim.demand.items() if v > 0)

    def take(victim: Admitted) -> None:
        left = remaining[victim.queue]
        for r, v in victim.demand.items():
            left[r] = left.get(r, 0) - v

    return _greedy(need, pool, allowed, take)


def select_within_queue(
    unit: Waiting,
    free: Mapping[str, int],
    queue: ReclaimQueue,
    allocated: Mapping[str, int],
    candidates: Iterable[Admitted],
    *,
    ordered: bool = False,
) -> list[Admitted] | None:
    """Admitted units of `unit`'s own queue with a strictly lower priority
    whose removal lets it fit (in the cluster and within the queue's
    capability); [] when it fits already, None when they would not do."""
    need = _shortfall(unit.demand, free)
    for r, v in unit.demand.items():
        if v > 0 and r in queue.capability:
            over = allocated.get(r, 0) + v - queue.capability[r]
            if over > need.get(r, 0):
                need[r] = over
    if not need:
        return []
    if queue.within_queue != "LowerPriority":
        return None
    mine = (c for c in candidates if c.queue == unit.queue and c.priority < unit.priority)
    pool = mine if ordered else sorted(mine, key=victim_order({queue.name: queue}))
    return _greedy(need, pool, lambda _: True, lambda _: None)


# -- the pass --------------------------------------------------------------------------


def plan(
    capacity: Resources,
    queues: Mapping[str, ReclaimQueue],
    admitted: Sequence[Admitted],
    waiting: Mapping[str, Sequence[Waiting]],
    *,
    due: Set[str],
    protected: Set[str] = frozenset(),
    allocated: Mapping[str, Mapping[str, int]] | None = None,
    ordered: bool = False,
    max_victims: int = 100,
    max_steps: int = 10_000,
) -> Plan:
    """Victims for the waiting units (see the module doc).

    `admitted`: every unit holding capacity (capacity being freed already
    left out) — or, when `allocated` gives what each queue holds, only the
    units that may be taken (in `victim_order` when `ordered`); `waiting`:
    each queue's waiting units in queue order (a prefix is enough); `due`:
    queues whose grace has passed; `protected`: keys never to pick (a write
    in flight, an eviction blocked lately).
    """
    # What the queues' admitted units hold (victims taken off): the floors
    # are checked against this. `projected` adds the units this pass has
    # served: shares, capabilities and the reclaimer's deserved share use it
    # (a unit about to be admitted must not make its queue's running units
    # look like surplus).
    held_by: dict[str, dict[str, int]] = {}
    free = dict(capacity)
    if allocated is None:
        for running in admitted:
            held = held_by.setdefault(running.queue, {})
            for r, v in running.demand.items():
                held[r] = held.get(r, 0) + v
    else:
        held_by = {name: dict(amounts) for name, amounts in allocated.items()}
    for amounts in held_by.values():
        for r, v in amounts.items():
            free[r] = free.get(r, 0) - v
    projected = {name: dict(amounts) for name, amounts in held_by.items()}
    chosen_from = (u for u in admitted if u.key not in protected and u.queue in queues)
    pool = list(chosen_from) if ordered else sorted(chosen_from, key=victim_order(queues))
    gone: set[str] = set()

    def candidates() -> Iterable[Admitted]:
        return (u for u in pool if u.key not in gone)

    cursor = {name: 0 for name in waiting if name in queues and waiting[name]}
    version = dict.fromkeys(cursor, 0)
    heap: list[tuple[Fraction, str, int]] = []

    def push(name: str) -> None:
        spec = queues[name]
        version[name] += 1
        share = dominant_share_of(projected.get(name, {}), capacity) / spec.weight
        heapq.heappush(heap, (share, name, version[name]))

    for name in cursor:
        push(name)
    victims: list[Victim] = []
    served: list[str] = []
    starving: set[str] = set()
    waiting_for_grace: set[str] = set()
    steps = 0
    while heap and len(victims) < max_victims and steps < max_steps:
        steps += 1
        _, name, ver = heapq.heappop(heap)
        if ver != version[name]:
            continue
        units = waiting[name]
        index = cursor[name]
        if index >= len(units):
            continue
        unit = units[index]
        spec = queues[name]
        held = projected.setdefault(name, {})
        chosen: list[Admitted] | None
        reason: Reason = "reclaim"
        if unit.demand.fits_in(free) and within_capability(held, unit.demand, spec.capability):
            chosen = []
        else:
            chosen = None
            if may_reclaim(spec, held, unit, free):
                starving.add(name)
                found = select_reclaim(unit, free, queues, held_by, candidates(), ordered=True)
                if found is not None and name not in due:
                    waiting_for_grace.add(name)
                    continue  # wait for the grace period: the queue offers nothing more
                chosen = found
            if chosen is None and spec.within_queue == "LowerPriority":
                chosen = select_within_queue(unit, free, spec, held, candidates(), ordered=True)
                reason = "withinQueue"
            if chosen is None:
                continue  # cannot be served now: the queue offers nothing more
            if victims and len(victims) + len(chosen) > max_victims:
                break  # the next pass serves it
        touched = {name}
        for victim in chosen:
            gone.add(victim.key)
            victims.append(Victim(victim, reason, unit.key, name))
            source = held_by.setdefault(victim.queue, {})
            ahead = projected.setdefault(victim.queue, {})
            for r, v in victim.demand.items():
                source[r] = source.get(r, 0) - v
                ahead[r] = ahead.get(r, 0) - v
                free[r] = free.get(r, 0) + v
            touched.add(victim.queue)
        for r, v in unit.demand.items():
            held[r] = held.get(r, 0) + v
            free[r] = free.get(r, 0) - v
        served.append(unit.key)
        cursor[name] = index + 1
        for other in touched:
            if other in cursor:
                push(other)
    return Plan(tuple(victims), tuple(served), frozenset(starving), frozenset(waiting_for_grace))
