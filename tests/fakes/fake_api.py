"""An in-memory stand-in for kubernetes_asyncio's ApiClient.call_api, enough
for arbiter.base.kubeapi's raw JSON calls (GET / POST / PUT on object paths)."""

from __future__ import annotations

from typing import Any

import orjson


class FakeResponse:
    def __init__(self, status: int, body: Any) -> None:
        self.status = status
        self._raw = orjson.dumps(body)

    async def read(self) -> bytes:
        return self._raw

    def release(self) -> None:
        pass


class FakeApi:
    """Objects by path; resourceVersion checked on PUT like the apiserver."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.calls: list[tuple[str, str]] = []
        self._version = 0

    def _next_version(self) -> str:
        self._version += 1
        return str(self._version)

    async def call_api(self, path: str, method: str, **kwargs: Any) -> FakeResponse:
        self.calls.append((method, path))
        body = kwargs.get("body")
        if method == "GET":
            if path not in self.objects:
                return FakeResponse(404, {"kind": "Status", "code": 404, "reason": "NotFound",
                                          "message": f"{path} not found"})
            return FakeResponse(200, self.objects[path])
        if method == "POST":
            assert body is not None
            name = body["metadata"]["name"]
            target = f"{path}/{name}"
            if target in self.objects:
                return FakeResponse(409, {"code": 409, "reason": "AlreadyExists",
                                          "message": "exists"})
            stored = orjson.loads(orjson.dumps(body))
            stored["metadata"]["resourceVersion"] = self._next_version()
            self.objects[target] = stored
            return FakeResponse(201, stored)
        if method == "PUT":
            assert body is not None
            current = self.objects.get(path)
            if current is None:
                return FakeResponse(404, {"code": 404, "message": "not found"})
            if body["metadata"].get("resourceVersion") != current["metadata"]["resourceVersion"]:
                return FakeResponse(409, {"code": 409, "reason": "Conflict",
                                          "message": "the object has been modified"})
            stored = orjson.loads(orjson.dumps(body))
            stored["metadata"]["resourceVersion"] = self._next_version()
            self.objects[path] = stored
            return FakeResponse(200, stored)
        return FakeResponse(405, {"code": 405, "message": method})
