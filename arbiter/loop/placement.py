"""The plan travels with the work (DESIGN §10): what an admitted unit's pods
are given when arbiter lets them go, and the JSON Patches that give it.

A unit admitted into a pool gets the pool's nodeSelector and tolerations,
plus its queue's nodeSelector, so kube-scheduler itself keeps the pods on
the pool's nodes. Both writes are legal (DESIGN §5): a suspended Job that
never started may have its pod template's nodeSelector and tolerations
changed, in the same patch that sets `suspend: false`; a gated pod may gain
nodeSelector keys, and any pod may gain tolerations (only additions), in the
same patch that removes the gate.

The patches are built from the object as read just before (the cache keeps
neither a template's nodeSelector nor its tolerations), guarded by `test`
operations on its uid and resourceVersion, so nothing the user set is lost
and nothing is written over a newer version.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from arbiter.api import ADMISSION_GATE
from arbiter.cache.records import PoolRecord, QueueRecord, Toleration, UnitRecord

Op = dict[str, Any]


@dataclass(frozen=True, slots=True)
class PodDirectives:
    node_selector: tuple[tuple[str, str], ...] = ()
    tolerations: tuple[Toleration, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.node_selector or self.tolerations)


NOTHING = PodDirectives()


def directives_for(unit: UnitRecord, pools: Mapping[str, PoolRecord],
                   queues: Mapping[str, QueueRecord]) -> PodDirectives:
    """The unit's pool's nodeSelector and tolerations and its queue's
    nodeSelector; nothing for a unit admitted without a plan, or into the
    pool `default` (which no selector describes) by a queue without one."""
    selector: dict[str, str] = {}
    tolerations: tuple[Toleration, ...] = ()
    admission = unit.admission
    pool = pools.get(admission.pool) if admission is not None else None
    if pool is not None:
        selector.update(pool.node_selector)
        tolerations = pool.tolerations
    queue = queues.get(unit.queue)
    if queue is not None and admission is not None:
        for key, value in queue.node_selector:
            selector.setdefault(key, value)  # the pool's word wins (its nodes were chosen)
    return PodDirectives(tuple(sorted(selector.items())), tolerations)


def _pointer(key: str) -> str:
    """A map key as one JSON Pointer segment (RFC 6901)."""
    return key.replace("~", "~0").replace("/", "~1")


def _guards(obj: Mapping[str, Any]) -> list[Op]:
    meta = obj.get("metadata") or {}
    return [{"op": "test", "path": "/metadata/uid", "value": meta.get("uid", "")},
            {"op": "test", "path": "/metadata/resourceVersion",
             "value": meta.get("resourceVersion", "")}]


def _spec_ops(base: str, spec: Mapping[str, Any], directives: PodDirectives) -> list[Op]:
    """Add the selector keys and the tolerations a pod spec lacks."""
    ops: list[Op] = []
    current = spec.get("nodeSelector")
    if directives.node_selector:
        if not isinstance(current, Mapping):
            ops.append({"op": "add", "path": f"{base}/nodeSelector",
                        "value": dict(directives.node_selector)})
        else:
            ops += [{"op": "add", "path": f"{base}/nodeSelector/{_pointer(key)}", "value": value}
                    for key, value in directives.node_selector if current.get(key) != value]
    have = spec.get("tolerations")
    wanted = [t.to_api() for t in directives.tolerations]
    if wanted:
        if not isinstance(have, list):
            ops.append({"op": "add", "path": f"{base}/tolerations", "value": wanted})
        else:
            ops += [{"op": "add", "path": f"{base}/tolerations/-", "value": t}
                    for t in wanted if t not in have]
    return ops


def job_release_ops(job: Mapping[str, Any], directives: PodDirectives) -> list[Op]:
    """Unsuspend a Job, giving its pod template the pool's directives."""
    template = ((job.get("spec") or {}).get("template") or {}).get("spec") or {}
    return [*_guards(job), *_spec_ops("/spec/template/spec", template, directives),
            {"op": "add", "path": "/spec/suspend", "value": False}]


def pod_release_ops(pod: Mapping[str, Any], directives: PodDirectives) -> list[Op] | None:
    """Remove arbiter's gate from a pod, giving it the pool's directives;
    None when the gate is gone already."""
    spec = pod.get("spec") or {}
    gates = [g.get("name") for g in spec.get("schedulingGates") or []]
    if ADMISSION_GATE not in gates:
        return None
    index = gates.index(ADMISSION_GATE)
    return [*_guards(pod), *_spec_ops("/spec", spec, directives),
            {"op": "remove", "path": f"/spec/schedulingGates/{index}"}]
