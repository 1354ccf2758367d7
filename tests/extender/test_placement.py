"""The plan travels with the work (DESIGN §10): filter keeps a planned unit's
pods in its pool, prioritize ranks its planned nodes first, and neither
fights a binding elsewhere in the pool."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from extender.filter import filter_nodes
from extender.prioritize import prioritize_nodes
from extender.wire import parse_extender_args
from tests.extender import builders as b
from tests.extender.builders import World

ALL = ["node-0", "node-1", "gpu-0", "gpu-1", "gpu-2"]


@pytest.fixture
def world() -> World:
    world = World()
    world.nodes(2)
    world.nodes(3, prefix="gpu-", labels={"accel": "gpu"})
    world.pool("gpu", accel="gpu")
    world.queue("a")
    return world


def plan(pool: str, *nodes: str) -> dict[str, Any]:
    return {"pool": pool, "nodes": {"main": list(nodes)}}


def filtered(world: World, pod: dict[str, Any], names: list[str] = ALL) -> Any:
    return filter_nodes(world.state, parse_extender_args(b.extender_args(pod, names))).result


def scores(world: World, pod: dict[str, Any], names: list[str] = ALL) -> dict[str, int]:
    encoded = prioritize_nodes(world.state, parse_extender_args(b.extender_args(pod, names)))
    return {entry["Host"]: entry["Score"] for entry in orjson.loads(orjson.dumps(encoded))}


def test_filter_passes_only_the_units_pool(world: World) -> None:
    world.unit("team-a", "job-t", "a", phase="Dequeued", count=2,
               admission=plan("gpu", "gpu-0", "gpu-1"))
    result = filtered(world, b.pod("t-0", job="t"), [*ALL, "gpu-new"])
    # Every node of the pool, not only the planned ones: kube-scheduler may
    # bind elsewhere in the pool, and the plan follows.
    assert result["NodeNames"] == ["gpu-0", "gpu-1", "gpu-2"]
    reason = 'node is not in pool "gpu", where queue "a" admitted unit team-a/job-t'
    assert result["FailedAndUnresolvableNodes"] == {"node-0": reason, "node-1": reason}
    assert result["FailedNodes"] == {"gpu-new": "node gpu-new is not in arbiter's cache yet"}


def test_the_default_pool_is_the_nodes_no_pool_selects(world: World) -> None:
    world.unit("team-a", "job-t", "a", phase="Dequeued", admission=plan("default", "node-1"))
    assert filtered(world, b.pod("t-0", job="t"))["NodeNames"] == ["node-0", "node-1"]


def test_a_unit_admitted_without_a_plan_is_not_confined(world: World) -> None:
    world.unit("team-a", "job-old", "a", phase="Running")
    result = filtered(world, b.pod("old-0", job="old"))
    assert result["NodeNames"] == ALL
    assert result["FailedAndUnresolvableNodes"] == {}


def test_pool_and_queue_selector_both_confine(world: World) -> None:
    world.add("Node", b.node("gpu-3", labels={"accel": "gpu", "zone": "z1"}))
    world.queue("z", node_selector={"zone": "z1"})
    world.unit("team-a", "job-t", "z", phase="Dequeued", admission=plan("gpu", "gpu-3"))
    result = filtered(world, b.pod("t-0", job="t", queue_name="z"), [*ALL, "gpu-3"])
    assert result["NodeNames"] == ["gpu-3"]
    unresolvable = result["FailedAndUnresolvableNodes"]
    assert "not in pool" in unresolvable["node-0"]
    assert "nodeSelector zone=z1" in unresolvable["gpu-0"]


def test_a_pool_without_nodes_rejects_every_node(world: World) -> None:
    world.unit("team-a", "job-t", "a", phase="Dequeued", admission=plan("gone", "x"))
    outcome = filter_nodes(world.state, parse_extender_args(
        b.extender_args(b.pod("t-0", job="t"), ALL)))
    assert outcome.verdict == "rejected"
    assert set(outcome.result["FailedAndUnresolvableNodes"]) == set(ALL)
    assert len(world.state.assumed) == 0


def test_pool_membership_follows_relabelled_nodes(world: World) -> None:
    world.unit("team-a", "job-t", "a", phase="Dequeued", admission=plan("gpu", "gpu-0"))
    world.add("Node", b.node("node-1", labels={"accel": "gpu"}))  # joins the pool
    world.add("Node", b.node("gpu-2"))  # leaves it
    assert filtered(world, b.pod("t-0", job="t"))["NodeNames"] == ["node-1", "gpu-0", "gpu-1"]


def test_planned_nodes_rank_first(world: World) -> None:
    world.unit("team-a", "job-t", "a", phase="Dequeued", count=2,
               admission=plan("gpu", "gpu-2", "gpu-2"))
    # gpu-0 is nearly full: packing alone would prefer it.
    world.pod("filler", queue_name=None, cpu="3900m", node_name="gpu-0", phase="Running")
    result = scores(world, b.pod("t-0", job="t"), ["gpu-0", "gpu-1", "gpu-2"])
    assert result["gpu-2"] == 10
    assert result["gpu-0"] == 9  # capped below the plan
    assert result["gpu-1"] < result["gpu-0"]


def test_planned_nodes_taken_by_bound_siblings_are_not_preferred(world: World) -> None:
    world.unit("team-a", "job-t", "a", phase="Dequeued", count=3,
               admission=plan("gpu", "gpu-0", "gpu-1", "gpu-1"))
    world.pod("t-0", job="t", node_name="gpu-0", phase="Running")
    world.pod("t-1", job="t", node_name="gpu-1", phase="Running")
    result = scores(world, b.pod("t-2", job="t"), ["gpu-0", "gpu-1", "gpu-2"])
    assert result["gpu-1"] == 10  # one more pod is planned there
    assert result["gpu-0"] < 10


def test_a_binding_elsewhere_is_followed_not_fought(world: World) -> None:
    world.unit("team-a", "job-t", "a", phase="Dequeued", count=2,
               admission=plan("gpu", "gpu-0", "gpu-1"))
    # kube-scheduler bound the first pod on gpu-2, outside the plan.
    world.pod("t-0", job="t", node_name="gpu-2", phase="Running")
    assert filtered(world, b.pod("t-1", job="t"))["NodeNames"] == ["gpu-0", "gpu-1", "gpu-2"]
    result = scores(world, b.pod("t-1", job="t"), ["gpu-0", "gpu-1", "gpu-2"])
    assert result["gpu-0"] == result["gpu-1"] == 10  # either planned slot is still free
    # The loop moves the plan to the binding: gpu-2 (bound) first, then gpu-0.
    world.unit("team-a", "job-t", "a", phase="Running", count=2,
               admission=plan("gpu", "gpu-2", "gpu-0"))
    result = scores(world, b.pod("t-1", job="t"), ["gpu-0", "gpu-1", "gpu-2"])
    assert result["gpu-0"] == 10
    assert result["gpu-1"] < 10 and result["gpu-2"] < 10


def test_a_plan_ranks_even_with_zero_weights() -> None:
    world = World(locality_weight=0, binpack_weight=0)
    world.nodes(2)
    world.queue("a")
    world.unit("team-a", "pod-p", "a", phase="Dequeued", admission=plan("default", "node-1"))
    assert scores(world, b.pod("p"), ["node-0", "node-1"]) == {"node-0": 0, "node-1": 10}


def test_unplanned_units_score_as_before(world: World) -> None:
    world.unit("team-a", "job-t", "a", phase="Running")
    world.pod("busy", queue_name=None, cpu="3", node_name="node-1", phase="Running")
    assert scores(world, b.pod("t-0", job="t"), ["node-0", "node-1"]) == {
        "node-0": 3, "node-1": 10}
