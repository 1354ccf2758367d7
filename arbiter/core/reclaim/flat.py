"""Reclaim's pass: victims for several waiting units at once, served the
way admission would serve them (DESIGN.md §3 "Reclaim"). Which victims one
unit may take, and in what order, is `arbiter.core.reclaim.selection`'s.
Pure: no I/O, no clock.

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

from arbiter.core.engine.flat import dominant_share_of
from arbiter.core.engine.tree import has_hierarchy
from arbiter.core.reclaim.rules import (
    GraceWaiters,
    may_gain,
    richest_share,
    stays_richer,
    under_guarantee,
    weighted_share,
    within_capability,
)
from arbiter.core.reclaim.selection import (
    Admitted,
    Reason,
    ReclaimQueue,
    Room,
    Victim,
    Waiting,
    floor_of,
    may_reclaim,
    select_reclaim,
    select_within_queue,
    victim_order,
)
from arbiter.core.reclaim.tree import ReclaimTree
from arbiter.core.reclaim.why import why_not_reclaiming
from arbiter.core.resources import EMPTY, Resources

# The selection's names are re-exported: the loop and tests import them with `plan`.
__all__ = [
    "Admitted", "Plan", "ReclaimQueue", "Room", "Victim", "Waiting", "floor_of", "may_gain",
    "may_reclaim", "plan", "richest_share", "select_reclaim", "select_within_queue",
    "stays_richer", "under_guarantee", "victim_order", "weighted_share", "within_capability",
]


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
            if skip[unit.key]:
                starving.add(name)
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
