"""Row 11 of issue #25: the extender charges a bound pod to the queue of the
unit that holds it, matched by uid, never to the queue its label names."""

from __future__ import annotations

import asyncio
import copy

from extender.filter import filter_nodes
from extender.wire import parse_extender_args
from tests.extender import builders as b
from tests.extender.builders import World


def _world() -> World:
    world = World()
    world.nodes(4)
    world.queue("a", capability={"cpu": "4"})
    world.queue("b", capability={"cpu": "2"})
    return world


def _filter(world: World, pod: dict[str, object]) -> tuple[str, str]:
    outcome = filter_nodes(world.state, parse_extender_args(
        b.extender_args(pod, sorted(world.store.nodes))))
    reasons = outcome.result["FailedAndUnresolvableNodes"] or {}
    return outcome.verdict, reasons.get("node-0", "")


def test_a_relabelled_pod_stays_charged_to_its_units_queue() -> None:
    world = _world()
    world.unit("team-a", "pod-mine", "a")
    mine = world.pod("mine", queue_name="a", cpu="2", node_name="node-0", phase="Running")
    # The tenant relabels its running pod with queue b's name (the webhook
    # now denies that; a pod that got past it anyway changes nothing here).
    relabelled = copy.deepcopy(mine)
    relabelled["metadata"]["labels"]["arbiter.dev/queue"] = "b"
    world.add("Pod", relabelled)
    assert world.state.queue_in_use("a").get_amount("cpu") == 2000
    assert world.state.queue_in_use("b").get_amount("cpu") == 0
    # b's own admitted pods still fit b's capability.
    world.unit("team-b", "pod-theirs", "b", phase="Dequeued")
    verdict, reason = _filter(world, b.pod("theirs", namespace="team-b", queue_name="b",
                                           cpu="2"))
    assert (verdict, reason) == ("passed", "")


def test_a_unit_of_the_same_name_for_another_uid_holds_nothing() -> None:
    world = _world()
    world.unit("team-a", "pod-web", "b", phase="Running")  # a deleted pod "web"'s
    reborn = b.pod("web", queue_name="b", pod_uid="a-new-uid")
    verdict, reason = _filter(world, reborn)
    assert verdict == "rejected"
    assert reason.startswith('queue "b" has not admitted this pod: QueueUnit team-a/pod-web '
                             "stands for another consumer of that name (by uid)")
    # Bound anyway (past the extender), it is charged to its namespace's
    # queue (none here), not to b through the stale unit or its label.
    reborn["spec"]["nodeName"] = "node-1"
    world.add("Pod", reborn)
    assert world.state.queue_in_use("b").get_amount("cpu") == 0


def test_a_unit_arriving_after_its_pod_bound_recharges_it() -> None:
    world = _world()
    listing = b.queue("listing")
    listing["spec"]["namespaces"] = ["team-a"]
    world.add("Queue", listing)
    world.pod("late", queue_name="b", cpu="1", node_name="node-0", phase="Running")
    # No unit yet: its namespace's queue, whatever its label says.
    assert world.state.queue_in_use("listing").get_amount("cpu") == 1000
    assert world.state.queue_in_use("b").get_amount("cpu") == 0
    world.unit("team-a", "pod-late", "a")
    assert world.state.queue_in_use("a").get_amount("cpu") == 1000
    assert world.state.queue_in_use("listing").get_amount("cpu") == 0
    world.store.apply("QueueUnit", "DELETED", b.unit("team-a", "pod-late", "a"))
    assert world.state.queue_in_use("a").get_amount("cpu") == 0
    assert world.state.queue_in_use("listing").get_amount("cpu") == 1000


def test_a_namespace_or_queue_change_recharges_its_unqueued_pods() -> None:
    """A pod no unit holds is charged to its namespace's queue: when that
    queue changes (the namespace's label, a Queue listing it) or the
    namespace stops being managed, the charge follows."""
    world = _world()
    world.add("Namespace", {"metadata": {"name": "team-a",
                                         "labels": {"arbiter.dev/queue": "a"}}})
    world.pod("stray", queue_name="a", cpu="1", node_name="node-0", phase="Running")
    assert world.state.queue_in_use("a").get_amount("cpu") == 1000
    world.add("Namespace", {"metadata": {"name": "team-a",
                                         "labels": {"arbiter.dev/queue": "b"}}})
    assert world.state.queue_in_use("a").get_amount("cpu") == 0
    assert world.state.queue_in_use("b").get_amount("cpu") == 1000
    listing = b.queue("listing")
    listing["spec"]["namespaces"] = ["team-a"]
    world.add("Queue", listing)
    assert world.state.queue_in_use("b").get_amount("cpu") == 0
    assert world.state.queue_in_use("listing").get_amount("cpu") == 1000
    world.add("Namespace", {"metadata": {"name": "team-a", "labels": {
        "arbiter.dev/queue": "b", "arbiter.dev/managed": "false"}}})
    assert world.state.queue_in_use("listing").get_amount("cpu") == 0
    assert world.state.queue_in_use("b").get_amount("cpu") == 0


async def test_on_the_event_loop_a_burst_of_namespace_events_recharges_once() -> None:
    world = _world()
    world.pod("stray", queue_name="a", cpu="1", node_name="node-0", phase="Running")
    recharged: list[int] = []
    original = world.state._update_pod

    def counting(uid: str) -> None:
        recharged.append(1)
        original(uid)

    world.state._update_pod = counting  # type: ignore[method-assign]
    for queue in ("a", "b", "a", "b"):
        world.add("Namespace", {"metadata": {"name": "team-a",
                                             "labels": {"arbiter.dev/queue": queue}}})
    assert recharged == []  # scheduled, not done per event
    await asyncio.sleep(0)
    assert len(recharged) == 1
    assert world.state.queue_in_use("b").get_amount("cpu") == 1000
