"""Node fit for admission (DESIGN.md §10): which nodes could hold a unit's pods.

Pure: no I/O. The engine keeps one `NodeIndex`; it knows every node's free
resources (allocatable - used - planned pods of admitted units) and answers
"where would these pods go" by first-fit decreasing: the pods, largest
dominant share first, each on the first node (by name) of the node set with
room for it. Equal pods are placed together, as many per node as fit.

A *node set* is one pool's nodes narrowed by a queue's nodeSelector; sets are
built when first asked for and kept up to date after that. Per set:

* free amounts per resource as flat lists (one int per node, in name order);
* blocks of 64 nodes with the largest free amount of each resource in the
  block: a search skips a block in one comparison when no node in it can hold
  the pod ("largest free slot" per block, updated in O(1) except when a
  block's largest node shrinks: one C-level max over 64 ints);
* a *cursor* per pod shape: no node before it has room for one such pod.
  Free space only shrinks while admitting, so first-fit searches resume
  there (amortised O(nodes) per shape between releases); a node that grows
  is logged and pulls every cursor back to it before its next use.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from arbiter.core.model import DEFAULT_POOL, Node, Pool

__all__ = ["NodeIndex", "NodeSet", "Pairs", "Runs"]

Pairs = tuple[tuple[int, int], ...]  # (resource index, amount > 0)
Runs = tuple[tuple[int, Pairs], ...]  # (pod count, pairs of one pod), placement order

_BLOCK = 3  # log2 of the nodes per block
_LOG_LIMIT = 1024  # cursors are dropped rather than pulled back past this many growths


_COARSE: dict[Pairs, Pairs] = {}


def _coarse(pairs: Pairs) -> Pairs:
    """`pairs` with each amount rounded down to its two leading bits: a pod
    of `pairs` needs at least that much, so the coarse shape's cursor holds."""
    got = _COARSE.get(pairs)
    if got is None:
        if len(_COARSE) > 65536:
            _COARSE.clear()
        rounded = []
        for r, a in pairs:
            drop = a.bit_length() - 2
            rounded.append((r, a >> drop << drop) if drop > 0 else (r, a))
        got = _COARSE[pairs] = tuple(rounded)
    return got


class NodeSet:
    """The nodes of one pool that a nodeSelector allows, in name order."""

    __slots__ = (
        "bmax", "cursors", "fails", "fr", "log", "members", "names", "pool", "total",
    )

    pool: str
    members: list[int]  # global node positions
    names: list[str]
    fr: list[list[int]]  # per resource index: free amount per member
    bmax: list[list[int]]  # per resource index: largest free amount per block
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
        self.bmax = [self._block_max(column) for column in self.fr]
        self.total = [sum(a for a in column if a > 0) for column in self.fr]
        self.cursors = {}
        self.log = []
        self.fails = {}

    @staticmethod
    def _block_max(column: list[int]) -> list[int]:
        size = 1 << _BLOCK
        return [max(column[b : b + size]) for b in range(0, len(column), size)]

    def add_resource(self) -> None:
        self.fr.append([0] * len(self.members))
        self.bmax.append(self._block_max(self.fr[-1]))
        self.total.append(0)

    def set_free(self, local: int, r: int, amount: int) -> None:
        column = self.fr[r]
        old = column[local]
        if amount == old:
            return
        column[local] = amount
        self.total[r] += max(amount, 0) - max(old, 0)  # over-committed nodes add nothing
        b = local >> _BLOCK
        top = self.bmax[r]
        if amount > old:
            if amount > top[b]:
                top[b] = amount
            self.log.append(local)
        elif old == top[b]:
            start = b << _BLOCK
            top[b] = max(column[start : start + (1 << _BLOCK)])

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
        fr = self.fr
        if holders is None:  # it failed on the set's total: does it still?
            total = self.total
            fresh = min((total[r] // a for r, a in pairs), default=count)
            if fresh < count:
                self.fails[run] = (len(log), None, fresh)
                return True
            nodes: set[int] = set(log[seen:])
        else:
            nodes = set(holders)
            nodes.update(log[seen:])
            bound = 0
        kept: list[int] = []
        for m in nodes:
            k = count
            for r, a in pairs:
                q = fr[r][m] // a
                if q < k:
                    k = q
            if k > 0:
                bound += k
                kept.append(m)
        if bound >= count:
            return False
        self.fails[run] = (len(log), kept if holders is not None else None, bound)
        return True

    def place(self, runs: Runs) -> list[list[int]] | None:
        """First-fit decreasing of `runs` (already in placement order): per run,
        the member index of each pod; None when some pod finds no room."""
        n = len(self.members)
        fr = self.fr
        bmax = self.bmax
        nblocks = len(bmax[0]) if bmax else 0
        size = 1 << _BLOCK
        total = self.total
        if len(runs) == 1:
            count, pairs = runs[0]
            for r, a in pairs:
                if a * count > total[r]:  # not even the set's total free is enough
                    self.fails[runs[0]] = (len(self.log), None, total[r] // a)
                    return None
            if self.still_full(runs[0]):
                return None
        taken: dict[int, dict[int, int]] | None = {} if len(runs) > 1 else None
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
            # Cursors: the shape's own, and that of its coarse shape (amounts
            # rounded down, shared by many shapes): nodes before either have
            # no room. While scanning from the coarse cursor, also find the
            # first node with room for the coarse shape, to advance it.
            coarse = _coarse(pairs)
            at = self.cursor(pairs)
            cat = self.cursor(coarse) if coarse != pairs else -1
            track = ri == 0 and cat >= at
            if cat > at:
                at = cat
            probe = coarse if track else pairs  # block filter
            cols = [(fr[r], a) for r, a in pairs]
            ccols = [(fr[r], a) for r, a in coarse]
            first = -1
            cfirst = -1
            b = at >> _BLOCK
            while count and b < nblocks:
                for r, a in probe:
                    if bmax[r][b] < a:
                        break
                else:
                    end = min(n, (b + 1) * size)
                    while at < end:
                        if track and cfirst < 0:
                            for column, a in ccols:
                                if column[at] < a:
                                    break
                            else:
                                cfirst = at
                                probe = pairs
                        k = count
                        if taken:
                            k = self._room(at, pairs, k, taken.get(at))
                        else:
                            for column, a in cols:
                                f = column[at]
                                if f < a:
                                    k = 0
                                    break
                                if f < a * k:
                                    k = f // a
                        if k > 0:
                            if first < 0:
                                first = at
                            got.extend([at] * k)
                            count -= k
                            if taken is not None:
                                use = taken.setdefault(at, {})
                                for r, a in pairs:
                                    use[r] = use.get(r, 0) + a * k
                            if not count:
                                break
                        at += 1
                    if not count:
                        break
                b += 1
                at = b * size
            if ri == 0:  # committed state only: later runs see tentative use
                self._set_cursor(pairs, first if first >= 0 else n)
                if track:
                    self._set_cursor(coarse, cfirst if cfirst >= 0 else n)
                if count and len(runs) == 1:
                    self.fails[runs[0]] = (len(self.log), sorted(set(got)), len(got))
            if count:
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

    def _pool_for(self, labels: Mapping[str, str]) -> str:
        for pool in self.pools:
            if pool.selects(labels):
                return pool.name
        return DEFAULT_POOL

    def add_resource(self) -> None:
        self.free.append([0] * len(self.names))
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
        for r, a in delta:
            if not a:
                continue
            amount = free[r][g] + a
            free[r][g] = amount
            if a > 0:
                grew = True
            for node_set, local in memberships:
                node_set.set_free(local, r, amount)
        return grew

    def take(self, g: int, pairs: Pairs, count: int) -> None:
        """`count` pods of `pairs` are planned on node g (shrinks only)."""
        free = self.free
        memberships = self.member_of[g]
        for r, a in pairs:
            amount = free[r][g] - a * count
            free[r][g] = amount
            for node_set, local in memberships:
                node_set.set_free(local, r, amount)
