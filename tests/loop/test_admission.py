"""The loop admits units in the engine's order and carries the decision out."""

from __future__ import annotations

import asyncio

import pytest

from arbiter.base.kubeapi import ApiError, Conflict, job_path, unit_path
from tests.loop.harness import T0, Cluster, eventually
from tests.loop.test_crash_safety import fail_on


async def test_two_queues_share_ten_cpus_five_and_five() -> None:
    c = Cluster()
    await c.nodes(10)
    await c.queue("a")
    await c.queue("b")
    await c.pods("ta", "a", 20, prefix="a")
    await c.pods("tb", "b", 20, prefix="b")
    await c.settle()
    assert len(c.released_pods("ta")) == 5
    assert len(c.released_pods("tb")) == 5
    # The first five of each queue (creation order), the rest still gated.
    assert c.released_pods("ta") == [f"a-{i:03d}" for i in range(5)]
    assert c.gated("ta", "a-019")
    phases = [c.phase("ta", f"pod-a-{i:03d}") for i in range(20)]
    assert phases.count("Dequeued") == 5 and phases.count(None) == 15
    assert c.admissions("ta", "pod-a-000") == 1


async def test_weights_two_to_one_admit_in_that_ratio() -> None:
    c = Cluster()
    await c.nodes(9)
    await c.queue("heavy", weight=2)
    await c.queue("light", weight=1)
    await c.pods("th", "heavy", 20)
    await c.pods("tl", "light", 20)
    await c.settle()
    assert (len(c.released_pods("th")), len(c.released_pods("tl"))) == (6, 3)


async def test_a_jobs_status_write_and_unsuspend_are_sent_together() -> None:
    """The unsuspend goes with the status write, not after it (DESIGN §16):
    the extender places the pods on either record."""
    c = Cluster()
    await c.nodes(2)
    await c.queue("q")
    await c.job("ns", "train", "q", parallelism=2)
    await c.settle()
    assert not c.suspended("ns", "train")
    status = c.unit_obj("ns", "job-train")["status"]
    assert status["phase"] == "Dequeued"
    assert len(status["admissions"]) == 1 and status["attempts"] == 1
    assert status["lastAllocateTime"] and status["allocated"] == {"cpu": "2"}
    writes = [(m, p) for m, p in c.api.calls if m == "PATCH"]
    assert ("PATCH", unit_path("ns", "job-train", status=True)) in writes
    assert ("PATCH", job_path("ns", "train")) in writes
    assert "Admitted" in c.events.reasons("ns/job-train")


async def test_a_status_write_that_fails_after_the_unsuspend_landed_counts_the_job() -> None:
    c = Cluster()
    await c.nodes(1)
    await c.queue("q")
    await c.job("ns", "train", "q")
    c.api.hooks.append(fail_on("PATCH", unit_path("ns", "job-train", status=True),
                               ApiError(500, "InternalError", "etcd"), times=1))
    await c.settle()
    # Released with the write that failed: the Job runs and is counted admitted.
    assert not c.suspended("ns", "train")
    c.clock.advance(5)
    await c.settle()
    assert c.phase("ns", "job-train") == "Dequeued"
    assert c.controller.mirror.state("ns/job-train") == "admitted"
    # With its admission on record all the same (when it counts from).
    status = c.unit_obj("ns", "job-train")["status"]
    assert c.admissions("ns", "job-train") == 1 and status["lastAllocateTime"]


async def test_a_job_let_go_whose_status_write_kept_conflicting_has_its_admission_recorded(
) -> None:
    c = Cluster()
    await c.nodes(1)
    await c.queue("q")
    await c.job("ns", "train", "q")
    # Every try of the admission write conflicts (its retries too): the Job
    # was let go with it, so the admission is written again, as such.
    c.api.hooks.append(fail_on("PATCH", unit_path("ns", "job-train", status=True),
                               Conflict(409, "Conflict", "changed"), times=4))
    await c.settle()
    assert not c.suspended("ns", "train")
    status = c.unit_obj("ns", "job-train")["status"]
    assert status["phase"] == "Dequeued" and status["lastAllocateTime"]
    assert c.admissions("ns", "job-train") == 1
    assert status["message"].startswith("admitted by queue q")  # not "outside arbiter"


async def test_unit_of_a_job_is_owned_by_it_and_goes_with_it() -> None:
    c = Cluster()
    await c.nodes(1)
    await c.queue("q")
    job = await c.job("ns", "first", "q")
    await c.job("ns", "second", "q")
    await c.settle()
    owners = c.unit_obj("ns", "job-first")["metadata"]["ownerReferences"]
    assert owners == [{"apiVersion": "batch/v1", "kind": "Job", "name": "first",
                       "uid": job["metadata"]["uid"], "controller": True,
                       "blockOwnerDeletion": True}]
    assert c.suspended("ns", "second")
    await c.api.delete(job_path("ns", "first"))  # the GC removes its unit too
    await c.settle()
    assert unit_path("ns", "job-first") not in c.api.objects
    assert not c.suspended("ns", "second")


async def test_completion_frees_capacity_and_the_next_job_goes_in_order() -> None:
    c = Cluster()
    await c.nodes(2)
    await c.queue("q", queuePolicy="FIFO")
    for index in range(5):
        await c.job("ns", f"j{index}", "q", created=T0 + index)
    await c.settle()
    assert [c.suspended("ns", f"j{i}") for i in range(5)] == [False, False, True, True, True]
    c.run_job("ns", "j0")
    await c.settle()
    assert c.phase("ns", "job-j0") == "Running"
    c.finish_job("ns", "j0")
    await c.settle()
    assert c.phase("ns", "job-j0") == "Succeed"
    assert [c.suspended("ns", f"j{i}") for i in range(5)] == [False, False, False, True, True]
    c.finish_job("ns", "j1", "Failed")
    await c.settle()
    assert c.phase("ns", "job-j1") == "Failed"
    assert not c.suspended("ns", "j3") and c.suspended("ns", "j4")


async def test_the_running_loop_reacts_to_a_finished_job_without_a_poke() -> None:
    c = Cluster()
    await c.nodes(1)
    await c.queue("q")
    await c.job("ns", "a", "q", created=T0)
    await c.job("ns", "b", "q", created=T0 + 1)
    task = asyncio.get_running_loop().create_task(c.controller.run())
    try:
        await eventually(lambda: not c.suspended("ns", "a"))
        assert c.suspended("ns", "b")
        c.finish_job("ns", "a")  # only the watch event: nothing calls the loop
        await eventually(lambda: not c.suspended("ns", "b"))
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert c.controller.stats.cycles < 50  # event-driven, not spinning


async def test_a_guarantee_is_admitted_first() -> None:
    c = Cluster()
    await c.nodes(6)
    await c.queue("a", guarantee={"cpu": "4"})
    await c.queue("b")
    await c.pods("tb", "b", 10)  # b's work is older; a's guarantee still comes first
    await c.pods("ta", "a", 10)
    await c.settle()
    assert (len(c.released_pods("ta")), len(c.released_pods("tb"))) == (4, 2)


async def test_a_capability_is_never_exceeded() -> None:
    c = Cluster()
    await c.nodes(10)
    await c.queue("a", capability={"cpu": "2"})
    await c.pods("ta", "a", 10)
    await c.settle()
    assert len(c.released_pods("ta")) == 2
    c.set_pod_phase("ta", "p-000", "Succeeded")  # room under the cap again
    await c.settle()
    assert len(c.released_pods("ta")) == 3
    assert c.phase("ta", "pod-p-000") == "Succeed"


async def test_priority_orders_a_queue_and_fifo_ignores_it() -> None:
    c = Cluster()
    await c.nodes(1)
    await c.queue("p")
    await c.queue("f", queuePolicy="FIFO")
    await c.api.create("/apis/scheduling.k8s.io/v1/priorityclasses",
                       {"metadata": {"name": "high"}, "value": 100})
    c.store.apply("PriorityClass", "ADDED", {"metadata": {"name": "high"}, "value": 100})
    await c.job("np", "low", "p", created=T0)
    await c.job("np", "high", "p", created=T0 + 5, priority_class="high")
    await c.settle()
    assert c.suspended("np", "low") and not c.suspended("np", "high")
    assert c.unit_obj("np", "job-high")["spec"]["priority"] == 100


async def test_closed_queue_admits_nothing_until_reopened() -> None:
    c = Cluster()
    await c.nodes(4)
    await c.queue("q", state="Closed")
    await c.pods("ns", "q", 3)
    await c.settle()
    assert c.released_pods("ns") == []
    assert c.controller.mirror.waiting["q"] == 3  # still reported as waiting
    await c.set_queue("q", state="Open")
    await c.settle()
    assert len(c.released_pods("ns")) == 3


async def test_a_reservation_is_admitted_and_holds_capacity() -> None:
    c = Cluster()
    await c.nodes(4)
    await c.queue("q")
    await c.api.create(unit_path("ns"), {
        "metadata": {"name": "hold", "namespace": "ns"},
        "spec": {"queue": "q", "podSets": [{"name": "main", "count": 3,
                                            "requests": {"cpu": "1"}}]},
    })
    await c.settle()
    assert c.phase("ns", "hold") == "Dequeued"
    await c.pods("ns", "q", 3)
    await c.settle()
    assert len(c.released_pods("ns")) == 1  # 3 of 4 CPUs are reserved


async def test_a_pod_group_waits_for_its_size_and_is_released_together() -> None:
    c = Cluster()
    await c.nodes(4)
    await c.queue("q")
    for index in range(2):
        await c.pod("ns", f"g-{index}", "q", group="g", size=3)
    await c.settle()
    assert unit_path("ns", "group-g") not in c.api.objects
    await c.pod("ns", "g-2", "q", group="g", size=3)
    await c.settle()
    assert c.phase("ns", "group-g") == "Dequeued"
    assert c.released_pods("ns") == ["g-0", "g-1", "g-2"]
    owners = c.unit_obj("ns", "group-g")["metadata"]["ownerReferences"]
    assert sorted(o["name"] for o in owners) == ["g-0", "g-1", "g-2"]


async def test_a_pod_group_that_does_not_fit_releases_none() -> None:
    c = Cluster()
    await c.nodes(2)
    await c.queue("q")
    for index in range(3):
        await c.pod("ns", f"g-{index}", "q", group="g", size=3)
    await c.settle()
    assert c.released_pods("ns") == []
    assert c.phase("ns", "group-g") is None


async def test_a_waiting_jobs_unit_follows_its_parallelism() -> None:
    c = Cluster()
    await c.nodes(1)
    await c.queue("q")
    await c.job("ns", "big", "q", parallelism=2)
    await c.settle()
    assert c.suspended("ns", "big")
    c.api.edit(job_path("ns", "big"), lambda job: job["spec"].update(parallelism=1))
    await c.settle()
    assert c.unit_obj("ns", "job-big")["spec"]["podSets"][0]["count"] == 1
    assert not c.suspended("ns", "big")


async def test_unmanaged_namespaces_get_no_units() -> None:
    c = Cluster()
    await c.nodes(1)
    await c.queue("q")
    await c.job("kube-system", "sys", "q")
    await c.settle()
    assert c.api.of_kind("queueunits") == []


async def test_unmanaged_pods_lower_the_capacity() -> None:
    c = Cluster()
    await c.nodes(3)
    await c.queue("q")
    await c.pod("other", "daemon", None, gated=False, node="node-0", phase="Running")
    await c.pods("ns", "q", 3)
    await c.settle()
    assert len(c.released_pods("ns")) == 2


async def test_a_waiting_event_names_the_reason() -> None:
    c = Cluster()
    await c.nodes(1)
    await c.queue("q")
    await c.pods("ns", "q", 3)
    await c.settle()
    await c.controller.publisher.publish()
    waiting = {s.unit: s.message for s in c.events.said if s.reason == "Waiting"}
    assert waiting["ns/pod-p-001"] == "waiting in queue q: cluster full (cpu)"
    assert waiting["ns/pod-p-002"] == "waiting in queue q: behind 1 units"
    assert all(not s.on_unit for s in c.events.said if s.reason == "Waiting")


@pytest.mark.parametrize("forged_uid", [None, "someone-else"])
async def test_a_unit_naming_another_consumer_is_not_adopted(forged_uid: str | None) -> None:
    """A unit whose consumerRef does not carry the consumer's uid (a tenant's
    forgery, or a namesake's leftover) neither stands for the Job nor
    releases it: the Job gets its own unit with its real demand."""
    c = Cluster()
    await c.nodes(1)
    await c.queue("q")
    ref: dict[str, str] = {"apiVersion": "batch/v1", "kind": "Job", "name": "victim"}
    if forged_uid is not None:
        ref["uid"] = forged_uid
    await c.api.create(unit_path("ns"), {
        "metadata": {"name": "forged", "namespace": "ns"},
        "spec": {"queue": "q", "consumerRef": ref,
                 "podSets": [{"name": "main", "count": 1, "requests": {"cpu": "100m"}}]},
    })
    await c.job("ns", "victim", "q", cpu="4")
    await c.settle()
    assert c.suspended("ns", "victim")  # 4 CPUs never fit on 1
    assert c.unit_obj("ns", "job-victim")["spec"]["podSets"][0]["requests"] == {"cpu": "4"}
