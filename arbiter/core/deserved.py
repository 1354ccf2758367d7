"""Deserved shares: continuous weighted DRF water-filling (DESIGN.md §4).

Pure: no I/O. Exact rational arithmetic; integers only at the very end.

Formulation. For queue q with total demand D (a resource vector), weight w,
guarantee G and capability K (absent resources unlimited):

* Its floor is G' = min(G, D, K) element-wise. If the floors of all queues
  together exceed the capacity C_r of some resource r, every queue's floor in
  r is scaled by C_r / sum(G'_r), so the floors always fit.
* d = max over r with C_r > 0 of D_r / C_r is the dominant share of its whole
  demand. At water level t it holds

      alloc(t) = max(G', D * min(1, w * t / d))        (element-wise)

  i.e. its demand vector scaled so that its dominant share is w * t, never
  below its floor. In resource r it is *growing* once D_r * w * t / d >= G'_r.
* Raising t from 0, a queue freezes (keeps alloc at that level for good) at
  the first of: it reaches its demand (w * t = d); it reaches its capability
  in some resource; a resource it is growing in is exhausted (the sum over
  all queues reaches C_r); or it would start growing in a resource that is
  already exhausted.
* A resource the cluster has none of (C_r = 0) takes no part: it is left
  out of every demand, floor and share, and deserves 0. So a unit naming
  one (it can never be admitted) does not freeze its queue's share of what
  the cluster has, and a tenant naming thousands of made-up resources costs
  the computation nothing.
* Every amount is floored to an integer (millicores, bytes, counts), so the
  result is <= demand, <= capability, and sums to <= capacity. The DRF
  paper's example comes out exactly: capacity 9 CPU / 18Gi, A tasks
  <1 CPU, 4Gi>, B tasks <3 CPU, 1Gi> -> A <3, 12Gi>, B <6, 2Gi>, both at
  dominant share 2/3.

Solving it. The level moves from event to event. A queue's own events (it
reaches its demand or capability, or crosses its floor in a resource) happen
at levels with small denominators and sit in a heap. Exhaustion levels are
where the exact sums get big (a common denominator over many queues), so
they are screened with floating-point estimates and computed exactly, by
balanced pairwise summation, only when one may come next: about once per
resource. Allocations of queues frozen together are kept as (speed, level)
pairs and floored with integer division.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Mapping
from dataclasses import replace
from fractions import Fraction

from arbiter.core.model import QueueSpec
from arbiter.core.resources import EMPTY, Resources

_DEMAND = 0
_CAP = 1
_CROSS = 2

_ZERO = Fraction(0)
_ONE = Fraction(1)

# Relative margin of the floating-point screen for exhaustion levels: far
# above the rounding error of the running float sums, far below anything that
# would make the screen useless.
_SCREEN = 1e-9


class _Filling:
    __slots__ = ("demand", "final", "floor", "rate", "speed")

    def __init__(self, demand: dict[str, int], floor: dict[str, Fraction]) -> None:
        self.demand = demand
        self.floor = floor
        self.rate = _ZERO  # w / d: the fraction of its demand held per unit of level
        self.speed: dict[str, Fraction] = {}  # D_r * rate
        # Final allocation per resource as a product a * b (floored at the end).
        self.final: dict[str, tuple[Fraction, Fraction]] = {r: (g, _ONE) for r, g in floor.items()}


def _sum(values: list[Fraction]) -> Fraction:
    """Exact sum, pairwise, so that big denominators meet as late as possible."""
    if not values:
        return _ZERO
    while len(values) > 1:
        paired = [values[i] + values[i + 1] for i in range(0, len(values) - 1, 2)]
        if len(values) % 2:
            paired.append(values[-1])
        values = paired
    return values[0]


def _floor_product(a: Fraction, b: Fraction) -> int:
    return (a.numerator * b.numerator) // (a.denominator * b.denominator)


def deserved(
    capacity: Resources,
    queues: Iterable[QueueSpec],
    demand: Mapping[str, Resources],
) -> dict[str, Resources]:
    """Deserved allocation of every queue in `queues` (see the module doc).

    `demand` maps a queue name to its total demand; queues missing from it
    demand nothing, names in it without a queue are ignored.
    """
    specs = {spec.name: spec for spec in queues}
    fills: dict[str, _Filling] = {}
    for name, spec in specs.items():
        wanted = {r: v for r, v in demand.get(name, EMPTY).items()
                  if v > 0 and capacity.get_amount(r) > 0}
        floor: dict[str, Fraction] = {}
        for r, v in wanted.items():
            g = min(v, spec.guarantee.get_amount(r))
            if r in spec.capability:
                g = min(g, spec.capability[r])
            floor[r] = Fraction(max(g, 0))
        fills[name] = _Filling(wanted, floor)

    # Over-subscribed guarantees: scale the floors down to the capacity.
    totals: dict[str, Fraction] = {}
    for fill in fills.values():
        for r, low in fill.floor.items():
            totals[r] = totals.get(r, _ZERO) + low
    for r, total in totals.items():
        cap = capacity.get_amount(r)
        if total > cap:
            factor = Fraction(max(cap, 0)) / total
            for fill in fills.values():
                if r in fill.floor:
                    fill.floor[r] *= factor
                    fill.final[r] = (fill.floor[r], _ONE)

    resources = set(capacity) | set(totals)
    growing: dict[str, set[str]] = {r: set() for r in resources}
    fixed: dict[str, list[Fraction]] = {r: [] for r in resources}  # frozen queues' amounts
    const_f: dict[str, float] = {r: float(totals.get(r, _ZERO)) for r in resources}
    slope_f: dict[str, float] = dict.fromkeys(resources, 0.0)
    events: list[tuple[Fraction, int, int, str, str]] = []
    active: set[str] = set()
    for name, fill in fills.items():
        dominant = max(
            (
                Fraction(v, capacity[r])
                for r, v in fill.demand.items()
                if capacity.get_amount(r) > 0
            ),
            default=_ZERO,
        )
        if dominant == 0:
            # Demands nothing, or only what the cluster has none of: floors only.
            for r, low in fill.floor.items():
                fixed[r].append(low)
            continue
        fill.rate = Fraction(specs[name].weight) / dominant
        active.add(name)
        events.append((1 / fill.rate, len(events), _DEMAND, name, ""))
        capability = specs[name].capability
        for r, v in fill.demand.items():
            speed = v * fill.rate
            fill.speed[r] = speed
            low = fill.floor[r]
            if low == 0:
                growing[r].add(name)
                slope_f[r] += float(speed)
            else:
                events.append((low / speed, len(events), _CROSS, name, r))
            if r in capability:
                events.append((capability[r] / speed, len(events), _CAP, name, r))
    heapq.heapify(events)
    exhausted: set[str] = set()

    def exhaustion_level(r: str) -> Fraction:
        """Exact level at which r runs out with the current set of growing queues."""
        members = growing[r]
        parts = list(fixed[r])
        parts.extend(fills[n].floor[r] for n in active if n not in members and r in fills[n].floor)
        slope = _sum([fills[n].speed[r] for n in members])
        return (capacity.get_amount(r) - _sum(parts)) / slope

    def freeze(names: Iterable[str], t: Fraction) -> None:
        """Freeze `names` at level t (a group frozen together shares one product)."""
        speeds: dict[str, list[Fraction]] = {}
        for name in names:
            if name not in active:
                continue
            active.discard(name)
            fill = fills[name]
            for r in fill.demand:
                members = growing[r]
                if name in members:
                    members.discard(name)
                    speed = fill.speed[r]
                    speeds.setdefault(r, []).append(speed)
                    fill.final[r] = (speed, t)
                else:
                    fixed[r].append(fill.floor[r])
        tf = float(t)
        for r, group in speeds.items():
            total = _sum(group)
            fixed[r].append(total * t)
            ft = float(total)
            slope_f[r] -= ft
            const_f[r] += ft * tf

    # Floors alone may use a resource up (all of it, or one the cluster lacks).
    level = _ZERO
    full = [
        r
        for r in sorted(resources)
        if _sum([f.floor.get(r, _ZERO) for f in fills.values()]) >= capacity.get_amount(r)
    ]
    exhausted.update(full)
    freeze(sorted({n for r in full for n in growing[r]}), level)

    while active:
        while events and events[0][3] not in active:
            heapq.heappop(events)
        upcoming: Fraction | None = events[0][0] if events else None
        horizon = float(upcoming) if upcoming is not None else float("inf")
        # Which resources might run out before the next queue event?
        candidates: dict[str, Fraction] = {}
        for r, members in growing.items():
            if not members or r in exhausted:
                continue
            slope = slope_f[r]
            if slope <= 0:  # float drift: recount it from its members
                slope = slope_f[r] = math.fsum(float(fills[n].speed[r]) for n in members)
            room = capacity.get_amount(r) - const_f[r]
            if slope > 0:
                guess = room / slope
                margin = _SCREEN * (abs(guess) + abs(capacity.get_amount(r) / slope) + 1.0)
                if guess > horizon + margin:
                    continue
            candidates[r] = exhaustion_level(r)
        nxt = upcoming
        for at in candidates.values():
            if nxt is None or at < nxt:
                nxt = at
        if nxt is None:  # cannot happen: every active queue has a demand event
            break
        level = max(level, nxt)
        while events and events[0][0] <= level:
            _, _, kind, name, r = heapq.heappop(events)
            if name not in active:
                continue
            if kind == _CROSS:
                if r in exhausted:
                    freeze([name], level)
                else:
                    fill = fills[name]
                    growing[r].add(name)
                    slope_f[r] += float(fill.speed[r])
                    const_f[r] -= float(fill.floor[r])
            else:
                freeze([name], level)
        out = sorted(r for r, at in candidates.items() if at <= level and r not in exhausted)
        exhausted.update(out)
        freeze(sorted({n for r in out for n in growing[r]}), level)

    return {
        name: Resources({r: _floor_product(a, b) for r, (a, b) in fills[name].final.items()})
        for name in specs
    }


def hierarchical_deserved(
    capacity: Resources,
    queues: Iterable[QueueSpec],
    demand: Mapping[str, Resources],
) -> dict[str, Resources]:
    """Deserved shares over a tree of queues (DESIGN §11), for every queue.

    Water-filling level by level: the top-level queues share the capacity by
    `deserved`, a parent standing in with its subtree's total demand and, as
    its guarantee, the larger of its own and its children's together (its
    capability caps the subtree). Each parent's deserved is then split among
    its children by the same rule, the parent's deserved as their capacity.
    A parent's result is its subtree's deserved. Queues whose chain of parents
    is broken (missing parent, cycle) deserve nothing: they are never admitted.
    """
    specs = {spec.name: spec for spec in queues}
    children: dict[str | None, list[QueueSpec]] = {}
    for spec in specs.values():
        children.setdefault(spec.parent, []).append(spec)
    out = dict.fromkeys(specs, EMPTY)

    def totals(spec: QueueSpec) -> tuple[Resources, Resources]:
        """(subtree demand, effective guarantee), also kept for the split.
        Reached from the top only, so no cycle is ever walked."""
        wanted = demand.get(spec.name, EMPTY)
        guarantee = EMPTY
        for child in children.get(spec.name, []):
            child_demand, child_guarantee = totals(child)
            wanted = wanted + child_demand
            guarantee = guarantee + child_guarantee
        subtree[spec.name] = (wanted, guarantee.maximum(spec.guarantee))
        return subtree[spec.name]

    subtree: dict[str, tuple[Resources, Resources]] = {}

    def split(level: list[QueueSpec], room: Resources) -> None:
        stand_ins = [replace(spec, guarantee=subtree[spec.name][1]) for spec in level]
        shares = deserved(room, stand_ins, {s.name: subtree[s.name][0] for s in level})
        for spec in level:
            out[spec.name] = shares[spec.name]
            below = children.get(spec.name)
            if below:
                split(below, shares[spec.name])

    top = children.get(None, [])
    for spec in top:
        totals(spec)
    split(top, capacity)
    return out
