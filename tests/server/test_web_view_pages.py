"""The web view's unit, pools and decisions pages, the share history and
the per-user cap on event streams (DESIGN §15)."""

from __future__ import annotations

import asyncio
import json
import math
import re
import time
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from arbiter.base.kubeapi import unit_path
from arbiter.core.api import ADMITTED_STATUS_ANNOTATION
from arbiter.loop import decisions
from arbiter.loop.decisions import Recorded
from arbiter.loop.runtime import Leadership
from arbiter.server.web import access, history, live
from arbiter.server.web import app as web_routes
from tests.loop.harness import Cluster
from tests.server.test_web_view import _cluster, _next_message, _reserve, _Reviewer


def _app(c: Cluster, mode: Any = "loopback", reviewer: access.ViewerReviewer | None = None,
         *, leader: bool = False, sample_every: float = history.STEP) -> web.Application:
    app = web.Application()
    app.add_subapp(web_routes.PREFIX, web_routes.web_app(
        store=c.store, overcommit=1.0, access_mode=mode, reviewer=reviewer, api=c.api,
        leadership=Leadership(controller=c.controller) if leader else Leadership(),
        sample_every=sample_every))
    return app


@pytest.fixture(autouse=True)
def _no_old_decisions() -> None:
    decisions.RECENT.clear()


def _cells(page: str, title: str) -> str:
    """The cell of the facts table headed `title`."""
    found = re.search(rf"<th>{title}</th><td[^>]*>(.*?)</td>", page)
    assert found is not None, title
    return found.group(1)


async def test_a_unit_page_shows_its_state_timeline_pod_sets_and_plan() -> None:
    c = await _cluster()
    async with TestClient(TestServer(_app(c))) as client:
        response = await client.get("/view/units/alpha/pod-p-000")
        assert response.status == 200
        page = await response.text()
        assert _cells(page, "phase") in ("Dequeued", "Running")
        assert 'href="/view/queues/qa"' in _cells(page, "queue")
        timeline = page[page.index("<h2>Timeline"):page.index("<h2>Pod sets")]
        # Created, then its admission from the QueueUnit's status (attempt
        # 1, by queue qa), then the loop's decision to admit it.
        whats = re.findall(r'<td class="what">([^<]*)</td>', timeline)
        assert whats[0] == "created" and "quota taken" in whats and "admitted" in whats
        assert whats.index("released") > whats.index("admitted")  # let go after admission
        assert "attempt 1 · queue qa" in timeline
        assert "next in fair-share order and fits" in timeline
        plan = page[page.index("<h2>Plan"):]
        assert "pool <b>default</b>" in plan and "node-" in plan
        pod_sets = page[page.index("<h2>Pod sets"):page.index("<h2>Plan")]
        assert "<td>main</td><td>1</td>" in pod_sets and "cpu=1" in pod_sets
        # A waiting unit: why it waits (the engine's reason), no plan.
        page = await (await client.get("/view/units/alpha/pod-p-004")).text()
        assert _cells(page, "phase") == "Enqueued"
        assert "cluster full (cpu)" in _cells(page, "why it waits")
        assert "Plan</h2><p class=\"plan\">none" in page
        assert (await client.get("/view/units/alpha/nope")).status == 404
        hostile = await client.get("/view/units/alpha/%3Cscript%3E")
        assert hostile.status == 404 and "<script>" not in await hostile.text()


async def test_a_unit_page_names_who_took_it_back_and_what_it_took() -> None:
    c = await _cluster()
    record = c.store.units["alpha/pod-p-000"]
    decisions.RECENT.append(Recorded(record.created + 5, "evict", "qa", "alpha/pod-p-000",
                                     "reclaimed by queue qb", (
                                         ("cause", "reclaim"), ("for_queue", "qb"),
                                         ("for_unit", "beta/held"))))
    async with TestClient(TestServer(_app(c))) as client:
        page = await (await client.get("/view/units/alpha/pod-p-000")).text()
        assert "taken back (reclaim)" in page and 'href="/view/units/beta/held"' in page
        taker = await (await client.get("/view/units/beta/held")).text()
        assert "took back (reclaim)" in taker and 'href="/view/units/alpha/pod-p-000"' in taker
    # A tenant who reads alpha only sees the unit that took it, not its name.
    async with TestClient(TestServer(_app(c, "token", _Reviewer()))) as client:
        alice = {"Authorization": "Bearer tok-alice"}
        page = await (await client.get("/view/units/alpha/pod-p-000", headers=alice)).text()
        assert "taken back" in page and "beta/held" not in page and "another namespace" in page
        assert (await client.get("/view/units/beta/held", headers=alice)).status == 404


async def test_a_queue_page_links_its_units_and_the_head_message_matches_its_reason() -> None:
    c = await _cluster()
    await _reserve(c, "beta", "second", "qb")  # qb's capability is 1 cpu, held by `held`
    await c.settle()
    await c.controller.publisher.publish()
    await c.settle()
    message = c.unit_obj("beta", "second")["status"]["message"]
    assert message == "waiting in queue qb: queue at capability (cpu)"
    async with TestClient(TestServer(_app(c))) as client:
        page = await (await client.get("/view/queues/qb")).text()
        row = page[page.index('href="/view/units/beta/second"'):]
        why = re.search(r'<td class="why">([^<]*)</td><td class="message">([^<]*)</td>', row)
        assert why is not None
        assert why.group(2) == message == f"waiting in queue qb: {why.group(1)}"
        assert 'href="/view/units/beta/held"' in page


async def test_the_pools_page_shows_capacity_allocated_and_a_node_grid() -> None:
    c = await _cluster()
    async with TestClient(TestServer(_app(c))) as client:
        page = await (await client.get("/view/pools")).text()
        row = page[page.index('<tr data-pool="default">'):]
        row = row[:row.index("</tr>")]
        assert "<td>3</td>" in row and "cpu=3" in row and "3 / 3" in row  # all 3 cpus held
        nodes = re.findall(r'<span class="node u(\d)" title="([^"]*)"', page)
        assert len(nodes) == 3 and all(level == "5" for level, _ in nodes), nodes
        assert nodes[0][1].startswith("node-") and "cpu 100%" in nodes[0][1]
    async with TestClient(TestServer(_app(c, "token", _Reviewer()))) as client:
        page = await (await client.get("/view/pools",
                                       headers={"Authorization": "Bearer tok-alice"})).text()
        titles = re.findall(r'<span class="node u\d" title="([^"]*)"', page)
        assert len(titles) == 3 and not any("node-" in title for title in titles)


async def test_the_decisions_page_lists_the_latest_first_of_the_queues_one_sees() -> None:
    c = await _cluster()
    admitted = [d.unit for d in decisions.RECENT if d.decision == "admit"]
    assert set(admitted) == {"alpha/pod-p-000", "alpha/pod-p-001", "beta/held"}
    async with TestClient(TestServer(_app(c))) as client:
        page = await (await client.get("/view/decisions")).text()
        units = re.findall(r'<td><a href="/view/units/([^"]*)"', page)
        assert units == list(reversed(admitted))
        page = await (await client.get("/view/decisions?queue=qb&limit=5")).text()
        assert re.findall(r'<td><a href="/view/units/([^"]*)"', page) == ["beta/held"]
        assert (await client.get("/view/decisions?limit=x")).status == 400
    async with TestClient(TestServer(_app(c, "token", _Reviewer()))) as client:
        page = await (await client.get("/view/decisions",
                                       headers={"Authorization": "Bearer tok-alice"})).text()
        assert "beta/held" not in page and "alpha/pod-p-000" in page


def test_the_decision_ring_is_bounded() -> None:
    record = Recorded(0.0, "admit", "q", "ns/u", "")
    for _ in range(decisions.KEPT + 10):
        decisions.RECENT.append(record)
    assert len(decisions.RECENT) == decisions.KEPT


async def test_the_share_history_keeps_an_hour_and_forgets_queues_gone() -> None:
    shares = history.ShareHistory()
    for step in range(history.KEEP + 40):
        counts = {"a": (0, 1, step / 1000)}
        if step < 100:
            counts["gone"] = (0, 0, 0.5)
        await shares.record(counts, float(step))
    series = shares.series("a")
    assert len(series) == history.KEEP
    assert series[0] == pytest.approx(40 / 1000) and series[-1] == pytest.approx(399 / 1000)
    assert "gone" not in shares.values and shares.sparkline("gone") == ""
    assert all(math.isnan(v) for v in shares.series("new"))
    points = re.search(r'points="([^"]*)"', shares.sparkline("a"))
    assert points is not None and len(points.group(1).split()) == history.SPARK
    chart = shares.chart("a", 0.2)
    assert 'class="fair"' in chart and chart.count(",") >= history.KEEP


async def test_steps_without_a_sample_stay_blank_in_the_history() -> None:
    shares = history.ShareHistory(step=10.0)
    for at, share in ((0.0, 0.1), (10.0, 0.2), (50.0, 0.3)):  # 20, 30, 40 missed
        await shares.record({"a": (0, 0, share)}, at)
    tail = shares.series("a")[-5:]
    assert tail[0] == pytest.approx(0.2) and tail[-1] == pytest.approx(0.3)
    assert all(math.isnan(v) for v in tail[1:4]), tail
    await shares.record({"a": (0, 0, 0.4)}, 50.0 + 10 * 2 * history.KEEP)  # longer than kept
    assert [v for v in shares.series("a") if not math.isnan(v)] == [pytest.approx(0.4)]


async def test_the_queues_page_draws_each_queues_share_over_time() -> None:
    c = await _cluster()
    async with TestClient(TestServer(_app(c, leader=True, sample_every=0.02))) as client:
        await asyncio.sleep(0.3)
        page = await (await client.get("/view/")).text()
        row = page[page.index('<tr data-q="qa">'):]
        assert '<svg class="spark"' in row[:row.index("</tr>")]
        assert "share over the last hour: 66.7% to 66.7%" in row
        queue = await (await client.get("/view/queues/qa")).text()
        assert '<svg class="chart"' in queue and "fair</text>" in queue


async def test_one_user_cannot_take_every_event_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(live, "MAX_PER_USER", 2)
    monkeypatch.setattr(live, "CHECK", 0.05)  # how soon a closed stream is noticed
    c = await _cluster()
    # A runner as arbiter's listeners have (TestServer cancels a handler
    # whose client left; aiohttp's default, and arbiter's, does not).
    runner = web.AppRunner(_app(c, "token", _Reviewer()))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    url = f"http://127.0.0.1:{port}/view/events"
    alice = {"Authorization": "Bearer tok-alice"}
    try:
        async with aiohttp.ClientSession() as session:
            streams = [await session.get(url, headers=alice) for _ in range(2)]
            for stream in streams:
                assert stream.status == 200
                await _next_message(stream, 2.0)
            third = await session.get(url, headers=alice)
            assert third.status == 429 and "views are open for this user" in await third.text()
            # Another user still gets one; and alice again once she closes
            # one (noticed with no message or ping to write: none comes here).
            admin = await session.get(url, headers={"Authorization": "Bearer tok-admin"})
            assert admin.status == 200
            streams[0].close()
            closed = time.monotonic()
            while True:
                again = await session.get(url, headers=alice)
                again.close()
                if again.status == 200:
                    break
                assert time.monotonic() - closed < 1.0, "alice's stream was not freed"
                await asyncio.sleep(0.02)
            for response in (admin, streams[1]):
                response.close()
    finally:
        await runner.cleanup()


async def test_a_unit_created_admitted_shows_its_admission_before_its_status_has_it() -> None:
    """Created admitted (the fast path, DESIGN §16), its admission is in an
    annotation until the loop writes its status: the page reads it there."""
    c = await _cluster()
    stored = c.api.objects[unit_path("alpha", "pod-p-000")]
    stored["metadata"].setdefault("annotations", {})[ADMITTED_STATUS_ANNOTATION] = \
        json.dumps(stored["status"])
    stored["status"] = {"phase": "Running"}
    async with TestClient(TestServer(_app(c))) as client:
        page = await (await client.get("/view/units/alpha/pod-p-000")).text()
        timeline = page[page.index("<h2>Timeline"):page.index("<h2>Pod sets")]
        assert "attempt 1 · queue qa" in timeline
