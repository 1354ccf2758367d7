"""Which queues a namespace may use (DESIGN §3, §13): the one rule that the
webhook (every workload and reservation) and the admission loop (every
unit, again) both apply, through `ClusterStore.queue_admits`.

A Queue admits a namespace that it lists in `spec.namespaces`, that its
`spec.namespaceSelector` matches, or whose own `arbiter.dev/queue` label
names it (only an admin can label a namespace). A Queue with neither
`spec.namespaces` nor `spec.namespaceSelector` is *open*: it admits every
managed namespace. That keeps queues created before the fields existed
usable (a shared queue, as before); an admin restricts a queue by listing
or selecting its namespaces. An open queue does not make a namespace
managed in `listed` mode: only an explicit admission does.
"""

from __future__ import annotations

from collections.abc import Iterable

from arbiter.cache.records import NamespaceRecord, QueueRecord

# Queue names a denial shows before "and N more": messages stay bounded.
SHOWN_QUEUES = 5


def open_queue(queue: QueueRecord) -> bool:
    """A queue that names no namespaces: every managed namespace may use it."""
    return not queue.namespaces and queue.namespace_selector is None


def names_namespace(queue: QueueRecord, namespace: str, record: NamespaceRecord | None) -> bool:
    """`queue` admits `namespace` explicitly: by name, by its labels, or by
    the namespace's own queue label (`record`: the namespace, if known)."""
    if namespace in queue.namespaces:
        return True
    if record is None:
        return False
    if record.queue_label == queue.name:
        return True
    selector = queue.namespace_selector
    return selector is not None and selector.matches(record.labels)


class AccessIndex:
    """The Queues' admission rules, indexed for `admitting`: namespace ->
    the queues listing it, and the queues with a selector (only those are
    matched one by one). Built once per change of what the Queues admit."""

    __slots__ = ("listing", "queues", "selecting")

    def __init__(self, queues: Iterable[QueueRecord]) -> None:
        listing: dict[str, list[str]] = {}
        selecting: list[QueueRecord] = []
        names: set[str] = set()
        for queue in queues:
            names.add(queue.name)
            for namespace in queue.namespaces:
                listing.setdefault(namespace, []).append(queue.name)
            if queue.namespace_selector is not None:
                selecting.append(queue)
        self.listing = {namespace: tuple(found) for namespace, found in listing.items()}
        self.selecting = tuple(selecting)
        self.queues = frozenset(names)

    def admitting(self, namespace: str, record: NamespaceRecord | None) -> tuple[str, ...]:
        """The names of the queues that admit `namespace` explicitly
        (`names_namespace`), sorted; O(queues with a selector)."""
        found = set(self.listing.get(namespace, ()))
        if record is not None:
            if record.queue_label is not None and record.queue_label in self.queues:
                found.add(record.queue_label)
            labels = record.labels
            for queue in self.selecting:
                selector = queue.namespace_selector
                if selector is not None and selector.matches(labels):
                    found.add(queue.name)
        return tuple(sorted(found))


def queue_list(names: list[str]) -> str:
    """`"a", "b" and 3 more`: at most SHOWN_QUEUES names."""
    shown = ", ".join(f'"{name}"' for name in names[:SHOWN_QUEUES])
    more = len(names) - SHOWN_QUEUES
    return f"{shown} and {more} more" if more > 0 else shown
