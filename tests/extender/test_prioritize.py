"""prioritize: bin-packing on the dominant resource and gang locality, 0..10."""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from extender.prioritize import dominant_resource, prioritize_nodes
from extender.wire import HostPriorityList, parse_extender_args
from tests.extender import builders as b
from tests.extender.builders import World


def scores(world: World, pod: dict[str, Any], names: list[str]) -> dict[str, int]:
    encoded = prioritize_nodes(world.state, parse_extender_args(b.extender_args(pod, names)))
    answer: HostPriorityList = orjson.loads(orjson.dumps(encoded))
    assert [entry["Host"] for entry in answer] == names  # one entry per node, in order
    return {entry["Host"]: entry["Score"] for entry in answer}


def make_world(**options: Any) -> World:
    world = World(**options)
    world.nodes(4)  # 4 cpu, 16Gi each
    world.queue("a")
    return world


NAMES = ["node-0", "node-1", "node-2", "node-3"]


def test_unmanaged_pods_get_no_opinion() -> None:
    world = make_world()
    world.pod("busy", queue_name=None, cpu="3", node_name="node-2", phase="Running")
    unmanaged = b.pod("p", namespace="kube-system", queue_name=None)
    assert scores(world, unmanaged, NAMES) == dict.fromkeys(NAMES, 0)


def test_fuller_nodes_score_higher() -> None:
    world = make_world()
    world.pod("u1", cpu="2", node_name="node-1", phase="Running")
    world.pod("u2", cpu="3", node_name="node-2", phase="Running")
    world.pod("u3", queue_name=None, cpu="4", node_name="node-3", phase="Running")
    result = scores(world, b.pod("p", cpu="1"), NAMES)
    # 10 x (used + 1) / 4, rounded; an overfull node is capped at 10.
    assert result == {"node-0": 3, "node-1": 8, "node-2": 10, "node-3": 10}


def test_packing_follows_the_dominant_resource() -> None:
    world = make_world()
    world.pod("cpu-heavy", cpu="3", node_name="node-0", phase="Running")
    world.pod("mem-heavy", cpu="0", memory="12Gi", node_name="node-1", phase="Running")
    result = scores(world, b.pod("p", cpu="100m", memory="2Gi"), NAMES)
    assert result["node-1"] > result["node-0"]
    assert result["node-1"] == 9  # (12 + 2) / 16


def test_dominant_resource() -> None:
    total = {"cpu": 10_000, "memory": 100, "nvidia.com/gpu": 4}
    assert dominant_resource({"cpu": 1000, "memory": 5}, total) == "cpu"
    assert dominant_resource({"cpu": 1000, "memory": 50}, total) == "memory"
    assert dominant_resource({"cpu": 1000, "nvidia.com/gpu": 1}, total) == "nvidia.com/gpu"
    assert dominant_resource({"example.com/foo": 3}, total) == "cpu"
    assert dominant_resource({}, total) == "cpu"


def test_gang_locality_prefers_nodes_running_siblings() -> None:
    world = make_world(locality_weight=1, binpack_weight=0)
    world.pod("train-0", job="train", node_name="node-3", phase="Running")
    world.pod("train-1", job="train", node_name="node-3", phase="Running")
    world.pod("train-2", job="train", node_name="node-0", phase="Running")
    world.pod("other-0", job="other", node_name="node-1", phase="Running")
    result = scores(world, b.pod("train-3", job="train"), NAMES)
    assert result == {"node-0": 5, "node-1": 0, "node-2": 0, "node-3": 10}


def test_locality_and_packing_mix() -> None:
    world = make_world(locality_weight=3, binpack_weight=1)
    world.pod("g-0", group="g", cpu="1", node_name="node-0", phase="Running")
    world.pod("big", queue_name=None, cpu="3", node_name="node-1", phase="Running")
    result = scores(world, b.pod("g-1", group="g", cpu="1"), NAMES)
    # node-0: (3 x 10 + 1 x 5) / 4 = 8.75; node-1: (0 + 10) / 4 = 2.5
    assert result["node-0"] == 9
    assert result["node-1"] == 3
    assert result["node-0"] > result["node-1"]


def test_a_gangs_first_pod_is_scored_on_packing_alone() -> None:
    world = make_world()
    world.pod("u", cpu="3", node_name="node-2", phase="Running")
    result = scores(world, b.pod("first", job="fresh", cpu="1"), NAMES)
    assert result["node-2"] == 10  # not halved by the absent locality signal


def test_finished_siblings_do_not_attract() -> None:
    world = make_world(locality_weight=1, binpack_weight=0)
    world.pod("t-0", job="t", node_name="node-1", phase="Succeeded")
    assert scores(world, b.pod("t-1", job="t"), NAMES) == dict.fromkeys(NAMES, 0)


def test_zero_weights_and_unknown_nodes() -> None:
    world = make_world(locality_weight=0, binpack_weight=0)
    assert scores(world, b.pod("p"), ["node-0", "ghost"]) == {"node-0": 0, "ghost": 0}
    world = make_world()
    assert scores(world, b.pod("p"), ["ghost"]) == {"ghost": 0}


@settings(max_examples=200, deadline=None)
@given(
    used=st.lists(st.integers(0, 6000), min_size=4, max_size=4),
    request=st.integers(0, 5000),
    siblings=st.lists(st.integers(0, 3), min_size=4, max_size=4),
    weights=st.tuples(st.integers(0, 5), st.integers(0, 5)),
)
def test_scores_stay_in_range(
    used: list[int], request: int, siblings: list[int], weights: tuple[int, int]
) -> None:
    world = make_world(locality_weight=weights[0], binpack_weight=weights[1])
    for index, amount in enumerate(used):
        world.pod(f"u-{index}", cpu=f"{amount}m", node_name=f"node-{index}", phase="Running")
        for k in range(siblings[index]):
            world.pod(f"j-{index}-{k}", job="j", cpu="0", node_name=f"node-{index}",
                      phase="Running")
    result = scores(world, b.pod("j-new", job="j", cpu=f"{request}m"), NAMES)
    assert all(0 <= value <= 10 for value in result.values())
