"""The one owner of in-flight state beyond assumed writes: admissions
running, TimeoutBackoff ends, creations to retry, namespaces held, and the
reclaimer's evictions (taking -> draining -> forgotten, blocked), each with
its TTL."""

from __future__ import annotations

from arbiter.cache.ownership import ConsumerKey
from arbiter.core.reclaim.flat import Admitted, Victim
from arbiter.core.resources import Resources
from arbiter.loop.inflight import (
    ASSUME_TTL,
    BLOCKED_MAX,
    EVICTION_TTL,
    HOLD_TIMER,
    TERMINATING_HOLD,
    Evictions,
    InFlightWrites,
)
from tests.loop.harness import Clock, Cluster

T0 = 1_000.0
JOB = ConsumerKey("Job", "ns", "job-a")
OTHER = ConsumerKey("Job", "ns", "job-b")


def writes(clock: Clock) -> InFlightWrites:
    return InFlightWrites(clock=clock, max_writes=4, retry_base=1.0, retry_max=8.0)


def victim(key: str = "ns/job-a") -> Victim:
    return Victim(Admitted(key, "q", Resources({"cpu": 1000})), "reclaim", "ns/waiting", "p")


def test_an_admission_runs_from_the_engines_pick_until_its_write_ends() -> None:
    w = writes(Clock(T0))
    assert not w.admission_running("ns/job-a")
    w.admission_started("ns/job-a")
    assert w.admission_running("ns/job-a") and not w.admission_running("ns/job-b")
    w.admission_ended("ns/job-a")
    assert not w.admission_running("ns/job-a")


def test_a_backoff_holds_its_end_until_the_unit_leaves_it_or_is_gone() -> None:
    w = writes(Clock(T0))
    assert w.backoff_end("ns/job-a") is None
    w.back_off("ns/job-a", T0 + 10)
    assert w.backoff_end("ns/job-a") == T0 + 10
    w.end_backoff("ns/job-a")
    assert w.backoff_end("ns/job-a") is None
    w.back_off("ns/job-a", T0 + 20)
    w.forget("ns/job-a")  # the unit is gone
    assert w.backoff_end("ns/job-a") is None


def test_a_failed_creation_wakes_its_consumer_once_when_its_retry_is_due() -> None:
    clock = Clock(T0)
    w = writes(clock)
    key = f"create:{JOB}"
    w.retry_creation(key, JOB)
    assert w.failed(key, RuntimeError("boom")) == 1.0
    assert w.due(T0 + 1.0) == [key]
    assert w.woken(key) == {JOB}
    assert w.woken(key) is None  # told once; a later timer is a unit's
    assert w.woken("ns/job-a") is None


def test_creations_in_a_terminating_namespace_wait_for_it_to_go_or_for_the_hold() -> None:
    clock = Clock(T0)
    w = writes(clock)
    assert not w.held_in("ns", JOB)  # not held: create
    assert w.hold_namespace("ns", JOB)  # the first refusal holds the namespace
    assert not w.hold_namespace("ns", JOB)  # a second one does not hold it anew
    assert w.held_in("ns", OTHER)  # another consumer's creation waits too
    assert w.timer_for(HOLD_TIMER + "ns") == T0 + TERMINATING_HOLD
    assert w.due(T0 + TERMINATING_HOLD - 1) == []
    assert w.due(T0 + TERMINATING_HOLD) == [HOLD_TIMER + "ns"]
    assert w.woken(HOLD_TIMER + "ns") == {JOB, OTHER}
    assert not w.held_in("ns", JOB)  # the hold is over: creations go again
    # The Namespace deleted before the hold ends: its consumers at once, and
    # the hold's timer then finds nobody.
    clock.now = T0 + 100
    w.hold_namespace("ns", JOB)
    assert w.namespace_gone("ns") == {JOB}
    assert w.woken(HOLD_TIMER + "ns") == set()


def test_an_eviction_is_taken_then_drains_until_its_pods_left_their_nodes() -> None:
    e = Evictions()
    e.begin(victim(), T0, attempt=1)
    assert set(e.taking()) == {"ns/job-a"} and e.leaving() == {"ns/job-a"}
    admitted, on_nodes = {"ns/job-a"}, {"ns/job-a"}

    def expire(now: float) -> None:
        e.expire(now, admitted=admitted.__contains__, readmitted=lambda _, __: False,
                 on_nodes=on_nodes.__contains__)

    expire(T0 + 1)  # the engine still counts it admitted: still being taken
    assert set(e.taking()) == {"ns/job-a"}
    admitted.clear()  # requeued: the engine lets go of it
    expire(T0 + 2)
    assert not e.taking() and set(e.draining()) == {"ns/job-a"}
    assert e.leaving() == {"ns/job-a"}  # its pods still count on no node
    on_nodes.clear()  # its pods are gone
    expire(T0 + 3)
    assert not e.draining() and e.leaving() == set()


def test_an_eviction_whose_effect_never_shows_is_forgotten_after_its_ttl() -> None:
    e = Evictions()
    e.begin(victim(), T0, attempt=1)

    def expire(now: float) -> None:  # the engine and the nodes never show it
        e.expire(now, admitted=lambda _: True, readmitted=lambda _, __: False,
                 on_nodes=lambda _: True)

    expire(T0 + EVICTION_TTL)
    assert set(e.taking()) == {"ns/job-a"}  # not past it yet
    expire(T0 + EVICTION_TTL + 0.1)
    # Past the TTL (counted from the choice) it neither is taken nor drains.
    assert not e.taking() and not e.draining() and e.leaving() == set()
    # Longer than a write's assumption: an eviction waits out pods terminating.
    assert EVICTION_TTL > ASSUME_TTL


def test_a_victim_admitted_again_is_no_longer_being_taken_back() -> None:
    e = Evictions()
    e.begin(victim(), T0, attempt=1)
    e.expire(T0 + 1, admitted=lambda _: True, readmitted=lambda _, attempt: attempt == 1,
             on_nodes=lambda _: True)
    assert not e.taking() and not e.draining()


def test_a_blocked_eviction_backs_off_doubling_then_is_forgotten() -> None:
    e = Evictions()
    e.begin(victim(), T0, attempt=1)
    delays = [e.block("ns/job-a", T0 + i) for i in range(7)]
    assert delays == [5.0, 10.0, 20.0, 40.0, 80.0, BLOCKED_MAX, BLOCKED_MAX]
    assert not e.taking()  # blocking ends the taking: the next look decides
    now = T0 + 6
    assert e.held_back(now) == {"ns/job-a"} and e.first_blocked("ns/job-a") == T0
    later = now + BLOCKED_MAX
    assert e.held_back(later) == set()  # may be chosen again
    e.expire(later, admitted=lambda _: True, readmitted=lambda _, __: False,
             on_nodes=lambda _: True)
    assert e.first_blocked("ns/job-a") == T0  # still admitted: the PDB clock runs on
    e.expire(later, admitted=lambda _: False, readmitted=lambda _, __: False,
             on_nodes=lambda _: False)
    assert e.first_blocked("ns/job-a") is None
    assert e.block("ns/job-a", later) == 5.0  # counting starts over


def test_an_abandoned_eviction_is_forgotten_at_once() -> None:
    e = Evictions()
    e.begin(victim(), T0, attempt=None)
    e.abandon("ns/job-a")
    assert not e.taking() and e.leaving() == set()


async def test_the_loop_and_its_reclaimer_share_one_owner() -> None:
    controller = Cluster().controller
    assert controller.reclaimer.evictions is controller.writes.evictions
