"""The first, plain implementation of deserved(): exact Fractions at every event.

Slow when many queues have distinct demands (denominators grow), but short and
direct: the tests hold arbiter.core.deserved to it on random cases.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Mapping
from fractions import Fraction
from typing import TYPE_CHECKING

from arbiter.core.resources import EMPTY, Resources

if TYPE_CHECKING:
    from arbiter.core.model import QueueSpec

_DEMAND = 0
_CAP = 1
_CROSS = 2


class _Filling:
    __slots__ = ("demand", "floor", "rate", "result")

    def __init__(self, demand: dict[str, int], floor: dict[str, Fraction]) -> None:
        self.demand = demand
        self.floor = floor
        self.rate = Fraction(0)  # w / d: the fraction of its demand held per unit of t
        self.result: dict[str, Fraction] = dict(floor)


def deserved_reference(
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
        # A resource the cluster has none of takes no part in shares.
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
            totals[r] = totals.get(r, Fraction(0)) + low
    for r, total in totals.items():
        cap = capacity.get_amount(r)
        if total > cap:
            factor = Fraction(max(cap, 0)) / total
            for fill in fills.values():
                if r in fill.floor:
                    fill.floor[r] *= factor
                    fill.result[r] = fill.floor[r]

    # Resource totals as const_r + slope_r * t; queues still rising.
    const: dict[str, Fraction] = {r: Fraction(0) for r in capacity}
    slope: dict[str, Fraction] = {r: Fraction(0) for r in capacity}
    growing: dict[str, set[str]] = {}
    events: list[tuple[Fraction, int, int, str, str]] = []
    active: set[str] = set()
    for name, fill in fills.items():
        for r, low in fill.floor.items():
            const[r] = const.get(r, Fraction(0)) + low
            slope.setdefault(r, Fraction(0))
        dominant = max(
            (
                Fraction(v, capacity[r])
                for r, v in fill.demand.items()
                if capacity.get_amount(r) > 0
            ),
            default=Fraction(0),
        )
        if dominant == 0:
            continue  # demands nothing, or only what the cluster has none of
        fill.rate = Fraction(specs[name].weight) / dominant
        active.add(name)
        seq = len(events)
        events.append((1 / fill.rate, seq, _DEMAND, name, ""))
        capability = specs[name].capability
        for r, v in fill.demand.items():
            speed = v * fill.rate
            low = fill.floor[r]
            if low == 0:
                growing.setdefault(r, set()).add(name)
                slope[r] += speed
            else:
                events.append((low / speed, len(events), _CROSS, name, r))
            if r in capability:
                events.append((capability[r] / speed, len(events), _CAP, name, r))
    heapq.heapify(events)

    exhausted: set[str] = set()

    def freeze(name: str, t: Fraction) -> None:
        active.discard(name)
        fill = fills[name]
        for r, v in fill.demand.items():
            members = growing.get(r)
            if members is not None and name in members:
                members.discard(name)
                speed = v * fill.rate
                slope[r] -= speed
                held = speed * t
                const[r] += held
                fill.result[r] = held
            else:
                fill.result[r] = fill.floor[r]

    def exhaust(t: Fraction) -> None:
        for r in list(slope):
            if r in exhausted:
                continue
            if const[r] + slope[r] * t >= capacity.get_amount(r):
                exhausted.add(r)
                for name in sorted(growing.get(r, ())):
                    freeze(name, t)

    t = Fraction(0)
    exhaust(t)
    while active:
        while events and events[0][3] not in active:
            heapq.heappop(events)
        nxt: Fraction | None = events[0][0] if events else None
        for r, s in slope.items():
            if s > 0 and r not in exhausted:
                at = (capacity.get_amount(r) - const[r]) / s
                if nxt is None or at < nxt:
                    nxt = at
        if nxt is None:  # cannot happen: every active queue has a demand event
            break
        t = nxt
        while events and events[0][0] <= t:
            _, _, kind, name, r = heapq.heappop(events)
            if name not in active:
                continue
            if kind == _CROSS:
                if r in exhausted:
                    freeze(name, t)
                else:
                    fill = fills[name]
                    const[r] -= fill.floor[r]
                    slope[r] += fill.demand[r] * fill.rate
                    growing.setdefault(r, set()).add(name)
            else:
                freeze(name, t)
        exhaust(t)

    return {
        name: Resources({r: math.floor(v) for r, v in fills[name].result.items()}) for name in specs
    }
