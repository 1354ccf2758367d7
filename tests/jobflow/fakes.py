"""An in-memory apiserver for the JobFlow controller, feeding a real ClusterStore.

Objects change only when a test says so: a create is not seen by the cache
until `sync()`, like a watch that lags; Job lifecycles are driven by
`start()`, `finish()` and `remove()`.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Mapping, Sequence
from typing import Any

from arbiter.base.kubeapi import AlreadyExists, Invalid, NotFound
from arbiter.cache.store import ClusterStore
from arbiter.core.api import QUEUE_LABEL, format_rfc3339

Obj = dict[str, Any]
NAMESPACE = "ml"


def template(name: str, namespace: str = NAMESPACE) -> Obj:
    return {
        "apiVersion": "arbiter.dev/v1alpha1", "kind": "JobTemplate",
        "metadata": {"name": name, "namespace": namespace, "uid": f"tpl-{name}"},
        "spec": {"backoffLimit": 0, "template": {"spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "main", "image": "busybox",
                            "resources": {"requests": {"cpu": "100m"}}}]}}},
    }


def flow(name: str, flows: Sequence[Mapping[str, Any]], *, uid: str = "flow-uid",
         namespace: str = NAMESPACE, **spec: Any) -> Obj:
    return {
        "apiVersion": "arbiter.dev/v1alpha1", "kind": "JobFlow",
        "metadata": {"name": name, "namespace": namespace, "uid": uid, "generation": 1,
                     "creationTimestamp": format_rfc3339(1_700_000_000)},
        "spec": {"flows": [dict(f) for f in flows], **spec},
    }


class FakeCluster:
    def __init__(self, store: ClusterStore) -> None:
        self.store = store
        self.now = 1_700_000_000.0
        self.jobs: dict[str, Obj] = {}
        self.flows: dict[str, Obj] = {}
        self.created: list[str] = []
        self.deleted: list[str] = []
        self.status_writes = 0
        self.invalid_jobs: set[str] = set()
        self._uids = itertools.count(1)
        store.apply("Namespace", "ADDED", {"metadata": {"name": NAMESPACE}})
        store.apply("Queue", "ADDED", {"metadata": {"name": "team"},
                                       "spec": {"namespaces": [NAMESPACE]}})

    def clock(self) -> float:
        return self.now

    # -- test controls ------------------------------------------------------
    def add_flow(self, obj: Obj) -> None:
        key = f"{obj['metadata']['namespace']}/{obj['metadata']['name']}"
        self.flows[key] = copy.deepcopy(obj)
        self.store.apply("JobFlow", "ADDED", self.flows[key])

    def add_template(self, obj: Obj) -> None:
        self.store.apply("JobTemplate", "ADDED", obj)

    def sync(self) -> None:
        """Deliver every pending change to the cache, as watch events."""
        for key, job in self.jobs.items():
            self.store.apply("Job", "MODIFIED" if key in self.store.jobs else "ADDED", job)
        for key in [k for k in self.store.jobs if k not in self.jobs]:
            namespace, _, name = key.partition("/")
            self.store.apply("Job", "DELETED", {"metadata": {"namespace": namespace,
                                                             "name": name}})
        for obj in self.flows.values():
            self.store.apply("JobFlow", "MODIFIED", obj)

    def job(self, name: str) -> Obj:
        return self.jobs[f"{NAMESPACE}/{name}"]

    def start(self, name: str) -> None:
        job = self.job(name)
        job["spec"]["suspend"] = False
        job["status"] = {"startTime": format_rfc3339(self.now), "active": 1, "ready": 1}

    def finish(self, name: str, ok: bool = True) -> None:
        job = self.job(name)
        if "startTime" not in job.get("status", {}):
            self.start(name)
        self.now += 10
        status = job["status"]
        status.update({"active": 0, "ready": 0})
        kind = "Complete" if ok else "Failed"
        status["conditions"] = [{"type": kind, "status": "True",
                                 "lastTransitionTime": format_rfc3339(self.now)}]
        if ok:
            status["completionTime"] = format_rfc3339(self.now)
            status["succeeded"] = 1
        else:
            status["failed"] = 1

    def remove(self, name: str) -> None:
        del self.jobs[f"{NAMESPACE}/{name}"]

    def status_of(self, name: str) -> Obj:
        status: Obj = self.flows[f"{NAMESPACE}/{name}"].get("status") or {}
        return status

    def step(self, flow_name: str, step: str) -> Obj:
        for entry in self.status_of(flow_name)["steps"]:
            if entry["name"] == step:
                return dict(entry)
        raise KeyError(step)

    # -- FlowApi ------------------------------------------------------------
    async def get(self, path: str) -> Obj:
        parts = path.strip("/").split("/")
        key = f"{parts[-3]}/{parts[-1]}"
        if "jobs" in parts and key in self.jobs:
            return copy.deepcopy(self.jobs[key])
        raise NotFound(404, "NotFound", path)

    async def create(self, path: str, body: Mapping[str, Any]) -> Obj:
        obj = copy.deepcopy(dict(body))
        meta = obj["metadata"]
        key = f"{meta['namespace']}/{meta['name']}"
        if key in self.jobs:
            raise AlreadyExists(409, "AlreadyExists", f'jobs.batch "{meta["name"]}" exists')
        if meta["name"] in self.invalid_jobs:
            raise Invalid(422, "Invalid", f'Job.batch "{meta["name"]}" is invalid: '
                          "spec.template.spec.containers: Required value")
        # What the webhook and apiserver add.
        obj["spec"]["suspend"] = True
        meta["uid"] = f"job-{next(self._uids)}"
        meta["creationTimestamp"] = format_rfc3339(self.now)
        meta.setdefault("labels", {}).setdefault(QUEUE_LABEL, "team")
        self.jobs[key] = obj
        self.created.append(meta["name"])
        return copy.deepcopy(obj)

    async def json_patch(self, path: str, ops: Sequence[Mapping[str, Any]]) -> Obj:
        parts = path.strip("/").split("/")
        key = f"{parts[-4]}/{parts[-2]}"
        obj = self.flows.get(key)
        if obj is None:
            raise NotFound(404, "NotFound", path)
        for op in ops:
            if op["op"] == "test":
                assert op["path"] == "/metadata/uid"
                if obj["metadata"]["uid"] != op["value"]:
                    raise Invalid(422, "Invalid", "the test operation failed")
            else:
                assert op["op"] == "add" and op["path"] == "/status"
                obj["status"] = copy.deepcopy(op["value"])
        self.status_writes += 1
        return copy.deepcopy(obj)

    async def delete(self, path: str) -> None:
        parts = path.strip("/").split("/")
        key = f"{parts[-3]}/{parts[-1]}"
        if self.jobs.pop(key, None) is None:
            raise NotFound(404, "NotFound", path)
        self.deleted.append(parts[-1])
