"""What every admission engine answers (DESIGN §4, §10, §11): the `Engine` contract.

Pure: no I/O. The flat engine (`arbiter.core.engine.flat.AdmissionEngine`)
and the tree engine (`arbiter.core.engine.tree.HierarchicalEngine`) both
satisfy it, checked by mypy in `arbiter.core.engine`; callers that may hold
either type against it, and get one from `new_engine`.
"""

from __future__ import annotations

from collections.abc import Iterable
from fractions import Fraction
from typing import Protocol

from arbiter.core.model import Node, Placement, Pool, QueueSpec, Unit
from arbiter.core.placement import NodeView
from arbiter.core.resources import Resources

__all__ = ["Engine"]


class Engine(Protocol):
    """Queues, units and decisions; nodes and plans once nodes are given."""

    # -- configuration and units ---------------------------------------------------
    def set_capacity(self, capacity: Resources) -> None:
        """Replace the cluster capacity."""

    def add_queue(self, spec: QueueSpec) -> None:
        """Add `spec`, or replace the queue of the same name (its units stay)."""

    def remove_queue(self, name: str) -> None:
        """Forget the queue's spec: its units stay but are never admitted."""

    def add_pending(self, unit: Unit) -> None:
        """A unit waiting for admission (replaces a pending one of the same key)."""

    def remove_pending(self, key: str) -> None:
        """Drop a pending unit; unknown keys are ignored."""

    def add_admitted(self, unit: Unit, placement: Placement | None = None) -> None:
        """A unit already admitted; with `placement` its pods count on those nodes."""

    def release(self, key: str) -> None:
        """An admitted unit is gone; unknown keys are ignored."""

    # -- decisions -----------------------------------------------------------------
    def next(self) -> Unit | None:
        """Admit the next unit and return it; None when nothing fits."""

    def admit_all(self) -> list[Unit]:
        """Admit until nothing fits; the admitted units in order."""

    # -- queries -------------------------------------------------------------------
    def capacity(self) -> Resources: ...
    def free(self) -> Resources: ...
    def allocated(self, queue: str) -> Resources: ...
    def spec(self, queue: str) -> QueueSpec | None: ...

    def pending(self, queue: str) -> list[Unit]:
        """Pending units of `queue` in queue order."""

    def admitted(self, queue: str) -> list[Unit]: ...
    def admitted_count(self, queue: str) -> int: ...
    def is_pending(self, key: str) -> bool: ...
    def is_admitted(self, key: str) -> bool: ...
    def dominant_share(self, queue: str) -> Fraction: ...

    def explain(self, queue: str) -> str:
        """Why the head of `queue` waits; "" when nothing waits."""

    def explain_unit(self, key: str) -> str:
        """Why the pending unit `key` waits; "" when it is not pending."""

    # -- nodes and plans (DESIGN §10) ------------------------------------------------
    def set_nodes(self, nodes: Iterable[Node] | None, pools: Iterable[Pool] = ()) -> None:
        """Replace the nodes (None: aggregate fit only); plans count again."""

    def set_node_used(self, name: str, used: Resources) -> None:
        """What node `name` runs that no plan accounts for changed."""

    def plan(self, key: str) -> Placement | None:
        """Where the admitted unit `key` goes (None: no plan)."""

    def replan(self, key: str, placement: Placement) -> None:
        """The admitted unit's pods go elsewhere (they bound to other nodes)."""

    def plans(self) -> dict[str, Placement]: ...
    def pool_usage(self) -> dict[str, tuple[Resources, Resources]]: ...
    def pool_of(self, node: str) -> str | None: ...

    def node_view(self) -> NodeView | None:
        """The nodes for reclaim's node fit (None: no nodes)."""
