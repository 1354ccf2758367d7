"""Attempts from Jobs and the last status; the status rendering."""

from __future__ import annotations

from typing import Any

from arbiter.cache.convert import job_from_api
from arbiter.jobflow.dag import Attempt, Step, evaluate
from arbiter.jobflow.patch import build_job
from arbiter.jobflow.state import (
    AttemptInfo,
    collect_attempts,
    format_duration,
    format_time,
    observe_job,
    render_status,
)

STEPS = [Step("a", "a"), Step("b", "b", ("a",), max_retries=1)]
T0 = 1_700_000_000.0


def live_job(step: str, attempt: int, status: dict[str, Any], *, uid: str = "flow-uid",
             suspend: bool = False) -> dict[str, Any]:
    job = build_job(flow="f", flow_uid=uid, namespace="ns", step=step, attempt=attempt,
                    name=f"f-{step}" + (f"-r{attempt}" if attempt else ""),
                    template_spec={"template": {"spec": {"containers": []}}}, patch=None,
                    queue="q")
    job["metadata"]["creationTimestamp"] = format_time(T0)
    job["spec"]["suspend"] = suspend
    job["status"] = status
    return job


def test_observe_job_phases() -> None:
    pending = observe_job(job_from_api(live_job("a", 0, {}, suspend=True)), "flow-uid")
    assert pending is not None and pending.phase == "Pending" and not pending.pods_ran
    running = observe_job(job_from_api(live_job("a", 0, {
        "startTime": format_time(T0 + 5), "active": 1, "ready": 1})), "flow-uid")
    assert running is not None and running.phase == "Running" and running.pods_ran
    assert running.started == T0 + 5
    done = observe_job(job_from_api(live_job("b", 1, {
        "startTime": format_time(T0 + 5), "completionTime": format_time(T0 + 65),
        "conditions": [{"type": "Complete", "status": "True"}]})), "flow-uid")
    assert done is not None
    assert (done.step, done.index, done.phase, done.finished) == ("b", 1, "Succeed", T0 + 65)
    failed = observe_job(job_from_api(live_job("a", 0, {
        "conditions": [{"type": "Failed", "status": "True",
                        "lastTransitionTime": format_time(T0 + 9)}]})), "flow-uid")
    assert failed is not None and failed.phase == "Failed" and failed.finished == T0 + 9
    assert not failed.pods_ran  # never started
    # Another flow's Job (same name, another uid) is not ours.
    assert observe_job(job_from_api(live_job("a", 0, {}, uid="other")), "flow-uid") is None


def test_vanished_jobs_keep_recorded_outcome_or_are_terminated() -> None:
    previous = {"steps": [
        {"name": "a", "history": [{"attempt": 0, "jobName": "f-a", "phase": "Succeed",
                                   "createTime": format_time(T0)}]},
        {"name": "b", "history": [{"attempt": 0, "jobName": "f-b", "phase": "Running",
                                   "podsRan": True}]},
    ]}
    attempts = collect_attempts(STEPS, previous, [], T0 + 100)
    assert [a.phase for a in attempts["a"]] == ["Succeed"]
    [b] = attempts["b"]
    assert (b.phase, b.reason, b.finished, b.pods_ran) == ("Terminated", "JobDeleted",
                                                           T0 + 100, True)


def test_observed_job_wins_over_the_record() -> None:
    previous = {"steps": [{"name": "a", "history": [
        {"attempt": 0, "jobName": "f-a", "phase": "Pending"}]}]}
    seen = AttemptInfo(step="a", index=0, job_name="f-a", phase="Running", pods_ran=True)
    attempts = collect_attempts(STEPS, previous, [seen], T0)
    assert attempts["a"] == [seen]


def test_rendered_status_is_stable_so_it_is_written_once() -> None:
    attempts = {"a": [AttemptInfo("a", 0, "f-a", "Succeed", created=T0, started=T0 + 1,
                                  finished=T0 + 61, pods_ran=True)],
                "b": [AttemptInfo("b", 0, "f-b", "Pending", created=T0 + 62)]}
    evaluation = evaluate(STEPS, {k: [a.as_attempt() for a in v] for k, v in attempts.items()})
    first = render_status(flow="f", steps=STEPS, evaluation=evaluation, attempts=attempts,
                          previous_status={}, generation=3, now=T0 + 70)
    # The status read back: attempts rebuilt from it, rendered again later.
    again = collect_attempts(STEPS, first, [], T0 + 500)
    assert again["a"][0].phase == "Succeed"
    second = render_status(
        flow="f", steps=STEPS, evaluation=evaluation,
        attempts={"a": again["a"], "b": attempts["b"]}, previous_status=first,
        generation=3, now=T0 + 500)
    assert second == first
    assert first["observedGeneration"] == 3
    assert first["state"] == {"phase": "Running"}
    assert first["progress"] == "1/2"
    assert first["pendingJobs"] == ["f-b"] and first["completedJobs"] == ["f-a"]
    a = first["steps"][0]
    assert a["runningDuration"] == "1m0s"
    assert a["finishTime"] == format_time(T0 + 61)
    [running] = first["conditions"]
    assert running["type"] == "Running" and running["status"] == "True"
    assert running["lastTransitionTime"] == format_time(T0 + 70)


def test_conditions_flip_with_transition_times() -> None:
    previous = {"conditions": [{"type": "Running", "status": "True", "reason": "Running",
                                "lastTransitionTime": format_time(T0)}]}
    evaluation = evaluate(STEPS, {"a": [Attempt(0, "Succeed")], "b": [Attempt(0, "Succeed")]})
    status = render_status(flow="f", steps=STEPS, evaluation=evaluation, attempts={},
                           previous_status=previous, generation=1, now=T0 + 9)
    by_type = {c["type"]: c for c in status["conditions"]}
    assert by_type["Running"]["status"] == "False"
    assert by_type["Running"]["lastTransitionTime"] == format_time(T0 + 9)
    assert by_type["Succeeded"]["status"] == "True"


def test_durations_read_like_go() -> None:
    assert format_duration(5) == "5s"
    assert format_duration(240) == "4m0s"
    assert format_duration(3723) == "1h2m3s"
