"""Cached packing scores: always what scoring every node afresh gives, however
pods bind and finish and nodes change between calls."""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from extender.prioritize import dominant_resource, prioritize_nodes
from extender.scores import MAX_TABLES
from extender.state import ExtenderState
from extender.wire import parse_extender_args
from tests.extender import builders as b
from tests.extender.builders import World

NODE_NAMES = [f"node-{i}" for i in range(5)]


def reference(state: ExtenderState, pod: dict[str, Any], names: list[str]) -> dict[str, int]:
    """Every node scored from the state's sums, the way the extender did before caching."""
    record = parse_extender_args(b.extender_args(pod, names)).pod
    gang = f"team-a/job-{record.job_name}" if record.job_name else None
    siblings = dict(state.gang_nodes(gang)) if gang and state.locality_weight else {}
    busiest = max((siblings.get(name, 0) for name in names), default=0)
    locality = state.locality_weight if busiest else 0
    binpack = state.binpack_weight
    if locality + binpack == 0:
        return dict.fromkeys(names, 0)
    resource = dominant_resource(record.requests, state.allocatable_total())
    requested = record.requests.get_amount(resource)
    allocatable = state.allocatable_by_node(resource)
    used = state.used_by_node(resource)
    out: dict[str, int] = {}
    for name in names:
        capacity = allocatable.get(name, 0)
        pack = min(10.0, 10 * (used.get(name, 0) + requested) / capacity) if capacity > 0 else 0.0
        near = 10 * siblings.get(name, 0) / busiest if locality else 0.0
        out[name] = max(0, int((locality * near + binpack * pack) / (locality + binpack) + 0.5))
    return out


def answer(world: World, pod: dict[str, Any], names: list[str]) -> dict[str, int]:
    encoded = prioritize_nodes(world.state, parse_extender_args(b.extender_args(pod, names)))
    entries = orjson.loads(orjson.dumps(encoded))
    assert [entry["Host"] for entry in entries] == names
    return {entry["Host"]: entry["Score"] for entry in entries}


bind = st.tuples(st.just("bind"), st.sampled_from(NODE_NAMES), st.integers(0, 4000),
                 st.sampled_from([None, "j"]))
finish = st.tuples(st.just("finish"), st.integers(0, 20))
resize = st.tuples(st.just("resize"), st.sampled_from(NODE_NAMES), st.integers(0, 8))
delete = st.tuples(st.just("delete"), st.sampled_from(NODE_NAMES))
step_strategy = st.one_of(bind, finish, resize, delete)


@settings(max_examples=200, deadline=None)
@given(
    steps=st.lists(step_strategy, max_size=15),
    requests=st.lists(st.integers(0, 3000), min_size=1, max_size=3),
    weights=st.tuples(st.integers(0, 3), st.integers(0, 3)),
)
def test_cached_scores_equal_fresh_scores(
    steps: list[tuple[Any, ...]], requests: list[int], weights: tuple[int, int]
) -> None:
    world = World(locality_weight=weights[0], binpack_weight=weights[1])
    world.nodes(len(NODE_NAMES))
    world.queue("a")
    names = [*NODE_NAMES, "ghost"]
    bound: list[dict[str, Any]] = []

    def check() -> None:
        for cpu in requests:
            pod = b.pod("new", job="j", cpu=f"{cpu}m")
            assert answer(world, pod, names) == reference(world.state, pod, names)

    check()
    for step in steps:
        if step[0] == "bind":
            _, node, cpu, job = step
            bound.append(world.pod(f"p{len(bound)}", job=job, cpu=f"{cpu}m", node_name=node,
                                   phase="Running"))
        elif step[0] == "finish" and bound:
            done = dict(bound[step[1] % len(bound)])
            done["status"] = {"phase": "Succeeded"}
            world.add("Pod", done)
        elif step[0] == "resize":
            world.add("Node", b.node(step[1], cpu=str(step[2])))
        elif step[0] == "delete":
            world.store.apply("Node", "DELETED", b.node(step[1]))
        check()


def test_tables_are_bounded_and_unknown_nodes_are_not_kept() -> None:
    world = World()
    world.nodes(2)
    world.queue("a")
    for cpu in range(MAX_TABLES + 5):
        answer(world, b.pod("p", cpu=f"{cpu + 1}m"), ["node-0", "ghost"])
    assert len(world.state.scores) == MAX_TABLES
    table = world.state.scores.table("cpu", MAX_TABLES + 5, 1, 1)
    assert set(table) == {"node-0"}


def test_unmanaged_answers_are_zero_and_shared() -> None:
    world = World()
    world.nodes(2)
    pod = b.pod("p", namespace="kube-system", queue_name=None)  # an unmanaged namespace
    first = prioritize_nodes(world.state, parse_extender_args(b.extender_args(pod, ["node-0"])))
    again = prioritize_nodes(world.state, parse_extender_args(b.extender_args(pod, ["node-0"])))
    assert first[0] is again[0]
    assert orjson.loads(orjson.dumps(first)) == [{"Host": "node-0", "Score": 0}]
