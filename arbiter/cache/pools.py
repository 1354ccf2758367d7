"""Which pool each node belongs to, kept incrementally (DESIGN §10).

A node belongs to the first Pool, by name, whose nodeSelector its labels
match; a node no Pool selects is in the pool `default`. Membership depends
on a node's labels only (not on Ready or cordoned: those decide what the
engine may place on it, not where it belongs).

Costs: a node added, relabelled or deleted is O(pools); a Pool added,
changed or deleted recomputes every node, O(nodes × pools) — Pools change
rarely, nodes and their heartbeats often. Lookups are O(1): the extender
asks `pool_of` / `nodes_in` on every request.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Set

from arbiter.cache.records import NodeRecord, PoolRecord
from arbiter.core.model import DEFAULT_POOL

_NO_NODES: frozenset[str] = frozenset()


class PoolMembership:
    def __init__(self) -> None:
        self._pools: dict[str, PoolRecord] = {}
        self._order: list[PoolRecord] = []  # by name: the first match wins
        self._labels: dict[str, Mapping[str, str]] = {}  # node -> labels
        self._pool_of: dict[str, str] = {}  # node -> pool
        self._members: dict[str, set[str]] = {}  # pool -> nodes
        # Bumped whenever any node changes pool (or a Pool is added/removed),
        # so a reader can cache what it derives from membership.
        self.version = 0

    # -- queries -------------------------------------------------------------
    def pool_of(self, node: str) -> str | None:
        """The node's pool; None for a node the store does not hold."""
        return self._pool_of.get(node)

    def nodes_in(self, pool: str) -> Set[str]:
        """The nodes of `pool` (a live, read-only view; empty for an unknown pool)."""
        return self._members.get(pool, _NO_NODES)

    def pool(self, name: str) -> PoolRecord | None:
        return self._pools.get(name)

    # -- nodes ---------------------------------------------------------------
    def set_node(self, node: NodeRecord) -> None:
        labels = dict(node.labels)
        self._labels[node.name] = labels
        self._assign(node.name, self._match(labels))

    def remove_node(self, name: str) -> None:
        self._labels.pop(name, None)
        old = self._pool_of.pop(name, None)
        if old is not None:
            self._leave(name, old)
            self.version += 1

    # -- pools ---------------------------------------------------------------
    def set_pool(self, pool: PoolRecord) -> None:
        old = self._pools.get(pool.name)
        self._pools[pool.name] = pool
        if old is None or old.node_selector != pool.node_selector:
            self._reorder()

    def remove_pool(self, name: str) -> None:
        if self._pools.pop(name, None) is not None:
            self._reorder()

    def replace_pools(self, pools: Iterable[PoolRecord]) -> None:
        self._pools = {pool.name: pool for pool in pools}
        self._reorder()

    # -- internals -----------------------------------------------------------
    def _reorder(self) -> None:
        self._order = [self._pools[name] for name in sorted(self._pools)]
        self.version += 1
        for node, labels in self._labels.items():
            self._assign(node, self._match(labels))

    def _match(self, labels: Mapping[str, str]) -> str:
        for pool in self._order:
            if pool.selects(labels):
                return pool.name
        return DEFAULT_POOL

    def _assign(self, node: str, pool: str) -> None:
        old = self._pool_of.get(node)
        if old == pool:
            return
        if old is not None:
            self._leave(node, old)
        self._pool_of[node] = pool
        self._members.setdefault(pool, set()).add(node)
        self.version += 1

    def _leave(self, node: str, pool: str) -> None:
        members = self._members.get(pool)
        if members is not None:
            members.discard(node)
            if not members:
                del self._members[pool]
