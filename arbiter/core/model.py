"""What the engine decides about: queues, units (with their pod sets), nodes, pools.

Pure data, no I/O. Split from `fairshare` so that `deserved` and `placement`
can use the same types without importing the engine.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal, Protocol

from arbiter.core.resources import EMPTY, Resources

__all__ = [
    "CHILD_ORDERS",
    "DEFAULT_POOL",
    "MAIN_POD_SET",
    "QUEUE_POLICIES",
    "ChildOrder",
    "CountedPods",
    "Node",
    "Placement",
    "PodSet",
    "Pool",
    "QueuePolicy",
    "QueueSpec",
    "Unit",
    "demand_of",
]

QueuePolicy = Literal["Priority", "FIFO"]
QUEUE_POLICIES: tuple[QueuePolicy, ...] = ("Priority", "FIFO")
# How a parent orders its subtree (DESIGN §11): H-DRF among its children, or
# its subtree's units as one queue (the children then act as quotas).
ChildOrder = Literal["Fair", "Queue"]
CHILD_ORDERS: tuple[ChildOrder, ...] = ("Fair", "Queue")

DEFAULT_POOL = "default"  # the nodes no Pool selects (DESIGN §10)
MAIN_POD_SET = "main"  # the one pod set of a unit given without pod sets


def _labels(value: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(value.items()))


@dataclass(frozen=True, slots=True)
class QueueSpec:
    """A tenant's queue as the engine sees it.

    `pools`: the pools its work may use, in order of preference (empty: every
    pool by name, `default` last). `node_selector` (matchLabels) narrows the
    nodes further. Both only matter once the engine has nodes.

    `parent` places it in a tree of queues (DESIGN §11); `child_order` only
    matters on a queue that has children.
    """

    name: str
    weight: int = 1  # > 0
    guarantee: Resources = EMPTY
    capability: Resources = EMPTY  # resources absent from capability are unlimited
    blocking: bool = False
    policy: QueuePolicy = "Priority"
    pools: tuple[str, ...] = ()
    node_selector: Mapping[str, str] = field(default_factory=dict, hash=False)
    parent: str | None = None
    child_order: ChildOrder = "Fair"

    def __post_init__(self) -> None:
        if isinstance(self.weight, bool) or not isinstance(self.weight, int) or self.weight <= 0:
            raise ValueError(f"queue {self.name}: weight must be a positive integer")
        if self.policy not in QUEUE_POLICIES:
            raise ValueError(f"queue {self.name}: policy must be Priority or FIFO")
        if self.child_order not in CHILD_ORDERS:
            raise ValueError(f"queue {self.name}: childOrder must be Fair or Queue")

    def selector_key(self) -> tuple[tuple[str, str], ...]:
        return _labels(self.node_selector)


@dataclass(frozen=True, slots=True)
class PodSet:
    """`count` identical pods, each requesting `requests`; with `min_count`,
    as few as that may be admitted when all do not fit (arbiter.core.partial)."""

    name: str
    count: int
    requests: Resources
    min_count: int | None = None

    def __post_init__(self) -> None:
        if self.count < 0:
            raise ValueError(f"pod set {self.name}: count must not be negative")


class CountedPods(Protocol):
    """`count` pods each requesting `requests` (a pod set, in any layer)."""

    @property
    def count(self) -> int: ...
    @property
    def requests(self) -> Resources: ...


@functools.lru_cache(maxsize=4096)
def demand_of(pod_sets: tuple[CountedPods, ...]) -> Resources:
    """Total demand of some pod sets (memoised: most units share a few shapes);
    the engine's PodSet and the cache's record alike."""
    total = EMPTY
    for pod_set in pod_sets:
        total = total + pod_set.requests.scale(pod_set.count)
    return total


@dataclass(frozen=True, slots=True)
class Unit:
    """The unit of admission: one Job, pod, pod group or reservation.

    `demand` is what it counts for in fair share. `pods` says how that demand
    is split into pods for node fit; without pod sets the unit is one pod
    (pod set `main`) requesting its whole demand.
    """

    key: str  # unique across all queues, e.g. "ns/name"
    queue: str
    demand: Resources
    priority: int = 0
    created: float = 0.0
    pods: tuple[PodSet, ...] = ()

    def __post_init__(self) -> None:
        if any(amount < 0 for amount in self.demand.values()):
            raise ValueError(f"unit {self.key}: demand must not be negative")


@dataclass(frozen=True, slots=True)
class Node:
    """A Ready, schedulable node (the caller filters the others out).

    `used`: what runs on it that the engine holds no plan for (unmanaged pods,
    bound pods of units it does not know); planned pods of admitted units are
    counted by the engine itself.
    """

    name: str
    labels: Mapping[str, str] = field(default_factory=dict, hash=False)
    allocatable: Resources = EMPTY
    used: Resources = EMPTY


@dataclass(frozen=True, slots=True)
class Pool:
    """A named set of nodes: those whose labels include every `node_selector` pair."""

    name: str
    node_selector: Mapping[str, str] = field(default_factory=dict, hash=False)

    def selects(self, labels: Mapping[str, str]) -> bool:
        return all(labels.get(k) == v for k, v in self.node_selector.items())


@dataclass(frozen=True, slots=True)
class Placement:
    """Where an admitted unit's pods go: its pool and one node per pod, per pod set."""

    pool: str
    nodes: Mapping[str, tuple[str, ...]] = field(default_factory=dict, hash=False)
