"""Reclaim across queues and preemption inside a queue: which admitted units
to take back, and for whom (DESIGN.md §3 "Reclaim"; the stopping rule is the
README's "Reclaim: the exact stopping rule"). Pure: no I/O, no clock.

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

**Plan.** `plan` serves several waiting units in one pass, the way admission
would: repeatedly, the queue with the lowest weighted dominant share (then
name) offers its next waiting unit; a unit that fits in the projected free
capacity is counted as admitted without victims (capacity already being freed
goes to the queues that wait for it), otherwise victims are chosen as above
and the projected state updated. Both sides of the rule are judged
conservatively: a victim queue by what its *admitted* units hold (a unit of
it served in this pass never makes its running units look richer), the
taker by what it holds plus the units served to it in this pass. A queue
that lost units to reclaim in this pass counts as due for the rest of it:
the grace absorbs bursts of new work, and its demand was running a moment
ago; so does a queue in its grace once the room freed since it offered
its unit fits that unit (`GraceWaiters`). A queue served a unit in this
pass is no victim for the rest of it: its victim would be requeued, perhaps
ahead of the unit it was served, and admission would give the room back to
the victim (the README shows the loop that made). A queue whose unit
cannot be served offers nothing more in this pass.
The pass stops before it would exceed `max_victims` victims (a single unit
that needs more is still served).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Mapping, Sequence, Set
from dataclasses import dataclass
from fractions import Fraction
from typing import Literal, Protocol

from arbiter.core.engine.flat import dominant_share_of
from arbiter.core.engine.tree import has_hierarchy
from arbiter.core.reclaim.rules import (
    GraceWaiters,
    capacity_of,
    cover_greedily,
    may_gain,
    richest_share,
    shortfall,
    stays_richer,
    under_guarantee,
    weighted_share,
    within_capability,
)
from arbiter.core.reclaim.tree import ReclaimTree
from arbiter.core.reclaim.why import why_not_reclaiming
from arbiter.core.resources import EMPTY, Resources

__all__ = [
    "Admitted", "Plan", "ReclaimQueue", "Room", "Victim", "Waiting", "floor_of", "may_gain",
    "may_reclaim", "plan", "richest_share", "select_reclaim", "select_within_queue",
    "stays_richer", "under_guarantee", "victim_order", "weighted_share", "within_capability",
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
    # The pass stopped before every queue was looked at (`starving` is partial).
    cut: bool = False
    timed_out: bool = False  # cut by `out_of_time`
    passed: tuple[tuple[str, bool], ...] = ()  # (unit, its queue starving): no room found
    early: frozenset[str] = frozenset()  # reclaimed in their grace (`GraceWaiters`)
    # Why a starving queue's unit got no victims: (unit key, one line), from
    # `arbiter.core.reclaim.why` (for its message and the decision log).
    refused: tuple[tuple[str, str], ...] = ()


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
    usable: Callable[[Waiting, Admitted], bool] | None = None,
    room: Room | None = None,
    out_of_time: Callable[[], bool] = lambda: False,
    skip: Mapping[str, bool] | None = None,
) -> Plan:
    """Victims for the waiting units (see the module doc).

    `out_of_time()`, asked before each unit after the first, cuts the pass
    (`timed_out`); `skip` (a timed-out pass's `passed`): units not looked at
    again, so that a costly one cannot keep the queues behind it waiting.

    `room` (node fit): a unit is served without victims only when its pods
    fit on nodes it may use, and victims are chosen so that they then do;
    `usable` defaults to `room.usable`.

    `usable(w, u)`: whether taking `u` back frees room `w` could use (with
    node fit, DESIGN §10: `u` holds resources on nodes of `w`'s pools); a
    victim that would free only room `w` cannot use is never taken for it.

    `admitted`: every unit holding capacity (capacity being freed already
    left out) — or, when `allocated` gives what each queue holds, only the
    units that may be taken (in `victim_order` when `ordered`); `waiting`:
    each queue's waiting units in queue order (a prefix is enough); `due`:
    queues whose grace has passed; `protected`: keys never to pick (a write
    in flight, an eviction blocked lately).
    """
    if usable is None and room is not None:
        usable = room.usable
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
    richest = richest_share(queues, lambda name: held_by.get(name, EMPTY), capacity)
    # A tree of queues (DESIGN §11): the move rule where taker and victim meet.
    tree = ReclaimTree(queues, capacity, held_by) if has_hierarchy(queues.values()) else None
    # Queues that can lose a unit (read by the tree's `could_gain` only).
    losers = [name for name, spec in queues.items() if spec.reclaimable and any(
        v > spec.guarantee.get_amount(r) for r, v in held_by.get(name, {}).items())
    ] if tree is not None else []
    chosen_from = (u for u in admitted if u.key not in protected and u.queue in queues)
    pool = list(chosen_from) if ordered else sorted(chosen_from, key=victim_order(queues))
    gone: set[str] = set()

    # Queues this pass has served a unit to: never victims of a later unit in
    # the same pass. A victim is requeued in its queue's order, possibly ahead
    # of the unit served to that queue; admission would then hand the room to
    # the victim, not to the unit it was planned for, and undo the pass.
    takers: set[str] = set()  # (in a tree: their groups, `ReclaimTree.group`)
    group: Callable[[str], str] = tree.group if tree is not None else str

    def candidates(unit: Waiting, inside: str | None = None,
                   every: bool = False) -> Iterable[Admitted]:
        ordered = pool if tree is None else tree.nearest_first(unit.queue, pool, inside)
        if usable is None or every:
            return (u for u in ordered if u.key not in gone)
        return (u for u in ordered if u.key not in gone and usable(unit, u))

    def reclaimable(unit: Waiting, inside: str | None = None) -> Iterable[Admitted]:
        return (u for u in candidates(unit, inside) if group(u.queue) not in takers)

    cursor = {name: 0 for name in waiting if name in queues and waiting[name]}
    version = dict.fromkeys(cursor, 0)
    # Keyed by the weighted shares on the queue's path, top down (a flat
    # queue: its own), then name: in a tree, subtrees offer as H-DRF would.
    PathKey = tuple[tuple[Fraction, str], ...]
    heap: list[tuple[PathKey, str, int]] = []

    def push(name: str) -> None:
        version[name] += 1
        key: PathKey
        if tree is None:
            key = ((dominant_share_of(projected.get(name, {}), capacity) / queues[name].weight,
                    name),)
        else:
            key = tuple((tree.share(up, tree.projected[up]), up)
                        for up in reversed(tree.paths[name]))
        heapq.heappush(heap, (key, name, version[name]))

    for name in cursor:
        push(name)
    victims: list[Victim] = []
    lost: set[str] = set()  # queues that lost units to reclaim in this pass
    waiters = GraceWaiters()  # queues in their grace, and those due since
    served: list[str] = []
    starving: set[str] = set()
    waiting_for_grace: set[str] = set()
    refused: list[tuple[str, str]] = []
    # In a tree, units this pass could not serve (queue, demand): room freed
    # for a later unit must not go to one of them that H-DRF admission would
    # serve first (`ReclaimTree.handed_on`), or the move would be undone; nor
    # to the next unit of another leaf of its `childOrder: Queue` subtree
    # (admission orders those by policy, not as the pass offers them).
    unserved: list[tuple[str, Resources]] = []
    steps = 0
    examined = 0  # units looked at (not skipped): the first always is
    timed_out = False
    passed: dict[str, bool] = {}
    while heap and len(victims) < max_victims and steps < max_steps:
        if examined and out_of_time():
            timed_out = True
            break
        steps += 1
        order, name, ver = heapq.heappop(heap)
        if ver != version[name]:
            continue
        units = waiting[name]
        index = cursor[name]
        if index >= len(units):
            continue
        unit = units[index]
        if skip is not None and unit.key in skip:  # as the earlier pass found it
            starving.update([name] if skip[unit.key] else [])
            unserved.append((name, unit.demand))
            continue
        examined += 1
        spec = queues[name]
        held = projected.setdefault(name, {})
        chosen: list[Admitted] | None
        reason: Reason = "reclaim"
        guaranteed = False
        capped, over = tree.over_capability(name, unit.demand) if tree else (None, {})
        in_total = unit.demand.fits_in(free) and within_capability(
            held, unit.demand, spec.capability) and not over
        if in_total and (room is None or room.fits(unit)):
            chosen, freed = [], EMPTY
        else:
            chosen = None
            # (in total but on no node it may use: room there is the shortfall)
            if in_total or may_reclaim(spec, held, unit, free) or (
                    over and within_capability(held, unit.demand, spec.capability)):
                found = select_reclaim(unit, free, queues, held_by, reclaimable(unit, capped),
                                       ordered=True, capacity=capacity, held=held, tree=tree,
                                       over=over, room=room)
                gain = (may_gain(spec, held, unit.demand, capacity, richest) if tree is None
                        else tree.could_gain(name, unit.demand, losers))
                if found is not None or gain:
                    # Starving even while the units it could take are
                    # protected (an eviction blocked lately): the grace runs on.
                    starving.add(name)
                if found is None and gain:
                    refused.append((unit.key, why_not_reclaiming(
                        unit, candidates(unit, capped, every=True), queues=queues,
                        allocated=held_by,
                        held=held, capacity=capacity, tree=tree, usable=usable,
                        served=takers, group=group)))
                if found is not None:
                    if name not in due and name not in lost and name not in waiters.early:
                        waiting_for_grace.add(name)
                        unserved.append((name, unit.demand))
                        waiters.park(name, order, unit.demand, free)
                        continue  # wait for the grace period: the queue offers nothing more
                    guaranteed = under_guarantee(held, unit.demand, spec.guarantee)
                chosen = found
            if chosen is None and spec.within_queue == "LowerPriority":
                chosen = select_within_queue(unit, free, spec, held, candidates(unit),
                                             ordered=True, room=room)
                reason = "withinQueue"
            freed = sum((v.demand for v in chosen), EMPTY) if chosen else EMPTY
            if tree is not None and chosen and tree.handed_on(
                    name, unit.demand, chosen, unserved + [
                        (leaf, units_[cursor[leaf]].demand) for leaf, units_ in waiting.items()
                        if leaf != name and leaf in cursor and cursor[leaf] < len(units_)
                        and group(leaf) == group(name) != name], freed + Resources(free)):
                chosen = None  # admission would hand that room to a unit ahead of it
                refused.append((unit.key, f"not reclaiming for {unit.key}: admission would "
                                "hand the room to a unit ahead of it (H-DRF)"))
            if chosen is None:
                unserved.append((name, unit.demand))
                passed[unit.key] = name in starving
                continue  # cannot be served now: the queue offers nothing more
            if victims and len(victims) + len(chosen) > max_victims:
                break  # the next pass serves it
        touched = {name}
        if chosen and reason == "reclaim":
            touched.update(waiters.freed(order, freed))
        for victim in chosen:
            gone.add(victim.key)
            victims.append(Victim(victim, reason, unit.key, name, guaranteed))
            if reason == "reclaim":
                lost.add(victim.queue)
            source = held_by.setdefault(victim.queue, {})
            ahead = projected.setdefault(victim.queue, {})
            for r, v in victim.demand.items():
                source[r] = source.get(r, 0) - v
                ahead[r] = ahead.get(r, 0) - v
                free[r] = free.get(r, 0) + v
            touched.add(victim.queue)
            if tree is not None:
                tree.change(victim.queue, victim.demand, -1)
        if room is not None:
            room.serve(unit, chosen)
        for r, v in unit.demand.items():
            held[r] = held.get(r, 0) + v
            free[r] = free.get(r, 0) - v
        if tree is not None:
            tree.change(name, unit.demand, 1, held=False)
            touched = set(cursor)  # shares on the paths above changed too
        served.append(unit.key)
        takers.add(group(name))
        cursor[name] = index + 1
        if tree is not None and chosen:
            # In a tree, one unit's victims per pass: admission (H-DRF) then
            # settles before the next move is judged on what it did.
            return Plan(tuple(victims), tuple(served), frozenset(starving),
                        frozenset(waiting_for_grace), cut=True, refused=tuple(refused))
        for other in touched:
            if other in cursor:
                push(other)
    return Plan(tuple(victims), tuple(served), frozenset(starving),
                frozenset(waiting_for_grace - waiters.early), cut=timed_out,
                timed_out=timed_out, passed=tuple(passed.items()),
                early=frozenset(waiters.early), refused=tuple(refused))
