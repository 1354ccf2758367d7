"""LeaderWorkerSet (`leaderworkerset.x-k8s.io/v1`): one unit per group, all
or nothing: the leader (1 pod of `leaderTemplate`, else of the worker
template) and `size - 1` workers. Its controller (v0.9) makes a leader
StatefulSet named as the LWS (controller: the LWS; its pods `<lws>-<group>`),
and per leader pod a worker StatefulSet named as that pod (controller: the
leader pod; its pods `<leader>-<1..size-1>`). Every pod carries its group's
index label, which picks the group's unit among the LWS's own (the chain to
the LWS is checked by uid): the LWS pod webhook sets it on a leader from its
name's ordinal, the worker StatefulSet's template on its workers."""

from __future__ import annotations

from collections.abc import Mapping

from arbiter.core.model import MAIN_POD_SET
from arbiter.core.resources import Resources
from arbiter.integrations.base import (
    Integration,
    Limit,
    Obj,
    Path,
    PodSetSpec,
    UnitSpec,
    count_at,
    dig,
    template_requests,
)

GROUP_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/group-index"
WORKERS: Path = ("spec", "leaderWorkerTemplate", "workerTemplate")
LEADER: Path = ("spec", "leaderWorkerTemplate", "leaderTemplate")
# More groups than this are not queued (a unit each; the CRD has no cap).
MAX_GROUPS = 1000


class LeaderWorkerSet(Integration):
    name = "lws"
    group = "leaderworkerset.x-k8s.io"
    version = "v1"
    resource = "leaderworkersets"
    kind = "LeaderWorkerSet"
    prefix = "lws"
    hold = "gate"
    children = ("StatefulSet", "Pod")
    readable = (f"spec.replicas at most {MAX_GROUPS} groups, spec.leaderWorkerTemplate.size "
                "at least 1, and a worker (and leader) pod template")

    def templates(self, obj: Obj) -> tuple[Path, ...]:
        has_leader = isinstance(dig(obj, LEADER), Mapping)
        return (LEADER, WORKERS) if has_leader else (WORKERS,)

    def units(self, obj: Obj) -> tuple[UnitSpec, ...] | None:
        groups = count_at(obj, ("spec", "replicas"))
        size = count_at(obj, ("spec", "leaderWorkerTemplate", "size"))
        leader = LEADER if isinstance(dig(obj, LEADER), Mapping) else WORKERS
        leader_requests = template_requests(obj, leader)
        worker_requests = template_requests(obj, WORKERS)
        if groups is None or size is None or size < 1 or groups > MAX_GROUPS \
                or leader_requests is None or worker_requests is None:
            return None
        sets = [PodSetSpec("leader", 1, leader_requests, leader)]
        if size > 1:
            sets.append(PodSetSpec("workers", size - 1, worker_requests, WORKERS))
        return tuple(UnitSpec(str(index), tuple(sets)) for index in range(groups))

    def unit_of_pod(self, labels: Mapping[str, str]) -> str:
        return labels.get(GROUP_INDEX_LABEL, "")

    def child_limits(self, pod_sets: Mapping[str, Limit], groups: int, child_kind: str,
                     direct: bool) -> Mapping[str, Limit] | None:
        # The leader StatefulSet (its controller: the LWS) has a leader pod
        # per group; a worker StatefulSet (its controller: a leader pod) the
        # size - 1 workers of one group.
        if child_kind != "StatefulSet":
            return None
        none: Limit = (0, Resources())
        if direct:
            return {MAIN_POD_SET: (groups, pod_sets.get("leader", none)[1])}
        return {MAIN_POD_SET: pod_sets.get("workers", none)}
