"""The move rule's building blocks (`arbiter.core.reclaim.flat`), exact: amounts
are integers, shares compared by cross-multiplying, and the pass's book of
queues in their grace. Pure: no I/O. Apart so that the tree's rule
(`arbiter.core.reclaim.tree`) uses the same ones."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Protocol, TypeVar

from arbiter.core.engine.flat import dominant_share_of
from arbiter.core.resources import EMPTY, Resources

__all__ = ["GraceWaiters", "RuleQueue", "cover_greedily", "may_gain", "richest_share", "shortfall",
           "stays_richer", "under_guarantee", "weighted_share", "within_capability"]

class RuleQueue(Protocol):
    """What of a queue `richest_share` and `may_gain` read (`ReclaimQueue`)."""

    @property
    def weight(self) -> int: ...
    @property
    def guarantee(self) -> Resources: ...
    @property
    def reclaimable(self) -> bool: ...


# A queue's place in admission's order: the shares on its path, top down, with names.
Order = tuple[tuple[Fraction, str], ...]


def under_guarantee(allocated: Mapping[str, int], demand: Mapping[str, int],
                    guarantee: Mapping[str, int]) -> bool:
    """allocated + demand <= guarantee on every resource `demand` requests
    (admission's "under guarantee"; a unit requesting nothing is not)."""
    requested = [(r, v) for r, v in demand.items() if v > 0]
    return bool(requested) and all(allocated.get(r, 0) + v <= guarantee.get(r, 0)
                                   for r, v in requested)


def weighted_share(allocated: Mapping[str, int], capacity: Mapping[str, int],
                   weight: int) -> Fraction:
    """Weighted dominant share: max over r of allocated[r] / (capacity[r] * weight)."""
    return dominant_share_of(allocated, capacity) / weight


def stays_richer(left: Mapping[str, int], capacity: Mapping[str, int], weight: int,
                 share: Fraction) -> bool:
    """weighted_share(left) > share, exactly: some resource r with capacity has
    left[r] * share.den > share.num * capacity[r] * weight."""
    num, den = share.numerator, share.denominator
    return any(v * den > num * capacity.get(r, 0) * weight
               for r, v in left.items() if v > 0 and capacity.get(r, 0) > 0)


def within_capability(allocated: Mapping[str, int], demand: Mapping[str, int],
                      capability: Mapping[str, int]) -> bool:
    """allocated + demand <= capability on every requested, capped resource."""
    return all(allocated.get(r, 0) + v <= capability[r]
               for r, v in demand.items() if v > 0 and r in capability)


def richest_share(queues: Mapping[str, RuleQueue],
                  allocated: Callable[[str], Mapping[str, int]],
                  capacity: Mapping[str, int]) -> Fraction:
    """The largest weighted share among the queues that could lose a unit
    (reclaimable, above their guarantee in some resource); 0 when none."""
    best = Fraction(0)
    for name, spec in queues.items():
        held = allocated(name)
        if spec.reclaimable and any(v > spec.guarantee.get_amount(r) for r, v in held.items()):
            best = max(best, weighted_share(held, capacity, spec.weight))
    return best


def may_gain(queue: RuleQueue, allocated: Mapping[str, int], demand: Mapping[str, int],
             capacity: Mapping[str, int], richest: Fraction) -> bool:
    """A cheap necessary condition for the move rule to find victims for a
    unit of `queue`: it is under its guarantee, or some queue that could
    lose is richer than it (`richest`, from `richest_share`)."""
    return (under_guarantee(allocated, demand, queue.guarantee)
            or weighted_share(allocated, capacity, queue.weight) < richest)


@dataclass(slots=True)
class GraceWaiters:
    """Queues that could reclaim in a pass but wait for their grace: the unit
    each offered, its place in admission's order then, and the room
    admission would give it (free then, plus every victim taken since for a
    queue after it).

    Admission serves lowest share first: once that room fits a waiter's
    unit, admission hands the room to the waiter, not to the later unit it
    was freed for, and that queue stops short (the pass that freed room only
    for the middle queue of a 3:2:1 flood ended at 19/9/4, and needed a pass
    per such leak). So the waiter counts as due for the rest of the pass
    and reclaims for itself, by its own move rule; the later queue takes
    what it is owed on top. (In a tree a pass ends with the first unit
    served by victims, and admission's order is H-DRF's: it never acts.)"""

    waiting: dict[str, tuple[Order, Resources, Resources]] = field(default_factory=dict)
    early: set[str] = field(default_factory=set)  # waiters due for the rest of the pass

    def park(self, name: str, order: Order, demand: Resources,
             free: Mapping[str, int]) -> None:
        self.waiting[name] = (order, demand, Resources(free))

    def freed(self, order: Order, victims: Resources) -> list[str]:
        """`victims` were taken for a queue at `order`: the waiters before it
        whose unit the room freed now fits: due from now on (`early`)."""
        joined: list[str] = []
        for name, (offered, demand, room) in list(self.waiting.items()):
            if offered > order:
                continue  # after it (a victim's share fell): not its room
            room = room + victims
            self.waiting[name] = (offered, demand, room)
            if demand.fits_in(room):
                del self.waiting[name]
                self.early.add(name)
                joined.append(name)
        return joined


class HasDemand(Protocol):
    @property
    def demand(self) -> Resources: ...


Victim = TypeVar("Victim", bound=HasDemand)


def capacity_of(free: Mapping[str, int],
                 allocated: Mapping[str, Mapping[str, int]]) -> dict[str, int]:
    """What is free plus what every queue holds."""
    total = dict(free)
    for amounts in allocated.values():
        for r, v in amounts.items():
            total[r] = total.get(r, 0) + v
    return total


def shortfall(demand: Mapping[str, int], free: Mapping[str, int]) -> dict[str, int]:
    return {r: v - free.get(r, 0) for r, v in demand.items() if v > free.get(r, 0)}


def cover_greedily(
    need: dict[str, int],
    ordered: Iterable[Victim],
    allowed: Callable[[Victim], bool],
    take: Callable[[Victim], None],
    placed: Callable[[list[Victim]], bool] | None = None,
    wanted: Mapping[str, int] = EMPTY,
    extra: int = 32,
) -> list[Victim] | None:
    """Take candidates in order (allowed and useful) until `need` is covered,
    then drop every one the cover does not need (last taken first).

    With `placed` (node fit, DESIGN §10): covered also means `placed(taken)`,
    the waiting unit's pods then fit on nodes it may use; once `need` is met a
    candidate is useful when it frees a resource of `wanted` (the caller
    passes only candidates on those nodes), at most `extra` of them, and one
    is dropped only when the rest still place the unit."""
    if not need and (placed is None or placed([])):
        return []
    short = dict(need)
    taken: list[Victim] = []
    done = False
    for unit in ordered:
        demand = unit.demand
        looked_for = short or wanted
        if not any(demand.get_amount(r) > 0 and looked_for.get(r, 0) > 0 for r in looked_for):
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
            if placed is None or placed(taken):
                done = True
                break
            extra -= 1
            if extra < 0:
                break  # not on these nodes: the caller may look node by node
    if not done:
        return None
    surplus = {r: -v for r, v in need.items()}
    for unit in taken:
        for r in surplus:
            surplus[r] += unit.demand.get_amount(r)
    kept = list(taken)
    for unit in reversed(taken):
        if not all(unit.demand.get_amount(r) <= surplus[r] for r in surplus):
            continue
        rest = [u for u in kept if u is not unit]
        if placed is not None and not placed(rest):
            continue
        kept = rest
        for r in surplus:
            surplus[r] -= unit.demand.get_amount(r)
    return kept
