"""Reclaim with node fit (DESIGN §10) in the admission loop: victims are
chosen so that the waiting unit's pods can then be placed on nodes of its
queue's pools, not merely so that the cluster's total free room covers it."""

from __future__ import annotations

from tests.loop.test_placement import node
from tests.reclaim.test_loop import GRACE, ReclaimCluster, planned_node, pods_fill_then_arrive


async def test_a_queue_confined_to_full_nodes_reclaims_there() -> None:
    """b may use only the zone-a nodes, which a fills; the cluster's other
    nodes are empty, so b's unit fits the total free room but no node it may
    use. b is poorer than a: after its grace it takes one of a's units back,
    and its pod is placed where that one ran."""
    c = ReclaimCluster()
    for index in range(4):
        await node(c, f"n{index}", **({"zone": "a"} if index < 2 else {}))
    await c.queue("a", nodeSelector={"zone": "a"})
    await c.queue("b", nodeSelector={"zone": "a"})
    await pods_fill_then_arrive(c, count=2)  # b starves: its grace runs
    await c.look(GRACE)
    evicted = list(c.evicting.evicted)
    assert len(evicted) == 1  # one unit of a's, not both
    await c.look()
    assert c.released_pods("nb") == ["p-000"]
    assert planned_node(c, "nb/pod-p-000") in ("n0", "n1")
    await c.look(GRACE)
    assert c.evicting.evicted == evicted  # 1:1 now: nothing more moves


async def test_victims_are_chosen_on_one_node_the_waiting_pod_fits_on() -> None:
    """Two 1-CPU nodes hold four 500m pods of a, two on each. b's 1-CPU pod
    needs a whole node. a's victims in order (lowest priority, then newest)
    are on different nodes: taking just those two would free 1 CPU in total
    and no node b's pod fits on. Reclaim takes two on the same node."""
    c = ReclaimCluster()
    await c.nodes(2)
    await c.queue("a")
    await c.queue("b")
    for index, priority in enumerate((1, 0, 1, 0)):
        await c.pod("na", f"a{index}", "a", cpu="500m", priority=priority)
        await c.settle()
    c.running_pods("na")
    await c.settle()
    on = {name: planned_node(c, f"na/pod-{name}") for name in ("a0", "a1", "a2", "a3")}
    assert on["a0"] == on["a1"] != on["a2"] == on["a3"]
    await c.pod("nb", "b0", "b", cpu="1")
    await c.settle()
    await c.look()
    await c.look(GRACE)
    evicted = c.evicting.evicted
    assert len(evicted) == 2 and on[evicted[0]] == on[evicted[1]], (evicted, on)
    await c.look()
    assert c.released_pods("nb") == ["b0"]
    assert planned_node(c, "nb/pod-b0") == on[evicted[0]]
