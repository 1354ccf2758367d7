"""The loop's window on the apiserver: a handful of JSON verbs on API paths.

`ClusterApi` is what every writer in `arbiter.loop` talks to; `KubeApi`
implements it over the one raw client, `arbiter.kubeapi` (raw JSON in and
out, no OpenAPI models: they cost more than the request), and
`arbiter.loop.memory.InMemoryApi` implements it for tests and benchmarks.
Errors come back as the few exception types a controller reacts to
(defined in `arbiter.kubeapi`, re-exported here).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol
from urllib.parse import quote

from arbiter.kubeapi import (
    AlreadyExists,
    ApiError,
    Conflict,
    Denied,
    Invalid,
    NotFound,
    request_json,
)

__all__ = [
    "ARBITER_PREFIX", "FIELD_MANAGER", "AlreadyExists", "ApiError", "ClusterApi", "Conflict",
    "Denied", "Invalid", "KubeApi", "NotFound", "Obj", "events_path", "job_path", "jobflow_path",
    "lease_path", "pod_path", "queue_path", "unit_path",
]

Obj = dict[str, Any]
FIELD_MANAGER = "kube-arbiter"

ARBITER_PREFIX = "/apis/arbiter.dev/v1alpha1"


class ClusterApi(Protocol):
    async def get(self, path: str) -> Obj: ...

    async def create(self, path: str, body: Mapping[str, Any]) -> Obj: ...

    async def replace(self, path: str, body: Mapping[str, Any]) -> Obj: ...

    async def merge_patch(self, path: str, patch: Mapping[str, Any]) -> Obj: ...

    async def json_patch(self, path: str, ops: Sequence[Mapping[str, Any]]) -> Obj: ...


# -- paths -----------------------------------------------------------------------


def _q(part: str) -> str:
    return quote(part, safe="")


def unit_path(namespace: str, name: str = "", *, status: bool = False) -> str:
    base = f"{ARBITER_PREFIX}/namespaces/{_q(namespace)}/queueunits"
    if not name:
        return base
    return f"{base}/{_q(name)}" + ("/status" if status else "")


def queue_path(name: str, *, status: bool = False) -> str:
    return f"{ARBITER_PREFIX}/queues/{_q(name)}" + ("/status" if status else "")


def job_path(namespace: str, name: str = "") -> str:
    base = f"/apis/batch/v1/namespaces/{_q(namespace)}/jobs"
    return f"{base}/{_q(name)}" if name else base


def jobflow_path(namespace: str, name: str, *, status: bool = False) -> str:
    base = f"{ARBITER_PREFIX}/namespaces/{_q(namespace)}/jobflows/{_q(name)}"
    return base + "/status" if status else base


def pod_path(namespace: str, name: str) -> str:
    return f"/api/v1/namespaces/{_q(namespace)}/pods/{_q(name)}"


def events_path(namespace: str) -> str:
    return f"/api/v1/namespaces/{_q(namespace)}/events"


def lease_path(namespace: str, name: str = "") -> str:
    base = f"/apis/coordination.k8s.io/v1/namespaces/{_q(namespace)}/leases"
    return f"{base}/{_q(name)}" if name else base


# -- the real thing -------------------------------------------------------------------


class KubeApi:
    """`ClusterApi` over a kubernetes_asyncio ApiClient (its auth and TLS),
    through `arbiter.kubeapi`; writes name arbiter as their field manager."""

    def __init__(self, api_client: Any, *, timeout: float = 10.0) -> None:
        self._client = api_client
        self._timeout = timeout

    async def _request(
        self,
        method: str,
        path: str,
        body: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None,
        content_type: str = "application/json",
    ) -> Obj:
        query = [("fieldManager", FIELD_MANAGER)] if method != "GET" else []
        return await request_json(self._client, method, path, query=query, body=body,
                                  request_timeout=self._timeout, content_type=content_type)

    async def get(self, path: str) -> Obj:
        return await self._request("GET", path)

    async def create(self, path: str, body: Mapping[str, Any]) -> Obj:
        return await self._request("POST", path, body)

    async def replace(self, path: str, body: Mapping[str, Any]) -> Obj:
        return await self._request("PUT", path, body)

    async def merge_patch(self, path: str, patch: Mapping[str, Any]) -> Obj:
        return await self._request("PATCH", path, patch, "application/merge-patch+json")

    async def json_patch(self, path: str, ops: Sequence[Mapping[str, Any]]) -> Obj:
        return await self._request("PATCH", path, ops, "application/json-patch+json")
