"""filter: unmanaged pods pass, managed pods need an admitted unit and room
under their queue's capability, and a queue's nodeSelector confines them."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from extender.filter import FilterOutcome, filter_nodes
from extender.wire import parse_extender_args
from tests.extender import builders as b
from tests.extender.builders import World


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def world(clock: Clock) -> World:
    world = World(clock=clock, assume_ttl=30.0)
    world.nodes(4)
    world.queue("a", capability={"cpu": "4"})
    world.queue("b")
    return world


def run(world: World, pod: dict[str, Any], names: list[str] | None = None) -> FilterOutcome:
    names = names if names is not None else sorted(world.store.nodes)
    return filter_nodes(world.state, parse_extender_args(b.extender_args(pod, names)))


def test_a_pod_without_queue_label_in_a_managed_namespace_is_checked(world: World) -> None:
    # Item 15: managed-ness is the webhook's (the namespace rule), not the
    # label's; an unlabelled pod there got past the webhook (bypassed, or
    # created before arbiter) and is not placed unchecked.
    outcome = run(world, b.pod("plain", queue_name=None), ["node-0", "ghost"])
    assert outcome.verdict == "rejected"
    assert outcome.result["NodeNames"] == []
    reason = outcome.result["FailedAndUnresolvableNodes"]["node-0"]
    assert 'namespace "team-a" has no queue' in reason
    assert len(world.state.assumed) == 0


def test_an_unlabelled_pod_takes_its_namespaces_queue_and_needs_its_unit(world: World) -> None:
    listing = b.queue("listing")
    listing["spec"]["namespaces"] = ["team-a"]
    world.add("Queue", listing)
    outcome = run(world, b.pod("plain", queue_name=None))
    assert outcome.verdict == "rejected"
    reason = outcome.result["FailedAndUnresolvableNodes"]["node-0"]
    assert 'queue "listing" has not admitted this pod' in reason
    assert "no arbiter.dev/queue label" in reason
    # Admitted (its unit exists and is admitted): it passes like a labelled pod.
    pod = b.pod("plain", queue_name=None)
    world.unit("team-a", "pod-plain", "listing", phase="Dequeued")
    assert run(world, pod).verdict == "passed"


def test_an_unlabelled_pod_in_an_unmanaged_namespace_passes(world: World) -> None:
    outcome = run(world, b.pod("plain", namespace="kube-system", queue_name=None))
    assert outcome.verdict == "unmanaged"
    assert outcome.result["NodeNames"] == sorted(world.store.nodes)


@pytest.mark.parametrize("namespace", ["kube-system", "opted-out"])
def test_pods_in_unmanaged_namespaces_pass(world: World, namespace: str) -> None:
    world.add("Namespace", {"metadata": {"name": "opted-out",
                                         "labels": {"arbiter.dev/managed": "false"}}})
    outcome = run(world, b.pod("sys", namespace=namespace, queue_name="nope"))
    assert outcome.verdict == "unmanaged"
    assert outcome.result["NodeNames"] == sorted(world.store.nodes)


def test_admitted_job_pod_passes_and_is_assumed(world: World) -> None:
    world.unit("team-a", "job-train", "a", phase="Dequeued", count=2)
    pod = b.pod("train-0", job="train")
    outcome = run(world, pod)
    assert outcome.verdict == "passed"
    assert outcome.result["NodeNames"] == sorted(world.store.nodes)
    assert outcome.result["Nodes"] is None
    assert pod["metadata"]["uid"] in world.state.assumed


def test_pod_without_a_unit_fails_everywhere_with_a_readable_reason(world: World) -> None:
    outcome = run(world, b.pod("sneaky"))
    assert outcome.verdict == "rejected"
    assert outcome.result["NodeNames"] == []
    failed = outcome.result["FailedAndUnresolvableNodes"]
    assert set(failed) == set(world.store.nodes)
    reason = failed["node-0"]
    assert 'queue "a" has not admitted this pod' in reason
    assert "no QueueUnit team-a/pod-sneaky" in reason
    assert "created while arbiter was down" in reason
    assert len(world.state.assumed) == 0


def test_pod_of_an_enqueued_unit_is_not_placed(world: World) -> None:
    world.unit("team-a", "job-big", "a", phase="Enqueued")
    outcome = run(world, b.pod("big-0", job="big"))
    reason = outcome.result["FailedAndUnresolvableNodes"]["node-1"]
    assert "has not admitted this pod's unit team-a/job-big yet (unit phase Enqueued" in reason


def test_pod_group_members_use_the_group_unit(world: World) -> None:
    world.unit("team-a", "group-g", "a", phase="Dequeued", count=3)
    assert run(world, b.pod("g-0", group="g")).verdict == "passed"
    assert run(world, b.pod("h-0", group="h")).verdict == "rejected"


def test_unknown_queue(world: World) -> None:
    outcome = run(world, b.pod("p", queue_name="ghost"))
    assert 'queue "ghost"' in outcome.result["FailedAndUnresolvableNodes"]["node-0"]
    assert "does not exist" in outcome.result["FailedAndUnresolvableNodes"]["node-0"]


def test_capability_counts_bound_and_assumed_pods(world: World) -> None:
    for i in range(3):
        world.unit("team-a", f"pod-run-{i}", "a", phase="Running")
        world.pod(f"run-{i}", node_name=f"node-{i}", phase="Running")
    world.unit("team-a", "pod-x", "a", phase="Dequeued")
    world.unit("team-a", "pod-y", "a", phase="Dequeued")
    x = b.pod("x")
    y = b.pod("y")
    assert run(world, x).verdict == "passed"  # 3 + 1 <= 4
    # x is approved but not bound yet: y may not squeeze in.
    outcome = run(world, y)
    assert outcome.verdict == "rejected"
    assert outcome.result["FailedAndUnresolvableNodes"]["node-0"] == (
        'queue "a" would exceed its capability: cpu 4 in use + 1 requested > 4'
    )
    # Filtering x again (a retry) does not count it twice.
    assert run(world, x).verdict == "passed"
    # x binds: counted once, as a bound pod.
    bound = copy.deepcopy(x)
    bound["spec"]["nodeName"] = "node-3"
    world.add("Pod", bound)
    assert x["metadata"]["uid"] not in world.state.assumed
    assert world.state.queue_in_use("a").get_amount("cpu") == 4000
    assert run(world, y).verdict == "rejected"
    # One of the running pods finishes: room for y.
    finished = world.store.pod_by_name("team-a", "run-0")
    assert finished is not None
    world.add("Pod", b.pod("run-0", node_name="node-0", phase="Succeeded", pod_uid=finished.uid))
    assert run(world, y).verdict == "passed"


def test_other_queues_and_unrequested_resources_do_not_count(world: World) -> None:
    for i in range(4):
        world.pod(f"b-{i}", queue_name="b", node_name=f"node-{i}", phase="Running")
    world.unit("team-a", "pod-x", "a", phase="Dequeued")
    assert run(world, b.pod("x", cpu="4")).verdict == "passed"
    world.unit("team-a", "pod-z", "a", phase="Dequeued")
    assert run(world, b.pod("z", cpu="0", memory="1Gi")).verdict == "passed"


def test_assumed_pods_expire(world: World, clock: Clock) -> None:
    world.unit("team-a", "pod-x", "a", phase="Dequeued")
    world.unit("team-a", "pod-y", "a", phase="Dequeued")
    assert run(world, b.pod("x", cpu="4")).verdict == "passed"
    assert run(world, b.pod("y", cpu="1")).verdict == "rejected"
    clock.now += 31
    assert run(world, b.pod("y", cpu="1")).verdict == "passed"


def test_deleted_pod_is_no_longer_assumed(world: World) -> None:
    world.unit("team-a", "pod-x", "a", phase="Dequeued")
    x = b.pod("x", cpu="4")
    run(world, x)
    world.store.apply("Pod", "DELETED", x)
    assert world.state.queue_in_use("a").is_zero()


def test_node_selector_confines_the_queue(world: World) -> None:
    world.add("Node", b.node("gpu-0", labels={"pool": "gpu"}))
    world.add("Node", b.node("gpu-1", labels={"pool": "gpu", "zone": "z1"}))
    world.queue("g", node_selector={"pool": "gpu"})
    world.unit("team-a", "pod-p", "g", phase="Dequeued")
    outcome = run(world, b.pod("p", queue_name="g"), ["node-0", "gpu-0", "gpu-1", "new-node"])
    assert outcome.verdict == "passed"
    assert outcome.result["NodeNames"] == ["gpu-0", "gpu-1"]
    unresolvable = outcome.result["FailedAndUnresolvableNodes"]
    assert unresolvable == {"node-0": 'node does not match queue "g"\'s nodeSelector pool=gpu'}
    assert outcome.result["FailedNodes"] == {
        "new-node": "node new-node is not in arbiter's cache yet"
    }


def test_node_selector_with_no_match_rejects(world: World) -> None:
    world.queue("g", node_selector={"pool": "gpu"})
    world.unit("team-a", "pod-p", "g", phase="Dequeued")
    outcome = run(world, b.pod("p", queue_name="g"))
    assert outcome.verdict == "rejected"
    assert len(outcome.result["FailedAndUnresolvableNodes"]) == 4
    assert len(world.state.assumed) == 0


def test_full_nodes_are_answered_with_nodes(world: World) -> None:
    world.queue("g", node_selector={"pool": "gpu"})
    world.unit("team-a", "pod-p", "g", phase="Dequeued")
    nodes = [b.node("x-0"), b.node("x-1", labels={"pool": "gpu"})]
    args = parse_extender_args(b.extender_args_nodes(b.pod("p", queue_name="g"), nodes))
    outcome = filter_nodes(world.state, args)
    assert outcome.result["NodeNames"] is None
    assert outcome.result["Nodes"] is not None
    assert outcome.result["Nodes"]["items"] == [nodes[1]]
    assert set(outcome.result["FailedAndUnresolvableNodes"]) == {"x-0"}


def test_unmanaged_pod_with_full_nodes_gets_them_all_back(world: World) -> None:
    nodes = [b.node("x-0"), b.node("x-1")]
    unmanaged = b.pod("p", namespace="kube-system", queue_name=None)
    args = parse_extender_args(b.extender_args_nodes(unmanaged, nodes))
    outcome = filter_nodes(world.state, args)
    assert outcome.result["Nodes"] is not None
    assert outcome.result["Nodes"]["items"] == nodes


def test_both_problems_are_reported(world: World) -> None:
    for i in range(4):
        world.unit("team-a", f"pod-run-{i}", "a", phase="Running")
        world.pod(f"run-{i}", node_name=f"node-{i}", phase="Running")
    outcome = run(world, b.pod("late"))
    reason = outcome.result["FailedAndUnresolvableNodes"]["node-0"]
    assert "no QueueUnit team-a/pod-late" in reason
    assert "would exceed its capability: cpu 4 in use + 1 requested > 4" in reason
