"""Pools as the world sees them (DESIGN §10): Pool status, each Queue's
per-pool usage, the `arbiter_pool_*` metrics. Rendered from the engine's
plans, so they agree with admission by construction; written rate-limited
like Queue status (an object at most once per interval, only when changed).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from arbiter.base import metrics
from arbiter.base.kubeapi import ClusterApi, NotFound
from arbiter.base.ratelimit import Throttle
from arbiter.core.api import POOL
from arbiter.core.resources import EMPTY, Resources
from arbiter.loop.mirror import EngineMirror
from arbiter.loop.status import ResourceGauges, add_summaries


@dataclass(frozen=True, slots=True)
class PoolView:
    name: str
    nodes: int
    capacity: Resources
    allocated: Resources

    def status(self) -> dict[str, Any]:
        status: dict[str, Any] = {"nodes": self.nodes,
                                  "capacity": self.capacity.to_quantities(),
                                  "allocated": self.allocated.to_quantities()}
        add_summaries(status, capacitySummary=self.capacity, allocatedSummary=self.allocated)
        return status

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, **self.status()}


@dataclass(frozen=True, slots=True)
class PoolShare:
    """What one queue's admitted units hold in one pool."""

    pool: str
    admitted: int
    allocated: Resources

    def to_json(self) -> dict[str, Any]:
        return {"name": self.pool, "admitted": self.admitted,
                "allocated": self.allocated.to_quantities()}


def pool_views(mirror: EngineMirror) -> dict[str, PoolView]:
    """Every pool the engine places into (none before it has nodes). O(nodes + plans)."""
    engine = mirror.engine
    counts = mirror.nodes.nodes_by_pool(engine.pool_of)
    return {name: PoolView(name, counts.get(name, 0), capacity, allocated)
            for name, (capacity, allocated) in sorted(engine.pool_usage().items())}


def queue_pools(mirror: EngineMirror) -> dict[str, tuple[PoolShare, ...]]:
    """Per queue, per pool: its admitted units with a plan there. O(plans)."""
    held: dict[str, dict[str, tuple[int, Resources]]] = {}
    for key, plan in mirror.engine.plans().items():
        entry = mirror.entries.get(key)
        if entry is None:
            continue
        unit = entry[1]
        pools = held.setdefault(unit.queue, {})
        count, total = pools.get(plan.pool, (0, EMPTY))
        pools[plan.pool] = (count + 1, total + unit.demand)
    return {queue: tuple(PoolShare(pool, count, total)
                         for pool, (count, total) in sorted(pools.items()))
            for queue, pools in held.items()}


def pool_path(name: str, *, status: bool = False) -> str:
    return f"{POOL.path}/{name}" + ("/status" if status else "")


class PoolStatusWriter:
    """Writes Pool `.status` (arbiter is its only writer: the whole status
    is replaced, so a resource that left is dropped)."""

    def __init__(self, api: ClusterApi, *, interval: float) -> None:
        self.api = api
        self.throttle = Throttle(interval)

    def due(self, views: Mapping[str, PoolView], exists: Mapping[str, object],
            now: float) -> list[PoolView]:
        """Views of Pool objects (not `default`: no object) whose status is due."""
        return [v for v in views.values()
                if v.name in exists and self.throttle.due(v.name, v.status(), now)]

    async def write(self, view: PoolView, now: float) -> bool:
        """One Pool's status; False if the Pool is gone."""
        status = view.status()
        try:
            await self.api.json_patch(pool_path(view.name, status=True),
                                      [{"op": "add", "path": "/status", "value": status}])
        except NotFound:
            return False
        self.throttle.written(view.name, status, now)
        return True


class PoolMetrics:
    """`arbiter_pool_capacity` / `arbiter_pool_allocated`."""

    def __init__(self) -> None:
        self._amounts = ResourceGauges(metrics.pool_capacity, metrics.pool_allocated)

    def update(self, views: Mapping[str, PoolView]) -> None:
        self._amounts.update({name: (view.capacity, view.allocated)
                              for name, view in views.items()})
