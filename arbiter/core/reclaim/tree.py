"""Reclaim over a tree of queues (DESIGN §11). Pure: no I/O, no clock.

The flat move rule (`arbiter.core.reclaim.flat`, DESIGN §4) judged where taker
and victim meet. For a waiting unit w of leaf T and an admitted unit u of
leaf V, let M be their lowest common ancestor (the virtual root for two
top-level subtrees), and A_T, A_V the children of M on the paths to T and
to V (T and V themselves for siblings, and for every pair of a flat set,
so a flat set gets exactly the flat rule). u may be taken for w when

* every queue on V's path below M (V .. A_V) stays at or above its
  guarantee with u gone (a parent's guarantee is the larger of its own and
  its children's together): no subtree is taken below its guarantee;
* M and every queue above it (they hold both) are no poorer with w in and
  u out: with units of other shapes their dominant share could fall, and
  undo the levels above (all of w's victims together are checked); and
* A_T is under its guarantee with w (subtree allocation + w <= guarantee on
  every resource w requests), or share(A_V without u) > share(A_T without
  w), strictly, shares being weighted dominant shares of the subtrees.

Inside a subtree ordered as one queue (`childOrder: Queue`, at M or above)
nothing moves: admission orders its units by that queue's policy, not by
share or guarantee, and would hand the room straight back.

So no subtree at M's depth or above gets poorer (same-shaped units: they
do not change at all), and the sorted weighted shares among M's children
rise (as the flat rule's do, once admission admits w): the vectors of the
levels, top down, rise with every move, so repeated reclaim reaches a
fixpoint (no loops; tests/reclaim/test_tree.py plays random trees).

**One move per pass** (`arbiter.core.reclaim.flat.plan` stops after the first
unit it takes victims for, `Plan.cut`): H-DRF admission settles before the
next move is judged on what it did. In the same spirit a pass serves no
unit whose freed room an unserved unit of the pass would fit, and a unit
served makes its `group` no victim for the rest of the pass.

**Nearest victims first.** For a taker, candidates are tried by the depth
of the meeting point, deepest first (siblings, then cousins, then the
rest of the cluster), and in victim order inside each.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from fractions import Fraction
from typing import Any, Protocol, TypeVar

from arbiter.core.engine.flat import dominant_share_of
from arbiter.core.reclaim.rules import stays_richer, under_guarantee
from arbiter.core.resources import EMPTY, Resources

__all__ = ["ReclaimTree", "TreeQueue"]


class TreeQueue(Protocol):
    """What the tree needs of a queue (`arbiter.core.reclaim.flat.ReclaimQueue`)."""

    @property
    def name(self) -> str: ...
    @property
    def weight(self) -> int: ...
    @property
    def guarantee(self) -> Resources: ...
    @property
    def capability(self) -> Resources: ...
    @property
    def parent(self) -> str | None: ...
    @property
    def child_order(self) -> str: ...


class _Queued(Protocol):
    @property
    def queue(self) -> str: ...


V = TypeVar("V", bound=_Queued)


class _Taken(_Queued, Protocol):
    @property
    def demand(self) -> Resources: ...


def _add(into: dict[str, int], amounts: Mapping[str, int], sign: int) -> None:
    for r, v in amounts.items():
        into[r] = into.get(r, 0) + sign * v


class ReclaimTree:
    """Paths, effective guarantees and subtree totals of a tree of queues.

    Two subtree totals are kept per queue: `held`, what the admitted units
    below hold (victims are judged by it), and `projected`, plus what a
    reclaim pass served (takers are judged by it), as the flat pass does."""

    def __init__(self, queues: Mapping[str, TreeQueue], capacity: Mapping[str, int],
                 held: Mapping[str, Mapping[str, int]],
                 projected: Mapping[str, Mapping[str, int]] | None = None) -> None:
        self.queues = queues
        self.capacity = capacity
        self.paths: dict[str, tuple[str, ...]] = {}
        for name in queues:
            self.paths[name] = self._path(name)
        self.guarantee: dict[str, Resources] = {}
        for name in sorted(queues, key=lambda n: -len(self.paths[n])):
            own = queues[name].guarantee
            below = EMPTY
            for child, path in self.paths.items():
                if len(path) > 1 and path[1] == name:
                    below = below + self.guarantee[child]
            self.guarantee[name] = below.maximum(own)
        self._nearest: dict[str, list[Any]] = {}  # per taker, see `nearest_first`
        self.held: dict[str, dict[str, int]] = {name: {} for name in queues}
        self.projected: dict[str, dict[str, int]] = {name: {} for name in queues}
        for name, amounts in held.items():
            self.change(name, amounts, 1, projected=False)
        for name, amounts in (projected if projected is not None else held).items():
            self.change(name, amounts, 1, held=False)

    def _path(self, name: str) -> tuple[str, ...]:
        """The queue and its ancestors, top last; a broken chain (a missing
        parent, a cycle) ends where it breaks."""
        path = [name]
        seen = {name}
        parent = self.queues[name].parent
        while parent is not None and parent in self.queues and parent not in seen:
            path.append(parent)
            seen.add(parent)
            parent = self.queues[parent].parent
        return tuple(path)

    def change(self, leaf: str, amounts: Mapping[str, int], sign: int, *,
               held: bool = True, projected: bool = True) -> None:
        """`leaf` holds `amounts` more (sign 1) or less (-1): every subtree on its path."""
        for name in self.paths.get(leaf, (leaf,)):
            if held and name in self.held:
                _add(self.held[name], amounts, sign)
            if projected and name in self.projected:
                _add(self.projected[name], amounts, sign)

    def meet(self, taker: str, victim: str) -> tuple[int, str, str, tuple[str, ...]] | None:
        """(depth of the meeting point, A_T, A_V, V's path below it); None
        when one is the other's ancestor (a parent's own units: never taken
        for its subtree)."""
        up_t = self.paths.get(taker, (taker,))
        up_v = self.paths.get(victim, (victim,))
        common = 0
        while (common < len(up_t) and common < len(up_v)
               and up_t[-1 - common] == up_v[-1 - common]):
            common += 1
        if common == len(up_t) or common == len(up_v):
            return None
        below_v = up_v[: len(up_v) - common]
        return common, up_t[len(up_t) - common - 1], below_v[-1], below_v

    def allows(self, taker: str, demand: Mapping[str, int], victim: str,
               loss: Mapping[str, int], remaining: dict[str, dict[str, int]]) -> bool:
        """The move rule of the module doc for a unit of `victim` asking
        `loss` back, for a unit of `taker` asking `demand`. `remaining`: per
        subtree, what it holds with the victims taken so far for this unit
        gone (filled here from `held`; the caller takes each victim off
        every subtree on its path)."""
        return self.refusal(taker, demand, victim, loss, remaining) is None

    def refusal(self, taker: str, demand: Mapping[str, int], victim: str,
                loss: Mapping[str, int],
                remaining: dict[str, dict[str, int]]) -> tuple[str, ...] | None:
        """`allows`, saying which part of the rule refuses (None: none):
        ("ancestor",), ("guarantee", subtree), ("one queue", meeting point),
        ("poorer", subtree) or ("share", A_V, A_T)."""
        met = self.meet(taker, victim)
        if met is None:
            return ("ancestor",)
        depth, above_taker, above_victim, below = met
        for name in below:
            left = remaining.setdefault(name, dict(self.held[name]))
            low = self.guarantee[name]
            if not all(left.get(r, 0) - v >= low.get_amount(r) for r, v in loss.items() if v > 0):
                return ("guarantee", name)
        if self.ordered_as_one(depth, taker):
            # quotas of one queue: admission orders them by its policy
            path = self.paths.get(taker, (taker,))
            return ("one queue", path[len(path) - depth])
        up = self.paths.get(taker, (taker,))
        for name in up[len(up) - depth:]:
            # A subtree holding both gains w and loses u: it must not end up
            # poorer (mixed shapes), or a level above would fall back.
            left = remaining.setdefault(name, dict(self.held[name]))
            after = dict(left)
            _add(after, loss, -1)
            _add(after, demand, 1)
            if dominant_share_of(after, self.capacity) < dominant_share_of(self.held[name],
                                                                           self.capacity):
                return ("poorer", name)
        gainer = self.projected[above_taker]
        if under_guarantee(gainer, demand, self.guarantee[above_taker]):
            return None
        after = dict(remaining[above_victim])
        for r, v in loss.items():
            after[r] = after.get(r, 0) - v
        if stays_richer(after, self.capacity, self.queues[above_victim].weight,
                        self.share(above_taker, gainer)):
            return None
        return ("share", above_victim, above_taker)

    def handed_on(self, taker: str, demand: Resources, victims: Iterable[_Taken],
                  unserved: Iterable[tuple[str, Resources]], room: Resources) -> bool:
        """Whether H-DRF admission, once `victims` are gone, could hand the
        `room` they leave to one of the `unserved` units (queue, demand)
        before the unit of `taker` they were chosen for: one that fits there,
        unless the taker's side is under its guarantee where the two paths
        meet and the other's is not (H-DRF serves it first). Such a move is
        not made: admission would undo it. (So a subtree under its
        guarantee reclaims first, whatever waits elsewhere.)"""
        gone = list(victims)
        for victim in gone:
            self.change(victim.queue, victim.demand, -1)
        try:
            return any(need.fits_in(room) and self._ahead(other, need, taker, demand)
                       for other, need in unserved)
        finally:
            for victim in gone:
                self.change(victim.queue, victim.demand, 1)

    def _ahead(self, other: str, need: Resources, taker: str, demand: Resources) -> bool:
        """Whether `other`'s unit may come first: yes, unless the taker's
        side is under its guarantee where they meet and the other's is not
        (shares alone, with units served and victims gone in between, are
        not a safe bet; nor is a subtree ordered as one queue)."""
        met = self.meet(taker, other)
        if met is None or any(self.queues[name].child_order == "Queue"
                              for name in (*self.paths[taker][1:], *self.paths[other][1:])):
            return True
        _, mine, theirs, _ = met
        return not (under_guarantee(self.projected[mine], demand, self.guarantee[mine])
                    and not under_guarantee(self.projected[theirs], need,
                                            self.guarantee[theirs]))

    def nearest_first(self, taker: str, pool: list[V], inside: str | None = None) -> list[V]:
        """`pool` (units with a `queue`, in victim order) nearest to `taker`
        first: by the depth where their queues meet it, deepest first (a
        stable sort, kept per taker); only those under `inside` if given."""
        ordered = self._nearest.get(taker)
        if ordered is None or len(ordered) != len(pool):
            def depth(queue: str) -> int:
                met = self.meet(taker, queue)
                return -1 if met is None else met[0]

            rank = {queue: -depth(queue) for queue in {u.queue for u in pool}}
            ordered = self._nearest[taker] = sorted(pool, key=lambda u: rank[u.queue])
        if inside is not None:
            return [u for u in ordered if inside in self.paths.get(u.queue, (u.queue,))]
        return ordered

    def could_gain(self, taker: str, demand: Mapping[str, int], losers: Iterable[str]) -> bool:
        """A cheap necessary condition for the move rule to find a victim for
        a unit of `taker`: some subtree on its path is under its guarantee
        with the unit, or has a sibling subtree richer than it that holds a
        queue that could lose (`losers`)."""
        richer: set[str] = set()
        for loser in losers:
            richer.update(self.paths.get(loser, (loser,)))
        path = self.paths.get(taker, (taker,))
        requested = [(r, v) for r, v in demand.items() if v > 0]
        for at, name in enumerate(path):
            mine = self.projected.get(name, {})
            floor = self.guarantee.get(name, EMPTY)
            if requested and all(mine.get(r, 0) + v <= floor.get_amount(r) for r, v in requested):
                return True
            share = self.share(name, mine)
            parent = path[at + 1] if at + 1 < len(path) else None
            for other in richer:
                other_path = self.paths[other]
                sibling = (other_path[1] if len(other_path) > 1 else None) == parent
                if sibling and other != name and self.share(other, self.held[other]) > share:
                    return True
        return False

    def over_capability(self, taker: str,
                        demand: Mapping[str, int]) -> tuple[str | None, dict[str, int]]:
        """The deepest parent of `taker` whose capability the unit would
        exceed (None: none), and per resource the largest overshoot over its
        parents: victims from that parent's subtree lower every one of them."""
        deepest: str | None = None
        over: dict[str, int] = {}
        for name in self.paths.get(taker, (taker,))[1:]:
            cap = self.queues[name].capability
            mine = self.projected.get(name, {})
            for r, v in demand.items():
                if v > 0 and r in cap:
                    excess = mine.get(r, 0) + v - cap[r]
                    if excess > 0:
                        over[r] = max(over.get(r, 0), excess)
                        deepest = deepest or name
        return deepest, over

    def group(self, leaf: str) -> str:
        """What admission orders `leaf`'s units with: its topmost parent
        with `childOrder: Queue` (one queue for the whole subtree), else itself."""
        found = leaf
        for name in self.paths.get(leaf, (leaf,))[1:]:
            if self.queues[name].child_order == "Queue":
                found = name
        return found

    def share(self, name: str, amounts: Mapping[str, int]) -> Fraction:
        return dominant_share_of(amounts, self.capacity) / self.queues[name].weight

    def ordered_as_one(self, depth: int, taker: str) -> bool:
        """Whether the meeting point at `depth` lies in a subtree ordered as
        one queue (it, or a parent above it, has `childOrder: Queue`)."""
        path = self.paths.get(taker, (taker,))
        return depth > 0 and any(self.queues[name].child_order == "Queue"
                                 for name in path[len(path) - depth:])
