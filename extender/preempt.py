"""preempt: keep kube-scheduler's priority preemption from robbing a tenant
that is within its fair share.

kube-scheduler proposes, per candidate node, the pods it would evict for the
preemptor. A victim is *protected* when:

- it belongs to another queue whose allocation is at or below its deserved
  share (continuous weighted DRF over the queues' demand, as the loop
  computes it for Queue status), or whose Queue is not `reclaimable`;
- or it is in the preemptor's own queue without a lower priority;
- or arbiter does not know it (a UID missing from the cache: whose pod it is
  cannot be told, so it is not given away).

Victims arbiter does not manage (unmanaged namespace) or that are in no
queue (no queue label: created past the webhook) are left to
kube-scheduler's usual priority rules, and so are all victims of an
unmanaged preemptor: system-critical pods must keep their ability to preempt.

A node is kept only if *none* of its victims is protected. kube-scheduler's
victim set for a node is already minimal (it reprieves every pod it can), so
dropping one protected victim and keeping the rest would evict pods for
nothing: the preemptor would still not fit. Nodes outside the preemptor
queue's nodeSelector are dropped, and a preemptor whose unit is not admitted
preempts nothing. The answer is NodeNameToMetaVictims (UIDs only; every UID
is one the scheduler proposed for that node).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Literal

from arbiter.cache.records import PodRecord, QueueRecord
from arbiter.core.api import FINISHED_PHASES
from arbiter.core.deserved import deserved
from arbiter.core.model import QueueSpec
from arbiter.core.resources import EMPTY, Resources
from extender.state import ExtenderState
from extender.wire import ExtenderPreemptionArgs, ExtenderPreemptionResult, MetaVictims, Victim

log = logging.getLogger(__name__)

PreemptVerdict = Literal["unmanaged", "allowed", "blocked"]


@dataclass(frozen=True, slots=True)
class PreemptOutcome:
    result: ExtenderPreemptionResult
    verdict: PreemptVerdict
    # node -> why its candidacy was dropped (for logs and tests).
    dropped: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class FairShareView:
    """Per queue: what its admitted units hold, and what it deserves."""

    allocated: dict[str, Resources]
    deserved: dict[str, Resources]

    def within_deserved(self, queue: str) -> bool:
        """At or below its deserved share on every resource."""
        return self.allocated.get(queue, EMPTY).fits_in(self.deserved.get(queue, EMPTY))


def fair_share_view(state: ExtenderState) -> FairShareView:
    """Allocated = admitted units' demand; demand = admitted + waiting units'."""
    store = state.store
    allocated: dict[str, Resources] = {}
    demand: dict[str, Resources] = {}
    for unit in store.units.values():
        if unit.phase in FINISHED_PHASES or unit.queue not in store.queues:
            continue
        amount = unit.demand
        demand[unit.queue] = demand.get(unit.queue, EMPTY) + amount
        if unit.admitted:
            allocated[unit.queue] = allocated.get(unit.queue, EMPTY) + amount
    specs = [
        QueueSpec(
            name=queue.name,
            weight=queue.weight,
            guarantee=queue.guarantee,
            capability=queue.capability,
            blocking=queue.blocking,
            policy=queue.policy,
        )
        for queue in store.queues.values()
    ]
    shares = deserved(store.capacity(state.overcommit), specs, demand)
    return FairShareView(allocated=allocated, deserved=dict(shares))


class _Judge:
    """Decides victims for one preemptor; computes the fair-share view at most once."""

    def __init__(self, state: ExtenderState, preemptor: PodRecord) -> None:
        self.state = state
        self.preemptor = preemptor
        self._view: FairShareView | None = None

    def view(self) -> FairShareView:
        if self._view is None:
            self._view = fair_share_view(self.state)
        return self._view

    def protection(self, victim: Victim) -> str | None:
        """Why `victim` may not be evicted for the preemptor; None when it may."""
        state = self.state
        pod = victim.pod or state.store.pods.get(victim.uid)
        if pod is None:
            return f"victim {victim.uid} is not in arbiter's cache"
        if not state.is_managed(pod) or pod.queue is None:
            return None  # no queue label: counted in no queue, no share to keep
        who = f"{pod.namespace}/{pod.name}"
        if pod.queue == self.preemptor.queue:
            if pod.priority < self.preemptor.priority:
                return None
            return f"victim {who} is in the preemptor's queue without a lower priority"
        queue = state.store.queues.get(pod.queue)
        if queue is None:
            return None  # its label names no Queue: no fair-share promise to keep
        if not queue.reclaimable:
            return f'victim {who} is in queue "{queue.name}", which is not reclaimable'
        if self.view().within_deserved(queue.name):
            return f'victim {who} is in queue "{queue.name}", which is within its deserved share'
        return None


def _outside_selector(state: ExtenderState, queue: QueueRecord, node: str) -> str | None:
    if not queue.node_selector:
        return None
    labels = state.node_labels(node)
    if labels is None:
        return f"node {node} is not in arbiter's cache"
    if not frozenset(queue.node_selector) <= labels:
        return f'node {node} does not match queue "{queue.name}"\'s nodeSelector'
    return None


def _meta(victims: tuple[Victim, ...], pdb_violations: int) -> MetaVictims:
    return {
        "Pods": [{"UID": victim.uid} for victim in victims],
        # The scheduler counted these for the whole set; never more than the pods kept.
        "NumPDBViolations": min(pdb_violations, len(victims)),
    }


def preempt(state: ExtenderState, args: ExtenderPreemptionArgs) -> PreemptOutcome:
    pod = args.pod
    candidates = {node: nv for node, nv in args.victims.items() if nv.pods}
    dropped = {node: "no victims" for node, nv in args.victims.items() if not nv.pods}
    if not state.is_managed(pod):
        result = {node: _meta(nv.pods, nv.pdb_violations) for node, nv in candidates.items()}
        return PreemptOutcome({"NodeNameToMetaVictims": result}, "unmanaged", dropped)

    queue_name = state.queue_of(pod)
    queue = state.store.queues.get(queue_name) if queue_name is not None else None
    unit = state.unit_of(pod)
    if queue is None or unit is None or not unit.admitted:
        blocked = f'the preemptor is not admitted by queue "{queue_name}"'
        dropped.update(dict.fromkeys(candidates, blocked))
        return PreemptOutcome({"NodeNameToMetaVictims": {}}, "blocked", dropped)

    judge = _Judge(state, pod)
    kept: dict[str, MetaVictims] = {}
    for node, node_victims in candidates.items():
        reason = _outside_selector(state, queue, node) or next(
            (why for why in map(judge.protection, node_victims.pods) if why is not None), None
        )
        if reason is not None:
            dropped[node] = reason
            continue
        kept[node] = _meta(node_victims.pods, node_victims.pdb_violations)
    if dropped:
        first_node, first_reason = next(iter(dropped.items()))
        log.info("preemption narrowed", extra={
            "pod": f"{pod.namespace}/{pod.name}", "queue": pod.queue, "kept": len(kept),
            "candidates": len(args.victims), "dropped_node": first_node, "reason": first_reason,
        })
    verdict: PreemptVerdict = "allowed" if kept or not candidates else "blocked"
    return PreemptOutcome({"NodeNameToMetaVictims": kept}, verdict, dropped)
