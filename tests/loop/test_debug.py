"""The read-only debug API over HTTP."""

from __future__ import annotations

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from arbiter import debug
from arbiter.loop.runtime import Leadership
from tests.loop.harness import Cluster


async def test_debug_routes_answer_json_from_the_cache() -> None:
    c = Cluster()
    await c.nodes(2)
    await c.queue("q")
    await c.pods("ns", "q", 5)
    await c.settle()
    app = web.Application()
    app.add_subapp(debug.PREFIX, debug.debug_app(store=c.store, overcommit=1.0,
                                                 leadership=Leadership()))
    async with TestClient(TestServer(app)) as client:
        response = await client.get("/debug/queues")
        assert response.status == 200
        document = await response.json()
        assert document["leader"] is False  # no loop runs in this server
        assert document["queues"]["q"]["admitted"] == 2
        assert document["queues"]["q"]["pending"] == 3
        response = await client.get("/debug/queues/q/pending?limit=1")
        pending = await response.json()
        assert [e["name"] for e in pending["pending"]] == ["pod-p-002"]
        assert pending["total"] == 3
        assert (await client.get("/debug/queues/missing/pending")).status == 404
        assert (await client.get("/debug/queues/q/pending?limit=x")).status == 400
