"""How the loop cycles: in slices that never admit over unclassified units,
only recomputing the capacity when it can have changed."""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import Any

from arbiter.base.kubeapi import unit_path
from arbiter.cache.store import ClusterStore
from arbiter.core.api import ADMISSION_GATE
from arbiter.core.resources import Resources
from arbiter.loop.settings import LoopSettings
from tests.loop.harness import Cluster


async def test_slices_admit_nothing_until_every_unit_is_classified() -> None:
    c = Cluster(LoopSettings(debounce=0.0))
    await c.nodes(1)
    await c.queue("q")
    # Already admitted (by an earlier leader) and holding the only CPU ...
    await c.api.create(unit_path("ns"), {
        "metadata": {"name": "held", "namespace": "ns"},
        "spec": {"queue": "q", "podSets": [{"name": "main", "count": 1,
                                            "requests": {"cpu": "1"}}]}})
    await c.api.merge_patch(unit_path("ns", "held", status=True),
                            {"status": {"phase": "Dequeued", "admissions": [{"time": "x"}]}})
    # ... and many waiting units a new leader may look at first.
    await c.pods("ns", "q", 40)
    await c.settle()  # creates the pods' units with this (soon replaced) leader
    c.controller.stop_listening()

    leader = c.new_controller()
    admitted: list[str] = []
    while True:
        chosen = leader.cycle(budget=1)
        admitted += [u.key for u in chosen]
        if not leader.warming and not leader.queued():
            break
    assert admitted == []  # the reservation holds the CPU: nothing fits
    assert leader.mirror.state("ns/held") == "admitted"


class CountingStore(ClusterStore):
    calls = 0

    def capacity(self, overcommit: float = 1.0) -> Resources:
        type(self).calls += 1
        return super().capacity(overcommit)


async def test_a_node_heartbeat_does_not_recompute_capacity() -> None:
    c = Cluster(store=CountingStore())
    await c.nodes(2)
    await c.queue("q")
    await c.pods("ns", "q", 3)
    await c.settle()
    CountingStore.calls = 0
    c.api.set_status("/api/v1/nodes/node-0", {"conditions": [
        {"type": "Ready", "status": "True", "lastHeartbeatTime": "2030-01-01T00:00:00Z"}]})
    await c.settle()
    assert CountingStore.calls == 0
    c.api.set_status("/api/v1/nodes/node-1", {"conditions": [
        {"type": "Ready", "status": "False"}]})
    await c.settle()
    assert CountingStore.calls == 1
    assert c.controller.mirror.capacity.get_amount("cpu") == 1000


async def test_a_new_leader_indexes_in_slices_while_the_cache_changes() -> None:
    c = Cluster()
    await c.nodes(3)
    await c.queue("q")
    await c.pods("ns", "q", 50)
    await c.settle()
    c.controller.stop_listening()
    leader = c.new_controller()

    async def meanwhile() -> None:
        await asyncio.sleep(0)
        await c.api.delete("/api/v1/namespaces/ns/pods/p-049")  # GC takes its unit
        await c.pod("ns", "late", "q")

    await asyncio.gather(leader.resync(reindex=True, chunk=5), meanwhile())
    await c.settle(leader)
    assert ("Pod", "ns", "p-049") not in {(k.kind, k.namespace, k.name)
                                          for k in leader.index.units_by_consumer}
    assert unit_path("ns", "pod-late") in c.api.objects
    released = c.released_pods("ns")
    assert released == ["p-000", "p-001", "p-002"]
    late = c.api.objects["/api/v1/namespaces/ns/pods/late"]
    assert late["spec"]["schedulingGates"] == [{"name": ADMISSION_GATE}]


async def _cycles_beside_a_timer() -> tuple[list[float], list[float]]:
    """When 0.6 s of 50 ms cycles (always more to do) started, and when a
    10 ms timer beside them (a webhook, the Lease renewal) got to run."""
    c = Cluster(LoopSettings(debounce=0.0, cycle_rest=1.0))
    controller = c.controller
    loop = asyncio.get_running_loop()
    starts: list[float] = []
    ticks: list[float] = []
    real_admit = controller.mirror.admit_all

    def slow_admit() -> Any:
        starts.append(loop.time())
        time.sleep(0.05)  # a long cycle blocks the whole event loop
        controller._units.add("ns/always-more")  # more to do after each
        return real_admit()

    controller.mirror.admit_all = slow_admit  # type: ignore[method-assign]

    async def timer() -> None:
        while True:
            await asyncio.sleep(0.01)
            ticks.append(loop.time())

    ticker = asyncio.ensure_future(timer())
    runner = asyncio.ensure_future(controller.run())
    await asyncio.sleep(0.6)
    runner.cancel()
    ticker.cancel()
    await asyncio.gather(runner, ticker, return_exceptions=True)
    return starts[1:], ticks  # the first follows the start-up resync


async def test_after_a_long_cycle_others_get_the_event_loop_for_as_long() -> None:
    """A cycle is one synchronous stretch: with more to do, the next waits
    as long as the last took, and what shares the loop runs in between."""
    starts, ticks = await _cycles_beside_a_timer()
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    assert len(gaps) >= 2 and min(gaps) >= 0.095, gaps
    assert len([t for t in ticks if starts[-2] < t < starts[-1]]) >= 3
