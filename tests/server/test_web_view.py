"""The read-only web view (DESIGN §15): pages, live counts, who sees what."""

from __future__ import annotations

import asyncio
import time
from html import escape
from typing import Any

import orjson
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from arbiter.base.kubeapi import unit_path
from arbiter.cache.store import ClusterStore
from arbiter.loop.mirror import EngineMirror
from arbiter.loop.runtime import Leadership
from arbiter.server import debug
from arbiter.server.app import build_metrics_app
from arbiter.server.config import ServeConfig
from arbiter.server.context import ServerContext
from arbiter.server.web import access, live
from arbiter.server.web import app as web_routes
from tests.loop.harness import Cluster

HTML = {"Accept": "text/html"}


def _app(store: ClusterStore, mode: Any = "loopback",
         reviewer: access.ViewerReviewer | None = None,
         leadership: Leadership | None = None) -> web.Application:
    app = web.Application()
    app.add_subapp(web_routes.PREFIX, web_routes.web_app(
        store=store, overcommit=1.0, leadership=leadership or Leadership(), access_mode=mode,
        reviewer=reviewer))
    return app


async def _namespace(c: Cluster, name: str) -> None:
    await c.api.create("/api/v1/namespaces", {"metadata": {"name": name}})


async def _reserve(c: Cluster, namespace: str, name: str, queue: str, cpu: str = "1") -> None:
    await c.api.create(unit_path(namespace), {
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"queue": queue, "podSets": [{"name": "main", "count": 1,
                                              "requests": {"cpu": cpu}}]}})


async def _cluster() -> Cluster:
    """Two tenants, each with its queue; 3 cpus, 5 wanted in `qa`, 1 in `qb`."""
    c = Cluster()
    await c.nodes(3)
    for namespace in ("alpha", "beta"):
        await _namespace(c, namespace)
    await c.queue("qa", namespaces=["alpha"], weight=2)
    await c.queue("qb", namespaces=["beta"], capability={"cpu": "1"})
    await c.pods("alpha", "qa", 5)
    await _reserve(c, "beta", "held", "qb")
    await c.settle()
    return c


async def test_the_queues_page_shows_each_queue_with_its_counts_and_bars() -> None:
    c = await _cluster()
    async with TestClient(TestServer(_app(c.store))) as client:
        response = await client.get("/view/")
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/html")
        page = await response.text()
        row = page[page.index('<tr data-q="qa">'):]
        row = row[:row.index("</tr>")]
        assert '<td data-k="admitted">2</td>' in row
        assert 'data-k="waiting"' in row and ">3</td>" in row
        assert "<td>2</td>" in row  # weight
        assert 'class="bar' in row and "cpu" in row
        assert 'href="/view/queues/qb"' in page and "cpu=1" in page  # qb's capability
        script = await client.get("/view/static/view.js")
        assert script.status == 200 and b"EventSource" in await script.read()
        assert (await client.get("/view/static/secret.py")).status == 404


async def test_the_leaders_page_shows_what_its_loop_published_and_agrees_with_a_replica(
        ) -> None:
    c = await _cluster()
    await c.controller.publisher.publish()
    assert set(c.controller.publisher.views) == {"qa", "qb"}
    leader = Leadership(controller=c.controller)
    async with TestClient(TestServer(_app(c.store, leadership=leader))) as client:
        on_leader = await (await client.get("/view/")).text()
        queue_on_leader = await (await client.get("/view/queues/qa")).text()
    async with TestClient(TestServer(_app(c.store))) as client:
        on_replica = await (await client.get("/view/")).text()
        queue_on_replica = await (await client.get("/view/queues/qa")).text()
    assert on_leader == on_replica and '<td data-k="admitted">2</td>' in on_leader
    assert queue_on_leader == queue_on_replica and "pod-p-004" in queue_on_leader


async def test_a_queue_page_lists_waiting_units_in_order_with_the_debug_reason() -> None:
    c = await _cluster()
    async with TestClient(TestServer(_app(c.store))) as client:
        page = await (await client.get("/view/queues/qa")).text()
        waiting = page[page.index("Waiting, in admission order"):page.index("Admitted (")]
        names = [f"alpha/pod-p-{index:03d}" for index in (2, 3, 4)]
        assert [waiting.index(name) for name in names] == sorted(
            waiting.index(name) for name in names)
        # The reasons are the debug API's, word for word.
        mirror = await debug.KeptView(c.store, 1.0).refreshed()
        document = debug.pending_document(mirror, "qa", 10)
        assert document is not None and len(document["pending"]) == 3
        for entry in document["pending"]:
            assert entry["reason"] and escape(entry["reason"]) in waiting
        admitted = page[page.index("Admitted ("):]
        assert "alpha/pod-p-000" in admitted and "node-" in admitted
        assert (await client.get("/view/queues/nope")).status == 404
        # A name from the URL is text in the answer, never markup.
        hostile = await client.get("/view/queues/%3Cimg%20src%3Dx%3E")
        assert hostile.status == 404 and "<img" not in await hostile.text()


async def _next_message(response: Any, within: float) -> dict[str, Any]:
    async with asyncio.timeout(within):
        while True:
            line = await response.content.readline()
            if line.startswith(b"data: "):
                return dict(orjson.loads(line[6:]))


async def test_a_new_unit_changes_the_waiting_count_in_the_stream_within_a_second() -> None:
    c = await _cluster()
    async with TestClient(TestServer(_app(c.store))) as client:
        response = await client.get("/view/events")
        assert response.headers["Content-Type"] == "text/event-stream"
        first = await _next_message(response, 2.0)
        assert first["queues"]["qa"][:2] == [3, 2]
        started = time.monotonic()
        await _reserve(c, "alpha", "late", "qa")
        message = await _next_message(response, 1.0)
        took = time.monotonic() - started
        assert message["queues"] == {"qa": [4, 2, message["queues"]["qa"][2]]}, message
        assert took < 1.0
        # A burst of changes arrives coalesced, not one message each.
        for index in range(20):
            await _reserve(c, "alpha", f"burst-{index}", "qa")
        message = await _next_message(response, 1.0)
        assert message["queues"]["qa"][0] > 4
        assert message["queues"]["qa"][0] == 24 or (
            (await _next_message(response, 1.0))["queues"]["qa"][0] == 24)


class _Reviewer(access.ViewerReviewer):
    """Tokens and RBAC as a table: token -> user, user -> readable namespaces."""

    def __init__(self) -> None:
        super().__init__(api=None)
        self.users = {"tok-alice": "alice", "tok-admin": "admin"}
        self.reads = {"alice": {"alpha"}, "admin": {""}}
        self.asked: list[tuple[str, str]] = []

    async def authenticate(self, token: str) -> dict[str, Any] | None:
        user = self.users.get(token)
        return {"username": user, "groups": []} if user else None

    async def allowed(self, user: dict[str, Any], attributes: dict[str, str]) -> bool:
        namespace = attributes.get("namespace", "")
        assert attributes["resource"] == "queueunits" and attributes["verb"] == "list"
        self.asked.append((user["username"], namespace))
        return namespace in self.reads.get(user["username"], set())


async def test_a_tenant_token_sees_only_the_queues_of_its_namespaces() -> None:
    c = await _cluster()
    reviewer = _Reviewer()
    async with TestClient(TestServer(_app(c.store, "token", reviewer))) as client:
        alice = {"Authorization": "Bearer tok-alice"}
        page = await (await client.get("/view/", headers=alice)).text()
        assert 'data-q="qa"' in page and 'data-q="qb"' not in page
        assert (await client.get("/view/queues/qb", headers=alice)).status == 404
        assert (await client.get("/view/queues/qa", headers=alice)).status == 200
        # From a browser: the token in the cookie the sign-in form sets.
        cookie = {"Cookie": f"{access.COOKIE}=tok-alice"}
        page = await (await client.get("/view/", headers=cookie)).text()
        assert 'data-q="qa"' in page and 'data-q="qb"' not in page
        # The stream carries alice's queues only.
        response = await client.get("/view/events", headers=alice)
        assert set((await _next_message(response, 2.0))["queues"]) == {"qa"}
        response.close()
        admin = await (await client.get("/view/", headers={
            "Authorization": "Bearer tok-admin"})).text()
        assert 'data-q="qa"' in admin and 'data-q="qb"' in admin
        asked = len(reviewer.asked)
        await client.get("/view/", headers=alice)
        assert len(reviewer.asked) == asked  # answers are cached
        stranger = await client.get("/view/", headers={"Authorization": "Bearer nope"})
        assert stranger.status == 403


async def test_anonymous_gets_401_and_a_browser_the_sign_in_form() -> None:
    c = await _cluster()
    async with TestClient(TestServer(_app(c.store, "token", _Reviewer()))) as client:
        assert (await client.get("/view/")).status == 401
        assert (await client.get("/view/events")).status == 401
        response = await client.get("/view/", headers=HTML)
        assert response.status == 401
        assert 'id="login"' in await response.text()
        # What the form needs comes without a token; the data does not.
        assert (await client.get("/view/static/view.js")).status == 200
        assert (await client.get("/view/queues/qa")).status == 401


async def test_the_flag_mounts_the_view_on_the_metrics_listener_or_not() -> None:
    off = ServerContext(config=ServeConfig(), store=ClusterStore())
    async with TestClient(TestServer(build_metrics_app(off), host="127.0.0.1")) as client:
        assert (await client.get("/view/")).status == 404
    on = ServerContext(config=ServeConfig(web_view="loopback"), store=ClusterStore())
    async with TestClient(TestServer(build_metrics_app(on), host="127.0.0.1")) as client:
        assert (await client.get("/view/")).status == 200
        assert (await client.get("/metrics")).status == 200
        bare = await client.get("/view", allow_redirects=False)
        assert (bare.status, bare.headers["Location"]) == (302, "/view/")


async def test_closing_the_pulse_ends_every_stream() -> None:
    store = ClusterStore()
    reads = 0

    async def read() -> Any:
        nonlocal reads
        reads += 1
        return EngineMirror()

    pulse = live.Pulse(store, read)
    with pulse.connected():
        assert len(store.listeners) == 1
        waiter = asyncio.create_task(pulse.wait(pulse.version + 1))
        await asyncio.sleep(0.01)
        pulse.close()
        await asyncio.wait_for(waiter, 1.0)
    assert store.listeners == []


async def test_a_failed_read_leaves_the_pulse_running(caplog: Any) -> None:
    store = ClusterStore()
    calls = 0

    async def read() -> EngineMirror:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("boom")
        mirror = EngineMirror()
        mirror.set_queues(store.queues)
        return mirror

    pulse = live.Pulse(store, read)
    with pulse.connected():
        store.apply("Queue", "ADDED", {"metadata": {"name": "q"}, "spec": {}})
        await asyncio.wait_for(pulse.wait(0), 2.0)
    assert pulse.counts == {"q": (0, 0, 0.0)} and calls >= 2
    assert "reading the counts failed" in caplog.text
