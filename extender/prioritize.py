"""prioritize: scores 0..10 that follow the unit's plan, keep gangs together
and pack nodes.

- **the plan** (DESIGN §10): a unit admitted with node fit carries planned
  nodes (QueueUnit status.admission). A planned node not yet taken by a
  bound pod of the unit scores 10 and every other node at most 9, so
  kube-scheduler (adding its own scores) prefers the plan; if it binds
  elsewhere in the pool anyway, the loop moves the plan to the binding
  and the extender follows the rewritten plan.

Then two signals, mixed with configurable weights (`ServeConfig`):

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

Cost: the packing score of every node comes from a `ScoreTable` kept by the
state (scores.py): one C-level lookup per node; only the nodes running the
gang's siblings are scored here, so a call is O(nodes) in C plus O(gang)
in Python. The answer entries are pre-encoded (`orjson.Fragment`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from itertools import compress

import orjson

from arbiter.cache.records import PodRecord
from extender.scores import mixed_score, pack_score
from extender.state import ExtenderState, gang_key
from extender.wire import MAX_SCORE, ExtenderArgs

# One encoded HostPriority ({"Host": ..., "Score": ...}) per candidate node,
# in the request's order: what the route serialises as the bare list.
EncodedPriorities = list[orjson.Fragment]


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


def _no_opinion(state: ExtenderState, names: list[str]) -> EncodedPriorities:
    return list(map(state.scores.no_opinion.__getitem__, names))


def _positions(names: list[str], counts: Mapping[str, int]) -> dict[int, int]:
    """Position in `names` -> count, for the candidates `counts` names (the scan
    is in C; only the named nodes are visited in Python)."""
    if not counts:
        return {}
    where = compress(range(len(names)), map(counts.__contains__, names))
    return {at: counts[names[at]] for at in where}


def free_planned_nodes(state: ExtenderState, pod: PodRecord,
                       siblings: Mapping[str, int]) -> dict[str, int]:
    """node -> pods of the pod's unit still planned there and not bound yet.

    The plan (QueueUnit status.admission, all pod sets) lists one node per
    pod; the loop rewrites it as pods bind (bound nodes first), and until it
    has, a binding elsewhere only leaves a planned slot free that another
    pod may take: either way planned minus bound is where the unit's next
    pods are expected. O(the unit's pods)."""
    unit = state.unit_of(pod)
    if unit is None or unit.admission is None:
        return {}
    planned = Counter(node for _, nodes in unit.admission.nodes for node in nodes)
    return {node: left for node, count in planned.items()
            if (left := count - siblings.get(node, 0)) > 0}


def prioritize_nodes(state: ExtenderState, args: ExtenderArgs) -> EncodedPriorities:
    pod = args.pod
    names = args.names
    if not state.is_managed(pod):
        return _no_opinion(state, names)
    locality_weight = state.locality_weight
    binpack_weight = state.binpack_weight
    gang = gang_key(pod)
    siblings = state.gang_nodes(gang) if gang is not None else {}
    # The plan first: its free nodes score 10 and every other node at most 9.
    planned_at = _positions(names, free_planned_nodes(state, pod, siblings))
    ceiling = MAX_SCORE - 1 if planned_at else MAX_SCORE
    near_at = _positions(names, siblings) if locality_weight else {}
    busiest = max(near_at.values(), default=0)
    if busiest == 0:
        locality_weight = 0  # nothing to be near: packing alone decides
    if locality_weight + binpack_weight == 0 and not planned_at:
        return _no_opinion(state, names)

    resource = dominant_resource(pod.requests, state.allocatable_total())
    requested = pod.requests.get_amount(resource)
    table = state.scores.table(resource, requested, binpack_weight,
                               locality_weight + binpack_weight, ceiling)
    scores: EncodedPriorities = list(map(table.__getitem__, names))
    known = state.store.nodes
    entry = state.scores.priorities.get
    if near_at:
        allocatable = state.allocatable_by_node(resource)
        used = state.used_by_node(resource)
        for at, count in near_at.items():
            name = names[at]
            pack = pack_score(used.get(name, 0), requested, allocatable.get(name, 0))
            near = MAX_SCORE * count / busiest
            score = mixed_score(near, pack, locality_weight, binpack_weight)
            scores[at] = entry(name, min(score, ceiling), keep=name in known)
    for at in planned_at:
        scores[at] = entry(names[at], MAX_SCORE, keep=names[at] in known)
    return scores
