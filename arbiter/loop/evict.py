"""Taking admitted work back: the API writes of reclaim and within-queue
preemption (the decisions are `arbiter.core.reclaim.flat`'s, the timing
`arbiter.loop.reclaim`'s).

- A **Job** is requeued, not killed: its QueueUnit's status goes back to
  `Enqueued` first (guarded by the phase and resourceVersion it was chosen
  in, the message says who reclaimed it), then the Job gets
  `spec.suspend: true`, which makes the Job controller delete its pods and
  keeps the Job. Status first, for the same reason as admission: a crash in
  between leaves an Enqueued unit whose Job still runs, which the loop
  counts as admitted and re-suspends no more; the unit keeps its place in
  its queue (queue order is by submission time) and its attempt count.
  A reservation (a QueueUnit without a consumer) is requeued the same way.
- A **plain pod or pod group** is evicted through the Eviction API
  (`policy/v1`, the pod's `eviction` subresource, with a uid precondition):
  PodDisruptionBudgets are honoured for a while: a 429 means the eviction
  is blocked *for now* and is retried later, with backoff. A budget must not
  let a tenant keep more than its share forever, though (a PDB with
  `minAvailable` = all its pods would): once a unit's evictions have been
  blocked for `--reclaim-pdb-timeout`, its blocked pods are deleted
  instead (with a uid precondition), and a `PodDisruptionBudgetOverridden`
  Event on the unit and its pod says so. The apiserver marks an
  evicted pod with a `DisruptionTarget` condition (reason
  `EvictionByEvictionAPI`); arbiter then rewrites it (best effort: the pod
  may be gone already) with its own reason and a message naming the queue
  that reclaimed it. An evicted bare pod is deleted — as with Kubernetes'
  own preemption, nothing recreates it — so its unit ends: its status goes
  to `Failed` with the reason, and the garbage collector removes it with the
  pod. Work that must survive reclaim belongs in a Job.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Literal

from arbiter.base.kubeapi import ApiError, ClusterApi, Conflict, Invalid, NotFound, pod_path
from arbiter.cache.records import UnitRecord
from arbiter.core.api import UnitPhase, format_rfc3339
from arbiter.loop.actions import Actions, Written, in_phase

log = logging.getLogger(__name__)

DISRUPTION_TARGET = "DisruptionTarget"
EvictResult = Literal["evicted", "gone", "blocked"]


def eviction_path(namespace: str, name: str) -> str:
    return pod_path(namespace, name) + "/eviction"


def eviction_body(namespace: str, name: str, uid: str) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": name, "namespace": namespace},
    }
    if uid:
        body["deleteOptions"] = {"preconditions": {"uid": uid}}
    return body


def with_condition(conditions: list[Any], condition: Mapping[str, Any]) -> list[Any]:
    """`conditions` with the one of the same type replaced (or appended)."""
    out = [c for c in conditions if not (isinstance(c, dict) and c.get("type")
                                         == condition.get("type"))]
    out.append(dict(condition))
    return out


class Evictor:
    """The writes that take a unit back; every one carries a precondition."""

    def __init__(self, api: ClusterApi, actions: Actions) -> None:
        self.api = api
        self.actions = actions

    async def requeue(self, unit: UnitRecord, message: str) -> Written | None:
        """Status back to Enqueued (from the phase the decision saw); None when
        the unit changed meanwhile or is gone. Attempts are left alone: being
        reclaimed is not a failure of the unit."""

        def build(_: UnitRecord, __: Mapping[str, Any] | None) -> dict[str, Any]:
            return {"phase": "Enqueued", "message": message, "allocated": None,
                    "position": None, "admissionChecks": None}

        return await self.actions.write_status(unit, build, in_phase(unit.phase))

    async def end(self, unit: UnitRecord, message: str,
                  phase: UnitPhase = "Failed") -> Written | None:
        """The unit's pods were evicted: it ends, saying why."""

        def build(_: UnitRecord, __: Mapping[str, Any] | None) -> dict[str, Any]:
            return {"phase": phase, "message": message, "allocated": None}

        return await self.actions.write_status(unit, build, in_phase(unit.phase))

    async def suspend_job(self, unit: UnitRecord) -> str:
        """spec.suspend: true (raises ConsumerGone when the Job is gone); the
        Job's resourceVersion after it."""
        return await self.actions.hold(unit)

    async def evict_pod(self, namespace: str, name: str, uid: str) -> EvictResult:
        """Ask the Eviction API; "blocked" when a PodDisruptionBudget (429)
        says not now. Other errors are raised."""
        try:
            await self.api.create(eviction_path(namespace, name),
                                  eviction_body(namespace, name, uid))
        except NotFound:
            return "gone"
        except Conflict:
            return "gone"  # the uid precondition failed: a namesake replaced it
        except ApiError as error:
            if error.status == 429:
                log.info("eviction of pod %s/%s blocked: %s", namespace, name,
                         error.message or error.reason)
                return "blocked"
            raise
        return "evicted"

    async def delete_pod(self, namespace: str, name: str, uid: str) -> EvictResult:
        """Delete the pod past its PodDisruptionBudget (uid-guarded)."""
        try:
            await self.api.delete_guarded(pod_path(namespace, name), uid)
        except (NotFound, Conflict):
            return "gone"
        return "evicted"

    async def mark_disruption(self, namespace: str, name: str, uid: str, reason: str,
                              message: str, now: float) -> bool:
        """Put arbiter's reason on the pod's DisruptionTarget condition (best
        effort: False when the pod is gone or changed meanwhile)."""
        path = pod_path(namespace, name)
        try:
            pod = await self.api.get(path)
        except NotFound:
            return False
        meta = pod.get("metadata") or {}
        if uid and meta.get("uid") != uid:
            return False
        conditions = list((pod.get("status") or {}).get("conditions") or [])
        condition = {"type": DISRUPTION_TARGET, "status": "True", "reason": reason,
                     "message": message, "lastTransitionTime": format_rfc3339(now)}
        ops: list[dict[str, Any]] = [
            {"op": "test", "path": "/metadata/resourceVersion",
             "value": meta.get("resourceVersion", "")},
            {"op": "add", "path": "/status/conditions",
             "value": with_condition(conditions, condition)},
        ]
        try:
            await self.api.json_patch(path + "/status", ops)
        except (NotFound, Invalid, Conflict) as error:
            log.debug("DisruptionTarget of pod %s/%s not written: %s", namespace, name, error)
            return False
        return True
