"""Restarts, a second leader, a lagging watch, failing writes: every unit is
admitted exactly once and none is lost."""

from __future__ import annotations

from typing import Any

from arbiter.base.kubeapi import ApiError, Denied, NotFound, job_path, pod_path, unit_path
from tests.loop.harness import Cluster


def fail_on(method: str, prefix: str, error: ApiError, times: int = 10**9) -> Any:
    left = [times]

    def hook(m: str, path: str, _: Any) -> ApiError | None:
        if m == method and path.startswith(prefix) and left[0] > 0:
            left[0] -= 1
            return error
        return None

    return hook


async def test_a_crash_between_status_and_release_is_finished_by_the_next_leader() -> None:
    c = Cluster()
    await c.nodes(2)
    await c.queue("q")
    await c.job("ns", "train", "q")
    # The release never gets through: the process "dies" after the status write.
    hook = fail_on("PATCH", job_path("ns", "train"), ApiError(500, "InternalError", "boom"))
    c.api.hooks.append(hook)
    await c.settle()
    assert c.phase("ns", "job-train") == "Dequeued" and c.suspended("ns", "train")
    await c.controller.close()
    c.controller.stop_listening()
    c.api.hooks.remove(hook)

    restarted = c.new_controller()
    await c.settle(restarted)
    assert not c.suspended("ns", "train")
    assert c.admissions("ns", "job-train") == 1


async def test_a_restart_admits_nothing_twice_and_loses_nothing() -> None:
    c = Cluster()
    await c.nodes(4)
    await c.queue("q")
    await c.pods("ns", "q", 10)
    await c.settle()
    first = c.released_pods("ns")
    assert len(first) == 4
    c.controller.stop_listening()
    await c.controller.close()

    # Pods keep arriving while no leader runs.
    for index in range(10, 13):
        await c.pod("ns", f"p-{index:03d}", "q")
    restarted = c.new_controller()
    await c.settle(restarted)
    assert c.released_pods("ns") == first  # still full: nothing new admitted
    assert len(c.api.of_kind("queueunits")) == 13  # units for the newcomers
    for name in first:
        c.set_pod_phase("ns", name, "Succeeded")
    await c.settle(restarted)
    assert len(c.released_pods("ns")) == 8
    counts = [len((u.get("status") or {}).get("admissions") or [])
              for u in c.api.of_kind("queueunits")]
    assert sorted(counts) == [0] * 5 + [1] * 8


async def test_two_leaders_at_once_still_admit_each_unit_once() -> None:
    c = Cluster()
    await c.nodes(6)
    await c.queue("q", state="Closed")
    await c.pods("ns", "q", 12)
    c.controller.stop_listening()
    one, two = c.new_controller("one"), c.new_controller("two")  # a split brain
    await c.settle(one)
    await c.settle(two)
    assert c.released_pods("ns") == []
    await c.set_queue("q", state="Open")
    # Both decide from the same cache before either's writes land.
    assert len(one.cycle()) == 6
    assert len(two.cycle()) == 6
    await c.settle(one)
    await c.settle(two)
    entries = [(u.get("status") or {}).get("admissions") or []
               for u in c.api.of_kind("queueunits")]
    assert sum(map(len, entries)) == 6 and max(map(len, entries)) == 1
    assert {e["by"] for unit in entries for e in unit} == {"one"}  # two lost every race
    assert len(c.released_pods("ns")) == 6


async def test_a_lagging_watch_does_not_cause_a_second_admission() -> None:
    c = Cluster(lag=True)
    await c.nodes(2)
    await c.queue("q")
    await c.job("ns", "a", "q")
    await c.job("ns", "b", "q")
    await c.job("ns", "c", "q")
    c.api.deliver()
    await c.settle()  # creates the units; the watch has not shown them yet
    c.api.deliver()
    await c.settle()
    # Admitted and released, but the watch still shows them Enqueued/suspended.
    for _ in range(3):
        c.controller.cycle()
        await c.settle()
    status_writes = [p for m, p in c.api.calls
                     if m == "PATCH" and p.endswith("/status") and "queueunits" in p]
    assert len(status_writes) == 2
    c.api.deliver()
    await c.settle()
    assert [c.admissions("ns", f"job-{n}") for n in "abc"] == [1, 1, 0]
    assert [c.suspended("ns", n) for n in "abc"] == [False, False, True]


async def test_a_denied_unsuspend_is_retried() -> None:
    c = Cluster()
    c.controller.actions.retry_delay = 0.001
    await c.nodes(1)
    await c.queue("q")
    await c.job("ns", "train", "q")
    denial = Denied(403, "Forbidden", 'admission webhook "jobs.arbiter.dev" denied the request')
    c.api.hooks.append(fail_on("PATCH", job_path("ns", "train"), denial, times=2))
    await c.settle()
    assert not c.suspended("ns", "train")
    assert c.admissions("ns", "job-train") == 1


async def test_a_failed_admission_write_is_undone_and_retried_later() -> None:
    c = Cluster()
    await c.nodes(1)
    await c.queue("q")
    await c.pod("ns", "p", "q")
    c.api.hooks.append(fail_on("PATCH", unit_path("ns", "pod-p", status=True),
                               ApiError(500, "InternalError", "etcd"), times=1))
    await c.settle()
    assert c.gated("ns", "p") and c.phase("ns", "pod-p") is None
    assert c.controller.mirror.state("ns/pod-p") is None  # out until the retry time
    c.clock.advance(5)
    await c.settle()
    assert not c.gated("ns", "p") and c.admissions("ns", "pod-p") == 1


async def test_a_position_write_racing_an_admission_does_not_double_it() -> None:
    c = Cluster()
    await c.nodes(1)
    await c.queue("q")
    await c.pods("ns", "q", 3)
    await c.settle()
    await c.controller.publisher.publish()  # positions for p-001, p-002 in flight
    c.set_pod_phase("ns", "p-000", "Succeeded")  # p-001 becomes admissible now
    await c.settle()
    assert c.admissions("ns", "pod-p-001") == 1
    assert "position" not in c.unit_obj("ns", "pod-p-001")["status"]
    assert not c.gated("ns", "p-001")


async def test_a_consumer_deleted_before_release_is_no_error() -> None:
    c = Cluster()
    await c.nodes(1)
    await c.queue("q")
    await c.pod("ns", "p", "q")

    def vanish(method: str, path: str, _: Any) -> ApiError | None:
        if method == "PATCH" and path == pod_path("ns", "p"):
            c.api.objects.pop(path, None)
            return NotFound(404, "NotFound", "gone")
        return None

    c.api.hooks.append(vanish)
    await c.settle()
    assert c.phase("ns", "pod-p") == "Dequeued"  # admitted, then the pod vanished
    assert ("PATCH", pod_path("ns", "p")) in c.api.calls
    assert c.controller.stats.writes_failed == 0


async def test_a_namesake_reservation_is_not_the_jobs_unit() -> None:
    """Issue #25 row 3: a reservation named `job-<name>` is not the Job's
    unit (no consumerRef uid): the Job gets its own, under another name."""
    c = Cluster()
    await c.nodes(2)
    await c.queue("q")
    await c.api.create(unit_path("ns"), {
        "metadata": {"name": "job-train", "namespace": "ns"},
        "spec": {"queue": "q", "podSets": [{"name": "main", "count": 1,
                                            "requests": {"cpu": "10m"}}]},
    })
    job = await c.job("ns", "train", "q", cpu="1")
    await c.settle()
    assert c.phase("ns", "job-train") == "Dequeued"  # the reservation was admitted
    own = f"job-train-{job['metadata']['uid'][:8]}"
    assert c.unit_obj("ns", own)["spec"]["consumerRef"]["uid"] == job["metadata"]["uid"]
    assert c.unit_obj("ns", own)["spec"]["podSets"][0]["requests"] == {"cpu": "1"}
    assert c.phase("ns", own) == "Dequeued" and not c.suspended("ns", "train")
    assert len(c.api.of_kind("queueunits")) == 2


async def test_a_failed_unit_creation_is_retried_on_a_timer() -> None:
    c = Cluster()
    await c.nodes(1)
    await c.queue("q")
    c.api.hooks.append(fail_on("POST", unit_path("ns"), ApiError(500, "InternalError", "etcd"),
                               times=1))
    await c.pod("ns", "p", "q")
    await c.settle()
    assert unit_path("ns", "pod-p") not in c.api.objects
    c.clock.advance(2)  # no event about the pod: only the retry timer brings it back
    await c.settle()
    assert c.phase("ns", "pod-p") == "Dequeued" and not c.gated("ns", "p")


def namespace_terminating(namespace: str) -> ApiError:
    """The apiserver's answer to a creation in a namespace being deleted."""
    return Denied(403, "Forbidden", f"unable to create new content in namespace {namespace} "
                  "because it is being terminated",
                  {"details": {"causes": [{"reason": "NamespaceTerminating",
                                           "field": "metadata.namespace"}]}})


def unit_posts(c: Cluster, namespace: str) -> int:
    return sum(1 for method, path in c.api.calls
               if method == "POST" and path == unit_path(namespace))


async def test_a_namespace_being_deleted_is_not_asked_again_for_each_unit() -> None:
    c = Cluster()
    await c.nodes(1)
    await c.queue("q")
    c.store.apply("Namespace", "ADDED", {"metadata": {"name": "ns"}})
    refusal = fail_on("POST", unit_path("ns"), namespace_terminating("ns"))
    c.api.hooks.append(refusal)
    await c.job("ns", "j0", "q", cpu="100m")
    await c.settle()
    for index in range(1, 5):
        await c.job("ns", f"j{index}", "q", cpu="100m")
        c.clock.advance(5)  # past every per-Job retry time
        await c.settle()
    # One refusal said it: the other Jobs' units are not tried, nor retried.
    assert unit_posts(c, "ns") == 1
    assert c.controller.writes.failures_total == 0

    # The namespace goes (a new one of that name may come): nothing was lost.
    c.api.hooks.remove(refusal)
    c.store.apply("Namespace", "DELETED", {"metadata": {"name": "ns"}})
    await c.settle()
    assert [c.phase("ns", f"job-j{index}") for index in range(5)] == ["Dequeued"] * 5


async def test_creations_in_a_namespace_found_terminating_are_tried_again_after_a_while() -> None:
    c = Cluster()
    await c.nodes(1)
    await c.queue("q")
    refusal = fail_on("POST", unit_path("ns"), namespace_terminating("ns"), times=1)
    c.api.hooks.append(refusal)
    await c.job("ns", "a", "q", cpu="100m")
    await c.settle()
    await c.job("ns", "b", "q", cpu="100m")
    await c.settle()
    # a's creation refused, b's not tried
    assert unit_posts(c, "ns") == 1 and not c.api.of_kind("queueunits")
    c.clock.advance(61)  # no Namespace event ever came: the hold's timer
    await c.settle()
    assert c.phase("ns", "job-a") == "Dequeued" and c.phase("ns", "job-b") == "Dequeued"


async def test_an_admission_decided_on_a_replaced_version_leaves_the_unit_decidable() -> None:
    """Chaos run 16: a new leader decided on a stale Enqueued version; by the
    time its write ran, the watch had brought the current one (Dequeued: an
    earlier leader's admission, its Job suspended since). The refused write
    marked that current version outdated, and the unit was decided no more:
    its Job stayed suspended, admitted, for the rest of the run."""
    c = Cluster(lag=True)
    await c.nodes(2)
    await c.queue("q")
    await c.job("ns", "a", "q")
    for _ in range(3):
        c.api.deliver()
        await c.settle()
    assert c.admissions("ns", "job-a") == 1 and not c.suspended("ns", "a")
    # Requeued (reclaimed, say) while its queue is closed: it waits, suspended.
    await c.set_queue("q", state="Closed")
    await c.api.merge_patch(unit_path("ns", "job-a") + "/status",
                            {"status": {"phase": "Enqueued", "message": "requeued",
                                        "allocated": None}})
    await c.api.merge_patch(job_path("ns", "a"), {"spec": {"suspend": True}})
    c.api.deliver()
    await c.settle()
    c.api.deliver()
    assert c.phase("ns", "job-a") == "Enqueued" and c.suspended("ns", "a")
    # The queue opens; meanwhile another leader admitted the unit again (its
    # write reaches the watch only after this leader's decision).
    await c.set_queue("q", state="Open")
    admitted = dict(c.unit_obj("ns", "job-a")["status"])
    admitted.update(phase="Dequeued", message="admitted by the other leader",
                    admissions=[*admitted["admissions"], admitted["admissions"][-1]])
    await c.api.merge_patch(unit_path("ns", "job-a") + "/status", {"status": admitted})
    c.api.deliver(1)  # the queue's change only
    assert c.controller.cycle(), "decided on the stale Enqueued version"
    c.api.deliver()  # the current version, before the admission's write runs
    await c.settle()
    c.api.deliver()
    await c.settle()
    assert c.admissions("ns", "job-a") == 2  # nothing recorded twice
    assert c.phase("ns", "job-a") == "Dequeued"
    assert not c.suspended("ns", "a"), "the admitted unit's Job was never let go"
