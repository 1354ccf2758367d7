"""A webhook denial that rests on this replica's watch being behind is
decided again when the record arrives (`Decision.recheck`,
`arbiter.cache.changes`), within a bounded wait, over HTTP."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from arbiter.base import metrics
from arbiter.cache.changes import ChangeWaiter
from arbiter.cache.store import ClusterStore
from arbiter.server.app import build_app
from arbiter.server.config import ServeConfig
from arbiter.server.context import ServerContext
from tests.webhook.admission_samples import (
    JOB_CONTROLLER,
    QUEUE_LABEL,
    Json,
    job,
    job_pod,
    make_store,
    namespace_obj,
    queue_obj,
    review,
)

Client = TestClient[web.Request, web.Application]


def _store() -> ClusterStore:
    return make_store(queues=[queue_obj("team-a", namespaces=["team-a"])],
                      namespaces=[namespace_obj("team-a")])


def _job_of(pod: Json, *, suspended: bool) -> Json:
    """The Job the pod's ownerReference names, labelled for queue team-a."""
    labels = {QUEUE_LABEL: "team-a"}
    made = job("train", "team-a", labels=labels, template_labels=labels, validating=True)
    made["metadata"]["uid"] = pod["metadata"]["ownerReferences"][0]["uid"]
    made["spec"]["suspend"] = suspended
    return made


@pytest.fixture
async def served() -> AsyncIterator[tuple[Client, ServerContext]]:
    ctx = ServerContext(config=ServeConfig(max_body_bytes=64 * 1024), store=_store())
    async with TestClient(TestServer(build_app(ctx, background=False))) as client:
        yield client, ctx


async def _post(client: Client, path: str, body: Json) -> Json:
    answer = await client.post(path, data=orjson.dumps(body),
                               headers={"Content-Type": "application/json"})
    assert answer.status == 200
    response: Json = orjson.loads(await answer.read())["response"]
    return response


def _rechecks(outcome: str) -> float:
    return float(metrics.webhook_rechecks_total.labels(outcome)._value.get())


@pytest.mark.parametrize("path", ["/webhook/mutate/pods", "/webhook/validate/pods"])
async def test_a_pod_of_a_job_the_watch_delivers_during_the_review_is_let_through(
        served: tuple[Client, ServerContext], path: str) -> None:
    """The Job controller makes a fast-path Job's pods as soon as its own
    watch shows the Job; this replica's watch delivers it 0.2 s later. The
    review waits for it instead of a 503 (the Job controller's retry backs
    off for seconds)."""
    client, ctx = served
    pod = job_pod("train", "team-a", queue="team-a")
    before = _rechecks("decided")

    async def watch_delivers() -> None:
        await asyncio.sleep(0.2)
        ctx.store.apply("Job", "ADDED", _job_of(pod, suspended=False))

    started = time.monotonic()
    delivered = asyncio.ensure_future(watch_delivers())
    response = await _post(client, path, review("Pod", "CREATE", pod, user=JOB_CONTROLLER))
    await delivered
    assert response["allowed"] is True, response
    assert 0.2 <= time.monotonic() - started < 1.0
    assert _rechecks("decided") == before + 1
    assert ctx.changes.waiting == 0


async def test_a_pod_of_a_job_started_by_the_leader_a_moment_ago_waits_for_the_start(
        served: tuple[Client, ServerContext]) -> None:
    """The replica has the Job still suspended (held) when the leader's
    unsuspend reaches the Job controller first: the denial waits for the
    Job's next change, and a change that does not start it is waited past."""
    client, ctx = served
    pod = job_pod("train", "team-a", queue="team-a")
    ctx.store.apply("Job", "ADDED", _job_of(pod, suspended=True))

    async def watch_delivers() -> None:
        await asyncio.sleep(0.1)
        relabelled = _job_of(pod, suspended=True)
        relabelled["metadata"]["annotations"] = {"note": "unrelated"}
        ctx.store.apply("Job", "MODIFIED", relabelled)
        await asyncio.sleep(0.1)
        ctx.store.apply("Job", "MODIFIED", _job_of(pod, suspended=False))

    delivered = asyncio.ensure_future(watch_delivers())
    response = await _post(client, "/webhook/mutate/pods",
                           review("Pod", "CREATE", pod, user=JOB_CONTROLLER))
    await delivered
    assert response["allowed"] is True, response


async def test_a_pod_claiming_a_job_that_never_comes_is_denied_after_the_wait(
        served: tuple[Client, ServerContext]) -> None:
    """A forged (or really late) claim: refused with the retryable 503 once
    the wait is over, and the wait is bounded by `recheck_within`."""
    client, _ = served
    pod = job_pod("ghost", "team-a", queue="team-a")
    before = _rechecks("unchanged")
    started = time.monotonic()
    response = await _post(client, "/webhook/mutate/pods",
                           review("Pod", "CREATE", pod, user=JOB_CONTROLLER))
    waited = time.monotonic() - started
    assert response["allowed"] is False
    assert response["status"]["code"] == 503
    assert "has not seen it yet" in response["status"]["message"]
    assert 0.9 <= waited < 2.0, waited
    assert _rechecks("unchanged") == before + 1


async def test_the_waiter_wakes_on_the_named_record_only_and_forgets_its_waiters() -> None:
    waiter = ChangeWaiter(limit=2)
    woken = asyncio.ensure_future(waiter.changed("Job", "team-a/train", 1.0))
    other = asyncio.ensure_future(waiter.changed("Job", "team-a/other", 0.1))
    await asyncio.sleep(0)
    assert waiter.waiting == 2
    # Full: a third waiter is answered at once, not queued.
    started = time.monotonic()
    assert await waiter.changed("Job", "team-a/third", 1.0) is False
    assert time.monotonic() - started < 0.05
    waiter.on_change("Job", "team-a/train")
    waiter.on_change("QueueUnit", "team-a/other")  # same key, another kind
    assert await woken is True
    assert await other is False
    assert waiter.waiting == 0 and not waiter._waiting
    assert await waiter.changed("Job", "team-a/train", 0) is False
