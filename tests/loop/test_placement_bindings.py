"""Plans following bindings while other pods are not seen bound yet
(DESIGN §10, `NodeModel._follow`): a node is never shown with room that a
pod already took, whether the pod that moved is half of a swap or not."""

from __future__ import annotations

from arbiter.base.kubeapi import pod_path
from arbiter.core.model import Placement
from arbiter.core.resources import Resources
from tests.loop.harness import Cluster
from tests.loop.test_placement import node


def bind(cluster: Cluster, name: str, node_name: str) -> None:
    cluster.api.edit(pod_path("ns", name), lambda pod: pod["spec"].update(nodeName=node_name))


def planned(cluster: Cluster, name: str) -> tuple[str, ...]:
    plan = cluster.controller.mirror.plan(f"ns/pod-{name}")
    assert plan is not None
    return plan.nodes["main"]


async def two_planned_pods(cluster: Cluster) -> None:
    await cluster.queue("q")
    await cluster.pod("ns", "x", "q")
    await cluster.settle()
    await cluster.pod("ns", "y", "q")
    await cluster.settle()
    assert planned(cluster, "x") == ("n0",) and planned(cluster, "y") == ("n1",)


async def test_a_pod_bound_beside_an_unbound_planned_pod_keeps_that_node_full() -> None:
    """n1 has room for both x (planned on n0) and y (planned on n1): x binds
    on n1 before y does. n1 holds x and y's slot; n0 holds x's old slot
    until y's binding shows (y might have gone to n0). z waits, then gets n0."""
    cluster = Cluster()
    await node(cluster, "n0")
    await node(cluster, "n1", cpu="2")
    await two_planned_pods(cluster)
    bind(cluster, "x", "n1")
    await cluster.pod("ns", "z", "q")
    await cluster.settle()
    # Room on n0 or n1 now would be room that is not there (or not yet known).
    assert cluster.gated("ns", "z")
    assert cluster.controller.mirror.nodes.used("n1") == Resources.parse({"cpu": "1"})
    bind(cluster, "y", "n1")
    await cluster.settle()
    assert planned(cluster, "x") == ("n1",) and planned(cluster, "y") == ("n1",)
    assert cluster.controller.mirror.nodes.used("n1") == Resources()  # counted by plans only
    assert not cluster.gated("ns", "z")
    assert planned(cluster, "z") == ("n0",)


async def test_a_swap_seen_half_then_whole_moves_both_plans_and_frees_nothing_early() -> None:
    cluster = Cluster()
    await node(cluster, "n0")
    await node(cluster, "n1")
    await two_planned_pods(cluster)
    bind(cluster, "x", "n1")  # y went to n0 at the same time; not seen yet
    await cluster.pod("ns", "z", "q")
    await cluster.settle()
    assert cluster.gated("ns", "z")
    assert planned(cluster, "x") == ("n0",)  # the move waits
    bind(cluster, "y", "n0")
    await cluster.settle()
    mirror = cluster.controller.mirror
    assert mirror.plan("ns/pod-x") == Placement("default", {"main": ("n1",)})
    assert mirror.plan("ns/pod-y") == Placement("default", {"main": ("n0",)})
    assert mirror.nodes.used("n0") == Resources() and mirror.nodes.used("n1") == Resources()
    assert cluster.gated("ns", "z")  # both nodes full, truly
    cluster.set_pod_phase("ns", "x", "Succeeded")
    await cluster.settle()
    assert not cluster.gated("ns", "z") and planned(cluster, "z") == ("n1",)


async def test_a_waiting_move_is_made_when_the_other_unit_goes() -> None:
    cluster = Cluster()
    await node(cluster, "n0")
    await node(cluster, "n1", cpu="2")
    await two_planned_pods(cluster)
    bind(cluster, "x", "n1")
    await cluster.settle()
    assert planned(cluster, "x") == ("n0",)
    await cluster.api.delete(pod_path("ns", "y"))  # y never bound: its slot goes
    await cluster.settle()
    assert planned(cluster, "x") == ("n1",)
    assert cluster.controller.mirror.nodes.used("n1") == Resources()
