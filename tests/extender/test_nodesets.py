"""Precomputed node sets give exactly the answers label matching per node gives,
however nodes are added, relabelled and deleted around them."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from extender.filter import filter_nodes
from extender.nodesets import SelectorNodeSets
from extender.wire import parse_extender_args
from tests.extender import builders as b
from tests.extender.builders import World

KEYS = ("zone", "pool", "gpu")
VALUES = ("x", "y")
NODE_NAMES = [f"n{i}" for i in range(8)]

labels_strategy = st.dictionaries(st.sampled_from(KEYS), st.sampled_from(VALUES), max_size=3)
selector_strategy = st.dictionaries(st.sampled_from(KEYS), st.sampled_from(VALUES),
                                    min_size=1, max_size=2)
# (node, labels) to add or relabel it, (node, None) to delete it.
change_strategy = st.tuples(st.sampled_from(NODE_NAMES), st.none() | labels_strategy)


def matches(labels: dict[str, str], selector: dict[str, str]) -> bool:
    return all(labels.get(key) == value for key, value in selector.items())


def apply_change(world: World, current: dict[str, dict[str, str]],
                 name: str, labels: dict[str, str] | None) -> None:
    if labels is None:
        world.store.apply("Node", "DELETED", b.node(name))
        current.pop(name, None)
    else:
        world.add("Node", b.node(name, labels=labels))
        current[name] = {"kubernetes.io/hostname": name, **labels}


@settings(max_examples=300, deadline=None)
@given(
    initial=st.dictionaries(st.sampled_from(NODE_NAMES), labels_strategy),
    selector=selector_strategy,
    changes=st.lists(change_strategy, max_size=12),
    candidates=st.lists(st.sampled_from([*NODE_NAMES, "ghost"]), max_size=10),
)
def test_filter_with_node_sets_equals_label_matching(
    initial: dict[str, dict[str, str]], selector: dict[str, str],
    changes: list[tuple[str, dict[str, str] | None]], candidates: list[str],
) -> None:
    world = World()
    current: dict[str, dict[str, str]] = {}
    for name, labels in initial.items():
        apply_change(world, current, name, labels)
    world.queue("q", node_selector=selector)
    world.unit("team-a", "pod-p", "q", phase="Dequeued", cpu="0")
    pod = b.pod("p", queue_name="q", cpu="0")

    def check() -> None:
        args = parse_extender_args(b.extender_args(pod, candidates))
        result: Any = filter_nodes(world.state, args).result
        assert result["NodeNames"] == [
            name for name in candidates if name in current and matches(current[name], selector)
        ]
        assert set(result["FailedAndUnresolvableNodes"]) == {
            name for name in candidates if name in current and not matches(current[name], selector)
        }
        assert set(result["FailedNodes"]) == {name for name in candidates if name not in current}

    check()  # builds the set
    for name, new_labels in changes:
        apply_change(world, current, name, new_labels)
        check()  # the set kept current incrementally
    # ... and equal to one built from scratch.
    fresh = SelectorNodeSets(world.store.nodes)
    fresh.rebuild()
    assert set(fresh.matching(tuple(selector.items()))) == set(
        world.state.node_sets.matching(tuple(selector.items())))


def test_sets_follow_queues_and_are_dropped_when_unused() -> None:
    world = World()
    world.nodes(2, labels={"pool": "a"})
    world.queue("q", node_selector={"pool": "a"})
    assert world.state.node_sets.matching((("pool", "a"),)) == {"node-0", "node-1"}
    assert len(world.state.node_sets) == 1
    world.queue("q", node_selector={"pool": "b"})  # the old selector is no longer used
    assert len(world.state.node_sets) == 0
    world.store.apply("Queue", "DELETED", b.queue("q"))
    assert len(world.state.node_sets) == 0


def test_a_heartbeat_leaves_the_sets_alone() -> None:
    world = World()
    world.nodes(1, labels={"pool": "a"})
    members = world.state.node_sets.matching((("pool", "a"),))
    labels = world.state.node_labels("node-0")
    world.add("Node", b.node("node-0", labels={"pool": "a"}))
    assert world.state.node_labels("node-0") is labels
    assert world.state.node_sets.matching((("pool", "a"),)) is members
    assert members == {"node-0"}


def test_selector_order_does_not_matter() -> None:
    world = World()
    world.nodes(1, labels={"pool": "a", "zone": "z"})
    sets = world.state.node_sets
    assert sets.matching((("pool", "a"), ("zone", "z"))) is sets.matching(
        (("zone", "z"), ("pool", "a")))
