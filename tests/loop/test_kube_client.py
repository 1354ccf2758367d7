"""KubeApi rides on the one raw client in `arbiter.base.kubeapi`: same
requests, same error types, JSON Patch bodies included."""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson
import pytest

from arbiter.base import kubeapi
from arbiter.base.kubeapi import KubeApi


class Answer:
    def __init__(self, status: int, raw: bytes) -> None:
        self.status = status
        self._raw = raw
        self.released = False

    async def read(self) -> bytes:
        return self._raw

    def release(self) -> None:
        self.released = True


class RecordingClient:
    """Stands in for kubernetes_asyncio's ApiClient.call_api."""

    def __init__(self, status: int = 200, body: Any = None, raw: bytes | None = None) -> None:
        self.answer = Answer(status, raw if raw is not None else orjson.dumps(body or {}))
        self.calls: list[dict[str, Any]] = []

    async def call_api(self, path: str, method: str, **kwargs: Any) -> Answer:
        self.calls.append({"path": path, "method": method, **kwargs})
        return self.answer


async def test_json_patch_goes_through_the_raw_client_with_a_list_body() -> None:
    client = RecordingClient(body={"metadata": {"name": "x"}})
    ops = [{"op": "test", "path": "/metadata/uid", "value": "u"},
           {"op": "remove", "path": "/spec/schedulingGates/0"}]
    answer = await KubeApi(client, timeout=4.0).json_patch("/api/v1/namespaces/n/pods/x", ops)
    assert answer == {"metadata": {"name": "x"}}
    (call,) = client.calls
    assert call["method"] == "PATCH" and call["body"] == ops
    assert call["header_params"]["Content-Type"] == "application/json-patch+json"
    assert call["query_params"] == [("fieldManager", "kube-arbiter")]
    assert call["_request_timeout"] == 4.0
    assert client.answer.released


async def test_the_raw_client_sends_a_json_patch_itself() -> None:
    client = RecordingClient(body={"kind": "Pod"})
    ops = [{"op": "add", "path": "/metadata/labels/a", "value": "b"}]
    await kubeapi.request_json(client, "PATCH", "/p", body=ops,
                               content_type="application/json-patch+json")
    assert client.calls[0]["body"] == ops


async def test_gets_carry_no_field_manager() -> None:
    client = RecordingClient(body={})
    await KubeApi(client).get("/api/v1/nodes/n")
    assert client.calls[0]["query_params"] == [] and client.calls[0]["body"] is None


@pytest.mark.parametrize(("status", "status_body", "kind"), [
    (404, {"reason": "NotFound", "message": "pods \"x\" not found"}, kubeapi.NotFound),
    (409, {"reason": "AlreadyExists", "message": "exists"}, kubeapi.AlreadyExists),
    (409, {"reason": "Conflict", "message": "the object has been modified"}, kubeapi.Conflict),
    (422, {"reason": "Invalid", "message": "testing value /metadata/uid failed"}, kubeapi.Invalid),
    (403, {"reason": "Forbidden", "message": "no"}, kubeapi.Denied),
    (400, {"message": 'admission webhook "jobs.arbiter.dev" denied the request'}, kubeapi.Denied),
    (500, {"reason": "InternalError", "message": "etcd"}, kubeapi.ApiError),
])
async def test_one_error_type_for_every_caller(status: int, status_body: dict[str, str],
                                               kind: type[kubeapi.ApiError]) -> None:
    async def loop_client(client: RecordingClient) -> object:
        return await KubeApi(client).get("/x")

    async def raw_client(client: RecordingClient) -> object:
        return await kubeapi.request_json(client, "GET", "/x")

    for call in (loop_client, raw_client):
        client = RecordingClient(status, {"kind": "Status", "code": status, **status_body})
        with pytest.raises(kubeapi.ApiError) as caught:
            await call(client)
        assert type(caught.value) is kind
        assert caught.value.status == status
        assert caught.value.message == status_body["message"]
        assert caught.value.reason == status_body.get("reason", "")
        assert client.answer.released


async def test_error_text_names_the_status_and_survives_a_non_json_body() -> None:
    client = RecordingClient(502, raw=b"<html>bad gateway</html>")
    with pytest.raises(kubeapi.ApiError) as caught:
        await KubeApi(client).create("/x", {"metadata": {}})
    assert caught.value.message == "<html>bad gateway</html>"
    assert str(caught.value) == "HTTP 502: <html>bad gateway</html>"
    assert str(kubeapi.NotFound(404, "NotFound", "gone")) == "HTTP 404 NotFound: gone"


class Unanswered:
    """A client whose connection is refused, cut or timed out."""

    def __init__(self, error: BaseException) -> None:
        self.error = error

    async def call_api(self, path: str, method: str, **kwargs: Any) -> Answer:
        raise self.error


@pytest.mark.parametrize("error", [
    aiohttp.ClientConnectionError("reset"), ConnectionResetError(), TimeoutError()])
async def test_no_answer_is_an_api_error_every_writer_retries(error: BaseException) -> None:
    # Uncaught, it ended the write's task with no retry scheduled (seen in
    # the chaos run: an apiserver restart, the proxy cut).
    with pytest.raises(kubeapi.Unreachable) as raised:
        await KubeApi(Unanswered(error)).merge_patch("/apis/x/status", {"status": {}})
    assert isinstance(raised.value, kubeapi.ApiError) and raised.value.status == 0
    assert "PATCH /apis/x/status" in str(raised.value)
