"""The plan travels with the work (DESIGN §10): what an admitted unit's pods
are given when arbiter lets them go, and the JSON Patches that give it.

A unit admitted into a pool gets the pool's nodeSelector and tolerations,
plus its queue's nodeSelector, so kube-scheduler itself keeps the pods on
the pool's nodes. Both writes are legal (DESIGN §5): a suspended Job that
never started (or was suspended again, which clears its start time) may
have its pod template's nodeSelector and tolerations changed, in the same
patch that sets `suspend: false`; a gated pod may gain nodeSelector keys,
and any pod may gain tolerations (only additions), in the same patch that
removes the gate.

A Job can be admitted again after a timeout or a reclaim, perhaps into
another pool: what arbiter added before must come off, or the template
would ask for two pools at once. The Job's `arbiter.dev/placed` annotation
records what arbiter set (and a user's value it replaced); the next release
takes exactly that off before adding the new pool's. Keys and tolerations
the user set are never removed, nor a key the user changed since.

The patches are built from the object as read just before (the cache keeps
neither a template's nodeSelector nor its tolerations), guarded by `test`
operations on its uid and its spec's and annotations' versions as read (a
pod: its resourceVersion), so nothing the user set is lost and nothing is
written over a newer spec.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from arbiter.cache.records import JobRecord, PoolRecord, QueueRecord, Toleration, UnitRecord
from arbiter.core.api import ADMISSION_GATE, PLACED_ANNOTATION

Op = dict[str, Any]


@dataclass(frozen=True, slots=True)
class PodDirectives:
    node_selector: tuple[tuple[str, str], ...] = ()
    tolerations: tuple[Toleration, ...] = ()
    # The consumer may carry what an earlier release gave it: patch it even
    # when this release gives nothing, so that comes off.
    undo_earlier: bool = False

    def __bool__(self) -> bool:
        return bool(self.node_selector or self.tolerations or self.undo_earlier)


NOTHING = PodDirectives()


def directives_for(unit: UnitRecord, pools: Mapping[str, PoolRecord],
                   queues: Mapping[str, QueueRecord],
                   job: JobRecord | None = None) -> PodDirectives:
    """The unit's pool's nodeSelector and tolerations and its queue's
    nodeSelector; nothing for a unit admitted without a plan, or into the
    pool `default` (which no selector describes) by a queue without one.
    `job`: the unit's Job as cached, whose annotation says whether an
    earlier release placed it (a re-admission counts too, in case the
    cache has not seen that annotation yet)."""
    admission = unit.admission
    directives = pool_directives(admission.pool if admission is not None else None,
                                 unit.queue, pools, queues)
    placed_before = job is not None and (
        unit.attempts > 1 or any(key == PLACED_ANNOTATION for key, _ in job.annotations))
    return replace(directives, undo_earlier=placed_before)


def pool_directives(pool_name: str | None, queue_name: str, pools: Mapping[str, PoolRecord],
                    queues: Mapping[str, QueueRecord]) -> PodDirectives:
    """Pool `pool_name`'s nodeSelector and tolerations, and its queue's
    nodeSelector; nothing when admitted without a plan (None)."""
    selector: dict[str, str] = {}
    tolerations: tuple[Toleration, ...] = ()
    pool = pools.get(pool_name) if pool_name is not None else None
    if pool is not None:
        selector.update(pool.node_selector)
        tolerations = pool.tolerations
    queue = queues.get(queue_name)
    if queue is not None and pool_name is not None:
        for key, value in queue.node_selector:
            selector.setdefault(key, value)  # the pool's word wins (its nodes were chosen)
    return PodDirectives(tuple(sorted(selector.items())), tolerations)


def _pointer(key: str) -> str:
    """A map key as one JSON Pointer segment (RFC 6901)."""
    return key.replace("~", "~0").replace("/", "~1")


def _uid_test(meta: Mapping[str, Any]) -> Op:
    return {"op": "test", "path": "/metadata/uid", "value": meta.get("uid", "")}


def _guards(obj: Mapping[str, Any]) -> list[Op]:
    meta = obj.get("metadata") or {}
    return [_uid_test(meta), {"op": "test", "path": "/metadata/resourceVersion",
                              "value": meta.get("resourceVersion", "")}]


def _spec_guards(obj: Mapping[str, Any]) -> list[Op]:
    """Guards of a workload's release: its uid, its spec as read (the
    generation: a status write does not move it), its labels (the queue)
    and annotations as read. Not the resourceVersion: the Job controller
    rewrites a held Job's status while its pods go, and a release guarded
    by it lost every race for minutes. A map the object has none of is
    guarded by a test for null, which the apiserver's JSON patch passes
    only while the key is absent (a map added since fails it). Without a
    generation, the resourceVersion it is."""
    meta = obj.get("metadata") or {}
    generation = meta.get("generation")
    if not isinstance(generation, int):
        return _guards(obj)
    return [_uid_test(meta), {"op": "test", "path": "/metadata/generation", "value": generation},
            *(_map_test(meta, key) for key in ("labels", "annotations"))]


def _map_test(meta: Mapping[str, Any], key: str) -> Op:
    value = meta.get(key)
    # An empty map is not serialized: to the apiserver it is absent.
    as_read = dict(value) if isinstance(value, Mapping) and value else None
    return {"op": "test", "path": f"/metadata/{key}", "value": as_read}


@dataclass(slots=True)
class Placed:
    """What arbiter set on a pod spec: selector keys with the value it set,
    the user's values it replaced, the tolerations it appended."""

    node_selector: dict[str, str]
    replaced: dict[str, str]
    tolerations: list[Any]

    def to_annotation(self) -> str:
        return json.dumps({"nodeSelector": self.node_selector, "replaced": self.replaced,
                           "tolerations": self.tolerations}, sort_keys=True)

    @classmethod
    def from_annotation(cls, text: Any) -> Placed:
        """Parsed leniently: an annotation someone mangled undoes nothing."""
        try:
            raw = json.loads(text) if isinstance(text, str) else {}
        except (ValueError, RecursionError):  # e.g. a deeply nested value
            raw = {}
        raw = raw if isinstance(raw, dict) else {}

        def strings(value: Any) -> dict[str, str]:
            return {k: v for k, v in value.items() if isinstance(k, str) and isinstance(v, str)} \
                if isinstance(value, dict) else {}

        tolerations = raw.get("tolerations")
        return cls(strings(raw.get("nodeSelector")), strings(raw.get("replaced")),
                   list(tolerations) if isinstance(tolerations, list) else [])

    def __bool__(self) -> bool:
        return bool(self.node_selector or self.tolerations)


def _undo(selector: dict[str, str], tolerations: list[Any], earlier: Placed) -> None:
    """Take off what an earlier release set, where it is still as set."""
    for key, value in earlier.node_selector.items():
        if selector.get(key) != value:
            continue  # changed (or removed) since: the user's now
        if key in earlier.replaced:
            selector[key] = earlier.replaced[key]
        else:
            del selector[key]
    for toleration in earlier.tolerations:
        if toleration in tolerations:
            tolerations.remove(toleration)


def _give(selector: dict[str, str], tolerations: list[Any], directives: PodDirectives) -> Placed:
    placed = Placed({}, {}, [])
    for key, value in directives.node_selector:
        if selector.get(key) == value:
            continue  # the user's already: not ours to take off later
        if key in selector:
            placed.replaced[key] = selector[key]
        selector[key] = placed.node_selector[key] = value
    for toleration in (t.to_api() for t in directives.tolerations):
        if toleration not in tolerations:
            tolerations.append(toleration)
            placed.tolerations.append(toleration)
    return placed


def _field_op(path: str, before: Any, after: Any) -> list[Op]:
    """Set a spec field to `after` as a whole (the version guards
    makes that as safe as per-key ops); an empty result removes it."""
    if after == (before or type(after)()):
        return []
    if not after:
        return [{"op": "remove", "path": path}]
    return [{"op": "add", "path": path, "value": after}]


def _spec_ops(base: str, spec: Mapping[str, Any], directives: PodDirectives,
              earlier: Placed | None = None) -> tuple[list[Op], Placed]:
    """Take `earlier` off a pod spec and give it `directives`."""
    old_selector = spec.get("nodeSelector")
    old_tolerations = spec.get("tolerations")
    selector = dict(old_selector) if isinstance(old_selector, Mapping) else {}
    tolerations = list(old_tolerations) if isinstance(old_tolerations, list) else []
    if earlier is not None:
        _undo(selector, tolerations, earlier)
    placed = _give(selector, tolerations, directives)
    ops = [*_field_op(f"{base}/nodeSelector", old_selector, selector),
           *_field_op(f"{base}/tolerations", old_tolerations, tolerations)]
    return ops, placed


def job_release_ops(job: Mapping[str, Any], directives: PodDirectives) -> list[Op]:
    """Unsuspend a Job, giving its pod template the pool's directives in
    place of those an earlier release gave it, and recording them."""
    return placed_ops(job, ("/spec/template",), directives,
                      [{"op": "add", "path": "/spec/suspend", "value": False}])


def placed_ops(obj: Mapping[str, Any], templates: Sequence[str], directives: PodDirectives,
               then: list[Op]) -> list[Op]:
    """Give every pod template of `obj` (JSON Pointers to PodTemplateSpecs)
    the directives in place of what an earlier release gave them, record
    that in the `arbiter.dev/placed` annotation, then `then` (the
    unsuspend). With no directives it only takes the earlier ones off
    (a workload held again)."""
    meta = obj.get("metadata") or {}
    annotations = meta.get("annotations")
    annotations = annotations if isinstance(annotations, Mapping) else {}
    earlier = Placed.from_annotation(annotations.get(PLACED_ANNOTATION))
    ops: list[Op] = []
    placed = Placed({}, {}, [])
    for base in templates:
        spec = _at(obj, base)
        spec_ops, placed = _spec_ops(f"{base}/spec", spec, directives, earlier)
        ops += spec_ops
    record = f"/metadata/annotations/{_pointer(PLACED_ANNOTATION)}"
    if placed:
        if annotations:
            ops.append({"op": "add", "path": record, "value": placed.to_annotation()})
        else:
            ops.append({"op": "add", "path": "/metadata/annotations",
                        "value": {PLACED_ANNOTATION: placed.to_annotation()}})
    elif PLACED_ANNOTATION in annotations:
        ops.append({"op": "remove", "path": record})
    return [*_spec_guards(obj), *ops, *then]


def _at(obj: Mapping[str, Any], template: str) -> Mapping[str, Any]:
    """The pod spec of the template at JSON Pointer `template` ({} when absent)."""
    node: Any = obj
    for step in template.strip("/").split("/"):
        step = step.replace("~1", "/").replace("~0", "~")
        if isinstance(node, list) and step.isdigit() and int(step) < len(node):
            node = node[int(step)]
        elif isinstance(node, Mapping):
            node = node.get(step)
        else:
            return {}
    spec = node.get("spec") if isinstance(node, Mapping) else None
    return spec if isinstance(spec, Mapping) else {}


def pod_release_ops(pod: Mapping[str, Any], directives: PodDirectives) -> list[Op] | None:
    """Remove arbiter's gate from a pod, giving it the pool's directives;
    None when the gate is gone already. (A pod is released once: nothing
    earlier to take off, only additions, as a gated pod allows.)"""
    spec = pod.get("spec") or {}
    gates = [g.get("name") for g in spec.get("schedulingGates") or []]
    if ADMISSION_GATE not in gates:
        return None
    index = gates.index(ADMISSION_GATE)
    ops, _ = _spec_ops("/spec", spec, directives)
    return [*_guards(pod), *ops, {"op": "remove", "path": f"/spec/schedulingGates/{index}"}]
