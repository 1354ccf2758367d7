"""Node fit for admission (DESIGN.md §10): which nodes could hold a unit's pods.

Pure: no I/O. The engine keeps one `NodeIndex`; it knows every node's free
resources (allocatable - used - planned pods of admitted units) and answers
"where would these pods go" by first-fit decreasing: the pods, largest
dominant share first, each on the first node (by name) of the node set with
room for it. Equal pods are placed together, as many per node as fit.

A *node set* is one pool's nodes narrowed by a queue's nodeSelector; sets are
built when first asked for and kept up to date after that. Per set:

* free amounts per resource as flat lists (one int per node, in name order);
* a *floor*: per resource, at most the smallest amount any pod asked of the
  set requests, and a bit per member at or above it in every resource. A
  member below it has room for no pod at all (most filled nodes: their last
  pod slot or millicores are gone), so `find` visits only the live bits,
  testing each member resource by resource, scarcest first;
* a *cursor* per pod shape: no node before it has room for one such pod.
  Free space only shrinks while admitting, so first-fit searches resume
  there (amortised O(nodes) per shape between releases); a node that grows
  is logged and pulls every cursor back to it before its next use.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from arbiter.core.model import DEFAULT_POOL, Node, Placement, Pool

__all__ = ["NodeIndex", "NodeSet", "NodeView", "Pairs", "Runs", "fit_placement", "packed_pod"]

Pairs = tuple[tuple[int, int], ...]  # (resource index, amount > 0)
Runs = tuple[tuple[int, Pairs], ...]  # (pod count, pairs of one pod), placement order
Checks = tuple[tuple[int, int], ...]  # a pod's pairs in the order `NodeSet._find` tests them

_WORD = 64  # members per word of live bits
_WORD_BITS = 6
_WORD_MASK = _WORD - 1
_GROWN_KEPT = 1024  # growths NodeIndex remembers
_LOG_LIMIT = 1024  # cursors are dropped rather than pulled back past this many growths
# Packed free amounts: each resource in a field of _WIDTH bits whose top bit
# (_GUARD) is always set, holding the free amount clamped to [0, _GUARD).
# For a pod asking a < _GUARD of each resource, field - a keeps its top bit
# exactly when free >= a, and never borrows from the next field.
_WIDTH = 64
_GUARD = 1 << (_WIDTH - 1)


def _clamp(amount: int) -> int:
    return 0 if amount < 0 else amount if amount < _GUARD else _GUARD - 1


_PACKED: dict[Pairs, tuple[int, int]] = {}


def packed_pod(pairs: Pairs) -> tuple[int, int]:
    """(a pod's amounts packed like `NodeIndex.packed`, the top bits of its
    fields); need -1 when some amount is too large to pack (checked per field).
    A node whose packed free amounts are `word` has room for the pod when
    need >= 0 and (word - need) & guards == guards (inlined where used)."""
    got = _PACKED.get(pairs)
    if got is None:
        if len(_PACKED) > 65536:
            _PACKED.clear()
        need = 0
        guards = 0
        for r, a in pairs:
            need |= a << (r * _WIDTH)
            guards |= _GUARD << (r * _WIDTH)
        if any(a >= _GUARD for _, a in pairs):
            need = -1
        got = _PACKED[pairs] = (need, guards)
    return got


def fit_placement(pool: str, members: Sequence[str], run_pod_sets: Iterable[str],
                  got: Iterable[Sequence[int]], pod_sets: Iterable[str]) -> Placement:
    """A first-fit answer as a Placement: per run (its pod set's name) the
    member index of each pod, over `members`' names; every pod set listed."""
    nodes: dict[str, tuple[str, ...]] = dict.fromkeys(pod_sets, ())
    for pod_set, placed in zip(run_pod_sets, got, strict=True):
        nodes[pod_set] = nodes.get(pod_set, ()) + tuple([members[m] for m in placed])
    return Placement(pool, nodes)


class NodeSet:
    """The nodes of one pool that a nodeSelector allows, in name order."""

    __slots__ = (
        "cursors", "fails", "floor", "fr", "live", "log", "members", "names", "order", "pool",
        "scale", "total",
    )

    pool: str
    members: list[int]  # global node positions
    names: tuple[str, ...]
    fr: list[list[int]]  # per resource index: free amount per member
    # The *floor*: per resource index, at most the smallest amount of it any
    # pod asked of this set requests (0: some pod does not request it; None:
    # no pod asked yet). A member below the floor in some resource has room
    # for none of those pods; `live` has a bit set, per word of 64 members,
    # for each member at or above it. First fit visits only those.
    floor: list[int] | None
    live: list[int]
    # Per resource index: the largest free amount of a member when the set was
    # made (>= 1); it only orders a pod's checks (`_checks`), never decides a fit.
    scale: list[int]
    order: dict[Pairs, Checks]  # pairs, scarcest first (see `_checks`)
    total: list[int]  # per resource index: free amount summed over the members (>= 0)
    # pod -> (first member that may fit, log length then, its `_checks`)
    cursors: dict[Pairs, tuple[int, int, Checks]]
    log: list[int]  # members that grew, in order
    # (count, pairs) of one pod set that found no room -> (log length then,
    # the members that could hold some (None: not known), how many in all)
    fails: dict[tuple[int, Pairs], tuple[int, list[int] | None, int]]

    def __init__(self, pool: str, members: list[int], names: tuple[str, ...],
                 free: list[list[int]]) -> None:
        self.pool = pool
        self.members = members
        self.names = names
        self.fr = [[column[g] for g in members] for column in free]
        self.floor = None
        n = len(members)
        self.live = [(1 << min(_WORD, n - b)) - 1 for b in range(0, n, _WORD)]
        self.total = [sum(a for a in column if a > 0) for column in self.fr]
        self.scale = [max(max(column, default=1), 1) for column in self.fr]
        self.order = {}
        self.cursors = {}
        self.log = []
        self.fails = {}

    def add_resource(self) -> None:
        self.fr.append([0] * len(self.members))
        if self.floor is not None:
            self.floor.append(0)
        self.total.append(0)
        self.scale.append(1)
        self.order = {}

    def set_free(self, local: int, r: int, amount: int) -> None:
        column = self.fr[r]
        old = column[local]
        if amount == old:
            return
        column[local] = amount
        # over-committed nodes add nothing
        self.total[r] += (amount if amount > 0 else 0) - (old if old > 0 else 0)
        floor = self.floor
        if floor is not None and floor[r]:
            self._relive(local)

    def _relive(self, local: int) -> None:
        """Set or clear the live bit of member `local` (see `floor`)."""
        floor = self.floor
        assert floor is not None
        fr = self.fr
        bit = 1 << (local & _WORD_MASK)
        word = local >> _WORD_BITS
        for r, f in enumerate(floor):
            if f and fr[r][local] < f:
                self.live[word] &= ~bit
                return
        self.live[word] |= bit

    def _lower_floor(self, pairs: Pairs) -> None:
        """Make the floor at most `pairs` (a pod asked of this set) and
        recompute which members are live. Rounded down to a power of two
        so that it is lowered only a few times."""
        asked = dict(pairs)
        floor = self.floor
        if floor is None:
            floor = [1 << (a.bit_length() - 1) if a > 0 else 0
                     for a in (asked.get(r, 0) for r in range(len(self.fr)))]
        else:
            floor = [f if asked.get(r, 0) >= f else
                     (1 << (asked[r].bit_length() - 1) if asked.get(r, 0) > 0 else 0)
                     for r, f in enumerate(floor)]
        self.floor = floor
        n = len(self.members)
        self.live = [(1 << min(_WORD, n - b)) - 1 for b in range(0, n, _WORD)]
        fr = self.fr
        for r, f in enumerate(floor):
            if f:
                column = fr[r]
                for m in range(n):
                    if column[m] < f:
                        self.live[m >> _WORD_BITS] &= ~(1 << (m & _WORD_MASK))

    def _checks(self, pairs: Pairs) -> Checks:
        """`pairs` with the resource a member most likely lacks first (the
        largest share of a member's size): a test stops at the first short
        one. Lowers the floor to `pairs` first if need be."""
        got = self.order.get(pairs)
        if got is None:
            floor = self.floor
            asked = dict(pairs)
            if floor is None or any(f and asked.get(r, 0) < f for r, f in enumerate(floor)):
                self._lower_floor(pairs)
            if len(self.order) > 4096:
                self.order = {}
            scale = self.scale
            got = self.order[pairs] = tuple(
                sorted(pairs, key=lambda pair: pair[1] / scale[pair[0]], reverse=True))
        return got

    def find(self, pairs: Pairs, at: int) -> int:
        """The first member from `at` on with room for one pod of `pairs`
        (len(members) if none). Visits only live members (see `floor`)."""
        return self._find(self._checks(pairs), at)

    def _find(self, checks: Checks, at: int) -> int:
        n = len(self.members)
        if at >= n:
            return n
        fr = self.fr
        if len(checks) == 3:  # cpu, memory, pods: the usual pod
            (r0, a0), (r1, a1), (r2, a2) = checks
            c0, c1, c2 = fr[r0], fr[r1], fr[r2]
            for m in self._live_from(at):
                if c0[m] >= a0 and c1[m] >= a1 and c2[m] >= a2:
                    return m
            return n
        columns = [(fr[r], a) for r, a in checks]
        for m in self._live_from(at):
            for column, a in columns:
                if column[m] < a:
                    break
            else:
                return m
        return n

    def _live_from(self, at: int) -> Iterator[int]:
        """The live members from `at` on, in order (see `floor`)."""
        live = self.live
        words = len(live)
        b = at >> _WORD_BITS
        word = live[b] >> (at & _WORD_MASK) << (at & _WORD_MASK)
        while True:
            while not word:
                b += 1
                if b >= words:
                    return
                word = live[b]
            low = word & -word
            yield (b << _WORD_BITS) | (low.bit_length() - 1)
            word ^= low

    def _cursor(self, pairs: Pairs) -> tuple[int, Checks]:
        """Where first fit of `pairs` starts, and its checks."""
        got = self.cursors.get(pairs)
        if got is None:
            return 0, self._checks(pairs)
        at, seen, checks = got
        log = self.log
        if seen < len(log):
            at = min(at, min(log[seen:]))
        return at, checks

    def _set_cursor(self, pairs: Pairs, at: int, checks: Checks) -> None:
        if len(self.log) > _LOG_LIMIT:
            self.log = []
            self.cursors = {}
            self.fails = {}
        self.cursors[pairs] = (at, len(self.log), checks)

    def still_full(self, run: tuple[int, Pairs]) -> bool:
        """A pod set that found no room still finds none.

        Since it failed, only the logged nodes grew; every other node only
        shrank. So the pods it could hold now are at most what the nodes that
        held some then (fewer than `count` nodes) and the grown nodes hold
        now: exact, and O(count + growths) instead of a scan."""
        failed = self.fails.get(run)
        if failed is None:
            return False
        seen, holders, bound = failed
        log = self.log
        count, pairs = run
        if holders is None:  # it failed on the set's total: does it still?
            total = self.total
            fresh = min((total[r] // a for r, a in pairs), default=count)
            if fresh < count:
                self.fails[run] = (len(log), None, fresh)
                return True
            nodes: set[int] = set(log[seen:])
        else:
            if seen == len(log):
                return True  # nothing grew: the holders only shrank
            # Counted again on the holders and the grown nodes, not added to
            # `bound`: the record stays exact (what the shape lacks, which
            # the engine's wake test reads) instead of creeping up.
            nodes = set(holders)
            nodes.update(log[seen:])
        bound, kept = self._holding(nodes, count, pairs, bound if holders is None else 0)
        if bound >= count:
            return False
        self.fails[run] = (len(log), kept if holders is not None else None, bound)
        return True

    def _holding(self, nodes: Iterable[int], count: int, pairs: Pairs,
                 start: int = 0) -> tuple[int, list[int]]:
        """`start` plus how many pods of `pairs` (at most `count` each) the
        members `nodes` hold, and those that hold some."""
        fr = self.fr
        bound = start
        kept: list[int] = []
        # Most of them (nodes that grew a little since) lack the scarcest
        # resource: drop those in one pass before testing the rest fully.
        if pairs:
            scarce, need = self._checks(pairs)[0]
            column = fr[scarce]
            nodes = [m for m in nodes if column[m] >= need]
        for m in nodes:
            k = count
            for r, a in pairs:
                q = fr[r][m] // a
                if q < k:
                    k = q
                    if k <= 0:
                        break  # not even one pod: the usual case
            if k > 0:
                bound += k
                kept.append(m)
        return bound, kept

    def place(self, runs: Runs) -> list[list[int]] | None:
        """First-fit decreasing of `runs` (already in placement order): per run,
        the member index of each pod; None when some pod finds no room."""
        n = len(self.members)
        fr = self.fr
        total = self.total
        single = len(runs) == 1
        if single:
            count, pairs = runs[0]
            for r, a in pairs:
                if a * count > total[r]:  # not even the set's total free is enough
                    self.fails[runs[0]] = (len(self.log), None, total[r] // a)
                    return None
            if self.fails and self.still_full(runs[0]):
                return None
        taken: dict[int, dict[int, int]] | None = None if single else {}
        find = self._find
        out: list[list[int]] = []
        for ri, (count, pairs) in enumerate(runs):
            got: list[int] = []
            out.append(got)
            if count <= 0:
                continue
            if not pairs:  # requests nothing: any node holds it
                if n == 0:
                    return None
                got.extend([0] * count)
                continue
            at, checks = self._cursor(pairs)
            at = find(checks, at)
            if ri == 0:  # committed state only: later runs see tentative use
                self._set_cursor(pairs, at, checks)
            while count and at < n:
                if taken:
                    k = self._room(at, pairs, count, taken.get(at))
                else:
                    k = count
                    for r, a in pairs:
                        f = fr[r][at]
                        if f < a * k:
                            k = f // a
                if k > 0:
                    got.extend([at] * k)
                    count -= k
                    if taken is not None:
                        use = taken.setdefault(at, {})
                        for r, a in pairs:
                            use[r] = use.get(r, 0) + a * k
                    if not count:
                        break
                at = find(checks, at + 1)
            if count:
                if single:
                    self.fails[runs[0]] = (len(self.log), sorted(set(got)), len(got))
                return None
        return out

    def _room(self, at: int, pairs: Pairs, k: int, extra: dict[int, int] | None) -> int:
        """How many pods of `pairs` (at most k) member `at` holds beside `extra`."""
        fr = self.fr
        for r, a in pairs:
            f = fr[r][at] - (extra.get(r, 0) if extra else 0)
            if f < a:
                return 0
            if f < a * k:
                k = f // a
        return k

    def largest(self, r: int) -> tuple[int, str]:
        """The largest free amount of resource `r` and the node holding it."""
        column = self.fr[r]
        if not column:
            return 0, ""
        best = max(range(len(column)), key=column.__getitem__)
        return column[best], self.names[best]


class NodeIndex:
    """Every node's free resources, its pool, and the node sets asked for so far."""

    def __init__(self, nodes: Iterable[Node], pools: Iterable[Pool], nres: int) -> None:
        ordered = sorted(nodes, key=lambda node: node.name)
        self.pools = sorted(pools, key=lambda pool: pool.name)
        names = [pool.name for pool in self.pools]
        # every pool by name, `default` last (DESIGN §10)
        self.pool_order: tuple[str, ...] = (
            *[name for name in names if name != DEFAULT_POOL], DEFAULT_POOL)
        self.names: list[str] = [node.name for node in ordered]
        self.position: dict[str, int] = {name: g for g, name in enumerate(self.names)}
        if len(self.position) != len(self.names):
            raise ValueError("node names must be unique")
        self.labels: list[Mapping[str, str]] = [node.labels for node in ordered]
        self.pool_of: list[str] = [self._pool_for(node.labels) for node in ordered]
        self.nodes: list[Node] = ordered
        self.free: list[list[int]] = [[0] * len(ordered) for _ in range(nres)]
        self.sets: dict[tuple[str, tuple[tuple[str, str], ...]], NodeSet] = {}
        # per node: (node set, its index there)
        self.member_of: list[list[tuple[NodeSet, int]]] = [[] for _ in ordered]
        # The last nodes that grew, in order, and how many grew in all: who
        # checked at grown_total = t can see which nodes grew since.
        self.grown: list[int] = []
        self.grown_total = 0
        self._packed: dict[int, int] = {}  # node -> `packed(node)`, dropped when it changes

    def _pool_for(self, labels: Mapping[str, str]) -> str:
        for pool in self.pools:
            if pool.selects(labels):
                return pool.name
        return DEFAULT_POOL

    def add_resource(self) -> None:
        self.free.append([0] * len(self.names))
        self._packed.clear()
        for node_set in self.sets.values():
            node_set.add_resource()

    def node_set(self, pool: str, selector: tuple[tuple[str, str], ...]) -> NodeSet:
        key = (pool, selector)
        found = self.sets.get(key)
        if found is not None:
            return found
        members = [
            g for g, name in enumerate(self.pool_of)
            if name == pool and all(self.labels[g].get(k) == v for k, v in selector)
        ]
        found = NodeSet(pool, members, tuple([self.names[g] for g in members]), self.free)
        self.sets[key] = found
        for local, g in enumerate(members):
            self.member_of[g].append((found, local))
        return found

    def change(self, g: int, delta: Iterable[tuple[int, int]]) -> bool:
        """Add the signed `delta` to node g's free amounts; True when something grew."""
        free = self.free
        grew = False
        memberships = self.member_of[g]
        self._packed.pop(g, None)
        for r, a in delta:
            if not a:
                continue
            amount = free[r][g] + a
            free[r][g] = amount
            if a > 0:
                grew = True
            for node_set, local in memberships:
                node_set.set_free(local, r, amount)
        if grew:
            for node_set, local in memberships:
                node_set.log.append(local)  # once per change, not per resource
            if len(self.grown) >= _GROWN_KEPT:
                del self.grown[: _GROWN_KEPT // 2]
            self.grown.append(g)
            self.grown_total += 1
        return grew

    def grown_since(self, mark: int) -> list[int] | None:
        """The nodes that grew since `grown_total` was `mark` (None: too many to tell)."""
        back = self.grown_total - mark
        if back > len(self.grown):
            return None
        return self.grown[len(self.grown) - back :] if back else []

    def packed(self, g: int) -> int:
        """Node g's free amounts in one int, _WIDTH bits per resource with the
        top bit set (see `packed_pod`), so one subtraction tests a whole pod
        (kept until the node changes: waking queues asks for it repeatedly)."""
        word = self._packed.get(g)
        if word is None:
            word = self._packed[g] = sum((_GUARD | _clamp(column[g])) << (r * _WIDTH)
                                         for r, column in enumerate(self.free))
        return word

    def take(self, g: int, pairs: Pairs, count: int) -> None:
        """`count` pods of `pairs` are planned on node g (shrinks only: no
        growth to log; the node may drop below a set's floor). The shrink half
        of `NodeSet.set_free`, inlined per member set: admissions are hot."""
        free = self.free
        memberships = self.member_of[g]
        self._packed.pop(g, None)
        for r, a in pairs:
            column = free[r]
            old = column[g]
            amount = old - a * count
            column[g] = amount
            drop = old - (amount if amount > 0 else 0) if old > 0 else 0  # totals count >= 0
            for node_set, local in memberships:
                node_set.fr[r][local] = amount
                node_set.total[r] -= drop
                floor = node_set.floor
                if floor is not None and 0 < floor[r] > amount:
                    node_set.live[local >> _WORD_BITS] &= ~(1 << (local & _WORD_MASK))


@dataclass(frozen=True, slots=True)
class NodeView:
    """An engine's nodes as reclaim's node fit reads them
    (`arbiter.core.reclaim.room`), for either engine."""

    index: NodeIndex
    pairs: Callable[[Mapping[str, int]], Pairs]  # amounts by name -> by resource index
    sets: Callable[[str], list[NodeSet]]  # a queue's node sets, in its pools' order
    held: Callable[[str], list[tuple[str, Pairs]]]  # what an admitted unit's plan holds, per node
