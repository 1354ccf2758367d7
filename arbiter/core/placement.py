"""Node fit for admission (DESIGN.md §10): which nodes could hold a unit's pods.

Pure: no I/O. The engine keeps one `NodeIndex`; it knows every node's free
resources (allocatable - used - planned pods of admitted units) and answers
"where would these pods go" by first-fit decreasing: the pods, largest
dominant share first, each on the first node (by name) of the node set with
room for it. Equal pods are placed together, as many per node as fit.

A *node set* is one pool's nodes narrowed by a queue's nodeSelector; sets are
built when first asked for and kept up to date after that. Per set:

* free amounts per resource as flat lists (one int per node, in name order);
* a tree of maxima over blocks of 64 of them (fan-out 8): per resource, a
  bound on the largest free amount below each tree node. `find` scans a
  block member by member (stopping at the first resource short) and descends
  the tree to the next block that may have room, skipping every subtree
  where some resource is short. Growth raises the bounds at once; shrinking
  (every admission) leaves them high until a search finds a block without
  room and lowers its bound to the exact maximum;
* a *cursor* per pod shape: no node before it has room for one such pod.
  Free space only shrinks while admitting, so first-fit searches resume
  there (amortised O(nodes) per shape between releases); a node that grows
  is logged and pulls every cursor back to it before its next use.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from arbiter.core.model import DEFAULT_POOL, Node, Pool

__all__ = ["NodeIndex", "NodeSet", "Pairs", "Runs", "packed_pod", "room_for"]

Pairs = tuple[tuple[int, int], ...]  # (resource index, amount > 0)
Runs = tuple[tuple[int, Pairs], ...]  # (pod count, pairs of one pod), placement order

_BITS = 3  # log2 of the fan-out of the tree of maxima
_FAN = 1 << _BITS
_MASK = _FAN - 1
_SCAN_LEVEL = 2  # `find` scans blocks of 8**2 members ...
_SCAN_BITS = _SCAN_LEVEL * _BITS  # ... and skips blocks by the tree above them
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
    `room_for(word, *packed_pod(pairs))` tests one node."""
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


def room_for(word: int, need: int, guards: int) -> bool:
    """Has the node whose packed free amounts are `word` room for the pod?"""
    return need >= 0 and (word - need) & guards == guards


class NodeSet:
    """The nodes of one pool that a nodeSelector allows, in name order."""

    __slots__ = (
        "cursors", "fails", "fr", "log", "members", "names", "order", "pool", "scale", "sizes",
        "total", "tree",
    )

    pool: str
    members: list[int]  # global node positions
    names: list[str]
    fr: list[list[int]]  # per resource index: free amount per member
    # tree[level][r][i], level >= _SCAN_LEVEL: at least the largest free
    # amount of resource r among the members i * 8**level ... (i + 1) *
    # 8**level - 1 (tree[0] is `fr`; tree[1] is not kept). Growth raises it
    # at once; shrinking leaves it high (still a bound) until a search finds
    # no room below it and lowers it to the exact maximum.
    tree: list[list[list[int]]]
    sizes: list[int]  # entries per level of `tree`
    scale: list[int]  # per resource index: the largest allocatable share of a member (>= 1)
    order: dict[Pairs, tuple[tuple[int, int], ...]]  # pairs, scarcest first (see `_checks`)
    total: list[int]  # per resource index: free amount summed over the members (>= 0)
    cursors: dict[Pairs, tuple[int, int]]  # shape -> (first member that may fit, log length)
    log: list[int]  # members that grew, in order
    # (count, pairs) of one pod set that found no room -> (log length then,
    # the members that could hold some (None: not known), how many in all)
    fails: dict[tuple[int, Pairs], tuple[int, list[int] | None, int]]

    def __init__(self, pool: str, members: list[int], names: list[str],
                 free: list[list[int]]) -> None:
        self.pool = pool
        self.members = members
        self.names = names
        self.fr = [[column[g] for g in members] for column in free]
        sizes = [len(members)]
        while sizes[-1] > 1:
            sizes.append((sizes[-1] + _FAN - 1) >> _BITS)
        self.sizes = sizes
        self.tree = [self.fr]
        for level in range(1, len(sizes)):
            if level < _SCAN_LEVEL:
                self.tree.append([[] for _ in self.fr])
            elif level == _SCAN_LEVEL:
                self.tree.append([self._maxima(column, _SCAN_BITS) for column in self.fr])
            else:
                self.tree.append([self._maxima(column, _BITS) for column in self.tree[-1]])
        self.total = [sum(a for a in column if a > 0) for column in self.fr]
        self.scale = [max(max(column, default=1), 1) for column in self.fr]
        self.order = {}
        self.cursors = {}
        self.log = []
        self.fails = {}

    @staticmethod
    def _maxima(column: list[int], bits: int) -> list[int]:
        step = 1 << bits
        return [max(column[b : b + step]) for b in range(0, len(column), step)]

    def add_resource(self) -> None:
        self.fr.append([0] * len(self.members))
        for level, entries in enumerate(self.tree[1:], 1):
            entries.append([] if level < _SCAN_LEVEL else [0] * self.sizes[level])
        self.total.append(0)
        self.scale.append(1)
        self.order = {}

    def set_free(self, local: int, r: int, amount: int) -> None:
        column = self.fr[r]
        old = column[local]
        if amount == old:
            return
        column[local] = amount
        self.total[r] += max(amount, 0) - max(old, 0)  # over-committed nodes add nothing
        if amount > old:
            self.log.append(local)
            tree = self.tree
            local >>= _SCAN_BITS
            for level in range(_SCAN_LEVEL, len(tree)):
                up = tree[level][r]
                if up[local] >= amount:
                    return
                up[local] = amount
                local >>= _BITS

    def _checks(self, pairs: Pairs) -> tuple[tuple[int, int], ...]:
        """`pairs` with the resource a member most likely lacks first (the
        largest share of a member's size): a scan stops at the first short one."""
        got = self.order.get(pairs)
        if got is None:
            if len(self.order) > 4096:
                self.order = {}
            scale = self.scale
            got = self.order[pairs] = tuple(
                sorted(pairs, key=lambda pair: pair[1] / scale[pair[0]], reverse=True))
        return got

    def _scan(self, checks: tuple[tuple[int, int], ...], start: int, end: int) -> int:
        """The first member in [start, end) with room for one pod (-1 if none)."""
        fr = self.fr
        if len(checks) == 3:  # cpu, memory, pods: the usual pod
            (r0, a0), (r1, a1), (r2, a2) = checks
            c0, c1, c2 = fr[r0], fr[r1], fr[r2]
            for m in range(start, end):
                if c0[m] >= a0 and c1[m] >= a1 and c2[m] >= a2:
                    return m
            return -1
        if len(checks) == 4:
            (r0, a0), (r1, a1), (r2, a2), (r3, a3) = checks
            c0, c1, c2, c3 = fr[r0], fr[r1], fr[r2], fr[r3]
            for m in range(start, end):
                if c0[m] >= a0 and c1[m] >= a1 and c2[m] >= a2 and c3[m] >= a3:
                    return m
            return -1
        columns = [(fr[r], a) for r, a in checks]
        for m in range(start, end):
            for column, a in columns:
                if column[m] < a:
                    break
            else:
                return m
        return -1

    def find(self, pairs: Pairs, at: int) -> int:
        """The first member from `at` on with room for one pod of `pairs`
        (len(members) if none). Scans blocks of 64 members, and skips by the
        tree of maxima every block where some resource is short everywhere;
        a block found full gets its maxima lowered to the exact ones."""
        n = self.sizes[0]
        checks = self._checks(pairs)
        top = len(self.tree) - 1
        start = at
        block = at >> _SCAN_BITS
        while start < n:
            end = min((block + 1) << _SCAN_BITS, n)
            hit = self._scan(checks, start, end)
            if hit >= 0:
                return hit
            if top < _SCAN_LEVEL:
                return n
            if start == block << _SCAN_BITS:
                entries = self.tree[_SCAN_LEVEL]
                fr = self.fr
                for r, _ in checks:
                    entries[r][block] = max(fr[r][start:end])
            block = self._next_block(pairs, block + 1)
            start = block << _SCAN_BITS
        return n

    def _next_block(self, pairs: Pairs, i: int) -> int:
        """The first block of 64 members from block `i` on whose maxima hold
        one pod of `pairs` (a necessary condition; past the end if none).
        A block entered from above none of whose parts passes gets its
        maxima lowered to theirs."""
        tree = self.tree
        sizes = self.sizes
        top = len(tree) - 1
        level = _SCAN_LEVEL
        entries = tree[level]
        entered = 0  # bit L: the current block at level L was entered from above
        while True:
            if i >= sizes[level]:
                return sizes[_SCAN_LEVEL]
            for r, a in pairs:
                if entries[r][i] < a:
                    break
            else:
                if level == _SCAN_LEVEL:
                    return i
                entered |= 1 << level
                level -= 1
                entries = tree[level]
                i <<= _BITS
                continue
            i += 1
            if not i & _MASK:
                while not i & _MASK and level < top:
                    if entered >> (level + 1) & 1:
                        entered &= ~(1 << (level + 1))
                        parent = tree[level + 1]
                        lo = i - _FAN
                        for r, _ in pairs:
                            parent[r][lo >> _BITS] = max(entries[r][lo:i])
                    level += 1
                    i >>= _BITS
                    entries = tree[level]

    def cursor(self, pairs: Pairs) -> int:
        got = self.cursors.get(pairs)
        if got is None:
            return 0
        at, seen = got
        log = self.log
        if seen < len(log):
            at = min(at, min(log[seen:]))
        return at

    def _set_cursor(self, pairs: Pairs, at: int) -> None:
        if len(self.log) > _LOG_LIMIT:
            self.log = []
            self.cursors = {}
            self.fails = {}
        self.cursors[pairs] = (at, len(self.log))

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
            # The holders only shrank unless they grew since: `bound` plus
            # what the grown nodes hold now is an upper bound, often enough.
            grown = set(log[seen:])
            extra, added = self._holding(grown, count, pairs)
            if bound + extra < count:
                if grown:
                    kept = holders + [m for m in added if m not in holders]
                    self.fails[run] = (len(log), kept, bound + extra)
                return True
            nodes = set(holders)
            nodes.update(grown)
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
        checks = self._checks(pairs)
        bound = start
        kept: list[int] = []
        for m in nodes:
            k = count
            for r, a in checks:
                q = fr[r][m] // a
                if q < k:
                    k = q
                    if not k:
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
        find = self.find
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
            at = find(pairs, self.cursor(pairs))
            if ri == 0:  # committed state only: later runs see tentative use
                self._set_cursor(pairs, at)
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
                at = find(pairs, at + 1)
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
        found = NodeSet(pool, members, [self.names[g] for g in members], self.free)
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
        """`count` pods of `pairs` are planned on node g (shrinks only)."""
        free = self.free
        memberships = self.member_of[g]
        self._packed.pop(g, None)
        for r, a in pairs:
            amount = free[r][g] - a * count
            free[r][g] = amount
            for node_set, local in memberships:
                node_set.set_free(local, r, amount)
