"""Which nodes a label selector matches, kept current as nodes change.

filter confines a queue's pods to the nodes its `spec.nodeSelector`
matches. Matching every candidate's labels on every call costs ~10 ms at
5,000 nodes; instead each distinct selector in use keeps the set of node
names it matches, built once (O(nodes)) and then updated per node event
(O(selectors in use)). A request then does one set membership per
candidate node, in C (`filter(matching.__contains__, names)`).

Sets are made on first use and dropped with `retain` once no Queue uses
their selector any more, so their number stays that of distinct selectors.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Set

from arbiter.cache.records import NodeRecord

Selector = tuple[tuple[str, str], ...]
Labels = frozenset[tuple[str, str]]


def selector_key(selector: Iterable[tuple[str, str]]) -> Labels:
    """A selector as a set of pairs: it matches a node whose labels include them all."""
    return frozenset(selector)


class SelectorNodeSets:
    """Per known node its labels as pairs; per selector in use the nodes it matches."""

    def __init__(self, nodes: Mapping[str, NodeRecord]) -> None:
        self._nodes = nodes
        self._labels: dict[str, Labels] = {}
        # The record's labels tuple the pairs were made from: a node update
        # that leaves the labels alone (a heartbeat) costs one comparison.
        self._raw: dict[str, tuple[tuple[str, str], ...]] = {}
        self._sets: dict[Labels, set[str]] = {}

    def rebuild(self) -> None:
        self._labels.clear()
        self._raw.clear()
        self._sets.clear()
        for name in self._nodes:
            self.update(name)

    def update(self, name: str) -> None:
        """Node `name` was added, changed or deleted in the store."""
        record = self._nodes.get(name)
        if record is None:
            if self._raw.pop(name, None) is not None:
                del self._labels[name]
                for members in self._sets.values():
                    members.discard(name)
            return
        if self._raw.get(name) == record.labels:
            return
        labels = frozenset(record.labels)
        self._raw[name] = record.labels
        self._labels[name] = labels
        for key, members in self._sets.items():
            if key <= labels:
                members.add(name)
            else:
                members.discard(name)

    def labels(self, name: str) -> Labels | None:
        """The node's labels as pairs; None for a node the store does not hold."""
        return self._labels.get(name)

    def matching(self, selector: Iterable[tuple[str, str]]) -> Set[str]:
        """Names of the known nodes whose labels include every pair of `selector`.

        The set is live (updated in place as nodes change): read it within
        one request, do not keep it."""
        key = selector_key(selector)
        members = self._sets.get(key)
        if members is None:
            members = {name for name, labels in self._labels.items() if key <= labels}
            self._sets[key] = members
        return members

    def retain(self, selectors: Iterable[Iterable[tuple[str, str]]]) -> None:
        """Drop the sets of selectors not among `selectors` (those still in use)."""
        keep = {selector_key(selector) for selector in selectors}
        for key in [key for key in self._sets if key not in keep]:
            del self._sets[key]

    def __len__(self) -> int:
        """How many selector sets are kept."""
        return len(self._sets)
