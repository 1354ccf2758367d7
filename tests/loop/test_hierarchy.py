"""Hierarchical queues in the admission loop (DESIGN §11): once some Queue
has a parent, the loop admits in H-DRF order with every parent's
capability applied, and on nodes (§10); a flat set keeps the flat engine."""

from __future__ import annotations

from arbiter.core.api import pod_unit_name
from arbiter.core.engine.flat import AdmissionEngine
from arbiter.core.engine.tree import HierarchicalEngine
from tests.loop.harness import Cluster


def released_by_namespace(c: Cluster, *namespaces: str) -> dict[str, int]:
    return {ns: len(c.released_pods(ns)) for ns in namespaces}


async def flooded_tree(**parent: object) -> Cluster:
    """Parent p (with `parent` in its spec) over p1, p2 (weights 1 and 3),
    and q at the top; ten 1-CPU pods each on 10 × 1 CPU; settled."""
    c = Cluster()
    await c.nodes(10)
    await c.queue("p", **parent)
    await c.queue("p1", parent="p")
    await c.queue("p2", parent="p", weight=3)
    await c.queue("q")
    for ns, queue in (("n1", "p1"), ("n2", "p2"), ("nq", "q")):
        await c.pods(ns, queue, 10)
    await c.settle()
    return c


async def test_a_parents_capability_caps_its_subtree() -> None:
    c = await flooded_tree(capability={"cpu": "4"})
    assert isinstance(c.controller.mirror.engine, HierarchicalEngine)
    got = released_by_namespace(c, "n1", "n2", "nq")
    assert got["n1"] + got["n2"] == 4  # the parent's capability, not the children's share
    assert got["nq"] == 6
    await c.controller.publisher.publish()
    await c.settle()  # the status writes it spawned
    assert c.queue_status("p1")["allocated"] == {"cpu": str(got["n1"])}


async def test_subtrees_share_by_weight_level_by_level() -> None:
    c = await flooded_tree()
    # Q and P's subtree share the cluster equally; P1:P2 by 1:3 inside it.
    assert released_by_namespace(c, "n1", "n2", "nq") == {"n1": 2, "n2": 3, "nq": 5}


async def test_a_tree_admits_only_where_pods_fit_on_nodes() -> None:
    c = Cluster()
    await c.nodes(4)  # 4 CPU in total, 1 per node
    await c.queue("p")
    await c.queue("p1", parent="p")
    await c.pod("n1", "big", "p1", cpu="2")  # fits in total, on no node
    await c.settle()
    assert c.released_pods("n1") == []
    reason = c.controller.mirror.engine.explain_unit(f"n1/{pod_unit_name('big')}")
    assert reason.startswith("no node")
    await c.pods("n1", "p1", 3, prefix="small")
    await c.settle()
    assert c.released_pods("n1") == ["small-000", "small-001", "small-002"]
    planned = {c.unit_obj("n1", pod_unit_name(f"small-{i:03d}"))["status"]["admission"]
               ["nodes"]["main"][0] for i in range(3)}
    assert len(planned) == 3  # admitted with plans, one pod per 1-CPU node


async def test_the_engine_follows_the_queues_between_flat_and_tree() -> None:
    c = Cluster()
    await c.nodes(10)
    await c.queue("a")
    await c.queue("b")
    await c.pods("na", "a", 4)
    await c.settle()
    assert isinstance(c.controller.mirror.engine, AdmissionEngine)
    # b becomes a parent's child: the tree engine takes over with a's units
    # and plans, and a parent's capability applies at once.
    await c.queue("top", capability={"cpu": "3"})
    await c.set_queue("b", parent="top")
    await c.pods("nb", "b", 10)
    await c.settle()
    mirror = c.controller.mirror
    assert isinstance(mirror.engine, HierarchicalEngine)
    assert mirror.engine.allocated("a").get_amount("cpu") == 4000
    assert len(mirror.engine.plans()) == 7
    assert released_by_namespace(c, "na", "nb") == {"na": 4, "nb": 3}
    # And back: no parent any more, the flat engine again with every unit
    # and plan; b's cap is gone, so it fills the free room.
    await c.set_queue("b", parent=None)
    await c.settle()
    assert isinstance(mirror.engine, AdmissionEngine)
    assert mirror.engine.allocated("a").get_amount("cpu") == 4000
    assert len(mirror.engine.plans()) == 10
    assert released_by_namespace(c, "na", "nb") == {"na": 4, "nb": 6}
