"""The extender's running sums always equal a recount from the store."""

from __future__ import annotations

from collections import Counter
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from arbiter.cache.ownership import holding_unit
from arbiter.cache.store import ClusterStore
from extender.state import ExtenderState, gang_key, unit_key
from tests.extender import builders as b
from tests.extender.builders import World

NODES = ["n0", "n1", "n2"]

pod_events = st.lists(
    st.tuples(
        st.sampled_from(["upsert", "delete"]),
        st.integers(0, 5),  # which pod
        st.sampled_from([None, *NODES]),  # node
        st.sampled_from(["Pending", "Running", "Succeeded", "Failed"]),
        st.sampled_from([None, "a", "b"]),  # queue
        st.sampled_from([None, "j1", "j2"]),  # job
        st.integers(0, 3000),  # millicores
    ),
    max_size=40,
)


# Which queue each pod's unit is in: pods are charged by their unit (matched
# by uid), never by their own queue label, which the events vary at random.
UNIT_QUEUES = {"job-j1": "a", "job-j2": "b", **{f"pod-p{i}": "ab"[i % 2] for i in range(6)}}


def recount(store: ClusterStore) -> tuple[dict[str, Counter[str]], dict[str, Counter[str]],
                                          dict[str, Counter[str]]]:
    nodes: dict[str, Counter[str]] = {}
    queues: dict[str, Counter[str]] = {}
    gangs: dict[str, Counter[str]] = {}
    for pod in store.pods.values():
        if not pod.node_name or pod.phase in ("Succeeded", "Failed"):
            continue
        nodes.setdefault(pod.node_name, Counter()).update(dict(pod.requests))
        queue = UNIT_QUEUES[holding_unit(pod, store.units)[0].split("/")[1]]
        queues.setdefault(queue, Counter()).update(dict(pod.requests))
        gang = gang_key(pod)
        if gang:
            gangs.setdefault(gang, Counter())[pod.node_name] += 1
    return nodes, queues, gangs


@settings(max_examples=300, deadline=None)
@given(events=pod_events)
def test_sums_match_a_recount(events: list[tuple[Any, ...]]) -> None:
    world = World()
    for name, queue in UNIT_QUEUES.items():
        world.unit("team-a", name, queue)
    for action, index, node, phase, queue, job, milli in events:
        obj = b.pod(f"p{index}", queue_name=queue, node_name=node, phase=phase, job=job,
                    cpu=f"{milli}m")
        world.store.apply("Pod", "DELETED" if action == "delete" else "ADDED", obj)
    nodes, queues, gangs = recount(world.store)
    for name in NODES:
        expected_node = {k: v for k, v in nodes.get(name, {}).items() if v}
        assert dict(world.state.node_used(name)) == expected_node
    for queue in ("a", "b"):
        expected = {k: v for k, v in queues.get(queue, {}).items() if v}
        assert dict(world.state.queue_in_use(queue)) == expected
    for job in ("j1", "j2"):
        key = f"team-a/job-{job}"
        assert dict(world.state.gang_nodes(key)) == dict(gangs.get(key, {}))
    # A state built from scratch agrees with the incrementally kept one.
    fresh = ExtenderState(world.store)
    for name in NODES:
        assert fresh.node_used(name) == world.state.node_used(name)


def test_allocatable_total_follows_nodes_and_relists() -> None:
    world = World()
    world.nodes(3, cpu="2")
    assert world.state.allocatable_total()["cpu"] == 6000
    world.add("Node", b.node("node-0", cpu="8"))  # resized
    assert world.state.allocatable_total()["cpu"] == 12000
    world.store.apply("Node", "DELETED", b.node("node-1"))
    assert world.state.allocatable_total()["cpu"] == 10000
    # A relist drops node-2 without a per-object notification.
    world.store.replace_all("Node", [b.node("node-0", cpu="8")])
    assert world.state.allocatable_total()["cpu"] == 8000


def test_node_labels_are_cached_per_record_version() -> None:
    world = World()
    world.add("Node", b.node("n", labels={"pool": "x"}))
    first = world.state.node_labels("n")
    assert first is not None and ("pool", "x") in first
    assert world.state.node_labels("n") is first
    world.add("Node", b.node("n", labels={"pool": "y"}))
    second = world.state.node_labels("n")
    assert second is not None and ("pool", "y") in second
    assert world.state.node_labels("ghost") is None


def test_unit_naming() -> None:
    world = World()
    job_pod = world.pod("train-abc", job="train")
    lone = world.pod("solo")
    grouped = world.pod("g-1", group="ring")
    records = {obj["metadata"]["name"]: world.store.pods[obj["metadata"]["uid"]]
               for obj in (job_pod, lone, grouped)}
    assert unit_key(records["train-abc"]) == "team-a/job-train"
    assert unit_key(records["solo"]) == "team-a/pod-solo"
    assert unit_key(records["g-1"]) == "team-a/group-ring"
    assert gang_key(records["solo"]) is None


def test_close_stops_following_the_store() -> None:
    world = World()
    world.state.close()
    world.pod("late", node_name="n0", phase="Running")
    assert dict(world.state.node_used("n0")) == {}
    world.state.close()  # idempotent


def test_long_names_follow_the_loops_hashing() -> None:
    from arbiter.core.api import job_unit_name

    world = World()
    long_job = "j" * 250
    obj = world.pod("p-0", job=long_job)
    record = world.store.pods[obj["metadata"]["uid"]]
    assert unit_key(record) == f"team-a/{job_unit_name(long_job)}"
    assert len(unit_key(record).split("/")[1]) <= 253
