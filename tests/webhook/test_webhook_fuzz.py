"""Fuzzing every webhook endpoint over real HTTP on 127.0.0.1.

Thousands of reviews: valid ones with random parts replaced by random JSON
(wrong types everywhere), random JSON documents, and random bytes. The
server must never answer 500 or crash: every answer is either a 400 with a
one-line reason or a 200 carrying a well-formed AdmissionReview response
(the request's uid, a boolean, a status on denial, a patch only from a
mutating endpoint, and one that applies cleanly to the reviewed object).
"""

from __future__ import annotations

import asyncio
import base64
import copy
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from aiohttp import ClientSession
from aiohttp.test_utils import TestServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from arbiter.server.app import build_app
from arbiter.server.config import ServeConfig
from arbiter.server.context import ServerContext
from tests.hostile import json_paths as _paths
from tests.webhook.admission_samples import (
    QUEUE_LABEL,
    job,
    job_pod,
    kubectl_run_pod,
    make_store,
    namespace_obj,
    queue_obj,
    review,
    unit_obj,
)
from tests.webhook.workload_samples import cache, jobset, lws, owned_by, statefulset, switch_on
from webhook.endpoints import BY_PATH, ENDPOINTS
from webhook.patch import apply_patch

EXAMPLES = 1500

_SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=12),
    st.sampled_from(["", "CREATE", "UPDATE", "DELETE", "v1", "Pod", "team-a",
                     "arbiter.dev/admission", "100m", "1Gi", "-1", "1e400", "Closed"]),
)
JSON = st.recursive(
    _SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=4),
                            st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=12,
)


# A held JobSet in the harness's cache: the owner of the child bases.
JOBSET = jobset("js", labels={QUEUE_LABEL: "team-a"}, suspend=True, validating=True)


def _bases() -> list[tuple[str, dict[str, Any]]]:
    held = kubectl_run_pod("held", "team-a", labels={QUEUE_LABEL: "team-a"}, validating=True)
    held["spec"]["schedulingGates"] = [{"name": "arbiter.dev/admission"}]
    unit_spec = {"queue": "team-a", "podSets": [{"name": "main", "count": 2, "minCount": 1,
                                                 "requests": {"cpu": "1"}}]}
    labelled_job = job("j", "team-a", labels={QUEUE_LABEL: "team-a"}, suspend=True,
                       template_labels={QUEUE_LABEL: "team-a"})
    labelled_jobset = copy.deepcopy(JOBSET)
    return [
        ("pods", review("Pod", "CREATE", kubectl_run_pod("web", "team-a"))),
        ("pods", review("Pod", "CREATE", job_pod("j", "team-a", queue="team-a"))),
        ("pods", review("Pod", "UPDATE", held, old=copy.deepcopy(held))),
        ("jobs", review("Job", "CREATE", job("j", "team-a"))),
        ("jobs", review("Job", "CREATE", owned_by(job("js-a-0", "team-a", validating=True),
                                                  JOBSET))),
        ("jobs", review("Job", "UPDATE", labelled_job, old=copy.deepcopy(labelled_job))),
        ("queues", review("Queue", "CREATE", queue_obj("q", guarantee={"cpu": "1"},
                                                       capability={"cpu": "2"},
                                                       namespaces=["x"], parent="team-a"))),
        ("queues", review("Queue", "DELETE", None, old=queue_obj("team-a"))),
        ("queueunits", review("QueueUnit", "CREATE", unit_obj("u", "team-a", unit_spec))),
        ("queueunits", review("QueueUnit", "CREATE", unit_obj(
            "u", "team-a", {"resourceUnit": {"cpu": "1"}, "resourceNo": 2}))),
        ("jobsets", review("JobSet", "CREATE", jobset("js"))),
        ("jobsets", review("JobSet", "UPDATE", labelled_jobset,
                           old=copy.deepcopy(labelled_jobset))),
        ("leaderworkersets", review("LeaderWorkerSet", "CREATE", lws("l"))),
        ("statefulsets", review("StatefulSet", "CREATE", owned_by(
            statefulset("s", validating=True), labelled_jobset))),
    ]


BASES = _bases()


@st.composite
def mutated_reviews(draw: st.DrawFn) -> tuple[str, bytes]:
    plural, base = draw(st.sampled_from(BASES))
    document = copy.deepcopy(base)
    for _ in range(draw(st.integers(min_value=1, max_value=4))):
        paths = list(_paths(document))[1:]
        if not paths:  # every key deleted already: sampled_from([]) would raise
            break
        path = draw(st.sampled_from(paths))
        parent: Any = document
        for token in path[:-1]:
            parent = parent[token]
        if draw(st.booleans()) and isinstance(parent, dict):
            del parent[path[-1]]
        else:
            parent[path[-1]] = draw(JSON)
        if not isinstance(document, dict):
            break
    mode = draw(st.sampled_from(["mutate", "validate"]))
    path = f"/webhook/{mode}/{plural}"
    if path not in BY_PATH:
        path = f"/webhook/validate/{plural}"
    return path, orjson.dumps(document)


@st.composite
def junk(draw: st.DrawFn) -> tuple[str, bytes]:
    endpoint = draw(st.sampled_from(ENDPOINTS))
    body = draw(st.one_of(
        st.binary(max_size=200),
        JSON.map(orjson.dumps),
        st.builds(lambda r: orjson.dumps({"apiVersion": "admission.k8s.io/v1",
                                          "kind": "AdmissionReview", "request": r}), JSON),
    ))
    return endpoint.path, body


class Harness:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        store = make_store(
            queues=[queue_obj("team-a", namespaces=["team-a"]), queue_obj("x", parent="team-a")],
            namespaces=[namespace_obj("team-a")],
            units=[unit_obj("job-j", "team-a", {"queue": "team-a", "podSets": [
                {"name": "main", "count": 1}]}, phase="Running")])
        switch_on(store)
        cache(store, JOBSET)  # its Jobs and StatefulSets take the children's path
        ctx = ServerContext(config=ServeConfig(max_body_bytes=1 << 20), store=store)
        self.server = TestServer(build_app(ctx, background=False), host="127.0.0.1")
        self.loop.run_until_complete(self.server.start_server())
        self.session = self.loop.run_until_complete(self._session())

    async def _session(self) -> ClientSession:
        return ClientSession()

    def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        async def call() -> tuple[int, bytes]:
            async with self.session.post(self.server.make_url(path), data=body) as answer:
                return answer.status, await answer.read()
        return self.loop.run_until_complete(call())

    def close(self) -> None:
        self.loop.run_until_complete(self.session.close())
        self.loop.run_until_complete(self.server.close())
        self.loop.close()


@pytest.fixture(scope="module")
def harness() -> Iterator[Harness]:
    instance = Harness()
    yield instance
    instance.close()


def check_answer(path: str, body: bytes, status: int, payload: bytes) -> None:
    assert status in (200, 400), (status, payload[:300])
    if status == 400:
        text = payload.decode()
        assert text.endswith("\n") and text.count("\n") == 1 and len(text) > 1
        return
    request = orjson.loads(body)["request"]
    answer = orjson.loads(payload)
    assert answer["apiVersion"] == "admission.k8s.io/v1"
    assert answer["kind"] == "AdmissionReview"
    response = answer["response"]
    assert response["uid"] == request["uid"] and isinstance(response["uid"], str)
    assert isinstance(response["allowed"], bool)
    assert set(response) <= {"uid", "allowed", "status", "patchType", "patch", "warnings"}
    if not response["allowed"]:
        assert isinstance(response["status"]["code"], int)
        message = response["status"]["message"]
        assert isinstance(message, str) and message and "\n" not in message
        assert "patch" not in response
    if "patch" in response:
        assert BY_PATH[path].mutating and response["patchType"] == "JSONPatch"
        ops = orjson.loads(base64.b64decode(response["patch"]))
        assert isinstance(ops, list) and ops
        apply_patch(request["object"], ops)  # raises if the patch does not apply
    for warning in response.get("warnings", []):
        assert isinstance(warning, str)


@settings(max_examples=EXAMPLES, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(case=mutated_reviews())
def test_mutated_reviews_never_500(harness: Harness, case: tuple[str, bytes]) -> None:
    path, body = case
    status, payload = harness.post(path, body)
    check_answer(path, body, status, payload)


@settings(max_examples=EXAMPLES, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(case=junk())
def test_junk_never_500(harness: Harness, case: tuple[str, bytes]) -> None:
    path, body = case
    status, payload = harness.post(path, body)
    check_answer(path, body, status, payload)


def test_every_base_review_is_answered_200(harness: Harness) -> None:
    for plural, base in BASES:
        for mode in ("mutate", "validate"):
            path = f"/webhook/{mode}/{plural}"
            if path in BY_PATH:
                body = orjson.dumps(base)
                status, payload = harness.post(path, body)
                assert status == 200, (path, payload)
                check_answer(path, body, status, payload)


# -- the seeded hostile slice (issue 13): shared with bench/fuzz_surfaces.py --
HOSTILE_SLICE = 500


async def test_hostile_reviews_over_http(caplog: pytest.LogCaptureFixture) -> None:
    """Deep nesting, huge numbers, thousand-digit quantities, wrong types,
    false Content-Encodings and truncated bodies, for every path and kind."""
    from tests.hostile import Generator, run_cases, world

    ctx = ServerContext(config=ServeConfig(), store=world())
    server = TestServer(build_app(ctx, background=False), host="127.0.0.1")
    await server.start_server()
    try:
        assert server.port is not None
        tally = await run_cases(Generator(seed=13).cases(HOSTILE_SLICE, 0), server.port)
    finally:
        await server.close()
    assert tally.sent == HOSTILE_SLICE
    assert tally.problem_count == 0, tally.problems
    assert tally.uid_echo_failures == 0
    assert tally.by_status.get(200, 0) > HOSTILE_SLICE // 10  # not all turned away at the door
    assert not [r for r in caplog.records if r.exc_info], "a traceback was logged"
