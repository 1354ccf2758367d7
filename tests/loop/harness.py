"""A small cluster for loop tests: an in-memory apiserver feeding a store,
an AdmissionController on a fake clock, and builders for the objects the
webhook would have let in (suspended Jobs, gated pods, Queues, Nodes)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from arbiter.base.kubeapi import job_path, pod_path, unit_path
from arbiter.cache.convert import JOB_NAME_LABEL, JOB_UID_LABEL
from arbiter.cache.records import UnitRecord
from arbiter.cache.store import KINDS, ClusterStore
from arbiter.core.api import (
    ADMISSION_GATE,
    POD_GROUP_LABEL,
    POD_GROUP_SIZE_ANNOTATION,
    QUEUE_LABEL,
    format_rfc3339,
)
from arbiter.loop.controller import AdmissionController
from arbiter.loop.settings import LoopSettings
from arbiter.testing.memory import InMemoryApi

T0 = 1_700_000_000.0


async def eventually(check: Callable[[], bool], within: float = 5.0,
                     poll: float = 0.005) -> None:
    """Wait (real time) until `check()` holds; TimeoutError after `within` s."""
    async with asyncio.timeout(within):
        while True:
            if check():
                return
            await asyncio.sleep(poll)


class Clock:
    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@dataclass
class Said:
    unit: str
    type: str
    reason: str
    message: str
    on_unit: bool


@dataclass
class RecordingEvents:
    said: list[Said] = field(default_factory=list)

    def unit_event(self, unit: UnitRecord, type_: str, reason: str, message: str,
                   *, on_unit: bool = True) -> None:
        self.said.append(Said(unit.key, type_, reason, message, on_unit))

    def reasons(self, key: str) -> list[str]:
        return [s.reason for s in self.said if s.unit == key]


class Cluster:
    def __init__(self, settings: LoopSettings | None = None, *, lag: bool = False,
                 store: ClusterStore | None = None, fast_path_key: bytes | None = None) -> None:
        self.fast_path_key = fast_path_key
        # Stand in for the Job controller's startTime (`settle`); off: it is behind.
        self.job_controller = True
        self.clock = Clock()
        self.store = store if store is not None else ClusterStore()
        self.store.synced_kinds.update(KINDS)
        self.api = InMemoryApi(self.store, clock=self.clock, lag=lag)
        self.events = RecordingEvents()
        # A key given: the fast path's tests, with it switched on (off by default).
        self.settings = settings or LoopSettings(debounce=0.0,
                                                 admit_on_create=fast_path_key is not None)
        self.controller = self.new_controller()

    def new_controller(self, identity: str = "") -> AdmissionController:
        """A fresh controller (a restart, or a new leader) on the same cluster."""
        controller = AdmissionController(self.store, self.api, self.settings,
                                         events=self.events, clock=self.clock,
                                         identity=identity, fast_path_key=self.fast_path_key)
        controller.start_listening()
        return controller

    async def settle(self, controller: AdmissionController | None = None) -> None:
        await (controller or self.controller).settle()
        if self.job_controller and self._take_releases_up():
            await (controller or self.controller).settle()

    def _take_releases_up(self) -> bool:
        """What the Job controller does with `spec.suspend`: a resumed Job gets
        status.startTime (the admission timeout counts from it), a suspended
        one loses it. True when a Job changed."""
        changed = False
        for path, job in list(self.api.objects.items()):
            parts = path.split("/")
            if len(parts) != 8 or parts[1:4] != ["apis", "batch", "v1"] or parts[6] != "jobs":
                continue
            status = job.get("status") or {}
            suspended = bool(job["spec"].get("suspend"))
            if suspended and status.get("startTime"):
                self.api.edit(path, lambda obj: obj["status"].pop("startTime"))
                changed = True
            elif not suspended and not status.get("startTime"):
                self.api.set_status(path, {"startTime": format_rfc3339(self.clock())})
                changed = True
        return changed

    # -- builders ----------------------------------------------------------------------
    async def node(self, name: str, cpu: str = "1", memory: str = "8Gi") -> None:
        await self.api.create("/api/v1/nodes", {
            "metadata": {"name": name},
            "status": {"allocatable": {"cpu": cpu, "memory": memory, "pods": "110"},
                       "conditions": [{"type": "Ready", "status": "True"}]},
        })

    async def nodes(self, count: int, cpu: str = "1", memory: str = "8Gi") -> None:
        for index in range(count):
            await self.node(f"node-{index}", cpu, memory)

    async def queue(self, name: str, **spec: Any) -> None:
        await self.api.create("/apis/arbiter.dev/v1alpha1/queues",
                              {"metadata": {"name": name}, "spec": spec})

    async def set_queue(self, name: str, **spec: Any) -> None:
        await self.api.merge_patch(f"/apis/arbiter.dev/v1alpha1/queues/{name}", {"spec": spec})

    async def job(
        self,
        namespace: str,
        name: str,
        queue: str,
        *,
        cpu: str = "1",
        parallelism: int = 1,
        suspend: bool = True,
        priority_class: str | None = None,
        created: float | None = None,
    ) -> dict[str, Any]:
        template_spec: dict[str, Any] = {
            "containers": [{"name": "c", "image": "x",
                            "resources": {"requests": {"cpu": cpu}}}],
        }
        if priority_class:
            template_spec["priorityClassName"] = priority_class
        meta: dict[str, Any] = {"name": name, "namespace": namespace,
                                "labels": {QUEUE_LABEL: queue}}
        if created is not None:
            meta["creationTimestamp"] = format_rfc3339(created)
        return await self.api.create(f"/apis/batch/v1/namespaces/{namespace}/jobs", {
            "metadata": meta,
            "spec": {"suspend": suspend, "parallelism": parallelism,
                     "template": {"metadata": {"labels": {QUEUE_LABEL: queue}},
                                  "spec": template_spec}},
        })

    async def pod(
        self,
        namespace: str,
        name: str,
        queue: str | None,
        *,
        cpu: str = "1",
        gated: bool = True,
        group: str | None = None,
        size: int | None = None,
        priority: int = 0,
        node: str | None = None,
        phase: str = "Pending",
    ) -> dict[str, Any]:
        labels: dict[str, str] = {}
        if queue is not None:
            labels[QUEUE_LABEL] = queue
        annotations: dict[str, str] = {}
        if group is not None:
            labels[POD_GROUP_LABEL] = group
        if size is not None:
            annotations[POD_GROUP_SIZE_ANNOTATION] = str(size)
        spec: dict[str, Any] = {
            "containers": [{"name": "c", "image": "x",
                            "resources": {"requests": {"cpu": cpu}}}],
            "priority": priority,
        }
        if gated:
            spec["schedulingGates"] = [{"name": ADMISSION_GATE}]
        if node is not None:
            spec["nodeName"] = node
        return await self.api.create(f"/api/v1/namespaces/{namespace}/pods", {
            "metadata": {"name": name, "namespace": namespace, "labels": labels,
                         "annotations": annotations},
            "spec": spec,
            "status": {"phase": phase},
        })

    async def pods(self, namespace: str, queue: str, count: int, *, prefix: str = "p",
                   cpu: str = "1") -> None:
        for index in range(count):
            await self.pod(namespace, f"{prefix}-{index:03d}", queue, cpu=cpu)

    # -- what a kubelet / the Job controller would do ------------------------------------
    async def job_pod(self, namespace: str, job: str, name: str, *, node: str,
                      cpu: str = "1") -> dict[str, Any]:
        """A running pod the Job controller made for `job` (controller ownerRef
        by uid), bound to `node`."""
        owner = self.api.objects[job_path(namespace, job)]["metadata"]
        queue = owner.get("labels", {}).get(QUEUE_LABEL, "")
        return await self.api.create(f"/api/v1/namespaces/{namespace}/pods", {
            "metadata": {"name": name, "namespace": namespace,
                         "creationTimestamp": format_rfc3339(self.clock()),
                         "labels": {QUEUE_LABEL: queue, JOB_NAME_LABEL: job,
                                    JOB_UID_LABEL: owner["uid"]},
                         "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job",
                                              "name": job, "uid": owner["uid"],
                                              "controller": True}]},
            "spec": {"nodeName": node,
                     "containers": [{"name": "c", "image": "x",
                                     "resources": {"requests": {"cpu": cpu}}}]},
            "status": {"phase": "Running"},
        })

    async def orphan_delete(self, path: str) -> None:
        """`kubectl delete --cascade=orphan`: the garbage collector takes the
        object's uid off its dependents' ownerReferences, then it goes."""
        uid = self.api.objects[path]["metadata"]["uid"]
        for key, obj in list(self.api.objects.items()):
            refs = obj["metadata"].get("ownerReferences") or []
            if any(ref.get("uid") == uid for ref in refs):
                def drop(o: dict[str, Any]) -> None:
                    o["metadata"]["ownerReferences"] = [
                        r for r in o["metadata"]["ownerReferences"] if r.get("uid") != uid]
                self.api.edit(key, drop)
        await self.api.delete(path)

    def run_job(self, namespace: str, name: str) -> None:
        job = self.api.objects[job_path(namespace, name)]
        count = job["spec"].get("parallelism", 1)
        self.api.set_status(job_path(namespace, name),
                            {"active": count, "ready": count,
                             "startTime": format_rfc3339(self.clock())})

    def finish_job(self, namespace: str, name: str, outcome: str = "Complete") -> None:
        self.api.set_status(job_path(namespace, name), {
            "active": 0, "ready": 0,
            "conditions": [{"type": outcome, "status": "True"}],
        })

    def set_pod_phase(self, namespace: str, name: str, phase: str) -> None:
        self.api.set_status(pod_path(namespace, name), {"phase": phase})

    # -- looking ---------------------------------------------------------------------------
    def unit_obj(self, namespace: str, name: str) -> dict[str, Any]:
        return self.api.objects[unit_path(namespace, name)]

    def phase(self, namespace: str, name: str) -> str | None:
        status = self.unit_obj(namespace, name).get("status") or {}
        phase = status.get("phase")
        return str(phase) if phase is not None else None

    def admissions(self, namespace: str, name: str) -> int:
        return len((self.unit_obj(namespace, name).get("status") or {}).get("admissions") or [])

    def gated(self, namespace: str, name: str) -> bool:
        pod = self.api.objects[pod_path(namespace, name)]
        return any(g.get("name") == ADMISSION_GATE
                   for g in pod["spec"].get("schedulingGates") or [])

    def suspended(self, namespace: str, name: str) -> bool:
        return bool(self.api.objects[job_path(namespace, name)]["spec"].get("suspend"))

    def released_pods(self, namespace: str) -> list[str]:
        return sorted(
            o["metadata"]["name"] for o in self.api.of_kind("pods")
            if o["metadata"]["namespace"] == namespace
            and not any(g.get("name") == ADMISSION_GATE
                        for g in o["spec"].get("schedulingGates") or [])
        )

    def queue_status(self, name: str) -> Mapping[str, Any]:
        return self.api.objects[f"/apis/arbiter.dev/v1alpha1/queues/{name}"].get("status") or {}
