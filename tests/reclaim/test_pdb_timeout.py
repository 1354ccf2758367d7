"""PodDisruptionBudgets cannot freeze reclaim (issue #25 row 12): a PDB
blocks reclaim's evictions for `reclaim_pdb_timeout`, no longer; then the
blocked pods are deleted (uid-guarded) and an Event says so. With a
negative timeout a PDB is honoured for good."""

from __future__ import annotations

from arbiter.loop.settings import LoopSettings
from tests.reclaim.test_loop import (
    GRACE,
    EvictingApi,
    ReclaimCluster,
    pods_fill_then_arrive,
    tenants,
)

TIMEOUT = 120.0


def _cluster(timeout: float) -> ReclaimCluster:
    c = ReclaimCluster()
    c.controller.stop_listening()
    c.settings = LoopSettings(debounce=0.0, reclaim_grace=GRACE, reclaim_pdb_timeout=timeout)
    c.api = EvictingApi(c.store, clock=c.clock)
    c.controller = c.new_controller()
    return c


async def test_a_pdb_blocks_reclaim_for_the_timeout_then_pods_are_deleted() -> None:
    c = _cluster(TIMEOUT)
    await tenants(c, capability={"cpu": "10"})
    # minAvailable = all of the tenant's pods: every eviction answers 429.
    c.evicting.blocked = {f"p-{i:03d}" for i in range(10)}
    await pods_fill_then_arrive(c)
    await c.look(GRACE + 1)
    assert len(c.pods_of("na")) == 10
    overridden = [s for s in c.events.said if s.reason == "PodDisruptionBudgetOverridden"]
    assert overridden == []
    for _ in range(12):  # 240 s: past the timeout plus one blocked backoff
        await c.look(20)
    # b's share came back: 5 of a's pods are gone, without an eviction.
    assert c.evicting.evicted == []
    assert len(c.pods_of("na")) == 5
    overridden = [s for s in c.events.said if s.reason == "PodDisruptionBudgetOverridden"]
    assert len(overridden) == 5
    assert "PodDisruptionBudget blocked" in overridden[0].message
    assert "--reclaim-pdb-timeout" in overridden[0].message
    assert not any(s.on_unit is False for s in overridden)  # on the unit and its pod
    await c.settle()
    assert len(c.released_pods("nb")) == 5


async def test_with_a_negative_timeout_the_pdb_is_honoured_for_good() -> None:
    c = _cluster(-1.0)
    await tenants(c, capability={"cpu": "10"})
    c.evicting.blocked = {f"p-{i:03d}" for i in range(10)}
    await pods_fill_then_arrive(c)
    for _ in range(20):
        await c.look(30)
    assert len(c.pods_of("na")) == 10 and c.released_pods("nb") == []
    assert not any(s.reason == "PodDisruptionBudgetOverridden" for s in c.events.said)


async def test_a_pdb_blocks_an_unqueued_pods_eviction_for_the_timeout_only() -> None:
    """Unqueued usage (a pod bound at creation, charged to its namespace's
    queue) is taken back under the same timeout: evictions answer 429 until
    `reclaim_pdb_timeout`, then the pod is deleted and the waiting pod runs."""
    c = _cluster(TIMEOUT)
    await c.nodes(4)
    await c.queue("a", namespaces=["na"])
    await c.queue("b", namespaces=["nb"])
    pinned = [f"pinned-{index}" for index in range(4)]
    for index, name in enumerate(pinned):
        await c.pod("na", name, "a", gated=False, node=f"node-{index}", phase="Running")
    c.evicting.blocked = set(pinned)
    await c.settle()
    await c.pod("nb", "wants", "b")
    await c.settle()
    await c.look()
    await c.look(GRACE)
    posts = [p for m, p in c.api.calls if m == "POST" and p.endswith("/eviction")]
    assert posts and len(c.pods_of("na")) == 4 and c.gated("nb", "wants")
    for _ in range(6):  # 120 s: still within the timeout
        await c.look(19)
    assert len(c.pods_of("na")) == 4 and c.gated("nb", "wants")
    for _ in range(8):  # past the timeout plus one blocked backoff
        await c.look(20)
    assert c.evicting.evicted == [] and len(c.pods_of("na")) == 3
    await c.look()
    assert not c.gated("nb", "wants")
