"""Raw JSON calls to the API server through a kubernetes_asyncio ApiClient.

Responses are decoded with orjson into plain dicts; kubernetes model
objects (slow to build, large to keep) are never made. The ApiClient still
provides what it is good at: kubeconfig / in-cluster auth, TLS, token
refresh, the connection pool. This is the one raw client: the cache's
watchers, certificates, webhook configurations and the CLIs call it
directly, and the admission loop through `arbiter.loop.kube.KubeApi`.
Failures are `ApiError`s, a subclass for each answer callers treat apart.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import aiohttp
import orjson

JSON = dict[str, Any]
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
