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

Cost: the packing score of every node comes from a `ScoreTable` kept by the
state (scores.py): one C-level lookup per node; only the nodes running the
gang's siblings are scored here, so a call is O(nodes) in C plus O(gang)
in Python. The answer entries are pre-encoded (`orjson.Fragment`).
"""

from __future__ import annotations

from collections.abc import Mapping
from itertools import compress

import orjson

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


def _gang_positions(names: list[str], siblings: Mapping[str, int]) -> dict[int, int]:
    """Position in `names` -> sibling count, for the candidates running the gang's pods
    (the scan is in C; only the gang's nodes are visited in Python)."""
    where = compress(range(len(names)), map(siblings.__contains__, names))
    return {at: siblings[names[at]] for at in where}


def prioritize_nodes(state: ExtenderState, args: ExtenderArgs) -> EncodedPriorities:
    pod = args.pod
    names = args.names
    locality_weight = state.locality_weight
    binpack_weight = state.binpack_weight
    if not state.is_managed(pod) or locality_weight + binpack_weight == 0:
        return _no_opinion(state, names)

    gang = gang_key(pod)
    siblings = state.gang_nodes(gang) if gang is not None and locality_weight else {}
    near_at = _gang_positions(names, siblings) if siblings else {}
    busiest = max(near_at.values(), default=0)
    if busiest == 0:
        locality_weight = 0  # nothing to be near: packing alone decides
        if binpack_weight == 0:
            return _no_opinion(state, names)

    resource = dominant_resource(pod.requests, state.allocatable_total())
    requested = pod.requests.get_amount(resource)
    table = state.scores.table(resource, requested, binpack_weight,
                               locality_weight + binpack_weight)
    scores: EncodedPriorities = list(map(table.__getitem__, names))
    if near_at:
        allocatable = state.allocatable_by_node(resource)
        used = state.used_by_node(resource)
        known = state.store.nodes
        entry = state.scores.priorities.get
        for at, count in near_at.items():
            name = names[at]
            pack = pack_score(used.get(name, 0), requested, allocatable.get(name, 0))
            near = MAX_SCORE * count / busiest
            score = mixed_score(near, pack, locality_weight, binpack_weight)
            scores[at] = entry(name, score, keep=name in known)
    return scores
