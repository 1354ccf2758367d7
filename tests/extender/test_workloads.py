"""Pods of the integrations' workloads at the extender: judged by their
root's unit (found by uid along the controller chain; an LWS pod by its
group's unit), never by an owner the cache does not know."""

from __future__ import annotations

import copy
from typing import Any

from arbiter.integrations import OPTIONAL, enabled
from arbiter.integrations.lws import GROUP_INDEX_LABEL
from extender.filter import FilterOutcome, filter_nodes
from extender.wire import parse_extender_args
from tests.extender import builders as b
from tests.extender.builders import World
from tests.webhook.workload_samples import jobset, lws, owned_by, statefulset, workload_unit

QUEUED = {b.QUEUE_LABEL: "a"}
Json = dict[str, Any]


def _world() -> World:
    world = World()
    world.store.integrations = enabled(i.name for i in OPTIONAL)
    world.nodes(2)
    world.queue("a")
    return world


def _pod(name: str, owner: Json | None, *, node: str | None = None,
         group_index: str | None = None) -> Json:
    obj = b.pod(name, queue_name="a", node_name=node)
    if group_index is not None:
        obj["metadata"]["labels"][GROUP_INDEX_LABEL] = group_index
    return owned_by(obj, owner) if owner is not None else obj


def _add(world: World, obj: Json) -> Json:
    """Apply `obj` as a watch event; return it (typed as built)."""
    world.add(obj["kind"], obj)
    return obj


def _held_statefulset(phase: str, *, unit_uid: str | None = None) -> tuple[World, Json]:
    """A world holding StatefulSet team-a/db in queue a, and its unit in
    `phase` (standing for the uid `unit_uid`, else the StatefulSet's)."""
    world = _world()
    sts = _add(world, statefulset("db", labels=QUEUED, validating=True))
    owner = copy.deepcopy(sts)
    owner["metadata"]["uid"] = unit_uid or sts["metadata"]["uid"]
    world.add("QueueUnit", workload_unit(owner, phase, queue="a"))
    return world, sts


def _filter(world: World, pod: Json) -> FilterOutcome:
    names = sorted(world.store.nodes)
    return filter_nodes(world.state, parse_extender_args(b.extender_args(pod, names)))


def _reason(outcome: FilterOutcome) -> str:
    return str(outcome.result["FailedAndUnresolvableNodes"]["node-0"])


def test_pods_of_an_admitted_statefulset_pass_and_of_a_held_one_never() -> None:
    world, sts = _held_statefulset("Running")
    assert _filter(world, _pod("db-0", sts)).verdict == "passed"
    world.add("QueueUnit", workload_unit(sts, "Enqueued", queue="a"))
    outcome = _filter(world, _pod("db-0", sts))
    assert outcome.verdict == "rejected"
    assert "has not admitted this pod's unit team-a/sts-db yet" in _reason(outcome)


def test_a_forged_owner_uid_is_judged_as_a_plain_pod() -> None:
    world, sts = _held_statefulset("Running")
    forged = copy.deepcopy(sts)
    forged["metadata"]["uid"] = "not-in-the-cache"
    outcome = _filter(world, _pod("intruder", forged))
    assert outcome.verdict == "rejected"
    assert "there is no QueueUnit team-a/pod-intruder" in _reason(outcome)


def test_a_unit_left_by_another_workload_of_that_name_holds_nothing() -> None:
    world, sts = _held_statefulset("Running", unit_uid="the-deleted-statefulsets-uid")
    assert world.state.unit_of(world.store.pods[_pod_uid(world, _pod("db-0", sts))]) is None
    assert _filter(world, _pod("db-0", sts)).verdict == "rejected"


def _pod_uid(world: World, obj: Json) -> str:
    world.add("Pod", obj)
    return str(obj["metadata"]["uid"])


def test_an_lws_pod_is_judged_by_its_groups_unit_through_the_whole_chain() -> None:
    world = _world()
    root = _add(world, lws("serve", labels=QUEUED, validating=True))
    world.add("QueueUnit", workload_unit(root, "Running", "0", queue="a"))
    world.add("QueueUnit", workload_unit(root, "Enqueued", "1", queue="a"))
    for group, verdict in (("0", "passed"), ("1", "rejected")):
        # LWS -> leader StatefulSet -> leader pod -> worker StatefulSet -> worker pod.
        leaders = _add(world, owned_by(
            statefulset(f"serve-{group}", validating=True), root))
        leader = _pod(f"serve-{group}", leaders, group_index=group)
        world.add("Pod", leader)
        workers = _add(world, owned_by(
            statefulset(f"serve-{group}-w", validating=True), leader))
        worker = _pod(f"serve-{group}-1", workers, group_index=group)
        assert _filter(world, leader).verdict == verdict
        assert _filter(world, worker).verdict == verdict


def test_a_jobset_childs_pod_is_judged_by_the_jobsets_unit() -> None:
    world = _world()
    root = _add(world, jobset("train", labels=QUEUED, suspend=False, validating=True))
    child = b.pod("x")  # its pod spec only
    job = {"apiVersion": "batch/v1", "kind": "Job",
           "metadata": {"name": "train-workers-0", "namespace": "team-a",
                        "uid": b.consumer_uid("Job", "team-a", "train-workers-0"),
                        "labels": QUEUED},
           "spec": {"parallelism": 1, "template": {"spec": child["spec"]}}}
    world.add("Job", owned_by(job, root))
    pod = b.pod("train-workers-0-abc", queue_name="a", job="train-workers-0")
    outcome = _filter(world, pod)
    assert outcome.verdict == "rejected"
    assert "no QueueUnit team-a/jobset-train" in _reason(outcome)
    world.add("QueueUnit", workload_unit(root, "Running", queue="a"))
    assert _filter(world, pod).verdict == "passed"


def test_bound_pods_are_charged_to_their_roots_queue_once_the_root_is_seen() -> None:
    world = _world()
    other = b.queue("other")
    other["spec"]["namespaces"] = ["team-a"]
    world.add("Queue", other)  # the namespace's queue: unqueued usage goes there
    sts = statefulset("db", labels=QUEUED, validating=True)
    world.add("Pod", _pod("db-0", sts, node="node-0"))
    world.add("QueueUnit", workload_unit(sts, "Running", queue="a"))
    assert world.state.queue_in_use("a").get_amount("cpu") == 0
    assert world.state.queue_in_use("other").get_amount("cpu") == 1000
    _add(world, sts)  # a cache that listed pods first catches up
    assert world.state.queue_in_use("a").get_amount("cpu") == 1000
    assert world.state.queue_in_use("other").get_amount("cpu") == 0
    assert world.state.gang_nodes("team-a/sts-db") == {"node-0": 1}
