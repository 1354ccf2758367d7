"""Hostile values in the reviewed object, over real HTTP: thousand-digit
quantities, values nested ~1,000 deep where a message prints or compares
them, unhashable values where a set lookup happens. Every answer is a 200
denial or a 400 with one line, never a 500 (issue 13, items 6, 7, 9)."""

from __future__ import annotations

import copy
import logging
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from arbiter.server.app import build_app
from arbiter.server.config import ServeConfig
from arbiter.server.context import ServerContext
from tests.webhook.admission_samples import (
    make_store,
    namespace_obj,
    queue_obj,
    review,
    unit_obj,
)

Json = dict[str, Any]
Client = TestClient[web.Request, web.Application]
# Just under orjson's own nesting limit (1,024), past Python's recursion limit.
DEPTH = 1000
NESTED = "@@nested@@"
HUGE = "1" * 5000


def nested_json(depth: int = DEPTH) -> str:
    return "[" * depth + "]" * depth


def dumps(body: Json) -> bytes:
    """orjson refuses to write 255+ levels; splice deep values in as text."""
    text = orjson.dumps(body).decode()
    return text.replace(f'"{NESTED}"', nested_json()).encode()


@pytest.fixture
async def client() -> AsyncIterator[Client]:
    store = make_store(queues=[queue_obj("team-a", namespaces=["team-a"])],
                       namespaces=[namespace_obj("team-a")])
    store.replace_all("JobTemplate", [{"metadata": {"name": "a", "namespace": "team-a"},
                                       "spec": {"template": {}}}])
    store.synced_kinds.update({"JobFlow", "JobTemplate"})
    ctx = ServerContext(config=ServeConfig(), store=store)
    async with TestClient(TestServer(build_app(ctx, background=False),
                                     host="127.0.0.1")) as test_client:
        yield test_client


def jobflow_review(flows: list[Json], *, old_flows: list[Json] | None = None) -> Json:
    def flow(steps: list[Json]) -> Json:
        return {"apiVersion": "arbiter.dev/v1alpha1", "kind": "JobFlow",
                "metadata": {"name": "demo", "namespace": "team-a"},
                "spec": {"flows": steps}}
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": str(uuid.uuid4()),
        "kind": {"group": "arbiter.dev", "version": "v1alpha1", "kind": "JobFlow"},
        "operation": "CREATE" if old_flows is None else "UPDATE",
        "namespace": "team-a", "name": "demo", "userInfo": {"username": "someone"},
        "object": flow(flows), "oldObject": None if old_flows is None else flow(old_flows)}}


def queue_review(**spec: Any) -> Json:
    return review("Queue", "CREATE", queue_obj("q", **spec))


def unit_review(spec: Json, *, old_phase: Any = None) -> Json:
    unit = unit_obj("u", "team-a", spec)
    if old_phase is None:
        return review("QueueUnit", "CREATE", unit)
    old = copy.deepcopy(unit)
    old["status"] = {"phase": old_phase}
    changed = copy.deepcopy(unit)
    changed["spec"]["priority"] = 5
    return review("QueueUnit", "UPDATE", changed, old=old)


def pod_set(**fields: Any) -> Json:
    return {"queue": "team-a", "podSets": [{"name": "main", "count": 1,
                                            "requests": {"cpu": "1"}, **fields}]}


def envelope(key: str) -> Callable[[], Json]:
    def make() -> Json:
        body = queue_review()
        body[key] = NESTED
        return body
    return make


CASES: dict[str, tuple[str, Callable[[], Json]]] = {
    # item 6: quantities past Python's int-conversion limit
    "queue guarantee 5000 digits": ("/webhook/validate/queues",
                                    lambda: queue_review(guarantee={"cpu": HUGE})),
    "queue capability exponent 5000 digits": (
        "/webhook/validate/queues", lambda: queue_review(capability={"cpu": "1e" + HUGE})),
    "unit requests 5000 digits": ("/webhook/validate/queueunits",
                                  lambda: unit_review(pod_set(requests={"cpu": HUGE}))),
    "unit shorthand 5000 digits": ("/webhook/validate/queueunits", lambda: unit_review(
        {"queue": "team-a", "resourceUnit": {"memory": HUGE + "Gi"}})),
    # item 7: deep nesting where a message prints or compares the value
    "review apiVersion nested": ("/webhook/validate/queues", envelope("apiVersion")),
    "review kind nested": ("/webhook/validate/queues", envelope("kind")),
    "queue weight nested": ("/webhook/validate/queues", lambda: queue_review(weight=NESTED)),
    "queue state nested": ("/webhook/validate/queues", lambda: queue_review(state=NESTED)),
    "queue policy nested": ("/webhook/validate/queues",
                            lambda: queue_review(queuePolicy=NESTED)),
    "queue priority nested": ("/webhook/validate/queues",
                              lambda: queue_review(priority=NESTED)),
    "queue guarantee nested": ("/webhook/validate/queues",
                               lambda: queue_review(guarantee={"cpu": NESTED})),
    "unit count nested": ("/webhook/validate/queueunits",
                          lambda: unit_review(pod_set(count=NESTED))),
    "unit minCount nested": ("/webhook/validate/queueunits",
                             lambda: unit_review(pod_set(minCount=NESTED))),
    "unit resourceNo nested": ("/webhook/validate/queueunits", lambda: unit_review(
        {"queue": "team-a", "resourceUnit": {"cpu": "1"}, "resourceNo": NESTED})),
    "jobflow maxRetries nested": ("/webhook/validate/jobflows", lambda: jobflow_review(
        [{"name": "a", "maxRetries": NESTED}])),
    "jobflow condition nested": ("/webhook/validate/jobflows", lambda: jobflow_review(
        [{"name": "a"}, {"name": "b", "dependsOn": {"targets": ["a"], "condition": NESTED}}])),
    "jobflow name nested": ("/webhook/validate/jobflows", lambda: jobflow_review(
        [{"name": NESTED}])),
    "jobflow metadata.name nested": ("/webhook/validate/jobflows", lambda: {
        **(body := jobflow_review([{"name": "a", "template": "nope"}])),
        "request": {**body["request"], "name": "", "object": {
            **body["request"]["object"], "metadata": {"name": NESTED, "namespace": NESTED}}}}),
    "queue delete metadata.name nested": ("/webhook/validate/queues", lambda: review(
        "Queue", "DELETE", None, old={"metadata": {"name": NESTED}}, name="")),
    "jobflow targets nested": ("/webhook/validate/jobflows", lambda: jobflow_review(
        [{"name": "a"}, {"name": "b", "dependsOn": {"targets": NESTED}}])),
    "jobflow update nested patch": ("/webhook/validate/jobflows", lambda: jobflow_review(
        [{"name": "a", "patch": {"x": NESTED}}],
        old_flows=[{"name": "a", "patch": {"x": NESTED}}])),
    "jobflow update nested patch changed": ("/webhook/validate/jobflows", lambda: jobflow_review(
        [{"name": "a", "patch": {"x": NESTED, "y": 1}}],
        old_flows=[{"name": "a", "patch": {"x": NESTED}}])),
    "unit shorthand resourceUnit nested (mutate)": (
        "/webhook/mutate/queueunits", lambda: unit_review(
            {"queue": "team-a", "resourceUnit": {"cpu": NESTED}, "resourceNo": 2})),
    "unit shorthand resourceUnit a list (mutate)": (
        "/webhook/mutate/queueunits", lambda: unit_review(
            {"queue": "team-a", "resourceUnit": NESTED, "resourceNo": 2})),
    # item 9: unhashable values looked up in sets
    "unit old phase a list": ("/webhook/validate/queueunits",
                              lambda: unit_review(pod_set(), old_phase=["Running"])),
    "unit old phase an object": ("/webhook/validate/queueunits",
                                 lambda: unit_review(pod_set(), old_phase={"a": 1})),
    "unit old phase nested": ("/webhook/validate/queueunits",
                              lambda: unit_review(pod_set(), old_phase=NESTED)),
}


@pytest.mark.parametrize("case", sorted(CASES))
async def test_hostile_values_never_get_a_500(client: Client, case: str,
                                              caplog: pytest.LogCaptureFixture) -> None:
    path, make = CASES[case]
    body = make()
    with caplog.at_level(logging.INFO):
        answer = await client.post(path, data=dumps(body),
                                   headers={"Content-Type": "application/json"})
    text = await answer.text()
    assert answer.status in (200, 400), text[:300]
    assert not [r for r in caplog.records if r.exc_info], "a traceback was logged"
    if answer.status == 400:
        assert text.count("\n") == 1 and len(text) < 1100
        return
    response = orjson.loads(text)["response"]
    assert response["uid"] == body["request"]["uid"]
    if case.startswith(("unit old phase", "jobflow update nested patch", "queue delete")) \
            or "mutate" in case:
        return  # may be allowed: the point is an answer, not a 500
    assert response["allowed"] is False, response
    assert len(response["status"]["message"]) <= 1000


async def test_a_flow_with_a_deep_patch_can_be_updated(client: Client) -> None:
    """Reachable through the apiserver: such a flow must stay updatable."""
    steps = [{"name": "a", "patch": {"x": NESTED}}]
    body = jobflow_review(steps, old_flows=steps)
    body["request"]["object"]["metadata"]["labels"] = {"changed": "yes"}
    answer = await client.post("/webhook/validate/jobflows", data=dumps(body))
    assert answer.status == 200, await answer.text()
    assert orjson.loads(await answer.read())["response"]["allowed"] is True
