"""preempt: fair share protects a tenant's pods from other tenants' priority."""

from __future__ import annotations

from typing import Any

import pytest

from extender.preempt import PreemptOutcome, fair_share_view, preempt
from extender.wire import parse_preemption_args
from tests.extender import builders as b
from tests.extender.builders import World


def running(world: World, name: str, queue: str | None, node: str, *, cpu: str = "1",
            priority: int = 0, namespace: str = "team-a") -> str:
    obj = world.pod(name, queue_name=queue, node_name=node, phase="Running", cpu=cpu,
                    priority=priority, namespace=namespace)
    return str(obj["metadata"]["uid"])


def admitted(world: World, queue: str, name: str, cpu: int, *, phase: str = "Running",
             namespace: str = "team-a") -> None:
    world.unit(namespace, name, queue, phase=phase, count=cpu, cpu="1")


def ask(world: World, pod: dict[str, Any], victims: dict[str, list[str]], pdb: int = 0
        ) -> PreemptOutcome:
    return preempt(world.state, parse_preemption_args(b.preemption_args(pod, victims, pdb)))


@pytest.fixture
def world() -> World:
    """16 cpu; queues a and b (weight 1). a's preemptor `hi` is admitted."""
    world = World()
    world.nodes(4, cpu="4")
    world.queue("a")
    world.queue("b")
    admitted(world, "a", "pod-hi", 1, phase="Dequeued")
    return world


def test_victims_of_a_queue_within_its_deserved_share_are_protected(world: World) -> None:
    admitted(world, "a", "job-a", 7)  # a: 8 with hi
    admitted(world, "b", "job-b", 8)  # b: 8 = deserved 8
    uid = running(world, "b-0", "b", "node-0")
    view = fair_share_view(world.state)
    assert view.within_deserved("b")
    outcome = ask(world, b.pod("hi", priority=1000), {"node-0": [uid]})
    assert outcome.result == {"NodeNameToMetaVictims": {}}
    assert outcome.verdict == "blocked"
    assert 'queue "b", which is within its deserved share' in outcome.dropped["node-0"]


def test_victims_of_a_queue_above_its_deserved_share_may_go(world: World) -> None:
    admitted(world, "a", "job-a", 4)  # a: 5 admitted
    world.unit("team-a", "job-a-more", "a", phase="Enqueued", count=3, cpu="1")  # a wants 8
    admitted(world, "b", "job-b", 11)  # b: 11 > deserved 8
    uid = running(world, "b-0", "b", "node-1")
    outcome = ask(world, b.pod("hi", priority=1000), {"node-1": [uid]}, pdb=1)
    assert outcome.verdict == "allowed"
    assert outcome.result == {
        "NodeNameToMetaVictims": {"node-1": {"Pods": [{"UID": uid}], "NumPDBViolations": 1}}
    }


def test_own_queue_lower_priority_victims_may_go_even_within_share(world: World) -> None:
    admitted(world, "a", "job-a", 3)
    low = running(world, "a-low", "a", "node-0", priority=10)
    same = running(world, "a-same", "a", "node-1", priority=1000)
    outcome = ask(world, b.pod("hi", priority=1000), {"node-0": [low], "node-1": [same]})
    assert list(outcome.result["NodeNameToMetaVictims"]) == ["node-0"]
    assert "without a lower priority" in outcome.dropped["node-1"]


def test_unmanaged_victims_are_left_to_the_scheduler(world: World) -> None:
    uid = running(world, "web", None, "node-2")
    system = running(world, "dns", "b", "node-3", namespace="kube-system")
    outcome = ask(world, b.pod("hi", priority=1000), {"node-2": [uid], "node-3": [system]})
    assert set(outcome.result["NodeNameToMetaVictims"]) == {"node-2", "node-3"}


def test_a_node_with_any_protected_victim_is_dropped_whole(world: World) -> None:
    admitted(world, "b", "job-b", 4)
    free = running(world, "web", None, "node-0")
    protected = running(world, "b-0", "b", "node-0")
    other = running(world, "web-2", None, "node-1")
    outcome = ask(world, b.pod("hi", priority=1000),
                  {"node-0": [free, protected], "node-1": [other]})
    assert outcome.result["NodeNameToMetaVictims"] == {
        "node-1": {"Pods": [{"UID": other}], "NumPDBViolations": 0}
    }


def test_unknown_victims_are_protected(world: World) -> None:
    outcome = ask(world, b.pod("hi", priority=1000), {"node-0": ["no-such-uid"]})
    assert outcome.result["NodeNameToMetaVictims"] == {}
    assert "not in arbiter's cache" in outcome.dropped["node-0"]


def test_non_reclaimable_queues_are_protected_even_above_share(world: World) -> None:
    world.queue("b", reclaimable=False)
    world.unit("team-a", "job-a-more", "a", phase="Enqueued", count=7, cpu="1")
    admitted(world, "b", "job-b", 12)
    uid = running(world, "b-0", "b", "node-0")
    assert not fair_share_view(world.state).within_deserved("b")
    outcome = ask(world, b.pod("hi", priority=1000), {"node-0": [uid]})
    assert "not reclaimable" in outcome.dropped["node-0"]


def test_unmanaged_preemptors_keep_every_candidate(world: World) -> None:
    admitted(world, "b", "job-b", 2)
    uid = running(world, "b-0", "b", "node-0")
    critical = b.pod("critical", namespace="kube-system", queue_name=None, priority=2_000_000_000)
    outcome = ask(world, critical, {"node-0": [uid], "node-1": []})
    assert outcome.verdict == "unmanaged"
    assert list(outcome.result["NodeNameToMetaVictims"]) == ["node-0"]  # no-victim node dropped


def test_a_preemptor_that_was_not_admitted_preempts_nothing(world: World) -> None:
    uid = running(world, "web", None, "node-0")
    outcome = ask(world, b.pod("sneaky", priority=1000), {"node-0": [uid]})
    assert outcome.result["NodeNameToMetaVictims"] == {}
    assert "not admitted" in outcome.dropped["node-0"]


def test_nodes_outside_the_queue_selector_are_dropped(world: World) -> None:
    world.add("Node", b.node("gpu-0", labels={"pool": "gpu"}))
    world.queue("a", node_selector={"pool": "gpu"})
    inside = running(world, "web", None, "gpu-0")
    outside = running(world, "web-2", None, "node-0")
    outcome = ask(world, b.pod("hi", priority=1000), {"gpu-0": [inside], "node-0": [outside]})
    assert list(outcome.result["NodeNameToMetaVictims"]) == ["gpu-0"]
    assert "nodeSelector" in outcome.dropped["node-0"]


def test_whole_victim_pods_are_judged_from_the_payload(world: World) -> None:
    admitted(world, "b", "job-b", 4)
    victim = b.pod("b-0", queue_name="b", node_name="node-0", phase="Running")
    unmanaged = b.pod("web", queue_name=None, node_name="node-1", phase="Running")
    body = {
        "Pod": b.pod("hi", priority=1000),
        "NodeNameToVictims": {
            "node-0": {"Pods": [victim], "NumPDBViolations": 0},
            "node-1": {"Pods": [unmanaged], "NumPDBViolations": 3},
        },
        "NodeNameToMetaVictims": None,
    }
    outcome = preempt(world.state, parse_preemption_args(body))
    assert outcome.result["NodeNameToMetaVictims"] == {
        # pdb violations never exceed the pods kept
        "node-1": {"Pods": [{"UID": unmanaged["metadata"]["uid"]}], "NumPDBViolations": 1}
    }


def test_finished_units_do_not_count_toward_allocation(world: World) -> None:
    admitted(world, "b", "job-old", 16, phase="Succeed")
    view = fair_share_view(world.state)
    assert view.allocated.get("b") is None
    assert view.within_deserved("b")
