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


def admitting(queues: Iterable[QueueRecord], namespace: str,
              record: NamespaceRecord | None) -> tuple[str, ...]:
    """The names of the queues that admit `namespace` explicitly, sorted."""
    return tuple(sorted(q.name for q in queues if names_namespace(q, namespace, record)))


def queue_list(names: list[str]) -> str:
    """`"a", "b" and 3 more`: at most SHOWN_QUEUES names."""
    shown = ", ".join(f'"{name}"' for name in names[:SHOWN_QUEUES])
    more = len(names) - SHOWN_QUEUES
    return f"{shown} and {more} more" if more > 0 else shown
