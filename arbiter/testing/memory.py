"""An in-memory apiserver for the loop's tests and benchmarks.

It implements `ClusterApi` with the semantics the loop relies on —
resourceVersion preconditions (409), JSON Patch `test` (422), AlreadyExists,
the status subresource of arbiter's kinds, uids, owner-reference garbage
collection — and feeds every change to a `ClusterStore` the way the watch
does: at once, or held back until `deliver()` to play a lagging watch.
It is not a Kubernetes: no validation, no defaulting, no controllers.
"""

from __future__ import annotations

import copy
import itertools
import uuid
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from typing import Any

from arbiter.base.kubeapi import AlreadyExists, ApiError, Conflict, Invalid, NotFound, Obj
from arbiter.cache.store import ClusterStore, EventType, Kind
from arbiter.core.api import format_rfc3339

# Collection (last path segment) -> store kind.
_KINDS: dict[str, Kind] = {
    "queues": "Queue",
    "queueunits": "QueueUnit",
    "jobs": "Job",
    "pods": "Pod",
    "nodes": "Node",
    "namespaces": "Namespace",
    "priorityclasses": "PriorityClass",
    "runtimeclasses": "RuntimeClass",
    "pools": "Pool",
    "admissionchecks": "AdmissionCheck",
    "jobsets": "JobSet",
    "statefulsets": "StatefulSet",
    "leaderworkersets": "LeaderWorkerSet",
    "deployments": "Deployment",
    "trainjobs": "TrainJob",
    "rayclusters": "RayCluster",
    "rayjobs": "RayJob",
}
_STATUS_KINDS = {"queues", "queueunits", "jobs", "pods", "nodes", "pools", "admissionchecks",
                 "jobsets", "statefulsets", "leaderworkersets", "deployments", "trainjobs",
                 "rayclusters", "rayjobs"}

# A hook may refuse a request: (method, path, body) -> an error to raise, or None.
Hook = Callable[[str, str, Any], ApiError | None]


def _split(path: str) -> tuple[str, bool]:
    """Object path without /status, and whether it was the status subresource."""
    if path.endswith("/status"):
        return path[: -len("/status")], True
    return path, False


def _collection(path: str) -> str:
    """The plural of an object path (/api/v1/namespaces/a/pods/p -> pods)."""
    parts = path.rstrip("/").split("/")
    return parts[-2] if len(parts) >= 2 else ""


def merge(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge(out.get(key), value)
    return out


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise Invalid(422, "Invalid", f"bad JSON pointer {path!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _walk(doc: Any, parts: list[str]) -> Any:
    for part in parts:
        if isinstance(doc, dict):
            if part not in doc:
                raise Invalid(422, "Invalid", f"missing path /{'/'.join(parts)}")
            doc = doc[part]
        elif isinstance(doc, list):
            try:
                doc = doc[int(part)]
            except (ValueError, IndexError):
                raise Invalid(422, "Invalid", f"missing path /{'/'.join(parts)}") from None
        else:
            raise Invalid(422, "Invalid", f"missing path /{'/'.join(parts)}")
    return doc


def _tested(doc: Any, parts: list[str]) -> Any:
    """The value a test op compares with, as the apiserver's JSON patch
    (evanphx/json-patch v4) sees it: a key missing from an object, or an
    empty map (never serialized), is null."""
    if not parts:
        return doc
    parent = _walk(doc, parts[:-1])
    if not isinstance(parent, dict):
        return _walk(parent, parts[-1:])
    value = parent.get(parts[-1])
    return None if value == {} else value


def json_patch(doc: Any, ops: Sequence[Mapping[str, Any]]) -> Any:
    """RFC 6902 for test/add/replace/remove (all or nothing)."""
    doc = copy.deepcopy(doc)
    for op in ops:
        parts = _pointer(str(op.get("path", "")))
        kind = op.get("op")
        if kind == "test":
            if _tested(doc, parts) != op.get("value"):
                raise Invalid(422, "Invalid", f"testing value {op.get('path')} failed")
            continue
        if not parts:
            raise Invalid(422, "Invalid", "cannot patch the whole document")
        parent = _walk(doc, parts[:-1])
        last = parts[-1]
        if kind in ("add", "replace"):
            value = copy.deepcopy(op.get("value"))
            if isinstance(parent, dict):
                if kind == "replace" and last not in parent:
                    raise Invalid(422, "Invalid", f"replace of missing {op.get('path')}")
                parent[last] = value
            elif isinstance(parent, list):
                if last == "-":
                    parent.append(value)
                else:
                    index = int(last)
                    if kind == "add":
                        parent.insert(index, value)
                    else:
                        parent[index] = value
            else:
                raise Invalid(422, "Invalid", f"cannot {kind} at {op.get('path')}")
        elif kind == "remove":
            if isinstance(parent, dict) and last in parent:
                del parent[last]
            elif isinstance(parent, list):
                try:
                    del parent[int(last)]
                except (ValueError, IndexError):
                    raise Invalid(422, "Invalid", f"missing {op.get('path')}") from None
            else:
                raise Invalid(422, "Invalid", f"missing {op.get('path')}")
        else:
            raise ApiError(400, "BadRequest", f"unsupported op {kind!r}")
    return doc


class InMemoryApi:
    """`ClusterApi` over a dict of objects, feeding a ClusterStore."""

    def __init__(
        self,
        store: ClusterStore | None = None,
        *,
        clock: Callable[[], float] | None = None,
        lag: bool = False,
        objects: MutableMapping[str, Obj] | None = None,
    ) -> None:
        self.store = store
        # Every change is written back whole (`_store`), so a mapping that
        # keeps objects encoded (a benchmark's, at 100k objects) works too.
        self.objects: MutableMapping[str, Obj] = {} if objects is None else objects
        self.lag = lag
        self.backlog: list[tuple[Kind, EventType, Obj]] = []
        self.hooks: list[Hook] = []
        self.calls: list[tuple[str, str]] = []
        self._rv = itertools.count(1)
        self._clock = clock
        self._tick = itertools.count()

    # -- helpers ------------------------------------------------------------------
    def _now(self) -> str:
        when = self._clock() if self._clock is not None else (
            1_700_000_000.0 + next(self._tick))
        return format_rfc3339(when)

    def _check(self, method: str, path: str, body: Any) -> None:
        self.calls.append((method, path))
        for hook in self.hooks:
            error = hook(method, path, body)
            if error is not None:
                raise error

    def _emit(self, path: str, event: EventType, obj: Obj) -> None:
        kind = _KINDS.get(_collection(path))
        if kind is None or self.store is None:
            return
        snapshot = copy.deepcopy(obj)
        if self.lag:
            self.backlog.append((kind, event, snapshot))
        else:
            self.store.apply(kind, event, snapshot)

    def deliver(self, count: int | None = None) -> int:
        """Hand held-back events to the store (all, or the oldest `count`)."""
        assert self.store is not None
        take = self.backlog if count is None else self.backlog[:count]
        self.backlog = self.backlog[len(take):]
        for kind, event, obj in take:
            self.store.apply(kind, event, obj)
        return len(take)

    def _store(self, path: str, obj: Obj, event: EventType) -> Obj:
        meta = obj.setdefault("metadata", {})
        meta["resourceVersion"] = str(next(self._rv))
        # As in the apiserver: the generation moves with the spec only.
        before = self.objects.get(path)
        if before is None:
            meta["generation"] = 1
        else:
            generation = (before.get("metadata") or {}).get("generation", 1)
            meta["generation"] = generation + (obj.get("spec") != before.get("spec"))
        self.objects[path] = obj
        self._emit(path, event, obj)
        return copy.deepcopy(obj)

    def _get(self, path: str) -> Obj:
        obj = self.objects.get(path)
        if obj is None:
            raise NotFound(404, "NotFound", f"{path} not found")
        return obj

    @staticmethod
    def _precondition(obj: Obj, body: Mapping[str, Any]) -> None:
        wanted = (body.get("metadata") or {}).get("resourceVersion")
        if wanted and wanted != obj["metadata"]["resourceVersion"]:
            raise Conflict(409, "Conflict", "the object has been modified")

    @staticmethod
    def _scoped(old: Obj, new: Obj, status: bool, collection: str) -> Obj:
        """What a write may change: the status subresource only the status,
        the main resource anything but the status."""
        if collection not in _STATUS_KINDS:
            return new
        out = copy.deepcopy(old)
        if status:
            out["status"] = new.get("status") or {}
            if not out["status"]:
                out.pop("status")
        else:
            out = {k: v for k, v in new.items() if k != "status"}
            if "status" in old:
                out["status"] = copy.deepcopy(old["status"])
            kept = {k: old["metadata"][k] for k in ("uid", "creationTimestamp")
                    if k in old["metadata"]}
            out["metadata"] = {**new.get("metadata", {}), **kept}
        return out

    # -- ClusterApi -----------------------------------------------------------------
    async def get(self, path: str) -> Obj:
        self._check("GET", path, None)
        return copy.deepcopy(self._get(_split(path)[0]))

    async def create(self, path: str, body: Mapping[str, Any]) -> Obj:
        self._check("POST", path, body)
        obj = copy.deepcopy(dict(body))
        meta = obj.setdefault("metadata", {})
        if not meta.get("name"):
            meta["name"] = meta.get("generateName", "obj-") + uuid.uuid4().hex[:5]
        target = f"{path.rstrip('/')}/{meta['name']}"
        if target in self.objects:
            raise AlreadyExists(409, "AlreadyExists", f"{target} already exists")
        meta["uid"] = str(uuid.uuid4())
        meta.setdefault("creationTimestamp", self._now())
        if _collection(target) in ("queueunits", "queues"):
            obj.pop("status", None)
        return self._store(target, obj, "ADDED")

    async def replace(self, path: str, body: Mapping[str, Any]) -> Obj:
        self._check("PUT", path, body)
        target, status = _split(path)
        old = self._get(target)
        self._precondition(old, body)
        new = self._scoped(old, copy.deepcopy(dict(body)), status, _collection(target))
        new.setdefault("metadata", {})["uid"] = old["metadata"]["uid"]
        return self._store(target, new, "MODIFIED")

    # Each verb spells out check / split / get / precondition, like the real
    # apiserver's handlers; the steps are shared, their order per verb is the point.
    async def merge_patch(self, path: str, patch: Mapping[str, Any]) -> Obj:
        self._check("PATCH", path, patch)
        target, status = _split(path)
        old = self._get(target)
        self._precondition(old, patch)
        new = merge(old, {k: v for k, v in patch.items() if k != "metadata"}
                      | ({"metadata": {k: v for k, v in patch["metadata"].items()
                                       if k != "resourceVersion"}}
                         if "metadata" in patch else {}))
        return self._store(target, self._scoped(old, new, status, _collection(target)),
                           "MODIFIED")

    async def json_patch(self, path: str, ops: Sequence[Mapping[str, Any]]) -> Obj:
        self._check("PATCH", path, list(ops))
        target, status = _split(path)
        old = self._get(target)
        new = json_patch(old, ops)
        # As in the apiserver, a patched resourceVersion is a precondition.
        self._precondition(old, new)
        return self._store(target, self._scoped(old, new, status, _collection(target)),
                           "MODIFIED")

    async def delete_guarded(self, path: str, uid: str) -> None:
        obj = self._get(path)
        if obj["metadata"].get("uid") != uid:
            raise Conflict(409, "Conflict", "uid precondition failed")
        await self.delete(path)

    # -- test conveniences (not part of ClusterApi) ----------------------------------
    async def delete(self, path: str) -> None:
        """Delete an object, then (like the garbage collector) every object
        all of whose owners are gone."""
        self._check("DELETE", path, None)
        obj = self.objects.pop(path, None)
        if obj is None:
            raise NotFound(404, "NotFound", f"{path} not found")
        self._emit(path, "DELETED", obj)
        self.collect_garbage()

    def collect_garbage(self) -> None:
        while True:
            uids = {o["metadata"].get("uid") for o in self.objects.values()}
            orphans = [
                p for p, o in self.objects.items()
                if (refs := o["metadata"].get("ownerReferences"))
                and not any(ref.get("uid") in uids for ref in refs)
            ]
            if not orphans:
                return
            for p in orphans:
                self._emit(p, "DELETED", self.objects.pop(p))

    def set_status(self, path: str, status: Mapping[str, Any]) -> Obj:
        """What a controller or the kubelet would write (merged into status)."""
        obj = self._get(path)
        obj["status"] = merge(obj.get("status") or {}, status)
        return self._store(path, obj, "MODIFIED")

    def edit(self, path: str, change: Callable[[Obj], None]) -> Obj:
        """Change an object in place (any field), as another client would."""
        obj = self._get(path)
        change(obj)
        return self._store(path, obj, "MODIFIED")

    def of_kind(self, collection: str) -> list[Obj]:
        return [copy.deepcopy(o) for p, o in self.objects.items()
                if _collection(p) == collection]
