"""Benchmark: the web view (DESIGN §15) at 1,000 queues × 100,000 units.

A store of 1,000 queues (100 QueueUnits each, one CPU apiece) and 200
nodes × 32 CPU; the engine built from it and `admit_all` run, so 6,400
units are admitted and 93,600 wait. Printed:

1. the queues page's time on the leader (the views its loop published,
   HTML), p50 / max over several requests, against its 50 ms budget, and
   its size; on a replica, its time right after a store change, when
   `queue_views` is computed again;
2. a queue's page (100 units, its share chart), p50 / max; the pages
   added by issue 31b: a unit's (admitted and waiting), pools and nodes
   (a grid of every node), decisions (the ring full, 200 shown);
2b. the share history full (360 samples of 1,000 queues): the queues
   page with its sparklines, right after a sample (every row's HTML built
   again) and unchanged; one sample's time and its longest slice;
3. the event loop's longest stall while a client is connected to
   `/view/events` (a replica's view: every store change goes through the
   kept view and the pulse): one QueueUnit created every 50 ms for
   `--seconds`, a probe task sleeping 1 ms and timing how late it wakes;
   against the 5 ms budget; and how many messages the client got. On a
   shared, loaded machine the wall-clock stall includes the time the OS
   ran other processes: the CPU time this process spent in the worst gap
   is printed beside it.

    .venv/bin/python bench/bench_web_view.py [--queues 1000] [--units 100000] [--seconds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from arbiter.cache.store import KINDS, ClusterStore
from arbiter.loop import decisions
from arbiter.loop.follow import mirror_from_store
from arbiter.loop.pool_status import pool_views
from arbiter.loop.runtime import Leadership
from arbiter.loop.status import queue_views
from arbiter.server.web import app as web_routes
from arbiter.server.web import history
from arbiter.server.web.live import CountsReader
from arbiter.server.web.pages import QueuesPage
from bench.bench_engine import cpu_model, load

NODES = 200
NODE_CPU = 32


def build_store(queues: int, units: int) -> ClusterStore:
    store = ClusterStore()
    store.synced_kinds.update(KINDS)
    for index in range(NODES):
        store.apply("Node", "ADDED", {"metadata": {"name": f"n-{index}"}, "status": {
            "allocatable": {"cpu": str(NODE_CPU), "memory": "256Gi", "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True"}]}})
    for index in range(queues):
        store.apply("Queue", "ADDED", {"metadata": {"name": f"q-{index:04d}"},
                                       "spec": {"weight": 1 + index % 3}})
    for index in range(units):
        add_unit(store, index, queues)
    return store


def add_unit(store: ClusterStore, index: int, queues: int) -> None:
    store.apply("QueueUnit", "ADDED", {
        "metadata": {"name": f"u-{index}", "namespace": f"ns-{index % 50}",
                     "uid": f"uid-{index}", "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {"queue": f"q-{index % queues:04d}",
                 "podSets": [{"name": "main", "count": 1, "requests": {"cpu": "1"}}]}})


VIEW = web.AppKey("view", web.Application)


def app_for(store: ClusterStore, leadership: Leadership) -> web.Application:
    app = web.Application()
    view = web_routes.web_app(store=store, overcommit=1.0, leadership=leadership)
    app.add_subapp(web_routes.PREFIX, view)
    app[VIEW] = view
    return app


async def timed(client: TestClient[Any, Any], path: str,
                runs: int) -> tuple[list[float], bytes]:
    """Time per request, in process (the client's share included: an
    upper bound on the server's)."""
    times, body = [], b""
    for _ in range(runs):
        started = time.perf_counter()
        response = await client.get(path)
        body = await response.read()
        times.append(time.perf_counter() - started)
        assert response.status == 200, (path, response.status)
    return times, body


async def probe(stop: asyncio.Event, stalls: list[float], busy: list[float]) -> None:
    """How late a 1 ms sleep wakes (wall clock: the longest the loop was
    held, this process descheduled by a loaded machine included), and the
    CPU time this process spent meanwhile (what the loop itself did)."""
    loop = asyncio.get_running_loop()
    while not stop.is_set():
        before, cpu = loop.time(), time.process_time()
        await asyncio.sleep(0.001)
        stalls.append(loop.time() - before - 0.001)
        busy.append(time.process_time() - cpu)


def fill_decisions(units: int) -> None:
    """The decision ring full: admissions, and reclaims naming their taker."""
    for index in range(decisions.KEPT):
        reclaim = index % 10 == 0
        decisions.RECENT.append(decisions.Recorded(
            1.7e9 + index, "evict" if reclaim else "admit", f"q-{index % 1000:04d}",
            f"ns-{index % 50}/u-{index % units}", "reclaimed" if reclaim else "fits",
            (("cause", "reclaim"), ("for_queue", "q-0001"), ("for_unit", "ns-1/u-1"))
            if reclaim else (("attempt", "1"),)))


async def share_history(client: TestClient[Any, Any], mirror: Any, queues: int) -> None:
    """The history full: time one sample, and the queues page after it."""
    shares = client.app[VIEW][web_routes.SHARES]
    counts = await CountsReader()(mirror)
    for step in range(history.KEEP - 1):  # the ring, filled without drawing
        shares.head = step
        for name, value in counts.items():
            if name not in shares.values:
                shares.values[name] = history._blank()
            shares.values[name][step] = value[2] * (1 + (step % 7) / 10)
    stop, stalls, busy = asyncio.Event(), list[float](), list[float]()
    prober = asyncio.create_task(probe(stop, stalls, busy))
    await asyncio.sleep(0.01)
    started = time.perf_counter()
    await shares.record(counts, time.time())
    took = time.perf_counter() - started
    stop.set()
    await prober
    print(f"  one share sample of {queues} queues (sparklines drawn): {took * 1000:.0f} ms in "
          f"all, longest slice {max(stalls) * 1000:.2f} ms wall / {max(busy) * 1000:.2f} ms CPU")
    after, body = await timed(client, "/view/", 1)
    kept, _ = await timed(client, "/view/", 10)
    print(f"  queues page with sparklines: right after a sample {after[0] * 1000:.1f} ms, "
          f"then p50 {statistics.median(kept) * 1000:.1f} ms, max {max(kept) * 1000:.1f} ms; "
          f"{len(body) / 1024:.0f} KiB HTML, {len(gzip.compress(body)) / 1024:.0f} KiB gzipped")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queues", type=int, default=1000)
    parser.add_argument("--units", type=int, default=100_000)
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args()
    print(f"web view benchmark on {cpu_model()}; {load()}")
    started = time.perf_counter()
    store = build_store(args.queues, args.units)
    mirror = mirror_from_store(store)
    admitted = len(mirror.admit_all())
    fill_decisions(args.units)
    print(f"  {args.queues} queues, {args.units} units, {NODES} nodes × {NODE_CPU} CPU: "
          f"{admitted} admitted; built in {time.perf_counter() - started:.1f} s")

    # 1, 2: the leader: its engine and the views its loop last published.
    started = time.perf_counter()
    views = queue_views(mirror, waiting=mirror.waiting_by_queue())
    publish = time.perf_counter() - started
    leader = Leadership()
    leader.controller = SimpleNamespace(  # type: ignore[assignment]
        mirror=mirror, publisher=SimpleNamespace(views=views, pool_views=pool_views(mirror)))
    async with TestClient(TestServer(app_for(store, leader))) as client:
        await timed(client, "/view/", 1)  # the rows' HTML built once
        times, body = await timed(client, "/view/", 15)
        p50, worst = statistics.median(times), max(times)
        verdict = "ok" if p50 <= 0.050 else "OVER"
        print(f"  queues page, kept: p50 {p50 * 1000:.1f} ms, max {worst * 1000:.1f} ms "
              f"(budget 50 ms: {verdict}); {len(body) / 1024:.0f} KiB HTML, "
              f"{len(gzip.compress(body)) / 1024:.0f} KiB gzipped")
        times, _ = await timed(client, "/view/queues/q-0001", 10)
        print(f"  a queue's page: p50 {statistics.median(times) * 1000:.1f} ms, "
              f"max {max(times) * 1000:.1f} ms")
        for what, path in (("a unit's page, admitted", "/view/units/ns-0/u-0"),
                           ("a unit's page, waiting", f"/view/units/ns-0/u-{args.units - 50}"),
                           (f"pools and nodes ({NODES} nodes)", "/view/pools"),
                           ("decisions (200 of a full ring)", "/view/decisions")):
            times, body = await timed(client, path, 10)
            print(f"  {what}: p50 {statistics.median(times) * 1000:.1f} ms, "
                  f"max {max(times) * 1000:.1f} ms; {len(body) / 1024:.0f} KiB")
        await share_history(client, mirror, args.queues)
        assets = sum([len(await (await client.get(f"/view/static/{name}")).read())
                      for name in web_routes.ASSETS])
        print(f"  assets (view.js + view.css): {assets / 1024:.1f} KiB")
    print(f"  (the loop's own queue_views for its status round: {publish * 1000:.0f} ms)")

    # 1b: a replica: no published views, queue_views computed after a change.
    async with TestClient(TestServer(app_for(store, Leadership()))) as client:
        await timed(client, "/view/", 1)  # the kept view catches up (not timed)
        cold = []
        for index in range(5):
            add_unit(store, args.units + 1000 + index, args.queues)
            await asyncio.sleep(QueuesPage.MIN_AGE + 0.1)
            cold += (await timed(client, "/view/", 1))[0]
        kept, _ = await timed(client, "/view/", 5)
    print(f"  a replica's queues page after a store change (queue_views computed again): "
          f"p50 {statistics.median(cold) * 1000:.1f} ms, max {max(cold) * 1000:.1f} ms; "
          f"unchanged: p50 {statistics.median(kept) * 1000:.1f} ms")

    # 3: a replica's view, a client on the event stream, the store changing.
    async with TestClient(TestServer(app_for(store, Leadership()))) as client:
        await timed(client, "/view/queues/q-0001", 1)  # the kept view catches up (not timed)
        stream = await client.get("/view/events")
        messages = 0

        async def read() -> None:
            nonlocal messages
            while line := await stream.content.readline():
                messages += line.startswith(b"data: ")

        reader = asyncio.create_task(read())
        await asyncio.sleep(1.0)  # the first message (every count) goes out
        stop, stalls, busy = asyncio.Event(), list[float](), list[float]()
        prober = asyncio.create_task(probe(stop, stalls, busy))
        first = messages
        changes = int(args.seconds / 0.05)
        for index in range(changes):
            add_unit(store, args.units + index, args.queues)
            await asyncio.sleep(0.05)
        await asyncio.sleep(1.0)
        stop.set()
        await prober
        reader.cancel()
        stream.close()
    worst, cpu = max(stalls), max(busy)
    verdict = "ok" if worst <= 0.005 else \
        "over on the wall clock, ok in CPU: the machine is loaded" if cpu <= 0.005 else "OVER"
    print(f"  stream connected, {changes} store changes in {args.seconds:.0f} s: "
          f"{messages - first} messages; longest event-loop stall {worst * 1000:.2f} ms "
          f"(budget 5 ms: {verdict}), p99 {statistics.quantiles(stalls, n=100)[98] * 1000:.2f} ms; "
          f"most CPU time between two wake-ups {cpu * 1000:.2f} ms")


if __name__ == "__main__":
    asyncio.run(main())
