"""What the rest of a cluster does around the admission loop, for reclaim
tests on the in-memory apiserver: a Job controller (an unsuspended Job gets
its pods, a suspended one loses them) and a scheduler that binds each
released pod to the node its unit's plan names. Pods of a Job taken back
may linger, terminating, until `finish` (graceful termination)."""

from __future__ import annotations

from typing import Any

from arbiter.base.kubeapi import pod_path, unit_path
from arbiter.core.api import QUEUE_LABEL, job_unit_name
from arbiter.core.model import Placement
from tests.reclaim.test_loop import ReclaimCluster

ADMISSION = "test/admission"  # which admission of its unit a pod was made for


class KubeSim:
    def __init__(self, cluster: ReclaimCluster, *, graceful: bool = True) -> None:
        self.c = cluster
        self.graceful = graceful
        # A Job suspended and resumed between two steps keeps its pods: the
        # Job controller never saw the suspension (default: it deletes them).
        self.missed = False
        self.made = 0

    def _plan(self, key: str) -> list[str]:
        plan = self.c.controller.mirror.plan(key)
        if not isinstance(plan, Placement):
            return []
        return [node for nodes in plan.nodes.values() for node in nodes]

    async def step(self) -> None:
        """One round of the Job controller and the scheduler."""
        api = self.c.api
        pods = api.of_kind("pods")
        live: dict[str, list[dict[str, Any]]] = {}
        for pod in pods:
            for ref in pod["metadata"].get("ownerReferences") or []:
                if ref.get("kind") == "Job":
                    live.setdefault(ref["uid"], []).append(pod)
        for job in api.of_kind("jobs"):
            meta, spec = job["metadata"], job["spec"]
            mine = [p for p in live.get(meta["uid"], [])
                    if not p["metadata"].get("deletionTimestamp")]
            unit = f"{meta['namespace']}/{job_unit_name(meta['name'])}"
            admission = str(self._admissions(unit))
            # Pods of an earlier admission: the Job was suspended meanwhile
            # (requeued and admitted again between two steps): the real Job
            # controller would have seen the suspension and deleted them.
            stale = [] if self.missed else [
                p for p in mine if p["metadata"]["annotations"][ADMISSION] != admission]
            mine = [p for p in mine if p not in stale]
            if spec.get("suspend"):
                stale += mine
                mine = []
            for pod in stale:
                path = pod_path(meta["namespace"], str(pod["metadata"]["name"]))
                if self.graceful:
                    api.edit(path, _terminate)
                else:
                    await api.delete(path)
            if spec.get("suspend"):
                continue
            want = int(spec.get("parallelism", 1))
            nodes = self._plan(unit)
            for index in range(len(mine), want):
                self.made += 1
                template = spec["template"]["spec"]
                await api.create(f"/api/v1/namespaces/{meta['namespace']}/pods", {
                    "metadata": {
                        "name": f"{meta['name']}-{self.made}", "namespace": meta["namespace"],
                        "annotations": {ADMISSION: admission},
                        "labels": {QUEUE_LABEL: spec["template"]["metadata"]["labels"]
                                   [QUEUE_LABEL]},
                        "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job",
                                             "name": meta["name"], "uid": meta["uid"],
                                             "controller": True}]},
                    "spec": {**template,
                             **({"nodeName": nodes[index]} if index < len(nodes) else {})},
                    "status": {"phase": "Running"},
                })

    def _admissions(self, key: str) -> int:
        namespace, name = key.split("/", 1)
        obj = self.c.api.objects.get(unit_path(namespace, name)) or {}
        return len((obj.get("status") or {}).get("admissions") or [])

    async def finish(self, at_most: int | None = None) -> int:
        """Terminating pods are gone (`at_most` of them, oldest first): how many."""
        done = 0
        for pod in self.c.api.of_kind("pods"):
            meta = pod["metadata"]
            if meta.get("deletionTimestamp") and (at_most is None or done < at_most):
                await self.c.api.delete(pod_path(meta["namespace"], meta["name"]))
                done += 1
        return done


def _terminate(obj: dict[str, Any]) -> None:
    obj["metadata"]["deletionTimestamp"] = "2023-11-14T22:13:20Z"
