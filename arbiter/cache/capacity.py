"""The cluster's capacity, kept as nodes and pods change so that reading it
is O(resource names) (`ClusterStore.capacity`).

Capacity is the allocatable of counted nodes (Ready, schedulable) minus
the requests of the unmanaged Pending or Running pods on them. A pod is
unmanaged load when it carries no queue label, or when its namespace is
one arbiter does not manage: its label then charges it to no queue (the
loop charges managed namespaces only), so it must come off the capacity.

That second verdict belongs to the namespace and can change after a pod
was counted (a namespace labelled out, a Queue's namespaces edited). Each
namespace's labelled pods are therefore counted with the verdict recorded
for it, indexed by namespace; when the verdict changes exactly those pods
are counted again, never every pod.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from arbiter.cache.records import NodeRecord, PodRecord
from arbiter.core.resources import Resources

# Phases in which a pod holds its node's resources.
ACTIVE_POD_PHASES: frozenset[str] = frozenset({"Pending", "Running"})


def counted(node: NodeRecord | None) -> bool:
    """A node whose allocatable is part of the capacity."""
    return node is not None and node.ready and node.schedulable


def add_into(total: dict[str, int], amounts: Mapping[str, int], sign: int) -> None:
    """total += sign * amounts, in place, dropping names that reach zero."""
    for name, value in amounts.items():
        result = total.get(name, 0) + sign * value
        if result:
            total[name] = result
        else:
            total.pop(name, None)


@dataclass(slots=True)
class CapacityLedger:
    nodes: Mapping[str, NodeRecord]  # the store's, live
    pods: Mapping[str, PodRecord]  # the store's, live
    managed: Callable[[str], bool]  # whether arbiter manages a namespace
    # allocatable of counted nodes; unmanaged requests per node (any node
    # name, known or not) and their sum over counted nodes.
    _allocatable: dict[str, int] = field(default_factory=dict)
    _unmanaged_by_node: dict[str, dict[str, int]] = field(default_factory=dict)
    _unmanaged: dict[str, int] = field(default_factory=dict)
    # uid -> node of each pod counted as unmanaged load: what is taken off
    # is what was counted, whatever has changed since.
    _counted_pods: dict[str, str] = field(default_factory=dict)
    # namespace -> its queue-labelled pods, and the managed verdict they
    # were counted with.
    _labelled: dict[str, set[str]] = field(default_factory=dict)
    _verdict: dict[str, bool] = field(default_factory=dict)

    def total(self, overcommit: float = 1.0) -> Resources:
        total = Resources(self._allocatable) - self._unmanaged
        if overcommit != 1.0:
            total = Resources({k: int(v * overcommit) for k, v in total.items()})
        return total.clamp_min(0)

    def count_node(self, node: NodeRecord | None, sign: int) -> None:
        if node is not None and counted(node):
            add_into(self._allocatable, node.allocatable, sign)
            add_into(self._unmanaged, self._unmanaged_by_node.get(node.name, {}), sign)

    def count_pod(self, pod: PodRecord | None, sign: int) -> None:
        if pod is None:
            return
        if pod.queue is not None:
            self._index(pod, sign)
        if sign < 0:
            node_name = self._counted_pods.pop(pod.uid, None)
        else:
            node_name = self._unmanaged_node(pod)
            if node_name is not None:
                self._counted_pods[pod.uid] = node_name
        if node_name is None:
            return
        on_node = self._unmanaged_by_node.setdefault(node_name, {})
        add_into(on_node, pod.requests, sign)
        if not on_node:
            del self._unmanaged_by_node[node_name]
        if counted(self.nodes.get(node_name)):
            add_into(self._unmanaged, pod.requests, sign)

    def namespace_changed(self, namespace: str | None) -> None:
        """`namespace`'s managed verdict may have changed (None: any
        namespace's, a Queue's namespaces changed in `listed` mode): count
        its labelled pods again if it did. O(namespaces with labelled pods
        + the pods of those that changed)."""
        names = list(self._labelled) if namespace is None else [namespace]
        for name in names:
            recorded = self._verdict.get(name)
            if recorded is None or recorded == self.managed(name):
                continue
            uids = list(self._labelled[name])
            for uid in uids:
                self.count_pod(self.pods.get(uid), -1)
            self._verdict[name] = not recorded
            for uid in uids:
                self.count_pod(self.pods.get(uid), +1)

    def _index(self, pod: PodRecord, sign: int) -> None:
        namespace = pod.namespace
        if sign > 0:
            self._labelled.setdefault(namespace, set()).add(pod.uid)
            self._verdict.setdefault(namespace, self.managed(namespace))
            return
        uids = self._labelled.get(namespace)
        if uids is not None:
            uids.discard(pod.uid)
            if not uids:
                del self._labelled[namespace]
                del self._verdict[namespace]

    def _unmanaged_node(self, pod: PodRecord) -> str | None:
        """The node whose capacity `pod` takes as unmanaged work, if any."""
        if not pod.node_name or pod.phase not in ACTIVE_POD_PHASES:
            return None
        if pod.queue is not None and self._verdict.get(pod.namespace, False):
            return None
        return pod.node_name
