"""Fuzzing: whatever arrives, the extender answers 200 or 400, never 500.

Thousands of generated bodies go through `routes.respond` (the whole
bytes -> decision -> bytes path), and a few hundred through a real HTTP
server running in a thread.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import http.client
import threading
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from aiohttp import web
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from extender import routes
from extender.state import ExtenderState
from tests.extender import builders as b

VERBS = ("filter", "prioritize", "preempt")

scalars = (
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=12)
)
json_values = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=12,
)
envelope_keys = st.sampled_from([
    "Pod", "pod", "POD", "Nodes", "NodeNames", "nodenames", "NodeNameToVictims",
    "NodeNameToMetaVictims", "Error", "Host",
])


def _world() -> tuple[ExtenderState, list[str], dict[str, str]]:
    store = b.synced_store()
    names = [f"node-{i}" for i in range(4)]
    for i, name in enumerate(names):
        store.apply("Node", "ADDED", b.node(name, labels={"pool": "x"} if i % 2 else {}))
    store.apply("Queue", "ADDED", b.queue("a", capability={"cpu": "3"}))
    store.apply("Queue", "ADDED", b.queue("b", node_selector={"pool": "x"}))
    store.apply("QueueUnit", "ADDED", b.unit("team-a", "pod-p", "a", phase="Dequeued"))
    store.apply("QueueUnit", "ADDED", b.unit("team-a", "job-j", "b", phase="Running", count=4))
    store.apply("QueueUnit", "ADDED", b.unit("team-a", "job-k", "b", phase="Enqueued", count=9))
    uids: dict[str, str] = {}
    for i, name in enumerate(names):
        obj = b.pod(f"j-{i}", queue_name="b", job="j", node_name=name, phase="Running")
        store.apply("Pod", "ADDED", obj)
        uids[name] = obj["metadata"]["uid"]
    return ExtenderState(store), names, uids


@functools.cache
def world() -> tuple[ExtenderState, list[str], dict[str, str]]:
    return _world()


def valid_bodies() -> list[tuple[str, dict[str, Any]]]:
    _, names, uids = world()
    return [
        ("filter", b.extender_args(b.pod("p"), names)),
        ("filter", b.extender_args(b.pod("q", queue_name="b", job="j"), names)),
        ("filter", b.extender_args_nodes(b.pod("q", queue_name="b", job="j"),
                                         [b.node(n) for n in names])),
        ("prioritize", b.extender_args(b.pod("q", queue_name="b", job="j"), names)),
        ("preempt", b.preemption_args(b.pod("p", priority=9),
                                      {n: [uids[n]] for n in names})),
        ("preempt", {"Pod": b.pod("p"), "NodeNameToMetaVictims": None, "NodeNameToVictims": {
            "node-0": {"Pods": [b.pod("v", node_name="node-0", queue_name="b")],
                       "NumPDBViolations": 0}}}),
    ]


def check(verb: str, reply: routes.Reply) -> None:
    assert reply.status in (200, 400), reply.body
    if reply.status == 400:
        text = reply.body.decode()
        assert text.endswith("\n") and text.count("\n") == 1
        assert reply.result == "bad_request"
        return
    answer = orjson.loads(reply.body)
    if verb == "filter":
        assert set(answer) == {"Nodes", "NodeNames", "FailedNodes",
                               "FailedAndUnresolvableNodes", "Error"}
    elif verb == "prioritize":
        assert all(0 <= entry["Score"] <= 10 for entry in answer)
    else:
        for victims in answer["NodeNameToMetaVictims"].values():
            assert victims["Pods"]


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(verb=st.sampled_from(VERBS), body=json_values)
def test_arbitrary_json(verb: str, body: Any) -> None:
    check(verb, routes.respond(verb, world()[0], orjson.dumps(body)))


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(verb=st.sampled_from(VERBS), body=st.dictionaries(envelope_keys, json_values, max_size=3))
def test_envelopes_with_random_fields(verb: str, body: dict[str, Any]) -> None:
    check(verb, routes.respond(verb, world()[0], orjson.dumps(body)))


@settings(max_examples=500, deadline=None)
@given(verb=st.sampled_from(VERBS), raw=st.binary(max_size=64))
def test_arbitrary_bytes(verb: str, raw: bytes) -> None:
    check(verb, routes.respond(verb, world()[0], raw))


def _mutate(data: st.DataObject, body: Any) -> Any:
    """Walk to a random place in `body` and replace or delete what is there."""
    body = copy.deepcopy(body)
    parent: Any = None
    key: Any = None
    node = body
    while isinstance(node, dict | list) and node and data.draw(st.booleans()):
        keys = list(node) if isinstance(node, dict) else list(range(len(node)))
        parent, key = node, data.draw(st.sampled_from(keys))
        node = node[key]
    if parent is None:
        return data.draw(json_values)
    if isinstance(parent, dict) and data.draw(st.booleans()):
        del parent[key]
    else:
        parent[key] = data.draw(json_values)
    return body


@settings(max_examples=3000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), which=st.integers(0, 5))
def test_mutated_valid_requests(data: st.DataObject, which: int) -> None:
    verb, body = valid_bodies()[which]
    check(verb, routes.respond(verb, world()[0], orjson.dumps(_mutate(data, body))))


def test_valid_bodies_are_answered() -> None:
    for verb, body in valid_bodies():
        reply = routes.respond(verb, world()[0], orjson.dumps(body))
        assert reply.status == 200, reply.body


# -- over HTTP ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def server_port() -> Iterator[int]:
    """An extender app on 127.0.0.1 in a thread with its own event loop."""
    state, _, _ = _world()
    loop = asyncio.new_event_loop()
    started = threading.Event()
    holder: dict[str, Any] = {}

    async def start() -> None:
        app = web.Application()
        app.add_subapp(routes.PREFIX, routes.extender_app(ExtenderState(state.store),
                                                              max_body=1 << 26))
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        holder["runner"] = runner
        holder["port"] = runner.addresses[0][1]
        started.set()

    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(start(), loop).result(timeout=10)
    assert started.wait(10)
    yield int(holder["port"])
    asyncio.run_coroutine_threadsafe(holder["runner"].cleanup(), loop).result(timeout=10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(timeout=10)
    loop.close()


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data(), which=st.integers(0, 5))
def test_http_never_500(server_port: int, data: st.DataObject, which: int) -> None:
    verb, body = valid_bodies()[which]
    payload = orjson.dumps(_mutate(data, body))
    connection = http.client.HTTPConnection("127.0.0.1", server_port, timeout=10)
    try:
        connection.request("POST", f"/scheduler/{verb}", body=payload,
                           headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        answer = response.read()
    finally:
        connection.close()
    assert response.status in (200, 400), answer
    if response.status == 200:
        orjson.loads(answer)


# -- the seeded hostile slice (issue 13): shared with bench/fuzz_surfaces.py --
HOSTILE_SLICE = 500


async def test_hostile_extender_args_over_http(caplog: pytest.LogCaptureFixture) -> None:
    """Deep nesting, huge numbers, thousand-digit quantities, wrong types,
    false Content-Encodings and truncated bodies, for every verb."""
    from aiohttp.test_utils import TestServer

    from tests.hostile import Generator, run_cases, world

    app = web.Application()
    app.add_subapp(routes.PREFIX, routes.extender_app(ExtenderState(world()), max_body=1 << 20))
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        assert server.port is not None
        tally = await run_cases(Generator(seed=13).cases(0, HOSTILE_SLICE), server.port)
    finally:
        await server.close()
    assert tally.sent == HOSTILE_SLICE
    assert tally.problem_count == 0, tally.problems
    assert tally.by_status.get(200, 0) > HOSTILE_SLICE // 10
    assert not [r for r in caplog.records if r.exc_info], "a traceback was logged"
