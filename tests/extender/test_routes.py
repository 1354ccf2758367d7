"""The HTTP edge: a real aiohttp server on 127.0.0.1, as kube-scheduler calls it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from arbiter.base import metrics
from arbiter.cache.store import ClusterStore
from extender import routes
from extender.state import ExtenderState
from tests.extender import builders as b


def sample(verb: str, result: str) -> float:
    value = metrics.REGISTRY.get_sample_value(
        "arbiter_extender_requests_total", {"verb": verb, "result": result}
    )
    return value or 0.0


def duration_count(verb: str) -> float:
    value = metrics.REGISTRY.get_sample_value(
        "arbiter_extender_duration_seconds_count", {"verb": verb}
    )
    return value or 0.0


@pytest.fixture
def store() -> ClusterStore:
    store = b.synced_store()
    for i in range(3):
        store.apply("Node", "ADDED", b.node(f"node-{i}"))
    store.apply("Queue", "ADDED", b.queue("a"))
    store.apply("QueueUnit", "ADDED", b.unit("team-a", "pod-ok", "a", phase="Dequeued"))
    return store


@pytest.fixture
async def client(store: ClusterStore) -> AsyncIterator[TestClient[web.Request, web.Application]]:
    app = web.Application()
    app.add_subapp(routes.PREFIX, routes.extender_app(ExtenderState(store), max_body=256 * 1024))
    async with TestClient(TestServer(app, host="127.0.0.1")) as client:
        yield client


Client = TestClient[web.Request, web.Application]


async def post(client: Client, verb: str, body: Any) -> tuple[int, bytes, str]:
    data = body if isinstance(body, bytes) else orjson.dumps(body)
    response = await client.post(f"/scheduler/{verb}", data=data,
                                 headers={"Content-Type": "application/json"})
    return response.status, await response.read(), response.content_type


async def test_filter_answers_200_with_json_and_counts(client: Client) -> None:
    before = sample("filter", "passed")
    timed = duration_count("filter")
    status, body, content_type = await post(
        client, "filter", b.extender_args(b.pod("ok"), ["node-0", "node-2"])
    )
    assert status == 200
    assert content_type == "application/json"
    answer = orjson.loads(body)
    assert answer["NodeNames"] == ["node-0", "node-2"]
    assert answer["FailedNodes"] == {}
    assert answer["FailedAndUnresolvableNodes"] == {}
    assert answer["Error"] == ""
    assert sample("filter", "passed") == before + 1
    assert duration_count("filter") == timed + 1


async def test_filter_rejection_is_still_200(client: Client) -> None:
    before = sample("filter", "rejected")
    status, body, _ = await post(client, "filter", b.extender_args(b.pod("nope"), ["node-1"]))
    assert status == 200
    reason = orjson.loads(body)["FailedAndUnresolvableNodes"]["node-1"]
    assert "no QueueUnit team-a/pod-nope" in reason
    assert sample("filter", "rejected") == before + 1


async def test_prioritize_answers_a_bare_host_priority_list(client: Client) -> None:
    status, body, _ = await post(
        client, "prioritize", b.extender_args(b.pod("ok"), ["node-0", "node-1"])
    )
    assert status == 200
    answer = orjson.loads(body)
    assert isinstance(answer, list)
    assert [entry["Host"] for entry in answer] == ["node-0", "node-1"]
    assert all(set(entry) == {"Host", "Score"} for entry in answer)


async def test_preempt_answers_meta_victims(client: Client, store: ClusterStore) -> None:
    victim = b.pod("victim", queue_name=None, node_name="node-0", phase="Running")
    store.apply("Pod", "ADDED", victim)
    uid = victim["metadata"]["uid"]
    status, body, _ = await post(
        client, "preempt", b.preemption_args(b.pod("ok"), {"node-0": [uid]})
    )
    assert status == 200
    assert orjson.loads(body) == {
        "NodeNameToMetaVictims": {"node-0": {"Pods": [{"UID": uid}], "NumPDBViolations": 0}}
    }


@pytest.mark.parametrize(
    ("verb", "body", "fragment"),
    [
        ("filter", b"{not json", "not valid JSON"),
        ("filter", b"", "empty body"),
        ("prioritize", b"[1, 2]", "expected an object"),
        ("filter", {"Pod": {"metadata": {"name": "x"}}, "NodeNames": []}, "namespace: required"),
        ("preempt", {"Pod": b.pod("p"), "Victims": {}}, "unknown field 'Victims'"),
        ("filter", b"\xff\xfe", "not valid JSON"),
    ],
)
async def test_malformed_requests_get_400_with_one_line(
    client: Client, verb: str, body: Any, fragment: str
) -> None:
    before = sample(verb, "bad_request")
    status, text, _ = await post(client, verb, body)
    assert status == 400
    line = text.decode()
    assert fragment in line
    assert line.count("\n") == 1 and line.endswith("\n")
    assert sample(verb, "bad_request") == before + 1


async def test_oversized_body_is_refused(client: Client) -> None:
    names = [f"node-{i:06d}" for i in range(30_000)]
    status, text, _ = await post(client, "filter", b.extender_args(b.pod("ok"), names))
    assert status == 400
    assert b"limit" in text


async def test_only_post_is_served(client: Client) -> None:
    response = await client.get("/scheduler/filter")
    assert response.status == 405


async def test_a_bug_is_a_500_and_counted(client: Client, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(state: Any, body: Any) -> tuple[Any, str]:
        raise RuntimeError("boom")

    monkeypatch.setitem(routes.VERBS, "filter", broken)
    before = sample("filter", "error")
    status, text, _ = await post(client, "filter", b.extender_args(b.pod("ok"), []))
    assert status == 500
    assert b"boom" in text
    assert sample("filter", "error") == before + 1


async def test_before_the_first_sync_every_call_is_503(client: Client, store: ClusterStore) -> None:
    store.synced_kinds.clear()
    before = sample("filter", "not_ready")
    status, text, _ = await post(client, "filter", b.extender_args(b.pod("ok"), ["node-0"]))
    assert status == 503
    assert b"not synced" in text
    assert sample("filter", "not_ready") == before + 1


def test_respond_is_bytes_to_bytes(store: ClusterStore) -> None:
    state = ExtenderState(store)
    reply = routes.respond("filter", state, orjson.dumps(b.extender_args(b.pod("ok"), ["n"])))
    assert (reply.status, reply.result) == (200, "passed")
    assert orjson.loads(reply.body)["NodeNames"] == ["n"]
    state.close()


def test_a_node_nested_too_deeply_to_echo_is_a_400(store: ClusterStore) -> None:
    """Filter echoes the Nodes it was sent; one nested past what can be
    written back is the caller's fault (was a 500: orjson's recursion limit)."""
    deep = "[" * 600 + "]" * 600
    nodes = [b.node(f"node-{i}") for i in range(3)]
    nodes[0]["metadata"]["annotations"] = {"deep": "@@deep@@"}
    body = orjson.dumps(b.extender_args_nodes(b.pod("ok"), nodes)).replace(
        b'"@@deep@@"', deep.encode())
    reply = routes.respond("filter", ExtenderState(store), body)
    assert reply.status == 400, reply.body
    assert reply.body.count(b"\n") == 1 and b"nested" in reply.body
