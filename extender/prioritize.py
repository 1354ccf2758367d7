"""prioritize: scores 0..10 that keep gangs together and pack nodes.

Two signals, mixed with configurable weights (`ServeConfig`):

- **gang locality**: a node already running pods of the pod's own unit (the
  same Job or pod group) scores in proportion to how many it runs, the
  busiest such node getting 10. Only counted when some sibling is bound
  somewhere; a lone pod or a gang's first pod is scored on packing alone.
- **bin-packing** on the pod's dominant resource (the one it asks the
  largest share of the cluster for): 10 × (node's requests + this pod's) /
  node allocatable, so fuller nodes score higher and whole nodes stay free
  for large units. A pod that requests nothing packs by cpu.

Pods arbiter does not manage get 0 everywhere (no opinion). kube-scheduler
multiplies the scores by the extender's `weight` and adds them to its own.
"""

from __future__ import annotations

from collections.abc import Mapping

from extender.state import ExtenderState, gang_key
from extender.wire import MAX_SCORE, MIN_SCORE, ExtenderArgs, HostPriorityList


def dominant_resource(requests: Mapping[str, int], total: Mapping[str, int]) -> str:
    """The resource `requests` asks the largest share of `total` for (ties by name)."""
    best = "cpu"
    best_share = -1.0
    for resource in sorted(requests):
        capacity = total.get(resource, 0)
        if capacity <= 0:
            continue
        share = requests[resource] / capacity
        if share > best_share:
            best, best_share = resource, share
    return best


def prioritize_nodes(state: ExtenderState, args: ExtenderArgs) -> HostPriorityList:
    pod = args.pod
    names = args.names
    locality_weight = state.locality_weight
    binpack_weight = state.binpack_weight
    if not state.is_managed(pod) or locality_weight + binpack_weight == 0:
        return [{"Host": name, "Score": MIN_SCORE} for name in names]

    gang = gang_key(pod)
    siblings = state.gang_nodes(gang) if gang is not None and locality_weight else {}
    busiest = max((siblings.get(name, 0) for name in names), default=0) if siblings else 0
    if busiest == 0:
        locality_weight = 0  # nothing to be near: packing alone decides
        if binpack_weight == 0:
            return [{"Host": name, "Score": MIN_SCORE} for name in names]
    total_weight = locality_weight + binpack_weight

    resource = dominant_resource(pod.requests, state.allocatable_total())
    requested = pod.requests.get_amount(resource)
    allocatable = state.allocatable_by_node(resource)
    used = state.used_by_node(resource)
    scores: HostPriorityList = []
    append = scores.append
    for name in names:
        pack = 0.0
        if binpack_weight:
            capacity = allocatable.get(name, 0)
            if capacity > 0:
                pack = MAX_SCORE * (used.get(name, 0) + requested) / capacity
                if pack > MAX_SCORE:
                    pack = MAX_SCORE
        near = MAX_SCORE * siblings.get(name, 0) / busiest if locality_weight else 0.0
        score = int((locality_weight * near + binpack_weight * pack) / total_weight + 0.5)
        append({"Host": name, "Score": score if score > MIN_SCORE else MIN_SCORE})
    return scores
