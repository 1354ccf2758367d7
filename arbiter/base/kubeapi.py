"""The one way to the API server: raw JSON calls through a kubernetes_asyncio
ApiClient, and `ClusterApi`, the few verbs the controllers write with.

Responses are decoded with orjson into plain dicts; kubernetes model
objects (slow to build, large to keep) are never made. The ApiClient still
provides what it is good at: kubeconfig / in-cluster auth, TLS, token
refresh, the connection pool. The cache's watchers, certificates, webhook
configurations and the CLIs call `request_json` / `open_stream` directly;
the admission loop and JobFlow talk to a `ClusterApi`: `KubeApi` here, or
`arbiter.testing.memory.InMemoryApi` in tests and benchmarks. Failures are
`ApiError`s, a subclass for each answer callers treat apart.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol
from urllib.parse import quote

import aiohttp
import orjson

from arbiter.base import metrics
from arbiter.core.api import API_PATH, JOB_FLOW, QUEUE, QUEUE_UNIT

JSON = dict[str, Any]
Obj = JSON
FIELD_MANAGER = "kube-arbiter"
# A JSON object, or a JSON Patch (a list of operations).
Body = Mapping[str, Any] | Sequence[Mapping[str, Any]]


class ApiError(Exception):
    """A non-2xx answer: `status` (HTTP), the Status object's `reason` and
    `message`, and the Status object itself (`body`, {} when there was none).

    The subclasses are the answers a controller reacts to differently.
    """

    def __init__(self, status: int, reason: str = "", message: str = "",
                 body: JSON | None = None) -> None:
        head = f"HTTP {status} {reason}" if reason else f"HTTP {status}"
        super().__init__(f"{head}: {message}" if message else head)
        self.status = status
        self.reason = reason
        self.message = message
        self.body = body or {}


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


class Unreachable(ApiError):
    """No answer at all (status 0): the connection was refused or cut, or
    the request timed out. An ApiError too, so every write's retry path
    takes it (an apiserver restart, a network cut)."""


def error_for(status: int, raw: bytes) -> ApiError:
    """The ApiError (subclass) for a non-2xx answer with body `raw`."""
    try:
        decoded = orjson.loads(raw) if raw else {}
    except orjson.JSONDecodeError:
        decoded = {}
    body: JSON = decoded if isinstance(decoded, dict) else {}
    reason = str(body.get("reason", "") or "")
    message = str(body.get("message", "") or "") or raw[:200].decode("utf-8", "replace")
    kind: type[ApiError] = ApiError
    if status == 404:
        kind = NotFound
    elif status == 409:
        kind = AlreadyExists if reason == "AlreadyExists" else Conflict
    elif status == 422:
        kind = Invalid
    elif status == 403 or "admission webhook" in message:
        kind = Denied
    return kind(status, reason, message, body)


def _json_body(body: Body | None) -> Any:
    if body is None:
        return None
    if isinstance(body, Mapping):
        return dict(body)
    return [dict(op) for op in body]


async def open_stream(
    api: Any,
    method: str,
    path: str,
    *,
    query: Sequence[tuple[str, str]] = (),
    body: Body | None = None,
    request_timeout: float | aiohttp.ClientTimeout | None = 30.0,
    content_type: str = "application/json",
) -> aiohttp.ClientResponse:
    """Send the request and return the open response (caller releases it).

    `body` is a JSON object, or a list of operations for a JSON Patch
    (`content_type="application/json-patch+json"`).
    """
    headers = {"Accept": "application/json", "Content-Type": content_type}
    response: aiohttp.ClientResponse = await api.call_api(
        path,
        method,
        query_params=list(query),
        header_params=headers,
        body=_json_body(body),
        auth_settings=["BearerToken"],
        _preload_content=False,
        _request_timeout=request_timeout,
    )
    if not 200 <= response.status < 300:
        try:
            raw = await response.read()
        finally:
            response.release()
        raise error_for(int(response.status), raw)
    return response


# Takes open_stream's keywords, so a caller can switch between the two as they are.
async def request_json(
    api: Any,
    method: str,
    path: str,
    *,
    query: Sequence[tuple[str, str]] = (),
    body: Body | None = None,
    request_timeout: float = 30.0,
    content_type: str = "application/json",
) -> JSON:
    """One request, the decoded JSON answer; ApiError for non-2xx."""
    response = await open_stream(api, method, path, query=query, body=body,
                                 request_timeout=request_timeout,
                                 content_type=content_type)
    try:
        raw = await response.read()
    finally:
        response.release()
    decoded = orjson.loads(raw) if raw else {}
    return decoded if isinstance(decoded, dict) else {"items": decoded}


async def self_usernames(api: Any) -> set[str]:
    """The usernames this client authenticates as (one SelfSubjectReview)."""
    answer = await request_json(
        api, "POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews",
        body={"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},
    )
    user = (answer.get("status") or {}).get("userInfo") or {}
    name = user.get("username")
    return {name} if isinstance(name, str) and name else set()


# -- ClusterApi: the verbs the controllers write with ---------------------------------


class ClusterApi(Protocol):
    async def get(self, path: str) -> Obj: ...

    async def create(self, path: str, body: Mapping[str, Any]) -> Obj: ...

    async def replace(self, path: str, body: Mapping[str, Any]) -> Obj: ...

    async def merge_patch(self, path: str, patch: Mapping[str, Any]) -> Obj: ...

    async def json_patch(self, path: str, ops: Sequence[Mapping[str, Any]]) -> Obj: ...

    async def delete_guarded(self, path: str, uid: str) -> None:
        """DELETE, only if the object still has `uid` (else Conflict)."""


# -- paths ---------------------------------------------------------------------------


def _q(part: str) -> str:
    return quote(part, safe="")


def unit_path(namespace: str, name: str = "", *, status: bool = False) -> str:
    base = f"{API_PATH}/namespaces/{_q(namespace)}/{QUEUE_UNIT.plural}"
    if not name:
        return base
    return f"{base}/{_q(name)}" + ("/status" if status else "")


def queue_path(name: str, *, status: bool = False) -> str:
    return f"{QUEUE.path}/{_q(name)}" + ("/status" if status else "")


def job_path(namespace: str, name: str = "") -> str:
    base = f"/apis/batch/v1/namespaces/{_q(namespace)}/jobs"
    return f"{base}/{_q(name)}" if name else base


def jobflow_path(namespace: str, name: str, *, status: bool = False) -> str:
    base = f"{API_PATH}/namespaces/{_q(namespace)}/{JOB_FLOW.plural}/{_q(name)}"
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
    through `request_json`; writes name arbiter as their field manager."""

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
        metrics.api_requests_total.labels(method).inc()
        try:
            return await request_json(self._client, method, path, query=query, body=body,
                                      request_timeout=self._timeout, content_type=content_type)
        except (aiohttp.ClientError, TimeoutError, OSError) as error:
            raise Unreachable(0, "Unreachable",
                              f"{method} {path}: {type(error).__name__} {error}") from error

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

    async def delete_guarded(self, path: str, uid: str) -> None:
        await self._request("DELETE", path, {"apiVersion": "v1", "kind": "DeleteOptions",
                                             "preconditions": {"uid": uid}})
