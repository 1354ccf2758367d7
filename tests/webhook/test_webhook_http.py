"""The webhook over HTTP: response shape, 400s with one line, metrics, health."""

from __future__ import annotations

import base64
import logging
from collections.abc import AsyncIterator

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from arbiter.server.app import build_app
from arbiter.server.config import ServeConfig
from arbiter.server.context import CONTEXT, ServerContext
from tests.webhook.admission_samples import (
    ADMISSION_GATE,
    QUEUE_LABEL,
    kubectl_run_pod,
    make_store,
    namespace_obj,
    queue_obj,
    review,
)

MAX_BODY = 64 * 1024
Client = TestClient[web.Request, web.Application]


@pytest.fixture
async def client() -> AsyncIterator[Client]:
    store = make_store(queues=[queue_obj("team-a", namespaces=["team-a"])],
                       namespaces=[namespace_obj("team-a"), namespace_obj("lonely")])
    ctx = ServerContext(config=ServeConfig(max_body_bytes=MAX_BODY), store=store)
    app = build_app(ctx, background=False)
    async with TestClient(TestServer(app)) as test_client:
        yield test_client


async def test_mutating_response_carries_base64_json_patch(
        client: Client) -> None:
    body = review("Pod", "CREATE", kubectl_run_pod("web", "team-a"))
    answer = await client.post("/webhook/mutate/pods?timeout=10s", data=orjson.dumps(body),
                               headers={"Content-Type": "application/json"})
    assert answer.status == 200
    assert answer.headers["Content-Type"].startswith("application/json")
    payload = orjson.loads(await answer.read())
    assert payload["apiVersion"] == "admission.k8s.io/v1"
    assert payload["kind"] == "AdmissionReview"
    response = payload["response"]
    assert response["uid"] == body["request"]["uid"]
    assert response["allowed"] is True
    assert response["patchType"] == "JSONPatch"
    ops = orjson.loads(base64.b64decode(response["patch"]))
    assert {"op": "add", "path": "/spec/schedulingGates",
            "value": [{"name": ADMISSION_GATE}]} in ops
    assert {"op": "add", "path": "/metadata/labels/arbiter.dev~1queue",
            "value": "team-a"} in ops


async def test_validating_denial_has_status_and_no_patch(
        client: Client, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)  # the denial log line's extra fields are valid
    body = review("Pod", "CREATE", kubectl_run_pod("web", "lonely", validating=True))
    answer = await client.post("/webhook/validate/pods", data=orjson.dumps(body))
    response = orjson.loads(await answer.read())["response"]
    assert response["allowed"] is False
    assert response["status"]["code"] == 403
    assert response["status"]["message"].startswith('namespace "lonely" has no queue')
    assert "patch" not in response and "patchType" not in response


async def test_allowed_without_changes_has_no_patch(client: Client) -> None:
    pod = kubectl_run_pod("web", "team-a", labels={QUEUE_LABEL: "team-a"})
    pod["spec"]["schedulingGates"] = [{"name": ADMISSION_GATE}]
    answer = await client.post("/webhook/mutate/pods",
                               data=orjson.dumps(review("Pod", "CREATE", pod)))
    response = orjson.loads(await answer.read())["response"]
    assert response["allowed"] is True and "patch" not in response


@pytest.mark.parametrize(("body", "reason"), [
    (b"", "empty body"),
    (b"{not json", "not valid JSON"),
    (b"[]", "must be a JSON object"),
    (orjson.dumps({"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview"}),
     "apiVersion must be admission.k8s.io/v1"),
    (orjson.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "Pod"}),
     "kind must be AdmissionReview"),
    (orjson.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}),
     "request is missing"),
    (orjson.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                   "request": {"kind": {"group": "", "version": "v1", "kind": "Pod"}}}),
     "request.uid is missing"),
    (orjson.dumps(review("Job", "CREATE", {"metadata": {"name": "x"}})),
     "this endpoint reviews Pod, got batch/Job"),
])
async def test_malformed_reviews_get_400_with_one_line(
        client: Client, body: bytes, reason: str) -> None:
    answer = await client.post("/webhook/mutate/pods", data=body)
    assert answer.status == 400
    text = await answer.text()
    assert reason in text
    assert text.count("\n") == 1 and text.endswith("\n")


async def test_wrongly_typed_object_fields_get_400(client: Client) -> None:
    pod = kubectl_run_pod("web", "team-a")
    pod["metadata"]["labels"] = ["not", "a", "map"]
    answer = await client.post("/webhook/mutate/pods",
                               data=orjson.dumps(review("Pod", "CREATE", pod)))
    assert answer.status == 400
    assert "request.object.metadata.labels must be an object" in await answer.text()


async def test_oversized_body_gets_400(client: Client) -> None:
    pod = kubectl_run_pod("web", "team-a")
    pod["metadata"]["annotations"] = {"big": "x" * MAX_BODY}
    answer = await client.post("/webhook/mutate/pods",
                               data=orjson.dumps(review("Pod", "CREATE", pod)))
    assert answer.status == 400
    assert "exceeds the 65536-byte limit" in await answer.text()


async def test_oversized_chunked_body_gets_400(client: Client) -> None:
    # No Content-Length: the limit must hold while reading, not only up front
    # (the app-wide client_max_size is the extender's, far larger).
    pod = kubectl_run_pod("web", "team-a")
    pod["metadata"]["annotations"] = {"big": "x" * MAX_BODY}
    body = orjson.dumps(review("Pod", "CREATE", pod))

    async def chunks() -> AsyncIterator[bytes]:
        for start in range(0, len(body), 8192):
            yield body[start:start + 8192]

    answer = await client.post("/webhook/mutate/pods", data=chunks())
    assert answer.status == 400
    assert "body exceeds the 65536-byte limit" in await answer.text()


async def test_metrics_count_requests_by_outcome(client: Client) -> None:
    async def scrape() -> str:
        return await (await client.get("/metrics")).text()

    def value(text: str, line_prefix: str) -> float:
        for line in text.splitlines():
            if line.startswith(line_prefix):
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    denied = ('arbiter_webhook_requests_total{allowed="false",operation="CREATE",'
              'webhook="validate-pods"}')
    before = value(await scrape(), denied)
    body = review("Pod", "CREATE", kubectl_run_pod("web", "lonely", validating=True))
    await client.post("/webhook/validate/pods", data=orjson.dumps(body))
    text = await scrape()
    assert value(text, denied) == before + 1
    assert 'arbiter_webhook_duration_seconds_count{webhook="validate-pods"}' in text


async def test_health_and_readiness(client: Client) -> None:
    assert (await client.get("/healthz")).status == 200
    assert (await client.get("/readyz")).status == 200
    assert client.app is not None
    ctx = client.app[CONTEXT]
    ctx.store.synced_kinds.discard("Pod")
    answer = await client.get("/readyz")
    assert answer.status == 503 and "Pod" in await answer.text()
