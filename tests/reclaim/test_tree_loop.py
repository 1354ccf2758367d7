"""Reclaim over a tree of queues in the admission loop (in-memory apiserver,
fake clock): the issue's scenario with plain pods, and a parent's capability
making room inside its subtree."""

from __future__ import annotations

from tests.reclaim.test_loop import GRACE, ReclaimCluster


async def issue_tree(c: ReclaimCluster, **parent: object) -> None:
    await c.nodes(10)
    await c.queue("p", **parent)
    await c.queue("p1", parent="p")
    await c.queue("p2", parent="p", weight=3)
    await c.queue("q")


async def flood(c: ReclaimCluster, *pairs: tuple[str, str]) -> None:
    for ns, queue in pairs:
        await c.pods(ns, queue, 10)
    await c.settle()
    for ns, _ in pairs:
        c.running_pods(ns)
    await c.settle()


def counts(c: ReclaimCluster) -> dict[str, int]:
    return {ns: len(c.released_pods(ns)) for ns in ("n1", "n2", "nq")}


async def test_the_subtree_takes_its_share_back_from_the_top_level_queue() -> None:
    c = ReclaimCluster()
    await issue_tree(c)
    await flood(c, ("nq", "q"))
    await flood(c, ("n1", "p1"), ("n2", "p2"))
    await c.look()
    assert counts(c) == {"n1": 0, "n2": 0, "nq": 10}
    await c.look(GRACE + 1)
    for _ in range(8):  # one move per look in a tree
        await c.look()
    got = counts(c)
    assert got["nq"] == 5 and got["n1"] + got["n2"] == 5 and got["n1"] in (1, 2), got
    assert len(c.evicting.evicted) == 5
    assert all(name.startswith("p-") for name in c.evicting.evicted)  # all of q's
    # A fixpoint: nothing more moves, however long the others wait.
    for ns in ("n1", "n2"):
        c.running_pods(ns)
    for _ in range(5):
        await c.look(GRACE)
    assert counts(c) == got and len(c.evicting.evicted) == 5


async def test_a_capped_parent_makes_room_from_inside_its_subtree() -> None:
    c = ReclaimCluster()
    await issue_tree(c, capability={"cpu": "4"})
    await flood(c, ("n1", "p1"))
    assert counts(c)["n1"] == 4  # the parent's capability
    await flood(c, ("n2", "p2"))
    await c.look()
    await c.look(GRACE + 1)
    for _ in range(6):
        await c.look()
    got = counts(c)
    # Inside p, p1 and p2 share its 4 CPUs by weight 1:3; q was never touched.
    assert got["n1"] + got["n2"] == 4 and got["n2"] >= 2, got
    assert len(c.evicting.evicted) == 4 - got["n1"]
