"""Packing scores per node, encoded once and reused until the node changes.

prioritize answers one `{"Host": node, "Score": n}` per candidate node.
Computing the score and building and encoding one dict per node costs
~10 ms at 5,000 nodes. But a node's packing score depends only on the
pod's dominant resource and its request of it (and the configured
weights), and on that node's used and allocatable amounts; the pods of one
Job, which kube-scheduler places one after another, share all of those.
So a `ScoreTable` per (resource, request, weights) maps node -> its answer
entry, already encoded (`orjson.Fragment`), filled on first use, and
`ScoreTables.node_changed` drops a node's entries when its usage or
allocatable changes. A request for a known table then costs one dict
lookup per node, in C (`map(table.__getitem__, names)`).

Only nodes the cache knows are kept; other names are scored (0) per call.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping

import orjson

from extender.wire import MAX_SCORE, MIN_SCORE

# Tables kept at once (least recently used dropped first): about one per
# distinct pod shape being scheduled right now.
MAX_TABLES = 32

# resource, requested, binpack weight, total weight, highest score given
TableKey = tuple[str, int, int, int, int]


def pack_score(used: int, requested: int, capacity: int) -> float:
    """10 x (node's requests + this pod's) / allocatable, capped at 10; 0 without capacity."""
    if capacity <= 0:
        return 0.0
    pack = MAX_SCORE * (used + requested) / capacity
    return MAX_SCORE if pack > MAX_SCORE else pack


def mixed_score(near: float, pack: float, locality_weight: int, binpack_weight: int) -> int:
    """The weighted mean of the two signals, rounded, at least MIN_SCORE."""
    total = locality_weight + binpack_weight
    score = int((locality_weight * near + binpack_weight * pack) / total + 0.5)
    return score if score > MIN_SCORE else MIN_SCORE


class HostPriorities:
    """Encoded `{"Host": node, "Score": n}` entries, made once per known node and score."""

    def __init__(self) -> None:
        self._rows: dict[str, list[orjson.Fragment | None]] = {}

    def get(self, node: str, score: int, *, keep: bool) -> orjson.Fragment:
        row = self._rows.get(node)
        if row is not None:
            found = row[score]
            if found is not None:
                return found
        fragment = orjson.Fragment(orjson.dumps({"Host": node, "Score": score}))
        if keep:
            if row is None:
                row = self._rows[node] = [None] * (MAX_SCORE + 1)
            row[score] = fragment
        return fragment

    def forget(self, node: str) -> None:
        self._rows.pop(node, None)


class ScoreTable(dict[str, orjson.Fragment]):
    """node -> encoded packing-only entry for one TableKey; a miss computes it."""

    __slots__ = ("_tables", "binpack_weight", "ceiling", "requested", "resource", "total_weight")

    def __init__(self, tables: ScoreTables, key: TableKey) -> None:
        super().__init__()
        self._tables = tables
        self.resource, self.requested, self.binpack_weight, self.total_weight, self.ceiling = key

    def score(self, node: str) -> int:
        if not self.binpack_weight:
            return MIN_SCORE  # packing does not count: only siblings (scored apart) do
        tables = self._tables
        pack = pack_score(
            tables.used(self.resource).get(node, 0),
            self.requested,
            tables.allocatable(self.resource).get(node, 0),
        )
        score = mixed_score(0.0, pack, self.total_weight - self.binpack_weight,
                            self.binpack_weight)
        return score if score < self.ceiling else self.ceiling

    def __missing__(self, node: str) -> orjson.Fragment:
        known = node in self._tables.known
        fragment = self._tables.priorities.get(node, self.score(node), keep=known)
        if known:
            self[node] = fragment
        return fragment


class ScoreTables:
    """The live tables, by key, and the per-resource index that invalidates them."""

    def __init__(
        self,
        *,
        known: Mapping[str, object],
        used_by_resource: Mapping[str, Mapping[str, int]],
        allocatable_by_resource: Mapping[str, Mapping[str, int]],
    ) -> None:
        self.known = known
        self._used = used_by_resource
        self._allocatable = allocatable_by_resource
        self.priorities = HostPriorities()
        self._tables: OrderedDict[TableKey, ScoreTable] = OrderedDict()
        # Every node MIN_SCORE: the answer for pods arbiter has no opinion on.
        self.no_opinion = ScoreTable(self, ("", 0, 0, 0, MIN_SCORE))

    def used(self, resource: str) -> Mapping[str, int]:
        return self._used.get(resource, _EMPTY)

    def allocatable(self, resource: str) -> Mapping[str, int]:
        return self._allocatable.get(resource, _EMPTY)

    def table(self, resource: str, requested: int, binpack_weight: int,
              total_weight: int, ceiling: int = MAX_SCORE) -> ScoreTable:
        key = (resource, requested, binpack_weight, total_weight, ceiling)
        found = self._tables.get(key)
        if found is not None:
            self._tables.move_to_end(key)
            return found
        found = self._tables[key] = ScoreTable(self, key)
        if len(self._tables) > MAX_TABLES:
            self._tables.popitem(last=False)
        return found

    def usage_changed(self, resource: str, node: str) -> None:
        """What the pods on `node` request of `resource` changed."""
        for table in self._tables.values():
            if table.resource == resource:
                table.pop(node, None)

    def node_changed(self, node: str) -> None:
        """The node was added, deleted or resized."""
        self.priorities.forget(node)
        self.no_opinion.pop(node, None)
        for table in self._tables.values():
            table.pop(node, None)

    def clear(self) -> None:
        self._tables.clear()
        self.no_opinion.clear()
        self.priorities = HostPriorities()

    def __len__(self) -> int:
        return len(self._tables)


_EMPTY: Mapping[str, int] = {}
