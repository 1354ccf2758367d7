"""Admitted but not running in time: TimeoutBackoff, suspended, requeued with
exponential backoff; and the other phase transitions a unit goes through."""

from __future__ import annotations

import random

from arbiter.base.kubeapi import ApiError, job_path, unit_path
from arbiter.loop.settings import LoopSettings
from tests.loop.harness import T0, Cluster


def settings(**kw: float) -> LoopSettings:
    base: dict[str, float] = dict(debounce=0.0, admission_timeout=60.0, backoff_base=10.0,
                                  backoff_max=100.0)
    base.update(kw)
    return LoopSettings(**base)  # type: ignore[arg-type]


async def test_a_job_not_running_in_time_is_suspended_and_requeued_after_backoff() -> None:
    c = Cluster(settings())
    c.controller.rng = random.Random(0)
    await c.nodes(1)
    await c.queue("q")
    await c.job("ns", "stuck", "q", created=T0)
    await c.job("ns", "next", "q", created=T0 + 1)
    await c.settle()
    assert not c.suspended("ns", "stuck") and c.suspended("ns", "next")

    c.clock.advance(61)  # the timer is due: no event needed
    await c.settle()
    status = c.unit_obj("ns", "job-stuck")["status"]
    assert status["phase"] == "TimeoutBackoff"
    assert c.suspended("ns", "stuck")
    # Its capacity went to the next unit in line.
    assert not c.suspended("ns", "next")
    backoff = [s for s in c.events.said if s.reason == "Backoff"]
    assert backoff and backoff[0].type == "Warning" and "attempt 1" in backoff[0].message

    c.run_job("ns", "next")
    c.finish_job("ns", "next")
    await c.settle()
    assert c.phase("ns", "job-stuck") == "TimeoutBackoff"  # still backing off (>= 10 s)
    c.clock.advance(16)  # base 10 s plus at most 50 % jitter
    await c.settle()
    status = c.unit_obj("ns", "job-stuck")["status"]
    assert status["phase"] == "Dequeued"
    assert status["attempts"] == 2 and len(status["admissions"]) == 2
    assert not c.suspended("ns", "stuck")


async def test_a_second_timeout_waits_twice_as_long() -> None:
    c = Cluster(settings())
    c.controller.rng = random.Random(0)
    await c.nodes(1)
    await c.queue("q")
    await c.job("ns", "stuck", "q")
    await c.settle()
    for wait in (61, 16, 61):  # time out, back off, time out again
        c.clock.advance(wait)
        await c.settle()
    assert c.phase("ns", "job-stuck") == "TimeoutBackoff"
    c.clock.advance(19)  # 20 s at least this time
    await c.settle()
    assert c.phase("ns", "job-stuck") == "TimeoutBackoff"
    c.clock.advance(12)
    await c.settle()
    assert c.phase("ns", "job-stuck") == "Dequeued"
    assert c.admissions("ns", "job-stuck") == 3


async def test_a_running_job_never_times_out() -> None:
    c = Cluster(settings())
    await c.nodes(1)
    await c.queue("q")
    await c.job("ns", "ok", "q")
    await c.settle()
    c.run_job("ns", "ok")
    await c.settle()
    c.clock.advance(1000)
    await c.settle()
    assert c.phase("ns", "job-ok") == "Running" and not c.suspended("ns", "ok")


async def test_a_job_suspended_by_someone_else_is_requeued() -> None:
    c = Cluster(settings())
    await c.nodes(1)
    await c.queue("q")
    await c.job("ns", "a", "q")
    await c.job("ns", "b", "q")
    await c.settle()
    c.run_job("ns", "a")
    await c.settle()
    c.api.edit(job_path("ns", "a"), lambda job: job["spec"].update(suspend=True))
    c.api.set_status(job_path("ns", "a"), {"active": 0, "ready": 0})
    await c.settle()
    # a gave its capacity back and b took it; a waits again.
    assert c.suspended("ns", "a") and not c.suspended("ns", "b")
    assert c.phase("ns", "job-a") == "Enqueued"


async def test_plain_pod_phases_follow_the_pod() -> None:
    c = Cluster(settings())
    await c.nodes(1)
    await c.queue("q")
    await c.pod("ns", "p", "q")
    await c.settle()
    assert c.phase("ns", "pod-p") == "Dequeued"
    c.clock.advance(1000)  # no timeout for a pod: it cannot be gated again
    c.set_pod_phase("ns", "p", "Running")
    await c.settle()
    assert c.phase("ns", "pod-p") == "Running"
    c.set_pod_phase("ns", "p", "Failed")
    await c.settle()
    assert c.phase("ns", "pod-p") == "Failed"


async def test_a_job_released_while_arbiter_was_away_counts_as_admitted() -> None:
    c = Cluster(settings())
    await c.nodes(2)
    await c.queue("q")
    await c.job("ns", "early", "q", suspend=False)
    await c.pods("ns", "q", 2)
    await c.settle()
    assert c.phase("ns", "job-early") == "Dequeued"
    # Counted as admitted from when arbiter saw it, with an admission on
    # record (its admission timeout counts from then) saying why.
    status = c.unit_obj("ns", "job-early")["status"]
    assert c.admissions("ns", "job-early") == 1
    assert status["lastAllocateTime"] == status["admissions"][0]["time"]
    assert "released outside arbiter" in status["message"]
    assert len(c.released_pods("ns")) == 1  # it uses one of the two CPUs


async def test_a_job_let_go_after_it_was_taken_back_is_held_again_not_adopted() -> None:
    """The take-back half done (a leader killed after its status write
    requeued the unit, before the suspend; or arbiter's own late release):
    the unit is Enqueued, admitted before, and its Job runs. It is suspended
    again and waits for its queue (here at capability 0), never adopted."""
    c = Cluster(settings())
    await c.nodes(1)
    await c.queue("q")
    await c.job("ns", "a", "q")
    await c.settle()
    assert c.phase("ns", "job-a") == "Dequeued" and not c.suspended("ns", "a")
    await c.set_queue("q", capability={"cpu": "0"})
    c.api.set_status(unit_path("ns", "job-a"), {
        "phase": "Enqueued", "message": "reclaimed by queue r; requeued", "allocated": None})
    await c.settle()
    assert c.suspended("ns", "a")
    assert c.phase("ns", "job-a") == "Enqueued" and c.admissions("ns", "job-a") == 1
    assert "released outside arbiter" not in c.unit_obj("ns", "job-a")["status"]["message"]


async def test_a_held_job_stays_held_while_the_job_watch_is_behind_the_suspend() -> None:
    """Our suspend landed; the Job watch is minutes behind it (chaos run 25,
    a saturated control plane). Past ASSUME_TTL the loop still sees the Job
    held (the cache is known older than the suspend): not suspended again,
    and its unit waits instead of being counted as running."""
    c = Cluster(settings(), lag=True)
    await c.nodes(1)
    await c.queue("q")
    await c.job("ns", "a", "q")
    for _ in range(4):
        c.api.deliver()
        await c.settle()
    assert c.phase("ns", "job-a") == "Dequeued" and not c.suspended("ns", "a")
    assert c.store.jobs["ns/a"].suspended is False  # the watch has the release
    await c.set_queue("q", capability={"cpu": "0"})
    c.api.set_status(unit_path("ns", "job-a"), {
        "phase": "Enqueued", "message": "reclaimed by queue r; requeued", "allocated": None})
    c.api.deliver()
    await c.settle()  # held again: the suspend lands, its Job event is held back
    assert c.suspended("ns", "a") and c.store.jobs["ns/a"].suspended is False

    def suspends() -> int:
        return sum(1 for method, path in c.api.calls
                   if method == "PATCH" and path == job_path("ns", "a"))

    held = suspends()
    for _ in range(3):
        c.clock.advance(60)
        c.api.backlog = [event for event in c.api.backlog if event[0] != "Job"]
        c.controller.touch("ns/job-a")
        await c.settle()
    assert suspends() == held  # not suspended again and again
    assert c.controller.mirror.state("ns/job-a") == "pending"
    assert c.phase("ns", "job-a") == "Enqueued"


async def test_a_pod_not_scheduled_in_time_frees_its_allocation_and_is_requeued() -> None:
    # Item 16: a gate cannot come back, so the pod stays (ungated, unbound:
    # the extender keeps it off nodes while its unit is not admitted) and
    # only its unit backs off, giving its allocation to the next in line.
    c = Cluster(settings())
    c.controller.rng = random.Random(0)
    await c.nodes(1)
    await c.queue("q")
    await c.pod("ns", "first", "q")
    await c.pod("ns", "second", "q")
    await c.settle()
    assert c.released_pods("ns") == ["first"]

    c.clock.advance(61)
    await c.settle()
    status = c.unit_obj("ns", "pod-first")["status"]
    assert status["phase"] == "TimeoutBackoff"
    assert "not scheduled" in status["message"]
    assert c.released_pods("ns") == ["first", "second"]  # the next one got the CPU
    assert c.phase("ns", "pod-second") == "Dequeued"
    assert any(s.reason == "Backoff" and s.unit == "ns/pod-first" for s in c.events.said)

    # Backoff over: waiting again, not counted as admitted while it waits.
    c.clock.advance(16)
    await c.settle()
    assert c.phase("ns", "pod-first") == "Enqueued"
    # The CPU frees up: admitted a second time.
    await c.api.delete("/api/v1/namespaces/ns/pods/second")
    await c.settle()
    status = c.unit_obj("ns", "pod-first")["status"]
    assert status["phase"] == "Dequeued" and status["attempts"] == 2


async def test_a_bound_pod_has_started_and_never_times_out() -> None:
    c = Cluster(settings())
    await c.nodes(1)
    await c.queue("q")
    await c.pod("ns", "ok", "q")
    await c.settle()
    await c.api.merge_patch("/api/v1/namespaces/ns/pods/ok", {"spec": {"nodeName": "node-0"}})
    await c.settle()
    c.clock.advance(1000)
    await c.settle()
    assert c.phase("ns", "pod-ok") == "Running"


async def test_a_pod_group_not_scheduled_in_time_backs_off() -> None:
    c = Cluster(settings())
    c.controller.rng = random.Random(0)
    await c.nodes(2)
    await c.queue("q")
    for index in range(2):
        await c.pod("ns", f"g-{index}", "q", group="g", size=2)
    await c.settle()
    assert c.phase("ns", "group-g") == "Dequeued"
    c.clock.advance(61)
    await c.settle()
    assert c.phase("ns", "group-g") == "TimeoutBackoff"
    assert c.controller.mirror.state("ns/group-g") is None  # its allocation is free


async def test_the_timeout_counts_from_when_the_job_controller_took_the_release_up() -> None:
    """A control plane minutes behind is not a Job that cannot start: the
    clock waits for the Job controller's startTime."""
    c = Cluster(settings())
    c.job_controller = False  # behind: no startTime yet
    await c.nodes(1)
    await c.queue("q")
    await c.job("ns", "late", "q")
    await c.settle()
    assert not c.suspended("ns", "late")
    c.clock.advance(100)  # past one timeout from admission
    await c.settle()
    assert c.phase("ns", "job-late") == "Dequeued"
    c.job_controller = True  # it takes the release up now: the clock starts
    await c.settle()
    c.clock.advance(59)
    await c.settle()
    assert c.phase("ns", "job-late") == "Dequeued"
    c.clock.advance(2)
    await c.settle()
    assert c.phase("ns", "job-late") == "TimeoutBackoff"
    assert c.suspended("ns", "late")


async def test_a_job_whose_pods_ran_while_its_status_lags_has_started() -> None:
    """Chaos run 27: a Job's pods ran and finished while its controller,
    minutes behind, never showed one ready. Its admission must not time out:
    that suspended finished work and admitted it again. A pod left from an
    earlier admission is no such sign."""
    c = Cluster(settings())
    await c.nodes(2)
    await c.queue("q")
    await c.job("ns", "quick", "q")
    await c.job("ns", "again", "q")
    c.clock.advance(5)
    await c.job_pod("ns", "again", "again-old", node="node-1")  # made before its admission
    c.set_pod_phase("ns", "again-old", "Succeeded")
    c.clock.advance(5)
    await c.settle()
    assert not c.suspended("ns", "quick") and not c.suspended("ns", "again")
    await c.job_pod("ns", "quick", "quick-0", node="node-0")
    c.set_pod_phase("ns", "quick-0", "Succeeded")  # its Job's status says nothing yet
    await c.settle()
    c.clock.advance(61)
    await c.settle()
    assert c.phase("ns", "job-quick") == "Running" and not c.suspended("ns", "quick")
    assert c.phase("ns", "job-again") == "TimeoutBackoff" and c.suspended("ns", "again")
    c.finish_job("ns", "quick")  # the controller catches up
    await c.settle()
    assert c.phase("ns", "job-quick") == "Succeed"


async def test_a_job_controller_that_never_starts_the_job_still_ends_its_admission() -> None:
    c = Cluster(settings())
    c.job_controller = False
    await c.nodes(1)
    await c.queue("q")
    await c.job("ns", "never", "q")
    await c.settle()
    c.clock.advance(179)
    await c.settle()
    assert c.phase("ns", "job-never") == "Dequeued"
    c.clock.advance(2)  # three timeouts after admission
    await c.settle()
    assert c.phase("ns", "job-never") == "TimeoutBackoff"


async def test_a_job_whose_release_never_goes_through_gives_its_room_back() -> None:
    """Chaos run 18: admitted again into another pool, a Job's release was
    refused for as long as its status showed the last admission's pods
    active (the Job controller behind); its room was held to the end. One
    timeout after admission it backs off, and the next unit is admitted."""
    c = Cluster(settings())
    c.controller.rng = random.Random(0)
    c.controller.actions.retry_delay = 0.001
    await c.nodes(1)
    await c.queue("q")
    await c.job("ns", "stuck", "q", created=T0)
    await c.job("ns", "next", "q", created=T0 + 1)

    def refused(method: str, path: str, _: object) -> ApiError | None:
        return ApiError(409, "Conflict", "1 pod(s) of its last admission still active") \
            if method == "PATCH" and path == job_path("ns", "stuck") else None

    c.api.hooks.append(refused)
    await c.settle()
    assert c.phase("ns", "job-stuck") == "Dequeued" and c.suspended("ns", "stuck")
    assert c.suspended("ns", "next")
    c.clock.advance(59)
    await c.settle()
    assert c.phase("ns", "job-stuck") == "Dequeued"  # its release is still retried
    c.clock.advance(2)
    await c.settle()
    status = c.unit_obj("ns", "job-stuck")["status"]
    assert status["phase"] == "TimeoutBackoff"
    assert status["message"].startswith("not let go 60s after admission")
    assert not c.suspended("ns", "next")  # its room went to the next in line


async def test_the_release_deadline_does_not_wait_for_the_next_release_retry() -> None:
    """Chaos run 23: a refused release retried ~2 minutes apart under load;
    the unit backed off at the first retry after its deadline, not at it."""
    c = Cluster(settings())
    c.controller.rng = random.Random(0)
    c.controller.actions.retry_delay = 0.001
    c.controller.writes.retry_base = c.controller.writes.retry_max = 45.0
    await c.nodes(1)
    await c.queue("q")
    await c.job("ns", "stuck", "q", created=T0)

    def refused(method: str, path: str, _: object) -> ApiError | None:
        return ApiError(409, "Conflict", "1 pod(s) of its last admission still active") \
            if method == "PATCH" and path == job_path("ns", "stuck") else None

    c.api.hooks.append(refused)
    await c.settle()
    assert c.controller.writes.retry_at("ns/job-stuck") == T0 + 45.0
    c.clock.advance(50)
    await c.settle()  # retried at 45, refused: next try at 95
    assert c.phase("ns", "job-stuck") == "Dequeued"
    assert c.controller.writes.timer_for("ns/job-stuck") == T0 + 60.0
    c.clock.advance(11)
    await c.settle()
    assert c.phase("ns", "job-stuck") == "TimeoutBackoff"
