"""Raw JSON calls to the API server through a kubernetes_asyncio ApiClient.

Responses are decoded with orjson into plain dicts; kubernetes model
objects (slow to build, large to keep) are never made. The ApiClient still
provides what it is good at: kubeconfig / in-cluster auth, TLS, token
refresh, the connection pool.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import aiohttp
import orjson

JSON = dict[str, Any]


class ApiError(Exception):
    """A non-2xx answer: `status` and the Status object's message."""

    def __init__(self, status: int, message: str, body: JSON | None = None) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.message = message
        self.body = body or {}

    @property
    def reason(self) -> str:
        return str(self.body.get("reason", ""))


async def open_stream(
    api: Any,
    method: str,
    path: str,
    *,
    query: Sequence[tuple[str, str]] = (),
    body: Mapping[str, Any] | None = None,
    request_timeout: float | aiohttp.ClientTimeout | None = 30.0,
    content_type: str = "application/json",
) -> aiohttp.ClientResponse:
    """Send the request and return the open response (caller releases it)."""
    headers = {"Accept": "application/json", "Content-Type": content_type}
    response: aiohttp.ClientResponse = await api.call_api(
        path,
        method,
        query_params=list(query),
        header_params=headers,
        body=dict(body) if body is not None else None,
        auth_settings=["BearerToken"],
        _preload_content=False,
        _request_timeout=request_timeout,
    )
    if not 200 <= response.status < 300:
        raw = await response.read()
        response.release()
        try:
            decoded = orjson.loads(raw) if raw else {}
        except orjson.JSONDecodeError:
            decoded = {}
        status_body = decoded if isinstance(decoded, dict) else {}
        message = str(status_body.get("message") or raw[:200].decode(errors="replace"))
        raise ApiError(response.status, message, status_body)
    return response


async def request_json(
    api: Any,
    method: str,
    path: str,
    *,
    query: Sequence[tuple[str, str]] = (),
    body: Mapping[str, Any] | None = None,
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
