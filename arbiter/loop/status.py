"""What the loop tells the world: Queue status, QueueUnit positions, metrics.

`queue_views` is the one summary of the engine's state; Queue status, the
`arbiter_queue_*` metrics and the debug API are all rendered from it, so
they agree by construction. Writes are rate-limited twice: an object is
written at most once per `status_interval`, only when its content changed,
and all status writes together stay under `status_qps`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from arbiter.base import metrics
from arbiter.base.kubeapi import ClusterApi, Conflict, NotFound, queue_path
from arbiter.base.ratelimit import Throttle
from arbiter.cache.records import QueueRecord
from arbiter.core.api import format_rfc3339
from arbiter.core.deserved import hierarchical_deserved
from arbiter.core.engine.flat import format_share
from arbiter.core.model import Unit
from arbiter.core.quantities import MILLI_RESOURCES
from arbiter.core.resources import EMPTY, Resources
from arbiter.loop.mirror import EngineMirror, queue_spec

TOP_PENDING = 10


@dataclass(frozen=True, slots=True)
class PendingEntry:
    namespace: str
    name: str
    priority: int
    position: int

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "namespace": self.namespace,
                "priority": self.priority, "position": self.position}


@dataclass(frozen=True, slots=True)
class QueueView:
    name: str
    state: str
    weight: int
    allocated: Resources
    deserved: Resources
    dominant_share: Fraction
    pending: int
    admitted: int
    pending_units: tuple[PendingEntry, ...]
    reason: str = ""
    # Per pool: what its admitted units hold there (PoolShare.to_json each).
    pools: tuple[Mapping[str, Any], ...] = ()
    # On a parent (DESIGN §11): its subtree's (allocated, deserved).
    subtree: tuple[Resources, Resources] | None = None
    parent: str = ""  # spec.parent ("" at the top)
    # Bound pods charged to this queue that no admitted unit covers
    # (DESIGN §13; part of `allocated` already), and how many.
    unqueued: Resources = EMPTY
    unqueued_pods: int = 0

    def status(self) -> dict[str, Any]:
        """Queue `.status` without conditions (those carry transition times).

        The summaries are for `kubectl get queues` (printer columns cannot
        format a map); absent when empty, so kubectl shows `<none>`.
        """
        status: dict[str, Any] = {
            "allocated": self.allocated.to_quantities(),
            "deserved": self.deserved.to_quantities(),
            "dominantShare": format_share(self.dominant_share),
            "pending": self.pending,
            "admitted": self.admitted,
            "pendingUnits": [entry.to_json() for entry in self.pending_units],
            "unqueued": self.unqueued.to_quantities(),
            "unqueuedPods": self.unqueued_pods,
        }
        if self.pools:
            status["pools"] = [dict(share) for share in self.pools]
        if self.subtree is not None:
            status["subtree"] = {"allocated": self.subtree[0].to_quantities(),
                                 "deserved": self.subtree[1].to_quantities()}
        add_summaries(status, allocatedSummary=self.allocated, deservedSummary=self.deserved)
        return status

    def to_json(self) -> dict[str, Any]:
        """The debug API's view: the status plus what explains it."""
        return {"name": self.name, "state": self.state, "weight": self.weight,
                **self.status(), "reason": self.reason}


def summary(resources: Resources) -> str:
    """A ResourceList as one line, `cpu=3,memory=12Gi`: names sorted,
    quantities canonical; "" when empty."""
    return ",".join(f"{name}={quantity}"
                    for name, quantity in sorted(resources.to_quantities().items()))


def add_summaries(status: dict[str, Any], **summaries: Resources) -> None:
    """Adds each non-empty summary line to `status` under its key (absent when
    empty, so kubectl shows `<none>`)."""
    for key, resources in summaries.items():
        if text := summary(resources):
            status[key] = text


def split_key(key: str) -> tuple[str, str]:
    namespace, _, name = key.partition("/")
    return namespace, name


def queue_views(
    mirror: EngineMirror,
    *,
    top: int = TOP_PENDING,
    waiting: Mapping[str, list[Unit]] | None = None,
    pools: Mapping[str, tuple[Mapping[str, Any], ...]] | None = None,
) -> dict[str, QueueView]:
    """The state of every known queue, from the engine (`waiting`: each
    queue's waiting units in order, when the caller has them already;
    `pools`: each queue's per-pool usage, when nodes are known)."""
    engine = mirror.engine
    deserved = mirror.deserved()
    subtrees = subtree_totals(mirror)
    views: dict[str, QueueView] = {}
    for name, queue in sorted(mirror.queues.items()):
        ordered = (waiting.get(name, []) if waiting is not None
                   else mirror.waiting_units(name))
        entries = []
        for position, unit in enumerate(ordered[:top], start=1):
            namespace, unit_name = split_key(unit.key)
            entries.append(PendingEntry(namespace, unit_name, unit.priority, position))
        reason = ""
        if queue.state == "Closed":
            reason = "queue is Closed: it admits nothing"
        elif ordered:
            reason = engine.explain(name)
        views[name] = QueueView(
            name=name,
            state=queue.state,
            weight=queue.weight,
            allocated=engine.allocated(name),
            deserved=deserved.get(name, EMPTY),
            dominant_share=engine.dominant_share(name),
            pending=mirror.waiting.get(name, 0),
            admitted=mirror.admitted.get(name, 0),
            pending_units=tuple(entries),
            reason=reason,
            pools=pools.get(name, ()) if pools is not None else (),
            subtree=subtrees.get(name),
            parent=queue.parent or "",
            unqueued=mirror.unqueued.get(name, EMPTY),
            unqueued_pods=mirror.unqueued_pods.get(name, 0),
        )
    return views


def subtree_totals(mirror: EngineMirror) -> dict[str, tuple[Resources, Resources]]:
    """Per parent queue: (its subtree's allocated, its subtree's deserved by
    water-filling per level, DESIGN §11). Empty when no queue has a parent."""
    queues = mirror.queues
    children: dict[str, list[str]] = {}
    for record in queues.values():
        if record.parent:
            children.setdefault(record.parent, []).append(record.name)
    if not children:
        return {}
    fair = hierarchical_deserved(mirror.engine_capacity(),
                                 [queue_spec(q) for q in queues.values()], mirror.demand())
    out: dict[str, tuple[Resources, Resources]] = {}
    for parent in children:
        if parent not in queues:
            continue
        total, stack, seen = EMPTY, [parent], {parent}
        while stack:
            name = stack.pop()
            total = total + mirror.engine.allocated(name)
            for child in children.get(name, ()):
                if child not in seen:  # a cycle is denied, but never loop on one
                    seen.add(child)
                    stack.append(child)
        out[parent] = (total, fair.get(parent, EMPTY))
    return out


def positions(
    mirror: EngineMirror,
    *,
    waiting: Mapping[str, list[Unit]] | None = None,
    depth: int | None = None,
) -> dict[str, int]:
    """Position (1-based) of every waiting unit in its queue (the first
    `depth` of each queue only, when given)."""
    out: dict[str, int] = {}
    for name in mirror.queues:
        if not mirror.waiting.get(name):
            continue
        ordered = waiting.get(name, []) if waiting is not None else mirror.waiting_units(name)
        for position, unit in enumerate(ordered[:depth], start=1):
            out[unit.key] = position
    return out


# -- metrics ---------------------------------------------------------------------------


def metric_amount(resource: str, amount: int) -> float:
    """Base units for Prometheus: cores for cpu (held in millicores)."""
    return amount / 1000 if resource in MILLI_RESOURCES else float(amount)


class ResourceGauges:
    """Gauges labelled (name, resource), one amount each per name; the label
    sets of names and resources that went are removed (a stale series
    would read as a value)."""

    def __init__(self, *gauges: Any) -> None:
        self.gauges = gauges
        self._resources: dict[str, set[str]] = {}

    def update(self, amounts: Mapping[str, Sequence[Resources]]) -> list[str]:
        """Set every gauge of every name (`amounts[name][i]` for gauge i);
        returns the names that went."""
        gone = [n for n in self._resources if n not in amounts]
        for name in gone:
            for resource in self._resources.pop(name):
                for gauge in self.gauges:
                    _remove(gauge, name, resource)
        for name, values in amounts.items():
            resources = set().union(*values)
            for resource in self._resources.get(name, set()) | resources:
                for gauge, value in zip(self.gauges, values, strict=True):
                    gauge.labels(name, resource).set(
                        metric_amount(resource, value.get_amount(resource)))
            self._resources[name] = self._resources.get(name, set()) | resources
        return gone


class QueueMetrics:
    """Sets the per-queue gauges; label sets of queues that went are removed."""

    def __init__(self) -> None:
        self._amounts = ResourceGauges(metrics.queue_allocated, metrics.queue_deserved,
                                       metrics.queue_unqueued)
        self._parents: dict[str, str] = {}  # the parent label each queue's info carries

    def update(self, views: Mapping[str, QueueView]) -> None:
        gone = self._amounts.update({name: (view.allocated, view.deserved, view.unqueued)
                                     for name, view in views.items()})
        for name in gone:
            _remove(metrics.queue_dominant_share, name)
            _remove(metrics.queue_pending_units, name)
        for name, view in views.items():
            metrics.queue_dominant_share.labels(name).set(float(view.dominant_share))
            metrics.queue_pending_units.labels(name).set(view.pending)
        for name, parent in list(self._parents.items()):
            now = views.get(name)
            if now is None or now.parent != parent:
                _remove(metrics.queue_info, name, parent)
                del self._parents[name]
        for name, view in views.items():
            metrics.queue_info.labels(name, view.parent).set(1)
            self._parents[name] = view.parent


def _remove(gauge: Any, *labels: str) -> None:
    with contextlib.suppress(KeyError):
        gauge.remove(*labels)


# -- Queue status ------------------------------------------------------------------------


class QueueStatusWriter:
    """Writes Queue `.status` from views, guarded by resourceVersion."""

    def __init__(self, api: ClusterApi, *, interval: float, conflict_retries: int = 3) -> None:
        self.api = api
        self.throttle = Throttle(interval)
        self.conflict_retries = conflict_retries
        self._conditions: dict[str, tuple[tuple[str, str, str], str]] = {}
        # Queue -> (resourceVersion our last write was based on, the one it
        # returned): until the watch brings our write, the cache's version
        # is the old one and a write based on it conflicts.
        self._written: dict[str, tuple[str, str]] = {}

    def conditions(self, view: QueueView, now: float) -> list[dict[str, Any]]:
        if view.state == "Closed":
            status, reason = "False", "Closed"
        elif view.pending and view.reason:
            status, reason = "True", "Waiting"
        else:
            status, reason = "True", "Open"
        message = view.reason
        ident = (status, reason, message)
        known = self._conditions.get(view.name)
        since = known[1] if known is not None and known[0][:2] == ident[:2] else format_rfc3339(now)
        self._conditions[view.name] = (ident, since)
        return [{"type": "Admitting", "status": status, "reason": reason,
                 "message": message, "lastTransitionTime": since}]

    def due(self, views: Mapping[str, QueueView], now: float) -> list[QueueView]:
        return [v for v in views.values() if self.throttle.due(v.name, v.status()
                                                                | {"reason": v.reason}, now)]

    async def write(self, view: QueueView, record: QueueRecord | None, now: float) -> bool:
        """One Queue's status; False if the Queue is gone."""
        content = view.status() | {"reason": view.reason}
        status = view.status()
        status["conditions"] = self.conditions(view, now)
        version = record.resource_version if record is not None else ""
        based, returned = self._written.get(view.name, ("", ""))
        if version and version == based:
            version = returned
        for _ in range(self.conflict_retries + 1):
            try:
                if not version:  # never a blind write: learn the current version
                    fresh = await self.api.get(queue_path(view.name))
                    version = str((fresh.get("metadata") or {}).get("resourceVersion", ""))
                # The whole status is replaced (a JSON Patch), not merged: a
                # merge patch cannot drop a resource that left `allocated` or
                # `deserved` without naming it, so a queue that emptied kept
                # its last values. Arbiter is the only writer of Queue status
                # and writes every field of it. The patched resourceVersion
                # is a precondition (409 when someone wrote first), as it was
                # in the merge patch.
                ops: list[dict[str, Any]] = [
                    {"op": "replace", "path": "/metadata/resourceVersion", "value": version},
                    {"op": "add", "path": "/status", "value": status}]
                written = await self.api.json_patch(queue_path(view.name, status=True), ops)
                self._written[view.name] = (
                    version, str((written.get("metadata") or {}).get("resourceVersion", "")))
                self.throttle.written(view.name, content, now)
                return True
            except NotFound:
                return False
            except Conflict:
                version = ""
        return False
