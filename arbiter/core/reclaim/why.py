"""Why a waiting unit is not reclaiming: which rule refused which
victim, one line, for its QueueUnit message and the decision log. Pure: no
I/O. Asked only when a pass could not serve a unit that starves (the move
rule might let it gain, `arbiter.core.reclaim.flat.plan`), so the cost is paid
for the units that wait, not for the pass.

Each candidate (in the order the pass tries them, nearest first in a tree)
is judged alone, by the rule `select_reclaim` applies (flat, or the tree's
`ReclaimTree.refusal`) and the pass's own filters (a victim that frees no
room on nodes the unit may use; a queue the pass served already). The
first refusal of each of the first few queues is named; when some victims were allowed, the line
says they do not make room for it together (in total, or with node fit on
nodes of its pools)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Set
from fractions import Fraction
from typing import Protocol, TypeVar

from arbiter.core.reclaim.rules import RuleQueue, stays_richer, under_guarantee, weighted_share
from arbiter.core.reclaim.tree import ReclaimTree
from arbiter.core.resources import EMPTY, Resources

__all__ = ["why_not_reclaiming"]

SHOWN = 4  # queues whose refusal one message names


class _Unit(Protocol):
    """What of a unit an explanation reads (Waiting and Admitted have it)."""

    @property
    def key(self) -> str: ...
    @property
    def queue(self) -> str: ...
    @property
    def demand(self) -> Resources: ...


W = TypeVar("W", bound=_Unit)
A = TypeVar("A", bound=_Unit)


def _share(value: Fraction) -> str:
    """Exact (the rule compares exactly), and roughly for a reader."""
    return str(value) if value.denominator == 1 else f"{value} (~{float(value):.3g})"


def _tree_reason(found: tuple[str, ...], victim: str) -> str:
    rule = found[0]
    if rule == "ancestor":
        return "its queue is the taker's ancestor"
    if rule == "guarantee":
        return f"subtree {found[1]} would go below its guarantee"
    if rule == "one queue":
        return f"both are quotas of {found[1]} (childOrder: Queue)"
    if rule == "poorer":
        return f"subtree {found[1]}, holding both, would end up poorer"
    return (f"subtree {found[1]}'s weighted share without it is not above "
            f"subtree {found[2]}'s (where {victim} and the taker meet)")


def why_not_reclaiming(
    unit: W,
    candidates: Iterable[A],
    *,
    queues: Mapping[str, RuleQueue],
    allocated: Mapping[str, Mapping[str, int]],
    held: Mapping[str, int],
    capacity: Mapping[str, int],
    tree: ReclaimTree | None = None,
    usable: Callable[[W, A], bool] | None = None,
    served: Set[str] = frozenset(),
    group: Callable[[str], str] = str,
) -> str:
    """One line: why no allowed victim set lets `unit` in (see the module
    doc). `queues`: `ReclaimQueue`s by name; `allocated`: what the victim
    queues hold; `held`: what the taker holds with the pass's units;
    `served`: groups the pass served (no victims in it)."""
    taker = queues.get(unit.queue)
    weight = taker.weight if taker is not None else 1
    guarantee = taker.guarantee if taker is not None else EMPTY
    guaranteed = under_guarantee(held, unit.demand, guarantee)
    bar = weighted_share(held, capacity, weight)
    refused: list[str] = []
    named: set[str] = set()  # one refusal per queue is named (its first)
    more = 0
    allowed = 0
    # Past the node check a refusal depends on the victim's queue and demand
    # only: thousands of candidates share a few of those (a look at 100
    # queues and 4,000 admitted units took seconds without this).
    by_shape: dict[tuple[str, Resources], str | None] = {}
    for victim in candidates:
        if victim.queue == unit.queue:
            continue
        reason = _node_refusal(unit, victim, queues, usable)
        if reason is None:
            shape = (victim.queue, victim.demand)
            if shape in by_shape and tree is None:  # a tree's reason names the victim
                reason = by_shape[shape]
            else:
                reason = by_shape[shape] = _refusal(unit, victim, queues, allocated, capacity,
                                                    tree, served, group, guaranteed, bar)
        if reason is None:
            allowed += 1
        elif victim.queue not in named and len(named) < SHOWN:
            named.add(victim.queue)
            refused.append(f"{victim.key} of queue {victim.queue}: {reason}")
        else:
            more += 1
    where = "under its guarantee" if guaranteed else f"weighted share {_share(bar)}"
    head = f"not reclaiming for {unit.key} (queue {unit.queue}, {where})"
    parts: list[str] = []
    if allowed:
        parts.append(f"the {allowed} victim(s) the rules allow do not make room for it")
    if refused:
        parts.append("refused: " + "; ".join(refused) + (f"; {more} more refused" if more else ""))
    if not parts:
        parts.append("no other queue holds a unit it may lose (reclaimable, above its "
                     "guarantee)")
    return f"{head}: {'; '.join(parts)}"


def _node_refusal(unit: W, victim: A, queues: Mapping[str, RuleQueue],
                  usable: Callable[[W, A], bool] | None) -> str | None:
    """The refusals checked first, victim by victim: its queue, its nodes."""
    spec = queues.get(victim.queue)
    if spec is None or not spec.reclaimable:
        return "its queue is not reclaimable"
    if usable is not None and not usable(unit, victim):
        return f"frees no room on nodes queue {unit.queue} may use"
    return None


def _refusal(unit: W, victim: A, queues: Mapping[str, RuleQueue],
             allocated: Mapping[str, Mapping[str, int]], capacity: Mapping[str, int],
             tree: ReclaimTree | None, served: Set[str], group: Callable[[str], str],
             guaranteed: bool, bar: Fraction) -> str | None:
    """The rest (a function of the victim's queue and demand only)."""
    spec = queues[victim.queue]
    if group(victim.queue) in served:
        return "its queue was served a unit in this pass"
    if tree is not None:
        found = tree.refusal(unit.queue, unit.demand, victim.queue, victim.demand, {})
        return None if found is None else _tree_reason(found, victim.key)
    left = allocated.get(victim.queue, EMPTY)
    low = spec.guarantee
    short = sorted(r for r, v in victim.demand.items()
                   if v > 0 and left.get(r, 0) - v < low.get(r, 0))
    if short:
        return f"queue {victim.queue} would go below its guarantee of {', '.join(short)}"
    if guaranteed:
        return None
    after = {r: left.get(r, 0) - victim.demand.get_amount(r) for r in {*left, *victim.demand}}
    weight = spec.weight
    if stays_richer(after, capacity, weight, bar):
        return None
    return (f"queue {victim.queue}'s weighted share without it, "
            f"{_share(weighted_share(after, capacity, weight))}, is not above {_share(bar)}")
