"""QueueUnits from consumers, and the phase rule table (pure functions)."""

from __future__ import annotations

import pytest

from arbiter.cache.ownership import ConsumerKey
from arbiter.cache.records import (
    JobRecord,
    OwnerRef,
    PodRecord,
    PodSet,
    PriorityClassRecord,
    UnitRecord,
)
from arbiter.core.api import MAX_NAME, UnitPhase, format_rfc3339, job_unit_name, pod_unit_name
from arbiter.core.resources import Resources
from arbiter.loop.consumers import Consumer, group_state, job_state, pod_state
from arbiter.loop.timeouts import admission_deadline, backoff_delay
from arbiter.loop.units import (
    decide,
    disposition,
    group_unit,
    job_unit,
    manifest,
    pod_unit,
    spec_drift,
)

CPU1 = Resources({"cpu": 1000})
NOW = 1_700_000_000.0


def job(**kw: object) -> JobRecord:
    base: dict[str, object] = dict(uid="u-job", namespace="ns", name="train", queue="q",
                                   suspended=True, parallelism=3, pod_requests=CPU1)
    base.update(kw)
    return JobRecord(**base)  # type: ignore[arg-type]


def pod(name: str = "p", **kw: object) -> PodRecord:
    base: dict[str, object] = dict(uid=f"u-{name}", namespace="ns", name=name,
                                   requests=CPU1, queue="q", gated=True)
    base.update(kw)
    return PodRecord(**base)  # type: ignore[arg-type]


def unit(phase: UnitPhase = "Enqueued", kind: str | None = "Job", **kw: object) -> UnitRecord:
    consumer = OwnerRef(kind, "train", "u-job") if kind is not None else None
    base: dict[str, object] = dict(uid="u-unit", namespace="ns", name="job-train", queue="q",
                                   pod_sets=(PodSet("main", 3, CPU1),), consumer=consumer,
                                   phase=phase)
    base.update(kw)
    return UnitRecord(**base)  # type: ignore[arg-type]


# -- naming -----------------------------------------------------------------------------


def test_unit_names_follow_the_consumer() -> None:
    assert job_unit_name("train") == "job-train"
    assert pod_unit_name("web-0") == "pod-web-0"


def test_an_overlong_name_is_cut_and_hashed_to_a_valid_length() -> None:
    long_a = pod_unit_name("a" * 252 + "x")
    long_b = pod_unit_name("a" * 252 + "y")
    assert len(long_a) <= MAX_NAME and len(long_b) <= MAX_NAME
    assert long_a != long_b  # the hash keeps distinct consumers apart
    assert long_a.startswith("pod-aaaa")


# -- desired units --------------------------------------------------------------------------


def test_job_unit_has_parallelism_times_pod_requests_and_the_job_as_controller() -> None:
    desired = job_unit(job(), {})
    assert desired is not None
    assert desired.name == "job-train" and desired.queue == "q"
    assert desired.pod_sets == (PodSet("main", 3, CPU1),)
    assert desired.demand == Resources({"cpu": 3000})
    body = manifest(desired)
    owner = body["metadata"]["ownerReferences"][0]
    assert owner == {"apiVersion": "batch/v1", "kind": "Job", "name": "train", "uid": "u-job",
                     "controller": True, "blockOwnerDeletion": True}
    assert body["spec"]["consumerRef"] == {"apiVersion": "batch/v1", "kind": "Job",
                                           "namespace": "ns", "name": "train", "uid": "u-job"}
    assert body["spec"]["podSets"] == [{"name": "main", "count": 3, "requests": {"cpu": "1"}}]
    assert body["metadata"]["labels"]["arbiter.dev/queue"] == "q"


def test_job_priority_comes_from_its_class_else_the_global_default() -> None:
    classes = {
        "high": PriorityClassRecord("high", 1000),
        "default": PriorityClassRecord("default", 7, global_default=True),
    }
    with_class = job_unit(job(priority_class="high"), classes)
    without = job_unit(job(), classes)
    unknown = job_unit(job(priority_class="nope"), classes)
    assert with_class is not None and with_class.priority == 1000
    assert with_class.priority_class == "high"
    assert without is not None and without.priority == 7
    assert unknown is not None and unknown.priority == 0


@pytest.mark.parametrize("change", [{"queue": None}, {"outcome": "Complete"}, {"parallelism": 0}])
def test_no_unit_for_an_unqueued_finished_or_empty_job(change: dict[str, object]) -> None:
    assert job_unit(job(**change), {}) is None


def test_pod_unit_only_for_a_gated_pod_outside_a_group() -> None:
    desired = pod_unit(pod(priority=5))
    assert desired is not None and desired.name == "pod-p" and desired.priority == 5
    assert desired.owners[0].controller and desired.owners[0].kind == "Pod"
    assert pod_unit(pod(gated=False)) is None
    # A gated pod of a Job is one arbiter does not hold (item 13): its own unit.
    job_pod = pod_unit(pod(job_name="train"))
    assert job_pod is not None and job_pod.name == "pod-p"
    assert pod_unit(pod(job_name="train", gated=False)) is None
    assert pod_unit(pod(pod_group="g")) is None
    assert pod_unit(pod(terminating=True)) is None


def test_group_unit_waits_for_its_declared_size() -> None:
    members = [pod(f"g-{i}", pod_group="g", pod_group_size=3, created=float(i))
               for i in range(2)]
    assert group_unit("ns", "g", members) is None
    members.append(pod("g-2", pod_group="g", pod_group_size=3, created=2.0,
                       requests=Resources({"cpu": 2000}), priority=9))
    desired = group_unit("ns", "g", members)
    assert desired is not None and desired.name == "group-g"
    assert desired.demand == Resources({"cpu": 4000})
    assert sorted((s.count, s.requests.get_amount("cpu")) for s in desired.pod_sets) == [
        (1, 2000), (2, 1000)]
    assert len({s.name for s in desired.pod_sets}) == 2  # names are the list-map key
    assert desired.priority == 9
    # Every pod owns the unit (GC deletes it with the last), none is its controller.
    assert [o.name for o in desired.owners] == ["g-0", "g-1", "g-2"]
    assert not any(o.controller for o in desired.owners)
    assert manifest(desired)["spec"]["consumerRef"]["kind"] == "PodGroup"


def test_group_of_many_shapes_keeps_its_exact_demand_in_one_set() -> None:
    members = [pod(f"g-{i}", pod_group="g", pod_group_size=9,
                   requests=Resources({"cpu": 100 * (i + 1)})) for i in range(9)]
    desired = group_unit("ns", "g", members)
    assert desired is not None and len(desired.pod_sets) == 1
    assert desired.demand == Resources({"cpu": 4500})


def test_spec_drift_patches_only_what_differs() -> None:
    desired = job_unit(job(parallelism=5), {})
    assert desired is not None
    assert spec_drift(unit(), desired) == {
        "podSets": [{"name": "main", "count": 5, "requests": {"cpu": "1"}}]}
    same = job_unit(job(), {})
    assert same is not None and spec_drift(unit(), same) is None


# -- consumer states -----------------------------------------------------------------------


def test_job_states() -> None:
    assert job_state(None, "u-job") is Consumer.MISSING
    assert job_state(job(uid="other"), "u-job") is Consumer.MISSING
    assert job_state(job(), "u-job") is Consumer.HELD
    assert job_state(job(suspended=False), "u-job") is Consumer.RELEASED
    assert job_state(job(suspended=False, ready=1), "u-job") is Consumer.RUNNING
    assert job_state(job(outcome="Complete"), "u-job") is Consumer.SUCCEEDED
    assert job_state(job(outcome="Failed"), "u-job") is Consumer.FAILED


def test_pod_and_group_states() -> None:
    assert pod_state(pod(), "u-p") is Consumer.HELD
    assert pod_state(pod(gated=False), "u-p") is Consumer.RELEASED
    assert pod_state(pod(gated=False, phase="Running"), "u-p") is Consumer.RUNNING
    assert pod_state(pod(gated=False, phase="Succeeded"), "u-p") is Consumer.SUCCEEDED
    assert pod_state(pod(), "someone-else") is Consumer.MISSING
    done = pod("a", gated=False, phase="Succeeded")
    running = pod("b", gated=False, phase="Running")
    assert group_state([]) is Consumer.MISSING
    assert group_state([running, pod("c")]) is Consumer.HELD  # a release to finish
    assert group_state([running, done]) is Consumer.RUNNING
    assert group_state([done, pod("d", gated=False, phase="Failed")]) is Consumer.FAILED
    assert group_state([done]) is Consumer.SUCCEEDED


# -- the rule table ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("phase", "consumer", "expected"),
    [
        ("Enqueued", Consumer.HELD, "pending"),
        ("Enqueued", Consumer.NONE, "pending"),
        ("Enqueued", Consumer.RELEASED, "admitted"),
        ("Enqueued", Consumer.MISSING, None),
        ("Dequeued", Consumer.HELD, "admitted"),
        ("Dequeued", Consumer.RELEASED, "admitted"),
        ("Dequeued", Consumer.NONE, "admitted"),
        ("Running", Consumer.RUNNING, "admitted"),
        ("Running", Consumer.HELD, None),
        ("Running", Consumer.SUCCEEDED, None),
        ("TimeoutBackoff", Consumer.HELD, None),
        ("TimeoutBackoff", Consumer.RELEASED, "admitted"),
        ("Succeed", Consumer.RUNNING, None),
    ],
)
def test_disposition(phase: UnitPhase, consumer: Consumer, expected: str | None) -> None:
    assert disposition(unit(phase), consumer) == expected


def step_of(phase: UnitPhase, consumer: Consumer, backoff_until: float | None = None,
            last_allocate_time: str | None = None,
            started: float = 0.0) -> tuple[str, str | None]:
    step = decide(unit(phase, last_allocate_time=last_allocate_time), consumer, now=NOW,
                  timeout=60.0, backoff_until=backoff_until, started=started)
    return step.kind, step.phase


@pytest.mark.parametrize(
    ("phase", "consumer", "expected"),
    [
        ("Enqueued", Consumer.HELD, ("none", None)),
        ("Enqueued", Consumer.RELEASED, ("adopt", "Dequeued")),
        ("Enqueued", Consumer.RUNNING, ("adopt", "Running")),
        ("Enqueued", Consumer.MISSING, ("none", None)),
        ("Dequeued", Consumer.HELD, ("release", None)),
        ("Dequeued", Consumer.RUNNING, ("phase", "Running")),
        ("Dequeued", Consumer.SUCCEEDED, ("phase", "Succeed")),
        ("Running", Consumer.FAILED, ("phase", "Failed")),
        ("Running", Consumer.HELD, ("phase", "Enqueued")),
        ("Running", Consumer.RELEASED, ("none", None)),
        ("TimeoutBackoff", Consumer.RUNNING, ("hold", None)),
        ("Succeed", Consumer.HELD, ("none", None)),
    ],
)
def test_decide(phase: UnitPhase, consumer: Consumer, expected: tuple[str, str | None]) -> None:
    assert step_of(phase, consumer) == expected


@pytest.mark.parametrize("consumer", [Consumer.RELEASED, Consumer.RUNNING])
def test_a_job_let_go_after_arbiter_took_it_back_is_held_again_not_adopted(
        consumer: Consumer) -> None:
    """Requeued (admitted before) and its Job let go: the take-back's hold
    did not land, or landed and the cache is behind it (chaos run 25: such
    units were adopted as admitted while their Jobs were suspended). Never
    admitted, it is adopted as before (created while arbiter was away)."""
    taken_back = decide(unit("Enqueued", admissions=1), consumer, now=NOW, timeout=60.0)
    assert (taken_back.kind, taken_back.phase) == ("hold", None)
    assert "held again" in taken_back.message
    assert step_of("Enqueued", consumer)[0] == "adopt"
    reserved = decide(unit("Reserved", admissions=1), consumer, now=NOW, timeout=60.0)
    assert reserved.kind == "adopt"  # quota held for its checks: as before


def test_a_dequeued_job_not_running_after_the_timeout_backs_off() -> None:
    allocated = format_rfc3339(NOW - 61)
    # Its clock starts when the Job controller took the release up.
    assert step_of("Dequeued", Consumer.RELEASED, last_allocate_time=allocated,
                   started=NOW - 61) == ("backoff", "TimeoutBackoff")
    assert step_of("Dequeued", Consumer.RELEASED, last_allocate_time=allocated,
                   started=NOW - 30) == ("none", None)  # the controller was 31 s behind
    recent = format_rfc3339(NOW - 30)
    assert step_of("Dequeued", Consumer.RELEASED, last_allocate_time=recent,
                   started=NOW - 30) == ("none", None)


def test_a_job_whose_controller_is_behind_times_out_at_three_timeouts() -> None:
    """No startTime yet (or one from before this admission): the control
    plane is behind, not the Job stuck; at 3 timeouts it backs off anyway.
    A startTime in the future (written by anyone but the Job controller)
    moves nothing past that ceiling."""
    for age, expected in ((61, "none"), (179, "none"), (181, "backoff")):
        allocated = format_rfc3339(NOW - age)
        assert step_of("Dequeued", Consumer.RELEASED, last_allocate_time=allocated)[0] \
            == expected, age
        # A startTime of an earlier run of the Job counts as none.
        assert step_of("Dequeued", Consumer.RELEASED, last_allocate_time=allocated,
                       started=NOW - age - 100)[0] == expected, age
    allocated_at = NOW - 181
    assert step_of("Dequeued", Consumer.RELEASED, last_allocate_time=format_rfc3339(
        allocated_at), started=NOW + 3600)[0] == "backoff"
    unit_record = unit("Dequeued", last_allocate_time=format_rfc3339(allocated_at))
    assert admission_deadline(unit_record, 60.0) == allocated_at + 180
    assert admission_deadline(unit_record, 60.0, started=allocated_at + 10) == allocated_at + 70
    # Pods cannot be gated again, but their unit times out all the same
    # (item 16): it backs off and frees its allocation, the pods stay.
    pod_unit_record = unit("Dequeued", kind="Pod", last_allocate_time=allocated)
    step = decide(pod_unit_record, Consumer.RELEASED, now=NOW, timeout=60.0)
    assert (step.kind, step.phase) == ("backoff", "TimeoutBackoff")
    assert "not scheduled" in step.message
    # Bound to a node is started: no timeout.
    assert decide(pod_unit_record, Consumer.RUNNING, now=NOW, timeout=60.0).phase == "Running"
    # In backoff its unbound pods count as held: out of the engine, waiting.
    backing_off = unit("TimeoutBackoff", kind="Pod", admissions=1)
    assert disposition(backing_off, Consumer.RELEASED) is None
    assert decide(backing_off, Consumer.RELEASED, now=NOW, timeout=60.0,
                  backoff_until=NOW - 1).phase == "Enqueued"
    waiting = unit("Enqueued", kind="Pod", admissions=1)
    assert disposition(waiting, Consumer.RELEASED) == "pending"
    assert decide(waiting, Consumer.RELEASED, now=NOW, timeout=60.0).kind == "none"


def test_backoff_ends_with_enqueued() -> None:
    assert step_of("TimeoutBackoff", Consumer.HELD, backoff_until=NOW + 1) == ("none", None)
    assert step_of("TimeoutBackoff", Consumer.HELD, backoff_until=NOW - 1) == (
        "phase", "Enqueued")


def test_backoff_delay_doubles_caps_and_jitters() -> None:
    assert backoff_delay(1, base=10, cap=600, jitter=0.0) == 10
    assert backoff_delay(3, base=10, cap=600, jitter=0.0) == 40
    assert backoff_delay(30, base=10, cap=600, jitter=0.0) == 600
    assert backoff_delay(1, base=10, cap=600, jitter=0.999) == pytest.approx(14.995)


def test_consumer_key_is_str_for_logs() -> None:
    assert str(ConsumerKey("Job", "ns", "x")) == "Job/ns/x"


def test_a_unit_created_admitted_records_its_admission_with_the_first_phase_reached() -> None:
    """One status write for the admission (carried in an annotation) and the
    phase its Job reached: when it ends, or `within` s after the unit's
    creation (Running, or the admission alone); none before."""
    created = unit("Dequeued", unwritten=True, created=NOW)
    within = 10.0

    def step(consumer: Consumer, now: float) -> tuple[str, str | None]:
        chosen = decide(created, consumer, now=now, timeout=60.0, record_within=within)
        return chosen.kind, chosen.phase

    assert step(Consumer.SUCCEEDED, NOW) == ("record", "Succeed")
    assert step(Consumer.FAILED, NOW) == ("record", "Failed")
    assert step(Consumer.RUNNING, NOW + within - 1) == ("none", None)
    assert step(Consumer.RELEASED, NOW + within - 1) == ("none", None)
    assert step(Consumer.RUNNING, NOW + within) == ("record", "Running")
    assert step(Consumer.RELEASED, NOW + within) == ("record", None)
    # Suspended by someone meanwhile: written at once (then released again).
    assert step(Consumer.HELD, NOW) == ("record", None)
    # Written already: the ordinary rules.
    written = decide(unit("Dequeued", created=NOW), Consumer.RUNNING, now=NOW, timeout=60.0,
                     record_within=within)
    assert (written.kind, written.phase) == ("phase", "Running")
