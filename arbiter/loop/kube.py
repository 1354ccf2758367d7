"""The loop's window on the apiserver: a handful of JSON verbs on API paths.

`ClusterApi` is what every writer in `arbiter.loop` talks to; `KubeApi`
implements it over a kubernetes_asyncio `ApiClient` (raw JSON in and out,
no OpenAPI models: they cost more than the request), and
`arbiter.loop.memory.InMemoryApi` implements it for tests and benchmarks.
Errors come back as the few exception types a controller reacts to.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol
from urllib.parse import quote

import orjson

Obj = dict[str, Any]
FIELD_MANAGER = "kube-arbiter"

ARBITER_PREFIX = "/apis/arbiter.dev/v1alpha1"


class ApiError(Exception):
    """A non-2xx answer; `status` is the HTTP code, `reason` the Status reason."""

    def __init__(self, status: int, reason: str = "", message: str = "") -> None:
        super().__init__(f"{status} {reason}: {message}".strip())
        self.status = status
        self.reason = reason
        self.message = message


class NotFound(ApiError):
    pass


class AlreadyExists(ApiError):
    pass


class Conflict(ApiError):
    """409: the resourceVersion precondition failed (someone wrote first)."""


class Invalid(ApiError):
    """422: validation failed, or a JSON Patch `test` operation did not hold."""


class Denied(ApiError):
    """403, or an admission webhook said no (its code is passed through)."""


def error_for(status: int, body: bytes) -> ApiError:
    reason = message = ""
    try:
        decoded = orjson.loads(body) if body else {}
        if isinstance(decoded, dict):
            reason = str(decoded.get("reason", "") or "")
            message = str(decoded.get("message", "") or "")
    except orjson.JSONDecodeError:
        message = body[:200].decode("utf-8", "replace")
    if status == 404:
        return NotFound(status, reason, message)
    if status == 409:
        if reason == "AlreadyExists":
            return AlreadyExists(status, reason, message)
        return Conflict(status, reason, message)
    if status == 422:
        return Invalid(status, reason, message)
    if status == 403 or "admission webhook" in message:
        return Denied(status, reason, message)
    return ApiError(status, reason, message)


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


def job_path(namespace: str, name: str) -> str:
    return f"/apis/batch/v1/namespaces/{_q(namespace)}/jobs/{_q(name)}"


def pod_path(namespace: str, name: str) -> str:
    return f"/api/v1/namespaces/{_q(namespace)}/pods/{_q(name)}"


def events_path(namespace: str) -> str:
    return f"/api/v1/namespaces/{_q(namespace)}/events"


def lease_path(namespace: str, name: str = "") -> str:
    base = f"/apis/coordination.k8s.io/v1/namespaces/{_q(namespace)}/leases"
    return f"{base}/{_q(name)}" if name else base


# -- the real thing -------------------------------------------------------------------


class KubeApi:
    """`ClusterApi` over a kubernetes_asyncio ApiClient (its auth and TLS)."""

    def __init__(self, api_client: Any, *, timeout: float = 10.0) -> None:
        self._client = api_client
        self._timeout = timeout

    async def _request(
        self,
        method: str,
        path: str,
        body: Any = None,
        content_type: str = "application/json",
    ) -> Obj:
        query = [("fieldManager", FIELD_MANAGER)] if method != "GET" else []
        response = await self._client.call_api(
            path,
            method,
            query_params=query,
            header_params={"Accept": "application/json", "Content-Type": content_type},
            body=body,
            auth_settings=["BearerToken"],
            _preload_content=False,
            _request_timeout=self._timeout,
        )
        try:
            data: bytes = await response.read()
            status = int(response.status)
        finally:
            response.release()
        if not 200 <= status < 300:
            raise error_for(status, data)
        decoded = orjson.loads(data) if data else {}
        return decoded if isinstance(decoded, dict) else {}

    async def get(self, path: str) -> Obj:
        return await self._request("GET", path)

    async def create(self, path: str, body: Mapping[str, Any]) -> Obj:
        return await self._request("POST", path, dict(body))

    async def replace(self, path: str, body: Mapping[str, Any]) -> Obj:
        return await self._request("PUT", path, dict(body))

    async def merge_patch(self, path: str, patch: Mapping[str, Any]) -> Obj:
        return await self._request("PATCH", path, dict(patch), "application/merge-patch+json")

    async def json_patch(self, path: str, ops: Sequence[Mapping[str, Any]]) -> Obj:
        return await self._request(
            "PATCH", path, [dict(op) for op in ops], "application/json-patch+json"
        )
